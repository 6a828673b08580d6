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

use serde::Serialize;
use serde_json::json;

use super::errors::{DevicePanic, OverBudget};
use super::resume::contradicting_keys;
use super::session::Session;
use super::workload::{Event, RunSummary, Workload};
use crate::remedy::Remedy;

use super::{ArrayFile, OutOfMemoryError, RunDir, RunDirError, RunError, checkpoints_newest_first};
use crate::profile::{MemoryReport, Profiler, oom_report, out_of_memory};

/// Profiled steps kept in the memory timeline.
const PROFILE_KEEP_STEPS: u64 = 200;

/// The last step `metrics.jsonl` logged (0: none, or no log).
fn last_logged_step(path: &Path) -> u64 {
    crate::files::read::read(path, crate::files::read::Links::Refuse)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .ok()
        .and_then(|text| text.lines().rev().find_map(super::metrics_log::line_step))
        .unwrap_or(0)
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
        let started = crate::files::read::read_text(&dir.path(WORKLOAD_FILE), crate::files::read::Links::Refuse);
        let unnamed = started.is_err().then(|| workload.to_string());
        if let Ok(started) = started {
            let started = started.trim();
            // Only what vramfit writes is repeated back: an edited file
            // could name anything (a shell command, even).
            let plain = started.len() <= 64
                && started
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_' | ':' | '.'));
            if started != workload && (!plain || started.is_empty()) {
                return Err(not_resumable(format!(
                    "its {WORKLOAD_FILE} file does not hold a command vramfit writes (it was edited); resume it with \
                     the command that started it"
                ))
                .into());
            }
            if started != workload {
                let how = Remedy::ResumeWith {
                    command: started.to_string(),
                    dir: out.to_path_buf(),
                };
                return Err(not_resumable(format!("it is a run of {started}, not of {workload}: {how}")).into());
            }
        }
        let path = dir.path("config.toml");
        let text = crate::files::read::read_text(&path, crate::files::read::Links::Refuse)
            .map_err(|e| not_resumable(format!("{}: {e}", path.display())))?;
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
                let resumable = workload.resumable();
                let keys = contradicting_keys(&resumable, then, &self.config, step);
                if !keys.is_empty() {
                    return Err(RunError::ConfigEdited {
                        dir: self.dir.root().into(),
                        checkpoint: name,
                        keys: keys.join("; "),
                        may_change: resumable.describe(),
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
        let _armed = super::allocation_failure::arm(self.dir.root().into());
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
            dir: &self.dir,
            device: &self.device,
            config: &self.config,
            budget: self.budget,
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
                     space and {}, which repeats the steps after its last checkpoint",
                    Remedy::Resume(self.dir.root().into())
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
