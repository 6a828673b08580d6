//! `vramfit bench …`: benchmarks that print a Markdown table and write
//! JSON (device, command, figures) plus the same table beside it.

use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use serde_json::json;
use vramfit_models::gpt::GptConfig;
use vramfit_splat::baseline::bicubic_at_equal_storage;
use vramfit_splat::config::FitConfig;
use vramfit_splat::job::load_image;

use crate::plan::Action;

#[derive(Subcommand)]
pub enum Which {
    /// Fit an image at the default schedule: time per step, quality, and
    /// the bicubic baseline at equal storage.
    Splat {
        /// Image (default: the built-in sample).
        #[arg(long)]
        image: Option<String>,
        /// Final number of Gaussians.
        #[arg(long)]
        gaussians: Option<usize>,
        /// Most optimiser steps.
        #[arg(long)]
        steps: Option<u64>,
        /// Override one setting, KEY=VALUE with a key of config.toml (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        #[command(flatten)]
        device: crate::device::DeviceArg,
        /// JSON output (a .md table is written beside it).
        #[arg(long, default_value = "bench-results/splat.json")]
        out: PathBuf,
    },
    /// The planner on the transformer: predicted vs measured peaks at budgets
    /// from infeasible to ample, the chosen plan against an exhaustive sweep.
    Plan(crate::plan_bench::Args<crate::flags::TrainSettings>),
    /// The band-height planner against a sweep of every band height on the splat fit.
    PlanSplat(crate::plan_bench::Args<crate::flags::FitSettings>),
    /// The scene planner (wgpu, CUDA) against a sweep of Gaussian counts:
    /// at budgets from infeasible to ample, the chosen count measured, and
    /// the largest count of its variant that measured within the budget.
    PlanScene(crate::plan_bench::Args<crate::scene::SceneSettings>),
    /// What a 3D scene takes in device memory (wgpu, CUDA): bytes per
    /// Gaussian by category at each count and SH degree, one render's and
    /// one backward's buffers, measured against the layout's prediction.
    SceneMemory(crate::bench_scene::Args),
}

pub fn run(which: Which) -> Result<()> {
    match which {
        Which::Splat {
            image,
            gaussians,
            steps,
            set,
            device,
            out,
        } => splat(image, gaussians, steps, &set, &device.name, out),
        Which::Plan(args) => {
            let config = crate::flags::resolve_train::<GptConfig>(args.settings())?;
            let (request, device) = args.request(serde_json::to_value(&config)?, "transformer");
            crate::plan::model::<GptConfig, 3>(config, device, Action::Bench(request))
        }
        Which::SceneMemory(args) => crate::bench_scene::run(args),
        Which::PlanScene(args) => {
            let config = crate::scene::resolve(args.settings())?;
            let (request, device) = args.request(serde_json::to_value(&config)?, "scene");
            crate::plan::scene(args.settings(), device, Action::Bench(request))
        }
        Which::PlanSplat(args) => {
            let config = crate::flags::resolve_fit(args.settings())?;
            let (request, device) = args.request(serde_json::to_value(&config)?, "splat");
            crate::plan::splat(config, device, Action::Bench(request))
        }
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn splat(
    image: Option<String>,
    gaussians: Option<usize>,
    steps: Option<u64>,
    set: &[String],
    device: &str,
    out: PathBuf,
) -> Result<()> {
    if let Some(dir) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("--out: creating {}", dir.display()))?;
    }
    crate::budget::check_writable("--out", &out)?;
    let mut config = FitConfig::default();
    if let Some(i) = image {
        config.image = i;
    }
    config.gaussians = gaussians.unwrap_or(config.gaussians);
    config.steps = steps.unwrap_or(config.steps);
    let mut config = crate::flags::apply_sets(config, set)?;
    config.frame_every = 0;
    config.checkpoint_every = 0;
    let scratch = std::env::temp_dir().join(format!("vramfit-bench-{}", std::process::id()));
    eprintln!(
        "bench splat: fitting {} with {} Gaussians, at most {} steps…",
        config.image, config.gaussians, config.steps
    );
    let result = crate::runs::run_with(
        device,
        crate::runs::Launch::Fit(vramfit::run::Start::New(
            config.clone(),
            vramfit::run::RunPath::At(scratch.clone()),
        )),
        |_| ControlFlow::Continue(()),
    );
    let _ = std::fs::remove_dir_all(&scratch);
    let (_, Some(crate::runs::Done::Fit(run))) = result? else {
        bail!("the fit stopped before its end")
    };
    let s = &run.workload;

    let picture = load_image(&config.image)?;
    let values_per_gaussian = 5 + vramfit_splat::picture::CHANNELS;
    let bicubic = bicubic_at_equal_storage(&picture, s.gaussians * values_per_gaussian);
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let table = format!(
        "| image | size | Gaussians | steps | ms/step (median) | wall s | PSNR dB | SSIM | bpp | bicubic at equal storage | bicubic PSNR dB | peak MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n\
         | {} | {}×{} | {} | {} | {:.1} | {:.1} | {:.2} | {:.4} | {:.2} | {}×{} | {:.2} | {:.1} |\n\n\
         Peak memory: {}{}{}.\n",
        s.image,
        s.width,
        s.height,
        s.gaussians,
        run.steps,
        run.median_step_ms,
        run.wall_seconds,
        s.psnr_db,
        s.ssim,
        s.bits_per_pixel,
        bicubic.width,
        bicubic.height,
        bicubic.psnr_db,
        mib(run.peak_memory_bytes.unwrap_or(0)),
        run.peak_memory_source,
        run.reserved_peak_bytes
            .map(|b| format!("; allocator reserved {:.1} MiB", mib(b)))
            .unwrap_or_default(),
        run.driver_peak_bytes
            .map(|b| format!(
                "; driver (NVML, this process) {:.1} MiB, of which {} MiB CUDA context",
                mib(b),
                run.driver_context_bytes
                    .map(|c| format!("{:.1}", mib(c)))
                    .unwrap_or_else(|| "?".into())
            ))
            .unwrap_or_default(),
    );
    let verdict = if s.psnr_db > bicubic.psnr_db {
        "beats"
    } else {
        "does NOT beat"
    };
    println!(
        "{table}\nThe fit {verdict} bicubic at equal storage by {:+.2} dB.",
        s.psnr_db - bicubic.psnr_db
    );
    let record = json!({
        "bench": "splat",
        "command": command,
        "device": run.device,
        "cpu": cpu_model(),
        "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "summary": run,
        "bicubic": bicubic,
        "beats_bicubic": s.psnr_db > bicubic.psnr_db,
    });
    if let Some(dir) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    vramfit::run::atomic_write(&out, serde_json::to_string_pretty(&record)?.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    let md = out.with_extension("md");
    vramfit::run::atomic_write(&md, format!("Command: `{command}`\n\n{table}").as_bytes())
        .with_context(|| format!("writing {}", md.display()))?;
    println!("wrote {} and {}", out.display(), md.display());
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}
