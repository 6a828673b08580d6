//! The fit as a workload of the run driver ([`vramfit::run::Workload`]):
//! its step is [`Fit::step`], its state the Gaussians, their Adam moments
//! and the schedule, its files `frames/` (as they are made),
//! `gaussians.vfg` and `render.png`, and its fields of `summary.json`
//! (PSNR, SSIM, bits per pixel). Everything is validated when the workload
//! is built, before a run directory exists.

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use serde_json::json;
use vramfit::profile::{Accounted, Category, DeviceMemory, MemoryReport, MemorySource, NamedTensor};
use vramfit::run::{
    ArrayFile, Cadence, DeviceFailure, Finished, Run, RunStats, Start, StepRecord, Workload, categories_at_peak,
};
use vramfit::step::StepObserver;

use crate::SplatError;
use crate::config::{BUILTIN_SAMPLE, FitConfig};
use crate::fit::Fit;
use crate::op::{FusedLoss, SplatBackend};
use vramfit_gauss::picture::{Picture, encode_png, to_rgb8};

/// The built-in sample photograph (see `assets/README.md`).
pub const ASTRONAUT_PNG: &[u8] = include_bytes!("../assets/astronaut.png");
const CHECKPOINT_KIND: &str = "checkpoint";
/// What starts a fit, as its run directory records it.
const WORKLOAD: &str = "vramfit fit";

/// Loads the image a config names (`builtin:astronaut` or a path).
pub fn load_image(name: &str) -> Result<Picture, SplatError> {
    if name == BUILTIN_SAMPLE {
        return Ok(Picture::decode(ASTRONAUT_PNG, Path::new(BUILTIN_SAMPLE))?);
    }
    Ok(Picture::load(Path::new(name))?)
}

/// The fit's fields of `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Image fitted.
    pub image: String,
    /// Image width.
    pub width: usize,
    /// Image height.
    pub height: usize,
    /// PSNR of the clamped final render, dB.
    pub psnr_db: f64,
    /// SSIM of the clamped final render.
    pub ssim: f64,
    /// Bits per pixel of the Gaussians stored as f32.
    pub bits_per_pixel: f64,
    /// Gaussians at the end.
    pub gaussians: usize,
    /// True when the stall schedule ended the fit before `steps`.
    pub stopped_early: bool,
    /// The most scratch the GPU engine held at once (its workspace), bytes.
    #[serde(default)]
    pub workspace_bytes: u64,
}

/// A fit of one image on backend `B`.
pub struct Splat<B: AutodiffBackend + SplatBackend>
where
    B::InnerBackend: FusedLoss,
{
    config: FitConfig,
    picture: Picture,
    fit: Fit<B>,
    device: B::Device,
}

/// Starts a new fit, or opens a run directory to resume it (with its own
/// settings); returns the run and the workload to drive.
/// The image and settings are checked before the directory is created.
pub fn launch<B>(start: Start<FitConfig>, device: &B::Device, device_name: &str) -> Result<(Run, Splat<B>), SplatError>
where
    B: AutodiffBackend + SplatBackend,
    B::InnerBackend: FusedLoss,
{
    match start {
        Start::New(mut config, out) => {
            // An absolute image path, so that `--resume` works from any directory.
            if let Ok(abs) = std::fs::canonicalize(&config.image) {
                config.image = abs.display().to_string();
            }
            let workload = Splat::new(config, device)?;
            let run = Run::create(&out, &workload.config.to_toml(), device_name, WORKLOAD)?;
            Ok((run, workload))
        }
        Start::Resume(out) => {
            let (run, text) = Run::open(&out, device_name, WORKLOAD)?;
            let config =
                FitConfig::from_toml(&text, &run.dir().path("config.toml")).map_err(|e| run.settings_error(e))?;
            Ok((run, Splat::new(config, device)?))
        }
    }
}

impl<B: AutodiffBackend + SplatBackend> Splat<B>
where
    B::InnerBackend: FusedLoss,
{
    /// Loads the image and places the initial Gaussians.
    pub fn new(config: FitConfig, device: &B::Device) -> Result<Self, SplatError> {
        let picture = load_image(&config.image)?;
        let fit = Fit::new(&picture, &config, device)?;
        Ok(Self {
            config,
            picture,
            fit,
            device: device.clone(),
        })
    }

    /// The fit.
    pub fn fit(&self) -> &Fit<B> {
        &self.fit
    }
}

impl<B: AutodiffBackend + SplatBackend> Workload for Splat<B>
where
    B::InnerBackend: FusedLoss,
{
    type Summary = Summary;
    type Error = SplatError;

    fn checkpoint_kind(&self) -> &'static str {
        CHECKPOINT_KIND
    }

    /// The cadences, the four learning rates, and more steps.
    fn resumable(&self) -> vramfit::run::Resumable {
        vramfit::run::Resumable {
            cadence: &[
                "check_every",
                "log_every",
                "frame_every",
                "checkpoint_every",
                "profile_every",
            ],
            learning_rates: &["lr_xy", "lr_inv_scale", "lr_theta", "lr_color"],
            steps: "steps",
            moments: None,
        }
    }
    fn cadence(&self) -> Cadence {
        let c = &self.config;
        Cadence {
            log_every: c.log_every,
            checkpoint_every: c.checkpoint_every,
            profile_every: c.profile_every,
            profile_sample_ms: c.profile_sample_ms,
        }
    }

    fn memory_source(&self) -> Box<dyn MemorySource> {
        <B::InnerBackend as DeviceMemory>::memory_source(&self.device)
    }

    fn steps_done(&self) -> u64 {
        self.fit.step_count()
    }

    fn total_steps(&self) -> u64 {
        self.config.steps
    }

    fn finished(&self) -> bool {
        self.fit.finished()
    }

    fn accounted(&self) -> Accounted {
        self.fit.accounted()
    }

    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, SplatError> {
        let next = self.fit.step_count() + 1;
        let want_frame = self.config.frame_every > 0 && next.is_multiple_of(self.config.frame_every);
        let r = self.fit.step(want_frame, observer)?;
        let mut metrics = serde_json::Map::new();
        metrics.insert("psnr_db".into(), json!(r.psnr_db));
        metrics.insert("ssim".into(), json!(r.ssim));
        metrics.insert("gaussians".into(), json!(r.gaussians));
        metrics.insert("added".into(), json!(r.added));
        metrics.insert("lr_decayed".into(), json!(r.decayed));
        let mut scalars = vec![("gaussians".to_string(), r.gaussians as f64)];
        scalars.extend(r.psnr_db.map(|v| ("psnr_db".to_string(), v)));
        scalars.extend(r.ssim.map(|v| ("ssim".to_string(), v)));
        let mut files = Vec::new();
        if let Some(frame) = &r.frame {
            let (w, h) = (self.picture.width, self.picture.height);
            files.push((
                format!("frames/step-{:08}.png", r.step),
                encode_png(&to_rgb8(w, h, frame))?,
            ));
        }
        Ok(StepRecord {
            step: r.step,
            loss: r.loss as f64,
            metrics,
            scalars,
            notable: r.added > 0 || r.decayed,
            status: match r.psnr_db {
                Some(p) => format!("loss {:.4} · PSNR {p:.2} dB · {} Gaussians", r.loss, r.gaussians),
                None => String::new(),
            },
            notes: if r.decayed {
                vec![format!(
                    "step {}: quality stalled, learning rates divided by 10",
                    r.step
                )]
            } else {
                Vec::new()
            },
            files,
        })
    }

    fn snapshot(&self) -> Result<ArrayFile, SplatError> {
        Ok(self.fit.checkpoint())
    }

    fn restore(&mut self, file: &ArrayFile) -> Result<(), SplatError> {
        self.fit = Fit::resume(&self.picture, &self.config, file, &self.device)?;
        Ok(())
    }

    fn tensors(&self) -> Vec<NamedTensor> {
        self.fit.tensors()
    }

    fn advice(&self, report: &MemoryReport) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let used = <B::InnerBackend as FusedLoss>::fused_band_rows_used(self.fit.target());
        let rungs = <B::InnerBackend as FusedLoss>::fused_band_rungs(self.picture.width, self.picture.height);
        let band = match lower_band(used, &rungs) {
            Some(rows) => format!(
                "workspace: lower the band height (--set band_rows={rows}, from {used}; the scratch scales with it)"
            ),
            None => format!("workspace: the band is at its lowest height ({used} rows); fewer pixels lower it"),
        };
        for (c, _) in categories_at_peak(report) {
            let a = match c {
                Category::Workspace => band.as_str(),
                Category::Cached => {
                    "cached: the allocator reserves whole pages of its pools; its page sizes are not a vramfit setting yet, \
                     and lowering band_rows lowers it only when the scratch spans several pages"
                }
                Category::Inputs => "inputs: a smaller image (the target is stored as 3 bytes per pixel on a GPU)",
                Category::Parameters | Category::OptimizerState | Category::Gradients => {
                    "parameters and Adam state: fewer Gaussians (--gaussians; 64 bytes each with Adam)"
                }
                _ => continue,
            };
            if !out.iter().any(|o| o == a) {
                out.push(a.to_string());
            }
        }
        out
    }

    fn device_failure(error: &SplatError) -> Option<DeviceFailure> {
        match error {
            SplatError::Device { step, phase, message } => Some(DeviceFailure {
                step: *step,
                phase: phase.to_string(),
                message: message.clone(),
            }),
            _ => None,
        }
    }

    fn finish(&mut self, _stats: &RunStats) -> Result<Finished<Summary>, SplatError> {
        let gaussians = self.fit.gaussians();
        let (render, psnr_db, ssim) = self.fit.evaluate()?;
        let (w, h) = (self.picture.width, self.picture.height);
        let summary = Summary {
            image: self.config.image.clone(),
            width: w,
            height: h,
            psnr_db,
            ssim,
            bits_per_pixel: gaussians.bits_per_pixel(),
            gaussians: gaussians.len(),
            stopped_early: self.fit.stopped_early(),
            workspace_bytes: <B::InnerBackend as FusedLoss>::fused_workspace_bytes(self.fit.target()),
        };
        Ok(Finished {
            summary,
            files: vec![
                (
                    "gaussians.vfg".into(),
                    vramfit::run::FileBody::Arrays(gaussians.to_file()),
                ),
                ("render.png".into(), encode_png(&to_rgb8(w, h, &render))?.into()),
            ],
        })
    }
}

/// The next band height below `used` rows among `rungs` (ascending): the
/// advice to lower the workspace never names a taller band.
pub fn lower_band(used: usize, rungs: &[usize]) -> Option<usize> {
    rungs.iter().copied().filter(|r| *r < used).max()
}

#[cfg(test)]
mod tests {
    use super::lower_band;

    /// The band the advice names is always lower than the one in use
    /// (issue 29: a fit at 32 rows was told to set 64), and none is named
    /// at the lowest.
    #[test]
    fn the_band_advice_never_raises_the_band() {
        let rungs = [16, 32, 64, 128, 256];
        assert_eq!(lower_band(32, &rungs), Some(16));
        assert_eq!(lower_band(256, &rungs), Some(128));
        assert_eq!(lower_band(96, &rungs), Some(64));
        assert_eq!(lower_band(16, &rungs), None);
        for used in [16, 32, 48, 64, 200, 256] {
            assert!(lower_band(used, &rungs).is_none_or(|r| r < used));
        }
    }
}
