//! A whole fit into a run directory: resolved `config.toml`, streamed
//! `metrics.jsonl` and `frames/`, atomic checkpoints, and at the end
//! `gaussians.vfg`, `render.png` and `summary.json` (written last: a run
//! directory without it is unfinished). Everything is validated before the
//! directory is created, so bad input leaves nothing behind; a failure
//! after that is recorded in `error.json`.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use serde_json::json;
use vramfit::run::{ArrayFile, EventWriter, RunDir, RunDirError};

use crate::SplatError;
use crate::config::{BUILTIN_SAMPLE, FitConfig};
use crate::fit::{Fit, StepReport};
use crate::op::SplatBackend;
use crate::picture::{Picture, save_png, to_rgb8};

/// The built-in sample photograph (see `assets/README.md`).
pub const ASTRONAUT_PNG: &[u8] = include_bytes!("../assets/astronaut.png");
/// Checkpoints kept on disk (the newest ones).
const KEEP_CHECKPOINTS: usize = 2;

/// Loads the image a config names (`builtin:astronaut` or a path).
pub fn load_image(name: &str) -> Result<Picture, SplatError> {
    if name == BUILTIN_SAMPLE {
        return Picture::decode(ASTRONAUT_PNG, Path::new(BUILTIN_SAMPLE));
    }
    Picture::load(Path::new(name))
}

/// The outcome of a finished fit (`summary.json`).
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
    /// Steps taken.
    pub steps: u64,
    /// True when the stall schedule ended the fit before `steps`.
    pub stopped_early: bool,
    /// Wall-clock seconds over every session of the run.
    pub wall_seconds: f64,
    /// Median milliseconds per step in the last session.
    pub median_step_ms: f64,
    /// Peak memory in bytes; see `peak_memory_source`.
    pub peak_memory_bytes: u64,
    /// What `peak_memory_bytes` measures.
    pub peak_memory_source: String,
    /// Largest bytes the device allocator held from the device (reserved),
    /// where it has figures.
    #[serde(default)]
    pub reserved_peak_bytes: Option<u64>,
    /// Largest device memory the driver (NVML) attributed to this process,
    /// an independent reading that includes the CUDA context; see
    /// `memory.json` for its source.
    #[serde(default)]
    pub driver_peak_bytes: Option<u64>,
    /// What the driver counted beyond the allocator when profiling began
    /// (the CUDA context): `driver_peak_bytes` minus this compares with
    /// `reserved_peak_bytes`.
    #[serde(default)]
    pub driver_context_bytes: Option<u64>,
    /// Device the fit ran on.
    pub device: String,
}

/// What the driver reports while it runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// The loop starts at `done` of `total` steps.
    Start {
        /// Steps already done (resume).
        done: u64,
        /// Step budget.
        total: u64,
    },
    /// A step completed.
    Step(&'a StepReport),
    /// A checkpoint was written.
    Checkpoint(&'a Path),
}

/// Runs a new fit into `out`, or resumes the one in `out`.
pub struct Job {
    /// Settings (ignored on resume: the run directory's own are used).
    pub config: FitConfig,
    /// Run directory.
    pub out: PathBuf,
    /// Continue the run in `out` from its last checkpoint.
    pub resume: bool,
    /// Describes the device for the summary.
    pub device_name: String,
}

/// The run's peak memory and what measured it: the device allocator where
/// the backend has one (sampled during steps), else the host process.
fn peak_memory<B>(fit: &Fit<B>) -> (Option<u64>, &'static str)
where
    B: AutodiffBackend + SplatBackend,
    B::InnerBackend: crate::op::FusedLoss,
{
    fit.profiler().peak_or_host()
}

impl Job {
    /// Runs to the end. `observe` sees every event and may stop the run
    /// (as a kill would: nothing more is written).
    pub fn run<B>(
        &self,
        device: &B::Device,
        mut observe: impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Option<Summary>, SplatError>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: crate::op::FusedLoss,
    {
        let (dir, config, picture, mut fit, mut wall_before) = if self.resume {
            self.open_for_resume::<B>(device)?
        } else {
            // Validate everything before the directory exists.
            let picture = load_image(&self.config.image)?;
            let fit = Fit::<B>::new(&picture, &self.config, device)?;
            let dir = RunDir::create(&self.out)?;
            // An absolute image path, so that `--resume` works from any directory.
            let mut config = self.config.clone();
            if let Ok(abs) = std::fs::canonicalize(&config.image) {
                config.image = abs.display().to_string();
            }
            dir.write("config.toml", config.to_toml().as_bytes())?;
            (dir, config, picture, fit, 0.0)
        };
        let mut result = self.drive(&dir, &config, &picture, &mut fit, &mut wall_before, &mut observe);
        // The memory report is written however the run ended.
        let _ = self.write_memory_report(&dir, &fit);
        if let Err(e) = &result
            && e.is_out_of_memory()
            && let SplatError::Device { step, phase, .. } = e
        {
            result = Err(self.write_oom_report(&dir, &fit, e, *step, phase));
        }
        if let Err(e) = &result {
            let _ = dir.write(
                "error.json",
                json!({ "error": e.to_string(), "step": fit.step_count() })
                    .to_string()
                    .as_bytes(),
            );
        }
        result
    }

    #[allow(clippy::type_complexity)]
    fn open_for_resume<B>(&self, device: &B::Device) -> Result<(RunDir, FitConfig, Picture, Fit<B>, f64), SplatError>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: crate::op::FusedLoss,
    {
        let dir = RunDir::open(&self.out)?;
        let not_resumable = |why: &str| RunDirError::NotResumable {
            path: self.out.clone(),
            why: why.into(),
        };
        if dir.path("summary.json").exists() {
            return Err(not_resumable("the run already finished (summary.json exists)").into());
        }
        let config = FitConfig::load(&dir.path("config.toml"))?;
        let picture = load_image(&config.image)?;
        let _ = std::fs::remove_file(dir.path("error.json"));
        // The newest checkpoint that reads back whole; none: start over.
        for path in vramfit::run::checkpoints_newest_first(&dir.checkpoints()) {
            if let Ok(ckpt) = ArrayFile::read(&path) {
                let wall = ckpt.meta.get("wall_seconds").and_then(|v| v.as_f64()).unwrap_or(0.0);
                return Ok((
                    dir,
                    config.clone(),
                    picture.clone(),
                    Fit::resume(&picture, &config, &ckpt, device)?,
                    wall,
                ));
            }
        }
        let fit = Fit::new(&picture, &config, device)?;
        Ok((dir, config, picture, fit, 0.0))
    }

    /// Writes `oom.json` (the error, the last recorded breakdown, the
    /// largest tensors) and returns the error to show the user.
    fn write_oom_report<B>(
        &self,
        dir: &RunDir,
        fit: &Fit<B>,
        e: &SplatError,
        step: u64,
        phase: &'static str,
    ) -> SplatError
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: crate::op::FusedLoss,
    {
        let message = match e {
            SplatError::Device { message, .. } => message.as_str(),
            _ => "",
        };
        let tensors = fit.tensor_sizes();
        let mut oom =
            vramfit::profile::oom_report(&e.to_string(), message, step, phase, fit.profiler().records(), &tensors);
        oom.json["gaussians"] = json!(fit.len());
        let path = dir.path("oom.json");
        if let Err(write) = dir.write(
            "oom.json",
            serde_json::to_string_pretty(&oom.json).expect("plain data").as_bytes(),
        ) {
            return write.into();
        }
        SplatError::OutOfMemory {
            step,
            phase,
            requested: oom.requested,
            largest: oom.largest,
            report: path,
        }
    }

    /// Writes `memory.json`: the profiler's timeline, and the peak from the
    /// allocator's readings where the backend has them, else the host peak.
    fn write_memory_report<B>(&self, dir: &RunDir, fit: &Fit<B>) -> Result<(), SplatError>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: crate::op::FusedLoss,
    {
        let (peak, source) = peak_memory(fit);
        let mut report = fit.profiler().report(&self.device_name, peak, source);
        report.largest_tensors = fit.tensor_sizes().into_iter().take(10).collect();
        dir.write(
            "memory.json",
            serde_json::to_string_pretty(&report).expect("plain data").as_bytes(),
        )?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn drive<B>(
        &self,
        dir: &RunDir,
        config: &FitConfig,
        picture: &Picture,
        fit: &mut Fit<B>,
        wall_before: &mut f64,
        observe: &mut impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Option<Summary>, SplatError>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: crate::op::FusedLoss,
    {
        let mut metrics = dir.metrics(Some(fit.step_count()))?;
        let tb_err = |e: std::io::Error| SplatError::Write {
            path: dir.root().into(),
            why: format!("TensorBoard events: {e}"),
        };
        let mut events = EventWriter::create(dir.root()).map_err(tb_err)?;
        let started = Instant::now();
        let mut step_ms = Vec::new();
        if observe(Event::Start {
            done: fit.step_count(),
            total: config.steps,
        })
        .is_break()
        {
            return Ok(None);
        }
        while !fit.finished() {
            let next = fit.step_count() + 1;
            let want_frame = config.frame_every > 0 && next.is_multiple_of(config.frame_every);
            let t0 = Instant::now();
            let report = fit.step(want_frame)?;
            step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            let step = report.step;
            if step % config.log_every == 0 || report.added > 0 || report.decayed || fit.finished() {
                metrics.append(&json!({
                    "step": step, "loss": report.loss, "psnr_db": report.psnr_db, "ssim": report.ssim,
                    "gaussians": report.gaussians, "added": report.added, "lr_decayed": report.decayed,
                    "wall_seconds": *wall_before + started.elapsed().as_secs_f64(),
                }))?;
                let mut scalars = vec![("loss", report.loss as f64), ("gaussians", report.gaussians as f64)];
                scalars.extend(report.psnr_db.map(|v| ("psnr_db", v)));
                scalars.extend(report.ssim.map(|v| ("ssim", v)));
                events.scalars(step, &scalars).map_err(tb_err)?;
            }
            let memory: Vec<(String, f64)> = fit
                .profiler()
                .records()
                .iter()
                .filter(|r| r.step == step)
                .flat_map(|r| {
                    let cats = r
                        .categories
                        .iter()
                        .map(move |(c, b)| (format!("memory/{}/{}", r.phase, c.name()), *b as f64));
                    cats.chain(std::iter::once((
                        format!("memory/{}/allocated", r.phase),
                        r.allocated() as f64,
                    )))
                })
                .collect();
            if !memory.is_empty() {
                let tags: Vec<(&str, f64)> = memory.iter().map(|(t, v)| (t.as_str(), *v)).collect();
                events.scalars(step, &tags).map_err(tb_err)?;
            }
            if let Some(frame) = &report.frame {
                save_png(
                    &dir.path(&format!("frames/step-{step:08}.png")),
                    &to_rgb8(picture.width, picture.height, frame),
                )?;
            }
            if observe(Event::Step(&report)).is_break() {
                return Ok(None);
            }
            if config.checkpoint_every > 0 && step % config.checkpoint_every == 0 && !fit.finished() {
                let mut ckpt = fit.checkpoint();
                ckpt.meta["wall_seconds"] = json!(*wall_before + started.elapsed().as_secs_f64());
                let path = dir.checkpoints().join(vramfit::run::checkpoint_name(step));
                vramfit::run::atomic_write(&path, &ckpt.to_bytes()).map_err(|e| SplatError::Write {
                    path: path.clone(),
                    why: e.to_string(),
                })?;
                for old in vramfit::run::checkpoints_newest_first(&dir.checkpoints())
                    .into_iter()
                    .skip(KEEP_CHECKPOINTS)
                {
                    let _ = std::fs::remove_file(old);
                }
                if observe(Event::Checkpoint(&path)).is_break() {
                    return Ok(None);
                }
            }
        }
        let gaussians = fit.gaussians();
        gaussians.save(&dir.path("gaussians.vfg"))?;
        let (render, psnr_db, ssim) = fit.evaluate()?;
        save_png(
            &dir.path("render.png"),
            &to_rgb8(picture.width, picture.height, &render),
        )?;
        step_ms.sort_by(f64::total_cmp);
        let (peak, peak_source) = peak_memory(fit);
        let summary = Summary {
            image: config.image.clone(),
            width: picture.width,
            height: picture.height,
            psnr_db,
            ssim,
            bits_per_pixel: gaussians.bits_per_pixel(),
            gaussians: gaussians.len(),
            steps: fit.step_count(),
            stopped_early: fit.stopped_early(),
            wall_seconds: *wall_before + started.elapsed().as_secs_f64(),
            median_step_ms: step_ms.get(step_ms.len() / 2).copied().unwrap_or(0.0),
            peak_memory_bytes: peak.unwrap_or(0),
            peak_memory_source: peak_source.into(),
            reserved_peak_bytes: fit.profiler().peak().map(|_| fit.profiler().other_peaks().reserved),
            driver_peak_bytes: fit.profiler().other_peaks().driver,
            driver_context_bytes: fit.profiler().driver_context(),
            device: self.device_name.clone(),
        };
        dir.write(
            "summary.json",
            serde_json::to_string_pretty(&summary).expect("plain data").as_bytes(),
        )?;
        Ok(Some(summary))
    }
}
