//! A scene fit as a workload of the run driver ([`vramfit::run::Workload`]):
//! its settings (`config.toml`), its step in two phases for the profiler
//! (`forward_backward`, `optimizer`), its state (the parameter groups,
//! Adam's moments, the step) for checkpoints and an exact resume, and its
//! files: `gaussians.ply` in the layout 3DGS viewers read, and the
//! held-out PSNR in `summary.json`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::json;
use vramfit::allocator::{Cleanup, CleanupPolicy};
use vramfit::optim::Moments;
use vramfit::profile::{Accounted, Category, HeapSource, MemorySource, NamedTensor};
use vramfit::run::{ArrayFile, Cadence, Finished, Run, RunStats, Start, StepRecord, Workload};
use vramfit::step::StepObserver;

use crate::config::SceneConfig;
use crate::densify::Stats;
use crate::error::SceneError;
use crate::fit::{Fit, GROUPS, SceneDevice, State};
use crate::sh_storage::ShStorage;

const CHECKPOINT_KIND: &str = "vramfit.scene.checkpoint";
/// What starts a scene fit, as its run directory records it.
/// The command a scene fit's run directory names as its workload.
pub(crate) const WORKLOAD: &str = "vramfit scene";

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
    pub(crate) fit: Fit,
    initial_psnr: f64,
    memory: Box<dyn Fn() -> Box<dyn MemorySource>>,
    /// The allocator cleanup cadence and what it has cost this session.
    cleanup: Cleanup,
    /// Each step's copy and host-Adam milliseconds this session (moments on the host).
    host_times: Vec<[f64; 2]>,
    /// [`Dataset::fingerprint`], kept in checkpoints.
    dataset_fingerprint: String,
    /// What the user should hear at the first step (the dataset's notes).
    notes: Vec<String>,
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
        let mut data = config.dataset()?;
        let mut notes = std::mem::take(&mut data.notes);
        let dataset_fingerprint = format!("{:016x}", data.fingerprint());
        let mut fit = Fit::new(data, config.settings())?;
        if !fit.any_visible() {
            notes.push(format!(
                "no Gaussian's centre is inside any training view of {}: every camera looks away from where the \
                 Gaussians start, and the fit has nothing to fit (check the poses' convention: COLMAP's are \
                 world-to-camera, NeRF's camera-to-world)",
                config.dataset
            ));
        }
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
            notes,
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
    /// The cadences, more steps, and Adam's moments between the device
    /// and the host (the learning rates are the 3DGS reference's, not settings).
    fn resumable(&self) -> vramfit::run::Resumable {
        vramfit::run::Resumable {
            cadence: &[
                "allocator_cleanup",
                "log_every",
                "frame_every",
                "checkpoint_every",
                "profile_every",
            ],
            learning_rates: &[],
            steps: "steps",
            moments: Some("moments"),
        }
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
            // The views stay on the host; the loss sends each step's up
            // and drops it after (in the workspace).
            return Accounted {
                parameters,
                gradients,
                optimizer_state,
                inputs: 0,
                workspace,
                ..Default::default()
            };
        }
        let params = self.fit.len() * self.widths().iter().sum::<usize>();
        let images: usize = self.fit.data().views.iter().map(|v| v.image.len()).sum();
        Accounted {
            parameters: bytes(params),
            gradients: 0,
            optimizer_state: bytes(2 * params),
            inputs: bytes(images),
            ..Default::default()
        }
    }
    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, SceneError> {
        let failed = |step: u64, phase: &'static str| {
            move |e: crate::fit::FitError| SceneError::DeviceStep {
                step,
                phase,
                message: e.to_string(),
            }
        };
        let step = self.fit.step + 1;
        self.fit.forward_backward().map_err(failed(step, "forward_backward"))?;
        if !self.fit.last_loss.is_finite() {
            return Err(SceneError::NonFinite {
                step,
                value: self.fit.last_loss,
            });
        }
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
                let png = self.fit.render_view(view).map_err(SceneError::Device)?;
                files.push((format!("frames/step-{step:08}.png"), png));
            }
        }
        Ok(StepRecord {
            step: self.fit.step,
            loss,
            metrics,
            status: format!("loss {loss:.4}"),
            files,
            notes: std::mem::take(&mut self.notes),
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
        let d = &self.fit.densified;
        let mut file = ArrayFile::new(
            CHECKPOINT_KIND,
            json!({
                "step": self.fit.step,
                "dataset_fingerprint": self.dataset_fingerprint,
                // What the summary reports of densification so far.
                "densified": [d.cloned, d.split, d.pruned, d.capped],
            }),
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
            .map_err(|e| SceneError::Checkpoint(e.to_string()))?;
        // Checkpoints from before the counts were kept have none.
        let counts = file.meta.get("densified").cloned();
        if let Some([cloned, split, pruned, capped]) = counts.and_then(|d| serde_json::from_value::<[usize; 4]>(d).ok())
        {
            self.fit.densified = crate::densify::Report {
                cloned,
                split,
                pruned,
                capped,
            };
        }
        Ok(())
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
