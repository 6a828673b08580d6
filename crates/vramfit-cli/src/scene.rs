//! `vramfit scene [DATASET]`: a 3D Gaussian scene (SH colour) fitted to a
//! COLMAP text dataset's views, or to the built-in scene, through the run
//! driver; new or resumed; on the renderer's CPU twin or, with its state in
//! device buffers, on its CubeCL kernels (`--device wgpu|cuda`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use vramfit::run::Start;
use vramfit_scene::job::{BUILTIN, SceneConfig, launch};

/// A scene fit's settings, for `vramfit scene` and `vramfit plan scene`.
#[derive(clap::Args)]
pub struct SceneSettings {
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
    /// The most Gaussians the fit may hold: densification never exceeds it
    /// (with a budget: the most the planner may set).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    max_gaussians: Option<usize>,
    /// Where Adam's moments live with --device wgpu|cuda: device, or host
    /// (host memory, updated by the CPU; the same parameters, less device
    /// memory). The config key `moments`.
    #[arg(long)]
    moments: Option<vramfit::optim::Moments>,
    /// TOML file of settings (keys as in a run's config.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one setting, KEY=VALUE with a key of config.toml (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Planning: let the planner lower the SH degree where the quality it
    /// costs, as measured on the built-in scene, is at most this (e.g. 0.3dB).
    #[arg(long, value_name = "DB", value_parser = parse_db)]
    allow_quality_loss: Option<f64>,
    /// Planning: the Gaussian counts each variant is probed at (default: a
    /// quarter, a half and all of --max-gaussians, within the device's
    /// largest buffer).
    #[arg(long, value_delimiter = ',')]
    probe_gaussians: Vec<usize>,
}

impl SceneSettings {
    /// The quality cost the planner may take (dB), if allowed.
    pub fn allow_quality_loss(&self) -> Option<f64> {
        self.allow_quality_loss
    }

    /// The counts to probe.
    pub fn probe_gaussians(&self) -> &[usize] {
        &self.probe_gaussians
    }
}

/// `0.3dB`, `0.3 dB` or `0.3`: decibels, 0 or more.
fn parse_db(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let number = t
        .strip_suffix("dB")
        .or_else(|| t.strip_suffix("db"))
        .unwrap_or(t)
        .trim();
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "`{text}` is not a quality loss: give decibels of held-out PSNR, 0 or more, such as 0.3dB"
        )),
    }
}

#[derive(clap::Args)]
pub struct SceneArgs {
    #[command(flatten)]
    settings: SceneSettings,
    /// Plan the fit into this memory budget first (6GiB, 512MiB, bytes, or
    /// auto: free memory), with --device wgpu|cuda: the planner sets
    /// max_gaussians and moments (and the SH degree only with --allow-quality-loss).
    #[arg(long)]
    budget: Option<String>,
    /// Run directory (default: the next free runs/scene-NNN).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in RUN_DIR from its last checkpoint.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["dataset", "steps", "sh_degree", "downscale", "max_gaussians", "moments", "config", "set", "out", "budget", "allow_quality_loss"])]
    resume: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Test seam: with --budget, the first plan fails at this step as an out-of-memory would.
    #[arg(long, hide = true, requires = "budget")]
    simulate_oom_at: Option<u64>,
}

pub fn run(args: SceneArgs) -> Result<()> {
    if let Some(budget) = &args.budget {
        let budget = crate::budget::Budget::parse(budget, &args.device.name)?;
        let action = crate::plan::Action::Run {
            budget,
            probe_batch: None,
            out: crate::run_path(&args.out, "scene"),
            simulate_oom_at: args.simulate_oom_at,
        };
        return crate::plan::scene(&args.settings, &args.device.name, action);
    }
    if args.settings.allow_quality_loss.is_some() {
        bail!("--allow-quality-loss tells the planner what it may trade: give it with --budget");
    }
    let placement = crate::device::scene_placement(&args.device.name)?;
    let start = match &args.resume {
        Some(dir) => Start::Resume(dir.clone()),
        None => Start::New(resolve(&args.settings)?, crate::run_path(&args.out, "scene")),
    };
    let (run, job) = launch(start, placement)?;
    let dir = run.dir().root().to_path_buf();
    let Some(summary) = run.drive(job, crate::runs::progress())? else {
        bail!("the run stopped before its end")
    };
    print(&summary, &dir);
    Ok(())
}

/// Prints a finished scene fit.
pub fn print(summary: &vramfit::run::RunSummary<vramfit_scene::job::SceneSummary>, dir: &std::path::Path) {
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
    let [moments, moved] = s.host_bytes;
    if moments > 0 {
        println!(
            "  Adam's moments in host memory: {} (not on the device); {} copied between host and device a step",
            vramfit::profile::human_bytes(moments),
            vramfit::profile::human_bytes(moved)
        );
    }
    crate::runs::print_common(summary, dir);
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
pub fn resolve(args: &SceneSettings) -> Result<SceneConfig> {
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
    c.moments = args.moments.unwrap_or(c.moments);
    let c = vramfit::settings::apply_sets(&c.to_toml(), &args.set)?.unwrap_or(c);
    if c.dataset == BUILTIN && args.dataset.is_some() {
        bail!("'{BUILTIN}' names the built-in scene: give no dataset for it, or a folder's path");
    }
    Ok(c)
}
