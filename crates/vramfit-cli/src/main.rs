//! `vramfit`: the command-line tool. Thin by design: it parses flags,
//! resolves settings, calls the libraries and prints.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use vramfit_gauss::picture::{check_output_target, save_png, to_rgb8};
use vramfit_splat::gaussians::Gaussians;
use vramfit_splat::output_size::check_size_here;

// Every command's printing goes through `stdout::write`: a closed or full
// stdout (`vramfit … | head -1`, `> /dev/full`) must not stop the command
// before it has written its files (std's macros panic there). Defined
// before the modules, so that theirs are these.
macro_rules! println {
    () => {
        $crate::stdout::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*))
    };
}
// Standard error likewise: a closed or full one (`2>/dev/full`) leaves the
// messages unwritten (there is nowhere to say so), never the work.
macro_rules! eprintln {
    () => {
        $crate::stdout::note(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::note(format_args!("{}\n", format_args!($($arg)*)))
    };
}
#[allow(unused_macros)]
macro_rules! eprint {
    ($($arg:tt)*) => {
        $crate::stdout::note(format_args!($($arg)*))
    };
}

mod stdout {
    //! Standard output that never stops the command: the first failed
    //! write is kept (later ones are skipped) and reported when the
    //! command has finished; standard error, written where it can be.
    use std::io::Write;
    use std::sync::OnceLock;

    static FAILED: OnceLock<std::io::Error> = OnceLock::new();

    /// Writes `text` unless an earlier write failed.
    pub fn write(text: std::fmt::Arguments) {
        if FAILED.get().is_some() {
            return;
        }
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_fmt(text).and_then(|()| out.flush()) {
            let _ = FAILED.set(e);
        }
    }

    /// The first failed write, if any.
    pub fn failure() -> Option<&'static std::io::Error> {
        FAILED.get()
    }

    /// Writes `text` to standard error, if it can.
    pub fn note(text: std::fmt::Arguments) {
        let _ = std::io::stderr().lock().write_fmt(text);
    }
}

mod bench;
mod bench_cards;
mod bench_model_cards;
mod bench_scene;
mod bench_slice;
mod budget;
mod check_kernels;
mod device;
mod export;
mod fit;
mod flags;
mod plan;
mod plan_bench;
mod private_network;
mod ranks;
mod remedies;
mod runs;
mod sample;
mod scene;
mod show_plan;
mod traced_cards;
mod train;

// The fit allocates and frees image-sized buffers every step; glibc's
// malloc returns them to the kernel each time, and the page faults and TLB
// shootdowns that follow cost half of a CPU step (measured: 285 → 144 ms
// per step on the built-in sample). mimalloc keeps them mapped. The
// counting wrapper gives the profiler the exact heap bytes in use and
// their high-water mark: on the CPU that is the figure that decides an
// out-of-memory.
#[global_allocator]
static ALLOC: vramfit::heap::Counting<mimalloc::MiMalloc> = vramfit::heap::Counting(mimalloc::MiMalloc);

/// A training step frees and allocates the same large buffers every step.
/// mimalloc by default decommits freed pages after a second, so the next
/// steps fault them in again, zeroed by the kernel: on the transformer at
/// PyTorch's shape 60,000 page faults in 12 steps, 1.5 GiB purged. Never
/// purging keeps them (540 faults; about 3 % of the step); the peak
/// resident set rises by what fragmentation keeps (409 → 434 MiB there).
/// `MIMALLOC_PURGE_DELAY` set by the user still wins.
fn keep_freed_pages() {
    // `mi_option_purge_delay` in mimalloc.h (v2 and v3), which the Rust
    // bindings do not name: the entry before `use_numa_nodes` (16).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = libmimalloc_sys::mi_option_use_numa_nodes - 1;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's runtime options; -1 is its "never".
        unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
    }
}

#[derive(Parser)]
#[command(
    name = "vramfit",
    version,
    about = "Fit training jobs in the memory you have; Gaussian image fitting included."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fit an image with 2D Gaussians (no IMAGE: the built-in sample).
    Fit(fit::FitArgs),
    /// Render a Gaussians file at any resolution.
    Render {
        /// A `gaussians.vfg` file from a fit's run directory.
        gaussians: PathBuf,
        /// Output size, WIDTHxHEIGHT (default: the fitted size).
        #[arg(long, allow_hyphen_values = true, value_parser = flags::parse_size)]
        size: Option<(u32, u32)>,
        /// Gaussians blended per pixel.
        #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = flags::parse_count::<usize>)]
        top_k: usize,
        /// Output PNG.
        out: PathBuf,
    },
    /// Render one view of a fitted 3D scene from its run directory's newest checkpoint.
    RenderScene {
        /// A `vramfit scene` run directory.
        run_dir: PathBuf,
        /// The view to render (0-based, in the dataset's order).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = flags::parse_count::<usize>)]
        view: usize,
        /// Output PNG.
        out: PathBuf,
    },
    /// Write a finished llm run as a Hugging Face checkpoint (LoRA adapters merged).
    Export(export::ExportArgs),
    /// Print a run's memory breakdown and write RUN_DIR/memory.html.
    Report {
        /// A run directory (with memory.json).
        run_dir: PathBuf,
    },
    /// Write the procedural test image, or (`sample scene DIR`) the built-in 3D scene as a COLMAP dataset.
    Sample(sample::SampleArgs),
    /// Fit a 3D Gaussian scene (SH colour) to a COLMAP dataset's views (none: the built-in scene).
    Scene(scene::SceneArgs),
    /// Train a workload with the memory techniques (see `vramfit train transformer --help`).
    Train {
        #[command(subcommand)]
        which: train::Which,
    },
    /// Plan a workload into a memory budget: probes, ranked plans, presets per card size.
    Plan {
        #[command(subcommand)]
        which: plan::Which,
    },
    /// Check the GPU kernels against their CPU twins on random cases.
    CheckKernels {
        /// Device: cuda or wgpu (a build with that feature).
        #[arg(long, default_value = "cuda")]
        device: String,
        /// Also run image-sized cases (up to 2048×2048 with 10,000 Gaussians).
        #[arg(long)]
        large: bool,
        /// Write the reports as JSON here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Benchmarks that print figures and write JSON.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
}

fn main() {
    keep_freed_pages();
    remedies::install();
    // A CUDA build on a machine without NVIDIA's driver: cudarc panics when
    // it cannot load libcuda. Said in a line below, not as a panic.
    // The panic comes on the device's thread; this one then fails to hear
    // from it (its own panic is not printed either).
    static NO_CUDA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| match no_cuda_driver(info.payload()) {
        Some(why) => {
            let _ = NO_CUDA.set(why);
        }
        None if NO_CUDA.get().is_some() => {}
        None => default_hook(info),
    }));
    // clap's own exit ignores a failed print: `--help > /dev/full` would
    // exit 0 having printed nothing.
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        if let Err(io) = e.print()
            && io.kind() != std::io::ErrorKind::BrokenPipe
        {
            eprintln!("error: cannot write to standard output ({io})");
            std::process::exit(1);
        }
        std::process::exit(e.exit_code())
    });
    // A rank of `train --ranks N` joins its MPI job (finalised when this drops).
    #[cfg(feature = "mpi")]
    let _mpi = ranks::join_if_launched();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli))) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
        Err(payload) => match no_cuda_driver(payload.as_ref()).or_else(|| NO_CUDA.get().cloned()) {
            Some(why) => {
                eprintln!(
                    "error: CUDA is not available here: {why}. Install NVIDIA's driver, or run on another device \
                     (--device cpu, or --device wgpu in a build with that feature)"
                );
                std::process::exit(1);
            }
            // A rank must not finalise MPI while the others wait for it in
            // a collective (finalising waits for them: the job would hang);
            // exiting at once makes mpirun stop the job. The panic was printed.
            None if vramfit::ranks::world().is_some() => std::process::exit(101),
            None => std::panic::resume_unwind(payload),
        },
    }
    // The command finished with its files written; what it printed did
    // not all arrive.
    match stdout::failure() {
        // The reader went away (`| head`): what it wanted, it has.
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Some(e) => {
            eprintln!("error: cannot write to standard output ({e}); the command's files are written");
            std::process::exit(1);
        }
        None => {}
    }
}

/// The reason in a panic raised because the CUDA driver library could not
/// be loaded.
fn no_cuda_driver(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())?;
    let lower = text.to_lowercase();
    (lower.contains("dynamically load") && lower.contains("cuda"))
        .then(|| "the driver library (libcuda) could not be loaded".to_string())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Fit(args) => fit::run(args),
        Command::Render {
            gaussians,
            size,
            top_k,
            out,
        } => render(&gaussians, size, top_k, &out),
        Command::RenderScene { run_dir, view, out } => scene::render(&run_dir, view, &out),
        Command::Sample(args) => sample::run(args),
        Command::Scene(args) => scene::run(args),
        Command::Bench { which } => bench::run(which),
        Command::CheckKernels { device, large, out } => check_kernels::run(&device, large, out),
        Command::Train { which } => train::run(which),
        Command::Plan { which } => plan::run(which),
        Command::Report { run_dir } => report(&run_dir),
        Command::Export(args) => export::run(args),
    }
}

fn report(dir: &Path) -> Result<()> {
    let path = dir.join("memory.json");
    if !dir.exists() {
        bail!(
            "{} does not exist: give the run directory a run wrote (its --out, or runs/NAME-NNN)",
            dir.display()
        );
    }
    // Nothing is read or written through a link planted in the run.
    if dir.is_dir() {
        vramfit::files::outputs::no_planted_link(dir)?;
    }
    if !path.exists() && !dir.join("config.toml").is_file() {
        bail!(
            "{} is not a vramfit run directory (it has neither memory.json nor config.toml); give the folder a run \
             wrote (its --out, or runs/NAME-NNN)",
            dir.display()
        );
    }
    if !path.exists() && dir.join("config.toml").is_file() {
        bail!(
            "{} has no memory report yet: a run writes memory.json when it ends, stops or fails; wait for it to \
             end, or resume it (`--resume {}`)",
            dir.display(),
            dir.display()
        );
    }
    let report = vramfit::profile::MemoryReport::read(&path)?;
    print!("{}", report.table());
    let html = dir.join("memory.html");
    let title = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    vramfit::files::outputs::no_link_below(dir, &html)
        .and_then(|()| vramfit::run::atomic_write(&html, report.to_html(&title).as_bytes()))
        .with_context(|| format!("writing {}", html.display()))?;
    println!("wrote {}", html.display());
    report_ranks(dir);
    Ok(())
}

/// A run on data-parallel ranks: every rank's deciding peak (from its own
/// memory report) and the largest, below rank 0's table.
fn report_ranks(dir: &Path) {
    let ranks = vramfit::run::rank_dirs(dir);
    if ranks.len() < 2 {
        return;
    }
    let peak = |d: &Path| -> Option<u64> {
        let v: serde_json::Value = serde_json::from_slice(
            &vramfit::files::read::read(&d.join("memory.json"), vramfit::files::read::Links::Refuse).ok()?,
        )
        .ok()?;
        v["headline"]["bytes"].as_u64()
    };
    let peaks: Vec<(usize, Option<u64>)> = ranks.iter().map(|(r, d)| (*r, peak(d))).collect();
    let each: Vec<String> = peaks
        .iter()
        .map(|(r, p)| {
            format!(
                "rank {r} {}",
                p.map_or("(no report)".into(), vramfit::profile::human_bytes)
            )
        })
        .collect();
    let largest = peaks.iter().filter_map(|(r, p)| p.map(|b| (b, *r))).max();
    println!(
        "ranks: {} (each rank's deciding peak: {}{}); each rank's breakdown: vramfit report {}/ranks/rank-R",
        peaks.len(),
        each.join(", "),
        largest.map_or(String::new(), |(b, r)| format!(
            "; the largest {} on rank {r}",
            vramfit::profile::human_bytes(b)
        )),
        dir.display()
    );
}

fn render(path: &Path, size: Option<(u32, u32)>, top_k: usize, out: &Path) -> Result<()> {
    check_output_target(out)?;
    crate::flags::check_output(out, &[("the Gaussians file".into(), path.to_path_buf())])?;
    let g = Gaussians::load(path)?;
    if !(1..=vramfit_splat::cpu::top_k::MAX_TOP_K).contains(&top_k) {
        bail!(
            "--top-k {top_k} is outside 1..={}",
            vramfit_splat::cpu::top_k::MAX_TOP_K
        );
    }
    let (w, h) = size.unwrap_or((g.width as u32, g.height as u32));
    check_size_here("rendering", w, h, |w, h| g.render_bytes(w, h))?;
    let img = g.render(w as usize, h as usize, top_k);
    save_png(out, &to_rgb8(w as usize, h as usize, &img)).with_context(|| format!("rendering {}", path.display()))?;
    println!("wrote {} ({w}x{h}) from {} Gaussians", out.display(), g.len());
    Ok(())
}
