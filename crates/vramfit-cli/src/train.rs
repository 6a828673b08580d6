//! `vramfit train transformer|unet`: flags → settings → the run driver;
//! with `--budget`, the library's planning pipeline first.

use std::path::PathBuf;

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{FALLBACKS, Runnable, record, verify};
use vramfit::profile::DeviceMemory;
use vramfit::run::RunPath;
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::{Family, ModelSettings};
use vramfit_models::gpt::GptConfig;
use vramfit_models::plan::FamilyTarget;
use vramfit_models::unet::UnetConfig;

use crate::budget::{Budget, check_new_out, check_within, run_with_fallbacks};
use crate::device::{OnBackend, on_device};
use crate::show_plan::{print_choice, print_verified, probe};

#[derive(clap::Subcommand)]
pub enum Which {
    /// A GPT-style decoder on deterministic synthetic sequences.
    Transformer(TrainArgs),
    /// A convolutional U-Net with BatchNorm denoising crops of the procedural
    /// sample (`--set task.resolution=256`, `--set model.norm=group`, …).
    Unet(TrainArgs),
}

#[derive(clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    settings: Settings,
    /// Plan the run into this memory budget first (6GiB, 512MiB, 1.5GB, bytes, or
    /// auto: free memory): the planner's fastest plan replaces the technique flags.
    #[arg(long)]
    budget: Option<String>,
    /// With --budget: probe at this effective batch and extrapolate to the run's.
    #[arg(long, requires = "budget")]
    probe_batch: Option<usize>,
    /// Run directory (default: the next free runs/<workload>-NNN).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in RUN_DIR from its last checkpoint.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = [
        "config", "precision", "checkpoint", "micro_batch", "accumulate", "batch_size", "steps",
        "storage", "moments", "allocator_cleanup", "seed", "out", "set", "budget"])]
    resume: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Test seam: with --budget, the first plan fails at this step as an out-of-memory would.
    #[arg(long, hide = true, requires = "budget")]
    simulate_oom_at: Option<u64>,
}

/// A family's settings as flags (shared by `train` and `plan`).
#[derive(clap::Args)]
pub struct Settings {
    /// TOML file of settings (keys as in a run's config.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Matrix-work precision: f32, bf16 or f16 (f16 uses dynamic loss scaling).
    #[arg(long)]
    precision: Option<String>,
    /// Block activation checkpointing: none, all, every:K, auto (√n), list:I,J.
    #[arg(long)]
    checkpoint: Option<String>,
    /// Samples per forward/backward.
    #[arg(long)]
    micro_batch: Option<usize>,
    /// Micro-batches per optimiser step (micro_batch × accumulate = batch_size).
    #[arg(long)]
    accumulate: Option<usize>,
    /// Samples per optimiser step.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Optimiser steps (e.g. 1000 or 1e3).
    #[arg(long, value_parser = crate::parse_count::<u64>)]
    steps: Option<u64>,
    /// Store a parameter group in low precision, PREFIX:TYPE (repeatable), e.g. token_embedding:bf16, stages:bf16.
    #[arg(long, value_name = "PREFIX:TYPE")]
    storage: Vec<String>,
    /// Adam moments' type: f32 or bf16.
    #[arg(long)]
    moments: Option<String>,
    /// Allocator cleanup: never, step, every:N.
    #[arg(long)]
    allocator_cleanup: Option<String>,
    /// Seed of the weights.
    #[arg(long)]
    seed: Option<u64>,
    /// Override one setting, KEY=VALUE (dotted keys reach tables: model.width=128) (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

impl Settings {
    /// The technique flags given (the planner's to set with `--budget`).
    pub fn techniques_given(&self) -> Vec<&'static str> {
        [
            ("--precision", self.precision.is_some()),
            ("--checkpoint", self.checkpoint.is_some()),
            ("--micro-batch", self.micro_batch.is_some()),
            ("--accumulate", self.accumulate.is_some()),
            ("--storage", !self.storage.is_empty()),
            ("--moments", self.moments.is_some()),
            ("--allocator-cleanup", self.allocator_cleanup.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }
}

/// Resolves defaults ← config file ← flags ← `--set`.
pub fn resolve<M: ModelSettings>(a: &Settings) -> Result<FamilyConfig<M>> {
    let mut c = match &a.config {
        Some(path) => FamilyConfig::<M>::load(path)?,
        None => FamilyConfig::<M>::default(),
    };
    let or = |flag: &Option<String>, value: &mut String| {
        if let Some(f) = flag {
            *value = f.clone();
        }
    };
    or(&a.precision, &mut c.precision);
    or(&a.checkpoint, &mut c.checkpoint);
    or(&a.moments, &mut c.moments);
    or(&a.allocator_cleanup, &mut c.allocator_cleanup);
    c.batch_size = a.batch_size.unwrap_or(c.batch_size);
    c.micro_batch = a.micro_batch.unwrap_or(c.micro_batch);
    c.accumulate = a.accumulate.unwrap_or(c.accumulate);
    c.steps = a.steps.unwrap_or(c.steps);
    c.seed = a.seed.unwrap_or(c.seed);
    if !a.storage.is_empty() {
        c.storage = a.storage.clone();
    }
    Ok(vramfit::settings::apply_sets(&c.to_toml(), &a.set)?.unwrap_or(c))
}

pub fn run(which: Which) -> Result<()> {
    match which {
        Which::Transformer(args) => run_family::<GptConfig, 3>(args, crate::runs::Launch::Transformer),
        Which::Unet(args) => run_family::<UnetConfig, 4>(args, crate::runs::Launch::Unet),
    }
}

fn run_family<F: Family<D>, const D: usize>(
    args: TrainArgs,
    launch: impl FnOnce(vramfit::run::Start<FamilyConfig<F>>) -> crate::runs::Launch,
) -> Result<()> {
    if let Some(budget) = &args.budget {
        let config = resolve::<F>(&args.settings)?;
        let budget = crate::budget::Budget::parse(budget, &args.device.name)?;
        return on_device(
            &args.device.name,
            PlannedRun::<F, D> {
                config,
                budget,
                probe_batch: args.probe_batch,
                out: crate::run_path(&args.out, F::NAME),
                simulate_oom_at: args.simulate_oom_at,
                replaced: args.settings.techniques_given(),
            },
        );
    }
    let start = match &args.resume {
        Some(dir) => vramfit::run::Start::Resume(dir.clone()),
        None => vramfit::run::Start::New(resolve::<F>(&args.settings)?, crate::run_path(&args.out, F::NAME)),
    };
    crate::runs::run(&args.device.name, launch(start))
}

/// `train transformer|unet --budget`: plan, write the plan into the run
/// directory, run the winner, fall back to the next plans on an out-of-memory.
struct PlannedRun<F: ModelSettings, const D: usize> {
    config: FamilyConfig<F>,
    budget: Budget,
    probe_batch: Option<usize>,
    out: RunPath,
    simulate_oom_at: Option<u64>,
    /// The technique flags the user gave, which the plan replaces.
    replaced: Vec<&'static str>,
}

impl<F: Family<D>, const D: usize> OnBackend for PlannedRun<F, D> {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend,
        B::InnerBackend: DeviceMemory,
    {
        check_new_out(&self.out)?;
        if !self.replaced.is_empty() {
            eprintln!(
                "note: with --budget the planner sets the techniques; it replaces {}",
                self.replaced.join(", ")
            );
        }
        let mut target = FamilyTarget::<B, F, D>::new(self.config.clone(), device)?.with_device_name(&name);
        let cal = probe(&mut target, self.probe_batch, &name)?;
        let mut verified = verify(&cal, &mut target, self.budget.bytes)?;
        print_choice(&cal, &verified.choice, self.budget);
        print_verified(&verified.choice, &verified.measured);
        let batch = self.config.batch_size;
        // On the CPU the budget is the whole heap: the planner's own tables
        // (hundreds of plans, the probes' records) must not ride along into the run.
        verified.choice.plans.truncate(1 + FALLBACKS);
        let kept = verified.choice.plans.clone();
        let configs: Vec<FamilyConfig<F>> = kept.iter().map(|p| target.settings(&p.knobs)).collect();
        let mut plan_json = record(&cal, &verified, &name);
        plan_json["budget_auto"] = serde_json::json!(self.budget.auto);
        drop((cal, verified));
        let (summary, dir) = run_with_fallbacks(
            &target,
            &configs,
            plan_json,
            self.budget,
            self.out,
            self.simulate_oom_at,
            |i| kept[i].knobs.describe(batch),
        )?;
        crate::runs::print_train(F::NAME, &summary);
        crate::runs::print_common(&summary, &dir);
        check_within(summary.peak_memory_bytes.unwrap_or(0), self.budget.bytes, &dir)
    }
}
