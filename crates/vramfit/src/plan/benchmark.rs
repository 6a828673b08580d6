//! The planner against measurement, for any strategy (`vramfit bench
//! plan`, `plan-splat`, `plan-scene`): at budgets from infeasible to ample
//! the chosen plan is run and its planned peak held against the measured
//! one; an exhaustive sweep finds the best plan that measured within each
//! budget, which is measured again beside the chosen one (the least of many
//! noisy timings is biased low: the ratio is of two measurements taken
//! under the same conditions). The knob model adds the extrapolation error
//! of a calibration at a quarter of the batch.
//!
//! What each strategy sweeps, and which budgets it is asked for, is
//! [`Benched`]; [`benchmark`] runs the whole comparison and returns it as
//! data ([`Benchmark`]) with its table and record.

use serde::Serialize;
use serde_json::json;

use super::{
    Calibration, CapacityCalibration, Choice, Counted, Knobs, LadderCalibration, Measured, PROBE_STEPS, Plan,
    PlanError, ProbeError, Strategy,
};
use crate::profile::human_bytes;

/// What the benchmark needs of a strategy beyond planning.
pub trait Benched: Strategy {
    /// Every setting of the exhaustive sweep.
    fn sweep(&self) -> Vec<Self::Setting>;
    /// The budgets to plan for, ascending: an infeasible one first, then
    /// `fractions` of the peak of the plan that turns no knob.
    fn budgets(&self, fractions: &[f64]) -> Vec<u64>;
    /// True when `setting` keeps the numerics (a numerically exact winner
    /// is compared with exact swept plans only).
    fn exact(&self, setting: &Self::Setting) -> bool;
    /// The calibration and the sweep in words.
    fn summary(&self, swept: usize) -> String;
    /// A second calibration that extrapolates, to measure its error (the
    /// knob model's at a quarter of the batch), or none; `progress` hears
    /// that it starts.
    fn extrapolating(
        &self,
        _target: &mut Self::Target,
        _progress: &mut dyn FnMut(&str),
    ) -> Result<Option<Self>, PlanError> {
        Ok(None)
    }
    /// The peak this calibration predicts for `setting`.
    fn predicted_peak(&self, setting: &Self::Setting) -> f64;
    /// Whether swept `candidate` is compared with the chosen `winner`
    /// (besides measuring within the budget and its exactness).
    fn comparable(&self, _winner: &Self::Setting, _candidate: &Self::Setting) -> bool {
        true
    }
    /// The best swept plan within a budget is the least of this: by
    /// default its measured step time.
    fn swept_rank(&self, _setting: &Self::Setting, measured: &Measured) -> f64 {
        measured.step_ms
    }
    /// True when the plan a run gets is the verified one, moved by
    /// measurement ([`Strategy::settle`]): the benchmark then measures
    /// that, not the choice's first plan as predicted.
    fn settles(&self) -> bool {
        false
    }
    /// The winner against the best swept plan, where a step-time ratio
    /// does not say how close it came.
    fn versus(&self, _winner: &Self::Setting, _best: &Self::Setting) -> Option<String> {
        None
    }
    /// This calibration, made by [`Benched::extrapolating`], in words.
    fn as_extrapolation(&self) -> String {
        String::new()
    }
}

impl Benched for Calibration {
    /// Precision × micro-batch × cleanup (the planner's own combinations,
    /// storage and moments at f32 on the device, attention unfused) ×
    /// checkpointed blocks (the first k, every k).
    fn sweep(&self) -> Vec<Knobs> {
        let blocks = self.space.blocks;
        self.space
            .combinations(1)
            .into_iter()
            .filter(|k| k.low_storage == 0 && !k.low_moments && !k.host_moments && !k.fused_attention)
            .flat_map(|knobs| {
                (0..=blocks).map(move |k| Knobs {
                    checkpointed: (0..blocks).map(|i| i < k).collect(),
                    ..knobs.clone()
                })
            })
            .collect()
    }

    fn budgets(&self, fractions: &[f64]) -> Vec<u64> {
        let plain = self.predict(&Knobs::base(self.space.blocks, self.space.batch)).0;
        let mut budgets = vec![(self.leanest().peak_bytes as f64 * 0.8) as u64];
        budgets.extend(fractions.iter().map(|f| (plain * f) as u64));
        budgets
    }

    fn exact(&self, knobs: &Knobs) -> bool {
        knobs.quality_costs(&self.space).is_empty()
    }

    fn summary(&self, swept: usize) -> String {
        format!(
            "Calibration: {} probes in {:.1} s; model error on the combinations it was not fitted on: peak ±{:.1} %, \
             time ±{:.1} %; margin {:.0} %{}. Sweep: {swept} plans (precision × micro-batch × checkpointed blocks × \
             cleanup; none with --no-sweep), each measured for {PROBE_STEPS} steps; storage and moment precision are \
             not swept.",
            self.probes.len() + self.checks.len(),
            self.seconds,
            self.peak_error * 100.0,
            self.time_error * 100.0,
            self.margin() * 100.0,
            if self.model.page_bytes > 1 {
                format!("; allocator pages {}", human_bytes(self.model.page_bytes))
            } else {
                String::new()
            },
        )
    }

    /// A calibration at the largest divisor of the batch up to a quarter
    /// of it (at least 2), or none.
    fn extrapolating(
        &self,
        target: &mut Self::Target,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Option<Self>, PlanError> {
        let batch = self.space.batch;
        let Some(quarter) = (1..=batch / 4)
            .rev()
            .find(|d| batch.is_multiple_of(*d))
            .filter(|d| *d >= 2)
        else {
            return Ok(None);
        };
        progress(&format!(
            "calibrating at batch {quarter} (for the extrapolation error)…"
        ));
        Self::calibrate(target, Some(quarter)).map(Some)
    }

    fn predicted_peak(&self, knobs: &Knobs) -> f64 {
        self.predict(knobs).0
    }

    fn as_extrapolation(&self) -> String {
        format!(
            " Extrapolation: a second calibration at batch {} ({:.1} s) predicts the chosen plans at batch {}.",
            self.probe_batch, self.seconds, self.space.batch
        )
    }
}

impl Benched for LadderCalibration {
    /// Every tile multiple (16 rows) up to the ladder's top, not only its doublings.
    fn sweep(&self) -> Vec<usize> {
        match self.rungs.as_slice() {
            [one] if one.value == 0 => vec![0],
            rungs => (16..=rungs.last().map_or(16, |r| r.value)).step_by(16).collect(),
        }
    }

    /// An infeasible budget, each distinct rung's level with the margin,
    /// twice the top's, and `fractions` of the top's.
    fn budgets(&self, fractions: &[f64]) -> Vec<u64> {
        let least = self.rungs[0].peak_bytes;
        let top = self.rungs.last().map_or(least, |r| r.peak_bytes);
        let mut budgets = vec![least * 4 / 5];
        let mut levels: Vec<u64> = self.rungs.iter().map(|r| r.peak_bytes).collect();
        levels.dedup();
        budgets.extend(levels.iter().map(|l| (*l as f64 * (1.0 + self.margin())).ceil() as u64));
        budgets.push(2 * top);
        budgets.extend(fractions.iter().map(|f| (top as f64 * f) as u64));
        budgets.sort_unstable();
        budgets.dedup();
        budgets
    }

    fn exact(&self, _: &usize) -> bool {
        true
    }

    fn summary(&self, swept: usize) -> String {
        format!(
            "Calibration: {} rungs ({:?}) and a repeat of the largest, {PROBE_STEPS} steps each, in {:.1} s; repeat \
             {:.2} % off, margin {:.0} %; time fit a + b/{} within {:.1} % of the rungs. Sweep: {swept} settings (every \
             multiple of 16 rows up to the top rung).",
            self.rungs.len(),
            self.rungs.iter().map(|r| r.value).collect::<Vec<_>>(),
            self.seconds,
            self.repeat_error * 100.0,
            self.margin() * 100.0,
            self.knob,
            self.time_error * 100.0,
        )
    }

    fn predicted_peak(&self, value: &usize) -> f64 {
        self.rungs
            .iter()
            .find(|r| r.value == *value)
            .map_or(f64::NAN, |r| r.peak_bytes as f64)
    }
}

impl Benched for CapacityCalibration {
    /// Every variant at counts 8 % apart, from the count asked for down to
    /// the smallest probe above the seeded count.
    fn sweep(&self) -> Vec<Counted> {
        let smallest = self
            .lines
            .iter()
            .flat_map(|l| l.probes.iter().map(|p| p.0).find(|&c| c > self.least))
            .min()
            .unwrap_or(1);
        let mut out = Vec::new();
        for l in &self.lines {
            let mut count = self.wanted.min(l.variant.limit) as f64;
            while count >= smallest as f64 {
                out.push(Counted {
                    variant: l.variant.name.clone(),
                    count: count as usize,
                });
                count *= 0.92;
            }
        }
        out
    }

    /// An infeasible budget, `fractions` of the leanest variant's peak at
    /// the count asked for (where the count must give), and the first
    /// variant's with the margin and 5 % (ample: the plain plan holds it all).
    fn budgets(&self, fractions: &[f64]) -> Vec<u64> {
        let least = self.least.min(self.wanted);
        let lowest = self.lines.iter().map(|l| l.peak(least)).min().unwrap_or(0);
        let leanest = self.lines.iter().map(|l| l.peak(self.wanted)).min().unwrap_or(0) as f64;
        let mut budgets = vec![lowest * 4 / 5];
        budgets.extend(fractions.iter().map(|f| (leanest * f) as u64));
        budgets.push((self.lines[0].peak(self.wanted) as f64 * (1.0 + self.margin()) * 1.05) as u64);
        budgets.sort_unstable();
        budgets.dedup();
        budgets
    }

    fn exact(&self, setting: &Counted) -> bool {
        self.line(&setting.variant)
            .is_some_and(|l| l.variant.quality.is_empty())
    }

    fn summary(&self, swept: usize) -> String {
        format!(
            "Calibration: {} variants probed at {:?} {} in {:.1} s; margin {:.0} %. Sweep: {swept} settings (each \
             variant at counts 8 % apart up to the {} asked for).",
            self.lines.len(),
            self.lines
                .first()
                .map(|l| l.probes.iter().map(|p| p.0).collect::<Vec<_>>()),
            self.knob,
            self.seconds,
            self.margin() * 100.0,
            self.wanted,
        )
    }

    fn predicted_peak(&self, setting: &Counted) -> f64 {
        self.line(&setting.variant)
            .map_or(f64::NAN, |l| l.peak(setting.count) as f64)
    }

    /// The same variant: the question is how close to its largest count
    /// within the budget the plan came.
    fn comparable(&self, winner: &Counted, candidate: &Counted) -> bool {
        winner.variant == candidate.variant
    }

    fn settles(&self) -> bool {
        true
    }

    /// The largest count is best.
    fn swept_rank(&self, setting: &Counted, _: &Measured) -> f64 {
        -(setting.count as f64)
    }

    fn versus(&self, winner: &Counted, best: &Counted) -> Option<String> {
        Some(format!(
            "{} {} = {:.3} × the largest swept within",
            self.knob,
            winner.count,
            winner.count as f64 / best.count.max(1) as f64
        ))
    }
}

/// What stopped a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A calibration failed.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A swept or chosen plan's measurement failed.
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// One swept setting and what it measured.
#[derive(Debug, Clone, Serialize)]
pub struct Swept<S> {
    /// The setting.
    pub setting: S,
    /// Its probe.
    pub measured: Measured,
}

/// What one budget got.
#[derive(Debug)]
pub enum Outcome<S> {
    /// The strategy chose no plan: none fits by prediction (the error
    /// names the least budget), or another of `choose`'s errors.
    Infeasible(PlanError),
    /// A settling strategy's verification found no plan within the budget.
    NotVerified(PlanError),
    /// The chosen plan, measured, against the best swept one.
    Chosen(Box<Chosen<S>>),
}

/// The chosen plan for a budget, measured, and what it is held against.
#[derive(Debug)]
pub struct Chosen<S> {
    /// The choice (its winner first).
    pub choice: Choice<S>,
    /// The winner's probe.
    pub measured: Measured,
    /// Planned over measured peak, less one.
    pub error: f64,
    /// The best swept plan that measured within the budget (an index into
    /// [`Benchmark::sweep`]), comparable with the winner.
    pub best_swept: Option<usize>,
    /// That plan measured again beside the winner.
    pub best_again: Option<Measured>,
    /// The extrapolating calibration's predicted peak for the winner.
    pub extrapolated_peak: Option<f64>,
}

impl<S> Chosen<S> {
    /// The winner.
    pub fn winner(&self) -> &Plan<S> {
        &self.choice.plans[0]
    }
}

/// A budget and what it got.
#[derive(Debug)]
pub struct BudgetRow<S> {
    /// The budget (bytes).
    pub budget: u64,
    /// What it got.
    pub outcome: Outcome<S>,
}

/// A whole benchmark: the calibration, the sweep and every budget's row.
pub struct Benchmark<B: Benched> {
    /// The calibration at the run's shape.
    pub calibration: B,
    /// The extrapolating one, where the strategy makes one.
    pub extrapolating: Option<B>,
    /// Every swept setting, measured (empty without the sweep).
    pub sweep: Vec<Swept<B::Setting>>,
    /// One row a budget, in the strategy's order (an infeasible one first).
    pub rows: Vec<BudgetRow<B::Setting>>,
}

/// Runs the benchmark on `target`: the calibration (and the extrapolating
/// one), the sweep where `sweep`, then each of the strategy's budgets for
/// `fractions`. `progress` hears what starts, in words (each probe takes a
/// while).
pub fn benchmark<B: Benched>(
    target: &mut B::Target,
    fractions: &[f64],
    sweep: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Benchmark<B>, BenchError> {
    progress("calibrating…");
    let cal = B::calibrate(target, None)?;
    let small = cal.extrapolating(target, progress)?;
    let mut swept = Vec::new();
    for setting in cal.sweep().into_iter().filter(|_| sweep) {
        progress(&format!("sweep {}: {}", swept.len() + 1, cal.describe(&setting)));
        let measured = cal.measure(target, &setting)?;
        swept.push(Swept { setting, measured });
    }
    let mut rows = Vec::new();
    for budget in cal.budgets(fractions) {
        let choice = match cal.choose(budget) {
            Ok(c) => c,
            Err(e) => {
                rows.push(BudgetRow {
                    budget,
                    outcome: Outcome::Infeasible(e),
                });
                continue;
            }
        };
        let (choice, measured) = if cal.settles() {
            match super::verify(&cal, target, budget) {
                Ok(v) => (v.choice, v.measured),
                Err(e) => {
                    rows.push(BudgetRow {
                        budget,
                        outcome: Outcome::NotVerified(e),
                    });
                    continue;
                }
            }
        } else {
            let measured = cal.measure(target, &choice.plans[0].setting)?;
            (choice, measured)
        };
        let winner = &choice.plans[0];
        let best_swept = best_within(&cal, &swept, winner, budget);
        let best_again = match best_swept {
            Some(b) => Some(cal.measure(target, &swept[b].setting)?),
            None => None,
        };
        rows.push(BudgetRow {
            budget,
            outcome: Outcome::Chosen(Box::new(Chosen {
                error: winner.peak_bytes as f64 / measured.peak_bytes as f64 - 1.0,
                extrapolated_peak: small.as_ref().map(|s| s.predicted_peak(&winner.setting)),
                choice,
                measured,
                best_swept,
                best_again,
            })),
        });
    }
    Ok(Benchmark {
        calibration: cal,
        extrapolating: small,
        sweep: swept,
        rows,
    })
}

/// The best swept plan that measured within `budget` and is comparable
/// with `winner` (an exact winner against exact plans only).
fn best_within<B: Benched>(
    cal: &B,
    swept: &[Swept<B::Setting>],
    winner: &Plan<B::Setting>,
    budget: u64,
) -> Option<usize> {
    let rank = |s: &Swept<B::Setting>| cal.swept_rank(&s.setting, &s.measured);
    swept
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            s.measured.peak_bytes <= budget
                && (!winner.exact() || cal.exact(&s.setting))
                && cal.comparable(&winner.setting, &s.setting)
        })
        .min_by(|a, b| rank(a.1).total_cmp(&rank(b.1)))
        .map(|(i, _)| i)
}

impl<B: Benched> Benchmark<B> {
    /// The calibration and sweep in words, for `device`.
    pub fn summary(&self, device: &str) -> String {
        format!(
            "Device: {device}. Peaks are the figure that decides an out-of-memory there (measured). {}{}\n",
            self.calibration.summary(self.sweep.len()),
            self.extrapolating
                .as_ref()
                .map_or(String::new(), |s| s.as_extrapolation()),
        )
    }

    /// The rows as a Markdown table.
    pub fn table(&self) -> String {
        let cal = &self.calibration;
        let mut table = String::from(
            "| budget | chosen plan | planned peak | measured peak | error | within | step ms | fastest swept plan \
             within budget | its step ms (sweep, measured again) | chosen / fastest (again) | extrapolated peak | \
             extrapolation error |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for row in &self.rows {
            let budget = human_bytes(row.budget);
            let c = match &row.outcome {
                Outcome::Infeasible(e) => {
                    let named = match e {
                        PlanError::Infeasible { smallest, .. } => format!("names {smallest}"),
                        other => other.to_string(),
                    };
                    table.push_str(&format!("| {budget} | infeasible: {named} | | | | | | | | | | |\n"));
                    continue;
                }
                Outcome::NotVerified(e) => {
                    table.push_str(&format!("| {budget} | NO plan verified: {e} | | | | | | | | | | |\n"));
                    continue;
                }
                Outcome::Chosen(c) => c,
            };
            let (winner, measured) = (c.winner(), &c.measured);
            let best = c.best_swept.map(|b| &self.sweep[b]);
            table.push_str(&format!(
                "| {budget} | {} | {} | {} | {:+.1} % | {} | {:.1} | {} | {} | {} | {} | {} |\n",
                cal.describe(&winner.setting),
                human_bytes(winner.peak_bytes),
                human_bytes(measured.peak_bytes),
                c.error * 100.0,
                if measured.peak_bytes <= row.budget { "yes" } else { "NO" },
                measured.step_ms,
                match best {
                    Some(b) => cal.describe(&b.setting),
                    None if self.sweep.is_empty() => "not swept".into(),
                    None => "none fits".into(),
                },
                match (best, &c.best_again) {
                    (Some(b), Some(a)) => format!("{:.1}, again {:.1}", b.measured.step_ms, a.step_ms),
                    _ => String::new(),
                },
                match best.and_then(|b| cal.versus(&winner.setting, &b.setting)) {
                    Some(words) => words,
                    None => c
                        .best_again
                        .as_ref()
                        .map_or(String::new(), |a| format!("{:.2}", measured.step_ms / a.step_ms)),
                },
                c.extrapolated_peak.map_or(String::new(), |e| human_bytes(e as u64)),
                c.extrapolated_peak.map_or(String::new(), |e| format!(
                    "{:+.1} %",
                    (e / measured.peak_bytes as f64 - 1.0) * 100.0
                )),
            ));
        }
        table
    }

    /// The record's JSON: `calibration`, `extrapolating_calibration`,
    /// `sweep` and `budgets` (one object a budget).
    pub fn record(&self) -> serde_json::Value {
        let budgets: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|row| match &row.outcome {
                Outcome::Infeasible(e) | Outcome::NotVerified(e) => {
                    json!({ "budget": row.budget, "error": e.to_string() })
                }
                Outcome::Chosen(c) => json!({
                    "budget": row.budget, "chosen": c.winner(), "why": c.choice.why, "measured": c.measured,
                    "error": c.error, "best_swept": c.best_swept.map(|b| &self.sweep[b]),
                    "best_swept_again": c.best_again, "extrapolated_peak": c.extrapolated_peak,
                }),
            })
            .collect();
        json!({
            "calibration": self.calibration, "extrapolating_calibration": self.extrapolating,
            "sweep": self.sweep, "budgets": budgets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ladder::tests::Paged;

    /// Every budget gets a row: the infeasible one says so; each chosen
    /// plan measures within its budget as planned (a deterministic law:
    /// no error), and is held against the fastest swept setting that
    /// measured within, which no chosen plan beats; the table and the
    /// record have a line a budget.
    #[test]
    fn each_budget_is_held_against_the_fastest_swept_setting_within_it() {
        let mut target = Paged { calls: Vec::new() };
        let mut heard = Vec::new();
        let done =
            benchmark::<LadderCalibration>(&mut target, &[0.5, 1.0], true, &mut |l| heard.push(l.to_string())).unwrap();
        assert_eq!(heard[0], "calibrating…");
        assert_eq!(done.sweep.len(), 7, "16 to 112 rows in steps of 16");
        assert_eq!(heard.len(), 1 + done.sweep.len());
        let budgets: Vec<u64> = done.rows.iter().map(|r| r.budget).collect();
        assert!(budgets.windows(2).all(|w| w[0] < w[1]), "{budgets:?}");
        assert!(matches!(
            done.rows[0].outcome,
            Outcome::Infeasible(PlanError::Infeasible { .. })
        ));
        let mut chosen = 0;
        for row in &done.rows[1..] {
            let Outcome::Chosen(c) = &row.outcome else {
                continue;
            };
            chosen += 1;
            assert!(c.measured.peak_bytes <= row.budget);
            assert_eq!(c.error, 0.0);
            let best = &done.sweep[c.best_swept.expect("a swept setting within")];
            assert!(best.measured.peak_bytes <= row.budget);
            for s in done.sweep.iter().filter(|s| s.measured.peak_bytes <= row.budget) {
                assert!(best.measured.step_ms <= s.measured.step_ms);
            }
            assert!(c.measured.step_ms >= best.measured.step_ms);
            assert_eq!(c.best_again.unwrap().step_ms, best.measured.step_ms);
        }
        assert!(chosen >= 2, "{:?}", done.rows);
        let table = done.table();
        assert_eq!(table.lines().count(), 2 + done.rows.len(), "{table}");
        assert!(table.lines().nth(2).unwrap().contains("infeasible: names"), "{table}");
        let record = done.record();
        assert_eq!(record["budgets"].as_array().unwrap().len(), done.rows.len());
        assert_eq!(record["sweep"].as_array().unwrap().len(), 7);
        assert!(done.summary("cpu").starts_with("Device: cpu."));
    }

    /// Without the sweep nothing is swept, and each chosen row says so.
    #[test]
    fn without_the_sweep_rows_say_not_swept() {
        let done =
            benchmark::<LadderCalibration>(&mut Paged { calls: Vec::new() }, &[1.0], false, &mut |_| {}).unwrap();
        assert!(done.sweep.is_empty());
        assert!(done.table().contains("| not swept |"), "{}", done.table());
    }
}
