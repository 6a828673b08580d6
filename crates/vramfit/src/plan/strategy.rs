//! What every planning strategy gives, and the result types they share.
//! Three strategies implement [`Strategy`], each beside its calibration:
//! the knob model ([`super::Calibration`], probing a [`super::Plannable`]),
//! the ladder of one ordered knob ([`super::LadderCalibration`]) and the
//! capacity lines of a counted quantity ([`super::CapacityCalibration`]). The pipeline
//! ([`super::verify`], [`super::run_within`]), the CLI's printing and the
//! benchmarks are written once against this trait.

use std::fmt::Debug;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Measured;
use crate::plan::ProbeError;
use crate::remedy::Remedy;

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
         safety margin, rounded up to a MiB, a budget that works is {smallest} ({})",
        Remedy::Budget(*smallest_bytes)
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
    fn measure(&self, target: &mut Self::Target, setting: &Self::Setting) -> Result<Measured, ProbeError>;
    /// Verifies `plan` for `budget` by measurement ([`super::verify`]): the
    /// plan to run and its measurement. By default one probe of the plan
    /// as it is; a strategy whose setting is continuous may move it to
    /// where measurements put the budget (the capacity's count).
    fn settle(
        &self,
        target: &mut Self::Target,
        plan: &Plan<Self::Setting>,
        _budget: u64,
    ) -> Result<(Plan<Self::Setting>, Measured), ProbeError> {
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
