//! The one run driver: every workload (the splat fit, the transformer, a
//! user's own model) runs through it. A workload supplies its step, its
//! state to snapshot and restore, its named tensors and its summary; the
//! driver owns the rest: the run directory, resume from the newest readable
//! checkpoint, checkpoint rotation, `metrics.jsonl`, TensorBoard scalars
//! (memory included), the profiler, and the `memory.json`, `oom.json`,
//! `error.json` and `summary.json` files.
//!
//! Order of a new run: the caller validates its settings and builds the
//! workload, then [`Run::create`] makes the directory (so bad settings leave
//! nothing behind), then [`Run::drive`]. A resume: [`Run::open`] returns the
//! run's own settings, the caller builds the workload from them, and
//! [`Run::drive`] restores it from the newest checkpoint that reads back.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{ArrayFile, EventWriter, RunDir, RunDirError, atomic_write, checkpoint_name, checkpoints_newest_first};
use crate::profile::{Accounted, MemoryReport, MemorySource, NamedTensor, Profiler, oom_report, out_of_memory};
use crate::step::{DeviceFailure, Probe, StepObserver};

/// Checkpoints kept on disk (the newest ones).
pub const KEEP_CHECKPOINTS: usize = 2;
/// Profiled steps kept in the memory timeline.
const PROFILE_KEEP_STEPS: u64 = 200;

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

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The run directory.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// The workload failed (its own words).
    #[error(transparent)]
    Workload(Box<dyn std::error::Error + Send + Sync>),
    /// A file could not be written.
    #[error("cannot write {path}: {why}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        why: String,
    },
    /// The device ran out of memory; `oom.json` holds the breakdown.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemoryError>),
    /// The run directory has no checkpoints folder: resuming would start
    /// over and then fail at the first checkpoint.
    #[error(
        "cannot resume {dir}: its checkpoints folder {dir}/checkpoints is missing (a run keeps its checkpoints \
         there). Nothing was changed. Restore the folder to resume, or start a new run with the same settings \
         (`--config {dir}/config.toml`)"
    )]
    CheckpointsMissing {
        /// The run directory.
        dir: PathBuf,
    },
    /// `config.toml` was edited since the checkpoint in a way that would not
    /// continue the same run.
    #[error(
        "cannot resume {dir}: config.toml was edited since {checkpoint}, and the run would not continue as it \
         was: {keys}. Nothing was changed. Put the values back to resume, or start a new run with the edited \
         settings (`--config {dir}/config.toml`). A resume may change the cadences (log_every, check_every, \
         frame_every, checkpoint_every, profile_every), the learning rates, and `steps` to no fewer than the \
         checkpoint's"
    )]
    ConfigEdited {
        /// The run directory.
        dir: PathBuf,
        /// The checkpoint resumed from.
        checkpoint: String,
        /// Each edited key, `key: then → now`.
        keys: String,
    },
    /// The checkpoints folder is empty though the run had written
    /// checkpoints (its log reaches past the first).
    #[error(
        "cannot resume {dir}: its checkpoints folder is empty, but the run had reached step {step} (metrics.jsonl) \
         with a checkpoint every {every} steps: they were removed. Nothing was changed. Restore them to resume, or \
         start a new run with the same settings (`--config {dir}/config.toml`)"
    )]
    CheckpointsGone {
        /// The run directory.
        dir: PathBuf,
        /// The last step its log holds.
        step: u64,
        /// Its checkpoint cadence.
        every: u64,
    },
    /// Checkpoints exist but none reads back: the run will not silently start over.
    #[error(
        "cannot resume {dir}: no checkpoint reads back ({why}). Nothing was changed. Start a new run with the same \
         settings (`--config {dir}/config.toml`), or move the checkpoints away to restart this run from step 0"
    )]
    NoReadableCheckpoint {
        /// The run directory.
        dir: PathBuf,
        /// Each checkpoint and why it was refused.
        why: String,
    },
}

/// A device out-of-memory, in words: where, what was asked, what held the
/// memory and what to turn.
#[derive(Debug, thiserror::Error)]
#[error(
    "out of device memory at step {step} ({phase}){requested}; largest: {largest}. The breakdown is in {report}.{advice}"
)]
pub struct OutOfMemoryError {
    /// Step that failed.
    pub step: u64,
    /// Phase in which it surfaced.
    pub phase: String,
    /// What the failed allocation asked for, in words (may be empty).
    pub requested: String,
    /// The largest categories and tensors, in words.
    pub largest: String,
    /// The `oom.json` written.
    pub report: PathBuf,
    /// What to turn, in words (may be empty).
    pub advice: String,
}

/// A run held to a budget ([`Run::with_budget`]) whose deciding figure went past it.
#[derive(Debug, thiserror::Error)]
#[error("{figure} reached {bytes} bytes at step {step} ({phase}), over the run's budget of {budget} bytes")]
struct OverBudget {
    step: u64,
    phase: String,
    figure: String,
    bytes: u64,
    budget: u64,
}

/// An out-of-memory that a backend's own thread panicked with during a
/// step ([`crate::profile::panics`]): the step itself returned as if nothing
/// had happened.
#[derive(Debug, thiserror::Error)]
#[error("the device ran out of memory during step {step} (reported by a panic on the backend's thread): {message}")]
struct DevicePanic {
    step: u64,
    message: String,
}

/// The last step `metrics.jsonl` logged (0: none, or no log).
fn last_logged_step(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.lines().rev().find_map(super::dir::line_step))
        .unwrap_or(0)
}

/// A failed write of `path` in the run at `root`; a full disk says how the
/// run continues.
fn write_err<'a>(root: &'a Path, path: &'a Path) -> impl Fn(std::io::Error) -> RunError + 'a {
    move |e| {
        let full = matches!(
            e.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        );
        RunError::Write {
            path: path.into(),
            why: if full {
                format!(
                    "{e}. Free space and resume the run (`--resume {}`): it continues from its last checkpoint as \
                     if it had not stopped",
                    root.display()
                )
            } else {
                e.to_string()
            },
        }
    }
}

fn pretty<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(value).expect("plain data serialises")
}

/// Where a new run goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunPath {
    /// This directory (an existing one is refused).
    At(PathBuf),
    /// The next free `BASE/PREFIX-NNN`, claimed atomically: runs started
    /// together take distinct directories.
    Next {
        /// Folder of the runs, e.g. `runs`.
        base: PathBuf,
        /// Name before the number, e.g. `fit`.
        prefix: String,
    },
}

/// How a run begins: new, with its settings and where it goes, or resumed
/// from its directory with the settings stored there.
#[derive(Debug, Clone, PartialEq)]
pub enum Start<C> {
    /// A new run.
    New(C, RunPath),
    /// Continue the run in this directory.
    Resume(PathBuf),
}

/// A run directory about to be driven.
#[derive(Debug)]
pub struct Run {
    dir: RunDir,
    device: String,
    resume: bool,
    budget: Option<u64>,
    /// `config.toml` as the run holds it: checkpoints keep a copy, so that a
    /// resume can tell an edit that contradicts them.
    config: String,
    /// Settings changed on purpose since the checkpoint (the planner's
    /// fallback to its next plan): not refused.
    new_settings: bool,
    /// Resumed from a directory with no `workload` file (older runs), as
    /// the named workload: its settings may be another workload's.
    unnamed: Option<String>,
}

/// The file in a run directory naming the workload that started the run.
const WORKLOAD_FILE: &str = "workload";

impl Run {
    /// Creates the run directory with its resolved `config.toml` and the
    /// name of the workload that runs it (`workload`: what starts it, such as
    /// `vramfit train transformer`), all or nothing (call after the workload
    /// has been built from the same settings).
    pub fn create(out: &RunPath, config_toml: &str, device: &str, workload: &str) -> Result<Self, RunError> {
        let named = format!("{workload}\n");
        let files: [(&str, &[u8]); 2] = [
            ("config.toml", config_toml.as_bytes()),
            (WORKLOAD_FILE, named.as_bytes()),
        ];
        let dir = match out {
            RunPath::At(root) => RunDir::create_with(root, &files)?,
            RunPath::Next { base, prefix } => RunDir::create_next(base, prefix, &files)?,
        };
        Ok(Self {
            dir,
            device: device.into(),
            resume: false,
            budget: None,
            config: config_toml.into(),
            new_settings: false,
            unnamed: None,
        })
    }

    /// Opens `out` to resume it with `workload` (as [`Run::create`] names
    /// it); returns the run and its `config.toml` text. A finished run, and
    /// a run another workload started, are refused.
    pub fn open(out: &Path, device: &str, workload: &str) -> Result<(Self, String), RunError> {
        let dir = RunDir::open(out)?;
        let not_resumable = |why: String| RunDirError::NotResumable {
            path: out.to_path_buf(),
            why,
        };
        if dir.path("summary.json").exists() {
            return Err(not_resumable("the run already finished (summary.json exists)".into()).into());
        }
        // Runs made before the file existed have none: their settings decide.
        let started = std::fs::read_to_string(dir.path(WORKLOAD_FILE));
        let unnamed = started.is_err().then(|| workload.to_string());
        if let Ok(started) = started {
            let started = started.trim();
            // Only what vramfit writes is repeated back: an edited file
            // could name anything (a shell command, even).
            let plain = started.len() <= 64
                && started
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_' | ':' | '.'));
            if started != workload && !plain {
                return Err(not_resumable(format!(
                    "its {WORKLOAD_FILE} file does not hold a command vramfit writes (it was edited); resume it with \
                     the command that started it"
                ))
                .into());
            }
            if started != workload {
                // A command is named as one; the library's trainer is not a command.
                let how = if started.starts_with("vramfit ") {
                    format!("resume it with {started} --resume {}", out.display())
                } else {
                    format!("resume it with {started}")
                };
                return Err(not_resumable(format!("it is a run of {started}, not of {workload}: {how}")).into());
            }
        }
        let path = dir.path("config.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| not_resumable(format!("{}: {e}", path.display())))?;
        let run = Self {
            dir,
            device: device.into(),
            resume: true,
            budget: None,
            config: text.clone(),
            new_settings: false,
            unnamed,
        };
        Ok((run, text))
    }

    /// `error`, from reading the settings [`Run::open`] returned, as the
    /// resume's refusal: where the run has no `workload` file (runs made
    /// before it existed), its settings may be another workload's, and the
    /// refusal says so rather than only naming a field.
    pub fn settings_error<E: From<RunError> + std::fmt::Display>(&self, error: E) -> E {
        let Some(workload) = &self.unnamed else { return error };
        RunError::from(RunDirError::NotResumable {
            path: self.dir.root().to_path_buf(),
            why: format!(
                "its config.toml is not settings of {workload} ({error}). The run has no `{WORKLOAD_FILE}` file \
                 naming the command that started it (it was made by an older vramfit): resume it with that command"
            ),
        })
        .into()
    }

    /// The run directory.
    pub fn dir(&self) -> &RunDir {
        &self.dir
    }

    /// Resumes under settings that differ from the checkpoint's on purpose
    /// (the planner's fallback continues a run under its next plan), where a
    /// plain resume refuses an edited `config.toml`.
    pub fn with_new_settings(mut self) -> Self {
        self.new_settings = true;
        self
    }

    /// Holds the run to `bytes` of the figure that decides an out-of-memory
    /// on its backend: a step that takes the figure's high-water mark past
    /// it ends the run as an out-of-memory would (`oom.json`,
    /// [`RunError::OutOfMemory`]), so a planned run falls back to its next
    /// plan instead of finding out after the run that the plan did not hold.
    /// A backend without such a figure is not held. The steps are held; the
    /// final evaluation after the last step is not (a run that passes the
    /// budget there has finished: its summary's peak says so).
    pub fn with_budget(mut self, bytes: u64) -> Self {
        self.budget = Some(bytes);
        self
    }

    /// Restores `workload` from the newest checkpoint that reads back;
    /// returns the wall seconds before this session and notes for the user.
    fn restore<W: Workload>(&self, workload: &mut W) -> Result<(f64, Vec<String>), RunError> {
        let found = checkpoints_newest_first(&self.dir.checkpoints());
        let mut refused = Vec::new();
        for path in &found {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let file = match ArrayFile::read(path) {
                Ok(f) if f.kind == workload.checkpoint_kind() => f,
                Ok(f) => {
                    refused.push(format!(
                        "{name} holds '{}', not '{}'",
                        f.kind,
                        workload.checkpoint_kind()
                    ));
                    continue;
                }
                Err(e) => {
                    refused.push(format!("{name}: {e}"));
                    continue;
                }
            };
            if let Some(then) = file.meta.get("config_toml").and_then(|v| v.as_str())
                && !self.new_settings
            {
                let step = name
                    .trim_start_matches("step-")
                    .trim_end_matches(".ckpt")
                    .parse::<u64>()
                    .unwrap_or(0);
                let keys = contradicting_keys(then, &self.config, step);
                if !keys.is_empty() {
                    return Err(RunError::ConfigEdited {
                        dir: self.dir.root().into(),
                        checkpoint: name,
                        keys: keys.join("; "),
                    });
                }
            }
            workload.restore(&file).map_err(|e| RunError::Workload(Box::new(e)))?;
            let wall = file.meta.get("wall_seconds").and_then(|v| v.as_f64()).unwrap_or(0.0);
            let mut notes: Vec<String> = refused
                .iter()
                .map(|r| format!("skipped an unreadable checkpoint: {r}"))
                .collect();
            if !refused.is_empty() {
                notes.push(format!(
                    "resuming from {name} (step {}): the steps after it are run again",
                    workload.steps_done()
                ));
            }
            return Ok((wall, notes));
        }
        if found.is_empty() && !self.dir.checkpoints().is_dir() {
            Err(RunError::CheckpointsMissing {
                dir: self.dir.root().into(),
            })
        } else if found.is_empty() {
            // A run logged past its first checkpoint had written one: an
            // empty folder means they were removed, and starting over would
            // overwrite the run's record of those steps.
            let every = workload.cadence().checkpoint_every;
            let logged = last_logged_step(&self.dir.path("metrics.jsonl"));
            // Past it, not at it: the step's log line is written before its
            // checkpoint, and a write that failed there left none.
            if every > 0 && logged > every {
                return Err(RunError::CheckpointsGone {
                    dir: self.dir.root().into(),
                    step: logged,
                    every,
                });
            }
            Ok((
                0.0,
                vec!["no checkpoint had been written yet: starting from step 0".into()],
            ))
        } else {
            Err(RunError::NoReadableCheckpoint {
                dir: self.dir.root().into(),
                why: refused.join("; "),
            })
        }
    }

    /// Runs `workload` to its end (restoring it first when resuming).
    /// `observe` sees every event and may stop the run as a kill would
    /// (nothing more is written; `Ok(None)`).
    pub fn drive<W: Workload>(
        self,
        mut workload: W,
        mut observe: impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Option<RunSummary<W::Summary>>, RunError> {
        crate::profile::panics::watch();
        let (wall_before, notes) = if self.resume {
            let restored = self.restore(&mut workload)?;
            let _ = std::fs::remove_file(self.dir.path("error.json"));
            restored
        } else {
            (0.0, Vec::new())
        };
        for n in &notes {
            if observe(Event::Note(n)).is_break() {
                return Ok(None);
            }
        }
        let cadence = workload.cadence();
        let mut profiler = Profiler::new(workload.memory_source(), PROFILE_KEEP_STEPS);
        if cadence.profile_sample_ms > 0 {
            profiler = profiler.with_sampling(std::time::Duration::from_millis(cadence.profile_sample_ms));
        }
        let mut session = Session {
            run: &self,
            cadence,
            profiler,
            wall_before,
            started: Instant::now(),
            step_ms: Vec::new(),
            losses: (None, None),
        };
        let result = session.steps(&mut workload, &mut observe);
        let result = match result {
            Ok(true) => {
                // The final files' work too (a backend's thread may fail there).
                let panics = crate::profile::panics::count();
                let finished = session.finish(&mut workload).map(Some);
                match crate::profile::panics::since(panics) {
                    Some(message) if finished.is_ok() => Err(RunError::Workload(Box::new(DevicePanic {
                        step: workload.steps_done(),
                        message,
                    }))),
                    _ => finished,
                }
            }
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        };
        // The memory report is written however the run ended; a run that
        // finished without it does not say it finished (a full disk must not
        // pass silently: `report` needs the file).
        let report = session.memory_report(&workload);
        let written = self.dir.write("memory.json", &pretty(&report));
        let result = match (result, written) {
            (Ok(Some(_)), Err(e)) => Err(RunError::Write {
                path: self.dir.path("memory.json"),
                why: format!(
                    "{e}. The run's steps are done, but without its memory report it is not marked finished: free \
                     space and resume it (`--resume {}`), which repeats the steps after its last checkpoint",
                    self.dir.root().display()
                ),
            }),
            (result, _) => result,
        };
        let result = match result {
            Err(RunError::Workload(e)) => match e.downcast::<OverBudget>() {
                Ok(over) => Err(self.over_budget(&workload, *over, &session.profiler, &report)),
                Err(e) => match e.downcast::<DevicePanic>() {
                    Ok(panic) => {
                        let at = OutOfMemoryAt {
                            error: panic.to_string(),
                            message: panic.message,
                            step: panic.step,
                            phase: "step".into(),
                            requested: None,
                            budget: None,
                        };
                        Err(self.out_of_memory_error(&workload, at, &session.profiler, &report))
                    }
                    Err(e) => Err(self.device_error(&workload, e, &session.profiler, &report)),
                },
            },
            other => other,
        };
        match result {
            Ok(Some(summary)) => {
                self.dir.write("summary.json", &pretty(&summary))?;
                Ok(Some(summary))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                let body = json!({ "error": e.to_string(), "step": workload.steps_done() });
                let _ = self.dir.write("error.json", body.to_string().as_bytes());
                Err(e)
            }
        }
    }

    /// A run held to a budget that went past it: `oom.json` and the error
    /// of an out-of-memory, the request being what the budget did not hold.
    fn over_budget<W: Workload>(
        &self,
        workload: &W,
        over: OverBudget,
        profiler: &Profiler,
        report: &MemoryReport,
    ) -> RunError {
        let requested = format!(
            ": {} reached {} bytes, over the run's budget of {} bytes",
            over.figure, over.bytes, over.budget
        );
        let at = OutOfMemoryAt {
            error: over.to_string(),
            message: String::new(),
            step: over.step,
            phase: over.phase,
            requested: Some(requested),
            budget: Some(over.budget),
        };
        self.out_of_memory_error(workload, at, profiler, report)
    }

    /// An out-of-memory gets `oom.json` and a message with the breakdown;
    /// any other failure passes through.
    fn device_error<W: Workload>(
        &self,
        workload: &W,
        error: Box<dyn std::error::Error + Send + Sync>,
        profiler: &Profiler,
        report: &MemoryReport,
    ) -> RunError {
        let Some(failure) = error.downcast_ref::<W::Error>().and_then(W::device_failure) else {
            return RunError::Workload(error);
        };
        if out_of_memory(&failure.message).is_none() {
            return RunError::Workload(error);
        }
        let at = OutOfMemoryAt {
            error: error.to_string(),
            message: failure.message,
            step: failure.step,
            phase: failure.phase,
            requested: None,
            budget: None,
        };
        self.out_of_memory_error(workload, at, profiler, report)
    }

    /// Writes `oom.json` (the last records, the largest tensors, the
    /// headline and advice) and returns the out-of-memory error that names it.
    fn out_of_memory_error<W: Workload>(
        &self,
        workload: &W,
        at: OutOfMemoryAt,
        profiler: &Profiler,
        report: &MemoryReport,
    ) -> RunError {
        let tensors = workload.tensors();
        let mut oom = oom_report(&at.error, &at.message, at.step, &at.phase, profiler.records(), &tensors);
        oom.json["headline"] = json!(report.headline);
        oom.json["advice"] = json!(report.advice);
        if let Some(budget) = at.budget {
            oom.json["budget_bytes"] = json!(budget);
        }
        // On data-parallel ranks, which one ran out (each writes its own).
        if let Some(w) = crate::ranks::world().filter(|w| w.size() > 1) {
            oom.json["rank"] = json!(w.rank());
            oom.json["ranks"] = json!(w.size());
        }
        if let Err(e) = self.dir.write("oom.json", &pretty(&oom.json)) {
            return e.into();
        }
        RunError::OutOfMemory(Box::new(OutOfMemoryError {
            step: at.step,
            phase: at.phase,
            requested: at.requested.unwrap_or(oom.requested),
            largest: oom.largest,
            report: self.dir.path("oom.json"),
            advice: if report.advice.is_empty() {
                String::new()
            } else {
                format!(" To use less: {}", report.advice.join("; "))
            },
        }))
    }
}

/// Where an out-of-memory happened, for [`Run::out_of_memory_error`].
struct OutOfMemoryAt {
    /// The error, in words.
    error: String,
    /// The backend's words (empty for a budget passed).
    message: String,
    step: u64,
    phase: String,
    /// What was asked for, in words, when the backend's message does not say it.
    requested: Option<String>,
    /// The run's budget, when that is what was passed.
    budget: Option<u64>,
}

/// One session of a run: from start or resume to the end or a stop.
struct Session<'r> {
    run: &'r Run,
    cadence: Cadence,
    profiler: Profiler,
    wall_before: f64,
    started: Instant,
    step_ms: Vec<f64>,
    /// First and last finite loss of the session, for the divergence warning.
    losses: (Option<f64>, Option<f64>),
}

impl Session<'_> {
    fn wall(&self) -> f64 {
        self.wall_before + self.started.elapsed().as_secs_f64()
    }

    /// Runs the steps; `Ok(false)` when the observer stopped the run.
    fn steps<W: Workload>(
        &mut self,
        w: &mut W,
        observe: &mut impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<bool, RunError> {
        let dir = &self.run.dir;
        let mut metrics = dir.metrics(Some(w.steps_done()))?;
        let mut events = EventWriter::create(dir.root()).map_err(write_err(dir.root(), dir.root()))?;
        let c = self.cadence;
        if observe(Event::Start {
            done: w.steps_done(),
            total: w.total_steps(),
        })
        .is_break()
        {
            return Ok(false);
        }
        while !w.finished() {
            let step = w.steps_done() + 1;
            // Step 1 too, so that a short run shows where its memory went.
            let record = c.profile_every > 0 && (step == 1 || step.is_multiple_of(c.profile_every));
            // The window that ends here covers the work between steps
            // (checkpoints, logs, frames).
            self.profiler.observe(step, "start", None, record, || w.accounted());
            let t0 = Instant::now();
            let panics = crate::profile::panics::count();
            let r = w
                .step(&mut Probe {
                    profiler: &mut self.profiler,
                    step,
                    record,
                })
                .map_err(|e| RunError::Workload(Box::new(e)))?;
            if let Some(message) = crate::profile::panics::since(panics) {
                return Err(RunError::Workload(Box::new(DevicePanic { step, message })));
            }
            self.step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            // The headline (a few strings) is built only for a run that has a budget.
            if let Some(budget) = self.run.budget
                && let Some(h) = self.profiler.headline()
                && h.bytes > budget
            {
                return Err(RunError::Workload(Box::new(OverBudget {
                    step: h.step,
                    phase: h.label(),
                    figure: h.figure,
                    bytes: h.bytes,
                    budget,
                })));
            }
            if r.loss.is_finite() {
                self.losses = (self.losses.0.or(Some(r.loss)), Some(r.loss));
            }
            if r.notable || step.is_multiple_of(c.log_every.max(1)) || w.finished() {
                let mut line = serde_json::Map::new();
                line.insert("step".into(), json!(step));
                line.insert("loss".into(), json!(r.loss));
                line.extend(r.metrics.clone());
                line.insert("wall_seconds".into(), json!(self.wall()));
                metrics.append(&line)?;
                let mut scalars = vec![("loss", r.loss)];
                scalars.extend(r.scalars.iter().map(|(k, v)| (k.as_str(), *v)));
                events
                    .scalars(step, &scalars)
                    .map_err(write_err(dir.root(), dir.root()))?;
            }
            self.memory_scalars(&mut events, step)?;
            for (name, bytes) in &r.files {
                let path = dir.path(name);
                atomic_write(&path, bytes).map_err(write_err(dir.root(), &path))?;
            }
            if observe(Event::Step(&r)).is_break() {
                return Ok(false);
            }
            if c.checkpoint_every > 0 && step.is_multiple_of(c.checkpoint_every) && !w.finished() {
                let mut file = w.snapshot().map_err(|e| RunError::Workload(Box::new(e)))?;
                file.meta["wall_seconds"] = json!(self.wall());
                file.meta["config_toml"] = json!(self.run.config);
                let path = dir.checkpoints().join(checkpoint_name(step));
                crate::run::atomic_write_with(&path, |w| file.write_to(w)).map_err(write_err(dir.root(), &path))?;
                drop(file);
                // A phase of its own: the encoded copy of the state is held
                // here, and the planner tells it from the optimizer's (a
                // sharded rank's checkpoint holds its own moments only).
                self.profiler
                    .observe(step, "checkpoint", None, record, || w.accounted());
                for old in checkpoints_newest_first(&dir.checkpoints())
                    .into_iter()
                    .skip(KEEP_CHECKPOINTS)
                {
                    let _ = std::fs::remove_file(old);
                }
                if observe(Event::Checkpoint(&path)).is_break() {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// TensorBoard `memory/<phase>/<category>` for the phases recorded at
    /// `step`, and `memory/peak` (the headline so far) at every recorded step.
    fn memory_scalars(&self, events: &mut EventWriter, step: u64) -> Result<(), RunError> {
        let mut tags: Vec<(String, f64)> = Vec::new();
        for r in self.profiler.records().iter().filter(|r| r.step == step) {
            let label = r.label();
            tags.extend(
                r.categories
                    .iter()
                    .map(|(c, b)| (format!("memory/{label}/{}", c.name()), *b as f64)),
            );
            tags.push((format!("memory/{label}/in_use"), r.allocated() as f64));
        }
        if tags.is_empty() {
            return Ok(());
        }
        if let Some(h) = self.profiler.headline() {
            tags.push(("memory/peak".into(), h.bytes as f64));
        }
        let refs: Vec<(&str, f64)> = tags.iter().map(|(t, v)| (t.as_str(), *v)).collect();
        events
            .scalars(step, &refs)
            .map_err(write_err(self.run.dir.root(), self.run.dir.root()))
    }

    fn finish<W: Workload>(&mut self, w: &mut W) -> Result<RunSummary<W::Summary>, RunError> {
        let mut sorted = self.step_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let stats = RunStats {
            steps: w.steps_done(),
            wall_seconds: self.wall(),
            median_step_ms: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        };
        let done = w.finish(&stats).map_err(|e| RunError::Workload(Box::new(e)))?;
        // The final evaluation and files: observed like a phase, since their
        // buffers count towards the peak too (recorded beside the last step's
        // phases when that step was recorded).
        let record = self.profiler.records().last().is_some_and(|r| r.step == stats.steps);
        self.profiler
            .observe(stats.steps, "finish", None, record, || w.accounted());
        for (name, body) in &done.files {
            let path = self.run.dir.path(name);
            body.write(&path).map_err(write_err(self.run.dir.root(), &path))?;
        }
        let mut warnings = Vec::new();
        if let (Some(first), Some(last)) = self.losses
            && last > 10.0 * first.abs().max(1e-12)
        {
            warnings.push(format!(
                "the loss grew from {first:.4e} to {last:.4e} over this session: the run diverged. Lower the learning rate"
            ));
        }
        let headline = self.profiler.headline();
        let peaks = self.profiler.run_peaks();
        Ok(RunSummary {
            workload: done.summary,
            steps: stats.steps,
            wall_seconds: stats.wall_seconds,
            median_step_ms: stats.median_step_ms,
            peak_memory_bytes: headline.as_ref().map(|h| h.bytes),
            peak_memory_source: headline
                .as_ref()
                .map(|h| h.figure.clone())
                .unwrap_or_else(|| "none: this backend measures no figure that decides an out-of-memory".into()),
            peak_at: headline.as_ref().map(|h| format!("step {}, {}", h.step, h.label())),
            in_use_peak_bytes: peaks.map(|p| p.allocated),
            reserved_peak_bytes: peaks
                .filter(|_| self.profiler.oom_figure().is_some_and(|f| f.reserved))
                .map(|p| p.reserved),
            driver_peak_bytes: peaks.and_then(|p| p.driver),
            driver_context_bytes: self.profiler.driver_context(),
            host_peak_bytes: crate::memory::host_peak_bytes(),
            warnings,
            device: self.run.device.clone(),
        })
    }

    fn memory_report<W: Workload>(&self, w: &W) -> MemoryReport {
        let mut tensors = w.tensors();
        tensors.truncate(10);
        let mut report = self.profiler.report(&self.run.device, tensors, Vec::new());
        report.advice = w.advice(&report);
        report
    }
}

/// The largest each category got over the recorded phases of the step
/// where the report's peak was reached (else the last recorded step),
/// largest first, zeros left out: what a workload's advice starts from.
pub fn categories_at_peak(report: &MemoryReport) -> Vec<(crate::profile::Category, u64)> {
    let Some(step) = report.peak_record().or(report.records.last()).map(|r| r.step) else {
        return Vec::new();
    };
    let mut most = std::collections::BTreeMap::new();
    for r in report.records.iter().filter(|r| r.step == step) {
        for (c, b) in &r.categories {
            let m = most.entry(*c).or_insert(0u64);
            *m = (*m).max(*b);
        }
    }
    let mut v: Vec<_> = most.into_iter().filter(|(_, b)| *b > 0).collect();
    v.sort_by_key(|c| std::cmp::Reverse(c.1));
    v
}

/// A test seam: `inner` whose step number `step` fails with the error that
/// `fail` makes (for example a device error in cubecl's out-of-memory
/// words), so that the driver's failure paths can be tested without a
/// device that fails. Everything else is `inner`'s.
pub struct FailAt<W: Workload> {
    /// The workload.
    pub inner: W,
    /// The step that fails (1-based).
    pub step: u64,
    /// Makes the error for that step.
    pub fail: fn(u64) -> W::Error,
}

impl<W: Workload> Workload for FailAt<W> {
    type Summary = W::Summary;
    type Error = W::Error;

    fn checkpoint_kind(&self) -> &'static str {
        self.inner.checkpoint_kind()
    }
    fn cadence(&self) -> Cadence {
        self.inner.cadence()
    }
    fn memory_source(&self) -> Box<dyn MemorySource> {
        self.inner.memory_source()
    }
    fn steps_done(&self) -> u64 {
        self.inner.steps_done()
    }
    fn total_steps(&self) -> u64 {
        self.inner.total_steps()
    }
    fn finished(&self) -> bool {
        self.inner.finished()
    }
    fn accounted(&self) -> Accounted {
        self.inner.accounted()
    }
    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, W::Error> {
        let next = self.inner.steps_done() + 1;
        if next == self.step {
            return Err((self.fail)(next));
        }
        self.inner.step(observer)
    }
    fn snapshot(&self) -> Result<ArrayFile, W::Error> {
        self.inner.snapshot()
    }
    fn restore(&mut self, file: &ArrayFile) -> Result<(), W::Error> {
        self.inner.restore(file)
    }
    fn tensors(&self) -> Vec<NamedTensor> {
        self.inner.tensors()
    }
    fn advice(&self, report: &MemoryReport) -> Vec<String> {
        self.inner.advice(report)
    }
    fn device_failure(error: &W::Error) -> Option<DeviceFailure> {
        W::device_failure(error)
    }
    fn finish(&mut self, stats: &RunStats) -> Result<Finished<W::Summary>, W::Error> {
        self.inner.finish(stats)
    }
}

/// Settings a resume may change: how often things are logged, checked,
/// drawn, checkpointed and profiled, and how often the allocator is
/// cleaned up (the run's trajectory does not depend on them); the learning rates (what the advice for a diverging run says
/// to lower before resuming); and `steps`, to no fewer than the
/// checkpoint's step (a run may be extended, not cut below where it is);
/// and `moments` between the device and the host (where Adam's state
/// lives, not its precision).
const CADENCE_KEYS: [&str; 6] = [
    "allocator_cleanup",
    "log_every",
    "check_every",
    "frame_every",
    "checkpoint_every",
    "profile_every",
];

fn may_change(key: &str, then: Option<&toml::Value>, now: Option<&toml::Value>, step: u64) -> bool {
    let learning_rate = key == "lr" || key.starts_with("lr_") || key.ends_with("_lr") || key.contains("learning_rate");
    let longer = key == "steps" && now.and_then(|v| v.as_integer()).is_some_and(|s| s >= step as i64);
    // Where Adam's moments live changes no arithmetic (the host's Adam is
    // the device's): a resume may move them between the device (`device`,
    // or f32 moments there) and the host, not change their precision.
    fn place(v: Option<&toml::Value>) -> &str {
        v.and_then(|v| v.as_str()).unwrap_or("device")
    }
    let moved = key == "moments"
        && [["device", "host"], ["f32", "host"]]
            .iter()
            .any(|pair| pair.contains(&place(then)) && pair.contains(&place(now)));
    CADENCE_KEYS.contains(&key) || learning_rate || longer || moved
}

/// The keys (dotted paths) whose values differ between two `config.toml`
/// texts in a way a resume from the checkpoint of `step` cannot honour, as
/// `key: then → now`; a text that does not parse is compared whole.
fn contradicting_keys(then: &str, now: &str, step: u64) -> Vec<String> {
    if then == now {
        return Vec::new();
    }
    let (Ok(a), Ok(b)) = (then.parse::<toml::Table>(), now.parse::<toml::Table>()) else {
        return vec!["the file (it no longer parses as it did)".into()];
    };
    let mut out = Vec::new();
    diff_tables("", &a, &b, step, &mut out);
    out
}

fn diff_tables(prefix: &str, a: &toml::Table, b: &toml::Table, step: u64, out: &mut Vec<String>) {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match (a.get(key), b.get(key)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => diff_tables(&path, x, y, step, out),
            (x, y) if x != y && !may_change(key, x, y, step) => {
                let show = |v: Option<&toml::Value>| v.map_or("(absent)".to_string(), |v| v.to_string());
                let why = if key == "steps" {
                    format!(" (the checkpoint is at step {step})")
                } else {
                    String::new()
                };
                out.push(format!("{path}: {} → {}{why}", show(x), show(y)));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::contradicting_keys;

    /// A resume may move Adam's moments between the device and the host,
    /// not change their precision; other edits stay refused.
    #[test]
    fn a_resume_may_move_the_moments_but_not_round_them() {
        let cfg = |moments: &str| format!("steps = 100\nmoments = \"{moments}\"\nlr = 0.1\n");
        for (then, now) in [("f32", "host"), ("host", "f32"), ("device", "host"), ("host", "device")] {
            assert!(
                contradicting_keys(&cfg(then), &cfg(now), 50).is_empty(),
                "{then} -> {now}"
            );
        }
        for (then, now) in [("bf16", "host"), ("f32", "bf16"), ("host", "bf16"), ("bf16", "f32")] {
            let keys = contradicting_keys(&cfg(then), &cfg(now), 50);
            assert_eq!(keys.len(), 1, "{then} -> {now}: {keys:?}");
            assert!(keys[0].starts_with("moments"), "{keys:?}");
        }
        // A scene checkpoint from before the key existed: the moments were on the device.
        assert!(contradicting_keys("steps = 100\n", "steps = 100\nmoments = \"host\"\n", 50).is_empty());
        assert_eq!(contradicting_keys("steps = 100\n", "steps = 40\n", 50).len(), 1);
    }
}
