//! `vramfit bench scene-memory`: what a 3D scene takes in device memory,
//! measured on the CubeCL allocator (wgpu, CUDA), per Gaussian count and SH
//! degree: parameters by group, Adam's moments, one render's buffers and
//! the backward's, beside what the layout predicts. `vramfit bench
//! scene-cleanup`: what each allocator cleanup cadence costs in step time
//! and returns of the deciding figure, over whole scene fits.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The benchmark's arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Gaussian counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [100_000usize, 1_000_000])]
    gaussians: Vec<usize>,
    /// SH degrees, comma-separated (0 to 3).
    #[arg(long, value_delimiter = ',', default_values_t = [0usize, 1, 2, 3])]
    sh_degrees: Vec<usize>,
    /// The rendered view's size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1280x720", value_parser = crate::flags::parse_size)]
    size: (u32, u32),
    /// Also measure whole training steps (render, loss, backward, Adam) of
    /// each case with Adam's moments here (device, host; comma-separated):
    /// the allocator's reserved peak, the bytes moved, the step time.
    #[arg(long, value_delimiter = ',')]
    moments: Vec<vramfit::optim::Moments>,
    /// With --moments: the SH storages to measure each case in (f32, f16,
    /// bf16; comma-separated). 16-bit storage is measured with the moments
    /// on the host only (where its f32 masters live).
    #[arg(long, value_delimiter = ',', requires = "moments", default_values_t = [vramfit_scene::sh_storage::ShStorage::F32])]
    sh_storage: Vec<vramfit_scene::sh_storage::ShStorage>,
    /// With --moments: how the fit's long-lived state (parameters, moments,
    /// statistics) is allocated, each measured: exact (its own exact-size
    /// allocations, the fit's default) or pooled (slices of the allocator's
    /// pages, as every other buffer); comma-separated.
    #[arg(long, value_delimiter = ',', requires = "moments", default_values_t = [vramfit_scene::allocation::StateAllocation::Exact])]
    state_allocation: Vec<vramfit_scene::allocation::StateAllocation>,
    /// Only the training steps (with --moments), not the stage table.
    #[arg(long, requires = "moments")]
    steps_only: bool,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// JSON output (a .md table is written beside it).
    #[arg(long, default_value = "bench-results/scene-memory.json")]
    out: PathBuf,
}

/// `bench scene-cleanup`'s arguments.
#[derive(clap::Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    settings: crate::flags::SceneSettings,
    /// The cadences to compare (never, step, every:N), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = ["never".to_string(), "every:100".into(), "every:50".into(), "every:10".into()])]
    cadences: Vec<String>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// JSON output (a .md table is written beside it).
    #[arg(long, default_value = "bench-results/scene-cleanup.json")]
    out: PathBuf,
}

/// Fits the scene once per cadence (same settings, a fresh run each) and
/// compares the runs' deciding figure (the allocator's reserved high-water
/// mark), median step time and time spent cleaning.
pub fn cleanup(args: CleanupArgs) -> Result<()> {
    use serde_json::json;
    if args.device.name == "cpu" {
        bail!("bench scene-cleanup measures a device's allocator; give --device wgpu or cuda");
    }
    for c in &args.cadences {
        vramfit::allocator::CleanupPolicy::parse(c).map_err(|e| anyhow::anyhow!("--cadences: {e}"))?;
    }
    crate::budget::check_bench_out(&args.out)?;
    let base = crate::flags::resolve_scene(&args.settings)?;
    // The runs go to a private temporary folder, removed at the end.
    let tmp = std::env::temp_dir().join(format!("vramfit-scene-cleanup-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut rows = Vec::new();
    let mut table = String::from(
        "| cleanup | reserved peak MiB | in use peak MiB | median step ms | cleanups | seconds cleaning | held-out PSNR dB |\n|---|---|---|---|---|---|---|\n",
    );
    for (k, cadence) in args.cadences.iter().enumerate() {
        eprintln!("fitting with allocator_cleanup = {cadence}…");
        let config = vramfit_scene::config::SceneConfig {
            allocator_cleanup: cadence.clone(),
            ..base.clone()
        };
        let dir = tmp.join(format!("run-{k}"));
        let placement = crate::device::scene_placement(&args.device.name)?;
        let (run, job) = vramfit_scene::job::launch(
            vramfit::run::Start::New(config, vramfit::run::RunPath::At(dir.clone())),
            placement,
        )?;
        let Some(summary) = run.drive(job, |_| std::ops::ControlFlow::Continue(()))? else {
            bail!("the run with allocator_cleanup = {cadence} stopped before its end")
        };
        let w = &summary.workload;
        let mib = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / (1u64 << 20) as f64);
        table.push_str(&format!(
            "| {cadence} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {:.2} |\n",
            mib(summary.reserved_peak_bytes),
            mib(summary.in_use_peak_bytes),
            summary.median_step_ms,
            w.allocator_cleanups,
            w.cleanup_seconds,
            w.held_out_psnr_db,
        ));
        rows.push(json!({
            "allocator_cleanup": cadence,
            "reserved_peak_bytes": summary.reserved_peak_bytes,
            "in_use_peak_bytes": summary.in_use_peak_bytes,
            "median_step_ms": summary.median_step_ms,
            "wall_seconds": summary.wall_seconds,
            "cleanups": w.allocator_cleanups,
            "cleanup_seconds": w.cleanup_seconds,
            "held_out_psnr_db": w.held_out_psnr_db,
            "gaussians": w.gaussians,
        }));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    println!("{table}");
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let record = json!({
        "bench": "scene-cleanup",
        "command": command,
        "device": args.device.name,
        "settings": base,
        "measured": "each run's allocator reserved high-water (the deciding figure) and in-use high-water, read by the profiler at every phase end and before each cleanup; median step time; the cleanups' own time",
        "rows": rows,
    });
    write_record(&args.out, &record, &command, &table)
}

/// Writes a benchmark's JSON record to `out` and its table, with the
/// command that made it, beside it as `.md`.
pub(crate) fn write_record(out: &Path, record: &serde_json::Value, command: &str, table: &str) -> Result<()> {
    crate::plan_bench::write_results(out, record, &format!("Command: `{command}`\n\n{table}"))
}

pub fn run(args: Args) -> Result<()> {
    if let Some(d) = args.sh_degrees.iter().find(|d| **d > 3) {
        bail!("--sh-degrees: {d} is above 3, the highest SH degree");
    }
    if args.gaussians.contains(&0) {
        bail!("--gaussians: a count must be positive");
    }
    if args.device.name == "cpu" {
        bail!("bench scene-memory measures a device's allocator; give --device wgpu or cuda");
    }
    crate::budget::check_bench_out(&args.out)?;
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    return device::measure_and_write(args);
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    Err(crate::device::unavailable(&args.device.name))
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod device {
    use anyhow::{Result, bail};
    use serde_json::json;
    use vramfit::optim::Moments;
    use vramfit_gauss::gpu::DeviceError;
    use vramfit_scene::gpu::device_fit::StateAllocation;
    use vramfit_scene::gpu::memory::{MemoryCase, MemoryRow, StepMemory};
    use vramfit_scene::sh_storage::ShStorage;

    use super::Args;

    pub(super) fn measure_and_write(args: Args) -> Result<()> {
        let (w, h) = (args.size.0 as usize, args.size.1 as usize);
        let cases = vramfit_scene::gpu::memory::cases(&args.gaussians, &args.sh_degrees, w, h);
        let rows = if args.steps_only {
            Vec::new()
        } else {
            measure(&args.device.name, &cases)?
        };
        let places: Vec<(Moments, ShStorage)> = args
            .moments
            .iter()
            .flat_map(|&m| args.sh_storage.iter().map(move |&sh| (m, sh)))
            .filter(|&(m, sh)| sh == ShStorage::F32 || m == Moments::Host)
            .collect();
        let places: Vec<Place> = places
            .into_iter()
            .flat_map(|(m, sh)| args.state_allocation.iter().map(move |&a| (m, sh, a)))
            .collect();
        if !args.moments.is_empty() && places.is_empty() {
            bail!("--sh-storage f16/bf16 is measured with the moments on the host: add host to --moments");
        }
        let steps = measure_steps(&args.device.name, &cases, &places)?;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let per = |b: u64, n: usize| b as f64 / n as f64;
        let mut table = String::from(
            "| Gaussians | SH degree | parameters MiB (B/Gaussian) | sh_rest B/Gaussian | Adam + statistics MiB (B/Gaussian) | gradients + image gradient MiB | render MiB (intersections) | predicted − measured, all stages | in use MiB | reserved MiB |\n|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let mut skipped = Vec::new();
        for (case, row) in &rows {
            let r = match row {
                Ok(r) => r,
                Err(why) => {
                    table.push_str(&format!(
                        "| {} | {} | does not fit: {why} | | | | | | | |\n",
                        case.gaussians, case.degree
                    ));
                    skipped.push(json!({ "case": case, "why": why.to_string() }));
                    continue;
                }
            };
            let n = r.case.gaussians;
            let stages = [r.parameters, r.optimizer, r.render, r.backward];
            let off: i64 = stages.iter().map(|s| s.predicted as i64 - s.measured as i64).sum();
            let rest = r.groups.iter().find(|(g, _)| g == "sh_rest").map_or(0, |g| g.1);
            table.push_str(&format!(
                "| {n} | {} | {:.1} ({:.0}) | {:.0} | {:.1} ({:.0}) | {:.1} | {:.1} ({}) | {off} B | {:.1} | {:.1} |\n",
                r.case.degree,
                mib(r.parameters.measured),
                per(r.parameters.measured, n),
                per(rest, n),
                mib(r.optimizer.measured),
                per(r.optimizer.measured, n),
                mib(r.backward.measured),
                mib(r.render.measured),
                r.intersections,
                mib(r.in_use),
                mib(r.reserved),
            ));
        }
        let mut step_table = String::new();
        if !steps.is_empty() {
            step_table.push_str(
                "\nWhole training steps (3; a random scene, the loss on the device):\n\n| Gaussians | SH degree | moments | SH stored | state allocated | \
                 parameters B/Gaussian | optimizer state (device) B/Gaussian | workspace high-water MiB | reserved peak \
                 MiB | reserved B/Gaussian | moved per step MiB | step ms (median) | of it: copies ms, host Adam ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            );
            for (case, (moments, sh, state), r) in &steps {
                match r {
                    Ok(m) => {
                        let n = case.gaussians;
                        step_table.push_str(&format!(
                            "| {n} | {} | {moments} | {sh} | {state} | {:.0} | {:.0} | {:.1} | {:.1} | {:.0} | {:.1} | {:.0} | {} |\n",
                            case.degree,
                            per(m.held[0], n),
                            per(m.held[2], n),
                            mib(m.held[3]),
                            mib(m.reserved),
                            per(m.reserved, n),
                            mib(m.moved),
                            m.step_ms,
                            m.host_ms.map_or("—".into(), |[c, a]| format!("{c:.0}, {a:.0}")),
                        ))
                    }
                    Err(why) => step_table.push_str(&format!(
                        "| {} | {} | {moments} | {sh} | {state} | does not fit: {why} | | | | | | | |\n",
                        case.gaussians, case.degree
                    )),
                }
            }
        }
        let table = if args.steps_only {
            step_table
        } else {
            format!("{table}{step_table}")
        };
        println!("{table}");
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let record = json!({
            "bench": "scene-memory",
            "command": command,
            "device": args.device.name,
            "measured": "allocator bytes in use added by each stage; reserved after the step",
            "rows": rows.iter().filter_map(|(_, r)| r.as_ref().ok()).collect::<Vec<_>>(),
            "steps": steps.iter().map(|(c, m, r)| match r {
                Ok(s) => json!(s),
                Err(why) => json!({ "case": c, "moments": m.0, "sh": m.1, "state": m.2, "why": why.to_string() }),
            }).collect::<Vec<_>>(),
            "did_not_fit": skipped,
        });
        super::write_record(&args.out, &record, &command, &table)
    }

    type Row = (MemoryCase, Result<MemoryRow, DeviceError>);
    type Place = (Moments, ShStorage, StateAllocation);
    type StepRow = (MemoryCase, Place, Result<StepMemory, DeviceError>);

    /// A buffer larger than the device's largest: the case is kept with the
    /// reason; any other failure ends the benchmark.
    fn too_large(e: &DeviceError) -> bool {
        matches!(e, DeviceError::BufferTooLarge { .. })
    }

    /// Whole training steps of every case with the moments at each place;
    /// a case the device cannot hold is kept with the reason.
    fn measure_steps(device: &str, cases: &[MemoryCase], places: &[Place]) -> Result<Vec<StepRow>> {
        let mut out = Vec::new();
        for c in cases {
            for &(m, sh, state) in places {
                eprintln!(
                    "training steps: {} Gaussians, SH degree {}, moments {m}, SH in {sh}, state {state}…",
                    c.gaussians, c.degree
                );
                let r = match device {
                    #[cfg(feature = "wgpu")]
                    "wgpu" => vramfit_scene::gpu::memory::measure_step::<cubecl::wgpu::WgpuRuntime>(
                        &Default::default(),
                        c,
                        m,
                        sh,
                        state,
                        3,
                    ),
                    #[cfg(feature = "cuda")]
                    "cuda" => vramfit_scene::gpu::memory::measure_step::<cubecl::cuda::CudaRuntime>(
                        &Default::default(),
                        c,
                        m,
                        sh,
                        state,
                        3,
                    ),
                    other => return Err(crate::device::unavailable(other)),
                };
                match r {
                    Err(e) if !too_large(&e) => bail!("device failure: {e}"),
                    r => out.push((*c, (m, sh, state), r)),
                }
            }
        }
        Ok(out)
    }

    /// Measures every case; a case whose buffers the device cannot allocate is
    /// kept with the reason, any other device failure ends the benchmark.
    fn measure(device: &str, cases: &[MemoryCase]) -> Result<Vec<Row>> {
        let each = |f: &dyn Fn(&MemoryCase) -> Result<MemoryRow, DeviceError>| {
            cases
                .iter()
                .map(|c| {
                    eprintln!("measuring {} Gaussians, SH degree {}…", c.gaussians, c.degree);
                    match f(c) {
                        Err(e) if !too_large(&e) => Err(anyhow::anyhow!("device failure: {e}")),
                        r => Ok((*c, r)),
                    }
                })
                .collect::<Result<Vec<_>>>()
        };
        match device {
            #[cfg(feature = "wgpu")]
            "wgpu" => {
                each(&|c| vramfit_scene::gpu::memory::measure::<cubecl::wgpu::WgpuRuntime>(&Default::default(), c))
            }
            #[cfg(feature = "cuda")]
            "cuda" => {
                each(&|c| vramfit_scene::gpu::memory::measure::<cubecl::cuda::CudaRuntime>(&Default::default(), c))
            }
            other => {
                let _ = each;
                Err(crate::device::unavailable(other))
            }
        }
    }
}
