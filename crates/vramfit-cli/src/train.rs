//! `vramfit train transformer|llm|unet|segmenter`: flags → settings → the run driver;
//! with `--budget`, the library's planning pipeline first.

use std::path::PathBuf;

use anyhow::Result;
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::Family;
use vramfit_models::gpt::GptConfig;
use vramfit_models::llama::LlamaConfig;
use vramfit_models::segmenter::SegmenterConfig;
use vramfit_models::unet::UnetConfig;

#[derive(clap::Subcommand)]
pub enum Which {
    /// A GPT-style decoder on deterministic synthetic sequences.
    Transformer(TrainArgs),
    /// A Llama-family decoder (RMSNorm, rotary positions, SwiGLU, grouped-query
    /// attention) on the same sequences; `--shape NAME` for a published shape.
    Llm(TrainArgs),
    /// A convolutional U-Net with BatchNorm denoising crops of the procedural
    /// sample (`--set task.resolution=256`, `--set model.norm=group`, …).
    Unet(TrainArgs),
    /// A segmenter on an LLM (an image encoder, a Llama-family LLM reading its
    /// tokens and a prompt, SAM's mask decoder) on synthetic images and masks;
    /// `--shape prs-med` for TinySAM and Mistral-7B at 1024 px.
    Segmenter(TrainArgs),
}

impl TrainArgs {
    fn probes(&self) -> crate::plan::Probes {
        crate::plan::Probes {
            blocks: self.probe_blocks,
            tokens: self.probe_tokens,
        }
    }
}

#[derive(clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    settings: crate::flags::TrainSettings,
    /// Plan the run into this memory budget first (6GiB, 512MiB, 1.5GB, bytes, or
    /// auto: free memory): the planner's fastest plan replaces the technique flags.
    #[arg(long, allow_hyphen_values = true)]
    budget: Option<String>,
    /// With --budget: probe at this effective batch and extrapolate to the run's.
    #[arg(long, requires = "budget", allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    probe_batch: Option<usize>,
    /// With --budget: probe a slice this many blocks deep and extrapolate to
    /// the model's depth (0: probe the whole model; default: 2 for llm, whole otherwise).
    #[arg(long, requires = "budget", allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    probe_blocks: Option<usize>,
    /// With --budget: probe at this many tokens a sample (and twice it) and
    /// extrapolate to the run's (0: at the run's; default: 128 for an llm
    /// run of 512 tokens or more).
    #[arg(long, requires = "budget", allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    probe_tokens: Option<usize>,
    /// Run directory (default: the next free runs/<workload>-NNN).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in RUN_DIR from its last checkpoint.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = [
        "config", "precision", "checkpoint", "micro_batch", "accumulate", "batch_size", "steps",
        "storage", "moments", "allocator_cleanup", "attention", "seed", "out", "set", "budget",
        "shard_moments", "keep_quality", "shape", "train", "weights", "data", "adapter"])]
    resume: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Test seam: with --budget, the first plan fails at this step as an out-of-memory would
    /// (on ranks: every rank, the planner's launcher passing it on).
    #[arg(long, hide = true)]
    simulate_oom_at: Option<u64>,
    /// A rank of a planned run on ranks: each step held to this many bytes (the planner's launcher gives it).
    #[arg(long, hide = true, conflicts_with = "budget")]
    held_to: Option<u64>,
    /// A rank of a planned run on ranks resumed under a fallback plan's settings (the planner's launcher gives it).
    #[arg(long, hide = true, requires = "resume")]
    fallback: bool,
}

pub fn run(which: Which) -> Result<()> {
    let (Which::Transformer(args) | Which::Llm(args) | Which::Unet(args) | Which::Segmenter(args)) = &which;
    if let Some(out) = &args.out {
        crate::flags::check_output(out, &crate::flags::Inputs::inputs(&args.settings))?;
    }
    match which {
        Which::Transformer(args) => run_family::<GptConfig, 3>(args, crate::runs::Launch::Transformer),
        Which::Llm(args) => run_family::<LlamaConfig, 3>(args, crate::runs::Launch::Llm),
        Which::Unet(args) => run_family::<UnetConfig, 4>(args, crate::runs::Launch::Unet),
        Which::Segmenter(args) => run_family::<SegmenterConfig, 3>(args, crate::runs::Launch::Segmenter),
    }
}

fn run_family<F: Family<D>, const D: usize>(
    args: TrainArgs,
    launch: impl FnOnce(vramfit::run::Start<FamilyConfig<F>>) -> crate::runs::Launch,
) -> Result<()> {
    if let Some(budget) = &args.budget {
        let mut config = crate::flags::resolve_train::<F>(&args.settings)?;
        let budget = crate::budget::Budget::parse(budget, &args.device.name)?;
        let replaced = args.settings.techniques_given();
        if !replaced.is_empty() {
            eprintln!(
                "note: with --budget the planner sets the techniques; it replaces {}",
                replaced.join(", ")
            );
        }
        if config.ranks > 1 {
            let ranks = config.ranks;
            if vramfit::ranks::world().is_some() {
                anyhow::bail!(
                    "--budget with --ranks plans in one process and then starts the {ranks} ranks itself: run it \
                     without mpirun"
                );
            }
            crate::ranks::check_mpi(ranks)?;
            if budget.auto {
                anyhow::bail!(
                    "--budget auto reads this machine's free memory, which {ranks} ranks on it would share: give the \
                     budget of one rank in bytes (e.g. --budget 2GiB)"
                );
            }
            let Some(out) = args.out.clone() else {
                anyhow::bail!("--ranks {ranks} needs --out RUN_DIR: every rank writes under it");
            };
            // The probes run here, as one rank; the plans are per rank.
            config.ranks = 1;
            config.shard_moments = false;
            let action = crate::plan::Action::RunOnRanks {
                budget,
                ranks,
                probe_batch: args.probe_batch,
                out,
                device: args.device.name.clone(),
                simulate_oom_at: args.simulate_oom_at,
            };
            return crate::plan::model::<F, D>(config, &args.device.name, args.probes(), action);
        }
        let action = crate::plan::Action::Run {
            budget,
            probe_batch: args.probe_batch,
            out: crate::runs::run_path(&args.out, F::NAME),
            simulate_oom_at: args.simulate_oom_at,
        };
        return crate::plan::model::<F, D>(config, &args.device.name, args.probes(), action);
    }
    if args.simulate_oom_at.is_some() && args.held_to.is_none() {
        anyhow::bail!("--simulate-oom-at is a test seam of planned runs: give --budget too");
    }
    let held = crate::runs::Held {
        budget: args.held_to,
        new_settings: args.fallback,
        simulate_oom_at: args.simulate_oom_at,
    };
    let (start, ranks) = match &args.resume {
        Some(dir) => {
            let launcher = vramfit::ranks::world().is_none();
            let ready = vramfit_models::on_ranks::ready_resume::<F, D>(
                dir,
                &format!("vramfit train {}", F::NAME),
                args.settings.ranks(),
                launcher,
                |ranks| crate::ranks::ready_to_launch(ranks).map_err(Into::into),
            )?;
            if let Some((wrote, step)) = ready.regathered {
                println!(
                    "resuming on {} rank(s) what {wrote} ran: the state of step {step} gathered from every rank \
                     (Adam's moments from the rank that kept them)",
                    ready.ranks
                );
            }
            if let Some(step) = ready.aligned {
                println!(
                    "the ranks' newest checkpoints differ (a rank stopped between them): every rank resumes from \
                     step {step}, the newest all of them wrote (the newer ones removed)"
                );
            }
            (vramfit::run::Start::Resume(dir.clone()), ready.ranks)
        }
        None => {
            let mut config = crate::flags::resolve_train::<F>(&args.settings)?;
            let ranks = config.ranks;
            // Every rank splits alike; the launcher says so once.
            if let Some(note) = vramfit_models::on_ranks::ready_new(&mut config)?
                && vramfit::ranks::world().is_none()
            {
                println!("{note}");
            }
            if ranks > 1 {
                crate::ranks::check_mpi(ranks)?;
            }
            (
                vramfit::run::Start::New(config, crate::runs::run_path(&args.out, F::NAME)),
                ranks,
            )
        }
    };
    match vramfit::ranks::world() {
        None if ranks > 1 => {
            if args.resume.is_none() && args.out.is_none() {
                anyhow::bail!("--ranks {ranks} needs --out RUN_DIR: every rank writes under it");
            }
            return crate::ranks::relaunch(ranks);
        }
        Some(w) if w.size() != ranks => anyhow::bail!(
            "this process is one of {} MPI ranks, but the run asks for {ranks}: give --ranks {}",
            w.size(),
            w.size()
        ),
        _ => {}
    }
    crate::runs::run(&args.device.name, launch(start), held)
}
