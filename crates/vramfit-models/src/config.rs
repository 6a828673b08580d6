//! Settings of `vramfit train <family>`: defaults, TOML files (unknown
//! keys are errors naming their line) and validation of every combination
//! before anything is created. The shared settings (steps, batch,
//! techniques, cadence) are the same for every family; `[model]` and
//! `[task]` are the family's ([`ModelSettings`]).

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use burn::tensor::backend::Backend;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use vramfit::activation_checkpointing::CheckpointPolicy;
use vramfit::allocator::CleanupPolicy;
use vramfit::batch::MicroBatching;
use vramfit::precision::Precision;
use vramfit::storage::StoragePolicy;

/// The `[model]` settings of a family, with its `[task]` settings.
pub trait ModelSettings:
    Clone + PartialEq + Debug + Default + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The `[task]` settings.
    type Task: Clone + PartialEq + Debug + Default + Serialize + DeserializeOwned + Send + Sync + 'static;
    /// `vramfit train NAME`; the default run directory's prefix.
    const NAME: &'static str;
    /// Kind of the run's checkpoint file.
    const CHECKPOINT_KIND: &'static str;
    /// Kind of the finished run's `weights.bin`.
    const WEIGHTS_KIND: &'static str;
    /// Where the family's Llama-family LLM settings are (`model` for the
    /// llm, `model.llm` for the segmenter): what `--train`, `--base`,
    /// `--weights` and `--adapter` set. `None`: it has none.
    const LLM_KEY: Option<&'static str> = None;

    /// Checks the model and task settings together; the error names the setting.
    fn check(&self, task: &Self::Task) -> Result<(), ConfigError>;

    /// Blocks of the chain (what `checkpoint` marks).
    fn blocks(&self) -> usize;

    /// The same model `blocks` deep, where its blocks repeat (a slice the
    /// planner probes: [`vramfit::plan::slice`]); `None` where they do not
    /// or a setting names single blocks.
    fn with_blocks(&self, _blocks: usize) -> Option<Self> {
        None
    }

    /// The slice the planner probes by default (`--probe-blocks`), where
    /// the family is planned from one unless asked otherwise.
    fn default_probe_blocks(&self) -> Option<usize> {
        None
    }

    /// Tokens a sample of `task` has, where its samples are sequences the
    /// planner can probe shorter ([`vramfit::plan::tokens`]).
    fn sequence_tokens(_task: &Self::Task) -> Option<usize> {
        None
    }

    /// `task` with `tokens` a sample, where [`Self::sequence_tokens`] has it.
    fn with_sequence_tokens(_task: &Self::Task, _tokens: usize) -> Option<Self::Task> {
        None
    }

    /// The tokens the planner probes at by default (`--probe-tokens`),
    /// where a run of `task` is long enough to be planned from shorter
    /// probes unless asked otherwise.
    fn default_probe_tokens(&self, _task: &Self::Task) -> Option<usize> {
        None
    }

    /// A rough count of the floats the model and task hold: parameters,
    /// activations a sample (kept for the backward), and the task's own
    /// tables. Only to refuse shapes past [`MOST_BYTES`] before anything
    /// is allocated; in f64, so that no product overflows.
    fn rough_floats(&self, task: &Self::Task) -> RoughFloats;

    /// The layer that normalises with statistics over a forward pass's
    /// samples (`BatchNorm`), if the model has one: splitting the batch
    /// into micro-batches then changes the numerics (the planner says so).
    fn batch_statistics(&self) -> Option<String> {
        None
    }

    /// Blocks that differ, for the planner: per block, its share of the
    /// activations relative to the mean block and its input's bytes per
    /// sample in f32 ([`vramfit::plan::Space::block_shapes`]). Empty: equal blocks.
    fn block_shapes(&self, _task: &Self::Task) -> Vec<(f64, u64)> {
        Vec::new()
    }

    /// A model setting that lowers the activations of `task` (in `vramfit
    /// train`'s words), if the model has one that is not in use and that
    /// pays at this shape.
    fn activation_lever(&self, _task: &Self::Task) -> Option<String> {
        None
    }

    /// How the model computes attention, if it has attention layers.
    fn attention(&self) -> Option<vramfit::fused::Attention> {
        None
    }

    /// What the model stores in a float type the device lacks (`supported`
    /// says which it has), in words, if anything.
    fn unsupported_storage(&self, _supported: &dyn Fn(burn::tensor::FloatDType) -> bool) -> Option<String> {
        None
    }

    /// Whether the parameter at `path` is rebuilt exactly from these
    /// settings (a frozen base: drawn from the seed, or read from the
    /// checkpoint they name), so a run's files need not hold it.
    fn rebuilt_from_settings(&self, _path: &str) -> bool {
        false
    }

    /// A fingerprint of the file the rebuilt parameters are read from
    /// (`None`: they are drawn from the seed, or nothing is rebuilt): kept
    /// in checkpoints, so that a resume whose file has changed under the
    /// same path is refused.
    fn rebuilt_fingerprint(&self) -> Result<Option<String>, ConfigError> {
        Ok(None)
    }

    /// The model with its attention computed as `attention` (a model
    /// without attention layers is returned as it is).
    fn with_attention(self, _attention: vramfit::fused::Attention) -> Self {
        self
    }

    /// The forward's operations per sample of `task`, counted from the
    /// shapes, where the family counts them: what the planner scales a
    /// probed step's time by to a deeper or longer run
    /// ([`vramfit::plan::Work`]).
    fn work(&self, _task: &Self::Task) -> Option<vramfit::plan::Work> {
        None
    }

    /// The frozen base's storages the planner is asked to choose among,
    /// best quality first, before the device's support is known (empty:
    /// the settings fix it, or nothing is frozen;
    /// [`vramfit::plan::Space::bases`]).
    fn bases_to_search(&self) -> Vec<vramfit::frozen::BaseStorage> {
        Vec::new()
    }

    /// The model with its frozen base stored as `base` (a model without
    /// one is returned as it is).
    fn with_base(self, _base: vramfit::frozen::BaseStorage) -> Self {
        self
    }

    /// The setting of `task` that costs quality, which the planner lowers
    /// only where no plan fits at the value asked for
    /// ([`vramfit::plan::quality`]); `None`: the family has none.
    fn quality_knob(&self, _task: &Self::Task) -> Option<vramfit::plan::quality::QualityKnob> {
        None
    }

    /// Where `keep_quality` is set: refuses a task the model would read
    /// less of than it asks (frames above the model's cap).
    fn check_kept_quality(&self, _task: &Self::Task) -> Result<(), ConfigError> {
        Ok(())
    }

    /// `task` with its quality knob at `value`.
    fn with_quality(_task: &Self::Task, _value: usize) -> Option<Self::Task> {
        None
    }

    /// `task` at the sizes a published shape is trained at (`--shape NAME`:
    /// a segmenter's image side and prompt); by default as it is.
    fn named_task(_name: &str, task: Self::Task) -> Self::Task {
        task
    }

    /// The model of a published shape (`--shape NAME`); the error lists
    /// the known ones, or says the family has none.
    fn named(name: &str) -> Result<Self, ConfigError> {
        Err(invalid(
            "shape",
            format!(
                "`{name}`: `train {}` has no named shapes (the llm family has)",
                Self::NAME
            ),
        ))
    }

    /// The family's own defaults of the shared settings (steps, batch, lr).
    fn defaults(config: FamilyConfig<Self>) -> FamilyConfig<Self> {
        config
    }
}

/// Every setting of a training run of family `M`. Field names are the TOML keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, bound = "")]
pub struct FamilyConfig<M: ModelSettings> {
    /// Optimiser steps.
    pub steps: u64,
    /// Samples per optimiser step.
    pub batch_size: usize,
    /// Samples per forward/backward (0: the whole batch).
    pub micro_batch: usize,
    /// Micro-batches per optimiser step.
    pub accumulate: usize,
    /// Peak learning rate (after warm-up; cosine decay to 10 % at the end).
    pub lr: f64,
    /// Linear warm-up steps.
    pub warmup_steps: u64,
    /// Decoupled (AdamW) weight decay.
    pub weight_decay: f64,
    /// Matrix-work precision: f32, bf16 or f16.
    pub precision: String,
    /// Loss scaling: `dynamic` (PyTorch GradScaler) or `none`. Used with f16.
    pub loss_scale: String,
    /// Block checkpointing: none, all, every:K, auto, list:I,J.
    pub checkpoint: String,
    /// Parameter groups stored in low precision, `PREFIX:TYPE` (e.g. `token_embedding:bf16`, `*:bf16`).
    pub storage: Vec<String>,
    /// Adam's moments: f32 or bf16 (their stored type, on the device), or
    /// host (f32 in host memory, updated by the CPU: no optimizer state on
    /// the device; a GPU device only).
    pub moments: String,
    /// Allocator cleanup: never, step, every:N.
    pub allocator_cleanup: String,
    /// Data-parallel ranks (processes) sharing each step's micro-batches;
    /// `accumulate` must be a multiple of it (started by `vramfit train
    /// --ranks N`, through `mpirun`).
    pub ranks: usize,
    /// With ranks: Adam's moments sharded over them, and the gradients
    /// summed onto their owners (ZeRO stage 2): each rank keeps the moments
    /// and accumulated gradients of about 1/N of the parameters, updates
    /// those and broadcasts them; the unsharded parameters, rounding apart.
    pub shard_moments: bool,
    /// The planner may not lower a setting that costs quality (frames, an
    /// image's size, tokens: [`vramfit::plan::quality`]): where nothing
    /// fits at the asked quality it says what that needs instead.
    pub keep_quality: bool,
    /// Seed of the weights.
    pub seed: u64,
    /// Steps between lines of `metrics.jsonl`.
    pub log_every: u64,
    /// Steps between checkpoints (0: none).
    pub checkpoint_every: u64,
    /// Steps between memory records (0: none).
    pub profile_every: u64,
    /// The model.
    pub model: M,
    /// The synthetic data.
    pub task: M::Task,
}

/// The largest batch, micro-batch or accumulation count a config may ask for.
pub const MOST_SAMPLES: usize = 1 << 31;

/// The largest size a model or task setting may take (widths, depths,
/// vocabularies, contexts, resolutions): far beyond any model these train.
pub const MOST_SIZE: usize = 1 << 24;

/// The most memory a configuration may ask for by a rough count (1 TiB):
/// sizes within [`MOST_SIZE`] each can still multiply to more than any
/// machine holds, which would end in an allocation failure, not a message.
pub const MOST_BYTES: f64 = (1u64 << 40) as f64;

/// [`ModelSettings::rough_floats`]: floats held, roughly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoughFloats {
    /// Parameters (each trainable one also has a gradient and two Adam moments).
    pub parameters: f64,
    /// Of them, the frozen ones (no gradient, no moments; storable in 16 bits).
    pub frozen: f64,
    /// Bytes a frozen parameter takes as the run stores it (4 in f32, 2 in
    /// 16 bits, about 0.56 in NF4 with its scales).
    pub frozen_bytes_each: f64,
    /// Activations kept for the backward, a sample.
    pub activations_per_sample: f64,
    /// The largest single tensor a sample makes, in floats (attention's
    /// scores where kept, the logits, a feature map), and what it is: one
    /// allocation of it for the (micro-)batch must fit what the process may
    /// take, or the allocation aborts the process.
    pub largest_per_sample: (f64, &'static str),
    /// The task's data (tables, source images).
    pub task: f64,
}

/// The largest of `(floats, what)`.
pub fn largest(candidates: &[(f64, &'static str)]) -> (f64, &'static str) {
    candidates
        .iter()
        .copied()
        .fold((0.0, "nothing"), |a, b| if b.0 > a.0 { b } else { a })
}

impl RoughFloats {
    /// Bytes of a step at `samples` a forward pass, all f32: parameters,
    /// gradients and two moments; the activations; the task.
    pub fn bytes(&self, samples: usize) -> f64 {
        16.0 * (self.parameters - self.frozen)
            + self.frozen_bytes_each * self.frozen
            + 4.0 * (self.activations_per_sample * samples as f64 + self.task)
    }

    /// Bytes every plan needs at least: trainable parameters, gradients
    /// and two moments in 16 bits, frozen parameters as stored, and the
    /// task; no activations (recomputed or split into micro-batches of
    /// one, they can be small).
    pub fn floor_bytes(&self) -> f64 {
        2.0 * 4.0 * (self.parameters - self.frozen) + self.frozen_bytes_each * self.frozen + 4.0 * self.task
    }
}

impl<M: ModelSettings> Default for FamilyConfig<M> {
    fn default() -> Self {
        M::defaults(Self {
            steps: 300,
            batch_size: 16,
            micro_batch: 0,
            accumulate: 1,
            lr: 3e-3,
            warmup_steps: 20,
            weight_decay: 0.0,
            precision: "f32".into(),
            loss_scale: "dynamic".into(),
            checkpoint: "none".into(),
            storage: Vec::new(),
            moments: "f32".into(),
            allocator_cleanup: "never".into(),
            ranks: 1,
            shard_moments: false,
            keep_quality: false,
            seed: 0,
            log_every: 10,
            checkpoint_every: 100,
            profile_every: 10,
            model: M::default(),
            task: M::Task::default(),
        })
    }
}

/// A setting that cannot be used; names the setting and what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read or parsed.
    #[error("{path}: {why}")]
    File {
        /// Source (a path, or `--set`).
        path: PathBuf,
        /// What is wrong, with the line.
        why: String,
    },
    /// One setting (or combination) is invalid.
    #[error("setting `{name}`: {why}")]
    Invalid {
        /// The setting.
        name: &'static str,
        /// What is wrong and what to do.
        why: String,
    },
}

/// The validated, parsed form of the string settings.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Precision.
    pub precision: Precision,
    /// Whether a dynamic loss scaler runs.
    pub loss_scaling: bool,
    /// Checkpoint marks per block.
    pub checkpointed: Vec<bool>,
    /// Batch split.
    pub batching: MicroBatching,
    /// Storage groups.
    pub storage: StoragePolicy,
    /// Moments' type.
    pub moments: burn::tensor::FloatDType,
    /// Moments in host memory (f32).
    pub moments_on_host: bool,
    /// Allocator policy.
    pub cleanup: CleanupPolicy,
}

/// The error for setting `name`.
pub fn invalid(name: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { name, why: why.into() }
}

impl<M: ModelSettings> FamilyConfig<M> {
    /// Parses TOML; `path` names the source in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        vramfit::settings::from_toml(text).map_err(|why| ConfigError::File {
            path: path.into(),
            why: why.to_string(),
        })
    }

    /// Reads a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = vramfit::files::read::read_text(path, vramfit::files::read::Links::Follow).map_err(|e| {
            ConfigError::File {
                path: path.into(),
                why: format!("cannot read it: {e}"),
            }
        })?;
        Self::from_toml(&text, path)
    }

    /// The resolved settings as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config is plain data")
    }

    /// Learning rate at optimiser step `step` (1-based): linear warm-up,
    /// then cosine from `lr` to `lr / 10`.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step <= self.warmup_steps {
            return self.lr * step as f64 / self.warmup_steps.max(1) as f64;
        }
        let span = self.steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let t = ((step - self.warmup_steps) as f64 / span).min(1.0);
        self.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
    }

    /// Checks every setting and combination against backend `B` on `device`.
    pub fn resolve<B: Backend>(&self, device: &B::Device) -> Result<Resolved, ConfigError> {
        self.resolve_on::<B>(device, true)
    }

    /// [`Self::resolve`] but for whether the model fits this machine's
    /// memory: a model planned from a slice ([`vramfit::plan::slice`]) for
    /// a card it is not run on.
    pub fn resolve_elsewhere<B: Backend>(&self, device: &B::Device) -> Result<Resolved, ConfigError> {
        self.resolve_on::<B>(device, false)
    }

    fn resolve_on<B: Backend>(&self, device: &B::Device, here: bool) -> Result<Resolved, ConfigError> {
        // Sizes first: a model or task size past any real one would overflow
        // a buffer's length (a panic) or ask the allocator for terabytes.
        for (table, value) in [
            ("model", toml::Value::try_from(&self.model)),
            ("task", toml::Value::try_from(&self.task)),
        ] {
            if let Ok(toml::Value::Table(t)) = value {
                for (key, v) in &t {
                    // Seeds are any number; the rest are sizes.
                    if let toml::Value::Integer(n) = v
                        && *n > MOST_SIZE as i64
                        && key != "seed"
                    {
                        return Err(ConfigError::Invalid {
                            name: if table == "model" { "model" } else { "task" },
                            why: format!("{table}.{key} = {n} is too large: at most {MOST_SIZE}"),
                        });
                    }
                }
            }
        }
        self.model.check(&self.task)?;
        if self.keep_quality {
            self.model.check_kept_quality(&self.task)?;
        }
        if self.steps == 0 {
            return Err(invalid("steps", "must be at least 1"));
        }
        if self.log_every == 0 {
            return Err(invalid("log_every", "must be at least 1"));
        }
        if self.batch_size == 0 {
            return Err(invalid("batch_size", "must be at least 1"));
        }
        // Beyond this a batch's buffers would not fit any address space
        // (their sizes would overflow before any memory is asked for).
        for (name, value) in [
            ("batch_size", self.batch_size),
            ("micro_batch", self.micro_batch),
            ("accumulate", self.accumulate),
        ] {
            if value > MOST_SAMPLES {
                return Err(invalid(name, format!("{value} is too large: at most {MOST_SAMPLES}")));
            }
        }
        // Each size within its limit, their product may still be past any machine.
        let samples = if self.micro_batch > 0 {
            self.micro_batch
        } else {
            self.batch_size
        };
        let mut rough = self.model.rough_floats(&self.task);
        if !self.storage.is_empty() {
            // A storage policy may put frozen groups in 16 bits.
            rough.frozen_bytes_each = rough.frozen_bytes_each.min(2.0);
        }
        let bytes = rough.bytes(samples);
        // On the CPU the host is the device: beyond the memory this process
        // may take (the machine's available memory, `ulimit -v`, a cgroup's
        // limit) an allocation aborts the process. What every plan needs at
        // least (16-bit state, the task's tables; activations can be
        // recomputed or split), and the largest single tensor of a
        // (micro-)batch, are held against it before anything is built.
        if let Some(room) = vramfit::files::room::room().filter(|_| here && vramfit::backends::is_cpu::<B>()) {
            if rough.floor_bytes() > room.bytes as f64 {
                return Err(ConfigError::Invalid {
                    name: if 4.0 * rough.task > rough.floor_bytes() / 2.0 {
                        "task"
                    } else {
                        "model"
                    },
                    why: format!(
                        "these sizes need at least about {} by a rough count, whatever the memory techniques \
                         ({:.3e} parameters, the trainable ones with their gradients and moments in 16 bits, {:.3e} \
                         frozen ones at {:.2} bytes each as stored; the task's tables): more than this process may \
                         take, {} ({}); {}",
                        rough_size(rough.floor_bytes()),
                        rough.parameters,
                        rough.frozen,
                        rough.frozen_bytes_each,
                        rough_size(room.bytes as f64),
                        room.limit,
                        if rough.frozen_bytes_each > 2.0 && rough.frozen * 2.0 > rough.floor_bytes() / 4.0 {
                            "store the frozen base in 16 bits (--base bf16) or 4 (--train qlora:RANK), or lower the sizes"
                        } else {
                            "lower the model's or task's sizes"
                        }
                    ),
                });
            }
            let (floats, what) = rough.largest_per_sample;
            let largest = 4.0 * floats * samples as f64;
            if largest > room.bytes as f64 {
                return Err(ConfigError::Invalid {
                    name: "task",
                    why: format!(
                        "one tensor, {what} for {samples} sample(s) a pass, takes about {} in f32: more than this \
                         process may take, {} ({}); lower task.tokens (or the task's size) or the (micro-)batch{}",
                        rough_size(largest),
                        rough_size(room.bytes as f64),
                        room.limit,
                        if what.contains("attention") {
                            ", or use --attention fused (it keeps no scores)"
                        } else {
                            ""
                        }
                    ),
                });
            }
        }
        let limit = MOST_BYTES;
        if bytes.is_nan() || bytes > limit {
            return Err(ConfigError::Invalid {
                name: if 2.0 * 4.0 * rough.task > bytes {
                    "task"
                } else {
                    "model"
                },
                why: format!(
                    "these sizes need about {} by a rough count ({:.3e} parameters, {:.3e} activation floats a \
                     sample, {samples} samples a pass): at most {} is accepted; lower the model's or task's sizes, \
                     or the (micro-)batch",
                    rough_size(bytes),
                    rough.parameters,
                    rough.activations_per_sample,
                    rough_size(limit)
                ),
            });
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(invalid("lr", format!("{} is not a finite positive number", self.lr)));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(invalid(
                "weight_decay",
                format!("{} is not finite and ≥ 0", self.weight_decay),
            ));
        }
        let precision = Precision::parse(&self.precision).ok_or_else(|| {
            invalid(
                "precision",
                format!("`{}` is not one of f32, bf16, f16", self.precision),
            )
        })?;
        let loss_scaling = match self.loss_scale.as_str() {
            "dynamic" => precision.needs_loss_scaling(),
            "none" if precision.needs_loss_scaling() => {
                return Err(invalid(
                    "loss_scale",
                    "f16 gradients underflow without loss scaling: use loss_scale = \"dynamic\", or precision bf16",
                ));
            }
            "none" => false,
            other => return Err(invalid("loss_scale", format!("`{other}` is not one of dynamic, none"))),
        };
        let supported = |dtype: burn::tensor::FloatDType| B::supports_dtype(device, DType::from(dtype));
        if !supported(precision.dtype()) {
            return Err(invalid(
                "precision",
                format!(
                    "{} is not supported by this device ({}); use f32",
                    self.precision,
                    B::name(device)
                ),
            ));
        }
        if let Some(why) = self.model.unsupported_storage(&supported) {
            return Err(invalid("model.base", format!("{why} ({})", B::name(device))));
        }
        let checkpointed = CheckpointPolicy::parse(&self.checkpoint)
            .and_then(|p| p.plan(self.model.blocks()))
            .map_err(|e| invalid("checkpoint", e.to_string()))?;
        let batching = MicroBatching {
            micro_batch: if self.micro_batch == 0 {
                self.batch_size
            } else {
                self.micro_batch
            },
            accumulate: self.accumulate,
        };
        batching
            .validate(self.batch_size)
            .map_err(|e| invalid("micro_batch", e.to_string()))?;
        if self.ranks == 0 {
            return Err(invalid("ranks", "must be at least 1"));
        }
        if self.shard_moments && self.ranks < 2 {
            return Err(invalid(
                "shard_moments",
                "shards Adam's moments over data-parallel ranks: it needs ranks = 2 or more (--ranks N)",
            ));
        }
        vramfit::ranks::check_split(batching.micro_batch, batching.accumulate, self.ranks)
            .map_err(|e| invalid("ranks", e.to_string()))?;
        let storage = StoragePolicy::parse(&self.storage).map_err(|e| invalid("storage", e.to_string()))?;
        for entry in &self.storage {
            let dtype = entry.rsplit_once(':').map(|(_, d)| d).unwrap_or("");
            let dtype = Precision::parse(dtype).map(|p| p.dtype());
            if let Some(d) = dtype
                && !supported(d)
            {
                return Err(invalid(
                    "storage",
                    format!("`{entry}`: the device does not support that type"),
                ));
            }
        }
        let moments_on_host = self.moments == "host";
        let moments = match self.moments.as_str() {
            "f32" | "host" => burn::tensor::FloatDType::F32,
            "bf16" => burn::tensor::FloatDType::BF16,
            other => return Err(invalid("moments", format!("`{other}` is not one of f32, bf16, host"))),
        };
        // A CPU run standing for a device's (a heap trace) keeps them apart.
        if moments_on_host && vramfit::backends::is_cpu::<B>() && !vramfit::fused::is_as_on_a_device() {
            return Err(invalid(
                "moments",
                "host keeps Adam's moments in host memory instead of a GPU's; on the CPU (--device cpu) they are \
                 there already. Use it with --device wgpu or cuda, or moments = f32",
            ));
        }
        if !supported(moments) {
            return Err(invalid("moments", "bf16 is not supported by this device; use f32"));
        }
        let cleanup =
            CleanupPolicy::parse(&self.allocator_cleanup).map_err(|e| invalid("allocator_cleanup", e.to_string()))?;
        Ok(Resolved {
            precision,
            loss_scaling,
            checkpointed,
            batching,
            storage,
            moments,
            moments_on_host,
            cleanup,
        })
    }
}

/// `bytes` in words: a binary unit up to TiB, past that a power of ten.
fn rough_size(bytes: f64) -> String {
    if bytes < (1u64 << 60) as f64 {
        vramfit::profile::human_bytes(bytes as u64)
    } else {
        format!("{bytes:.1e} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::TaskConfig;
    use crate::gpt::{GptConfig, TrainConfig};
    use burn::backend::Flex;

    fn check(c: TrainConfig) -> String {
        c.resolve::<Flex>(&Default::default()).unwrap_err().to_string()
    }

    #[test]
    fn invalid_combinations_name_the_setting() {
        let e = check(TrainConfig {
            precision: "f16".into(),
            loss_scale: "none".into(),
            ..Default::default()
        });
        assert!(e.contains("loss_scale") && e.contains("dynamic"), "{e}");
        let e = check(TrainConfig {
            batch_size: 16,
            micro_batch: 5,
            accumulate: 3,
            ..Default::default()
        });
        assert!(e.contains("micro_batch") && e.contains("batch_size"), "{e}");
        let e = check(TrainConfig {
            precision: "fp8".into(),
            ..Default::default()
        });
        assert!(e.contains("precision") && e.contains("fp8"), "{e}");
        let e = check(TrainConfig {
            checkpoint: "every:0".into(),
            ..Default::default()
        });
        assert!(e.contains("checkpoint"), "{e}");
        let e = check(TrainConfig {
            task: TaskConfig {
                tokens: 100,
                ..Default::default()
            },
            ..Default::default()
        });
        assert!(e.contains("model.context"), "{e}");
        let mut c = TrainConfig::default();
        c.model.heads = 5;
        assert!(check(c).contains("heads"));
        assert!(TrainConfig::default().resolve::<Flex>(&Default::default()).is_ok());
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let e = TrainConfig::from_toml("steps = 3\n[model]\nwidht = 8\n", Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("widht") && e.contains("t.toml"), "{e}");
        let c = TrainConfig::from_toml("steps = 3\n[model]\nwidth = 8\nheads = 2\n", Path::new("t.toml")).unwrap();
        assert_eq!(
            (c.steps, c.model.width, c.model.depth),
            (3, 8, GptConfig::default().depth)
        );
        assert_eq!(TrainConfig::from_toml(&c.to_toml(), Path::new("x")).unwrap(), c);
    }

    #[test]
    fn schedule_warms_up_then_decays_to_a_tenth() {
        let c = TrainConfig {
            steps: 100,
            warmup_steps: 10,
            lr: 1.0,
            ..Default::default()
        };
        assert_eq!(c.lr_at(5), 0.5);
        assert!((c.lr_at(10) - 1.0).abs() < 1e-12);
        assert!((c.lr_at(100) - 0.1).abs() < 1e-12);
        assert!(c.lr_at(50) < c.lr_at(20));
    }
}
