//! A scene's data: views (a camera and its image) and the sparse points
//! that seed the Gaussians, with the split into training and held-out
//! views that 3DGS papers report on (every 8th view held out).

use std::path::PathBuf;

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
            if w < 8 || h < 8 {
                return Err(DatasetError::Invalid(format!(
                    "{}: {}x{} downscaled by {k} is {w}x{h}, below 8x8: give a smaller downscale",
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
}
