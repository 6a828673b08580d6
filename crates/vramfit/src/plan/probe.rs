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

/// Why a probe measured nothing.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The workload failed: to be built, or in a way of its own.
    #[error("{0}")]
    Workload(Box<dyn std::error::Error + Send + Sync>),
    /// The probe's run failed (an out-of-memory among the causes).
    #[error(transparent)]
    Run(#[from] crate::run::RunError),
    /// The probe's observer stopped it.
    #[error("the probe stopped before its end")]
    Stopped,
    /// The backend measures no figure that decides an out-of-memory.
    #[error(
        "this backend measures no figure that decides an out-of-memory ({figure}); on the CPU, install \
         vramfit::heap::Counting as the global allocator"
    )]
    NoFigure {
        /// What the run reported as its peak's source.
        figure: String,
    },
    /// A run's records (`summary.json`, `memory.json`) do not say what a probe needs.
    #[error("{path}: {why}")]
    Records {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

impl ProbeError {
    /// The workload's own failure.
    pub fn workload(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Workload(e.into())
    }
}

/// Steps of every probe, whatever the workload: the first compiles kernels
/// and warms the allocator's pools, the step time is the median of the
/// other three, and the peak is the high-water of all four.
pub const PROBE_STEPS: u64 = 4;

/// The probe ritual every planning target shares: pools emptied, the
/// workload `make` builds for [`PROBE_STEPS`] steps driven to its end
/// ([`measure_run`]), pools emptied again, so no probe inherits another's
/// pages and the run after the probes starts clean.
pub fn run_probe<B: Backend, W: Workload, E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    device: &B::Device,
    make: impl FnOnce(u64) -> Result<W, E>,
) -> Result<Measured, ProbeError> {
    B::memory_cleanup(device);
    let measured = make(PROBE_STEPS).map_err(ProbeError::workload).and_then(measure_run);
    B::memory_cleanup(device);
    measured
}

/// Drives `workload` (built for a few steps) to its end in a temporary run
/// directory and returns its OOM-deciding peak and median step time.
pub fn measure_run<W: Workload>(workload: W) -> Result<Measured, ProbeError> {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!(
        "vramfit-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let run = Run::create(&RunPath::At(dir.clone()), "", "probe", "a planner probe")?;
        let summary = run
            .drive(workload, |_| ControlFlow::Continue(()))?
            .ok_or(ProbeError::Stopped)?;
        let peak = summary.peak_memory_bytes.ok_or_else(|| ProbeError::NoFigure {
            figure: summary.peak_memory_source.clone(),
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
pub fn measured_in(dir: &std::path::Path) -> Result<Measured, ProbeError> {
    let path = dir.join("summary.json");
    let records = |why: String| ProbeError::Records {
        path: path.clone(),
        why,
    };
    let text = crate::files::read::read(&path, crate::files::read::Links::Refuse)
        .map_err(|e| records(format!("{e} (the run did not finish)")))?;
    let summary: serde_json::Value = serde_json::from_slice(&text).map_err(|e| records(e.to_string()))?;
    let peak = summary["peak_memory_bytes"]
        .as_u64()
        .ok_or_else(|| records("no peak_memory_bytes".into()))?;
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
fn phase_peaks(path: &std::path::Path, headline: u64) -> Result<Measured, ProbeError> {
    let records = |why: String| ProbeError::Records { path: path.into(), why };
    let bytes =
        crate::files::read::read(path, crate::files::read::Links::Refuse).map_err(|e| records(e.to_string()))?;
    let report: MemoryReport = serde_json::from_slice(&bytes).map_err(|e| records(e.to_string()))?;
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
        return Err(records("the probe recorded no forward or backward phase".into()));
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
