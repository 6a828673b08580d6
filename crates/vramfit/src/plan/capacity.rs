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
    fn measure(&mut self, variant: &str, count: usize) -> Result<Measured, String>;
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
                why,
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
    ) -> Result<(Plan<Counted>, Measured), String> {
        let line = self
            .line(&plan.setting.variant)
            .ok_or_else(|| format!("no line for {}", plan.setting.variant))?;
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
    ) -> Result<(Plan<Counted>, Measured), String> {
        let (mut best, mut measured) = self.settle_count(target, plan, budget)?;
        if best.setting.count >= self.wanted || measured.peak_bytes > budget {
            return Ok((best, measured));
        }
        let least = (best.setting.count as f64 * (1.0 - COUNT_RESOLUTION)) as usize;
        let aim = budget as f64 / (1.0 + SETTLE_MARGIN);
        let kind = self.line(&plan.setting.variant).map(|l| l.variant.quality.clone());
        for line in &self.lines {
            let faster = line.step_ms(least) < measured.step_ms * (1.0 - super::model::TIME_RESOLUTION);
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
                if p.step_ms <= fastest * (1.0 + super::model::TIME_RESOLUTION) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An exact workload with Adam's moments on the device or the host,
    /// probed at `counts`, each probe measured by `measure`.
    struct TwoVariants<F> {
        wanted: usize,
        counts: Vec<usize>,
        measure: F,
    }

    impl<F: FnMut(&str, usize) -> Measured> Capacity for TwoVariants<F> {
        fn knob(&self) -> String {
            "max_gaussians".into()
        }
        fn wanted(&self) -> usize {
            self.wanted
        }
        fn variants(&self) -> Vec<Variant> {
            ["moments device", "moments host"]
                .map(|n| Variant {
                    name: n.into(),
                    quality: vec![],
                    limit: usize::MAX,
                })
                .to_vec()
        }
        fn probe_counts(&self) -> Vec<usize> {
            self.counts.clone()
        }
        fn measure(&mut self, variant: &str, count: usize) -> Result<Measured, String> {
            Ok((self.measure)(variant, count))
        }
    }

    /// 50 MiB fixed and 1,000 bytes an element (device moments) or 500
    /// (host moments, 30 % slower), in pages of 32 MiB.
    struct Scene {
        allow_degree: bool,
    }

    fn law(per: u64, count: usize) -> u64 {
        let page = 32u64 << 20;
        ((50u64 << 20) + per * count as u64).div_ceil(page) * page
    }

    impl Capacity for Scene {
        fn knob(&self) -> String {
            "max_gaussians".into()
        }
        fn wanted(&self) -> usize {
            1_000_000
        }
        fn variants(&self) -> Vec<Variant> {
            let mut v = vec![
                Variant {
                    name: "moments device".into(),
                    quality: vec![],
                    limit: usize::MAX,
                },
                Variant {
                    name: "moments host".into(),
                    quality: vec![],
                    limit: usize::MAX,
                },
            ];
            if self.allow_degree {
                v.push(Variant {
                    name: "degree 2".into(),
                    quality: vec!["SH degree 2 instead of 3".into()],
                    limit: usize::MAX,
                });
            }
            v
        }
        fn probe_counts(&self) -> Vec<usize> {
            vec![100_000, 200_000, 400_000]
        }
        fn measure(&mut self, variant: &str, count: usize) -> Result<Measured, String> {
            let (per, ms) = match variant {
                "moments device" => (1000, 1.0),
                "moments host" => (500, 1.3),
                _ => (300, 0.9),
            };
            let peak = law(per, count);
            Ok(Measured {
                peak_bytes: peak,
                step_peak_bytes: peak,
                step_ms: ms * count as f64 / 1e5,
                ..Measured::default()
            })
        }
    }

    /// A count a probe measured within the budget stays allowed where the
    /// raised line and a wide margin would rule it out (measured on wgpu: a
    /// variant at 100,000 Gaussians in 48 MiB, its line allowing 9,929 in
    /// 64 MiB), and its plan expects the measured peak.
    #[test]
    fn a_count_measured_within_the_budget_is_not_ruled_out_by_the_line() {
        let probe = |count: usize, mib: u64| {
            let peak = mib << 20;
            (
                count,
                Measured {
                    peak_bytes: peak,
                    step_peak_bytes: peak,
                    step_ms: 1.0,
                    ..Measured::default()
                },
            )
        };
        let line = Line {
            variant: Variant {
                name: "v".into(),
                quality: vec![],
                limit: usize::MAX,
            },
            probes: vec![probe(2_000, 8), probe(25_000, 40), probe(100_000, 48)],
            bytes: (31.3 * (1u64 << 20) as f64, 365.0),
            error: 0.0,
            shortfall: 0.0,
            time: (0.0, 0.01),
        };
        assert!(line.by_memory(64 << 20, 0.84) < 20_000);
        assert_eq!(line.largest(64 << 20, 0.84), 100_000);
        assert_eq!(line.expected_peak(100_000), 48 << 20);
        // A count between probes expects no more than the probe above it measured.
        assert_eq!(line.expected_peak(60_000), 48 << 20);
        // Without 3 % to spare, the measurement does not count.
        assert!(line.largest(49 << 20, 0.84) < 100_000);
        // Capped by the variant's limit all the same.
        let capped = Line {
            variant: Variant {
                limit: 50_000,
                ..line.variant.clone()
            },
            ..line.clone()
        };
        assert_eq!(capped.largest(64 << 20, 0.84), 50_000);
    }

    /// Verified (settled by measurement), the count measures within the
    /// budget and within 10 % of the largest count that does, at budgets
    /// where the paged law's steps put the line's prediction off.
    #[test]
    fn the_verified_count_measures_within_and_near_the_largest() {
        let mut target = Scene { allow_degree: false };
        let cal = calibrate_capacity(&mut target).unwrap();
        for budget_mib in [200u64, 300, 450, 600, 1200] {
            let budget = budget_mib << 20;
            let v = crate::plan::verify(&cal, &mut target as &mut dyn Capacity, budget).unwrap();
            let plan = &v.choice.plans[0];
            let per = if plan.setting.variant == "moments device" {
                1000
            } else {
                500
            };
            let count = plan.setting.count;
            assert_eq!(law(per, count), v.measured.peak_bytes);
            assert!(v.measured.peak_bytes <= budget, "{budget_mib} MiB: {plan:?}");
            // The largest count of that variant measuring within the budget, by search.
            let best = (1..=1_000_000)
                .rev()
                .step_by(500)
                .find(|&c| law(per, c) <= budget)
                .unwrap();
            assert!(
                count as f64 >= 0.9 * best as f64,
                "{budget_mib} MiB: {} {count} against the largest within, {best}",
                plan.setting.variant
            );
        }
    }

    /// A plan that holds the count asked for is measured as it is, never
    /// moved down: over the budget it goes back to the pipeline, which
    /// tries the next plan (one that may hold the count too).
    #[test]
    fn a_plan_holding_the_count_asked_for_is_not_moved() {
        let mut target = Scene { allow_degree: false };
        let cal = calibrate_capacity(&mut target).unwrap();
        let line = cal.line("moments device").unwrap();
        let plan = cal.plan(line, 1_000_000);
        let (settled, measured) = cal.settle_count(&mut target, &plan, 500 << 20).unwrap();
        assert_eq!(settled.setting.count, 1_000_000);
        assert!(measured.peak_bytes > 500 << 20);
        let (settled, measured) = cal.settle_count(&mut target, &plan, 2 << 30).unwrap();
        assert_eq!(
            (settled.setting.count, measured.peak_bytes),
            (1_000_000, law(1000, 1_000_000))
        );
    }

    /// Two exact variants holding the count, the second 2 % faster (within
    /// the probes' resolution): the first, the workload's preference, wins.
    #[test]
    fn times_within_resolution_keep_the_workloads_order() {
        let mut close = TwoVariants {
            wanted: 1000,
            counts: vec![250, 500, 1000],
            measure: |variant: &str, count: usize| Measured {
                peak_bytes: 1000 * count as u64,
                step_ms: if variant == "moments host" { 0.98 } else { 1.0 } * count as f64,
                ..Measured::default()
            },
        };
        let cal = calibrate_capacity(&mut close).unwrap();
        let c = cal.choose_count(1 << 30).unwrap();
        assert_eq!(c.plans[0].setting.variant, "moments device", "{:?}", c.plans);
        assert_eq!(c.plans[1].setting.variant, "moments host");
    }

    #[test]
    fn the_count_asked_for_wins_then_the_largest() {
        let cal = calibrate_capacity(&mut Scene { allow_degree: false }).unwrap();
        // Ample: both hold a million; device moments are faster.
        let c = cal.choose_count(4 << 30).unwrap();
        assert_eq!(c.plans[0].setting.variant, "moments device");
        assert_eq!(c.plans[0].setting.count, 1_000_000);
        assert!(c.plans[0].exact());
        // 700 MiB: only host moments hold a million.
        let c = cal.choose_count(700 << 20).unwrap();
        assert_eq!(c.plans[0].setting.variant, "moments host");
        assert_eq!(c.plans[0].setting.count, 1_000_000);
        // 400 MiB: nothing holds a million; the most is on host moments,
        // and the plan says it lowers the count.
        let c = cal.choose_count(400 << 20).unwrap();
        assert_eq!(c.plans[0].setting.variant, "moments host");
        assert!(c.plans[0].setting.count < 1_000_000);
        assert!(c.plans[0].quality[0].contains("instead of 1000000"), "{:?}", c.plans[0]);
        // Too small: names a budget that works.
        match cal.choose_count(40 << 20) {
            Err(PlanError::Infeasible { smallest_bytes, .. }) => {
                assert!(cal.choose_count(smallest_bytes).is_ok())
            }
            other => panic!("{other:?}"),
        }
    }

    /// Below the count asked for, a faster variant that measures within
    /// the budget at no more than 3 % fewer than the settled winner
    /// replaces it; one holding far fewer does not.
    #[test]
    fn a_faster_variant_holding_nearly_as_many_wins_verification() {
        // Host moments `per` bytes an element against the device's 1,000
        // and five times slower, with `jump` bytes more above 1.2 M
        // elements, where no probe looked (as a page would): its line
        // promises more than it holds.
        let near = |per: u64, jump: u64| TwoVariants {
            wanted: 10_000_000,
            counts: vec![100_000, 400_000, 1_000_000],
            measure: move |variant: &str, count: usize| {
                let (per, jump, ms) = if variant == "moments host" {
                    (per, if count > 1_200_000 { jump } else { 0 }, 5.0)
                } else {
                    (1000, 0, 1.0)
                };
                let peak = (50u64 << 20) + per * count as u64 + jump;
                Measured {
                    peak_bytes: peak,
                    step_peak_bytes: peak,
                    step_ms: ms * count as f64 / 1e5,
                    ..Measured::default()
                }
            },
        };
        let budget = 1_600_000_000;
        let mut close = near(900, 136_000_000);
        let cal = calibrate_capacity(&mut close).unwrap();
        let ranked = cal.choose_count(budget).unwrap().plans[0].clone();
        assert_eq!(ranked.setting.variant, "moments host", "its line promises the most");
        let (host, _) = cal.settle_count(&mut close, &ranked, budget).unwrap();
        let v = crate::plan::verify(&cal, &mut close as &mut dyn Capacity, budget).unwrap();
        let plan = &v.choice.plans[0];
        assert_eq!(plan.setting.variant, "moments device", "{}", v.choice.why);
        assert!(v.measured.peak_bytes <= budget);
        assert!(
            plan.setting.count as f64 >= host.setting.count as f64 * (1.0 - COUNT_RESOLUTION),
            "{plan:?} against {host:?}"
        );
        // Host moments holding twice as many stay the winner.
        let mut far = near(500, 0);
        let cal = calibrate_capacity(&mut far).unwrap();
        let v = crate::plan::verify(&cal, &mut far as &mut dyn Capacity, budget).unwrap();
        assert_eq!(v.choice.plans[0].setting.variant, "moments host");
    }

    #[test]
    fn a_model_change_is_ranked_after_exact_plans_at_the_same_count() {
        let cal = calibrate_capacity(&mut Scene { allow_degree: true }).unwrap();
        let c = cal.choose_count(4 << 30).unwrap();
        // The degree-2 variant is fastest but changes the model.
        assert_eq!(c.plans[0].setting.variant, "moments device");
        assert_eq!(c.plans.last().unwrap().setting.variant, "degree 2");
        // Where only it holds the count asked for, it wins, saying so.
        let c = cal.choose_count(500 << 20).unwrap();
        assert_eq!(c.plans[0].setting.variant, "degree 2");
        assert_eq!(c.plans[0].setting.count, 1_000_000);
        assert_eq!(c.plans[0].quality, vec!["SH degree 2 instead of 3".to_string()]);
    }
}
