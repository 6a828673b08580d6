//! From a budget to a run within it: probe ([`calibrate`]), choose
//! ([`Calibration::choose`]), verify the winner with a probe at the run's
//! own batch ([`verify`]), keep fallbacks, write `plan.json`, and run the
//! winner held to the budget, falling back to the next plan from the last
//! checkpoint on an out-of-memory ([`run_plans`]). [`run_within`] is all of
//! it in one call; the CLI calls the steps one by one to print between them.

use std::ops::ControlFlow;

use serde::{Deserialize, Serialize};

use super::{Calibration, Choice, Knobs, Measured, PlanError, Plannable, Planned, PlannedRun, calibrate};
use crate::run::{Event, Run, RunError, RunPath, Start, Workload};

/// Plans a verification may measure over the budget before the planner gives up.
pub const VERIFY_TRIES: usize = 3;

/// Plans kept after the winner, to fall back to on an out-of-memory.
pub const FALLBACKS: usize = 3;

/// The words of [`Runnable::simulated_oom`]'s error (the profiler's
/// out-of-memory reader recognises them as cubecl's).
pub const SIMULATED_OOM: &str = "simulated: out of memory (the planner's fallback test seam)";

/// A planning target whose plans run through the run driver: the settings
/// a plan gives, and a run opened with its workload, new or resumed in its
/// directory under another plan after an out-of-memory.
pub trait Runnable {
    /// What a plan sets: [`Knobs`] for the knob model, a rung for a ladder.
    type Plan;
    /// A run's settings (what its `config.toml` holds).
    type Settings: Clone;
    /// The workload a run drives.
    type Workload: Workload;
    /// Its errors, a run's among them.
    type Error: From<RunError> + std::fmt::Display;

    /// The settings that run `plan` at the run's own shape.
    fn settings(&self, plan: &Self::Plan) -> Self::Settings;
    /// `settings` as `config.toml`.
    fn to_toml(settings: &Self::Settings) -> String;
    /// A new run (`Start::New`) or the run in a directory resumed with the
    /// settings written there (`Start::Resume`), with its workload. Empties
    /// the device's pools first: a fallback's budget is read from them.
    fn launch(&self, start: Start<Self::Settings>) -> Result<(Run, Self::Workload), Self::Error>;
    /// True when `error` is a device out-of-memory (or a budget passed).
    fn is_oom(error: &Self::Error) -> bool;
    /// The workload's error for a device out-of-memory at `step`, in the
    /// backend's words: what [`Options::simulate_oom_at`] injects.
    fn simulated_oom(step: u64) -> <Self::Workload as Workload>::Error;
}

/// A choice whose winner a probe at the run's own batch measured within
/// the budget.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Verified {
    /// The plans that fit, the verified winner first (plans measured over
    /// the budget removed, `why` saying so).
    pub choice: Choice,
    /// The winner's verification probe.
    pub measured: Measured,
}

/// [`Calibration::choose`] for `budget`, its winner verified by a probe at
/// the run's batch: a winner measured over the budget is dropped and the
/// next one tried, [`VERIFY_TRIES`] at most.
pub fn verify(cal: &Calibration, target: &mut dyn Plannable, budget: u64) -> Result<Verified, PlanError> {
    let mut choice = cal.choose(budget)?;
    let batch = cal.space.batch;
    let mut rejected = Vec::new();
    while rejected.len() < VERIFY_TRIES {
        let Some(winner) = choice.plans.first() else { break };
        let measured = target.measure(&winner.knobs, batch).map_err(|why| PlanError::Probe {
            probe: format!("verifying {}", winner.knobs.describe(batch)),
            why,
        })?;
        if measured.peak_bytes <= budget {
            if !rejected.is_empty() {
                choice.why = format!(
                    "the {} plan(s) ranked above it measured over the budget ({}); this one measured {} bytes of {}",
                    rejected.len(),
                    rejected.join("; "),
                    measured.peak_bytes,
                    budget
                );
            }
            return Ok(Verified { choice, measured });
        }
        rejected.push(format!(
            "{}: predicted {} bytes, measured {}",
            winner.knobs.describe(batch),
            winner.peak_bytes,
            measured.peak_bytes
        ));
        choice.plans.remove(0);
    }
    Err(PlanError::Unverified {
        budget,
        rejected: rejected.join("; "),
    })
}

/// `plan.json`'s body for a verified choice: the budget, the winner and
/// its fallbacks, the verification, the model and its measured error.
pub fn record(cal: &Calibration, verified: &Verified, device: &str) -> serde_json::Value {
    let kept = &verified.choice.plans[..verified.choice.plans.len().min(1 + FALLBACKS)];
    serde_json::json!({
        "budget_bytes": verified.choice.budget,
        "device": device,
        "why": verified.choice.why,
        "margin": verified.choice.margin,
        "plans": kept,
        "verified": verified.measured,
        "model": cal.model,
        "model_peak_error": cal.peak_error,
        "model_time_error": cal.time_error,
        "probes": cal.probes.len() + cal.checks.len(),
        "probe_seconds": cal.seconds,
    })
}

/// How a planned run is run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Probe at this effective batch and extrapolate (`None`: the run's).
    pub probe_batch: Option<usize>,
    /// Where the run goes.
    pub out: RunPath,
    /// Test seam: the first plan fails with the backend's out-of-memory at
    /// this step, to exercise the fallback.
    pub simulate_oom_at: Option<u64>,
}

impl Options {
    /// A run at `out`, probed at the run's batch.
    pub fn new(out: RunPath) -> Self {
        Self {
            probe_batch: None,
            out,
            simulate_oom_at: None,
        }
    }
}

/// Why [`run_within`] could not give a run within the budget.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError<E: std::fmt::Display + std::fmt::Debug> {
    /// No plan: a probe failed, nothing fits, or nothing measured within.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The run failed (after every fallback, for an out-of-memory).
    #[error("{0}")]
    Run(E),
}

/// Runs `plans` (the winner first) into `options.out` with `record` as
/// `plan.json`, each attempt held to `budget` ([`Run::with_budget`]),
/// falling back to the next plan from the last checkpoint on an
/// out-of-memory ([`PlannedRun`]).
pub fn run_plans<T: Runnable>(
    target: &T,
    plans: &[T::Settings],
    record: serde_json::Value,
    budget: Option<u64>,
    options: &Options,
    observe: impl FnMut(Event) -> ControlFlow<()>,
) -> Result<Planned<<T::Workload as Workload>::Summary>, T::Error> {
    PlannedRun {
        plans,
        to_toml: T::to_toml,
        out: options.out.clone(),
        record,
        simulate_oom_at: options.simulate_oom_at,
        oom: T::simulated_oom,
        budget,
    }
    .run(|start| target.launch(start), T::is_oom, observe)
}

/// A run within a budget and how it was planned.
pub struct WithinBudget<S> {
    /// The verified choice (the winner and its fallbacks).
    pub verified: Verified,
    /// The run.
    pub planned: Planned<S>,
}

/// The one call: probe `target`, choose the fastest plan that fits
/// `budget` bytes of the device's deciding figure, verify it, and run it
/// with [`FALLBACKS`] fallbacks, held to the budget; `plan.json` in the run
/// directory says what was chosen and why, and which plan finished.
pub fn run_within<T>(
    target: &mut T,
    budget: u64,
    device: &str,
    options: &Options,
    observe: impl FnMut(Event) -> ControlFlow<()>,
) -> Result<WithinBudget<<T::Workload as Workload>::Summary>, BudgetError<T::Error>>
where
    T: Plannable + Runnable<Plan = Knobs>,
    T::Error: std::fmt::Debug,
{
    let cal = calibrate(target, options.probe_batch)?;
    let mut verified = verify(&cal, target, budget)?;
    verified.choice.plans.truncate(1 + FALLBACKS);
    let plans: Vec<T::Settings> = verified
        .choice
        .plans
        .iter()
        .map(|p| target.settings(&p.knobs))
        .collect();
    let record = record(&cal, &verified, device);
    // On the CPU the budget is the whole heap: the probes' records do not ride along.
    drop(cal);
    let planned = run_plans(target, &plans, record, Some(budget), options, observe).map_err(BudgetError::Run)?;
    Ok(WithinBudget { verified, planned })
}
