//! `vramfit scene [DATASET]`: a 3D Gaussian scene (SH colour) fitted to a
//! COLMAP text dataset's views, or to the built-in scene, through the run
//! driver; new or resumed; on the renderer's CPU twin or, with its state in
//! device buffers, on its CubeCL kernels (`--device wgpu|cuda`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use vramfit::run::Start;
use vramfit_scene::job::{BUILTIN, SceneConfig, launch};

#[derive(clap::Args)]
pub struct SceneArgs {
    /// A COLMAP text dataset's folder (sparse/0/*.txt and images/); none: the built-in scene.
    dataset: Option<PathBuf>,
    /// Optimiser steps, one view each (e.g. 3000 or 3e3).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<u64>)]
    steps: Option<u64>,
    /// Final SH degree, 0 to 3 (raised from 0 every sh_every steps).
    #[arg(long)]
    sh_degree: Option<usize>,
    /// Each view at 1/K of its size (for large photographs).
    #[arg(long, value_name = "K")]
    downscale: Option<usize>,
    /// The most Gaussians the fit may hold: densification never exceeds it.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    max_gaussians: Option<usize>,
    /// TOML file of settings (keys as in a run's config.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one setting, KEY=VALUE with a key of config.toml (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Run directory (default: the next free runs/scene-NNN).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in RUN_DIR from its last checkpoint.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["dataset", "steps", "sh_degree", "downscale", "max_gaussians", "config", "set", "out"])]
    resume: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Where Adam's moments live with --device wgpu|cuda: device, or host
    /// (host memory, updated by the CPU; the same parameters, less device memory).
    #[arg(long, default_value = "device", value_parser = clap::value_parser!(vramfit::optim::Moments))]
    moments: vramfit::optim::Moments,
}

pub fn run(args: SceneArgs) -> Result<()> {
    let placement = crate::device::scene_placement(&args.device.name, args.moments)?;
    let start = match &args.resume {
        Some(dir) => Start::Resume(dir.clone()),
        None => Start::New(resolve(&args)?, crate::run_path(&args.out, "scene")),
    };
    let (run, job) = launch(start, placement)?;
    let dir = run.dir().root().to_path_buf();
    let Some(summary) = run.drive(job, crate::runs::progress())? else {
        bail!("the run stopped before its end")
    };
    let s = &summary.workload;
    println!(
        "fitted {} Gaussians (SH degree {}) to {} views, {} held out",
        s.gaussians, s.sh_degree, s.views[0], s.views[1]
    );
    let [cloned, split, pruned, capped] = s.densified;
    println!(
        "  densified: {cloned} cloned, {split} split, {pruned} pruned{}",
        if capped > 0 {
            format!(", {capped} candidates left out at the cap (--max-gaussians)")
        } else {
            String::new()
        }
    );
    println!(
        "  held-out PSNR {:.2} dB, SSIM {:.3} (the seeded Gaussians: {:.2} dB) · final loss {:.4} · {} steps · {:.1} s · \
         {:.1} ms per step (median)",
        s.held_out_psnr_db,
        s.held_out_ssim,
        s.initial_psnr_db,
        s.final_loss,
        summary.steps,
        summary.wall_seconds,
        summary.median_step_ms
    );
    crate::runs::print_common(&summary, &dir);
    Ok(())
}

/// `vramfit render-scene RUN_DIR --view K OUT.png`.
pub fn render(run_dir: &std::path::Path, view: usize, out: &std::path::Path) -> Result<()> {
    vramfit_splat::picture::check_output_path(out)?;
    let r = vramfit_scene::job::render_run_view(run_dir, view)?;
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

/// Defaults ← config file ← flags ← `--set`.
fn resolve(args: &SceneArgs) -> Result<SceneConfig> {
    let mut c = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("{}: cannot read it: {e}", path.display()))?;
            SceneConfig::from_toml(&text, path)?
        }
        None => SceneConfig::default(),
    };
    if let Some(d) = &args.dataset {
        c.dataset = d.display().to_string();
    }
    c.steps = args.steps.unwrap_or(c.steps);
    c.sh_degree = args.sh_degree.unwrap_or(c.sh_degree);
    c.max_gaussians = args.max_gaussians.unwrap_or(c.max_gaussians);
    c.downscale = args.downscale.unwrap_or(c.downscale);
    let c = vramfit::settings::apply_sets(&c.to_toml(), &args.set)?.unwrap_or(c);
    if c.dataset == BUILTIN && args.dataset.is_some() {
        bail!("'{BUILTIN}' names the built-in scene: give no dataset for it, or a folder's path");
    }
    Ok(c)
}
