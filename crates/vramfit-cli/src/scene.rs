//! `vramfit scene [DATASET]`: a 3D Gaussian scene (SH colour) fitted to a
//! COLMAP text dataset's views, or to the built-in scene, through the run
//! driver; new or resumed; on the renderer's CPU twin or, with its state in
//! device buffers, on its CubeCL kernels (`--device wgpu|cuda`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use vramfit::run::Start;
use vramfit_scene::job::launch;

#[derive(clap::Args)]
pub struct SceneArgs {
    #[command(flatten)]
    settings: crate::flags::SceneSettings,
    /// Plan the fit into this memory budget first (6GiB, 512MiB, bytes, or
    /// auto: free memory), with --device wgpu|cuda: the planner sets
    /// max_gaussians, moments and sh_storage (and the SH degree only with
    /// --allow-quality-loss).
    #[arg(long, allow_hyphen_values = true)]
    budget: Option<String>,
    /// Run directory (default: the next free runs/scene-NNN).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in RUN_DIR from its last checkpoint.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["dataset", "steps", "sh_degree", "downscale", "max_gaussians", "moments", "sh_storage", "config", "set", "out", "budget", "allow_quality_loss"])]
    resume: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Test seam: with --budget, the first plan fails at this step as an out-of-memory would.
    #[arg(long, hide = true, requires = "budget")]
    simulate_oom_at: Option<u64>,
}

pub fn run(args: SceneArgs) -> Result<()> {
    if let Some(out) = &args.out {
        crate::flags::check_output(out, &crate::flags::Inputs::inputs(&args.settings))?;
    }
    if let Some(budget) = &args.budget {
        let budget = crate::budget::Budget::parse(budget, &args.device.name)?;
        let action = crate::plan::Action::Run {
            budget,
            probe_batch: None,
            out: crate::runs::run_path(&args.out, "scene"),
            simulate_oom_at: args.simulate_oom_at,
        };
        return crate::plan::scene(&args.settings, &args.device.name, action);
    }
    if args.settings.allow_quality_loss().is_some() {
        bail!("--allow-quality-loss tells the planner what it may trade: give it with --budget");
    }
    let placement = crate::device::scene_placement(&args.device.name)?;
    let start = match &args.resume {
        Some(dir) => Start::Resume(dir.clone()),
        None => Start::New(
            crate::flags::resolve_scene(&args.settings)?,
            crate::runs::run_path(&args.out, "scene"),
        ),
    };
    let (run, job) = launch(start, placement)?;
    let dir = run.dir().root().to_path_buf();
    let Some(summary) = run.drive(job, crate::runs::progress())? else {
        bail!("the run stopped before its end")
    };
    crate::runs::print_scene(&summary, &dir);
    Ok(())
}

/// `vramfit render-scene RUN_DIR --view K OUT.png`.
pub fn render(run_dir: &std::path::Path, view: usize, out: &std::path::Path) -> Result<()> {
    vramfit_gauss::picture::check_output_target(out)?;
    crate::flags::check_output(out, &[("the run directory".into(), run_dir.to_path_buf())])?;
    let r = vramfit_scene::view::render_run_view(run_dir, view)?;
    // Nor over the dataset the run fitted (an image of it, through a link).
    crate::flags::check_output(out, &[("the run's dataset".into(), r.dataset.clone())])?;
    vramfit::run::atomic_write(out, &r.png).map_err(|e| anyhow::anyhow!("{}: cannot write it: {e}", out.display()))?;
    println!(
        "wrote {}: view {view} of {} ({}) at step {}, PSNR {:.2} dB against the view's image",
        out.display(),
        r.views,
        if r.held_out { "held out" } else { "a training view" },
        r.step,
        r.psnr_db
    );
    Ok(())
}
