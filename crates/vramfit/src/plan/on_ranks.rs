//! A planned run on data-parallel ranks: the same pipeline as
//! [`super::run_within`], where one process is one rank. The plans per rank
//! are predicted from this process's one-rank probes
//! ([`Calibration::choose_on_ranks`]), the winner is verified by a probe on
//! the ranks (every rank measured), and the run goes to the ranks held to
//! the budget, falling back to the next plan from the ranks' last common
//! checkpoint when a rank runs out of memory (or passes the budget). The
//! ranks are other processes, so the caller starts them: a
//! [`RanksLauncher`] (`mpirun` in the CLI).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::pipeline::{Probed, verify_ranked};
use super::{
    BudgetError, Calibration, FALLBACKS, Fallback, Knobs, Measured, PlanError, ProbeError, Strategy, Verified,
};
use crate::run::atomic_write;
use crate::run::{align_checkpoints, rank_dirs};

/// A plan verified on data-parallel ranks: [`Verified`] (its `measured`
/// the rank that peaked highest) and every rank's probe.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerifiedOnRanks {
    /// The plans for the budget on the ranks, the verified winner first.
    pub verified: Verified<Knobs>,
    /// Each rank's probe of the winner, rank 0 first.
    pub ranks: Vec<Measured>,
}

/// [`Calibration::choose_on_ranks`] for `budget` on `ranks` ranks, its
/// winner verified by `probe`, which runs a plan on the ranks at the run's
/// shape and measures every rank (one process cannot: the prediction on
/// ranks is derived from one rank's probes). A winner any rank of which
/// measured over the budget is dropped and the next one tried,
/// [`super::VERIFY_TRIES`] at most.
pub fn verify_on_ranks(
    cal: &Calibration,
    budget: u64,
    ranks: usize,
    mut probe: impl FnMut(&Knobs) -> Result<Vec<Measured>, ProbeError>,
) -> Result<VerifiedOnRanks, PlanError> {
    let ranked = |rejected: &[Knobs]| {
        cal.choose_on_ranks(budget, ranks).map(|mut choice| {
            choice.plans.retain(|p| !rejected.contains(&p.setting));
            choice
        })
    };
    let measure = |winner: &super::Plan<Knobs>| {
        let failed = |why: String| PlanError::Probe {
            probe: format!("verifying {} on {ranks} ranks", cal.describe(&winner.setting)),
            why,
        };
        let each = probe(&winner.setting).map_err(|e| failed(e.to_string()))?;
        let Some((worst, measured)) = each.iter().enumerate().max_by_key(|(_, m)| m.peak_bytes) else {
            return Err(failed("no rank reported a peak".into()));
        };
        Ok(Probed {
            settled: winner.clone(),
            measured: *measured,
            on: format!(" on rank {worst}, the highest"),
            kept: each,
        })
    };
    let (verified, each) = verify_ranked(budget, ranked, |k| cal.describe(k), measure)?;
    Ok(VerifiedOnRanks { verified, ranks: each })
}

/// A job for the ranks, each rank running in its own folder of the run
/// directory ([`crate::run::rank_dir`]).
#[derive(Debug, Clone, Copy)]
pub enum RanksJob<'a> {
    /// A short probe of the settings in `config` (a `config.toml`) into the
    /// new run directory `dir`; what the ranks print may be dropped.
    Probe {
        /// The settings.
        config: &'a Path,
        /// The probe's run directory (new).
        dir: &'a Path,
    },
    /// The run of the settings in `config` into the new run directory
    /// `dir`, each rank held to `budget` bytes ([`crate::run::Run::with_budget`]).
    Run {
        /// The settings.
        config: &'a Path,
        /// The run directory (new).
        dir: &'a Path,
        /// Each rank's budget.
        budget: u64,
        /// Test seam: every rank fails with the backend's out-of-memory at
        /// this step, to exercise the fallback.
        simulate_oom_at: Option<u64>,
    },
    /// The run in `dir` resumed from its last checkpoint (the same on every
    /// rank) under the settings its `config.toml` now holds, a fallback
    /// plan's ([`crate::run::Run::with_new_settings`]), held to `budget`.
    Fallback {
        /// The run directory.
        dir: &'a Path,
        /// Each rank's budget.
        budget: u64,
    },
}

/// Starts the ranks on a job and waits until every rank has ended.
pub trait RanksLauncher {
    /// Runs `job` on the ranks; `Err`: the job failed (the launcher's
    /// error, or the failing rank's).
    fn launch(&mut self, job: RanksJob<'_>) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// What a planned run on ranks is: the knobs' settings as `config.toml`.
pub struct OnRanks<'a> {
    /// Ranks.
    pub ranks: usize,
    /// Each rank's budget (bytes of the deciding figure).
    pub budget: u64,
    /// The run directory (new).
    pub out: &'a Path,
    /// The device, as `plan.json` names it.
    pub device: &'a str,
    /// Test seam: the first plan fails at this step as an out-of-memory would.
    pub simulate_oom_at: Option<u64>,
}

/// A run on ranks within a budget and how it was planned.
#[derive(Debug, Clone)]
pub struct RanksWithinBudget {
    /// The verified choice and every rank's verification probe.
    pub verified: VerifiedOnRanks,
    /// Each rank's measurement of the run, rank 0 first.
    pub run: Vec<Measured>,
    /// Plans that ran out of memory on a rank, and which took over.
    pub fallbacks: Vec<Fallback>,
    /// `plan.json` in the run.
    pub record: PathBuf,
}

/// Plans `on.ranks` ranks within `on.budget` bytes each from `cal` (one
/// rank's probes), verifies the winner on the ranks and runs it there
/// with [`FALLBACKS`] fallbacks; `config(knobs, probe)` is a plan's
/// `config.toml` (`probe`: a short probe at the run's shape). `show` hears
/// of the verified choice before the run starts. `plan.json` in the run
/// says what was chosen, what every rank measured, and which plans fell
/// back. The probes' folders (beside the run, never in it) are removed.
pub fn run_within_on_ranks(
    cal: &Calibration,
    on: &OnRanks<'_>,
    config: impl Fn(&Knobs, bool) -> String,
    launcher: &mut impl RanksLauncher,
    show: impl FnOnce(&VerifiedOnRanks),
) -> Result<RanksWithinBudget, BudgetError<String>> {
    let name = on
        .out
        .file_name()
        .map_or("run".into(), |n| n.to_string_lossy().into_owned());
    let work = on.out.with_file_name(format!(".{name}.ranks-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| BudgetError::Run(format!("creating {}: {e}", work.display())))?;
    let result = plan_and_run(cal, on, &work, config, launcher, show);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn plan_and_run(
    cal: &Calibration,
    on: &OnRanks<'_>,
    work: &Path,
    config: impl Fn(&Knobs, bool) -> String,
    launcher: &mut impl RanksLauncher,
    show: impl FnOnce(&VerifiedOnRanks),
) -> Result<RanksWithinBudget, BudgetError<String>> {
    let write = |path: &Path, text: &[u8]| atomic_write(path, text).map_err(|e| format!("{}: {e}", path.display()));
    let mut tried = 0;
    let mut verified = verify_on_ranks(cal, on.budget, on.ranks, |knobs| {
        tried += 1;
        let file = work.join(format!("probe-{tried}.toml"));
        write(&file, config(knobs, true).as_bytes()).map_err(ProbeError::workload)?;
        let dir = work.join(format!("probe-{tried}"));
        launcher
            .launch(RanksJob::Probe {
                config: &file,
                dir: &dir,
            })
            .map_err(ProbeError::workload)?;
        rank_dirs(&dir).iter().map(|(_, d)| super::measured_in(d)).collect()
    })?;
    show(&verified);
    verified.verified.choice.plans.truncate(1 + FALLBACKS);
    let plans: Vec<String> = verified
        .verified
        .choice
        .plans
        .iter()
        .map(|p| config(&p.setting, false))
        .collect();
    let mut record = super::record(cal, &verified.verified, on.device);
    record["ranks"] = on.ranks.into();
    record["verified_ranks"] = serde_json::json!(verified.ranks);
    let record_path = on.out.join("plan.json");
    let write_record = |record: &serde_json::Value| {
        write(&record_path, &serde_json::to_vec_pretty(record).unwrap_or_default()).map_err(BudgetError::Run)
    };
    let mut fallbacks = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        record["running"] = i.into();
        let started = SystemTime::now();
        let ran = if i == 0 {
            let file = work.join("config.toml");
            write(&file, plan.as_bytes()).map_err(BudgetError::Run)?;
            launcher.launch(RanksJob::Run {
                config: &file,
                dir: on.out,
                budget: on.budget,
                simulate_oom_at: on.simulate_oom_at,
            })
        } else {
            // Every rank continues under the next plan from the newest
            // checkpoint all of them wrote.
            align_checkpoints(on.out).map_err(|e| BudgetError::Run(e.to_string()))?;
            for (_, dir) in rank_dirs(on.out) {
                write(&dir.join("config.toml"), plan.as_bytes()).map_err(BudgetError::Run)?;
            }
            launcher.launch(RanksJob::Fallback {
                dir: on.out,
                budget: on.budget,
            })
        };
        if on.out.is_dir() {
            write_record(&record)?;
        }
        match (ran, out_of_memory_since(on.out, started)) {
            (Ok(()), _) => {
                let run = rank_dirs(on.out)
                    .iter()
                    .map(|(_, d)| super::measured_in(d))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| BudgetError::Run(e.to_string()))?;
                record["run_ranks"] = serde_json::json!(run);
                if !fallbacks.is_empty() {
                    record["fallbacks"] = serde_json::json!(fallbacks);
                }
                write_record(&record)?;
                return Ok(RanksWithinBudget {
                    verified,
                    run,
                    fallbacks,
                    record: record_path,
                });
            }
            (Err(e), Some(oom)) if i + 1 < plans.len() => {
                fallbacks.push(Fallback {
                    from: i,
                    to: i + 1,
                    error: format!("{e}; {oom}"),
                });
                record["fallbacks"] = serde_json::json!(fallbacks);
            }
            (Err(e), Some(oom)) => {
                return Err(BudgetError::Run(format!(
                    "{e}; {oom}, and no plan is left to fall back to"
                )));
            }
            (Err(e), None) => return Err(BudgetError::Run(e.to_string())),
        }
    }
    Err(BudgetError::Plan(PlanError::Unverified {
        budget: on.budget,
        rejected: "no plan was left to run".into(),
    }))
}

/// The ranks whose `oom.json` was written since `since`, in words
/// (`None`: no rank ran out of memory then).
fn out_of_memory_since(root: &Path, since: SystemTime) -> Option<String> {
    let ranks: Vec<String> = rank_dirs(root)
        .iter()
        .filter(|(_, dir)| {
            std::fs::metadata(dir.join("oom.json"))
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= since)
        })
        .map(|(r, dir)| format!("rank {r} ran out of memory ({})", dir.join("oom.json").display()))
        .collect();
    (!ranks.is_empty()).then(|| ranks.join(", "))
}
