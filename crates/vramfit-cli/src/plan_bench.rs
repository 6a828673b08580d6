//! `vramfit bench plan` (the transformer's knob model) and `bench
//! plan-splat` (the splat fit's band-height ladder): the planner against
//! measurement, one benchmark for both strategies. At budgets from
//! infeasible to ample it runs the chosen plan and reports its planned and
//! measured peak; an exhaustive sweep finds the fastest plan that measured
//! within each budget, which is then measured again beside the chosen one
//! (the minimum of many noisy timings is biased low: the ratio is of two
//! measurements taken under the same conditions). The knob model adds the
//! extrapolation error of a calibration at a quarter of the batch.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::json;
use vramfit::plan::{
    Calibration, CapacityCalibration, Counted, Knobs, LadderCalibration, Measured, PROBE_STEPS, PlanError, Runnable,
    Strategy,
};
use vramfit::profile::human_bytes;

use crate::show_plan::Show;

#[derive(clap::Args)]
pub struct Args<S: clap::Args> {
    #[command(flatten)]
    settings: S,
    /// Budgets as fractions of the peak of the plan that turns no knob (the
    /// knob model's plain step, the ladder's top rung), besides an
    /// infeasible one and, for a ladder, each rung's level.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.65,0.8,1.0,1.5", allow_negative_numbers = true,
        value_parser = crate::budget::parse_fraction)]
    budgets: Vec<f64>,
    /// Leave out the exhaustive sweep (memory only: on a software device
    /// step times say nothing about a GPU's).
    #[arg(long)]
    no_sweep: bool,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// JSON output, a .md table written beside it (default:
    /// bench-results/plan-WORKLOAD.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What the benchmark was asked for.
#[derive(Clone)]
pub struct Request {
    fractions: Vec<f64>,
    sweep: bool,
    out: Option<PathBuf>,
    /// The resolved settings, for the record.
    config: serde_json::Value,
    /// The workload's name, for the file names.
    workload: String,
}

impl Request {
    /// Where the JSON goes (`--out`, or bench-results/plan-WORKLOAD.json).
    pub fn out_path(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("bench-results/plan-{}.json", self.workload)))
    }
}

impl<S: clap::Args> Args<S> {
    /// The request for settings `config` (resolved from `self.settings`)
    /// of workload `workload`, and the device.
    pub fn request(&self, config: serde_json::Value, workload: &str) -> (Request, &str) {
        let request = Request {
            fractions: self.budgets.clone(),
            sweep: !self.no_sweep,
            out: self.out.clone(),
            config,
            workload: workload.into(),
        };
        (request, &self.device.name)
    }

    /// The settings flags.
    pub fn settings(&self) -> &S {
        &self.settings
    }
}

/// What the benchmark needs of a strategy beyond planning.
pub trait Benched: Show {
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
    /// knob model's at a quarter of the batch), or none.
    fn extrapolating(&self, _target: &mut Self::Target) -> Result<Option<Self>, PlanError> {
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

    fn extrapolating(&self, target: &mut Self::Target) -> Result<Option<Self>, PlanError> {
        let batch = self.space.batch;
        let Some(quarter) = (1..=batch / 4)
            .rev()
            .find(|d| batch.is_multiple_of(*d))
            .filter(|d| *d >= 2)
        else {
            return Ok(None);
        };
        eprintln!("calibrating at batch {quarter} (for the extrapolation error)…");
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
    /// the smallest probe.
    fn sweep(&self) -> Vec<Counted> {
        // Down to the smallest probe above the seeded count.
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

/// One swept setting and what it measured.
#[derive(serde::Serialize)]
struct Swept<S> {
    setting: S,
    measured: Measured,
}

/// The benchmark on a built target (`crate::plan::Action::Bench`).
pub fn bench<T: Runnable<Strategy: Benched>>(target: &mut T, request: Request, name: &str) -> Result<()> {
    eprintln!("calibrating…");
    let cal = T::Strategy::calibrate(target.target(), None)?;
    let small = cal.extrapolating(target.target())?;
    let measure = |target: &mut T, setting: &_| cal.measure(target.target(), setting).map_err(anyhow::Error::msg);
    let mut sweep = Vec::new();
    for setting in cal.sweep().into_iter().filter(|_| request.sweep) {
        eprintln!("sweep {}: {}", sweep.len() + 1, cal.describe(&setting));
        let measured = measure(target, &setting)?;
        sweep.push(Swept { setting, measured });
    }
    let mut rows = Vec::new();
    let mut table = String::from(
        "| budget | chosen plan | planned peak | measured peak | error | within | step ms | fastest swept plan within \
         budget | its step ms (sweep, measured again) | chosen / fastest (again) | extrapolated peak | extrapolation \
         error |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for budget in cal.budgets(&request.fractions) {
        let choice = match cal.choose(budget) {
            Ok(c) => c,
            Err(e) => {
                let named = match &e {
                    PlanError::Infeasible { smallest, .. } => format!("names {smallest}"),
                    other => other.to_string(),
                };
                table.push_str(&format!(
                    "| {} | infeasible: {named} | | | | | | | | | | |\n",
                    human_bytes(budget)
                ));
                rows.push(json!({ "budget": budget, "error": e.to_string() }));
                continue;
            }
        };
        let (choice, measured) = if cal.settles() {
            match vramfit::plan::verify(&cal, target.target(), budget) {
                Ok(v) => (v.choice, v.measured),
                Err(e) => {
                    table.push_str(&format!(
                        "| {} | NO plan verified: {e} | | | | | | | | | | |\n",
                        human_bytes(budget)
                    ));
                    rows.push(json!({ "budget": budget, "error": e.to_string() }));
                    continue;
                }
            }
        } else {
            let measured = measure(target, &choice.plans[0].setting)?;
            (choice, measured)
        };
        let winner = &choice.plans[0];
        let error = winner.peak_bytes as f64 / measured.peak_bytes as f64 - 1.0;
        let best = sweep
            .iter()
            .filter(|s| {
                s.measured.peak_bytes <= budget
                    && (!winner.exact() || cal.exact(&s.setting))
                    && cal.comparable(&winner.setting, &s.setting)
            })
            .min_by(|a, b| {
                cal.swept_rank(&a.setting, &a.measured)
                    .total_cmp(&cal.swept_rank(&b.setting, &b.measured))
            });
        let again = match best {
            Some(b) => Some(measure(target, &b.setting)?),
            None => None,
        };
        let extrapolated = small.as_ref().map(|s| s.predicted_peak(&winner.setting));
        table.push_str(&format!(
            "| {} | {} | {} | {} | {:+.1} % | {} | {:.1} | {} | {} | {} | {} | {} |\n",
            human_bytes(budget),
            cal.describe(&winner.setting),
            human_bytes(winner.peak_bytes),
            human_bytes(measured.peak_bytes),
            error * 100.0,
            if measured.peak_bytes <= budget { "yes" } else { "NO" },
            measured.step_ms,
            match best {
                Some(b) => cal.describe(&b.setting),
                None if sweep.is_empty() => "not swept".into(),
                None => "none fits".into(),
            },
            match (best, again) {
                (Some(b), Some(a)) => format!("{:.1}, again {:.1}", b.measured.step_ms, a.step_ms),
                _ => String::new(),
            },
            match best.and_then(|b| cal.versus(&winner.setting, &b.setting)) {
                Some(words) => words,
                None => again.map_or(String::new(), |a| format!("{:.2}", measured.step_ms / a.step_ms)),
            },
            extrapolated.map_or(String::new(), |e| human_bytes(e as u64)),
            extrapolated.map_or(String::new(), |e| format!(
                "{:+.1} %",
                (e / measured.peak_bytes as f64 - 1.0) * 100.0
            )),
        ));
        rows.push(json!({
            "budget": budget, "chosen": winner, "why": choice.why, "measured": measured, "error": error,
            "best_swept": best, "best_swept_again": again, "extrapolated_peak": extrapolated,
        }));
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let summary = format!(
        "Device: {name}. Peaks are the figure that decides an out-of-memory there (measured). {}{}\n",
        cal.summary(sweep.len()),
        small.as_ref().map_or(String::new(), |s| s.as_extrapolation()),
    );
    println!("{summary}\n{table}");
    let bench = format!("plan-{}", request.workload);
    let record = json!({
        "bench": bench, "command": command, "device": name, "config": request.config,
        "calibration": cal, "extrapolating_calibration": small, "sweep": sweep, "budgets": rows,
    });
    let out = request.out_path();
    write_results(&out, &record, &format!("Command: `{command}`\n\n{summary}\n{table}"))
}

/// Writes a benchmark's JSON record at `out` and its Markdown beside it.
/// A record whose indented form passes 1 MiB (one holding allocation
/// traces) is written without indentation: a fifth of the bytes.
pub(crate) fn write_results(out: &std::path::Path, record: &serde_json::Value, markdown: &str) -> Result<()> {
    if let Some(dir) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(record)?;
    if text.len() > 1 << 20 {
        text = serde_json::to_string(record)?;
    }
    vramfit::run::atomic_write(out, text.as_bytes()).with_context(|| format!("writing {}", out.display()))?;
    let md = out.with_extension("md");
    vramfit::run::atomic_write(&md, markdown.as_bytes()).with_context(|| format!("writing {}", md.display()))?;
    println!("wrote {} and {}", out.display(), md.display());
    Ok(())
}
