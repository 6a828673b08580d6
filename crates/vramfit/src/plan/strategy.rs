//! What every planning strategy gives, and the result types they share.
//! Two strategies implement [`Strategy`]: the knob model ([`Calibration`],
//! probing a [`Plannable`]) and the ladder of one ordered knob
//! ([`LadderCalibration`], probing a [`Ladder`]). The pipeline
//! ([`super::verify`], [`super::run_within`]), the CLI's printing and the
//! benchmarks are written once against this trait.

use std::fmt::Debug;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{
    Calibration, Capacity, CapacityCalibration, Counted, Knobs, Ladder, LadderCalibration, Measured, Plannable,
};

/// One plan: what it sets and what the strategy predicts for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound = "S: Serialize + DeserializeOwned")]
pub struct Plan<S> {
    /// What the plan sets: [`Knobs`], or a ladder's rung. (Records written
    /// before the two strategies shared this type named it `knobs` or
    /// `value`; both still read.)
    #[serde(alias = "knobs", alias = "value")]
    pub setting: S,
    /// Predicted peak of the OOM-deciding figure (bytes).
    pub peak_bytes: u64,
    /// Predicted step time (ms).
    pub step_ms: f64,
    /// What it changes in the numerics (empty: exact up to summation order).
    #[serde(default)]
    pub quality: Vec<String>,
}

impl<S> Plan<S> {
    /// True when the plan keeps the numerics (up to summation order).
    pub fn exact(&self) -> bool {
        self.quality.is_empty()
    }
}

/// The plans that fit a budget, best first, and why the first won.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound = "S: Serialize + DeserializeOwned")]
pub struct Choice<S> {
    /// The budget (bytes).
    pub budget: u64,
    /// The safety margin applied to predicted peaks.
    pub margin: f64,
    /// Plans that fit, the winner first, then the fallbacks in order.
    pub plans: Vec<Plan<S>>,
    /// Why the winner won, in words.
    pub why: String,
}

/// One card size's plan (or why nothing fits): a row of a preset table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound = "S: Serialize + DeserializeOwned")]
pub struct Preset<S> {
    /// The card's memory (bytes).
    pub budget: u64,
    /// The winner, if anything fits.
    pub plan: Option<Plan<S>>,
    /// Plans that fit.
    pub fitting: usize,
    /// Why nothing fits, where nothing does.
    pub error: Option<String>,
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A setting of the planner.
    #[error("{0}")]
    Setting(String),
    /// A probe failed.
    #[error("the probe {probe} failed: {why}")]
    Probe {
        /// Which probe, with its knobs.
        probe: String,
        /// What went wrong.
        why: String,
    },
    /// The plans that fit by prediction measured over the budget when verified.
    #[error(
        "no plan measured within {budget} bytes when verified at the run's batch: {rejected}. Raise the budget by a \
         few per cent"
    )]
    Unverified {
        /// The budget (bytes).
        budget: u64,
        /// Each plan tried, predicted and measured.
        rejected: String,
    },
    /// The ranks cannot share any split of the batch.
    #[error(
        "{ranks} ranks cannot share a batch of {batch} evenly: no split of it into micro-batches gives each rank \
         as many; give a rank count that divides the batch (or a batch that {ranks} divides)"
    )]
    UnevenRanks {
        /// The ranks asked for.
        ranks: usize,
        /// The effective batch.
        batch: usize,
    },
    /// Nothing fits the budget.
    #[error(
        "no plan fits {budget}: the leanest plan, {knobs}, is predicted to peak at {least}; with the {margin:.0} % \
         safety margin, rounded up to a MiB, a budget that works is {smallest} (--budget {smallest_bytes})"
    )]
    Infeasible {
        /// The budget, in words.
        budget: String,
        /// The least predicted peak, in words.
        least: String,
        /// The plan reaching it.
        knobs: String,
        /// Safety margin in percent.
        margin: f64,
        /// The smallest budget that works, in words.
        smallest: String,
        /// The same in bytes.
        smallest_bytes: u64,
    },
}

/// A way to plan a workload: calibrated by probing it, it chooses the
/// plans that fit a budget.
pub trait Strategy: Serialize + Sized {
    /// What a plan sets.
    type Setting: Clone + PartialEq + Debug + Serialize + DeserializeOwned;
    /// The workload as this strategy probes it.
    type Target: ?Sized;

    /// Probes `target` (at effective batch `probe_batch` where the strategy
    /// extrapolates; `None`: the run's own shape).
    fn calibrate(target: &mut Self::Target, probe_batch: Option<usize>) -> Result<Self, PlanError>;
    /// The plans that fit `budget` with the margin, best first, or an
    /// error naming the smallest budget that works.
    fn choose(&self, budget: u64) -> Result<Choice<Self::Setting>, PlanError>;
    /// The safety margin on predicted peaks (a fraction).
    fn margin(&self) -> f64;
    /// Runs a probe of `setting` at the run's own shape.
    fn measure(&self, target: &mut Self::Target, setting: &Self::Setting) -> Result<Measured, String>;
    /// Verifies `plan` for `budget` by measurement ([`super::verify`]): the
    /// plan to run and its measurement. By default one probe of the plan
    /// as it is; a strategy whose setting is continuous may move it to
    /// where measurements put the budget (the capacity's count).
    fn settle(
        &self,
        target: &mut Self::Target,
        plan: &Plan<Self::Setting>,
        _budget: u64,
    ) -> Result<(Plan<Self::Setting>, Measured), String> {
        Ok((plan.clone(), self.measure(target, &plan.setting)?))
    }
    /// `setting` in words, for tables.
    fn describe(&self, setting: &Self::Setting) -> String;
    /// How the choice was made, for `plan.json`: the probes' count and
    /// time and the strategy's measured error.
    fn account(&self) -> serde_json::Value;

    /// The winner for each budget (card sizes): the preset table.
    fn presets(&self, budgets: &[u64]) -> Vec<Preset<Self::Setting>> {
        budgets
            .iter()
            .map(|&budget| match self.choose(budget) {
                Ok(choice) => Preset {
                    budget,
                    fitting: choice.plans.len(),
                    plan: choice.plans.into_iter().next(),
                    error: None,
                },
                Err(e) => Preset {
                    budget,
                    plan: None,
                    fitting: 0,
                    error: Some(e.to_string()),
                },
            })
            .collect()
    }
}

impl Strategy for Calibration {
    type Setting = Knobs;
    type Target = dyn Plannable;

    fn calibrate(target: &mut (dyn Plannable + 'static), probe_batch: Option<usize>) -> Result<Self, PlanError> {
        super::calibrate(target, probe_batch)
    }
    fn choose(&self, budget: u64) -> Result<Choice<Knobs>, PlanError> {
        self.choose_knobs(budget)
    }
    /// Twice the largest shortfall measured on the probes and checks, at
    /// least 3 %. (Predictions above the measurement cost memory, not
    /// safety; on a paged allocator they are mostly the rounding up to
    /// whole pages.)
    fn margin(&self) -> f64 {
        (2.0 * self.shortfall).max(0.03)
    }
    fn measure(&self, target: &mut (dyn Plannable + 'static), knobs: &Knobs) -> Result<Measured, String> {
        target.measure(knobs, self.space.batch)
    }
    fn describe(&self, knobs: &Knobs) -> String {
        knobs.describe(self.space.batch)
    }
    fn account(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "model_peak_error": self.peak_error,
            "model_time_error": self.time_error,
            "probes": self.probes.len() + self.checks.len(),
            "probe_seconds": self.seconds,
        })
    }
}

impl Strategy for LadderCalibration {
    type Setting = usize;
    type Target = dyn Ladder;

    fn calibrate(target: &mut (dyn Ladder + 'static), probe_batch: Option<usize>) -> Result<Self, PlanError> {
        if let Some(batch) = probe_batch {
            return Err(PlanError::Setting(format!(
                "a probe batch ({batch}) does not apply to {}: each rung is probed at the run's own shape",
                target.knob()
            )));
        }
        super::calibrate_ladder(target)
    }
    fn choose(&self, budget: u64) -> Result<Choice<usize>, PlanError> {
        self.choose_rung(budget)
    }
    /// Twice the repeat's relative difference, at least 3 %.
    fn margin(&self) -> f64 {
        (2.0 * self.repeat_error).max(0.03)
    }
    fn measure(&self, target: &mut (dyn Ladder + 'static), value: &usize) -> Result<Measured, String> {
        target.measure(*value)
    }
    fn describe(&self, value: &usize) -> String {
        self.rungs
            .iter()
            .find(|r| r.value == *value && !r.label.is_empty())
            .map_or_else(|| format!("{} {value}", self.knob), |r| r.label.clone())
    }
    fn account(&self) -> serde_json::Value {
        serde_json::json!({
            "knob": self.knob,
            "rungs": self.rungs,
            "repeat_error": self.repeat_error,
            "time_error": self.time_error,
            "probes": self.rungs.len() + usize::from(self.repeat.is_some()),
            "probe_seconds": self.seconds,
        })
    }
}

impl Strategy for CapacityCalibration {
    type Setting = Counted;
    type Target = dyn Capacity;

    fn calibrate(target: &mut (dyn Capacity + 'static), probe_batch: Option<usize>) -> Result<Self, PlanError> {
        if let Some(batch) = probe_batch {
            return Err(PlanError::Setting(format!(
                "a probe batch ({batch}) does not apply to {}: each variant is probed at several counts",
                target.knob()
            )));
        }
        super::calibrate_capacity(target)
    }
    fn choose(&self, budget: u64) -> Result<Choice<Counted>, PlanError> {
        self.choose_count(budget)
    }
    fn margin(&self) -> f64 {
        CapacityCalibration::margin(self)
    }
    fn measure(&self, target: &mut (dyn Capacity + 'static), setting: &Counted) -> Result<Measured, String> {
        target.measure(&setting.variant, setting.count)
    }
    fn settle(
        &self,
        target: &mut (dyn Capacity + 'static),
        plan: &Plan<Counted>,
        budget: u64,
    ) -> Result<(Plan<Counted>, Measured), String> {
        self.settle_with_faster(target, plan, budget)
    }
    fn describe(&self, setting: &Counted) -> String {
        format!("{}, {} {}", setting.variant, self.knob, setting.count)
    }
    fn account(&self) -> serde_json::Value {
        serde_json::json!({
            "knob": self.knob,
            "lines": self.lines,
            "probes": self.lines.iter().map(|l| l.probes.len()).sum::<usize>(),
            "probe_seconds": self.seconds,
        })
    }
}
