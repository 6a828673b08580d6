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
        #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<u64>)]
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
    /// The planner's depth slice on the llm: each plan predicted from a
    /// K-block slice against the whole model measured.
    Slice(crate::bench_slice::Args),
    /// The band-height planner against a sweep of every band height on the splat fit.
    PlanSplat(crate::plan_bench::Args<crate::flags::FitSettings>),
    /// The scene planner (wgpu, CUDA) against a sweep of Gaussian counts:
    /// at budgets from infeasible to ample, the chosen count measured, and
    /// the largest count of its variant that measured within the budget.
    PlanScene(crate::plan_bench::Args<crate::flags::SceneSettings>),
    /// Adam on the host (what --moments host runs): its throughput on this
    /// CPU, and the transfer a scene's step needs, projected onto a PCIe
    /// link.
    HostAdam {
        /// Values updated per step.
        #[arg(long, default_value_t = 50_000_000, value_parser = crate::flags::parse_count::<usize>)]
        values: usize,
        /// Link bandwidth each way for the projection, GB/s (PCIe 4.0 ×16:
        /// 31.5 nominal, about 25 measured with pinned memory).
        #[arg(long, default_value_t = 25.0)]
        link_gb_s: f64,
        /// JSON output (a .md table is written beside it).
        #[arg(long, default_value = "bench-results/host-adam.json")]
        out: PathBuf,
    },
    /// What a 3D scene takes in device memory (wgpu, CUDA): bytes per
    /// Gaussian by category at each count and SH degree, one render's and
    /// one backward's buffers, measured against the layout's prediction.
    SceneMemory(crate::bench_scene::Args),
    /// Allocator cleanup cadences on a scene fit (wgpu, CUDA): the deciding
    /// figure each leaves and the step time each costs, one run each.
    SceneCleanup(crate::bench_scene::CleanupArgs),
    /// A scene fit's reserved bytes on cards it did not run on (wgpu,
    /// CUDA probes): traced at small counts here, grown and replayed
    /// through each card's CubeCL pools, against recorded figures.
    SceneCards(crate::bench_cards::Args),
    /// A transformer's reserved bytes on a card it did not run on: each
    /// f32 step of a `bench plan` record made on the card, traced on this
    /// machine's CPU and replayed through the card's CubeCL pools.
    ModelCards(crate::bench_model_cards::Args),
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
            crate::plan::model::<GptConfig, 3>(
                config,
                device,
                crate::plan::Probes {
                    blocks: Some(0),
                    tokens: Some(0),
                },
                Action::Bench(request),
            )
        }
        Which::Slice(args) => crate::bench_slice::run(args),
        Which::SceneMemory(args) => crate::bench_scene::run(args),
        Which::SceneCleanup(args) => crate::bench_scene::cleanup(args),
        Which::SceneCards(args) => crate::bench_cards::run(args),
        Which::ModelCards(args) => crate::bench_model_cards::run(args),
        Which::HostAdam { values, link_gb_s, out } => host_adam(values, link_gb_s, out),
        Which::PlanScene(args) => {
            let config = crate::flags::resolve_scene(args.settings())?;
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

/// `bench host-adam`: the host's Adam over `values` f32 values (median of
/// five steps after one warm-up), in GB/s of memory touched (each value:
/// parameter, gradient and both moments read, parameter and moments
/// written: 28 bytes), and a scene's host-moments step projected at
/// `link_gb_s` each way (gradients down, parameters up: 8 bytes a value).
fn host_adam(values: usize, link_gb_s: f64, out: PathBuf) -> Result<()> {
    if values == 0 || link_gb_s.is_nan() || link_gb_s <= 0.0 {
        bail!("--values and --link-gb-s must be positive");
    }
    crate::budget::check_bench_out(&out)?;
    let adam = vramfit_scene::fit::ADAM;
    let mut p: Vec<f32> = (0..values).map(|i| (i as f32 * 1e-3).sin()).collect();
    let g: Vec<f32> = (0..values).map(|i| (i as f32 * 7e-4).cos() * 1e-3).collect();
    let (mut m, mut v) = (vec![0.0f32; values], vec![0.0f32; values]);
    let mut times = Vec::new();
    for t in 1..=6 {
        let started = std::time::Instant::now();
        let (c1, c2) = (1.0 - adam.beta1.powi(t), 1.0 - adam.beta2.powi(t));
        adam.step(&mut p, &g, &mut m, &mut v, 1e-3, c1, c2);
        times.push(started.elapsed().as_secs_f64());
    }
    times.remove(0);
    times.sort_by(f64::total_cmp);
    let seconds = times[times.len() / 2];
    let gb_s = 28.0 * values as f64 / seconds / 1e9;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut table = format!(
        "Host Adam on {} ({threads} threads): {values} values in {:.1} ms (median of 5): **{gb_s:.1} GB/s** of memory \
         touched (28 bytes a value), {:.0} M values/s. Measured.\n\nProjected (not measured: no GPU here) for a scene's \
         step with the moments on the host, degree 3 (59 floats a Gaussian), at {link_gb_s} GB/s each way:\n\n\
         | Gaussians | gradients down + parameters up | transfer ms (one way, each) | host Adam ms (at the measured rate) |\n|---|---|---|---|\n",
        cpu_model(),
        seconds * 1e3,
        values as f64 / seconds / 1e6
    );
    let mut rows = Vec::new();
    for gaussians in [1_000_000u64, 6_000_000, 20_000_000] {
        let n = gaussians * 59;
        let one_way = 4.0 * n as f64;
        let transfer_ms = one_way / (link_gb_s * 1e9) * 1e3;
        let adam_ms = 28.0 * n as f64 / (gb_s * 1e9) * 1e3;
        table.push_str(&format!(
            "| {gaussians} | {:.2} GB + {:.2} GB | {transfer_ms:.0} | {adam_ms:.0} |\n",
            one_way / 1e9,
            one_way / 1e9
        ));
        rows.push(json!({ "gaussians": gaussians, "bytes_each_way": one_way, "transfer_ms_each_way": transfer_ms, "host_adam_ms": adam_ms }));
    }
    println!("{table}");
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let record = json!({
        "bench": "host-adam", "command": command, "cpu": cpu_model(), "threads": threads,
        "values": values, "seconds_median": seconds, "gb_per_s": gb_s,
        "projection": { "link_gb_s_each_way": link_gb_s, "measured": false, "rows": rows },
    });
    crate::plan_bench::write_results(&out, &record, &format!("Command: `{command}`\n\n{table}"))
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
    crate::budget::check_bench_out(&out)?;
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
        Default::default(),
        |_| ControlFlow::Continue(()),
    );
    let _ = std::fs::remove_dir_all(&scratch);
    let (_, Some(crate::runs::Done::Fit(run))) = result? else {
        bail!("the fit stopped before its end")
    };
    let s = &run.workload;

    let picture = load_image(&config.image)?;
    let values_per_gaussian = 5 + vramfit_gauss::picture::CHANNELS;
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
    crate::bench_scene::write_record(&out, &record, &command, &table)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}
