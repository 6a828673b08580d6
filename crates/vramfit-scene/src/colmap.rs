//! COLMAP's text model: `cameras.txt`, `images.txt` and `points3D.txt`
//! (in `sparse/0/`, `sparse/` or the dataset folder itself) beside an
//! `images/` folder. Read with clear errors; written by `vramfit sample
//! scene` so that users and tests see the format.
//!
//! Formats (COLMAP's documentation): a camera line is `CAMERA_ID MODEL
//! WIDTH HEIGHT PARAMS…`; an image takes two lines, `IMAGE_ID QW QX QY QZ
//! TX TY TZ CAMERA_ID NAME` (the world-to-camera rotation as a quaternion
//! and the translation) and its 2D points, `X Y POINT3D_ID` triples
//! (possibly none: an empty line; checked, then ignored); a point line is
//! `POINT3D_ID X Y Z R G B ERROR TRACK…`. Lines starting with `#` are
//! comments; a UTF-8 byte-order mark is skipped. Only undistorted pinhole
//! models are read: `PINHOLE` (fx fy cx cy) and `SIMPLE_PINHOLE` (f cx cy).
//!
//! A dataset is untrusted input: every image it names must be inside its
//! folder ([`crate::dataset::inside`]), every number finite in f32, every
//! id unique.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use vramfit_gauss::picture::{Picture, save_png, to_rgb8};

use crate::cpu::camera::Camera;
use crate::dataset::{Dataset, DatasetError, Point, View, finite_f32, inside};

/// The rotation matrix of quaternion (w, x, y, z) (normalised first).
pub fn rotation_from_quaternion(q: [f64; 4]) -> [[f64; 3]; 3] {
    let n = q.iter().map(|v| v * v).sum::<f64>().sqrt();
    let [w, x, y, z] = q.map(|v| v / n);
    [
        [
            1.0 - 2.0 * (y * y + z * z),
            2.0 * (x * y - w * z),
            2.0 * (x * z + w * y),
        ],
        [
            2.0 * (x * y + w * z),
            1.0 - 2.0 * (x * x + z * z),
            2.0 * (y * z - w * x),
        ],
        [
            2.0 * (x * z - w * y),
            2.0 * (y * z + w * x),
            1.0 - 2.0 * (x * x + y * y),
        ],
    ]
}

/// The unit quaternion (w ≥ 0) of rotation matrix `r`.
pub fn quaternion_from_rotation(r: &[[f64; 3]; 3]) -> [f64; 4] {
    let trace = r[0][0] + r[1][1] + r[2][2];
    // The largest of the four squared components decides the division (stable).
    let q = if trace > 0.0 {
        let s = 2.0 * (1.0 + trace).sqrt();
        [
            0.25 * s,
            (r[2][1] - r[1][2]) / s,
            (r[0][2] - r[2][0]) / s,
            (r[1][0] - r[0][1]) / s,
        ]
    } else if r[0][0] > r[1][1] && r[0][0] > r[2][2] {
        let s = 2.0 * (1.0 + r[0][0] - r[1][1] - r[2][2]).sqrt();
        [
            (r[2][1] - r[1][2]) / s,
            0.25 * s,
            (r[0][1] + r[1][0]) / s,
            (r[0][2] + r[2][0]) / s,
        ]
    } else if r[1][1] > r[2][2] {
        let s = 2.0 * (1.0 + r[1][1] - r[0][0] - r[2][2]).sqrt();
        [
            (r[0][2] - r[2][0]) / s,
            (r[0][1] + r[1][0]) / s,
            0.25 * s,
            (r[1][2] + r[2][1]) / s,
        ]
    } else {
        let s = 2.0 * (1.0 + r[2][2] - r[0][0] - r[1][1]).sqrt();
        [
            (r[1][0] - r[0][1]) / s,
            (r[0][2] + r[2][0]) / s,
            (r[1][2] + r[2][1]) / s,
            0.25 * s,
        ]
    };
    if q[0] < 0.0 { q.map(|v| -v) } else { q }
}

/// The folder in `dir` holding a COLMAP text model's `cameras.txt`, if any.
pub fn model(dir: &Path) -> Option<PathBuf> {
    [dir.join("sparse/0"), dir.join("sparse"), dir.to_path_buf()]
        .into_iter()
        .find(|candidate| candidate.join("cameras.txt").is_file())
}

/// The folder holding the three text files.
fn model_folder(dir: &Path) -> Result<PathBuf, DatasetError> {
    if let Some(found) = model(dir) {
        return Ok(found);
    }
    Err(DatasetError::Invalid(format!(
        "{}: no COLMAP text model (cameras.txt, images.txt, points3D.txt) in sparse/0/, sparse/ or the folder itself; \
         a binary model (.bin) can be converted with `colmap model_converter --output_type TXT`; a NeRF-synthetic \
         dataset has transforms_train.json",
        dir.display()
    )))
}

/// The lines of `path` that are not comments, with their 1-based numbers.
fn lines(path: &Path) -> Result<Vec<(usize, String)>, DatasetError> {
    let text =
        vramfit::files::read::read_text(path, vramfit::files::read::Links::Follow).map_err(|e| DatasetError::File {
            path: path.into(),
            why: e.to_string(),
        })?;
    Ok(text
        .strip_prefix('\u{feff}')
        .unwrap_or(&text)
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with('#'))
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .collect())
}

/// Parses field `name` of a line.
fn field<T: std::str::FromStr>(
    path: &Path,
    line: usize,
    fields: &[&str],
    index: usize,
    name: &str,
) -> Result<T, DatasetError> {
    let bad = |why: String| DatasetError::Line {
        path: path.into(),
        line,
        why,
    };
    let text = fields
        .get(index)
        .ok_or_else(|| bad(format!("{name} is missing (field {} of the line)", index + 1)))?;
    text.parse()
        .map_err(|_| bad(format!("{name} is '{text}', not a number of the right kind")))
}

/// `v`, where it is a finite number in f32 (the fit's type).
fn finite(path: &Path, line: usize, name: &str, v: f64) -> Result<f64, DatasetError> {
    if finite_f32(v) {
        Ok(v)
    } else {
        Err(DatasetError::Line {
            path: path.into(),
            line,
            why: format!(
                "{name} is {v}; every coordinate must be a finite number within f32's range (±3.4e38), the type the \
                 fit computes in"
            ),
        })
    }
}

/// Checks that a pose's POINTS2D line is `X Y POINT3D_ID` triples (or
/// empty): a line that is not is another pose read in its place, the
/// points line missing.
fn points2d(path: &Path, line: usize, text: &str, pose: usize) -> Result<(), DatasetError> {
    let f: Vec<&str> = text.split_whitespace().collect();
    let triple = |t: &[&str]| t[0].parse::<f64>().is_ok() && t[1].parse::<f64>().is_ok() && t[2].parse::<i64>().is_ok();
    if f.len().is_multiple_of(3) && f.chunks(3).all(triple) {
        return Ok(());
    }
    Err(DatasetError::Line {
        path: path.into(),
        line,
        why: format!(
            "this should be the POINTS2D line of the image posed on line {pose} (X Y POINT3D_ID triples, or an \
             empty line), but it is not: in images.txt every pose line is followed by its points line, which may be \
             empty"
        ),
    })
}

/// Intrinsics and size: (width, height, fx, fy, cx, cy).
type Intrinsics = (usize, usize, f64, f64, f64, f64);

fn read_cameras(path: &Path) -> Result<HashMap<u32, Intrinsics>, DatasetError> {
    let mut out = HashMap::new();
    for (n, line) in lines(path)? {
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let id: u32 = field(path, n, &f, 0, "CAMERA_ID")?;
        let model = f.get(1).copied().unwrap_or("");
        let w: usize = field(path, n, &f, 2, "WIDTH")?;
        let h: usize = field(path, n, &f, 3, "HEIGHT")?;
        let p = |i: usize, name: &str| -> Result<f64, DatasetError> {
            let v: f64 = field(path, n, &f, 4 + i, name)?;
            finite(path, n, name, v)
        };
        let intrinsics = match model {
            "PINHOLE" => (w, h, p(0, "fx")?, p(1, "fy")?, p(2, "cx")?, p(3, "cy")?),
            "SIMPLE_PINHOLE" => {
                let focal = p(0, "f")?;
                (w, h, focal, focal, p(1, "cx")?, p(2, "cy")?)
            }
            other => {
                return Err(DatasetError::Line {
                    path: path.into(),
                    line: n,
                    why: format!(
                        "camera {id} uses the {other} model; vramfit reads PINHOLE and SIMPLE_PINHOLE only: undistort \
                         the images first (`colmap image_undistorter`)"
                    ),
                });
            }
        };
        if w == 0 || h == 0 || intrinsics.2 <= 0.0 || intrinsics.3 <= 0.0 {
            return Err(DatasetError::Line {
                path: path.into(),
                line: n,
                why: format!("camera {id}: size {w}x{h} and focal lengths must be positive"),
            });
        }
        if out.insert(id, intrinsics).is_some() {
            return Err(DatasetError::Line {
                path: path.into(),
                line: n,
                why: format!("camera {id} is defined twice; every CAMERA_ID must be unique"),
            });
        }
    }
    Ok(out)
}

/// Reads the dataset in `dir`: the model, then each image from `images/`
/// (its size checked against its camera's). Views are ordered by name.
pub fn read(dir: &Path) -> Result<Dataset, DatasetError> {
    let model = model_folder(dir)?;
    // The model's own files stay in the dataset too (a `sparse/0` or a
    // `cameras.txt` linked elsewhere is refused like an image name).
    for file in ["cameras.txt", "images.txt", "points3D.txt"] {
        inside(dir, &model, file, &model.join(file), "the dataset's layout")?;
    }
    let cameras = read_cameras(&model.join("cameras.txt"))?;
    let images_txt = model.join("images.txt");
    let mut views = Vec::new();
    // Each image id and file name with the line that gave it: a second is refused.
    let mut seen_ids = HashMap::new();
    let mut seen_names = HashMap::new();
    // The line of the pose whose points line comes next.
    let mut posed_on = None;
    for (n, line) in lines(&images_txt)? {
        // Two lines an image: the pose, then its 2D points (possibly empty).
        if let Some(pose) = posed_on.take() {
            points2d(&images_txt, n, &line, pose)?;
            continue;
        }
        if line.is_empty() {
            continue;
        }
        posed_on = Some(n);
        let f: Vec<&str> = line.split_whitespace().collect();
        let p = &images_txt;
        let mut v = [0.0; 7];
        for (i, name) in ["QW", "QX", "QY", "QZ", "TX", "TY", "TZ"].iter().enumerate() {
            v[i] = finite(p, n, name, field(p, n, &f, 1 + i, name)?)?;
        }
        let line_error = |why: String| DatasetError::Line {
            path: p.clone(),
            line: n,
            why,
        };
        // A zero quaternion is no rotation: normalising it gives NaNs.
        if v[..4].iter().map(|q| q * q).sum::<f64>() < 1e-12 {
            return Err(line_error(
                "QW QX QY QZ are all zero: a pose's rotation must be a non-zero quaternion".into(),
            ));
        }
        let image_id: u32 = field(p, n, &f, 0, "IMAGE_ID")?;
        let camera_id: u32 = field(p, n, &f, 8, "CAMERA_ID")?;
        let name = f.get(9..).map(|rest| rest.join(" ")).unwrap_or_default();
        if name.is_empty() {
            return Err(line_error("NAME (the image's file name) is missing".into()));
        }
        if let Some(first) = seen_ids.insert(image_id, n) {
            return Err(line_error(format!(
                "image {image_id} is also on line {first}; every IMAGE_ID must be unique"
            )));
        }
        if let Some(first) = seen_names.insert(name.clone(), n) {
            return Err(line_error(format!(
                "{name} is also posed on line {first}; each image may have one pose"
            )));
        }
        let Some(&(width, height, fx, fy, cx, cy)) = cameras.get(&camera_id) else {
            return Err(DatasetError::Line {
                path: p.clone(),
                line: n,
                why: format!("camera {camera_id} is not in cameras.txt"),
            });
        };
        let file = inside(dir, &dir.join("images"), &name, p, &format!("line {n}"))?;
        if let Some(what) = vramfit::files::confine::not_regular(&file) {
            return Err(DatasetError::Invalid(format!(
                "{}: the image that images.txt line {n} names is {}",
                file.display(),
                if what.starts_with("not there") { "missing" } else { what }
            )));
        }
        let picture = Picture::load(&file).map_err(|e| DatasetError::File {
            path: file.clone(),
            why: e.to_string(),
        })?;
        if (picture.width, picture.height) != (width, height) {
            return Err(DatasetError::Invalid(format!(
                "{} is {}x{}, but its camera {camera_id} says {width}x{height}: the images must be the ones the model \
                 was made from, at the same size",
                file.display(),
                picture.width,
                picture.height
            )));
        }
        views.push(View {
            name,
            camera: Camera {
                width,
                height,
                fx,
                fy,
                cx,
                cy,
                rotation: rotation_from_quaternion([v[0], v[1], v[2], v[3]]),
                translation: [v[4], v[5], v[6]],
            },
            image: picture.data,
        });
    }
    if views.is_empty() {
        return Err(DatasetError::Invalid(format!("{}: no images", images_txt.display())));
    }
    views.sort_by(|a, b| a.name.cmp(&b.name));
    let points_txt = model.join("points3D.txt");
    let mut points = Vec::new();
    let mut notes = Vec::new();
    if points_txt.exists() || points_txt.is_symlink() {
        let mut seen = HashMap::new();
        for (n, line) in lines(&points_txt)? {
            if line.is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let p = &points_txt;
            let id: u64 = field(p, n, &f, 0, "POINT3D_ID")?;
            if let Some(first) = seen.insert(id, n) {
                return Err(DatasetError::Line {
                    path: p.clone(),
                    line: n,
                    why: format!("point {id} is also on line {first}; every POINT3D_ID must be unique"),
                });
            }
            let mut position = [0.0; 3];
            for (i, name) in ["X", "Y", "Z"].iter().enumerate() {
                position[i] = finite(p, n, name, field(p, n, &f, 1 + i, name)?)?;
            }
            let color = [
                field(p, n, &f, 4, "R")?,
                field(p, n, &f, 5, "G")?,
                field(p, n, &f, 6, "B")?,
            ];
            points.push(Point { position, color });
        }
    }
    if points.is_empty() {
        notes.push(format!(
            "{} {}: the Gaussians start at random around where the cameras look, as for a NeRF-synthetic dataset \
             (a model with its sparse points fits sooner)",
            points_txt.display(),
            if points_txt.exists() || points_txt.is_symlink() {
                "holds no points"
            } else {
                "is missing"
            }
        ));
    }
    let data = Dataset {
        views,
        points,
        held_out: None,
        notes,
    };
    data.check_view_sizes()?;
    Ok(data)
}

/// Writes `data` as a COLMAP text model in `dir/sparse/0/` with its images
/// as PNG in `dir/images/` (one camera per view).
pub fn write(dir: &Path, data: &Dataset) -> Result<(), DatasetError> {
    let model = dir.join("sparse/0");
    let images = dir.join("images");
    for folder in [&model, &images] {
        std::fs::create_dir_all(folder).map_err(|e| DatasetError::File {
            path: folder.clone(),
            why: e.to_string(),
        })?;
    }
    let mut cameras = String::from("# Camera list: CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[] (written by vramfit)\n");
    let mut poses = String::from(
        "# Image list, two lines each: IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME; then POINTS2D[] \
         (none here)\n",
    );
    for (i, view) in data.views.iter().enumerate() {
        let c = &view.camera;
        let id = i + 1;
        cameras.push_str(&format!(
            "{id} PINHOLE {} {} {:.17} {:.17} {:.17} {:.17}\n",
            c.width, c.height, c.fx, c.fy, c.cx, c.cy
        ));
        let [qw, qx, qy, qz] = quaternion_from_rotation(&c.rotation);
        let [tx, ty, tz] = c.translation;
        poses.push_str(&format!(
            "{id} {qw:.17} {qx:.17} {qy:.17} {qz:.17} {tx:.17} {ty:.17} {tz:.17} {id} {}\n\n",
            view.name
        ));
        let file = images.join(&view.name);
        save_png(&file, &to_rgb8(c.width, c.height, &view.image)).map_err(|e| DatasetError::File {
            path: file.clone(),
            why: e.to_string(),
        })?;
    }
    let mut points = String::from("# 3D point list: POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] (empty here)\n");
    for (i, p) in data.points.iter().enumerate() {
        let [x, y, z] = p.position;
        let [r, g, b] = p.color;
        points.push_str(&format!("{} {x:.17} {y:.17} {z:.17} {r} {g} {b} 0\n", i + 1));
    }
    for (name, text) in [
        ("cameras.txt", cameras),
        ("images.txt", poses),
        ("points3D.txt", points),
    ] {
        let path = model.join(name);
        vramfit::run::atomic_write(&path, text.as_bytes()).map_err(|e| DatasetError::File {
            path,
            why: e.to_string(),
        })?;
    }
    Ok(())
}
