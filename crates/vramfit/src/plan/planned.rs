//! A planned run: the winner's settings run through the run driver, with
//! `plan.json` beside them; when the device still runs out of memory, the
//! run's settings are rewritten to the next plan and the run resumes from
//! its last checkpoint, so the steps since it run again under the new plan
//! and none is missing. One copy for every workload.

use std::ops::ControlFlow;
use std::path::PathBuf;

use super::{Fallback, with_fallback};
use crate::run::{Event, FailAt, Run, RunError, RunPath, RunSummary, Start, Workload, atomic_write};

/// How a planned run went.
pub struct Planned<S> {
    /// The run directory.
    pub dir: PathBuf,
    /// Its summary (`None`: the observer stopped it).
    pub summary: Option<RunSummary<S>>,
    /// Plans that ran out of memory, and which took over.
    pub fallbacks: Vec<Fallback>,
}

/// What a planned run needs from its workload.
pub struct PlannedRun<'a, C, W: Workload> {
    /// Each plan's settings, the winner first.
    pub plans: &'a [C],
    /// Settings as the run directory's `config.toml`.
    pub to_toml: fn(&C) -> String,
    /// Where the run goes.
    pub out: RunPath,
    /// What is written as `plan.json` (`running` and `fallbacks` are added).
    pub record: serde_json::Value,
    /// Makes plan 0 fail at this step with `oom(step)` (a test seam, as [`FailAt`]).
    pub simulate_oom_at: Option<u64>,
    /// The workload's error for a device out-of-memory at a step (for the seam).
    pub oom: fn(u64) -> W::Error,
    /// The budget each attempt is held to ([`Run::with_budget`]): going past
    /// it falls back as an out-of-memory does. `None`: only the device's limit.
    pub budget: Option<u64>,
}

impl<C: Clone, W: Workload> PlannedRun<'_, C, W> {
    /// Runs the plans in turn (see the module). `launch` opens a new run or
    /// resumes one. A run that the driver stopped with an out-of-memory
    /// ([`RunError::OutOfMemory`], a budget passed among them) falls back
    /// to the next plan; any other error ends the run.
    pub fn run<E: From<RunError> + std::fmt::Display>(
        mut self,
        mut launch: impl FnMut(Start<C>) -> Result<(Run, W), E>,
        mut observe: impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Planned<W::Summary>, E> {
        let mut dir: Option<PathBuf> = None;
        let write_record = |d: &std::path::Path, record: &serde_json::Value| {
            let path = d.join("plan.json");
            crate::files::outputs::no_link_below(d, &path)
                .and_then(|()| atomic_write(&path, &serde_json::to_vec_pretty(record).unwrap_or_default()))
                .map_err(|e| RunError::Write {
                    path: path.clone(),
                    why: e.to_string(),
                })
        };
        let result = with_fallback(
            self.plans.len(),
            |i, resumed| {
                self.record["running"] = serde_json::json!(i);
                let start = match (&dir, resumed) {
                    (Some(d), true) => {
                        // The next plan's settings replace the failed one's; the
                        // checkpoints hold what every plan of the workload reads.
                        let path = d.join("config.toml");
                        crate::files::outputs::no_link_below(d, &path)
                            .and_then(|()| atomic_write(&path, (self.to_toml)(&self.plans[i]).as_bytes()))
                            .map_err(|e| RunError::Write {
                                path: path.clone(),
                                why: e.to_string(),
                            })?;
                        write_record(d, &self.record)?;
                        Start::Resume(d.clone())
                    }
                    _ => Start::New(self.plans[i].clone(), self.out.clone()),
                };
                let (run, workload) = launch(start).map_err(Attempt::Launch)?;
                // A fallback continues the run under the next plan's settings.
                let run = if resumed { run.with_new_settings() } else { run };
                let run = match self.budget {
                    Some(bytes) => run.with_budget(bytes),
                    None => run,
                };
                if !resumed {
                    write_record(run.dir().root(), &self.record)?;
                    dir = Some(run.dir().root().to_path_buf());
                }
                Ok(match self.simulate_oom_at.filter(|_| i == 0) {
                    Some(step) => run.drive(
                        FailAt {
                            inner: workload,
                            step,
                            fail: self.oom,
                        },
                        &mut observe,
                    )?,
                    None => run.drive(workload, &mut observe)?,
                })
            },
            |failed| matches!(failed, Attempt::Run(RunError::OutOfMemory(_))),
        );
        let (summary, fallbacks) = result.map_err(|failed| match failed {
            Attempt::Launch(e) => e,
            Attempt::Run(e) => E::from(e),
        })?;
        let dir = dir.expect("the first attempt created the run directory");
        if !fallbacks.is_empty() {
            self.record["fallbacks"] = serde_json::json!(fallbacks);
            let _ = write_record(&dir, &self.record);
        }
        Ok(Planned {
            dir,
            summary,
            fallbacks,
        })
    }
}

/// Why one plan's attempt failed: opening its run (the workload's error),
/// or the run itself (the driver's, an out-of-memory among them).
#[derive(Debug, thiserror::Error)]
enum Attempt<E: std::fmt::Display> {
    #[error("{0}")]
    Launch(E),
    #[error(transparent)]
    Run(#[from] RunError),
}
