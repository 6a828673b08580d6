//! A scene fit as a workload of the run driver ([`vramfit::run::Workload`]):
//! its settings (`config.toml`), its step in two phases for the profiler
//! (`forward_backward`, `optimizer`), its state (the parameter groups,
//! Adam's moments, the step) for checkpoints and an exact resume, and its
//! files: `gaussians.ply` in the layout 3DGS viewers read, and the
//! held-out PSNR in `summary.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;
use vramfit::allocator::{Cleanup, CleanupPolicy};
use vramfit::optim::Moments;
use vramfit::profile::{Accounted, Category, HeapSource, MemorySource, NamedTensor};
use vramfit::run::{ArrayFile, Cadence, Finished, Run, RunError, RunStats, Start, StepRecord, Workload};
use vramfit::step::StepObserver;

use crate::dataset::{Dataset, DatasetError};
use crate::densify::{Densify, Stats};
use crate::sh_storage::ShStorage;
use crate::synthetic::{Builtin, Spec};
use crate::train::{Fit, GROUPS, LearningRates, SceneDevice, Settings, State};

const CHECKPOINT_KIND: &str = "vramfit.scene.checkpoint";
/// What starts a scene fit, as its run directory records it.
const WORKLOAD: &str = "vramfit scene";

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
    /// A built-in scene's views, image width and height, sparse points.
    pub views: usize,
    /// Built-in scene: image width.
    pub width: usize,
    /// Built-in scene: image height.
    pub height: usize,
    /// Built-in scene: sparse points.
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
            if dir.join("transforms_train.json").is_file() {
                crate::nerf::read(dir)?
            } else {
                crate::colmap::read(dir)?
            }
        };
        Ok(data.downscaled(self.downscale)?)
    }

    fn settings(&self) -> Settings {
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

/// Why a scene fit stopped.
#[derive(Debug, thiserror::Error)]
pub enum SceneError {
    /// A setting.
    #[error("{0}")]
    Setting(String),
    /// The dataset.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// The run driver.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A checkpoint that does not fit this fit.
    #[error("checkpoint does not match the scene: {0}")]
    Checkpoint(String),
    /// The device running the fit failed (out of memory, lost device).
    #[error("device: {0}")]
    Device(String),
    /// The device failed during a step's phase.
    #[error("device, at step {step} ({phase}): {message}")]
    DeviceStep {
        /// The step.
        step: u64,
        /// The phase (`forward_backward`, `optimizer`).
        phase: &'static str,
        /// The device's words.
        message: String,
    },
}

/// Makes the device that holds a fit's state, with Adam's moments where
/// the run's settings say and the SH groups stored as they say.
pub type DeviceMaker = Box<dyn FnOnce(Moments, ShStorage) -> Box<dyn SceneDevice>>;

/// Where a scene fit runs: the CPU twin, or a device holding its state.
pub struct Placement {
    /// The device running the steps (`None`: the CPU twin).
    pub device: Option<DeviceMaker>,
    /// The profiler's reading of where the fit's memory lives.
    pub memory: Box<dyn Fn() -> Box<dyn MemorySource>>,
    /// What runs it, for reports.
    pub name: String,
}

impl Placement {
    /// The CPU twin: the arrays live on the process heap.
    pub fn cpu() -> Self {
        Self {
            device: None,
            memory: Box::new(HeapSource::if_installed),
            name: "cpu (the scene renderer's CPU twin)".into(),
        }
    }
}

/// A scene fit's fields of `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SceneSummary {
    /// Mean PSNR over the held-out views at the end (dB).
    pub held_out_psnr_db: f64,
    /// Mean SSIM over the held-out views at the end.
    #[serde(default)]
    pub held_out_ssim: f64,
    /// The same for the Gaussians as seeded, before any step (dB).
    pub initial_psnr_db: f64,
    /// Views trained on and held out.
    pub views: [usize; 2],
    /// Gaussians at the end.
    pub gaussians: usize,
    /// Densification over the fit's last session: cloned, split, pruned,
    /// and candidates left out at the cap.
    pub densified: [usize; 4],
    /// Final SH degree.
    pub sh_degree: usize,
    /// Bytes of each parameter group (f32).
    pub parameter_bytes: serde_json::Map<String, serde_json::Value>,
    /// Loss of the last step.
    pub final_loss: f64,
    /// Bytes of Adam's moments in host memory (`moments = host`), and
    /// bytes copied between host and device by the last step.
    #[serde(default)]
    pub host_bytes: [u64; 2],
    /// Allocator cleanups over the run's last session (`allocator_cleanup`)
    /// and the seconds they took (a device sync and the cleanup each).
    #[serde(default)]
    pub allocator_cleanups: u64,
    #[serde(default)]
    pub cleanup_seconds: f64,
    /// How the device stored the SH coefficients.
    #[serde(default)]
    pub sh_storage: ShStorage,
    /// With the moments on the host: the median step's milliseconds in
    /// copies between host and device and in the host's Adam (this
    /// session's steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_step_ms: Option<[f64; 2]>,
}

/// The workload.
pub struct SceneJob {
    config: SceneConfig,
    fit: Fit,
    initial_psnr: f64,
    memory: Box<dyn Fn() -> Box<dyn MemorySource>>,
    /// The allocator cleanup cadence and what it has cost this session.
    cleanup: Cleanup,
    /// Each step's copy and host-Adam milliseconds this session (moments on the host).
    host_times: Vec<[f64; 2]>,
    /// [`Dataset::fingerprint`], kept in checkpoints.
    dataset_fingerprint: String,
}

/// The median of each of the pair's two parts.
pub(crate) fn median_pair(values: &[[f64; 2]]) -> Option<[f64; 2]> {
    if values.is_empty() {
        return None;
    }
    Some(std::array::from_fn(|i| {
        let mut v: Vec<f64> = values.iter().map(|p| p[i]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }))
}

impl SceneJob {
    /// Reads the dataset and seeds the Gaussians.
    pub fn new(config: SceneConfig, placement: Placement) -> Result<Self, SceneError> {
        config.check()?;
        if config.sh_storage != ShStorage::F32 && placement.device.is_none() {
            return Err(SceneError::Setting(format!(
                "sh_storage = \"{}\" stores the SH coefficients in 16 bits in a GPU's memory; the CPU twin \
                 (--device cpu) renders in f32. Use --device wgpu or cuda, or sh_storage = \"f32\"",
                config.sh_storage
            )));
        }
        if config.moments == Moments::Host && placement.device.is_none() {
            return Err(SceneError::Setting(
                "moments = \"host\" keeps Adam's state in host memory instead of a GPU's; on the CPU twin \
                 (--device cpu) everything is in host memory already. Use --device wgpu or cuda, or moments = \"device\""
                    .into(),
            ));
        }
        // Checked above: the cadence parses.
        let cleanup = Cleanup::new(CleanupPolicy::parse(&config.allocator_cleanup).unwrap_or_default());
        let data = config.dataset()?;
        let dataset_fingerprint = format!("{:016x}", data.fingerprint());
        let mut fit = Fit::new(data, config.settings())?;
        if let Some(make) = placement.device {
            fit = fit
                .on_device(make(config.moments, config.sh_storage))
                .map_err(SceneError::Device)?;
        }
        let initial_psnr = fit.held_out_psnr().map_err(SceneError::Device)?;
        Ok(Self {
            config,
            fit,
            initial_psnr,
            cleanup,
            host_times: Vec::new(),
            memory: placement.memory,
            dataset_fingerprint,
        })
    }

    /// The fit.
    pub fn fit(&self) -> &Fit {
        &self.fit
    }

    /// Floats a Gaussian holds in each group (the SH rest at the final degree).
    fn widths(&self) -> [usize; 6] {
        crate::cpu::render::group_widths(self.config.sh_degree)
    }
}

/// Starts a new scene fit, or opens a run directory to resume it.
pub fn launch(start: Start<SceneConfig>, placement: Placement) -> Result<(Run, SceneJob), SceneError> {
    let device_name = placement.name.clone();
    match start {
        Start::New(mut config, out) => {
            // An absolute dataset path, so that `--resume` works from any directory.
            if config.builtin().is_none()
                && let Ok(abs) = std::fs::canonicalize(&config.dataset)
            {
                config.dataset = abs.display().to_string();
            }
            let job = SceneJob::new(config, placement)?;
            let run = Run::create(&out, &job.config.to_toml(), &device_name, WORKLOAD)?;
            Ok((run, job))
        }
        Start::Resume(dir) => {
            let (run, text) = Run::open(&dir, &device_name, WORKLOAD)?;
            let config = SceneConfig::from_toml(&text, &PathBuf::from(&dir).join("config.toml"))
                .map_err(|e| run.settings_error(e))?;
            Ok((run, SceneJob::new(config, placement)?))
        }
    }
}

fn bytes(values: usize) -> u64 {
    4 * values as u64
}

impl Workload for SceneJob {
    type Summary = SceneSummary;
    type Error = SceneError;

    fn checkpoint_kind(&self) -> &'static str {
        CHECKPOINT_KIND
    }
    fn cadence(&self) -> Cadence {
        Cadence {
            log_every: self.config.log_every,
            checkpoint_every: self.config.checkpoint_every,
            profile_every: self.config.profile_every,
            profile_sample_ms: 2,
        }
    }
    fn memory_source(&self) -> Box<dyn MemorySource> {
        (self.memory)()
    }
    fn steps_done(&self) -> u64 {
        self.fit.step
    }
    fn total_steps(&self) -> u64 {
        self.config.steps
    }
    fn accounted(&self) -> Accounted {
        if let Some([parameters, gradients, optimizer_state, workspace]) = self.fit.device_bytes() {
            // The views stay on the host; the loss reads them there.
            return Accounted {
                parameters,
                gradients,
                optimizer_state,
                inputs: 0,
                workspace,
                activations: None,
            };
        }
        let params = self.fit.len() * self.widths().iter().sum::<usize>();
        let images: usize = self.fit.data().views.iter().map(|v| v.image.len()).sum();
        Accounted {
            parameters: bytes(params),
            gradients: 0,
            optimizer_state: bytes(2 * params),
            inputs: bytes(images),
            workspace: 0,
            activations: None,
        }
    }
    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, SceneError> {
        let failed = |step: u64, phase: &'static str| move |message| SceneError::DeviceStep { step, phase, message };
        let step = self.fit.step + 1;
        self.fit.forward_backward().map_err(failed(step, "forward_backward"))?;
        let held = self.accounted();
        // A device says what gradients it holds (with the moments on the
        // host, one chunk's, in its workspace); the CPU twin's are the
        // parameters' size.
        let with_grads = if self.fit.device_bytes().is_some() {
            held
        } else {
            Accounted {
                gradients: held.parameters,
                ..held
            }
        };
        observer.phase("forward_backward", None, &|| with_grads);
        self.fit.optimize().map_err(failed(step, "optimizer"))?;
        let held = Accounted {
            gradients: 0,
            ..self.accounted()
        };
        observer.phase("optimizer", None, &|| held);
        // After the phase is read: the reservation is seen before a
        // cleanup can release it.
        let fit = &self.fit;
        let cleaned = self
            .cleanup
            .run_if_due(step, || fit.cleanup_device())
            .map_err(failed(step, "cleanup"))?;
        let loss = self.fit.last_loss as f64;
        let mut metrics = serde_json::Map::new();
        if let Some(took) = cleaned {
            metrics.insert("cleanup_seconds".into(), json!(took.as_secs_f64()));
        }
        metrics.insert("sh_degree".into(), json!(self.fit.active_degree(self.fit.step)));
        // The moments on the host: the step's copies and host update, timed.
        if let Some([copies, update]) = self.fit.host_times() {
            metrics.insert("transfer_ms".into(), json!(copies));
            metrics.insert("host_adam_ms".into(), json!(update));
            self.host_times.push([copies, update]);
        }
        metrics.insert("gaussians".into(), json!(self.fit.len()));
        let step = self.fit.step;
        let mut files = Vec::new();
        if self.config.frame_every > 0 && (step.is_multiple_of(self.config.frame_every) || step == self.config.steps) {
            let (_, held) = self.fit.data().split();
            if let Some(&view) = held.first() {
                let png = self.fit.render_view(view).map_err(SceneError::Setting)?;
                files.push((format!("frames/step-{step:08}.png"), png));
            }
        }
        Ok(StepRecord {
            step: self.fit.step,
            loss,
            metrics,
            status: format!("loss {loss:.4}"),
            files,
            ..Default::default()
        })
    }
    fn device_failure(error: &SceneError) -> Option<vramfit::run::DeviceFailure> {
        match error {
            SceneError::DeviceStep { step, phase, message } => Some(vramfit::run::DeviceFailure {
                step: *step,
                phase: phase.to_string(),
                message: message.clone(),
            }),
            _ => None,
        }
    }
    fn snapshot(&self) -> Result<ArrayFile, SceneError> {
        let mut file = ArrayFile::new(
            CHECKPOINT_KIND,
            json!({ "step": self.fit.step, "dataset_fingerprint": self.dataset_fingerprint }),
        );
        let state = self.fit.state().map_err(SceneError::Device)?;
        for ((name, group), (m, v)) in GROUPS.iter().zip(state.params.groups()).zip(&state.moments) {
            file.insert(&format!("param/{name}"), vec![group.len()], group.clone());
            file.insert(&format!("adam_m/{name}"), vec![m.len()], m.to_vec());
            file.insert(&format!("adam_v/{name}"), vec![v.len()], v.to_vec());
        }
        let s = &state.stats;
        for (name, values) in [("grad", &s.grad), ("seen", &s.seen), ("max_radius", &s.max_radius)] {
            file.insert(&format!("densify/{name}"), vec![values.len()], values.clone());
        }
        Ok(file)
    }
    fn restore(&mut self, file: &ArrayFile) -> Result<(), SceneError> {
        // Checkpoints from before the fingerprint was kept have none.
        if let Some(then) = file.meta.get("dataset_fingerprint").and_then(|v| v.as_str())
            && then != self.dataset_fingerprint
        {
            return Err(SceneError::Checkpoint(format!(
                "it was written for other images or cameras than {} holds now: the dataset changed since \
                 (put the original back to resume, or start a new run)",
                self.config.dataset
            )));
        }
        let get = |key: String| {
            file.get(&key)
                .map(<[f32]>::to_vec)
                .ok_or_else(|| SceneError::Checkpoint(format!("{key} is missing")))
        };
        let mut params = self.fit.params().map_err(SceneError::Device)?.clone();
        let mut moments = Vec::new();
        for (name, group) in GROUPS.iter().zip(params.groups_mut()) {
            *group = get(format!("param/{name}"))?;
            moments.push((get(format!("adam_m/{name}"))?, get(format!("adam_v/{name}"))?));
        }
        let stats = Stats {
            grad: get("densify/grad".into())?,
            seen: get("densify/seen".into())?,
            max_radius: get("densify/max_radius".into())?,
        };
        let step = file.meta.get("step").and_then(|s| s.as_u64()).unwrap_or(0);
        self.fit
            .restore(State { params, moments, stats }, step)
            .map_err(SceneError::Checkpoint)
    }
    fn tensors(&self) -> Vec<NamedTensor> {
        let n = self.fit.len();
        // As stored: the SH groups in 16 bits where the device keeps them so.
        let per = crate::sh_storage::group_bytes(self.widths(), self.config.sh_storage);
        let mut out: Vec<NamedTensor> = GROUPS
            .iter()
            .zip(per)
            .map(|(name, b)| NamedTensor::new(*name, (n * b) as u64, Category::Parameters))
            .collect();
        out.sort_by_key(|t| std::cmp::Reverse(t.bytes));
        out
    }
    fn finish(&mut self, _: &RunStats) -> Result<Finished<SceneSummary>, SceneError> {
        let (train, held) = self.fit.data().split();
        let params = self.fit.params().map_err(SceneError::Device)?;
        let summary = SceneSummary {
            held_out_psnr_db: self.fit.held_out_psnr().map_err(SceneError::Device)?,
            held_out_ssim: self.fit.held_out_ssim().map_err(SceneError::Device)?,
            initial_psnr_db: self.initial_psnr,
            views: [train.len(), held.len()],
            gaussians: params.len(),
            densified: {
                let d = &self.fit.densified;
                [d.cloned, d.split, d.pruned, d.capped]
            },
            sh_degree: self.config.sh_degree,
            parameter_bytes: GROUPS
                .iter()
                .zip(params.groups())
                .map(|(n, g)| (n.to_string(), json!(bytes(g.len()))))
                .collect(),
            final_loss: self.fit.last_loss as f64,
            host_bytes: self.fit.host_bytes(),
            allocator_cleanups: self.cleanup.calls(),
            sh_storage: self.config.sh_storage,
            cleanup_seconds: self.cleanup.spent().as_secs_f64(),
            host_step_ms: median_pair(&self.host_times),
        };
        Ok(Finished {
            summary,
            files: vec![("gaussians.ply".into(), crate::ply::encode(&params).into())],
        })
    }
}

/// One view of a fitted scene, rendered by [`render_run_view`].
pub struct RenderedView {
    /// PNG bytes.
    pub png: Vec<u8>,
    /// The step of the checkpoint it was rendered from.
    pub step: u64,
    /// Whether the view was held out of training.
    pub held_out: bool,
    /// PSNR of the render against the view's image (dB).
    pub psnr_db: f64,
    /// Views in the dataset.
    pub views: usize,
}

/// View `view` of the scene that the run in `dir` fits, rendered on the CPU
/// twin: from `gaussians.ply` when the run has finished, else from its
/// newest checkpoint that reads back.
pub fn render_run_view(dir: &Path, view: usize) -> Result<RenderedView, SceneError> {
    let config_path = dir.join("config.toml");
    let text = std::fs::read_to_string(&config_path).map_err(|e| {
        SceneError::Setting(format!(
            "{}: cannot read it ({e}); give the run directory of a `vramfit scene` run",
            config_path.display()
        ))
    })?;
    let mut config = SceneConfig::from_toml(&text, &config_path)?;
    // The CPU twin draws the f32 parameters the run saved, wherever the
    // run kept its moments and however its device stored the SH.
    config.moments = Moments::Device;
    config.sh_storage = ShStorage::F32;
    let mut job = SceneJob::new(config, Placement::cpu())?;
    let views = job.fit.data().views.len();
    if view >= views {
        return Err(SceneError::Setting(format!(
            "--view {view}: the scene has {views} views, numbered 0 to {}",
            views - 1
        )));
    }
    let render = |job: &SceneJob| -> Result<RenderedView, SceneError> {
        let fit = &job.fit;
        let image = fit.render_image(view).map_err(SceneError::Device)?;
        Ok(RenderedView {
            png: fit.render_view(view).map_err(SceneError::Device)?,
            step: fit.step,
            held_out: fit.data().split().1.contains(&view),
            psnr_db: crate::train::psnr(&image, &fit.data().views[view].image),
            views,
        })
    };
    // A finished run's Gaussians are in gaussians.ply (no checkpoint is
    // taken at the last step); a run in progress has its checkpoints.
    let ply = dir.join("gaussians.ply");
    if ply.is_file() {
        let read = std::fs::read(&ply).map_err(|e| e.to_string());
        let params = read
            .and_then(|bytes| crate::ply::decode(&bytes))
            .map_err(|e| SceneError::Checkpoint(format!("{}: {e}", ply.display())))?;
        let steps = std::fs::read(dir.join("summary.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|s| s["steps"].as_u64())
            .unwrap_or(0);
        job.fit
            .restore(State::fresh(params), steps)
            .map_err(SceneError::Checkpoint)?;
        return render(&job);
    }
    let checkpoints = vramfit::run::checkpoints_newest_first(&dir.join("checkpoints"));
    let mut why = Vec::new();
    for path in &checkpoints {
        let restored = vramfit::run::ArrayFile::read(path)
            .map_err(|e| e.to_string())
            .and_then(|file| job.restore(&file).map_err(|e| e.to_string()));
        match restored {
            Ok(()) => return render(&job),
            Err(e) => why.push(format!("{}: {e}", path.display())),
        }
    }
    Err(SceneError::Checkpoint(if why.is_empty() {
        format!(
            "no checkpoint in {}: the run has not written one yet (it writes one every checkpoint_every steps and at its end)",
            dir.join("checkpoints").display()
        )
    } else {
        format!("no checkpoint reads back: {}", why.join("; "))
    }))
}
