//! A whole training run into a run directory: resolved `config.toml`,
//! streamed `metrics.jsonl` and TensorBoard events, atomic checkpoints
//! (parameters, Adam moments, loss-scaler state), `memory.json`, and at the
//! end `weights.bin` and `summary.json` (written last). Every setting is
//! validated before the directory exists; a failure after that is recorded
//! in `error.json` and the checkpoints stay, so `--resume` continues.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use serde_json::json;
use vramfit::allocator::Cleanup;
use vramfit::optim::{AdamConfig, AdamSnapshot, ModuleAdam};
use vramfit::params::{Snapshot, restore, snapshot};
use vramfit::precision::{Autocast, LossScaler, ScalerConfig, ScalerState};
use vramfit::profile::{Accounted, DeviceMemory, Profiler};
use vramfit::run::{ArrayFile, EventWriter, RunDir, RunDirError, StepError, Stepper, atomic_write};
use vramfit::storage::parameter_bytes;

use crate::config::{ConfigError, TrainConfig};
use crate::data::SyntheticTask;
use crate::gpt::Gpt;

/// Checkpoints kept on disk (the newest ones).
const KEEP_CHECKPOINTS: usize = 2;
const CHECKPOINT_KIND: &str = "vramfit.transformer.checkpoint";

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The run directory.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// The step (non-finite loss, collapsed scale).
    #[error(transparent)]
    Step(#[from] StepError),
    /// A file could not be written.
    #[error("cannot write {path}: {why}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        why: String,
    },
    /// The device ran out of memory; `oom.json` holds the breakdown.
    #[error(
        "out of device memory at step {step}{requested}; largest: {largest}. The breakdown is in {report}. \
         Use less: halve --micro-batch and double --accumulate (same batch), --checkpoint all, \
         --precision bf16, or --storage '*:bf16' and --moments bf16"
    )]
    OutOfMemory {
        /// Step that failed.
        step: u64,
        /// What the failed allocation asked for, in words (empty when the
        /// message does not say).
        requested: String,
        /// The largest categories and tensors, in words.
        largest: String,
        /// The `oom.json` written.
        report: PathBuf,
    },
    /// A checkpoint does not fit this run's model.
    #[error("checkpoint {path} does not match the run's model: {why}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// The mismatch.
        why: String,
    },
}

/// The outcome of a finished run (`summary.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    /// Mean loss over the last 10 optimiser steps (nats per token).
    pub final_loss: f64,
    /// The task's floor: a predictor that knows the hidden topic (nats).
    pub entropy_floor: f64,
    /// Optimiser steps attempted.
    pub steps: u64,
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
    /// Wall-clock seconds over every session of the run.
    pub wall_seconds: f64,
    /// Median milliseconds per optimiser step in the last session.
    pub median_step_ms: f64,
    /// Tokens per second in the last session (median step).
    pub tokens_per_second: f64,
    /// Allocator cleanups done and their total seconds (last session).
    pub cleanup_calls: u64,
    /// Seconds spent in them.
    pub cleanup_seconds: f64,
    /// Peak memory in bytes; see `peak_memory_source`.
    pub peak_memory_bytes: u64,
    /// What `peak_memory_bytes` measures.
    pub peak_memory_source: String,
    /// Device.
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
    /// An optimiser step completed.
    Step {
        /// Step number (1-based).
        step: u64,
        /// Mean loss.
        loss: f64,
        /// Loss scale used.
        scale: f64,
        /// False when the scaler skipped it.
        stepped: bool,
    },
    /// A checkpoint was written.
    Checkpoint(&'a Path),
}

/// Runs a new training run into `out`, or resumes the one in `out`.
pub struct TrainJob {
    /// Settings (ignored on resume: the run directory's own are used).
    pub config: TrainConfig,
    /// Run directory.
    pub out: PathBuf,
    /// Continue the run in `out` from its last checkpoint.
    pub resume: bool,
    /// Describes the device for the summary.
    pub device_name: String,
}

struct State<B: AutodiffBackend> {
    model: Gpt<B>,
    stepper: Stepper<B>,
    wall_before: f64,
    /// Losses of the last (up to) 10 steps, for `final_loss` (kept across resumes).
    recent: Vec<f64>,
}

fn write_error(path: &Path) -> impl Fn(std::io::Error) -> TrainError + '_ {
    move |e| TrainError::Write {
        path: path.into(),
        why: e.to_string(),
    }
}

/// Parameters and Adam state as one array file.
fn to_array_file<B: AutodiffBackend>(state: &State<B>, wall_seconds: f64) -> ArrayFile {
    let scaler = state.stepper.scaler.as_ref().map(|s| s.state());
    let adam = state.stepper.optimizer.snapshot();
    let params = snapshot(&state.model);
    let dtypes: serde_json::Map<String, serde_json::Value> = params
        .iter()
        .map(|(k, (_, d, _))| (k.clone(), json!(format!("{d:?}"))))
        .collect();
    let mut file = ArrayFile::new(
        CHECKPOINT_KIND,
        json!({ "step": state.stepper.attempts, "optimizer_steps": adam.step, "scaler": scaler,
                "wall_seconds": wall_seconds, "recent_losses": state.recent, "stored_types": dtypes }),
    );
    for (path, (shape, _, values)) in params {
        file.insert(&format!("param/{path}"), shape, values);
    }
    for (path, (m, v)) in adam.moments {
        file.insert(&format!("adam_m/{path}"), vec![m.len()], m);
        file.insert(&format!("adam_v/{path}"), vec![v.len()], v);
    }
    file
}

impl TrainJob {
    /// Runs to the end. `observe` sees every event and may stop the run
    /// (as a kill would: nothing more is written).
    pub fn run<B>(
        &self,
        device: &B::Device,
        mut observe: impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Option<TrainSummary>, TrainError>
    where
        B: AutodiffBackend,
        B::InnerBackend: DeviceMemory,
    {
        let (dir, config, mut state) = if self.resume {
            self.open_for_resume::<B>(device)?
        } else {
            let state = Self::fresh::<B>(&self.config, device)?; // validates before the directory exists
            let dir = RunDir::create(&self.out)?;
            dir.write("config.toml", self.config.to_toml().as_bytes())?;
            (dir, self.config.clone(), state)
        };
        let mut profiler = Profiler::new(<B::InnerBackend as DeviceMemory>::memory_source(device), 64)
            .with_sampling(std::time::Duration::from_millis(2));
        let result = self.drive(&dir, &config, &mut state, &mut profiler, device, &mut observe);
        let (peak, source) = profiler.peak_or_host();
        let mut report = profiler.report(&self.device_name, peak, source);
        let mut tensors: Vec<(String, u64)> = vramfit::params::describe(&state.model)
            .into_iter()
            .map(|p| (p.bytes(), p))
            .map(|(b, p)| (p.path, b))
            .collect();
        tensors.sort_by_key(|t| std::cmp::Reverse(t.1));
        report.largest_tensors = tensors.iter().take(10).cloned().collect();
        let _ = dir.write(
            "memory.json",
            serde_json::to_string_pretty(&report).expect("plain data").as_bytes(),
        );
        match result {
            Ok(Some(mut summary)) => {
                summary.peak_memory_bytes = peak.unwrap_or(0);
                summary.peak_memory_source = source.into();
                dir.write(
                    "summary.json",
                    serde_json::to_string_pretty(&summary).expect("plain data").as_bytes(),
                )?;
                Ok(Some(summary))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                let e = match &e {
                    TrainError::Step(StepError::Device { step, reason })
                        if vramfit::profile::out_of_memory(reason).is_some() =>
                    {
                        let oom = vramfit::profile::oom_report(
                            &e.to_string(),
                            reason,
                            *step,
                            "the step",
                            profiler.records(),
                            &tensors,
                        );
                        match dir.write(
                            "oom.json",
                            serde_json::to_string_pretty(&oom.json).expect("plain data").as_bytes(),
                        ) {
                            Ok(()) => TrainError::OutOfMemory {
                                step: *step,
                                requested: oom.requested,
                                largest: oom.largest,
                                report: dir.path("oom.json"),
                            },
                            Err(write) => write.into(),
                        }
                    }
                    _ => e,
                };
                let body = json!({ "error": e.to_string(), "step": state.stepper.attempts });
                let _ = dir.write("error.json", body.to_string().as_bytes());
                Err(e)
            }
        }
    }

    fn fresh<B: AutodiffBackend>(config: &TrainConfig, device: &B::Device) -> Result<State<B>, TrainError> {
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
        Ok(State {
            model,
            stepper,
            wall_before: 0.0,
            recent: Vec::new(),
        })
    }

    fn open_for_resume<B: AutodiffBackend>(
        &self,
        device: &B::Device,
    ) -> Result<(RunDir, TrainConfig, State<B>), TrainError> {
        let dir = RunDir::open(&self.out)?;
        if dir.path("summary.json").exists() {
            return Err(RunDirError::NotResumable {
                path: self.out.clone(),
                why: "the run already finished (summary.json exists)".into(),
            }
            .into());
        }
        let config = TrainConfig::load(&dir.path("config.toml"))?;
        let mut state = Self::fresh::<B>(&config, device)?;
        let _ = std::fs::remove_file(dir.path("error.json"));
        // The newest checkpoint that reads back whole; none: start over.
        let Some((path, file)) = vramfit::run::checkpoints_newest_first(&dir.checkpoints())
            .into_iter()
            .find_map(|p| {
                ArrayFile::read(&p)
                    .ok()
                    .filter(|f| f.kind == CHECKPOINT_KIND)
                    .map(|f| (p, f))
            })
        else {
            return Ok((dir, config, state));
        };
        let bad = |why: String| TrainError::Checkpoint {
            path: path.clone(),
            why,
        };
        let mut params = Snapshot::new();
        let mut adam = AdamSnapshot::default();
        for (name, (shape, values)) in &file.arrays {
            if let Some(p) = name.strip_prefix("param/") {
                params.insert(p.into(), (shape.clone(), burn::tensor::DType::F32, values.clone()));
            } else if let Some(p) = name.strip_prefix("adam_m/") {
                adam.moments.entry(p.into()).or_default().0 = values.clone();
            } else if let Some(p) = name.strip_prefix("adam_v/") {
                adam.moments.entry(p.into()).or_default().1 = values.clone();
            }
        }
        let meta = |key: &str| file.meta.get(key).cloned().unwrap_or_default();
        adam.step = meta("optimizer_steps").as_u64().unwrap_or(0);
        state.model = restore(state.model, &params).map_err(|e| bad(e.to_string()))?;
        state.stepper.optimizer.restore(&adam, device);
        state.stepper.attempts = meta("step").as_u64().unwrap_or(0);
        if let Some(s) = state.stepper.scaler.as_mut() {
            let saved: ScalerState = serde_json::from_value(meta("scaler")).map_err(|e| bad(format!("scaler: {e}")))?;
            *s = LossScaler::resume(ScalerConfig::default(), saved);
        }
        state.wall_before = meta("wall_seconds").as_f64().unwrap_or(0.0);
        state.recent = serde_json::from_value(meta("recent_losses")).unwrap_or_default();
        Ok((dir, config, state))
    }

    fn drive<B>(
        &self,
        dir: &RunDir,
        config: &TrainConfig,
        state: &mut State<B>,
        profiler: &mut Profiler,
        device: &B::Device,
        observe: &mut impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Option<TrainSummary>, TrainError>
    where
        B: AutodiffBackend,
    {
        let task = SyntheticTask::new(config.task.clone(), config.model.vocab, config.model.frame_dim);
        let mut metrics = dir.metrics(Some(state.stepper.attempts))?;
        let mut events = EventWriter::create(dir.root()).map_err(write_error(dir.root()))?;
        let started = Instant::now();
        let mut step_ms = Vec::new();
        if observe(Event::Start {
            done: state.stepper.attempts,
            total: config.steps,
        })
        .is_break()
        {
            return Ok(None);
        }
        while state.stepper.attempts < config.steps {
            let step = state.stepper.attempts + 1;
            let batch = task.batch::<B>(step, config.batch_size, device);
            let lr = config.lr_at(step);
            let profiled = config.profile_every > 0 && step.is_multiple_of(config.profile_every);
            let accounted = |s: &State<B>| Accounted {
                parameters: parameter_bytes(&s.model),
                gradients: 0,
                optimizer_state: s.stepper.optimizer.state_bytes(),
                activations: None,
            };
            if profiled {
                profiler.record(step, "start", accounted(state));
            }
            if let Some(reason) = vramfit::profile::simulated_oom(step) {
                return Err(StepError::Device { step, reason }.into());
            }
            let t0 = Instant::now();
            let model = state.model.clone();
            let (model, out) = state.stepper.step(model, &batch, lr, device)?;
            state.model = model;
            step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            if profiled {
                profiler.record(step, "optimizer", accounted(state));
            }
            state.recent.push(out.loss);
            if state.recent.len() > 10 {
                state.recent.remove(0);
            }
            if step.is_multiple_of(config.log_every) || !out.stepped || step == config.steps {
                let wall = state.wall_before + started.elapsed().as_secs_f64();
                metrics.append(&json!({
                    "step": step, "loss": out.loss, "lr": lr, "loss_scale": out.scale, "stepped": out.stepped,
                    "cleanup_seconds": out.cleanup_seconds, "wall_seconds": wall,
                }))?;
                let skipped = state.stepper.scaler.as_ref().map_or(0, |s| s.state().skipped_steps);
                events
                    .scalars(
                        step,
                        &[
                            ("loss", out.loss),
                            ("lr", lr),
                            ("loss_scale", out.scale),
                            ("skipped_steps", skipped as f64),
                        ],
                    )
                    .map_err(write_error(dir.root()))?;
            }
            if observe(Event::Step {
                step,
                loss: out.loss,
                scale: out.scale,
                stepped: out.stepped,
            })
            .is_break()
            {
                return Ok(None);
            }
            if config.checkpoint_every > 0 && step.is_multiple_of(config.checkpoint_every) && step < config.steps {
                let file = to_array_file(state, state.wall_before + started.elapsed().as_secs_f64());
                let path = dir.checkpoints().join(vramfit::run::checkpoint_name(step));
                atomic_write(&path, &file.to_bytes()).map_err(write_error(&path))?;
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
        let wall = state.wall_before + started.elapsed().as_secs_f64();
        let weights = to_array_file(state, wall);
        let path = dir.path("weights.bin");
        atomic_write(&path, &weights.to_bytes()).map_err(write_error(&path))?;
        step_ms.sort_by(f64::total_cmp);
        let median = step_ms.get(step_ms.len() / 2).copied().unwrap_or(0.0);
        let s = &state.stepper;
        Ok(Some(TrainSummary {
            final_loss: state.recent.iter().sum::<f64>() / state.recent.len().max(1) as f64,
            entropy_floor: task.entropy_floor(),
            steps: s.attempts,
            skipped_steps: s.scaler.as_ref().map_or(0, |x| x.state().skipped_steps),
            loss_scale: s.scaler.as_ref().map_or(1.0, |x| x.scale()),
            techniques: json!({
                "precision": config.precision, "checkpoint": config.checkpoint,
                "micro_batch": s.batching.micro_batch, "accumulate": s.batching.accumulate,
                "storage": config.storage, "moments": config.moments, "allocator_cleanup": config.allocator_cleanup,
            }),
            parameter_bytes: parameter_bytes(&state.model),
            optimizer_state_bytes: s.optimizer.state_bytes(),
            wall_seconds: wall,
            median_step_ms: median,
            tokens_per_second: if median > 0.0 {
                (config.batch_size * config.task.tokens) as f64 / (median / 1e3)
            } else {
                0.0
            },
            cleanup_calls: s.cleanup.calls(),
            cleanup_seconds: s.cleanup.spent().as_secs_f64(),
            peak_memory_bytes: 0,
            peak_memory_source: String::new(),
            device: self.device_name.clone(),
        }))
    }
}
