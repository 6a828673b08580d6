//! Planning one ordered knob: a setting whose larger values hold more
//! memory and run no slower, such as the band height of a banded render
//! (rows processed at once; each band recomputes a halo, so taller bands
//! waste less work).
//!
//! Why not a linear model: on a paged allocator the peak is a step
//! function of such a knob. Measured on wgpu (CubeCL's pools) for a
//! 1024² splat fit: 16 and 64 rows peak at 40 MiB, 256 and 1024 rows at
//! 168 MiB, because buffers above a size go to a pool with 128 MiB pages.
//! A line through two probes misses that by 4×. So the rungs are a
//! geometric ladder (each twice the last: the number of probes grows with
//! the logarithm of the knob's range, not with its values) and every rung
//! is measured; the peak used for a rung is the largest measured at it or
//! any lower rung (the knob never lowers memory, and noise must not make a
//! larger setting look leaner). Step time follows `a + b / value` (the
//! halo's share falls as the band grows), fitted to every rung by least
//! squares, so one noisy probe does not decide the ranking.
//!
//! The margin is from a repeat: the largest rung is measured twice and
//! the margin is twice their relative difference, at least 3 %.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{Choice, Measured, Plan, PlanError, Strategy};
use crate::plan::ProbeError;
use crate::profile::human_bytes;

/// A workload with one ordered memory knob, for the planner.
pub trait Ladder {
    /// The knob's name (its key in the workload's settings).
    fn knob(&self) -> String;
    /// The settings to probe, ascending. One setting where the device has
    /// no such knob (the workload then has exactly one plan).
    fn rungs(&self) -> Vec<usize>;
    /// Runs a few steps with the knob at `value` and measures them.
    fn measure(&mut self, value: usize) -> Result<Measured, ProbeError>;
    /// The setting `value` in words, for tables (a workload whose value 0
    /// means something special says what).
    fn describe(&self, value: usize) -> String {
        format!("{} {value}", self.knob())
    }
}

/// The settings `1·start, 2·start, 4·start, …` up to `most` (included,
/// as the last rung, when it is not a power-of-two multiple), each a
/// multiple of `unit`.
pub fn doubling(start: usize, most: usize, unit: usize) -> Vec<usize> {
    let unit = unit.max(1);
    let round = |v: usize| v.div_ceil(unit) * unit;
    let (start, most) = (round(start.max(1)), round(most.max(1)));
    let mut out = Vec::new();
    let mut v = start;
    while v < most {
        out.push(v);
        v *= 2;
    }
    out.push(most.max(start));
    out.dedup();
    out
}

/// One rung: its measurement and the figures the planner uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rung {
    /// The knob's value.
    pub value: usize,
    /// The value in words ([`Ladder::describe`]).
    #[serde(default)]
    pub label: String,
    /// What the probe measured.
    pub measured: Measured,
    /// The peak planned with: the largest measured at this rung or below (bytes).
    pub peak_bytes: u64,
    /// The fitted step time (ms).
    pub step_ms: f64,
}

/// The measured ladder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LadderCalibration {
    /// The knob's name.
    pub knob: String,
    /// The rungs, ascending.
    pub rungs: Vec<Rung>,
    /// The largest rung measured again (its repeat), where there was more than one probe.
    pub repeat: Option<Measured>,
    /// Relative difference of the repeat's peak from the first measurement.
    pub repeat_error: f64,
    /// Step time `a + b / value`: (a, b) in ms.
    pub time_fit: (f64, f64),
    /// Largest relative error of the fitted step time on the rungs.
    pub time_error: f64,
    /// Seconds spent probing.
    pub seconds: f64,
}

/// Step times this close to the fastest count as equal (the probes' resolution).
const TIME_NOISE: f64 = super::cost_model::TIME_RESOLUTION;

/// Measures every rung (after an uncounted warm-up) and the largest twice.
pub fn calibrate_ladder(target: &mut dyn Ladder) -> Result<LadderCalibration, PlanError> {
    let started = Instant::now();
    let knob = target.knob();
    let values = target.rungs();
    if values.is_empty() || values.windows(2).any(|w| w[0] >= w[1]) {
        return Err(PlanError::Setting(format!(
            "the {knob} settings to probe must be ascending and not empty: {values:?}"
        )));
    }
    let mut probe = |v: usize| {
        target.measure(v).map_err(|why| PlanError::Probe {
            probe: format!("{knob} = {v}"),
            why: why.to_string(),
        })
    };
    // A first run pays for what later runs reuse (thread pools, compiled kernels).
    probe(values[0])?;
    let mut measured = Vec::with_capacity(values.len());
    for &v in &values {
        measured.push(probe(v)?);
    }
    let last = *values.last().expect("not empty");
    let repeat = if values.len() > 1 { Some(probe(last)?) } else { None };
    let top = measured.last().expect("not empty").peak_bytes;
    let repeat_error = repeat.map_or(0.0, |r| (r.peak_bytes as f64 - top as f64).abs() / top.max(1) as f64);
    let time_fit = fit_inverse(&values, &measured);
    let mut rungs = Vec::with_capacity(values.len());
    let mut most = 0;
    for (&value, m) in values.iter().zip(&measured) {
        most = most.max(m.peak_bytes).max(if value == last {
            repeat.map_or(0, |r| r.peak_bytes)
        } else {
            0
        });
        rungs.push(Rung {
            value,
            label: target.describe(value),
            measured: *m,
            peak_bytes: most,
            step_ms: fitted_ms(time_fit, value),
        });
    }
    let time_error = rungs
        .iter()
        .map(|r| (r.step_ms - r.measured.step_ms).abs() / r.measured.step_ms.max(1e-9))
        .fold(0.0, f64::max);
    Ok(LadderCalibration {
        knob,
        rungs,
        repeat,
        repeat_error,
        time_fit,
        time_error,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `a + b / value` (a lone rung may be 0, "automatic": its time is `a`).
fn fitted_ms((a, b): (f64, f64), value: usize) -> f64 {
    if b > 0.0 { a + b / value.max(1) as f64 } else { a }
}

/// Least squares of `t = a + b / v` over the rungs; with one rung, its time.
/// A negative `b` (noise: taller bands measured slower) is dropped to a
/// constant time, which ranks the rungs by memory alone.
fn fit_inverse(values: &[usize], measured: &[Measured]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.len() == 1 {
        return (measured[0].step_ms, 0.0);
    }
    let xs: Vec<f64> = values.iter().map(|v| 1.0 / *v as f64).collect();
    let ts: Vec<f64> = measured.iter().map(|m| m.step_ms).collect();
    let (mx, mt) = (xs.iter().sum::<f64>() / n, ts.iter().sum::<f64>() / n);
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let sxt: f64 = xs.iter().zip(&ts).map(|(x, t)| (x - mx) * (t - mt)).sum();
    let b = if sxx > 0.0 { (sxt / sxx).max(0.0) } else { 0.0 };
    (mt - b * mx, b)
}

impl LadderCalibration {
    /// [`Strategy::choose`] for the ladder: the rungs whose peak plus the
    /// margin is within `budget`; the winner is, among those within the
    /// probes' time resolution of the fastest by the fitted time, the one
    /// holding least memory (the faster of equals).
    pub(super) fn choose_rung(&self, budget: u64) -> Result<Choice<usize>, PlanError> {
        let margin = self.margin();
        let fits = |r: &&Rung| r.peak_bytes as f64 * (1.0 + margin) <= budget as f64;
        let mut plans: Vec<Rung> = self.rungs.iter().filter(fits).rev().cloned().collect();
        if plans.is_empty() {
            let least = &self.rungs[0];
            let smallest = ((least.peak_bytes as f64 * (1.0 + margin)) / (1 << 20) as f64).ceil() as u64 * (1 << 20);
            return Err(PlanError::Infeasible {
                budget: human_bytes(budget),
                least: human_bytes(least.peak_bytes),
                knobs: self.describe(&least.value),
                margin: margin * 100.0,
                smallest: human_bytes(smallest),
                smallest_bytes: smallest,
            });
        }
        let fastest = plans.iter().map(|r| r.step_ms).fold(f64::INFINITY, f64::min);
        let pick = (0..plans.len())
            .filter(|&i| plans[i].step_ms <= fastest * (1.0 + TIME_NOISE))
            .min_by(|&i, &j| {
                (plans[i].peak_bytes, plans[i].step_ms)
                    .partial_cmp(&(plans[j].peak_bytes, plans[j].step_ms))
                    .expect("times are numbers")
            })
            .expect("the fastest is within its own resolution");
        let winner = plans.remove(pick);
        let why = if self.rungs.len() == 1 {
            format!(
                "the only plan: this device has no {} knob; it peaks at {}",
                self.knob,
                human_bytes(winner.peak_bytes)
            )
        } else if pick == 0 {
            format!(
                "the largest {} that fits: predicted fastest ({:.1} ms per step), peak {} with a {:.0} % margin",
                self.knob,
                winner.step_ms,
                human_bytes(winner.peak_bytes),
                margin * 100.0
            )
        } else {
            format!(
                "within {:.0} % of the fastest that fits ({:.1} against {fastest:.1} ms per step) and holding less \
                 memory ({})",
                TIME_NOISE * 100.0,
                winner.step_ms,
                human_bytes(winner.peak_bytes)
            )
        };
        // Fallbacks: the rungs below the winner, largest first.
        plans.retain(|r| r.value < winner.value);
        plans.insert(0, winner);
        // A rung keeps the numerics: the band height changes only the order of sums.
        let plans = plans
            .into_iter()
            .map(|r| Plan {
                setting: r.value,
                peak_bytes: r.peak_bytes,
                step_ms: r.step_ms,
                quality: Vec::new(),
            })
            .collect();
        Ok(Choice {
            budget,
            margin,
            plans,
            why,
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
        calibrate_ladder(target)
    }
    fn choose(&self, budget: u64) -> Result<Choice<usize>, PlanError> {
        self.choose_rung(budget)
    }
    /// Twice the repeat's relative difference, at least 3 %.
    fn margin(&self) -> f64 {
        (2.0 * self.repeat_error).max(0.03)
    }
    fn measure(&self, target: &mut (dyn Ladder + 'static), value: &usize) -> Result<Measured, ProbeError> {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A paged knob: 10 MiB fixed, 1 MiB per unit, pages of 8 MiB, and a
    /// big page of 64 MiB once the value passes 40; time 100 + 1600/v ms.
    /// (The benchmark's test uses it too.)
    pub(crate) struct Paged {
        pub(crate) calls: Vec<usize>,
    }

    fn law(v: usize) -> Measured {
        let mib = 1u64 << 20;
        let raw = 10 * mib + v as u64 * mib;
        let paged = raw.div_ceil(8 * mib) * 8 * mib + if v > 40 { 64 * mib } else { 0 };
        Measured {
            peak_bytes: paged,
            step_peak_bytes: paged,
            rest_peak_bytes: 10 * mib,
            files_peak_bytes: 0,
            between_peak_bytes: 0,
            step_ms: 100.0 + 1600.0 / v as f64,
            seconds: 0.1,
        }
    }

    impl Ladder for Paged {
        fn knob(&self) -> String {
            "band_rows".into()
        }
        fn rungs(&self) -> Vec<usize> {
            doubling(16, 100, 16)
        }
        fn measure(&mut self, v: usize) -> Result<Measured, ProbeError> {
            self.calls.push(v);
            Ok(law(v))
        }
    }

    #[test]
    fn doubling_rungs_are_multiples_and_end_at_the_most() {
        assert_eq!(doubling(16, 100, 16), vec![16, 32, 64, 112]);
        assert_eq!(doubling(16, 64, 16), vec![16, 32, 64]);
        assert_eq!(doubling(16, 10, 16), vec![16]);
        assert_eq!(doubling(0, 0, 0), vec![1]);
    }

    #[test]
    fn the_largest_rung_that_fits_wins_and_the_smaller_ones_are_fallbacks() {
        let mut t = Paged { calls: Vec::new() };
        let cal = calibrate_ladder(&mut t).unwrap();
        // A warm-up, each rung, the largest again: logarithmic in the range.
        assert_eq!(t.calls, vec![16, 16, 32, 64, 112, 112]);
        let mib = 1u64 << 20;
        let peaks: Vec<u64> = cal.rungs.iter().map(|r| r.peak_bytes / mib).collect();
        assert_eq!(peaks, vec![32, 48, 144, 192]);
        assert!(cal.time_error < 1e-9, "the law is a + b/v: {}", cal.time_error);
        assert_eq!(cal.margin(), 0.03);
        // Ample: the largest; between: the largest that fits; fallbacks descend.
        let c = cal.choose(1 << 30).unwrap();
        assert_eq!(
            c.plans.iter().map(|r| r.setting).collect::<Vec<_>>(),
            vec![112, 64, 32, 16]
        );
        let c = cal.choose(100 * mib).unwrap();
        assert_eq!(c.plans.iter().map(|r| r.setting).collect::<Vec<_>>(), vec![32, 16]);
        // Every plan's peak with the margin is within the budget.
        for budget in [40 * mib, 60 * mib, 150 * mib, 200 * mib] {
            for r in cal.choose(budget).unwrap().plans {
                assert!(r.peak_bytes as f64 * 1.03 <= budget as f64);
            }
        }
        // Too small: the error names a budget that then works.
        let e = cal.choose(20 * mib).unwrap_err();
        let PlanError::Infeasible { smallest_bytes, .. } = e else {
            panic!("{e}")
        };
        assert_eq!(cal.choose(smallest_bytes).unwrap().plans[0].setting, 16);
        assert!(cal.choose(smallest_bytes - (1 << 20)).is_err());
    }

    #[test]
    fn a_smaller_rung_that_measured_more_raises_the_larger_ones() {
        struct Noisy;
        impl Ladder for Noisy {
            fn knob(&self) -> String {
                "k".into()
            }
            fn rungs(&self) -> Vec<usize> {
                vec![1, 2, 4]
            }
            fn measure(&mut self, v: usize) -> Result<Measured, ProbeError> {
                let peak = [0, 300, 200, 0, 400][v];
                Ok(Measured {
                    peak_bytes: peak,
                    step_peak_bytes: peak,
                    step_ms: 10.0,
                    ..Measured::default()
                })
            }
        }
        let cal = calibrate_ladder(&mut Noisy).unwrap();
        assert_eq!(
            cal.rungs.iter().map(|r| r.peak_bytes).collect::<Vec<_>>(),
            vec![300, 300, 400]
        );
        // Equal times: the leanest rung wins (of equal peaks, the larger setting).
        let c = cal.choose(1000).unwrap();
        assert_eq!((c.plans[0].setting, c.plans[0].peak_bytes), (2, 300));
    }
}
