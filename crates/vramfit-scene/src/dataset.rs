//! A scene's data: views (a camera and its image) and the sparse points
//! that seed the Gaussians, with the split into training and held-out
//! views that 3DGS papers report on (every 8th view held out).

use std::path::{Path, PathBuf};

use crate::cpu::camera::Camera;

/// Every `HOLD_OUT_EVERY`-th view (by name order, starting with the
/// first) is held out for evaluation, as in the 3DGS papers.
pub const HOLD_OUT_EVERY: usize = 8;

/// One photograph and the camera that took it.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// Its file name (relative to the images folder).
    pub name: String,
    /// Its camera.
    pub camera: Camera,
    /// Its pixels: f32 RGB in `[0, 1]`, row by row.
    pub image: Vec<f32>,
}

/// A sparse point of the reconstruction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Position in the world.
    pub position: [f64; 3],
    /// Colour.
    pub color: [u8; 3],
}

/// Views and points.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// The views, ordered by name.
    pub views: Vec<View>,
    /// The sparse points (may be empty: Gaussians then start at random
    /// inside the cameras' bounds).
    pub points: Vec<Point>,
    /// The held-out views, where the dataset names them (NeRF-synthetic's
    /// test frames); `None`: every 8th view.
    pub held_out: Option<Vec<usize>>,
    /// What the reader noticed and a user should hear (a model without
    /// sparse points, say), in words.
    pub notes: Vec<String>,
}

/// The smallest view a fit takes: 8×8 pixels (a tile's half).
pub const MIN_VIEW: usize = 8;

/// How far a camera's rotation may be from a rotation: the largest entry
/// of RᵀR − I, and |det R − 1|. Poses written in f32 (NeRF's JSON) are
/// orthonormal to about 1e-7; a scaled, sheared or mirrored matrix is far
/// outside.
pub const ROTATION_TOLERANCE: f64 = 1e-3;

/// True when `v` is a finite number in f32, the type the fit uses.
pub fn finite_f32(v: f64) -> bool {
    v.is_finite() && (v as f32).is_finite()
}

/// What keeps `r` from being a rotation (orthonormal, det +1, within
/// [`ROTATION_TOLERANCE`]), in words; `None` when it is one.
pub fn rotation_problem(r: &[[f64; 3]; 3]) -> Option<String> {
    let mut off = 0.0f64;
    for i in 0..3 {
        for j in 0..3 {
            let dot: f64 = (0..3).map(|k| r[k][i] * r[k][j]).sum();
            off = off.max((dot - if i == j { 1.0 } else { 0.0 }).abs());
        }
    }
    let det = r[0][0] * (r[1][1] * r[2][2] - r[1][2] * r[2][1]) - r[0][1] * (r[1][0] * r[2][2] - r[1][2] * r[2][0])
        + r[0][2] * (r[1][0] * r[2][1] - r[1][1] * r[2][0]);
    if !(off.is_finite() && det.is_finite()) {
        Some("holds numbers that are not finite".into())
    } else if off > ROTATION_TOLERANCE {
        Some(format!(
            "is not a rotation: its columns are not orthonormal (RᵀR is {off:.3e} from the identity, at most \
             {ROTATION_TOLERANCE:e} allowed; a scaled or sheared matrix is not a camera pose)"
        ))
    } else if (det - 1.0).abs() > ROTATION_TOLERANCE {
        Some(format!(
            "is not a rotation: its determinant is {det:.4} (a mirror image when -1); a camera pose's rotation has \
             determinant +1"
        ))
    } else {
        None
    }
}

/// The file `name`, as the dataset in `root` names it at `at` (its file
/// and where in it), relative to `base` (a folder inside `root`): a name
/// that climbs out (`..`), is absolute, or resolves outside `root` through
/// a symlink is refused before the file is opened. A name that points at
/// nothing is returned for the caller to call missing.
pub fn inside(root: &Path, base: &Path, name: &str, source: &Path, at: &str) -> Result<PathBuf, DatasetError> {
    vramfit::files::confine::inside(root, base, name, "the dataset").map_err(|o| DatasetError::Outside {
        source_file: source.into(),
        at: at.into(),
        name: o.name,
        why: o.why,
        root: root.into(),
    })
}

impl Dataset {
    /// A hash of every view's name, camera and pixels: tells a resume
    /// whether the dataset is the one the run was fitting (its path alone
    /// does not). FNV-1a, a word at a time.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |word: u64| h = (h ^ word).wrapping_mul(0x0100_0000_01b3);
        for v in &self.views {
            let named = format!("{}\n{:?}", v.name, v.camera);
            named.bytes().for_each(|b| mix(b as u64));
            v.image.iter().for_each(|x| mix(x.to_bits() as u64));
        }
        h
    }

    /// Every view at `1/k` of its size (each pixel the mean of a `k × k`
    /// block; the intrinsics scaled alike), for photographs larger than a
    /// fit needs; `k = 1` leaves them as they are.
    pub fn downscaled(mut self, k: usize) -> Result<Self, DatasetError> {
        if k <= 1 {
            return Ok(self);
        }
        for v in &mut self.views {
            let (w, h) = (v.camera.width / k, v.camera.height / k);
            if w < MIN_VIEW || h < MIN_VIEW {
                return Err(DatasetError::Invalid(format!(
                    "{}: {}x{} downscaled by {k} is {w}x{h}, below {MIN_VIEW}x{MIN_VIEW}: give a smaller downscale",
                    v.name, v.camera.width, v.camera.height
                )));
            }
            let stride = v.camera.width;
            let mut image = Vec::with_capacity(3 * w * h);
            for y in 0..h {
                for x in 0..w {
                    for ch in 0..3 {
                        let sum: f32 = (0..k)
                            .flat_map(|dy| (0..k).map(move |dx| (dx, dy)))
                            .map(|(dx, dy)| v.image[3 * ((y * k + dy) * stride + x * k + dx) + ch])
                            .sum();
                        image.push(sum / (k * k) as f32);
                    }
                }
            }
            let c = &mut v.camera;
            let f = k as f64;
            (c.width, c.height, c.fx, c.fy, c.cx, c.cy) = (w, h, c.fx / f, c.fy / f, c.cx / f, c.cy / f);
            v.image = image;
        }
        Ok(self)
    }

    /// Refuses a view smaller than [`MIN_VIEW`] on a side, naming it.
    pub fn check_view_sizes(&self) -> Result<(), DatasetError> {
        match self
            .views
            .iter()
            .find(|v| v.camera.width < MIN_VIEW || v.camera.height < MIN_VIEW)
        {
            Some(v) => Err(DatasetError::Invalid(format!(
                "{} is {}x{}: a view must be at least {MIN_VIEW}x{MIN_VIEW} pixels",
                v.name, v.camera.width, v.camera.height
            ))),
            None => Ok(()),
        }
    }

    /// Indices of the training views and of the held-out views.
    pub fn split(&self) -> (Vec<usize>, Vec<usize>) {
        match &self.held_out {
            Some(held) => (
                (0..self.views.len()).filter(|i| !held.contains(i)).collect(),
                held.clone(),
            ),
            None => (0..self.views.len()).partition(|i| i % HOLD_OUT_EVERY != 0),
        }
    }
}

/// Why a dataset cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// A file could not be read or written.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// A line of a text file is not what its format says.
    #[error("{path}, line {line}: {why}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong and what was expected.
        why: String,
    },
    /// The data does not hold together.
    #[error("{0}")]
    Invalid(String),
    /// A dataset names a file outside its own folder.
    #[error("{source_file}, {at}: '{name}' {why}; a dataset may name only files inside its own folder ({root})")]
    Outside {
        /// The file that names it.
        source_file: PathBuf,
        /// Where in that file (`line 4`, `frame 2`).
        at: String,
        /// The name as given.
        name: String,
        /// How it gets out.
        why: String,
        /// The dataset's folder.
        root: PathBuf,
    },
}
