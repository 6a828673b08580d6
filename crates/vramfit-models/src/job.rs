//! A model family's training run: the library's one trainer
//! ([`vramfit::trainer::Trainer`]), the same workload a user's model runs
//! as, on the family's course ([`FamilyCourse`]): batches of its synthetic
//! task, the warm-up and cosine learning rate, its floor and throughput in
//! `summary.json`, advice in `vramfit train`'s flags, and `weights.bin` at
//! the end. Every setting is validated when the run is built, before a run
//! directory exists. [`Transformer`] and [`Unet`] are its two families.

use burn::tensor::backend::AutodiffBackend;
use serde_json::json;
use vramfit::allocator::Cleanup;
use vramfit::batch::MicroBatching;
use vramfit::optim::{AdamConfig, ModuleAdam};
use vramfit::precision::{Autocast, LossScaler, ScalerConfig};
use vramfit::profile::{Category, MemoryReport};
use vramfit::run::{Run, RunError, Start, categories_at_peak};
use vramfit::step::{Stepper, Trainable};
use vramfit::trainer::{Course, Schedule, Trainer};

pub use vramfit::trainer::TrainSummary;

use crate::config::{ConfigError, FamilyConfig};
use crate::family::Family;
use crate::gpt::{GptConfig, TrainConfig};
use crate::unet::UnetConfig;

/// A training run of family `F` on backend `B`.
pub type Job<B, F, const D: usize> = Trainer<B, <F as Family<D>>::Net<B>, D, FamilyCourse<F, D>>;

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
    /// The run driver (directory, files, out-of-memory; the trainer's own
    /// errors, a step's or a checkpoint's, come through it).
    #[error(transparent)]
    Run(#[from] RunError),
}

/// What a family adds to the trainer: its settings and its task's data.
pub struct FamilyCourse<F: Family<D>, const D: usize> {
    config: FamilyConfig<F>,
    data: F::Data,
    /// Whether the device computes in bf16 (advice offers only what runs).
    bf16: bool,
    /// [`crate::config::ModelSettings::rebuilt_fingerprint`], taken once.
    rebuilt_fingerprint: Option<String>,
}

impl<F: Family<D>, const D: usize> FamilyCourse<F, D> {
    /// The settings.
    pub fn config(&self) -> &FamilyConfig<F> {
        &self.config
    }
}

impl<B: AutodiffBackend, F: Family<D>, const D: usize> Course<B, F::Net<B>, D> for FamilyCourse<F, D> {
    fn batch(&self, step: u64, size: usize, device: &B::Device) -> <F::Net<B> as Trainable<B, D>>::Batch {
        F::batch::<B>(&self.data, step, size, device)
    }

    fn lr(&self, _: &Schedule, step: u64) -> f64 {
        self.config.lr_at(step)
    }

    fn log_every(&self) -> u64 {
        self.config.log_every
    }

    fn checkpoint_kind(&self) -> &'static str {
        F::CHECKPOINT_KIND
    }

    fn rebuilt_from_settings(&self, path: &str) -> bool {
        self.config.model.rebuilt_from_settings(path)
    }

    fn rebuilt_fingerprint(&self) -> Option<String> {
        self.rebuilt_fingerprint.clone()
    }
    fn files(&self, model: &F::Net<B>) -> Result<Vec<(String, vramfit::run::FileBody)>, String> {
        Ok(self
            .config
            .model
            .files::<B>(model)?
            .into_iter()
            .map(|(name, bytes)| (name, bytes.into()))
            .collect())
    }

    fn data_fingerprint(&self) -> Option<String> {
        F::data_fingerprint(&self.data)
    }

    fn evaluate_every(&self) -> u64 {
        F::evaluate_every(&self.config.task)
    }

    fn evaluate(
        &self,
        model: &F::Net<B>,
        batching: &MicroBatching,
        autocast: &vramfit::precision::Autocast,
        device: &B::Device,
    ) -> Vec<(String, f64)> {
        F::evaluate::<B>(&self.data, model, batching.micro_batch, autocast, device)
    }

    /// The cadences, the learning rate, more steps, and Adam's moments
    /// between the device and the host.
    fn resumable(&self) -> vramfit::run::Resumable {
        vramfit::run::Resumable {
            cadence: &["allocator_cleanup", "log_every", "checkpoint_every", "profile_every"],
            learning_rates: &["lr"],
            steps: "steps",
            moments: Some("moments"),
        }
    }

    fn weights_kind(&self) -> Option<&'static str> {
        Some(F::WEIGHTS_KIND)
    }

    fn summary(
        &self,
        model: &F::Net<B>,
        batching: &MicroBatching,
        median_step_ms: f64,
        device: &B::Device,
    ) -> serde_json::Map<String, serde_json::Value> {
        let c = &self.config;
        c.model.summary::<B>(
            &self.data,
            model,
            c.batch_size,
            batching.micro_batch,
            median_step_ms,
            device,
        )
    }

    /// Advice in `vramfit train`'s flags, for the categories at the peak.
    fn advice(&self, report: &MemoryReport, b: &MicroBatching) -> Vec<String> {
        let c = &self.config;
        // Parameters stored in bf16 are widened to f32 where they are used,
        // and the forward keeps those copies for the backward: storage
        // lowers the figure only where the peak is outside the forward and
        // backward (measured, the transformer on the CPU with its peak in
        // the backward: 30,655,022 -> 30,674,531 bytes; tests/advice.rs).
        let in_step = report
            .headline
            .as_ref()
            .is_some_and(|h| h.phase.starts_with("forward") || h.phase.starts_with("backward"));
        let all_low = in_step || c.storage.iter().any(|s| s.starts_with("*:"));
        // A cleanup between steps cannot lower a peak inside one: the step
        // takes its pages back (measured, the transformer on wgpu with its
        // peak in the forward: 50,331,648 bytes either way, though each
        // step then starts from 8,388,608; tests/advice.rs).
        let within_step = in_step
            || report
                .headline
                .as_ref()
                .is_some_and(|h| h.phase.starts_with("optimizer"));
        let at_peak = categories_at_peak(report);
        let bytes = |c: Category| at_peak.iter().find(|(k, _)| *k == c).map_or(0, |(_, b)| *b);
        // On a pooled allocator the figure is whole pages: removing fewer
        // bytes than its pages held spare at the peak may lower nothing
        // (measured on wgpu: the transformer's 0.96 MB of moments moved to
        // the host left 167,772,160 bytes as they were). The CPU's heap
        // counts every byte.
        // The spare at the peak: its phase's reserved high-water mark less
        // the most it held in use.
        let slack = match report.peak_record() {
            Some(r) if !vramfit::backends::is_cpu::<B>() => r
                .peak_reserved
                .unwrap_or(0)
                .saturating_sub(r.peak_in_use.unwrap_or(u64::MAX)),
            _ => 0,
        };
        let mut out = Vec::new();
        for (category, _) in at_peak.iter().filter(|(c, b)| *c == Category::Cached || *b > slack) {
            let lever = match category {
                Category::Activations | Category::Other => {
                    let mut ways = Vec::new();
                    // One block recomputed keeps its input beside what it
                    // held: nothing to save (measured, depth 1: +6 KB).
                    if c.checkpoint != "all" && c.model.blocks() >= 2 {
                        ways.push("--checkpoint all (recompute blocks in backward)".to_string());
                    }
                    // Half the micro-batch saves half its activations and
                    // adds a gradient accumulator of the parameters' size:
                    // offered where that pays (measured otherwise: +18 KB).
                    if b.micro_batch > 1
                        && (b.accumulate > 1 || bytes(Category::Activations) > 2 * bytes(Category::Parameters))
                    {
                        ways.push(format!(
                            "--micro-batch {} --accumulate {} (same batch)",
                            b.micro_batch / 2,
                            b.accumulate * 2
                        ));
                    }
                    // Not on the CPU: Flex keeps the f32 tensors beside their
                    // bf16 copies, and the peak rises (measured, the
                    // transformer: 30.7 -> 37.3 MB; tests/advice.rs).
                    if c.precision == "f32" && !vramfit::backends::is_cpu::<B>() && self.bf16 {
                        ways.push("--precision bf16".into());
                    }
                    // The model's own (the fused attention): where it has
                    // a kernel (the CPU, wgpu, CUDA); elsewhere it would be
                    // Burn's operations.
                    if vramfit::fused::Attention::is_fused_on::<B>()
                        && let Some(lever) = c.model.activation_lever(&c.task)
                    {
                        ways.push(lever);
                    }
                    (!ways.is_empty()).then(|| format!("activations: {}", ways.join(", or ")))
                }
                Category::Parameters if !all_low => Some("parameters: --storage '*:bf16' (half the bytes)".into()),
                // Frozen weights take no updates: storing them in bf16 loses
                // only their rounding (nothing where they came in bf16).
                Category::FrozenParameters if !all_low => Some(
                    "frozen parameters: --storage '*:bf16' (half the bytes; no updates to lose, only the weights' \
                     rounding)"
                        .into(),
                ),
                Category::OptimizerState => {
                    let mut ways = Vec::new();
                    if !vramfit::backends::is_cpu::<B>() {
                        ways.push("--moments host (none on the device, the same updates; a transfer each step)");
                    }
                    if c.moments == "f32" && self.bf16 {
                        ways.push("--moments bf16 (half the bytes)");
                    }
                    (!ways.is_empty()).then(|| format!("optimizer state: {}", ways.join(", or ")))
                }
                Category::Gradients if !all_low => {
                    Some("gradients: --storage '*:bf16' (gradients take the parameters' type)".into())
                }
                Category::Cached if c.allocator_cleanup == "never" && !within_step => {
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
}

/// The run of `config` on `device`: its settings validated, the model
/// built with its storage policy applied, the step composed.
pub fn build<B: AutodiffBackend, F: Family<D>, const D: usize>(
    config: FamilyConfig<F>,
    device: &B::Device,
) -> Result<Job<B, F, D>, TrainError> {
    let r = config.resolve::<B>(device)?;
    let model = config.model.init::<B>(config.seed, device)?;
    let model = r.storage.apply(model).map_err(|e| ConfigError::Invalid {
        name: "storage",
        why: e.to_string(),
    })?;
    // The ranks this process joined (`vramfit train --ranks N` under mpirun).
    let ranks = match config.ranks {
        1 => None,
        n => match vramfit::ranks::world().filter(|w| w.size() == n) {
            Some(w) => Some(w),
            None => {
                return Err(ConfigError::Invalid {
                    name: "ranks",
                    why: format!(
                        "ranks = {n} needs {n} processes started together: run `vramfit train … --ranks {n}` (it starts \
                         them through mpirun) or `mpirun -n {n} vramfit train …`, in a build with `--features mpi`{}",
                        vramfit::ranks::world().map_or(String::new(), |w| format!(" (this job has {} ranks)", w.size()))
                    ),
                }
                .into());
            }
        },
    };
    let stepper = Stepper {
        autocast: Autocast::new(r.precision),
        checkpointed: r.checkpointed,
        batching: r.batching,
        scaler: r.loss_scaling.then(|| LossScaler::new(ScalerConfig::default())),
        optimizer: {
            let adam = ModuleAdam::new(AdamConfig::default(), config.weight_decay, r.moments);
            let adam = if r.moments_on_host { adam.on_host() } else { adam };
            match &ranks {
                Some(ranks) if config.shard_moments => adam.sharded(ranks.clone()),
                _ => adam,
            }
        },
        cleanup: Cleanup::new(r.cleanup),
        attempts: 0,
        ranks,
    };
    let mut techniques = json!({
        "precision": config.precision, "checkpoint": config.checkpoint,
        "micro_batch": stepper.batching.micro_batch, "accumulate": stepper.batching.accumulate,
        "storage": config.storage, "moments": config.moments, "allocator_cleanup": config.allocator_cleanup,
    });
    if config.ranks > 1 {
        techniques["ranks"] = json!(config.ranks);
    }
    if config.shard_moments {
        techniques["shard_moments"] = json!(true);
    }
    // A model with attention says how it computed it.
    if let Some(attention) = config.model.attention() {
        techniques["attention"] = json!(attention.to_string());
    }
    let schedule = Schedule {
        steps: config.steps,
        batch_size: config.batch_size,
        lr: config.lr,
        checkpoint_every: config.checkpoint_every,
        profile_every: config.profile_every,
    };
    let course = FamilyCourse {
        data: config.model.data(&config.task)?,
        rebuilt_fingerprint: config.model.rebuilt_fingerprint()?,
        config,
        bf16: B::supports_dtype(device, burn::tensor::DType::BF16),
    };
    // The settings were resolved to a consistent step: this only restates it.
    Trainer::with_stepper(model, course, schedule, stepper, techniques, device).map_err(|e| {
        TrainError::Config(ConfigError::Invalid {
            name: "techniques",
            why: e.to_string(),
        })
    })
}

/// Starts a new run of family `F`, or opens a run directory to resume it
/// (with its own settings); returns the run and the workload to drive.
/// Settings are validated before the directory is created.
pub fn start<B: AutodiffBackend, F: Family<D>, const D: usize>(
    start: Start<FamilyConfig<F>>,
    device: &B::Device,
    device_name: &str,
) -> Result<(Run, Job<B, F, D>), TrainError> {
    match start {
        Start::New(config, out) => {
            let text = config.to_toml();
            let workload = build::<B, F, D>(config, device)?;
            let run = Run::create(&out, &text, device_name, &format!("vramfit train {}", F::NAME))?;
            Ok((run, workload))
        }
        Start::Resume(out) => {
            let (run, text) = Run::open(&out, device_name, &format!("vramfit train {}", F::NAME))?;
            let config = FamilyConfig::from_toml(&text, &run.dir().path("config.toml"))
                .map_err(|e| run.settings_error(TrainError::from(e)))?;
            Ok((run, build::<B, F, D>(config, device)?))
        }
    }
}

/// [`start`] for the transformer.
pub fn launch<B: AutodiffBackend>(
    start: Start<TrainConfig>,
    device: &B::Device,
    device_name: &str,
) -> Result<(Run, Transformer<B>), TrainError> {
    self::start::<B, GptConfig, 3>(start, device, device_name)
}
