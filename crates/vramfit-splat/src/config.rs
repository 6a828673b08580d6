//! Fit settings: defaults, TOML files (unknown keys are errors that name
//! the key), and validation against the image.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::SplatError;
use crate::cpu::top_k::MAX_TOP_K;
use crate::params::Params;

/// Every setting of a fit. Field names are the keys of the TOML file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FitConfig {
    /// Image to fit: a path, or `builtin:astronaut` for the built-in sample.
    pub image: String,
    /// Final number of Gaussians N.
    pub gaussians: usize,
    /// Most optimiser steps (the stall schedule may stop earlier).
    pub steps: u64,
    /// Seed of every random choice (placement, addition).
    pub seed: u64,
    /// Gaussians blended per pixel.
    pub top_k: usize,
    /// Weight of `1 − SSIM` in the loss.
    pub ssim_weight: f64,
    /// Adam learning rate of the centres.
    pub lr_xy: f64,
    /// Adam learning rate of the inverse scales.
    pub lr_inv_scale: f64,
    /// Adam learning rate of the rotations.
    pub lr_theta: f64,
    /// Adam learning rate of the colours.
    pub lr_color: f64,
    /// Start with ⌈N/2⌉ and add the rest guided by the error; false starts with all N.
    pub progressive: bool,
    /// Steps between additions.
    pub add_every: u64,
    /// Number of additions, each of ⌈N/8⌉ (the last trimmed to reach N).
    pub add_rounds: u64,
    /// Steps between quality checks of the stall schedule.
    pub check_every: u64,
    /// Stalled steps that trigger the learning-rate decay, then the stop.
    pub stall_limit: u64,
    /// Steps between lines of `metrics.jsonl`.
    pub log_every: u64,
    /// Steps between progress frames in `frames/` (0: none).
    pub frame_every: u64,
    /// Steps between checkpoints (0: none).
    pub checkpoint_every: u64,
    /// Steps between memory records of every phase (0: none).
    pub profile_every: u64,
    /// Milliseconds between background samples of the device allocator, for
    /// the peak inside a step (0: off; backends without an allocator never sample).
    pub profile_sample_ms: u64,
    /// Image rows per band of the GPU's banded render, loss and backward
    /// (rounded up to whole 16-row tiles; 0: automatic, 160 rows, where the
    /// halo adds 1/8 of the work, or fewer to keep the scratch planes under
    /// 192 MiB). The scratch scales with it. The CPU path ignores it.
    pub band_rows: usize,
}

impl Default for FitConfig {
    fn default() -> Self {
        Self {
            image: BUILTIN_SAMPLE.into(),
            gaussians: 10_000,
            steps: 10_000,
            seed: 0,
            top_k: 10,
            ssim_weight: 0.1,
            lr_xy: 5e-4,
            lr_inv_scale: 2e-3,
            lr_theta: 2e-3,
            lr_color: 5e-3,
            progressive: true,
            add_every: 500,
            add_rounds: 4,
            check_every: 100,
            stall_limit: 1000,
            log_every: 10,
            frame_every: 500,
            checkpoint_every: 500,
            profile_every: 10,
            profile_sample_ms: 2,
            band_rows: 0,
        }
    }
}

/// Name of the built-in sample in `image`.
pub const BUILTIN_SAMPLE: &str = "builtin:astronaut";

impl FitConfig {
    /// Adam's learning rate per parameter tensor.
    pub fn learning_rates(&self) -> Params<f64> {
        Params {
            xy: self.lr_xy,
            inv_scale: self.lr_inv_scale,
            theta: self.lr_theta,
            color: self.lr_color,
        }
    }

    /// Parses TOML text; `path` names the source in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, SplatError> {
        vramfit::settings::from_toml(text).map_err(|why| SplatError::Config {
            path: path.into(),
            why: why.to_string(),
        })
    }

    /// Reads a TOML file.
    pub fn load(path: &Path) -> Result<Self, SplatError> {
        let text = vramfit::files::read::read_text(path, vramfit::files::read::Links::Follow).map_err(|e| {
            SplatError::Config {
                path: path.into(),
                why: format!("cannot read it: {e}"),
            }
        })?;
        Self::from_toml(&text, path)
    }

    /// The resolved config as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config is plain data")
    }

    /// Checks every setting; `pixels` is the image's pixel count.
    pub fn validate(&self, pixels: usize) -> Result<(), SplatError> {
        let bad = |name: &'static str, why: String| Err(SplatError::InvalidSetting { name, why });
        if self.gaussians == 0 {
            return bad("gaussians", "must be at least 1".into());
        }
        if self.gaussians > pixels {
            return bad(
                "gaussians",
                format!(
                    "{} Gaussians for {pixels} pixels: use at most one per pixel (--gaussians {pixels} or fewer)",
                    self.gaussians
                ),
            );
        }
        if self.steps == 0 {
            return bad("steps", "must be at least 1".into());
        }
        if !(1..=MAX_TOP_K).contains(&self.top_k) {
            return bad("top_k", format!("{} is outside 1..={MAX_TOP_K}", self.top_k));
        }
        for (name, v) in [
            ("lr_xy", self.lr_xy),
            ("lr_inv_scale", self.lr_inv_scale),
            ("lr_theta", self.lr_theta),
            ("lr_color", self.lr_color),
            ("ssim_weight", self.ssim_weight),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(name, format!("{v} is not a finite non-negative number"));
            }
        }
        for (name, v) in [
            ("add_every", self.add_every),
            ("check_every", self.check_every),
            ("log_every", self.log_every),
        ] {
            if v == 0 {
                return bad(name, "must be at least 1".into());
            }
        }
        Ok(())
    }

    /// Gaussians present at the start.
    pub fn initial_count(&self) -> usize {
        if self.progressive && self.add_rounds > 0 {
            self.gaussians.div_ceil(2)
        } else {
            self.gaussians
        }
    }

    /// Gaussians the next addition adds when `present` are there: ⌈N/8⌉,
    /// trimmed so that the total never exceeds N.
    pub fn added_in_round(&self, present: usize) -> usize {
        self.gaussians.div_ceil(8).min(self.gaussians - present)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named() {
        let err = FitConfig::from_toml("gaussians = 5\ngausians = 7\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("gausians") && err.contains("x.toml"), "{err}");
    }

    #[test]
    fn wrong_types_name_their_line() {
        let err = FitConfig::from_toml("seed = 1\nsteps = \"many\"\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("steps = \"many\""), "{err}");
    }

    #[test]
    fn partial_files_keep_defaults_and_round_trip() {
        let c = FitConfig::from_toml("steps = 42", Path::new("x.toml")).unwrap();
        assert_eq!(c.steps, 42);
        assert_eq!(c.top_k, FitConfig::default().top_k);
        assert_eq!(FitConfig::from_toml(&c.to_toml(), Path::new("y")).unwrap(), c);
    }

    #[test]
    fn progressive_counts_reach_exactly_n() {
        for n in [1usize, 7, 10, 13, 10_000] {
            let c = FitConfig {
                gaussians: n,
                ..Default::default()
            };
            let mut present = c.initial_count();
            for _ in 0..c.add_rounds {
                present += c.added_in_round(present);
            }
            assert_eq!(present, n);
        }
    }
}
