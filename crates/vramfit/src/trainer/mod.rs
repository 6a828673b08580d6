//! A user's own model as a workload of the run driver and a target of the
//! planner: any [`Trainable`] model, a function that makes its batches, and
//! the knobs of a plan. This is how a Burn user profiles their model and
//! plans it into a memory budget without writing a workload.
//!
//! [`Trainer`] is the one workload of every trainable model: the built-in
//! transformer and U-Net are trainers too, on their own [`Course`] (a
//! learning-rate schedule, their summary fields and advice). The state it
//! snapshots (parameters, Adam moments and step, the loss scaler, the
//! recent losses) is written and read by [`save_state`] and [`load_state`].

mod target;

pub use target::TrainerTarget;

use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType};
use serde_json::json;

use crate::allocator::{Cleanup, CleanupPolicy};
use crate::batch::MicroBatching;
use crate::optim::{AdamConfig, AdamSnapshot, ModuleAdam};
use crate::params::{Snapshot, describe};
use crate::plan::Knobs;
use crate::precision::{Autocast, LossScaler, ScalerConfig, ScalerState};
use crate::profile::{Accounted, DeviceMemory, MemoryReport, MemorySource, NamedTensor};
use crate::run::{ArrayFile, Cadence, DeviceFailure, Finished, Resumable, RunStats, StepRecord, Workload};
use crate::step::{StepError, StepObserver, Stepper, Trainable};
use crate::storage::{StoragePolicy, parameter_bytes};

pub use crate::optim::MOMENT_KEYS;

const CHECKPOINT_KIND: &str = "vramfit.trainer.checkpoint";
/// What starts a run of a user's model, as its run directory records it.
const WORKLOAD: &str = "vramfit::trainer (a user's model)";

/// Makes batch `step` (1-based) of `size` samples on a device.
pub type Batches<B, M> = Arc<dyn Fn(u64, usize, &burn::tensor::Device<B>) -> M + Send + Sync>;

/// Builds the model on a device.
pub type Maker<B, M> = Arc<dyn Fn(&burn::tensor::Device<B>) -> M + Send + Sync>;

/// What a [`Trainer`] runs: steps, batch, learning rate, cadence.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Optimiser steps.
    pub steps: u64,
    /// Samples per optimiser step.
    pub batch_size: usize,
    /// Adam's learning rate (constant unless the [`Course`] schedules it).
    pub lr: f64,
    /// Steps between checkpoints (0: none).
    pub checkpoint_every: u64,
    /// Steps between memory records (0: none).
    pub profile_every: u64,
}

/// Parameters, Adam moments and step, the loss scaler and `meta` as one
/// array file; parameters `rebuilt` picks (rebuilt exactly from the run's
/// settings, such as a frozen base) are neither copied nor written.
pub fn save_state<B: AutodiffBackend, M: burn::module::AutodiffModule<B>>(
    kind: &str,
    model: &M,
    stepper: &Stepper<B>,
    mut meta: serde_json::Value,
    rebuilt: impl Fn(&str) -> bool,
) -> ArrayFile {
    let adam = stepper.optimizer.snapshot();
    let params = crate::params::snapshot_where(model, |path| !rebuilt(path));
    meta["step"] = json!(stepper.attempts);
    meta["optimizer_steps"] = json!(adam.step);
    meta["scaler"] = json!(stepper.scaler.as_ref().map(|s| s.state()));
    meta["stored_types"] = params
        .iter()
        .map(|(k, (_, d, _))| (k.clone(), json!(format!("{d:?}"))))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let mut file = ArrayFile::new(kind, meta);
    for (path, (shape, _, values)) in params {
        file.insert(&format!("param/{path}"), shape, values);
    }
    for (path, (m, v)) in adam.moments {
        file.insert(&format!("{}{path}", MOMENT_KEYS[0]), vec![m.len()], m);
        file.insert(&format!("{}{path}", MOMENT_KEYS[1]), vec![v.len()], v);
    }
    file
}

/// Restores what [`save_state`] wrote into `model` and `stepper`; returns
/// the model. Parameters `rebuilt` picks keep the values `model` has where
/// the file holds none.
pub fn load_state<B: AutodiffBackend, M: burn::module::AutodiffModule<B>>(
    file: &ArrayFile,
    model: M,
    stepper: &mut Stepper<B>,
    device: &B::Device,
    rebuilt: impl Fn(&str) -> bool,
) -> Result<M, String> {
    let mut params = Snapshot::new();
    let mut adam = AdamSnapshot::default();
    for (name, (shape, values)) in &file.arrays {
        if let Some(p) = name.strip_prefix("param/") {
            params.insert(p.into(), (shape.clone(), DType::F32, values.clone()));
        } else if let Some(p) = name.strip_prefix(MOMENT_KEYS[0]) {
            adam.moments.entry(p.into()).or_default().0 = values.clone();
        } else if let Some(p) = name.strip_prefix(MOMENT_KEYS[1]) {
            adam.moments.entry(p.into()).or_default().1 = values.clone();
        }
    }
    // Moments that do not match their parameter would fail the first update.
    for (path, (m, v)) in &adam.moments {
        let Some((shape, ..)) = params.get(path) else {
            return Err(format!(
                "it holds Adam moments for `{path}`, which is not a parameter of the model"
            ));
        };
        let len: usize = shape.iter().product();
        if m.len() != len || v.len() != len {
            return Err(format!(
                "the Adam moments of `{path}` hold {} and {} values for a parameter of {len}",
                m.len(),
                v.len()
            ));
        }
    }
    let meta = |key: &str| file.meta.get(key).cloned().unwrap_or_default();
    adam.step = meta("optimizer_steps").as_u64().unwrap_or(0);
    let model = crate::params::restore_where(model, &params, rebuilt).map_err(|e| e.to_string())?;
    stepper.optimizer.restore(&adam, device);
    stepper.attempts = meta("step").as_u64().unwrap_or(0);
    if let Some(s) = stepper.scaler.as_mut() {
        let saved: ScalerState =
            serde_json::from_value(meta("scaler")).map_err(|e| format!("loss scaler state: {e}"))?;
        *s = LossScaler::resume(ScalerConfig::default(), saved);
    }
    Ok(model)
}

/// The step a plan's knobs give, and the storage policy for `groups` (largest first).
pub fn stepper_for<B: AutodiffBackend>(knobs: &Knobs, batch: usize, groups: &[String]) -> (Stepper<B>, StoragePolicy) {
    let low: Vec<String> = groups[..knobs.low_storage.min(groups.len())]
        .iter()
        .map(|g| format!("{g}:bf16"))
        .collect();
    let storage = StoragePolicy::parse(&low).expect("groups come from the model's own parameter paths");
    let stepper = Stepper {
        autocast: Autocast::new(knobs.precision),
        checkpointed: knobs.checkpointed.clone(),
        batching: MicroBatching {
            micro_batch: knobs.micro_batch,
            accumulate: batch / knobs.micro_batch.max(1),
        },
        scaler: knobs
            .precision
            .needs_loss_scaling()
            .then(|| LossScaler::new(ScalerConfig::default())),
        optimizer: {
            let adam = ModuleAdam::new(
                AdamConfig::default(),
                0.0,
                if knobs.low_moments {
                    FloatDType::BF16
                } else {
                    FloatDType::F32
                },
            );
            if knobs.host_moments { adam.on_host() } else { adam }
        },
        cleanup: Cleanup::new(if knobs.cleanup {
            CleanupPolicy::Every(1)
        } else {
            CleanupPolicy::Never
        }),
        attempts: 0,
        ranks: None,
    };
    (stepper, storage)
}

/// What a model's training run adds to the trainer's loop: its batches,
/// and hooks with defaults (a constant learning rate, no summary fields of
/// its own, no final weights file). A user's model needs only its batches:
/// [`Batches`] is a course. The transformer and the U-Net are courses with
/// a warm-up and cosine schedule, their floors and throughput, and advice
/// in their flags (`vramfit_models::job`).
pub trait Course<B: AutodiffBackend, M: Trainable<B, D>, const D: usize> {
    /// Batch `step` (1-based) of `size` samples: the same for a given step
    /// whatever the run's history, so a resumed run sees the batches it
    /// would have seen.
    fn batch(&self, step: u64, size: usize, device: &B::Device) -> M::Batch;
    /// The learning rate at `step` (default: the schedule's, constant).
    fn lr(&self, schedule: &Schedule, _step: u64) -> f64 {
        schedule.lr
    }
    /// Steps between metric lines (default: every step).
    fn log_every(&self) -> u64 {
        1
    }
    /// The kind stored in its checkpoints.
    fn checkpoint_kind(&self) -> &'static str {
        CHECKPOINT_KIND
    }
    /// A fingerprint of the file the rebuilt parameters are read from
    /// (see [`Course::rebuilt_from_settings`]): kept in each checkpoint; a
    /// resume whose file gives another is refused (the same path, another
    /// base). Default: none.
    fn rebuilt_fingerprint(&self) -> Option<String> {
        None
    }

    /// Whether the parameter at `path` is rebuilt exactly from the run's
    /// settings (a frozen base drawn from its seed or read from the
    /// checkpoint the settings name): then checkpoints and the final
    /// weights leave it out, and a resume keeps the rebuilt value. Default:
    /// none (every parameter is written).
    fn rebuilt_from_settings(&self, _path: &str) -> bool {
        false
    }
    /// A fingerprint of the data the batches are read from (a corpus's
    /// file): kept in each checkpoint; a resume over data that gives
    /// another is refused, since its batches would not be the ones the run
    /// would have seen. Default: none (batches drawn from the seed).
    fn data_fingerprint(&self) -> Option<String> {
        None
    }
    /// Steps between evaluations of held-out data (0, the default: none
    /// during the run; [`Course::evaluate`] still gives the summary's).
    fn evaluate_every(&self) -> u64 {
        0
    }
    /// Figures of `model` on held-out data (e.g. `val_loss`), run
    /// `batching.micro_batch` samples at a time (what fits in training) with
    /// the step's `autocast`: logged with the step every
    /// [`Course::evaluate_every`] steps, and the last in `summary.json`.
    /// Default: none.
    fn evaluate(
        &self,
        _model: &M,
        _batching: &MicroBatching,
        _autocast: &crate::precision::Autocast,
        _device: &B::Device,
    ) -> Vec<(String, f64)> {
        Vec::new()
    }
    /// What a resume may change in its settings: by default the
    /// [`Schedule`]'s learning rate and cadences, and more steps.
    fn resumable(&self) -> Resumable {
        Resumable {
            cadence: &["checkpoint_every", "profile_every"],
            learning_rates: &["lr"],
            ..Resumable::STEPS_ONLY
        }
    }
    /// Files of its own written at the end beside `weights.bin` (name,
    /// contents), e.g. adapters in another library's layout; none by
    /// default. An error ends the run as a failed write would.
    fn files(&self, _model: &M) -> Result<Vec<(String, crate::run::FileBody)>, String> {
        Ok(Vec::new())
    }
    /// The kind of a final `weights.bin`, or `None` for none (the default).
    fn weights_kind(&self) -> Option<&'static str> {
        None
    }
    /// Its own fields of `summary.json` (a floor, a throughput, an
    /// evaluation) for `model` after a run at `median_step_ms` per step.
    fn summary(
        &self,
        _model: &M,
        _batching: &MicroBatching,
        _median_step_ms: f64,
        _device: &B::Device,
    ) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }
    /// What to turn to lower the peak of `report`.
    fn advice(&self, _report: &MemoryReport, _batching: &MicroBatching) -> Vec<String> {
        vec!["plan it into a budget: vramfit::plan::run_within with a TrainerTarget".into()]
    }
}

impl<B, M, const D: usize> Course<B, M, D> for Batches<B, M::Batch>
where
    B: AutodiffBackend,
    M: Trainable<B, D>,
{
    fn batch(&self, step: u64, size: usize, device: &B::Device) -> M::Batch {
        self(step, size, device)
    }
}

/// The techniques a plan's knobs give, as `summary.json` and the settings
/// files name them.
pub fn techniques(knobs: &Knobs, batch: usize, groups: &[String]) -> serde_json::Value {
    json!({
        "precision": knobs.precision.name(),
        "checkpoint": knobs.checkpoint_setting(),
        "micro_batch": knobs.micro_batch,
        "accumulate": batch / knobs.micro_batch.max(1),
        "storage": groups[..knobs.low_storage.min(groups.len())].iter().map(|g| format!("{g}:bf16")).collect::<Vec<_>>(),
        "moments": if knobs.host_moments { "host" } else if knobs.low_moments { "bf16" } else { "f32" },
        "allocator_cleanup": if knobs.cleanup { "step" } else { "never" },
    })
}

/// A model trained by a [`Stepper`] on a [`Course`]: the one [`Workload`]
/// of every trainable model, a user's and the built-in ones alike. Every
/// step logs its learning rate, loss scale and cleanup time; `final_loss`
/// is the mean of the last 10 steps (kept across a resume).
pub struct Trainer<B, M, const D: usize, C = Batches<B, <M as Trainable<B, D>>::Batch>>
where
    B: AutodiffBackend,
    M: Trainable<B, D>,
{
    model: M,
    stepper: Stepper<B>,
    course: C,
    schedule: Schedule,
    /// The techniques in words, for `summary.json`.
    techniques: serde_json::Value,
    /// Losses of the last (up to) 10 steps, for `final_loss` (kept across resumes).
    recent: Vec<f64>,
    /// On data-parallel ranks, the bytes the last step handed to the collectives.
    handed: Option<crate::ranks::Handed>,
    /// The last evaluation and its step: the summary's, where the run
    /// ended on an evaluated step (not computed twice).
    evaluation: Option<(u64, Vec<(String, f64)>)>,
    device: B::Device,
}

/// A training run's fields of `summary.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainSummary {
    /// Mean loss over the last 10 optimiser steps.
    pub final_loss: f64,
    /// Steps skipped by the loss scaler.
    pub skipped_steps: u64,
    /// Final loss scale (1 without a scaler).
    pub loss_scale: f64,
    /// Precision, checkpointing, batch split, storage, moments, cleanup.
    pub techniques: serde_json::Value,
    /// Bytes of parameters as stored.
    pub parameter_bytes: u64,
    /// Bytes of Adam moments on the device.
    pub optimizer_state_bytes: u64,
    /// Bytes of Adam moments in host memory (`moments = host`).
    #[serde(default)]
    pub optimizer_host_bytes: u64,
    /// Allocator cleanups done (last session).
    pub cleanup_calls: u64,
    /// Seconds spent in them.
    pub cleanup_seconds: f64,
    /// The course's own fields ([`Course::summary`]): the transformer's
    /// `entropy_floor` and `tokens_per_second`, for example.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Why a trainer stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// The step.
    #[error(transparent)]
    Step(#[from] StepError),
    /// A setting.
    #[error("{0}")]
    Setting(String),
    /// A checkpoint that does not fit the model.
    #[error("checkpoint does not match the model: {0}")]
    Checkpoint(String),
    /// A final file of the course's own could not be made.
    #[error("making the run's final files: {0}")]
    Files(String),
}

/// A micro-batch that divides the batch, and one checkpoint mark per block.
fn check<B: AutodiffBackend, M: Trainable<B, D>, const D: usize>(
    micro_batch: usize,
    marks: usize,
    model: &M,
    schedule: &Schedule,
) -> Result<(), TrainerError> {
    if micro_batch == 0 || !schedule.batch_size.is_multiple_of(micro_batch) {
        return Err(TrainerError::Setting(format!(
            "micro-batch {micro_batch} does not divide the batch {}",
            schedule.batch_size
        )));
    }
    if marks != model.blocks().len() {
        return Err(TrainerError::Setting(format!(
            "{marks} checkpoint marks for {} blocks",
            model.blocks().len()
        )));
    }
    Ok(())
}

/// The model's top-level parameter groups, largest first, with their bytes.
pub fn parameter_groups<B: burn::tensor::backend::Backend, M: burn::module::Module<B>>(
    model: &M,
) -> Vec<(String, u64)> {
    let mut groups: Vec<(String, u64)> = Vec::new();
    for p in describe(model) {
        let top = p.path.split('.').next().unwrap_or(&p.path).to_string();
        match groups.iter_mut().find(|(g, _)| *g == top) {
            Some((_, bytes)) => *bytes += p.bytes(),
            None => groups.push((top, p.bytes())),
        }
    }
    groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    groups
}

impl<B, M, const D: usize, C> Trainer<B, M, D, C>
where
    B: AutodiffBackend,
    M: Trainable<B, D>,
    C: Course<B, M, D>,
{
    /// `model` trained with a plan's `knobs` on `course`.
    pub fn new(
        model: M,
        course: C,
        schedule: Schedule,
        knobs: &Knobs,
        device: &B::Device,
    ) -> Result<Self, TrainerError> {
        check(knobs.micro_batch, knobs.checkpointed.len(), &model, &schedule)?;
        let groups: Vec<String> = parameter_groups(&model).into_iter().map(|(g, _)| g).collect();
        let (stepper, storage) = stepper_for::<B>(knobs, schedule.batch_size, &groups);
        let model = storage.apply(model).map_err(|e| TrainerError::Setting(e.to_string()))?;
        let techniques = techniques(knobs, schedule.batch_size, &groups);
        Self::with_stepper(model, course, schedule, stepper, techniques, device)
    }

    /// `model` (its storage policy applied) trained by `stepper` on
    /// `course`; `techniques` name the stepper's settings for `summary.json`.
    /// The same checks as [`Trainer::new`]: the micro-batch divides the
    /// batch, one checkpoint mark per block.
    pub fn with_stepper(
        model: M,
        course: C,
        schedule: Schedule,
        stepper: Stepper<B>,
        techniques: serde_json::Value,
        device: &B::Device,
    ) -> Result<Self, TrainerError> {
        let b = &stepper.batching;
        if b.micro_batch * b.accumulate != schedule.batch_size {
            return Err(TrainerError::Setting(format!(
                "micro-batch {} × {} accumulated is not the batch {}",
                b.micro_batch, b.accumulate, schedule.batch_size
            )));
        }
        check(b.micro_batch, stepper.checkpointed.len(), &model, &schedule)?;
        Ok(Self {
            model,
            stepper,
            course,
            schedule,
            techniques,
            recent: Vec::new(),
            handed: None,
            evaluation: None,
            device: device.clone(),
        })
    }

    /// The course.
    pub fn course(&self) -> &C {
        &self.course
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Parameters, Adam state and the recent losses as one array file of `kind`.
    fn to_array_file(&self, kind: &str) -> ArrayFile {
        save_state(
            kind,
            &self.model,
            &self.stepper,
            json!({
                "recent_losses": self.recent,
                "rebuilt_fingerprint": self.course.rebuilt_fingerprint(),
                "data_fingerprint": self.course.data_fingerprint(),
            }),
            |path| self.course.rebuilt_from_settings(path),
        )
    }
}

impl<B, M, const D: usize, C> Workload for Trainer<B, M, D, C>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D>,
    C: Course<B, M, D>,
{
    type Summary = TrainSummary;
    type Error = TrainerError;

    fn checkpoint_kind(&self) -> &'static str {
        self.course.checkpoint_kind()
    }
    fn resumable(&self) -> Resumable {
        self.course.resumable()
    }
    fn cadence(&self) -> Cadence {
        Cadence {
            log_every: self.course.log_every(),
            checkpoint_every: self.schedule.checkpoint_every,
            profile_every: self.schedule.profile_every,
            profile_sample_ms: 2,
        }
    }
    fn memory_source(&self) -> Box<dyn MemorySource> {
        <B::InnerBackend as DeviceMemory>::memory_source(&self.device)
    }
    fn steps_done(&self) -> u64 {
        self.stepper.attempts
    }
    fn total_steps(&self) -> u64 {
        self.schedule.steps
    }
    fn accounted(&self) -> Accounted {
        self.stepper.accounted(&self.model)
    }
    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, TrainerError> {
        let step = self.stepper.attempts + 1;
        let batch = self.course.batch(step, self.schedule.batch_size, &self.device);
        let lr = self.course.lr(&self.schedule, step);
        let handed = self.stepper.ranks.as_ref().map(|r| r.handed());
        let (model, out) = self
            .stepper
            .step(self.model.clone(), &batch, lr, &self.device, observer)?;
        self.model = model;
        // A step the loss scaler skips broadcasts nothing: the summary's
        // figure is the last step taken's.
        let handed = self
            .stepper
            .ranks
            .as_ref()
            .zip(handed)
            .map(|(r, h)| r.handed().since(h));
        if out.stepped || self.handed.is_none() {
            self.handed = handed;
        }
        self.recent.push(out.loss);
        if self.recent.len() > 10 {
            self.recent.remove(0);
        }
        let skipped = self.stepper.scaler.as_ref().map_or(0, |s| s.state().skipped_steps);
        let every = self.course.evaluate_every();
        let evaluated = if every > 0 && step.is_multiple_of(every) {
            self.course.evaluate(
                &self.model,
                &self.stepper.batching,
                &self.stepper.autocast,
                &self.device,
            )
        } else {
            Vec::new()
        };
        let mut metrics = serde_json::Map::new();
        metrics.insert("lr".into(), json!(lr));
        metrics.insert("loss_scale".into(), json!(out.scale));
        metrics.insert("stepped".into(), json!(out.stepped));
        metrics.insert("cleanup_seconds".into(), json!(out.cleanup_seconds));
        if let Some(h) = handed {
            metrics.insert("collective_bytes".into(), json!(h.total()));
        }
        let mut status = format!("loss {:.4}", out.loss);
        let mut scalars = vec![
            ("lr".into(), lr),
            ("loss_scale".into(), out.scale),
            ("skipped_steps".into(), skipped as f64),
        ];
        let evaluated_now = !evaluated.is_empty();
        if evaluated_now {
            self.evaluation = Some((step, evaluated.clone()));
        }
        for (name, value) in evaluated {
            status.push_str(&format!(" · {name} {value:.4}"));
            metrics.insert(name.clone(), json!(value));
            scalars.push((name, value));
        }
        Ok(StepRecord {
            step,
            loss: out.loss,
            metrics,
            scalars,
            // An evaluation is a line of its own in the log.
            notable: !out.stepped || evaluated_now,
            status,
            notes: if out.stepped {
                Vec::new()
            } else {
                vec![format!(
                    "step {step}: inf/NaN gradients at loss scale {}: step skipped, scale halved",
                    out.scale
                )]
            },
            files: Vec::new(),
        })
    }
    fn snapshot(&self) -> Result<ArrayFile, TrainerError> {
        Ok(self.to_array_file(self.course.checkpoint_kind()))
    }
    fn restore(&mut self, file: &ArrayFile) -> Result<(), TrainerError> {
        if let Some(then) = file.meta.get("rebuilt_fingerprint").and_then(|v| v.as_str())
            && Some(then) != self.course.rebuilt_fingerprint().as_deref()
        {
            return Err(TrainerError::Checkpoint(format!(
                "it was trained on a base read from a file whose fingerprint was {then}, and the file the run's \
                 settings name now gives {}: the same path holds another checkpoint; give back the one the run \
                 started from (or start a new run)",
                self.course.rebuilt_fingerprint().unwrap_or_else(|| "none".into())
            )));
        }
        let then = file.meta.get("data_fingerprint").and_then(|v| v.as_str());
        if then.is_some() && then != self.course.data_fingerprint().as_deref() {
            return Err(TrainerError::Checkpoint(format!(
                "it was trained on data whose fingerprint was {}, and the data the run's settings name now gives {}: \
                 the file was changed or replaced, so the batches after the checkpoint would not be the ones the run \
                 would have read; give back the file the run started from (or start a new run)",
                then.unwrap_or_default(),
                self.course.data_fingerprint().unwrap_or_else(|| "none".into())
            )));
        }
        self.model = load_state(file, self.model.clone(), &mut self.stepper, &self.device, |path| {
            self.course.rebuilt_from_settings(path)
        })
        .map_err(TrainerError::Checkpoint)?;
        self.recent =
            serde_json::from_value(file.meta.get("recent_losses").cloned().unwrap_or_default()).unwrap_or_default();
        Ok(())
    }
    fn tensors(&self) -> Vec<NamedTensor> {
        crate::params::named_tensors(&self.model)
    }
    fn advice(&self, report: &MemoryReport) -> Vec<String> {
        self.course.advice(report, &self.stepper.batching)
    }
    fn device_failure(error: &TrainerError) -> Option<DeviceFailure> {
        match error {
            TrainerError::Step(e) => e.device_failure(),
            _ => None,
        }
    }
    fn finish(&mut self, stats: &RunStats) -> Result<Finished<TrainSummary>, TrainerError> {
        let s = &self.stepper;
        let mut summary = TrainSummary {
            final_loss: self.recent.iter().sum::<f64>() / self.recent.len().max(1) as f64,
            skipped_steps: s.scaler.as_ref().map_or(0, |x| x.state().skipped_steps),
            loss_scale: s.scaler.as_ref().map_or(1.0, |x| x.scale()),
            techniques: self.techniques.clone(),
            parameter_bytes: parameter_bytes(&self.model),
            optimizer_state_bytes: s.optimizer.state_bytes(),
            optimizer_host_bytes: s.optimizer.host_bytes(),
            cleanup_calls: s.cleanup.calls(),
            cleanup_seconds: s.cleanup.spent().as_secs_f64(),
            extra: self
                .course
                .summary(&self.model, &s.batching, stats.median_step_ms, &self.device),
        };
        let evaluation = match self.evaluation.take() {
            Some((step, figures)) if step == s.attempts => figures,
            _ => self
                .course
                .evaluate(&self.model, &s.batching, &s.autocast, &self.device),
        };
        for (name, value) in evaluation {
            summary.extra.insert(name, json!(value));
        }
        if let Some(h) = self.handed {
            // The last step taken's: every step taken hands the same bytes.
            summary.extra.insert("collective_bytes_per_step".into(), json!(h));
        }
        // No wall time in the weights: a resumed run writes the same bytes.
        let mut files = match self.course.weights_kind() {
            Some(kind) => vec![(
                "weights.bin".into(),
                crate::run::FileBody::Arrays(self.to_array_file(kind)),
            )],
            None => Vec::new(),
        };
        files.extend(self.course.files(&self.model).map_err(TrainerError::Files)?);
        Ok(Finished { summary, files })
    }
}
