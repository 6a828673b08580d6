//! What the run driver needs of a workload (its step, its state to
//! snapshot and restore, its named tensors and summary), and what it gives
//! back: each step's record, the run's summary and the events it reports.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{ArrayFile, atomic_write};
use crate::profile::{Accounted, MemoryReport, MemorySource, NamedTensor};
use crate::step::{DeviceFailure, StepObserver};

/// How often the driver logs, checkpoints and profiles (from the workload's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// Log metrics every this many steps (and at notable steps).
    pub log_every: u64,
    /// Checkpoint every this many steps (0: never).
    pub checkpoint_every: u64,
    /// Record memory categories every this many steps (0: never; the
    /// high-water marks are kept at every step regardless).
    pub profile_every: u64,
    /// Sample the allocator's in-use figure every this many ms (0: no
    /// sampling), where the source cannot track it exactly.
    pub profile_sample_ms: u64,
}

/// What one step of a workload produced.
#[derive(Debug, Clone, Default)]
pub struct StepRecord {
    /// Step just completed (1-based).
    pub step: u64,
    /// Its loss.
    pub loss: f64,
    /// Fields of the `metrics.jsonl` line beside `step`, `loss` and `wall_seconds`.
    pub metrics: serde_json::Map<String, serde_json::Value>,
    /// TensorBoard scalars beside `loss`.
    pub scalars: Vec<(String, f64)>,
    /// Log this step whatever `log_every` says (something happened).
    pub notable: bool,
    /// A short status for a progress bar ("PSNR 30.21 dB · 4000 Gaussians").
    pub status: String,
    /// Lines worth showing the user ("quality stalled: learning rates ÷ 10").
    pub notes: Vec<String>,
    /// Files to write into the run directory now (name, bytes), e.g. frames.
    pub files: Vec<(String, Vec<u8>)>,
}

/// How a run went, for the workload's summary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunStats {
    /// Steps done.
    pub steps: u64,
    /// Wall-clock seconds over every session of the run.
    pub wall_seconds: f64,
    /// Median milliseconds per step in the last session.
    pub median_step_ms: f64,
}

/// What a finished workload leaves: its summary fields and its files.
#[derive(Debug, Clone)]
pub struct Finished<S> {
    /// The workload's fields of `summary.json`.
    pub summary: S,
    /// Files to write (name, contents), e.g. `gaussians.vfg`, `weights.bin`.
    pub files: Vec<(String, FileBody)>,
}

/// A final file's contents.
#[derive(Debug, Clone)]
pub enum FileBody {
    /// Bytes made already.
    Bytes(Vec<u8>),
    /// Arrays, written as they are encoded: the file's bytes are never
    /// whole in memory beside them.
    Arrays(ArrayFile),
}

impl From<Vec<u8>> for FileBody {
    fn from(bytes: Vec<u8>) -> Self {
        Self::Bytes(bytes)
    }
}

impl FileBody {
    /// Writes the contents to `path` atomically.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        match self {
            Self::Bytes(b) => atomic_write(path, b),
            Self::Arrays(a) => crate::run::atomic_write_with(path, |w| a.write_to(w)),
        }
    }
}

/// What the run driver needs of a workload.
pub trait Workload {
    /// The workload's fields of `summary.json`.
    type Summary: Serialize + DeserializeOwned + Clone;
    /// Its errors.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The kind stored in its checkpoints (checked on resume).
    fn checkpoint_kind(&self) -> &'static str;
    /// How often to log, checkpoint and profile.
    fn cadence(&self) -> Cadence;
    /// The settings a resume may change ([`super::Resumable`]); by
    /// default only the step count, which may grow.
    fn resumable(&self) -> super::Resumable {
        super::Resumable::STEPS_ONLY
    }
    /// Where device memory figures come from on its backend.
    fn memory_source(&self) -> Box<dyn MemorySource>;
    /// Steps done.
    fn steps_done(&self) -> u64;
    /// The step budget.
    fn total_steps(&self) -> u64;
    /// True when the run is over (default: the step budget spent; a
    /// workload that stops early says so here).
    fn finished(&self) -> bool {
        self.steps_done() >= self.total_steps()
    }
    /// What it holds between steps (parameters, optimiser state, inputs).
    fn accounted(&self) -> Accounted;
    /// One step; reports the end of each phase to `observer`.
    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, Self::Error>;
    /// All its state, to resume exactly.
    fn snapshot(&self) -> Result<ArrayFile, Self::Error>;
    /// Restores a snapshot taken by [`Workload::snapshot`] with the same settings.
    fn restore(&mut self, file: &ArrayFile) -> Result<(), Self::Error>;
    /// Its tensors by name and category, largest first, for the memory
    /// report's table (default: none named).
    fn tensors(&self) -> Vec<NamedTensor> {
        Vec::new()
    }
    /// What to turn to lower the peak of `report`, most effective first
    /// (default: no advice).
    fn advice(&self, _report: &MemoryReport) -> Vec<String> {
        Vec::new()
    }
    /// The device failure inside `error`, if it is one (default: none is;
    /// a workload whose device can fail must say, or an out-of-memory is
    /// reported as a plain error).
    fn device_failure(_error: &Self::Error) -> Option<DeviceFailure> {
        None
    }
    /// Ends the run: its summary fields and final files.
    fn finish(&mut self, stats: &RunStats) -> Result<Finished<Self::Summary>, Self::Error>;
}

/// `summary.json`: the driver's fields and the workload's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary<S> {
    /// The workload's own fields.
    #[serde(flatten)]
    pub workload: S,
    /// Steps done.
    pub steps: u64,
    /// Wall-clock seconds over every session of the run.
    pub wall_seconds: f64,
    /// Median milliseconds per step in the last session.
    pub median_step_ms: f64,
    /// The high-water mark of the figure that decides an out-of-memory on
    /// this backend; see `peak_memory_source`.
    pub peak_memory_bytes: Option<u64>,
    /// What `peak_memory_bytes` measures, or why there is none.
    pub peak_memory_source: String,
    /// Step and phase where the peak was reached.
    #[serde(default)]
    pub peak_at: Option<String>,
    /// Largest in-use bytes over the run (allocator or heap).
    #[serde(default)]
    pub in_use_peak_bytes: Option<u64>,
    /// Largest bytes the allocator reserved from the device.
    #[serde(default)]
    pub reserved_peak_bytes: Option<u64>,
    /// Largest device memory the driver (NVML) attributed to this process.
    #[serde(default)]
    pub driver_peak_bytes: Option<u64>,
    /// What the driver counted beyond the allocator when profiling began
    /// (the CUDA context).
    #[serde(default)]
    pub driver_context_bytes: Option<u64>,
    /// The process's peak resident set (VmHWM), host memory.
    #[serde(default)]
    pub host_peak_bytes: Option<u64>,
    /// Warnings about the run (a diverging loss).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Device.
    pub device: String,
}

/// What the driver reports while it runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// The loop starts at `done` of `total` steps.
    Start {
        /// Steps already done (resume).
        done: u64,
        /// Step budget.
        total: u64,
    },
    /// A step completed.
    Step(&'a StepRecord),
    /// A checkpoint was written.
    Checkpoint(&'a Path),
    /// Something the user should know (a checkpoint skipped on resume).
    Note(&'a str),
}
