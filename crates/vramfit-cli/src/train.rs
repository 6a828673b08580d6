//! `vramfit train transformer`: flags → settings → the models crate's job,
//! with a progress bar and a printed summary.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use vramfit_models::config::TrainConfig;
use vramfit_models::job::{Event, TrainJob, TrainSummary};

#[derive(clap::Subcommand)]
pub enum Which {
    /// A GPT-style decoder on deterministic synthetic sequences.
    Transformer(TransformerArgs),
}

#[derive(clap::Args)]
pub struct TransformerArgs {
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
    /// Store a parameter group in low precision, PREFIX:TYPE (repeatable), e.g. token_embedding:bf16.
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
    /// Run directory (default: the next free runs/transformer-NNN).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override one setting, KEY=VALUE (dotted keys reach tables: model.width=128) (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Continue the run in RUN_DIR from its last checkpoint.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = [
        "config", "precision", "checkpoint", "micro_batch", "accumulate", "batch_size", "steps",
        "storage", "moments", "allocator_cleanup", "seed", "out", "set"])]
    resume: Option<PathBuf>,
    /// Device: cpu; cuda or wgpu in a build with that feature (`--features cuda`, `--features wgpu`).
    #[arg(long, default_value = "cpu")]
    device: String,
}

/// Resolves defaults ← config file ← flags ← `--set`.
fn resolve(a: &TransformerArgs) -> Result<TrainConfig> {
    let mut c = match &a.config {
        Some(path) => TrainConfig::load(path)?,
        None => TrainConfig::default(),
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
    let Which::Transformer(args) = which;
    let config = match &args.resume {
        Some(_) => TrainConfig::default(),
        None => resolve(&args)?,
    };
    let auto = args.resume.is_none() && args.out.is_none();
    for _ in 0..crate::AUTO_NAME_TRIES {
        let out = match (&args.resume, &args.out) {
            (Some(dir), _) | (None, Some(dir)) => dir.clone(),
            (None, None) => vramfit::run::next_free_run_dir(Path::new("runs"), "transformer"),
        };
        let job = TrainJob {
            config: config.clone(),
            out: out.clone(),
            resume: args.resume.is_some(),
            device_name: String::new(),
        };
        let summary = match crate::device::train(&args.device, job, observer()) {
            Err(e) if auto && crate::taken_meanwhile(&e, &out) => continue,
            other => other?,
        };
        let Some(s) = summary else {
            bail!("the run stopped before its end")
        };
        print_summary(&s, &out);
        return Ok(());
    }
    bail!("other vramfit processes keep taking the next free runs/transformer-NNN; pass --out")
}

fn observer() -> impl FnMut(Event) -> ControlFlow<()> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps · {msg} · {per_sec} · ETA {eta}")
            .expect("valid template"),
    );
    move |event| {
        match event {
            Event::Start { done, total } => {
                bar.set_length(total);
                bar.set_position(done);
                bar.reset_eta();
            }
            Event::Step {
                step,
                loss,
                scale,
                stepped,
            } => {
                bar.set_position(step);
                bar.set_message(format!("loss {loss:.4}"));
                if !stepped {
                    bar.println(format!(
                        "step {step}: inf/NaN gradients at loss scale {scale}: step skipped, scale halved"
                    ));
                }
            }
            Event::Checkpoint(_) => {}
        }
        ControlFlow::Continue(())
    }
}

fn print_summary(s: &TrainSummary, dir: &Path) {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!("trained transformer on {}: {}", s.device, s.techniques);
    println!(
        "  final loss {:.4} nats/token (task floor {:.4}) · {} steps ({} skipped, loss scale {})",
        s.final_loss, s.entropy_floor, s.steps, s.skipped_steps, s.loss_scale
    );
    println!(
        "  {:.1} s · {:.1} ms per step (median) · {:.0} tokens/s",
        s.wall_seconds, s.median_step_ms, s.tokens_per_second
    );
    println!(
        "  parameters {:.2} MiB · optimizer state {:.2} MiB · peak {:.0} MiB ({})",
        mib(s.parameter_bytes),
        mib(s.optimizer_state_bytes),
        mib(s.peak_memory_bytes),
        s.peak_memory_source
    );
    if s.cleanup_calls > 0 {
        println!(
            "  allocator cleanups: {} in {:.3} s",
            s.cleanup_calls, s.cleanup_seconds
        );
    }
    println!("  run directory: {}", dir.display());
}
