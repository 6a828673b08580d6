//! A scene fit's settings: the keys of its `config.toml`, their defaults,
//! and the checks that refuse a setting that cannot work.

use std::path::Path;

use serde::{Deserialize, Serialize};
use vramfit::allocator::CleanupPolicy;
use vramfit::optim::Moments;

use crate::dataset::Dataset;
use crate::densify::Densify;
use crate::error::SceneError;
use crate::fit::{LearningRates, Settings};
use crate::sh_storage::ShStorage;
use crate::synthetic::{Builtin, Spec};

/// The default built-in scene's name in place of a dataset folder (the
/// other: [`Builtin::name`]).
pub const BUILTIN: &str = "builtin";

/// Every setting of a scene fit; the keys of its `config.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SceneConfig {
    /// A COLMAP text dataset's folder, a NeRF-synthetic one (with
    /// `transforms_train.json`), or a built-in scene: `builtin` or
    /// `builtin:glossy`.
    pub dataset: String,
    /// A built-in scene's views, image width and height, sparse points
    /// (written only where they differ from the default: a dataset's own
    /// views are its images).
    #[serde(skip_serializing_if = "is_default_views")]
    pub views: usize,
    /// Built-in scene: image width.
    #[serde(skip_serializing_if = "is_default_width")]
    pub width: usize,
    /// Built-in scene: image height.
    #[serde(skip_serializing_if = "is_default_height")]
    pub height: usize,
    /// Built-in scene: sparse points.
    #[serde(skip_serializing_if = "is_default_points")]
    pub points: usize,
    /// Each view at 1/downscale of its size (1: as it is).
    pub downscale: usize,
    /// Optimiser steps (one view each).
    pub steps: u64,
    /// Final SH degree, 0–3.
    pub sh_degree: usize,
    /// Steps between raising the SH degree by one.
    pub sh_every: u64,
    /// The colour behind the Gaussians (default: a built-in scene's sky, else black).
    pub background: Option<[f32; 3]>,
    /// The most Gaussians the fit may hold (densification never exceeds it;
    /// more sparse points than this seed an evenly spaced subset).
    pub max_gaussians: usize,
    /// First step that densifies.
    pub densify_from: u64,
    /// No densification from this step on.
    pub densify_until: u64,
    /// Steps between densifications (0: none).
    pub densify_every: u64,
    /// Mean screen-position gradient (NDC units) that makes a Gaussian grow.
    pub densify_grad_threshold: f32,
    /// Steps between opacity resets (0: none).
    pub opacity_reset_every: u64,
    /// Steps between frames of the first held-out view in `frames/` (0: none).
    pub frame_every: u64,
    /// Steps between metric lines.
    pub log_every: u64,
    /// Steps between checkpoints (0: none).
    pub checkpoint_every: u64,
    /// Steps between memory records (0: none).
    pub profile_every: u64,
    /// Where Adam's moments live on a GPU: `device`, or `host` (host
    /// memory, updated by the CPU with the device kernel's arithmetic: the
    /// same parameters, less device memory, a transfer each step).
    pub moments: Moments,
    /// How a GPU stores the SH coefficients: `f32`, or `f16`/`bf16` (each
    /// the rounded copy of an f32 master kept with the moments on the host:
    /// needs `moments = "host"`; changes the rendered colours slightly).
    pub sh_storage: ShStorage,
    /// When a GPU's allocator returns its unused pools to the device:
    /// `never`, `step`, or `every:N` steps (each a sync and a cleanup; what
    /// it returns and costs: `vramfit bench scene-cleanup`).
    pub allocator_cleanup: String,
}

fn is_default_views(v: &usize) -> bool {
    *v == Spec::default().views
}
fn is_default_width(v: &usize) -> bool {
    *v == Spec::default().width
}
fn is_default_height(v: &usize) -> bool {
    *v == Spec::default().height
}
fn is_default_points(v: &usize) -> bool {
    *v == Spec::default().points
}

impl Default for SceneConfig {
    fn default() -> Self {
        let spec = Spec::default();
        Self {
            dataset: BUILTIN.into(),
            views: spec.views,
            width: spec.width,
            height: spec.height,
            points: spec.points,
            downscale: 1,
            steps: 3_000,
            sh_degree: 3,
            sh_every: 500,
            background: None,
            max_gaussians: 6_000,
            densify_from: 200,
            densify_until: 1_500,
            densify_every: 100,
            densify_grad_threshold: 2e-4,
            opacity_reset_every: 1_000,
            frame_every: 250,
            log_every: 50,
            checkpoint_every: 500,
            profile_every: 100,
            moments: Moments::Device,
            sh_storage: ShStorage::F32,
            allocator_cleanup: "never".into(),
        }
    }
}

impl SceneConfig {
    /// Parses TOML; `path` names the source in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, SceneError> {
        vramfit::settings::from_toml(text).map_err(|why| SceneError::Setting(format!("{}: {why}", path.display())))
    }

    /// As TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("settings are plain data")
    }

    /// Refuses settings that cannot run, naming the key.
    pub fn check(&self) -> Result<(), SceneError> {
        let bad = |name: &str, why: &str| Err(SceneError::Setting(format!("{name}: {why}")));
        if self.steps == 0 {
            return bad("steps", "must be at least 1");
        }
        if self.sh_degree > 3 {
            return bad("sh_degree", "must be 0, 1, 2 or 3");
        }
        if self.downscale == 0 {
            return bad("downscale", "must be at least 1 (1: the images as they are)");
        }
        if self.max_gaussians == 0 {
            return bad("max_gaussians", "must be at least 1");
        }
        if let Some(bg) = self.background
            && !bg.iter().all(|c| (0.0..=1.0).contains(c))
        {
            return bad(
                "background",
                &format!("{bg:?}: each channel must be a number from 0 to 1 (e.g. [0, 0, 0] for black)"),
            );
        }
        if !(self.densify_grad_threshold.is_finite() && self.densify_grad_threshold > 0.0) {
            return bad("densify_grad_threshold", "must be a positive number");
        }
        if self.sh_every == 0 || self.log_every == 0 {
            return bad("sh_every and log_every", "must be at least 1");
        }
        if let Err(e) = CleanupPolicy::parse(&self.allocator_cleanup) {
            return bad("allocator_cleanup", &e.to_string());
        }
        if self.sh_storage != ShStorage::F32 && self.moments != Moments::Host {
            return bad(
                "sh_storage",
                "16-bit SH storage needs moments = \"host\" (--moments host): the f32 masters the updates land in \
                 live with the moments there",
            );
        }
        let spec = Spec::default();
        if self.builtin().is_none()
            && (self.views, self.width, self.height, self.points) != (spec.views, spec.width, spec.height, spec.points)
        {
            return bad(
                "views, width, height, points",
                &format!(
                    "these describe a built-in scene, and dataset {} is read from its folder (its views are its \
                     images, at their own size): leave them out, or use `downscale` to fit smaller images",
                    self.dataset
                ),
            );
        }
        if self.builtin().is_some() && (self.views < 2 || self.width < 8 || self.height < 8 || self.points == 0) {
            return bad(
                "views, width, height, points",
                "the built-in scene needs at least 2 views of 8x8 and 1 point",
            );
        }
        Ok(())
    }

    /// The built-in scene these settings name, if they name one.
    pub fn builtin(&self) -> Option<Builtin> {
        Builtin::from_name(&self.dataset)
    }

    /// The dataset these settings name, downscaled as they say.
    pub fn dataset(&self) -> Result<Dataset, SceneError> {
        let data = if let Some(scene) = self.builtin() {
            crate::synthetic::dataset(&Spec {
                scene,
                views: self.views,
                width: self.width,
                height: self.height,
                points: self.points,
            })
        } else {
            let dir = Path::new(&self.dataset);
            if !dir.exists() {
                return Err(SceneError::Setting(format!(
                    "dataset {}: no such folder; give a COLMAP text or NeRF-synthetic dataset's folder, or a built-in \
                     scene: {}",
                    self.dataset,
                    Builtin::names()
                )));
            }
            let nerf = dir.join("transforms_train.json");
            // Present at all (a FIFO or a folder there is the NeRF reader's to refuse by name).
            let nerf_given = nerf.exists() || nerf.is_symlink();
            if let (true, Some(model)) = (nerf_given, crate::colmap::model(dir)) {
                return Err(SceneError::Setting(format!(
                    "dataset {}: holds both a COLMAP model ({}) and a NeRF-synthetic one ({}), and vramfit will not \
                     guess which you mean: move one of them to a folder of its own",
                    self.dataset,
                    model.join("cameras.txt").display(),
                    nerf.display()
                )));
            }
            if nerf_given {
                crate::nerf::read(dir)?
            } else {
                crate::colmap::read(dir)?
            }
        };
        Ok(data.downscaled(self.downscale)?)
    }

    pub(crate) fn settings(&self) -> Settings {
        Settings {
            steps: self.steps,
            sh_degree: self.sh_degree,
            sh_every: self.sh_every,
            background: self.background.unwrap_or(if let Some(scene) = self.builtin() {
                scene.sky().map(|v| v as f32)
            } else {
                [0.0; 3]
            }),
            lr: LearningRates::default(),
            densify: Densify {
                from: self.densify_from,
                until: self.densify_until,
                every: self.densify_every,
                grad_threshold: self.densify_grad_threshold,
                reset_every: self.opacity_reset_every,
                max_gaussians: self.max_gaussians,
                ..Densify::default()
            },
        }
    }
}
