//! A user's own model as a workload of the run driver and a target of the
//! planner: any [`Trainable`] model, a function that makes its batches, and
//! the knobs of a plan. This is how a Burn user profiles their model and
//! plans it into a memory budget without writing a workload.
//!
//! The state it snapshots (parameters, Adam moments and step, the loss
//! scaler) is written and read by [`save_state`] and [`load_state`], which
//! the transformer workload uses too.

use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType};
use serde_json::json;

use crate::allocator::{Cleanup, CleanupPolicy};
use crate::batch::MicroBatching;
use crate::optim::{AdamConfig, AdamSnapshot, ModuleAdam};
use crate::params::{Snapshot, describe, restore, snapshot};
use crate::plan::{Calibration, Knobs, Measured, Plannable, Runnable, SIMULATED_OOM, Space, run_probe};
use crate::precision::{Autocast, LossScaler, Precision, ScalerConfig, ScalerState};
use crate::profile::{Accounted, DeviceMemory, MemoryReport, MemorySource, NamedTensor};
use crate::run::{ArrayFile, Cadence, DeviceFailure, Finished, Run, RunError, RunStats, Start, StepRecord, Workload};
use crate::step::{StepError, StepObserver, Stepper, Trainable};
use crate::storage::{StoragePolicy, parameter_bytes};

const CHECKPOINT_KIND: &str = "vramfit.trainer.checkpoint";

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
    /// Adam's learning rate (constant).
    pub lr: f64,
    /// Steps between checkpoints (0: none).
    pub checkpoint_every: u64,
    /// Steps between memory records (0: none).
    pub profile_every: u64,
}

/// Parameters, Adam moments and step, the loss scaler and `meta` as one array file.
pub fn save_state<B: AutodiffBackend, M: burn::module::AutodiffModule<B>>(
    kind: &str,
    model: &M,
    stepper: &Stepper<B>,
    mut meta: serde_json::Value,
) -> ArrayFile {
    let adam = stepper.optimizer.snapshot();
    let params = snapshot(model);
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
        file.insert(&format!("adam_m/{path}"), vec![m.len()], m);
        file.insert(&format!("adam_v/{path}"), vec![v.len()], v);
    }
    file
}

/// Restores what [`save_state`] wrote into `model` and `stepper`; returns the model.
pub fn load_state<B: AutodiffBackend, M: burn::module::AutodiffModule<B>>(
    file: &ArrayFile,
    model: M,
    stepper: &mut Stepper<B>,
    device: &B::Device,
) -> Result<M, String> {
    let mut params = Snapshot::new();
    let mut adam = AdamSnapshot::default();
    for (name, (shape, values)) in &file.arrays {
        if let Some(p) = name.strip_prefix("param/") {
            params.insert(p.into(), (shape.clone(), DType::F32, values.clone()));
        } else if let Some(p) = name.strip_prefix("adam_m/") {
            adam.moments.entry(p.into()).or_default().0 = values.clone();
        } else if let Some(p) = name.strip_prefix("adam_v/") {
            adam.moments.entry(p.into()).or_default().1 = values.clone();
        }
    }
    let meta = |key: &str| file.meta.get(key).cloned().unwrap_or_default();
    adam.step = meta("optimizer_steps").as_u64().unwrap_or(0);
    let model = restore(model, &params).map_err(|e| e.to_string())?;
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
        optimizer: ModuleAdam::new(
            AdamConfig::default(),
            0.0,
            if knobs.low_moments {
                FloatDType::BF16
            } else {
                FloatDType::F32
            },
        ),
        cleanup: Cleanup::new(if knobs.cleanup {
            CleanupPolicy::Every(1)
        } else {
            CleanupPolicy::Never
        }),
        attempts: 0,
    };
    (stepper, storage)
}

/// A user's model trained with a plan's knobs: a [`Workload`].
pub struct Trainer<B: AutodiffBackend, M: Trainable<B, D>, const D: usize> {
    model: M,
    stepper: Stepper<B>,
    batches: Batches<B, M::Batch>,
    schedule: Schedule,
    last_loss: f64,
    device: B::Device,
}

/// The trainer's fields of `summary.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainerSummary {
    /// Loss of the last step.
    pub final_loss: f64,
    /// Bytes of parameters as stored.
    pub parameter_bytes: u64,
    /// Bytes of Adam moments.
    pub optimizer_state_bytes: u64,
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

impl<B, M, const D: usize> Trainer<B, M, D>
where
    B: AutodiffBackend,
    M: Trainable<B, D>,
{
    /// `model` trained with `knobs` on `batches`.
    pub fn new(
        model: M,
        batches: Batches<B, M::Batch>,
        schedule: Schedule,
        knobs: &Knobs,
        device: &B::Device,
    ) -> Result<Self, TrainerError> {
        if knobs.micro_batch == 0 || !schedule.batch_size.is_multiple_of(knobs.micro_batch) {
            return Err(TrainerError::Setting(format!(
                "micro-batch {} does not divide the batch {}",
                knobs.micro_batch, schedule.batch_size
            )));
        }
        if knobs.checkpointed.len() != model.blocks().len() {
            return Err(TrainerError::Setting(format!(
                "{} checkpoint marks for {} blocks",
                knobs.checkpointed.len(),
                model.blocks().len()
            )));
        }
        let groups: Vec<String> = parameter_groups(&model).into_iter().map(|(g, _)| g).collect();
        let (stepper, storage) = stepper_for::<B>(knobs, schedule.batch_size, &groups);
        let model = storage.apply(model).map_err(|e| TrainerError::Setting(e.to_string()))?;
        Ok(Self {
            model,
            stepper,
            batches,
            schedule,
            last_loss: f64::NAN,
            device: device.clone(),
        })
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }
}

impl<B, M, const D: usize> Workload for Trainer<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D>,
{
    type Summary = TrainerSummary;
    type Error = TrainerError;

    fn checkpoint_kind(&self) -> &'static str {
        CHECKPOINT_KIND
    }
    fn cadence(&self) -> Cadence {
        Cadence {
            log_every: 1,
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
    fn finished(&self) -> bool {
        self.stepper.attempts >= self.schedule.steps
    }
    fn accounted(&self) -> Accounted {
        self.stepper.accounted(&self.model)
    }
    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, TrainerError> {
        let step = self.stepper.attempts + 1;
        let batch = (self.batches)(step, self.schedule.batch_size, &self.device);
        let (model, out) = self
            .stepper
            .step(self.model.clone(), &batch, self.schedule.lr, &self.device, observer)?;
        self.model = model;
        self.last_loss = out.loss;
        Ok(StepRecord {
            step,
            loss: out.loss,
            status: format!("loss {:.4}", out.loss),
            ..Default::default()
        })
    }
    fn snapshot(&self) -> Result<ArrayFile, TrainerError> {
        Ok(save_state(CHECKPOINT_KIND, &self.model, &self.stepper, json!({})))
    }
    fn restore(&mut self, file: &ArrayFile) -> Result<(), TrainerError> {
        self.model =
            load_state(file, self.model.clone(), &mut self.stepper, &self.device).map_err(TrainerError::Checkpoint)?;
        Ok(())
    }
    fn tensors(&self) -> Vec<NamedTensor> {
        crate::params::named_tensors(&self.model)
    }
    fn advice(&self, _: &MemoryReport) -> Vec<String> {
        vec!["plan it into a budget: vramfit::plan::run_within with a TrainerTarget".into()]
    }
    fn device_failure(error: &TrainerError) -> Option<DeviceFailure> {
        match error {
            TrainerError::Step(e) => e.device_failure(),
            _ => None,
        }
    }
    fn finish(&mut self, _: &RunStats) -> Result<Finished<TrainerSummary>, TrainerError> {
        Ok(Finished {
            summary: TrainerSummary {
                final_loss: self.last_loss,
                parameter_bytes: parameter_bytes(&self.model),
                optimizer_state_bytes: self.stepper.optimizer.state_bytes(),
            },
            files: Vec::new(),
        })
    }
}

/// A user's model for the planner: how to make it, its batches, and the
/// schedule; each probe is a short [`Trainer`] run through the run driver.
pub struct TrainerTarget<B: AutodiffBackend, M: Trainable<B, D>, const D: usize> {
    make: Maker<B, M>,
    batches: Batches<B, M::Batch>,
    schedule: Schedule,
    space: Space,
    device: B::Device,
}

impl<B, M, const D: usize> TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D>,
{
    /// The model `make` builds, trained on `batches` with `schedule` on `device`.
    pub fn new(
        make: impl Fn(&B::Device) -> M + Send + Sync + 'static,
        batches: Batches<B, M::Batch>,
        schedule: Schedule,
        device: &B::Device,
    ) -> Self {
        let model = make(device);
        // What a checkpointed block keeps per sample: the chain's input.
        let one = batches(1, 1, device);
        let input = model.prelude(&one, &Autocast::new(Precision::F32));
        let block_input_bytes = (input.shape().num_elements() * 4) as u64;
        let bf16 = B::supports_dtype(device, DType::BF16);
        let space = Space {
            batch: schedule.batch_size,
            blocks: model.blocks().len(),
            block_input_bytes,
            precisions: [Precision::F32, Precision::Bf16, Precision::F16]
                .into_iter()
                .filter(|p| B::supports_dtype(device, DType::from(p.dtype())))
                .collect(),
            storage_groups: if bf16 { parameter_groups(&model) } else { Vec::new() },
            low_moments: bf16,
            batch_statistics: None,
            block_shapes: Vec::new(),
        };
        Self {
            make: Arc::new(make),
            batches,
            schedule,
            space,
            device: device.clone(),
        }
    }

    /// The trainer for a full run with `knobs`.
    pub fn trainer(&self, knobs: &Knobs) -> Result<Trainer<B, M, D>, TrainerError> {
        self.trainer_on(knobs, self.schedule.clone())
    }

    /// A fresh model trained with `knobs` on `schedule`.
    fn trainer_on(&self, knobs: &Knobs, schedule: Schedule) -> Result<Trainer<B, M, D>, TrainerError> {
        Trainer::new(
            (self.make)(&self.device),
            self.batches.clone(),
            schedule,
            knobs,
            &self.device,
        )
    }
}

impl<B, M, const D: usize> Plannable for TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D>,
{
    fn space(&self) -> Space {
        self.space.clone()
    }

    fn measure(&mut self, knobs: &Knobs, batch: usize) -> Result<Measured, String> {
        run_probe::<B, _, _>(&self.device, |steps| {
            let schedule = Schedule {
                steps,
                batch_size: batch,
                // Checkpoint writes count towards the peak (host copies): probed when the run makes them.
                checkpoint_every: if self.schedule.checkpoint_every > 0 { 2 } else { 0 },
                profile_every: 1,
                ..self.schedule.clone()
            };
            self.trainer_on(knobs, schedule)
        })
    }
}

/// A planned run of the user's model: its settings are the plan's knobs
/// (`config.toml` holds them, so a fallback rewrites them and resumes).
impl<B, M, const D: usize> Runnable for TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D> + 'static,
{
    type Strategy = Calibration;
    type Settings = Knobs;
    type Workload = Trainer<B, M, D>;
    type Error = RunError;

    fn target(&mut self) -> &mut (dyn Plannable + 'static) {
        self
    }
    fn settings(&self, knobs: &Knobs) -> Knobs {
        knobs.clone()
    }
    fn to_toml(knobs: &Knobs) -> String {
        toml::to_string(knobs).expect("knobs are plain data")
    }
    fn launch(&self, start: Start<Knobs>) -> Result<(Run, Self::Workload), RunError> {
        // A fallback starts from pools that hold nothing of the failed attempt:
        // on CubeCL reserved bytes only shrink on a cleanup, and they are the budget's figure.
        B::memory_cleanup(&self.device);
        let device = B::name(&self.device);
        let trainer = |knobs: &Knobs| self.trainer(knobs).map_err(|e| RunError::Workload(Box::new(e)));
        match start {
            Start::New(knobs, out) => {
                let workload = trainer(&knobs)?;
                Ok((Run::create(&out, &Self::to_toml(&knobs), &device)?, workload))
            }
            Start::Resume(dir) => {
                let (run, text) = Run::open(&dir, &device)?;
                let knobs: Knobs = toml::from_str(&text).map_err(|e| {
                    RunError::Workload(Box::new(TrainerError::Setting(format!(
                        "{}: not a plan's knobs: {e}",
                        dir.join("config.toml").display()
                    ))))
                })?;
                Ok((run, trainer(&knobs)?))
            }
        }
    }
    fn is_oom(error: &RunError) -> bool {
        matches!(error, RunError::OutOfMemory(_))
    }
    fn simulated_oom(step: u64) -> TrainerError {
        TrainerError::Step(StepError::Device {
            step,
            reason: SIMULATED_OOM.into(),
        })
    }
}
