//! The NeRF-synthetic layout: `transforms_train.json` and
//! `transforms_test.json` beside the images, each with `camera_angle_x`
//! (the horizontal field of view) and `frames` of `file_path` (without its
//! `.png`) and a 4×4 camera-to-world `transform_matrix` in OpenGL's axes
//! (y up, z backwards: flipped here to COLMAP's y down, z forwards). The
//! images are RGBA, composited over black; the test frames are the
//! held-out views. There are no sparse points: the Gaussians start at
//! random inside the cameras' bounds ([`crate::params`]). Every frame's
//! image must be inside the dataset's folder, its matrix finite in f32
//! and its rotation a rotation ([`crate::dataset::rotation_problem`]).

use std::path::Path;

use crate::cpu::camera::Camera;
use crate::dataset::{Dataset, DatasetError, View, finite_f32, inside, rotation_problem};

fn bad(path: &Path, why: impl Into<String>) -> DatasetError {
    DatasetError::Invalid(format!("{}: {}", path.display(), why.into()))
}

/// The frames of one `transforms_*.json`.
fn frames(dir: &Path, file: &str) -> Result<Vec<View>, DatasetError> {
    let path = inside(dir, dir, file, &dir.join(file), "the dataset's layout")?;
    let text = vramfit::files::read::read_text(&path, vramfit::files::read::Links::Follow).map_err(|e| {
        DatasetError::File {
            path: path.clone(),
            why: e.to_string(),
        }
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(&path, format!("not JSON: {e}")))?;
    let fov = json["camera_angle_x"]
        .as_f64()
        .filter(|f| f.is_finite() && *f > 0.0 && *f < std::f64::consts::PI)
        .ok_or_else(|| {
            bad(
                &path,
                "camera_angle_x (the horizontal field of view, radians) is missing or not in (0, π)",
            )
        })?;
    let list = json["frames"]
        .as_array()
        .filter(|f| !f.is_empty())
        .ok_or_else(|| bad(&path, "no frames: `frames` must list the views"))?;
    let mut views = Vec::with_capacity(list.len());
    for (k, frame) in list.iter().enumerate() {
        let name = frame["file_path"]
            .as_str()
            .ok_or_else(|| bad(&path, format!("frame {k} has no file_path")))?;
        let m: Vec<Vec<f64>> = frame["transform_matrix"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|r| {
                        r.as_array()
                            .map(|r| r.iter().filter_map(|v| v.as_f64()).collect())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default();
        if m.len() < 3
            || m.iter()
                .take(3)
                .any(|r| r.len() != 4 || r.iter().any(|v| !finite_f32(*v)))
        {
            return Err(bad(
                &path,
                format!("frame {k}: transform_matrix must be 4×4 numbers, finite in f32 (±3.4e38)"),
            ));
        }
        // A camera-to-world matrix is affine: its bottom row is [0, 0, 0, 1]
        // (another row would be a projective map the renderer cannot take).
        if m.len() > 4
            || m.get(3)
                .is_some_and(|r| r.len() != 4 || r.iter().zip([0.0, 0.0, 0.0, 1.0]).any(|(a, b)| (a - b).abs() > 1e-6))
        {
            return Err(bad(
                &path,
                if m.len() > 4 {
                    format!(
                        "frame {k} ({name}): transform_matrix has {} rows, where a camera pose has 4 (its bottom row \
                         [0, 0, 0, 1])",
                        m.len()
                    )
                } else {
                    format!(
                        "frame {k} ({name}): transform_matrix's bottom row is {:?}, where a camera pose's is [0, 0, 0, \
                         1]",
                        m.get(3).cloned().unwrap_or_default()
                    )
                },
            ));
        }
        let rotation_gl: [[f64; 3]; 3] = std::array::from_fn(|i| [m[i][0], m[i][1], m[i][2]]);
        if let Some(why) = rotation_problem(&rotation_gl) {
            return Err(bad(
                &path,
                format!("frame {k} ({name}): the rotation of its transform_matrix (upper left 3×3) {why}"),
            ));
        }
        let named = if Path::new(name).extension().is_some() {
            name.to_string()
        } else {
            format!("{name}.png")
        };
        let file = inside(dir, dir, &named, &path, &format!("frame {k}"))?;
        // Opened as a regular file first (a FIFO named as a frame would
        // block the read for ever, a device never end).
        let image = vramfit::files::read::open(&file, vramfit::files::read::Links::Follow)
            .map_err(image::ImageError::IoError)
            .and_then(|f| {
                image::ImageReader::new(std::io::BufReader::new(f))
                    .with_guessed_format()
                    .map_err(image::ImageError::IoError)
            })
            .and_then(|r| r.decode())
            .map_err(|e| DatasetError::File {
                path: file.clone(),
                why: format!("cannot read the image frame {k} names: {e}"),
            })?;
        let rgba = image.to_rgba32f();
        let (width, height) = (rgba.width() as usize, rgba.height() as usize);
        let pixels = rgba
            .pixels()
            .flat_map(|p| {
                let [r, g, b, a] = p.0;
                [r * a, g * a, b * a]
            })
            .collect();
        // Camera-to-world in OpenGL axes → COLMAP's: flip the y and z axes.
        let rot_c2w: [[f64; 3]; 3] = std::array::from_fn(|i| [m[i][0], -m[i][1], -m[i][2]]);
        let centre = [m[0][3], m[1][3], m[2][3]];
        let rotation: [[f64; 3]; 3] = std::array::from_fn(|i| std::array::from_fn(|j| rot_c2w[j][i]));
        views.push(View {
            name: name.to_string(),
            camera: Camera::centred(width, height, fov, rotation, centre),
            image: pixels,
        });
    }
    Ok(views)
}

/// Reads a NeRF-synthetic dataset: the train frames, then the test frames
/// (held out; a dataset without `transforms_test.json` holds out every
/// 8th view).
pub fn read(dir: &Path) -> Result<Dataset, DatasetError> {
    if !dir.join("transforms_train.json").is_file() {
        return Err(bad(dir, "no transforms_train.json: not a NeRF-synthetic dataset"));
    }
    let mut views = frames(dir, "transforms_train.json")?;
    let held_out = if dir.join("transforms_test.json").is_file() {
        let test = frames(dir, "transforms_test.json")?;
        let first = views.len();
        views.extend(test);
        Some((first..views.len()).collect())
    } else {
        None
    };
    let data = Dataset {
        views,
        points: Vec::new(),
        held_out,
        notes: Vec::new(),
    };
    data.check_view_sizes()?;
    Ok(data)
}
