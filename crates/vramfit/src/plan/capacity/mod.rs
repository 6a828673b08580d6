//! Planning a count: how many of a workload's elements (a scene's
//! Gaussians) fit a budget, in each of its storage variants (Adam's
//! moments on the device or the host, the SH degree).
//!
//! Why a line: a step's memory is a fixed part (the image, the render's
//! per-pixel buffers, kernels) plus bytes per element (parameters,
//! gradients, moments, the render's per-element buffers and, in
//! proportion, tile intersections). Measured on the CubeCL allocator the
//! in-use bytes follow the layout to the allocator's 32-byte rounding
//! (`bench scene-memory`); the reserved bytes, which decide an
//! out-of-memory, add pages. So each variant is probed at a few counts,
//! a least-squares line is fitted, and it is then raised until no probe
//! lies above it (a prediction is never below a measurement it was made
//! from). The margin is twice the line's largest relative residual, at
//! least 3 %. The largest count that fits is where the line plus the
//! margin meets the budget; the winner is verified by a probe at that
//! count ([`super::verify`]).
//!
//! Ranking: plans that keep the count the user asked for come first,
//! exact variants before those that change numerics or the model, each by
//! predicted step time (times within the probes' resolution count as
//! equal, and the workload's order of variants decides); then plans at a
//! lower count, largest first. A
//! variant that changes the model (a lower SH degree) is offered only when
//! the workload lists it, which it does only when the user allowed its
//! measured quality cost.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{Choice, Measured, Plan, PlanError, Strategy};
use crate::plan::ProbeError;
use crate::profile::human_bytes;

/// What a verified count leaves to spare below the budget (the run's
/// Gaussians grow to the count through densification; a page's worth of
/// difference in packing must not pass the budget).
pub const SETTLE_MARGIN: f64 = 0.03;

/// A faster variant holding this much fewer than the settled winner
/// replaces it ([`CapacityCalibration::settle_with_faster`]): the
/// settling itself places a count to 2 % and keeps 3 % spare.
pub const COUNT_RESOLUTION: f64 = 0.03;

/// Probes the verification of a count may take.
pub const SETTLE_PROBES: usize = 6;

/// One way to store the workload, for the planner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// Its name, as plans and tables show it (`moments host`).
    pub name: String,
    /// What it changes in the numerics or the model (empty: exact).
    pub quality: Vec<String>,
    /// The most elements the device can hold in it at all (its largest
    /// buffer), `usize::MAX` where nothing but memory limits it.
    pub limit: usize,
}

/// A workload whose memory grows with a count, for the planner.
pub trait Capacity {
    /// The count's name (its key in the workload's settings).
    fn knob(&self) -> String;
    /// The count the user asked for: no plan exceeds it.
    fn wanted(&self) -> usize;
    /// The smallest count worth running (a plan below it does not fit).
    fn least(&self) -> usize {
        1
    }
    /// The variants the plan may use (only those the user allows).
    fn variants(&self) -> Vec<Variant>;
    /// The counts to probe each variant at, ascending (two at least).
    fn probe_counts(&self) -> Vec<usize>;
    /// Runs a step or two of `variant` holding `count` elements and
    /// measures them.
    fn measure(&mut self, variant: &str, count: usize) -> Result<Measured, ProbeError>;
}

/// What a capacity plan sets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counted {
    /// The variant's name.
    pub variant: String,
    /// The count.
    pub count: usize,
}

/// One variant's probes and fitted lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// The variant.
    pub variant: Variant,
    /// Each probe: the count and what it measured.
    pub probes: Vec<(usize, Measured)>,
    /// Peak bytes `a + b · count`: (a, b), raised above every probe.
    pub bytes: (f64, f64),
    /// Largest relative residual of the least-squares line on the probes.
    pub error: f64,
    /// How far the measurement of the largest probe count was above the
    /// line fitted (and raised) without it, relative (0 when not above):
    /// the extrapolation error the margin covers.
    #[serde(default)]
    pub shortfall: f64,
    /// Step time `c + d · count` in ms: (c, d).
    pub time: (f64, f64),
}

impl Line {
    /// Predicted peak at `count` (bytes).
    pub fn peak(&self, count: usize) -> u64 {
        (self.bytes.0 + self.bytes.1 * count as f64).max(0.0).ceil() as u64
    }

    /// Predicted step time at `count` (ms).
    pub fn step_ms(&self, count: usize) -> f64 {
        (self.time.0 + self.time.1 * count as f64).max(0.0)
    }

    /// The largest count whose peak with `margin` is within `budget`, or
    /// a larger count a probe measured within it with [`SETTLE_MARGIN`] to
    /// spare (on a paged allocator the raised line and its margin can rule
    /// out a count measured to fit), capped by the variant's limit; or 0.
    pub fn largest(&self, budget: u64, margin: f64) -> usize {
        self.by_memory(budget, margin)
            .max(self.measured_within(budget))
            .min(self.variant.limit)
    }

    /// The largest probed count whose measured peak is within `budget` with
    /// [`SETTLE_MARGIN`] to spare, or 0.
    pub fn measured_within(&self, budget: u64) -> usize {
        self.probes
            .iter()
            .filter(|(_, m)| m.peak_bytes as f64 * (1.0 + SETTLE_MARGIN) <= budget as f64)
            .map(|(count, _)| *count)
            .max()
            .unwrap_or(0)
    }

    /// The peak a plan at `count` is expected to reach: the line's
    /// prediction, or less where a probe at that count or above measured
    /// less (the peak does not fall as the count grows).
    pub fn expected_peak(&self, count: usize) -> u64 {
        self.probes
            .iter()
            .filter(|(c, _)| *c >= count)
            .map(|(_, m)| m.peak_bytes)
            .fold(self.peak(count), u64::min)
    }

    /// The same without the variant's limit: what the memory alone allows
    /// (on a device without this one's largest-buffer cap).
    pub fn by_memory(&self, budget: u64, margin: f64) -> usize {
        let (a, b) = self.bytes;
        let room = budget as f64 / (1.0 + margin) - a;
        if b <= 0.0 {
            if room >= 0.0 { usize::MAX } else { 0 }
        } else if room <= 0.0 {
            0
        } else {
            (room / b).floor().min(usize::MAX as f64) as usize
        }
    }
}

/// The measured lines of every variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityCalibration {
    /// The count's name.
    pub knob: String,
    /// The count the user asked for.
    pub wanted: usize,
    /// The smallest count worth running.
    pub least: usize,
    /// One line per variant, in the workload's order.
    pub lines: Vec<Line>,
    /// Seconds spent probing.
    pub seconds: f64,
}

/// Least squares of `y = a + b x`.
fn fit_line(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - b * mx, b)
}

/// The least-squares line raised until no point lies above it; its slope
/// at least 0 (memory never falls as the count grows).
fn raised_line(points: &[(f64, f64)]) -> (f64, f64) {
    let (a, b) = fit_line(points);
    let b = b.max(0.0);
    let raise = points.iter().map(|(x, y)| y - (a + b * x)).fold(f64::MIN, f64::max);
    (a + raise, b)
}

/// Probes every variant at every count (after an uncounted warm-up) and
/// fits its lines.
pub fn calibrate_capacity(target: &mut dyn Capacity) -> Result<CapacityCalibration, PlanError> {
    let started = Instant::now();
    let knob = target.knob();
    let counts = target.probe_counts();
    if counts.len() < 2 || counts.windows(2).any(|w| w[0] >= w[1]) || counts[0] == 0 {
        return Err(PlanError::Setting(format!(
            "the {knob} counts to probe must be two or more, positive and ascending: {counts:?}"
        )));
    }
    // The smallest count worth running is probed too: the line then spans
    // every count a plan may take (and an infeasible budget is named from
    // a measurement, not from the line's end).
    let mut counts = counts;
    let least = target.least().min(target.wanted());
    if least > 0 && least < counts[0] {
        counts.insert(0, least);
    }
    let variants = target.variants();
    if variants.is_empty() {
        return Err(PlanError::Setting(format!("no variant to plan {knob} with")));
    }
    let mut lines = Vec::with_capacity(variants.len());
    for (i, variant) in variants.into_iter().enumerate() {
        let mut probe = |count: usize| {
            target.measure(&variant.name, count).map_err(|why| PlanError::Probe {
                probe: format!("{}, {knob} {count}", variant.name),
                why: why.to_string(),
            })
        };
        if i == 0 {
            // A first run pays for what later runs reuse (compiled kernels).
            probe(counts[0])?;
        }
        let mut probes = Vec::with_capacity(counts.len());
        for &c in counts.iter().filter(|&&c| c <= variant.limit) {
            probes.push((c, probe(c)?));
        }
        if probes.len() < 2 {
            continue;
        }
        let bytes: Vec<(f64, f64)> = probes.iter().map(|(c, m)| (*c as f64, m.peak_bytes as f64)).collect();
        let (a, b) = raised_line(&bytes);
        let error = bytes
            .iter()
            .map(|(x, y)| (a + b * x - y).abs() / y.max(1.0))
            .fold(0.0, f64::max);
        // The largest probe predicted from the others (with three or more).
        let shortfall = match bytes.split_last() {
            Some((&(x, y), rest)) if rest.len() >= 2 => {
                let (a, b) = raised_line(rest);
                ((y - (a + b * x)) / y.max(1.0)).max(0.0)
            }
            _ => 0.0,
        };
        let times: Vec<(f64, f64)> = probes.iter().map(|(c, m)| (*c as f64, m.step_ms)).collect();
        lines.push(Line {
            variant,
            probes,
            bytes: (a, b),
            error,
            shortfall,
            time: fit_line(&times),
        });
    }
    if lines.is_empty() {
        return Err(PlanError::Setting(format!(
            "no variant can hold two of the probe counts {counts:?}: the device's largest buffer is too small"
        )));
    }
    Ok(CapacityCalibration {
        knob,
        wanted: target.wanted(),
        least: target.least(),
        lines,
        seconds: started.elapsed().as_secs_f64(),
    })
}

impl CapacityCalibration {
    /// Twice the largest extrapolation shortfall of any line (its largest
    /// probe predicted from the smaller ones), at least 3 %. (A line raised
    /// above every probe predicts no probe low; what it can miss is where
    /// it was not measured.)
    pub fn margin(&self) -> f64 {
        (2.0 * self.lines.iter().map(|l| l.shortfall).fold(0.0, f64::max)).max(0.03)
    }

    /// Moves `plan`'s count to where measurements put the budget (with
    /// [`SETTLE_MARGIN`] to spare): from the chosen count, up when there
    /// is room (along the line's slope, at least 8 %; never past the count
    /// asked for) and down when over, then halving the gap between the
    /// largest count measured within and the smallest measured over until
    /// it is 2 %, at most [`SETTLE_PROBES`] probes; the largest count
    /// measured within wins. A plan holding the count asked for is not
    /// moved: it is measured once, and the pipeline rejects it if it is
    /// over the budget (the next plan may hold the count). Where no count
    /// measured within the spare, the smallest measured over it is returned
    /// (the pipeline accepts it only if it is within the budget itself). A
    /// probe that fails after a count measured within ends the search
    /// there (a larger count ran out of memory).
    pub(super) fn settle_count(
        &self,
        target: &mut dyn Capacity,
        plan: &Plan<Counted>,
        budget: u64,
    ) -> Result<(Plan<Counted>, Measured), ProbeError> {
        let line = self
            .line(&plan.setting.variant)
            .ok_or_else(|| ProbeError::workload(format!("no line for {}", plan.setting.variant)))?;
        let slope = line.bytes.1.max(1.0);
        let aim = budget as f64 / (1.0 + SETTLE_MARGIN);
        let top = self.wanted.min(line.variant.limit);
        let floor = self.least.min(self.wanted).max(1);
        if plan.setting.count >= self.wanted {
            let m = target.measure(&plan.setting.variant, plan.setting.count)?;
            return Ok((plan.clone(), m));
        }
        let mut count = plan.setting.count.clamp(floor, top);
        // The largest count measured within, and the smallest measured over.
        let mut within: Option<(usize, Measured)> = None;
        let mut over: Option<(usize, Measured)> = None;
        for _ in 0..SETTLE_PROBES {
            let m = match target.measure(&plan.setting.variant, count) {
                Ok(m) => m,
                Err(_) if within.is_some() => break,
                Err(e) => return Err(e),
            };
            let peak = m.peak_bytes as f64;
            if peak <= aim {
                if within.as_ref().is_none_or(|(c, _)| count > *c) {
                    within = Some((count, m));
                }
            } else if over.as_ref().is_none_or(|(c, _)| count < *c) {
                over = Some((count, m));
            }
            let lo = within.as_ref().map(|w| w.0);
            let hi = over.as_ref().map(|o| o.0);
            let next = match (lo, hi) {
                // Bracketed: halve the gap, until it is 2 % of the count.
                (Some(lo), Some(hi)) if hi - lo > lo / 50 + 1 => lo + (hi - lo) / 2,
                (Some(_), Some(_)) => break,
                // Room left: along the line, at least 8 % more (a page's
                // rounding hides the room within it), never past the top.
                (Some(lo), None) if lo < top => (lo + ((aim - peak) / slope) as usize).max(lo + lo / 12 + 1).min(top),
                (Some(_), None) => break,
                // Over: down along the line, at least 5 % (a page may hold
                // the peak up), never below the floor.
                (None, Some(hi)) if hi > floor => hi
                    .saturating_sub(((peak - aim) / slope).ceil() as usize)
                    .min(hi - hi / 20)
                    .max(floor),
                _ => break,
            };
            if next == count {
                break;
            }
            count = next;
        }
        let best = within;
        let last = over;
        let (count, measured) = best.or(last).expect("at least one probe");
        Ok((self.plan(line, count), measured))
    }

    /// [`Self::settle_count`], then, where the settled count is below the
    /// one asked for, each faster variant of the same kind (exact, or
    /// changing the same things) is tried at [`COUNT_RESOLUTION`] below
    /// that count: one probe, and if it measures within, its own count is
    /// settled from there; the fastest measured plan holding at least that
    /// many wins. The lines rank the variants by their counts with the
    /// whole margin, which can be wide on a paged allocator: on an H200 at
    /// 3.2 GiB the host's moments won at 1,100,656 Gaussians, settled at
    /// 1,662,746 and ran 5 times slower than the moments on the device,
    /// which hold 1,657,138 there. A challenger's probe that fails is
    /// skipped: the winner stands.
    pub(super) fn settle_with_faster(
        &self,
        target: &mut dyn Capacity,
        plan: &Plan<Counted>,
        budget: u64,
    ) -> Result<(Plan<Counted>, Measured), ProbeError> {
        let (mut best, mut measured) = self.settle_count(target, plan, budget)?;
        if best.setting.count >= self.wanted || measured.peak_bytes > budget {
            return Ok((best, measured));
        }
        let least = (best.setting.count as f64 * (1.0 - COUNT_RESOLUTION)) as usize;
        let aim = budget as f64 / (1.0 + SETTLE_MARGIN);
        let kind = self.line(&plan.setting.variant).map(|l| l.variant.quality.clone());
        for line in &self.lines {
            let faster = line.step_ms(least) < measured.step_ms * (1.0 - super::cost_model::TIME_RESOLUTION);
            if line.variant.name == best.setting.variant || Some(&line.variant.quality) != kind.as_ref() || !faster {
                continue;
            }
            let Ok(first) = target.measure(&line.variant.name, least) else {
                continue;
            };
            if first.peak_bytes as f64 > aim {
                continue;
            }
            let (settled, m) = self
                .settle_count(target, &self.plan(line, least), budget)
                .unwrap_or((self.plan(line, least), first));
            if m.peak_bytes <= budget && settled.setting.count >= least && m.step_ms < measured.step_ms {
                (best, measured) = (settled, m);
            }
        }
        Ok((best, measured))
    }

    /// The line of `variant`.
    pub fn line(&self, variant: &str) -> Option<&Line> {
        self.lines.iter().find(|l| l.variant.name == variant)
    }

    /// For each variant, the largest count within `budget` with the margin
    /// (not capped by what the user asked for): a preset table's row.
    pub fn largest(&self, budget: u64) -> Vec<(String, usize)> {
        let margin = self.margin();
        self.lines
            .iter()
            .map(|l| (l.variant.name.clone(), l.largest(budget, margin)))
            .collect()
    }

    fn plan(&self, line: &Line, count: usize) -> Plan<Counted> {
        let mut quality = line.variant.quality.clone();
        if count < self.wanted {
            quality.push(format!("{} {count} instead of {}", self.knob, self.wanted));
        }
        Plan {
            setting: Counted {
                variant: line.variant.name.clone(),
                count,
            },
            peak_bytes: line.expected_peak(count),
            step_ms: line.step_ms(count),
            quality,
        }
    }

    /// [`super::Strategy::choose`] for counts: each variant at the largest
    /// count that fits (at most the one asked for), ranked as the module
    /// says.
    pub(super) fn choose_count(&self, budget: u64) -> Result<Choice<Counted>, PlanError> {
        let margin = self.margin();
        let plans: Vec<(bool, usize, Plan<Counted>)> = self
            .lines
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let count = l.largest(budget, margin).min(self.wanted);
                (count >= self.least.min(self.wanted)).then(|| (l.variant.quality.is_empty(), i, self.plan(l, count)))
            })
            .collect();
        if plans.is_empty() {
            let least = self.least.min(self.wanted);
            let (line, peak) = self
                .lines
                .iter()
                .map(|l| (l, l.peak(least)))
                .min_by_key(|(_, p)| *p)
                .expect("at least one line");
            let smallest = ((peak as f64 * (1.0 + margin)) / (1 << 20) as f64).ceil() as u64 * (1 << 20);
            return Err(PlanError::Infeasible {
                budget: human_bytes(budget),
                least: human_bytes(peak),
                knobs: format!("{}, {} {least}", line.variant.name, self.knob),
                margin: margin * 100.0,
                smallest: human_bytes(smallest),
                smallest_bytes: smallest,
            });
        }
        // Step times within the probes' resolution of the fastest among
        // plans of the same rank count as the fastest's: then the
        // workload's order of variants decides (moments on the device
        // first: no copies). (A total order: each time is compared with
        // one reference, its group's fastest.)
        let group = |exact: bool, p: &Plan<Counted>| (p.setting.count < self.wanted, !exact, p.setting.count);
        let timed: Vec<f64> = plans
            .iter()
            .map(|(e, _, p)| {
                let fastest = plans
                    .iter()
                    .filter(|(f, _, q)| group(*f, q) == group(*e, p))
                    .map(|(_, _, q)| q.step_ms)
                    .fold(f64::INFINITY, f64::min);
                if p.step_ms <= fastest * (1.0 + super::cost_model::TIME_RESOLUTION) {
                    fastest
                } else {
                    p.step_ms
                }
            })
            .collect();
        let mut order: Vec<usize> = (0..plans.len()).collect();
        order.sort_by(|&i, &j| {
            let ((ea, ia, a), (eb, ib, b)) = (&plans[i], &plans[j]);
            let key = |exact: bool, p: &Plan<Counted>| (p.setting.count < self.wanted, !exact);
            key(*ea, a)
                .cmp(&key(*eb, b))
                .then(b.setting.count.cmp(&a.setting.count))
                .then(timed[i].total_cmp(&timed[j]))
                .then(ia.cmp(ib))
        });
        let mut slots: Vec<Option<(bool, usize, Plan<Counted>)>> = plans.into_iter().map(Some).collect();
        let plans: Vec<(bool, usize, Plan<Counted>)> =
            order.iter().map(|&i| slots[i].take().expect("each once")).collect();
        let plans: Vec<Plan<Counted>> = plans.into_iter().map(|(_, _, p)| p).collect();
        let w = &plans[0];
        let why = if w.setting.count >= self.wanted {
            format!(
                "holds the {} {} asked for, predicted fastest of the plans that do, or within 5 % of it and first in \
                 the workload's order ({:.1} ms per step), peak {} with a {:.0} % margin",
                self.wanted,
                self.knob,
                w.step_ms,
                human_bytes(w.peak_bytes),
                margin * 100.0
            )
        } else {
            format!(
                "no plan holds the {} {} asked for within {}; this one holds the most, {}, peak {} with a {:.0} % \
                 margin",
                self.wanted,
                self.knob,
                human_bytes(budget),
                w.setting.count,
                human_bytes(w.peak_bytes),
                margin * 100.0
            )
        };
        Ok(Choice {
            budget,
            margin,
            plans,
            why,
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
        calibrate_capacity(target)
    }
    fn choose(&self, budget: u64) -> Result<Choice<Counted>, PlanError> {
        self.choose_count(budget)
    }
    fn margin(&self) -> f64 {
        CapacityCalibration::margin(self)
    }
    fn measure(&self, target: &mut (dyn Capacity + 'static), setting: &Counted) -> Result<Measured, ProbeError> {
        target.measure(&setting.variant, setting.count)
    }
    fn settle(
        &self,
        target: &mut (dyn Capacity + 'static),
        plan: &Plan<Counted>,
        budget: u64,
    ) -> Result<(Plan<Counted>, Measured), ProbeError> {
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

#[cfg(test)]
mod tests;
