//! Fitted Gaussians on the host and their file format.
//!
//! A `.vfg` file is a vramfit array file (see `vramfit::run::ArrayFile`:
//! magic `VRAMFIT\0`, format version, JSON header, little-endian f32
//! arrays, FNV-1a checksum) of kind `"gaussians"` with metadata
//! `{"version": 1, "width", "height", "channels", "count"}` and arrays
//! one per parameter of the table in [`crate::params`]: `xy [N, 2]`
//! (centres in `[0, 1]²`), `inv_scale [N, 2]` (inverse pixel-space
//! standard deviations at `width × height`), `theta [N]` (radians) and
//! `color [N, C]` (unclamped, display range `[0, 1]`).

use std::path::Path;

use serde_json::json;
use vramfit::run::{ArrayFile, ArrayFileError};

use crate::SplatError;
use crate::cpu::project::{Frame, Projected, project_one};
use crate::cpu::render::{Splats, render};
use crate::params::{HostParams, Param, values_per_gaussian};

/// Version of the Gaussians metadata layout.
pub const GAUSSIANS_VERSION: u64 = 1;

/// A set of Gaussians fitted to a `width × height` image.
#[derive(Debug, Clone, PartialEq)]
pub struct Gaussians {
    /// Width of the fitted image.
    pub width: usize,
    /// Height of the fitted image.
    pub height: usize,
    /// Channels C.
    pub channels: usize,
    /// The parameter arrays.
    pub params: HostParams,
}

impl Gaussians {
    /// Number of Gaussians.
    pub fn len(&self) -> usize {
        self.params.count()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stored f32 values per Gaussian.
    pub fn values_per_gaussian(&self) -> usize {
        values_per_gaussian(self.channels)
    }

    /// Bits per pixel of the fitted image at f32 storage.
    pub fn bits_per_pixel(&self) -> f64 {
        (self.values_per_gaussian() * 32 * self.len()) as f64 / (self.width * self.height) as f64
    }

    /// Borrowed parameters for the CPU kernels.
    pub fn splats(&self) -> Splats<'_, f32> {
        Splats::new(&self.params, self.channels)
    }

    /// Renders at any resolution on the host, `[H, W, C]`; standard
    /// deviations scale with the resolution ratio per axis.
    pub fn render(&self, width: usize, height: usize, top_k: usize) -> Vec<f32> {
        let frame = Frame {
            width,
            height,
            zoom_x: width as f64 / self.width as f64,
            zoom_y: height as f64 / self.height as f64,
        };
        render(&self.splats(), &frame, top_k)
    }

    /// Host bytes that rendering at `width × height` and encoding the PNG
    /// take at their peak: the f32 render, its 8-bit copy, the PNG bytes (at
    /// most about as many as the raw pixels) and the tile bins, counted
    /// exactly from each Gaussian's footprint at that size.
    pub fn render_bytes(&self, width: u32, height: u32) -> u64 {
        let (w, h) = (width as usize, height as usize);
        let frame = Frame {
            width: w,
            height: h,
            zoom_x: w as f64 / self.width as f64,
            zoom_y: h as f64 / self.height as f64,
        };
        let g = &self.params;
        let pairs: u64 = (0..self.len())
            .map(|i| {
                let p = project_one(
                    [g.xy[2 * i], g.xy[2 * i + 1]],
                    [g.inv_scale[2 * i], g.inv_scale[2 * i + 1]],
                    g.theta[i],
                    &frame,
                );
                let [x0, x1, y0, y1] = p.tiles;
                (x1.saturating_sub(x0) as u64) * (y1.saturating_sub(y0) as u64)
            })
            .sum();
        let pixels = (w as u64).saturating_mul(h as u64);
        let tiles = (frame.tiles_x() as u64).saturating_mul(frame.tiles_y() as u64);
        let per_pixel = (self.channels as u64) * 4 + 3 + 3;
        pixels
            .saturating_mul(per_pixel)
            .saturating_add(tiles.saturating_add(1).saturating_mul(16))
            .saturating_add(pairs.saturating_mul(4))
            .saturating_add((self.len() * std::mem::size_of::<Projected<f32>>()) as u64)
    }

    /// As an array file.
    pub fn to_file(&self) -> ArrayFile {
        let n = self.len();
        let mut f = ArrayFile::new(
            "gaussians",
            json!({ "version": GAUSSIANS_VERSION, "width": self.width, "height": self.height,
                    "channels": self.channels, "count": n }),
        );
        for (p, values) in self.params.iter() {
            f.insert(p.name(), file_shape(p, n, self.channels), values.clone());
        }
        f
    }

    /// From an array file, checking kind, version and shapes.
    pub fn from_file(f: &ArrayFile, path: &str) -> Result<Self, ArrayFileError> {
        let bad = |why: String| ArrayFileError::Invalid { path: path.into(), why };
        if f.kind != "gaussians" {
            return Err(bad(format!("holds '{}', not Gaussians", f.kind)));
        }
        let field = |k: &str| {
            f.meta
                .get(k)
                .and_then(|v| v.as_u64())
                .ok_or_else(|| bad(format!("metadata lacks '{k}'")))
        };
        let version = field("version")?;
        if version != GAUSSIANS_VERSION {
            return Err(bad(format!(
                "Gaussians version {version}; this build reads {GAUSSIANS_VERSION}"
            )));
        }
        let (width, height, channels, n) = (
            field("width")? as usize,
            field("height")? as usize,
            field("channels")? as usize,
            field("count")? as usize,
        );
        let get = |p: Param| -> Result<Vec<f32>, ArrayFileError> {
            let (name, shape) = (p.name(), file_shape(p, n, channels));
            match f.arrays.get(name) {
                Some((s, v)) if *s == shape => match v.iter().position(|x| !x.is_finite()) {
                    None => Ok(v.clone()),
                    Some(i) => Err(bad(format!(
                        "array '{name}' holds {} at index {i}: the fit that wrote it diverged; \
                         fit again with lower learning rates (e.g. --set lr_{name}=...)",
                        v[i]
                    ))),
                },
                Some((s, _)) => Err(bad(format!("array '{name}' has shape {s:?}, expected {shape:?}"))),
                None => Err(bad(format!("array '{name}' is missing"))),
            }
        };
        Ok(Self {
            width,
            height,
            channels,
            params: HostParams::try_from_fn(get)?,
        })
    }

    /// Writes atomically.
    pub fn save(&self, path: &Path) -> Result<(), SplatError> {
        vramfit::run::atomic_write(path, &self.to_file().to_bytes()).map_err(|e| SplatError::Write {
            path: path.into(),
            why: e.to_string(),
        })
    }

    /// Reads a file.
    pub fn load(path: &Path) -> Result<Self, SplatError> {
        let f = ArrayFile::read(path)?;
        Ok(Self::from_file(&f, &path.display().to_string())?)
    }
}

/// An array's shape in the file: `[N]` for one value per Gaussian (the
/// format predates the table's `[N, 1]`), `[N, width]` otherwise.
fn file_shape(p: Param, n: usize, channels: usize) -> Vec<usize> {
    match p.width(channels) {
        1 => vec![n],
        w => vec![n, w],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::project::project_and_bin;

    fn some() -> Gaussians {
        Gaussians {
            width: 40,
            height: 30,
            channels: 3,
            params: HostParams {
                xy: vec![0.2, 0.3, 0.7, 0.6, 0.5, 0.5],
                inv_scale: vec![0.3, 0.2, 0.1, 0.4, 0.05, 0.05],
                theta: vec![0.0, 0.5, 1.0],
                color: vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
            },
        }
    }

    #[test]
    fn a_file_with_non_finite_values_is_refused_naming_file_and_array() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.vfg");
        let mut g = some();
        g.save(&path).unwrap();
        assert_eq!(Gaussians::load(&path).unwrap(), g);
        g.params.inv_scale[3] = f32::NAN;
        g.save(&path).unwrap();
        let msg = Gaussians::load(&path).unwrap_err().to_string();
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains("array 'inv_scale' holds NaN at index 3"),
            "{msg}"
        );
        g.params.inv_scale[3] = 0.1;
        g.params.color[0] = f32::INFINITY;
        g.save(&path).unwrap();
        let msg = Gaussians::load(&path).unwrap_err().to_string();
        assert!(msg.contains("array 'color' holds inf at index 0"), "{msg}");
    }

    #[test]
    fn render_bytes_count_the_bins_the_renderer_makes() {
        let g = some();
        for (w, h) in [(40, 30), (400, 300), (1000, 90)] {
            let frame = Frame {
                width: w,
                height: h,
                zoom_x: w as f64 / 40.0,
                zoom_y: h as f64 / 30.0,
            };
            let binned = project_and_bin(&g.params.xy, &g.params.inv_scale, &g.params.theta, &frame);
            let tiles = (frame.tiles_x() * frame.tiles_y() + 1) as u64;
            let expected = (w * h * (3 * 4 + 6)) as u64
                + tiles * 16
                + binned.ids.len() as u64 * 4
                + (3 * std::mem::size_of::<Projected<f32>>()) as u64;
            assert!(!binned.ids.is_empty());
            assert_eq!(g.render_bytes(w as u32, h as u32), expected, "{w}x{h}");
        }
    }
}
