//! A model family's training run as a workload of the run driver
//! ([`vramfit::run::Workload`]): its step is the composed step of
//! [`vramfit::step::Stepper`] on the family's synthetic task, its state is
//! the parameters, the Adam moments and the loss scaler, and its files are
//! `weights.bin` and its fields of `summary.json` (final loss, the
//! family's floor and throughput, parameter and optimiser bytes). Every
//! setting is validated when the workload is built, before a run directory
//! exists. [`Transformer`] and [`Unet`] are its two families.

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use serde_json::json;
use vramfit::allocator::Cleanup;
use vramfit::optim::{AdamConfig, ModuleAdam};
use vramfit::precision::{Autocast, LossScaler, ScalerConfig};
use vramfit::profile::{Accounted, Category, DeviceMemory, MemoryReport, MemorySource, NamedTensor};
use vramfit::run::{
    ArrayFile, Cadence, DeviceFailure, Finished, Run, RunError, RunStats, Start, StepRecord, Workload,
    categories_at_peak,
};
use vramfit::step::{StepError, StepObserver, Stepper};
use vramfit::storage::parameter_bytes;
use vramfit::trainer::{load_state, save_state};

use crate::config::{ConfigError, FamilyConfig};
use crate::family::Family;
use crate::gpt::{GptConfig, TrainConfig};
use crate::unet::UnetConfig;

/// The transformer's training run.
pub type Transformer<B> = Job<B, GptConfig, 3>;

/// The U-Net's training run.
pub type Unet<B> = Job<B, UnetConfig, 4>;

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The run driver (directory, files, out-of-memory).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The step (non-finite loss, collapsed scale, device failure).
    #[error(transparent)]
    Step(#[from] StepError),
    /// A checkpoint does not fit this run's model.
    #[error("checkpoint does not match the run's model: {0}")]
    Checkpoint(String),
}

/// A training run's fields of `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Bytes of Adam moments.
    pub optimizer_state_bytes: u64,
    /// Allocator cleanups done (last session).
    pub cleanup_calls: u64,
    /// Seconds spent in them.
    pub cleanup_seconds: f64,
    /// The family's own fields: its floor, its throughput (the
    /// transformer's `entropy_floor` and `tokens_per_second`).
    #[serde(flatten)]
    pub family: serde_json::Map<String, serde_json::Value>,
}

/// A training run of family `F` on backend `B`.
pub struct Job<B: AutodiffBackend, F: Family<D>, const D: usize> {
    config: FamilyConfig<F>,
    data: F::Data,
    model: F::Net<B>,
    stepper: Stepper<B>,
    /// Losses of the last (up to) 10 steps, for `final_loss` (kept across resumes).
    recent: Vec<f64>,
    device: B::Device,
}

/// Starts a new transformer run, or opens a run directory to resume it
/// ([`Job::launch`]).
pub fn launch<B>(
    start: Start<TrainConfig>,
    device: &B::Device,
    device_name: &str,
) -> Result<(Run, Transformer<B>), TrainError>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    Transformer::<B>::launch(start, device, device_name)
}

impl<B: AutodiffBackend, F: Family<D>, const D: usize> Job<B, F, D> {
    /// Starts a new run, or opens a run directory to resume it (with its
    /// own settings); returns the run and the workload to drive. Settings
    /// are validated before the directory is created.
    pub fn launch(
        start: Start<FamilyConfig<F>>,
        device: &B::Device,
        device_name: &str,
    ) -> Result<(Run, Self), TrainError>
    where
        B::InnerBackend: DeviceMemory,
    {
        match start {
            Start::New(config, out) => {
                let workload = Self::new(config, device)?;
                let run = Run::create(&out, &workload.config.to_toml(), device_name)?;
                Ok((run, workload))
            }
            Start::Resume(out) => {
                let (run, text) = Run::open(&out, device_name)?;
                let config = FamilyConfig::from_toml(&text, &run.dir().path("config.toml"))?;
                Ok((run, Self::new(config, device)?))
            }
        }
    }

    /// Builds the model, the optimiser and the step from validated settings.
    pub fn new(config: FamilyConfig<F>, device: &B::Device) -> Result<Self, TrainError> {
        let r = config.resolve::<B>(device)?;
        let model = config.model.init::<B>(config.seed, device);
        let model = r.storage.apply(model).map_err(|e| ConfigError::Invalid {
            name: "storage",
            why: e.to_string(),
        })?;
        let stepper = Stepper {
            autocast: Autocast::new(r.precision),
            checkpointed: r.checkpointed,
            batching: r.batching,
            scaler: r.loss_scaling.then(|| LossScaler::new(ScalerConfig::default())),
            optimizer: ModuleAdam::new(AdamConfig::default(), config.weight_decay, r.moments),
            cleanup: Cleanup::new(r.cleanup),
            attempts: 0,
        };
        Ok(Self {
            data: config.model.data(&config.task),
            config,
            model,
            stepper,
            recent: Vec::new(),
            device: device.clone(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &FamilyConfig<F> {
        &self.config
    }

    /// The model.
    pub fn model(&self) -> &F::Net<B> {
        &self.model
    }

    /// Parameters and Adam state as one array file of `kind`.
    fn to_array_file(&self, kind: &str) -> ArrayFile {
        save_state(
            kind,
            &self.model,
            &self.stepper,
            json!({ "recent_losses": self.recent }),
        )
    }
}

impl<B, F: Family<D>, const D: usize> Workload for Job<B, F, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    type Summary = TrainSummary;
    type Error = TrainError;

    fn checkpoint_kind(&self) -> &'static str {
        F::CHECKPOINT_KIND
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
        <B::InnerBackend as DeviceMemory>::memory_source(&self.device)
    }

    fn steps_done(&self) -> u64 {
        self.stepper.attempts
    }

    fn total_steps(&self) -> u64 {
        self.config.steps
    }

    fn finished(&self) -> bool {
        self.stepper.attempts >= self.config.steps
    }

    fn accounted(&self) -> Accounted {
        self.stepper.accounted(&self.model)
    }

    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, TrainError> {
        let step = self.stepper.attempts + 1;
        let batch = F::batch::<B>(&self.data, step, self.config.batch_size, &self.device);
        let lr = self.config.lr_at(step);
        let model = self.model.clone();
        let (model, out) = self.stepper.step(model, &batch, lr, &self.device, observer)?;
        self.model = model;
        self.recent.push(out.loss);
        if self.recent.len() > 10 {
            self.recent.remove(0);
        }
        let skipped = self.stepper.scaler.as_ref().map_or(0, |s| s.state().skipped_steps);
        let mut metrics = serde_json::Map::new();
        metrics.insert("lr".into(), json!(lr));
        metrics.insert("loss_scale".into(), json!(out.scale));
        metrics.insert("stepped".into(), json!(out.stepped));
        metrics.insert("cleanup_seconds".into(), json!(out.cleanup_seconds));
        Ok(StepRecord {
            step,
            loss: out.loss,
            metrics,
            scalars: vec![
                ("lr".into(), lr),
                ("loss_scale".into(), out.scale),
                ("skipped_steps".into(), skipped as f64),
            ],
            notable: !out.stepped,
            status: format!("loss {:.4}", out.loss),
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

    fn snapshot(&self) -> Result<ArrayFile, TrainError> {
        Ok(self.to_array_file(F::CHECKPOINT_KIND))
    }

    fn restore(&mut self, file: &ArrayFile) -> Result<(), TrainError> {
        self.model =
            load_state(file, self.model.clone(), &mut self.stepper, &self.device).map_err(TrainError::Checkpoint)?;
        self.recent =
            serde_json::from_value(file.meta.get("recent_losses").cloned().unwrap_or_default()).unwrap_or_default();
        Ok(())
    }

    fn tensors(&self) -> Vec<NamedTensor> {
        vramfit::params::named_tensors(&self.model)
    }

    fn advice(&self, report: &MemoryReport) -> Vec<String> {
        let (b, c) = (&self.stepper.batching, &self.config);
        let all_low = c.storage.iter().any(|s| s.starts_with("*:"));
        let mut out = Vec::new();
        for (category, _) in categories_at_peak(report) {
            let lever = match category {
                Category::Activations | Category::Other => {
                    let mut ways = Vec::new();
                    if c.checkpoint != "all" {
                        ways.push("--checkpoint all (recompute blocks in backward)".to_string());
                    }
                    if b.micro_batch > 1 {
                        ways.push(format!(
                            "--micro-batch {} --accumulate {} (same batch)",
                            b.micro_batch / 2,
                            b.accumulate * 2
                        ));
                    }
                    if c.precision == "f32" {
                        ways.push("--precision bf16".into());
                    }
                    (!ways.is_empty()).then(|| format!("activations: {}", ways.join(", or ")))
                }
                Category::Parameters if !all_low => Some("parameters: --storage '*:bf16' (half the bytes)".into()),
                Category::OptimizerState if c.moments != "bf16" => {
                    Some("optimizer state: --moments bf16 (half the bytes)".into())
                }
                Category::Gradients if !all_low => {
                    Some("gradients: --storage '*:bf16' (gradients take the parameters' type)".into())
                }
                Category::Cached if c.allocator_cleanup == "never" => {
                    Some("cached: --allocator-cleanup step (returns unused blocks to the device)".into())
                }
                _ => None,
            };
            if let Some(l) = lever.filter(|l| !out.contains(l)) {
                out.push(l);
            }
        }
        out
    }

    fn device_failure(error: &TrainError) -> Option<DeviceFailure> {
        match error {
            TrainError::Step(e) => e.device_failure(),
            _ => None,
        }
    }

    fn finish(&mut self, stats: &RunStats) -> Result<Finished<TrainSummary>, TrainError> {
        let s = &self.stepper;
        let median = stats.median_step_ms;
        let c = &self.config;
        let summary = TrainSummary {
            final_loss: self.recent.iter().sum::<f64>() / self.recent.len().max(1) as f64,
            skipped_steps: s.scaler.as_ref().map_or(0, |x| x.state().skipped_steps),
            loss_scale: s.scaler.as_ref().map_or(1.0, |x| x.scale()),
            techniques: json!({
                "precision": c.precision, "checkpoint": c.checkpoint,
                "micro_batch": s.batching.micro_batch, "accumulate": s.batching.accumulate,
                "storage": c.storage, "moments": c.moments, "allocator_cleanup": c.allocator_cleanup,
            }),
            parameter_bytes: parameter_bytes(&self.model),
            optimizer_state_bytes: s.optimizer.state_bytes(),
            cleanup_calls: s.cleanup.calls(),
            cleanup_seconds: s.cleanup.spent().as_secs_f64(),
            family: c.model.summary::<B>(
                &self.data,
                &self.model,
                c.batch_size,
                s.batching.micro_batch,
                median,
                &self.device,
            ),
        };
        // No wall time in the weights: a resumed run writes the same bytes.
        let weights = self.to_array_file(F::WEIGHTS_KIND).to_bytes();
        Ok(Finished {
            summary,
            files: vec![("weights.bin".into(), weights)],
        })
    }
}
