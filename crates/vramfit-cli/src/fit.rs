//! `vramfit fit`: an image fitted with 2D Gaussians through the run
//! driver, new or resumed; with `--budget`, planned first (`plan.rs`).

use std::path::PathBuf;

use anyhow::Result;
use vramfit::run::Start;

#[derive(clap::Args)]
pub struct FitArgs {
    #[command(flatten)]
    settings: crate::flags::FitSettings,
    /// Plan the fit into this memory budget first (6GiB, 512MiB, 1.5GB, bytes, or
    /// auto: free memory): the planner sets the band height (band_rows).
    #[arg(long, allow_hyphen_values = true)]
    budget: Option<String>,
    /// Run directory (default: the next free runs/fit-NNN).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in RUN_DIR from its last checkpoint.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["image", "gaussians", "steps", "seed", "out", "config", "set", "budget"])]
    resume: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Test seam: with --budget, the first plan fails at this step as an out-of-memory would.
    #[arg(long, hide = true, requires = "budget")]
    simulate_oom_at: Option<u64>,
}

pub fn run(args: FitArgs) -> Result<()> {
    if let Some(out) = &args.out {
        crate::flags::check_output(out, &crate::flags::Inputs::inputs(&args.settings))?;
    }
    if let Some(budget) = &args.budget {
        let budget = crate::budget::Budget::parse(budget, &args.device.name)?;
        let config = crate::flags::resolve_fit(&args.settings)?;
        if config.band_rows != 0 {
            eprintln!(
                "note: with --budget the planner sets the band height; it replaces band_rows = {}",
                config.band_rows
            );
        }
        let action = crate::plan::Action::Run {
            budget,
            probe_batch: None,
            out: crate::runs::run_path(&args.out, "fit"),
            simulate_oom_at: args.simulate_oom_at,
        };
        return crate::plan::splat(config, &args.device.name, action);
    }
    let start = match &args.resume {
        Some(dir) => Start::Resume(dir.clone()),
        None => Start::New(
            crate::flags::resolve_fit(&args.settings)?,
            crate::runs::run_path(&args.out, "fit"),
        ),
    };
    crate::runs::run(&args.device.name, crate::runs::Launch::Fit(start), Default::default())
}
