//! Runs a workload through the one run driver on the chosen device, with
//! one progress bar and one summary printer for every workload.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};
use vramfit::plan::Runnable;
use vramfit::profile::{DeviceMemory, MemoryReport, human_bytes};
use vramfit::run::{Event, FailAt, RunSummary, Start};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::{Family, ModelSettings};
use vramfit_models::gpt::{GptConfig, TrainConfig};
use vramfit_models::job::TrainSummary;
use vramfit_models::llama::{LlamaConfig, LlmConfig};
use vramfit_models::plan::FamilyTarget;
use vramfit_models::segmenter::{SegmenterConfig, SegmenterTrainConfig};
use vramfit_models::unet::{UnetConfig, UnetTrainConfig};
use vramfit_splat::config::{BUILTIN_SAMPLE, FitConfig};
use vramfit_splat::op::{FusedLoss, SplatBackend};

use crate::device::{OnBackend, OnSplatBackend, on_device, on_splat_device};

/// What to run: a workload, new with its settings or resumed.
pub enum Launch {
    /// `vramfit fit`.
    Fit(Start<FitConfig>),
    /// `vramfit train transformer`.
    Transformer(Start<TrainConfig>),
    /// `vramfit train llm`.
    Llm(Start<LlmConfig>),
    /// `vramfit train unet`.
    Unet(Start<UnetTrainConfig>),
    /// `vramfit train segmenter`.
    Segmenter(Start<SegmenterTrainConfig>),
}

impl Launch {
    fn resumed(&self) -> bool {
        matches!(
            self,
            Launch::Fit(Start::Resume(_))
                | Launch::Transformer(Start::Resume(_))
                | Launch::Llm(Start::Resume(_))
                | Launch::Unet(Start::Resume(_))
                | Launch::Segmenter(Start::Resume(_))
        )
    }
}

/// How the planner holds a rank's run when it runs a plan on ranks (the
/// hidden flags `train --held-to B [--fallback] [--simulate-oom-at S]`,
/// which its launcher gives every rank): held to a budget, resumed under a
/// fallback plan's settings, the fallback's test seam.
#[derive(Debug, Clone, Copy, Default)]
pub struct Held {
    /// Each step held to this many bytes of the deciding figure.
    pub budget: Option<u64>,
    /// A resume may change the settings (a fallback plan's).
    pub new_settings: bool,
    /// Fails with the backend's out-of-memory at this step.
    pub simulate_oom_at: Option<u64>,
}

/// How a run ended.
pub enum Done {
    /// A fit.
    Fit(RunSummary<vramfit_splat::job::Summary>),
    /// A training run of a model family (its name).
    Train(&'static str, RunSummary<TrainSummary>),
}

/// A fit, driven (it needs the splat kernels on its backend).
struct DriveFit<O> {
    start: Start<FitConfig>,
    observe: O,
}

impl<O: FnMut(Event) -> ControlFlow<()>> OnSplatBackend for DriveFit<O> {
    type Output = (PathBuf, Option<Done>);

    fn run<B>(self, device: &B::Device, name: String) -> Result<(PathBuf, Option<Done>)>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: FusedLoss + DeviceMemory,
    {
        let (run, w) = vramfit_splat::job::launch::<B>(self.start, device, &name)?;
        let dir = run.dir().root().to_path_buf();
        Ok((dir, run.drive(w, self.observe)?.map(Done::Fit)))
    }
}

/// A model family's training run, driven.
struct DriveTrain<F: ModelSettings, const D: usize, O> {
    start: Start<FamilyConfig<F>>,
    held: Held,
    observe: O,
}

impl<F: Family<D>, const D: usize, O: FnMut(Event) -> ControlFlow<()>> OnBackend for DriveTrain<F, D, O> {
    type Output = (PathBuf, Option<Done>);

    fn run<B>(self, device: &B::Device, name: String) -> Result<(PathBuf, Option<Done>)>
    where
        B: AutodiffBackend,
        B::InnerBackend: DeviceMemory,
    {
        // On ranks, rank 0 creates the run directory before the others
        // create theirs inside it (a barrier, reached by rank 0 whether or
        // not its start succeeded).
        let world = vramfit::ranks::world();
        let rank = world.as_ref().map_or(0, |w| w.rank());
        if rank > 0 {
            world.as_ref().expect("a rank above 0 has a world").barrier();
        }
        let started = crate::ranks::for_rank(self.start, rank)
            .and_then(|start| Ok(vramfit_models::job::start::<B, F, D>(start, device, &name)?));
        if rank == 0
            && let Some(w) = &world
        {
            w.barrier();
        }
        let (run, w) = started?;
        let dir = run.dir().root().to_path_buf();
        let Held {
            budget,
            new_settings,
            simulate_oom_at,
        } = self.held;
        let run = if new_settings { run.with_new_settings() } else { run };
        let run = match budget {
            Some(bytes) => run.with_budget(bytes),
            None => run,
        };
        let summary = match simulate_oom_at {
            Some(step) => {
                let fail = <FamilyTarget<B, F, D> as Runnable>::simulated_oom;
                run.drive(FailAt { inner: w, step, fail }, self.observe)?
            }
            None => run.drive(w, self.observe)?,
        };
        Ok((dir, summary.map(|s| Done::Train(F::NAME, s))))
    }
}

/// Runs `launch` on `device` with `observe` watching; returns the run
/// directory and how the run ended (`None`: the observer stopped it).
pub fn run_with(
    device: &str,
    launch: Launch,
    held: Held,
    observe: impl FnMut(Event) -> ControlFlow<()>,
) -> Result<(PathBuf, Option<Done>)> {
    match launch {
        Launch::Fit(start) => on_splat_device(device, DriveFit { start, observe }),
        Launch::Transformer(start) => on_device(device, DriveTrain::<GptConfig, 3, _> { start, held, observe }),
        Launch::Llm(start) => on_device(device, DriveTrain::<LlamaConfig, 3, _> { start, held, observe }),
        Launch::Unet(start) => on_device(device, DriveTrain::<UnetConfig, 4, _> { start, held, observe }),
        Launch::Segmenter(start) => on_device(device, DriveTrain::<SegmenterConfig, 3, _> { start, held, observe }),
    }
}

/// Runs `launch` on `device` with a progress bar, and prints the summary.
pub fn run(device: &str, launch: Launch, held: Held) -> Result<()> {
    let resumed = launch.resumed();
    let world = vramfit::ranks::world();
    let rank = world.as_ref().map_or(0, |w| w.rank());
    // Rank 0 shows the progress and the summary; the others work quietly.
    let (out, done) = if rank == 0 {
        run_with(device, launch, held, progress())?
    } else {
        run_with(device, launch, held, |_| ControlFlow::Continue(()))?
    };
    let Some(done) = done else {
        bail!("the run stopped before its end")
    };
    if let (Some(w), Done::Train(name, s)) = (&world, &done) {
        // Every rank's deciding peak, gathered (each rank fills its own slot).
        let mut peaks = vec![0.0; w.size()];
        peaks[rank] = s.peak_memory_bytes.unwrap_or(0) as f64;
        w.sum_f64(&mut peaks);
        if rank > 0 {
            return Ok(());
        }
        print_train(name, s);
        print_common(s, &out);
        let each: Vec<String> = peaks.iter().map(|b| human_bytes(*b as u64)).collect();
        let largest = peaks.iter().cloned().fold(0.0, f64::max);
        println!(
            "  ranks: {} (each rank's deciding peak: {}; the largest {}; rank r's run directory is {}/ranks/rank-r)",
            w.size(),
            each.join(", "),
            human_bytes(largest as u64),
            out.display()
        );
        return Ok(());
    }
    match &done {
        Done::Fit(s) => print_fit(s, resumed),
        Done::Train(name, s) => print_train(name, s),
    }
    match &done {
        Done::Fit(s) => print_common(s, &out),
        Done::Train(_, s) => print_common(s, &out),
    }
    Ok(())
}

/// A line above the bar; where the bar is hidden (output not a terminal:
/// a log, a pipe), on standard error, since a hidden bar prints nothing.
fn say(bar: &ProgressBar, line: &str) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// The progress bar every run shows.
pub fn progress() -> impl FnMut(Event) -> ControlFlow<()> {
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
            Event::Step(r) => {
                bar.set_position(r.step);
                if !r.status.is_empty() {
                    bar.set_message(r.status.clone());
                }
                for n in &r.notes {
                    say(&bar, n);
                }
            }
            Event::Note(n) => say(&bar, &format!("note: {n}")),
            Event::Checkpoint(_) => {}
        }
        ControlFlow::Continue(())
    }
}

pub(crate) fn print_fit(s: &RunSummary<vramfit_splat::job::Summary>, resumed: bool) {
    let f = &s.workload;
    let image = if f.image == BUILTIN_SAMPLE {
        "built-in sample (astronaut)".to_string()
    } else {
        f.image.clone()
    };
    println!(
        "fitted {image}, {}x{}, on {}{}",
        f.width,
        f.height,
        s.device,
        if resumed { " (resumed)" } else { "" }
    );
    println!(
        "  PSNR {:.2} dB · SSIM {:.4} · {:.2} bits per pixel",
        f.psnr_db, f.ssim, f.bits_per_pixel
    );
    println!(
        "  {} Gaussians · {} steps{} · {:.1} s · {:.1} ms per step (median)",
        f.gaussians,
        s.steps,
        if f.stopped_early {
            " (stopped early: quality stalled)"
        } else {
            ""
        },
        s.wall_seconds,
        s.median_step_ms
    );
}

pub(crate) fn print_train(name: &str, s: &RunSummary<TrainSummary>) {
    let t = &s.workload;
    let field = |key: &str| t.extra.get(key).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    println!("trained {name} on {}: {}", s.device, t.techniques);
    let (loss, throughput) = if name == "segmenter" {
        (
            format!(
                "final loss {:.4} (cross-entropy + 1 − Dice), mean of the last 10 steps · held-out Dice {:.3}",
                t.final_loss,
                field("val_dice")
            ),
            format!("{:.3} images/s", field("images_per_second")),
        )
    } else if name == "unet" {
        (
            format!(
                "final loss {:.5} MSE, mean of the last 10 steps (noise floor {:.5}, the noisy input's {:.5}) · eval {:.5} on held-out crops",
                t.final_loss,
                field("noise_floor"),
                field("identity_loss"),
                field("eval_loss")
            ),
            format!("{:.0} pixels/s", field("pixels_per_second")),
        )
    } else {
        let against = if t.extra.contains_key("val_loss") {
            format!(
                "held out: loss {:.4}, perplexity {:.2}, over {} windows",
                field("val_loss"),
                field("val_perplexity"),
                t.extra.get("evaluated_windows").and_then(|v| v.as_u64()).unwrap_or(0)
            )
        } else if t.extra.contains_key("entropy_floor") {
            format!("task floor {:.4}", field("entropy_floor"))
        } else {
            "no windows held out".into()
        };
        (
            format!("final loss {:.4} nats/token ({against})", t.final_loss),
            format!("{:.0} tokens/s", field("tokens_per_second")),
        )
    };
    println!(
        "  {loss} · {} steps ({} skipped, loss scale {})",
        s.steps, t.skipped_steps, t.loss_scale
    );
    if let Some(parameters) = t.extra.get("parameters").and_then(|v| v.as_u64()) {
        let bytes = |key: &str| t.extra.get(key).and_then(|v| v.as_u64()).map(human_bytes);
        match (bytes("trainable_bytes"), bytes("frozen_bytes")) {
            (Some(trainable), Some(frozen)) => {
                println!("  {parameters} parameters: {trainable} trainable, {frozen} frozen (no gradients, no moments)")
            }
            _ => println!("  {parameters} parameters"),
        }
    }
    println!(
        "  {:.1} s · {:.1} ms per step (median) · {throughput}",
        s.wall_seconds, s.median_step_ms
    );
    println!(
        "  parameters {} · optimizer state {}{}",
        human_bytes(t.parameter_bytes),
        human_bytes(t.optimizer_state_bytes),
        if t.optimizer_host_bytes > 0 {
            format!(
                " on the device, {} in host memory (--moments host)",
                human_bytes(t.optimizer_host_bytes)
            )
        } else {
            String::new()
        }
    );
    if t.cleanup_calls > 0 {
        println!(
            "  allocator cleanups: {} in {:.3} s",
            t.cleanup_calls, t.cleanup_seconds
        );
    }
}

/// The memory lines and table every run prints, then the run directory.
pub(crate) fn print_common<S>(s: &RunSummary<S>, dir: &Path) {
    for w in &s.warnings {
        println!("  warning: {w}");
    }
    let report = vramfit::files::read::read(&dir.join("memory.json"), vramfit::files::read::Links::Refuse)
        .ok()
        .and_then(|b| serde_json::from_slice::<MemoryReport>(&b).ok());
    match &report {
        Some(r) => {
            for line in r.table().lines() {
                println!("  {line}");
            }
        }
        None => println!(
            "  memory: peak {} ({})",
            s.peak_memory_bytes.map(human_bytes).unwrap_or_else(|| "-".into()),
            s.peak_memory_source
        ),
    }
    if let Some(h) = s.host_peak_bytes {
        println!(
            "  host peak resident set {} (beside; not the device figure)",
            human_bytes(h)
        );
    }
    if let Some(d) = s.driver_peak_bytes {
        println!(
            "  driver (NVML) saw at most {} for this process, CUDA context included",
            human_bytes(d)
        );
        if let (Some(c), Some(r)) = (s.driver_context_bytes, s.reserved_peak_bytes) {
            let beyond = d.saturating_sub(c);
            println!(
                "  driver minus the context ({}) = {}; the allocator's reserved peak is {:+.1} % of it",
                human_bytes(c),
                human_bytes(beyond),
                (r as f64 / beyond.max(1) as f64 - 1.0) * 100.0
            );
        }
    }
    println!("  run directory: {}", dir.display());
}

/// Prints a finished scene fit.
pub fn print_scene(summary: &vramfit::run::RunSummary<vramfit_scene::job::SceneSummary>, dir: &std::path::Path) {
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
        if let Some([copies, update]) = s.host_step_ms {
            println!(
                "  a median step spent {copies:.1} ms copying between host and device and {update:.1} ms in the \
                 host's Adam (of {:.1} ms)",
                summary.median_step_ms
            );
        }
    }
    if s.sh_storage != vramfit_scene::sh_storage::ShStorage::F32 {
        println!(
            "  SH coefficients stored in {} on the device (the f32 masters the updates land in: in host memory)",
            s.sh_storage
        );
    }
    if s.allocator_cleanups > 0 {
        println!(
            "  allocator cleanups: {} taking {:.2} s in all",
            s.allocator_cleanups, s.cleanup_seconds
        );
    }
    print_common(summary, dir);
}

/// `--out`, or the next free `runs/PREFIX-NNN` (claimed atomically when the run starts).
pub(crate) fn run_path(out: &Option<PathBuf>, prefix: &str) -> vramfit::run::RunPath {
    match out {
        Some(dir) => vramfit::run::RunPath::At(dir.clone()),
        None => vramfit::run::RunPath::Next {
            base: PathBuf::from("runs"),
            prefix: prefix.into(),
        },
    }
}
