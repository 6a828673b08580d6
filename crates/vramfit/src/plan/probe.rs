//! A probe is a short run of the real workload through the one run driver,
//! in a throw-away directory: the same step, profiler, checkpoint and final
//! files as a real run, so its peak is the peak a run would reach.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::profile::MemoryReport;
use crate::run::{Run, RunPath, Workload};

/// One probe's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Peak of the figure that decides an out-of-memory (bytes).
    pub peak_bytes: u64,
    /// Its peak inside the forward and backward phases.
    pub step_peak_bytes: u64,
    /// Its peak in every other phase (between steps, optimiser, final files).
    pub rest_peak_bytes: u64,
    /// Of those, the peak of the phases that write files (checkpoints, the
    /// final files) where they are encoded in the figure's own memory (on
    /// the CPU, whose heap is the device: a copy of the state); 0 where
    /// not measured or not so (a GPU's files are encoded in host memory).
    #[serde(default)]
    pub files_peak_bytes: u64,
    /// With `files_peak_bytes`, the peak of the other phases outside the
    /// forward and backward (the optimiser's, between steps).
    #[serde(default)]
    pub between_peak_bytes: u64,
    /// Median step time (ms).
    pub step_ms: f64,
    /// Wall seconds the probe took, set-up included.
    pub seconds: f64,
}

static PROBES: AtomicU64 = AtomicU64::new(0);

/// Steps of every probe, whatever the workload: the first compiles kernels
/// and warms the allocator's pools, the step time is the median of the
/// other three, and the peak is the high-water of all four.
pub const PROBE_STEPS: u64 = 4;

/// The probe ritual every planning target shares: pools emptied, the
/// workload `make` builds for [`PROBE_STEPS`] steps driven to its end
/// ([`measure_run`]), pools emptied again, so no probe inherits another's
/// pages and the run after the probes starts clean.
pub fn run_probe<B: Backend, W: Workload, E: std::fmt::Display>(
    device: &B::Device,
    make: impl FnOnce(u64) -> Result<W, E>,
) -> Result<Measured, String> {
    B::memory_cleanup(device);
    let measured = make(PROBE_STEPS).map_err(|e| e.to_string()).and_then(measure_run);
    B::memory_cleanup(device);
    measured
}

/// Drives `workload` (built for a few steps) to its end in a temporary run
/// directory and returns its OOM-deciding peak and median step time.
pub fn measure_run<W: Workload>(workload: W) -> Result<Measured, String> {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!(
        "vramfit-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let run = Run::create(&RunPath::At(dir.clone()), "", "probe", "a planner probe").map_err(|e| e.to_string())?;
        let summary = run
            .drive(workload, |_| ControlFlow::Continue(()))
            .map_err(|e| e.to_string())?
            .ok_or("the probe stopped before its end")?;
        let peak = summary.peak_memory_bytes.ok_or_else(|| {
            format!(
                "this backend measures no figure that decides an out-of-memory ({}); on the CPU, install \
                 vramfit::heap::Counting as the global allocator",
                summary.peak_memory_source
            )
        })?;
        Ok(Measured {
            step_ms: summary.median_step_ms,
            seconds: started.elapsed().as_secs_f64(),
            ..phase_peaks(&dir.join("memory.json"), peak)?
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A finished run's figures as a probe's, read from its directory
/// (`summary.json`, `memory.json`): how a run in another process (a rank
/// of a data-parallel probe) is measured.
pub fn measured_in(dir: &std::path::Path) -> Result<Measured, String> {
    let path = dir.join("summary.json");
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e} (the run did not finish)", path.display()))?;
    let summary: serde_json::Value = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let peak = summary["peak_memory_bytes"]
        .as_u64()
        .ok_or_else(|| format!("{}: no peak_memory_bytes", path.display()))?;
    // A run that recorded no phases (`profile_every = 0`) has its peak only.
    let phases = phase_peaks(&dir.join("memory.json"), peak).unwrap_or(Measured {
        peak_bytes: peak,
        step_peak_bytes: peak,
        rest_peak_bytes: peak,
        ..Measured::default()
    });
    Ok(Measured {
        step_ms: summary["median_step_ms"].as_f64().unwrap_or(0.0),
        seconds: summary["wall_seconds"].as_f64().unwrap_or(0.0),
        ..phases
    })
}

/// The largest OOM-deciding figure inside the step's forward and backward
/// phases (one fused phase in the splat fit), and inside every other phase
/// (between steps, optimiser, checkpoints, final files), the latter split
/// into the phases that write files and the others where the files are
/// encoded in the figure's own memory (the heap), from the probe's memory
/// report (every step is recorded): a [`Measured`] without its times.
fn phase_peaks(path: &std::path::Path, headline: u64) -> Result<Measured, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let report: MemoryReport = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let reserved = report.headline.as_ref().is_some_and(|h| h.figure.contains("reserved"));
    let (mut step, mut files, mut between) = (0, 0, 0);
    for r in &report.records {
        let figure = if reserved { r.peak_reserved } else { r.peak_in_use };
        let figure = figure.unwrap_or(0);
        match r.phase.as_str() {
            "forward" | "backward" | "forward_backward" => step = step.max(figure),
            "checkpoint" | "finish" => files = files.max(figure),
            _ => between = between.max(figure),
        }
    }
    if step == 0 {
        return Err("the probe recorded no forward or backward phase".into());
    }
    let rest = files.max(between).min(headline);
    // On a device the files are encoded in host memory: no split.
    let split = !reserved && files > 0;
    Ok(Measured {
        peak_bytes: headline,
        step_peak_bytes: step.min(headline),
        rest_peak_bytes: rest,
        files_peak_bytes: if split { files.min(headline) } else { 0 },
        between_peak_bytes: if split { between.min(headline) } else { 0 },
        ..Measured::default()
    })
}
