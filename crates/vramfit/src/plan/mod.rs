//! The planner: given a memory budget, the fastest combination of the
//! techniques that fits, chosen from a few short measured probes.
//!
//! 1. [`calibrate`] runs probe steps of the real workload on the real
//!    device, one probe per knob and not one per combination (a base, a
//!    smaller batch, micro-batches, every block checkpointed, each lower
//!    precision, low-precision storage, low-precision moments, allocator
//!    cleanup), and reads each probe's peak of the figure that decides an
//!    out-of-memory ([`crate::profile`]) and its step time.
//! 2. From them it fits a [`Model`] that knows how each part scales: fixed
//!    bytes, bytes per sample outside the blocks, per block kept or
//!    checkpointed, the ratio each precision gives, what storage, moments
//!    and cleanup add, and a time model of the same form. Two further
//!    probes of combinations it did not fit on measure its prediction
//!    error.
//! 3. Choosing ([`Strategy::choose`]) enumerates every combination of the other
//!    knobs, and for each the checkpoint set with the least recomputation
//!    that fits what is left ([`chain::optimal`], exact), keeps the plans
//!    whose predicted peak plus a margin (from the measured error) is
//!    within the budget, and ranks them by predicted step time.
//!    Numerically exact plans (checkpointing, micro-batching, cleanup) win
//!    over plans that change the numerics (lower precision, low-precision
//!    storage or moments) unless no exact plan fits.
//! 4. [`verify`] probes the winner at the run's own batch and falls back to
//!    the next plan if it measures over the budget; [`run_plans`] runs it
//!    held to the budget and, on an out-of-memory (or the budget passed),
//!    falls back to the next plan from its last checkpoint. [`run_within`]
//!    does all four in one call for a [`Runnable`] target;
//!    [`run_within_on_ranks`] the same on data-parallel ranks, which a
//!    [`RanksLauncher`] starts.
//!
//! A workload whose memory knob is one ordered setting (the splat fit's
//! band height) is planned by [`ladder`] instead: every rung of a doubling
//! ladder is measured, because a paged allocator makes its peak a step
//! function. Both are a [`Strategy`] with the same result types
//! ([`Plan`], [`Choice`], [`Preset`]), so steps 4 on, the CLI and the
//! benchmarks are written once for both.
//!
//! A workload whose memory grows with a count (a scene's Gaussians) is
//! planned by [`capacity`]: each storage variant is probed at a few
//! counts and a line fitted; the plan is the largest count that fits.
//!
//! Budgets are in the backend's OOM-deciding figure: heap bytes of the
//! process on the CPU (the counting allocator), the allocator's reserved
//! bytes on CubeCL (wgpu, CUDA).

mod bases;
pub mod benchmark;
mod calibrate;
pub mod capacity;
pub mod chain;
mod choose;
mod cost_model;
pub mod ladder;
mod on_ranks;
mod pipeline;
mod planned;
mod probe;
pub mod quality;
pub mod slice;
mod strategy;
pub mod tokens;
pub mod traced;
pub mod work;

pub use capacity::{Capacity, CapacityCalibration, Counted, Line, Variant, calibrate_capacity};
pub use cost_model::{Delta, FusedCosts, Model, ProbeRecord, TIME_RESOLUTION};
pub use ladder::{Ladder, LadderCalibration, Rung, calibrate_ladder};
pub use on_ranks::{
    OnRanks, RanksJob, RanksLauncher, RanksWithinBudget, VerifiedOnRanks, run_within_on_ranks, verify_on_ranks,
};
pub use pipeline::{
    BudgetError, FALLBACKS, Found, GAP_SAID, Options, Runnable, SIMULATED_OOM, Setting, VERIFY_TRIES, Verified, Within,
    WithinBudget, prediction_gap, record, run_plans, run_within, run_within_showing, verify,
};
pub use planned::{Planned, PlannedRun};
pub use probe::{Measured, PROBE_STEPS, ProbeError, measure_run, measured_in, run_probe};
pub use slice::{Deep, Slice, calibrate_sliced};
pub use strategy::{Choice, Plan, PlanError, Preset, Strategy};
pub use tokens::{Long, TokenLaw, calibrate_long};
pub use work::Work;

use serde::{Deserialize, Serialize};

/// What a preset table calibrated on `device` (a `--device` name) cannot
/// know about cards, where that matters: CubeCL sizes its pool pages from
/// the device (CUDA: a quarter of the card's memory, then a sixteenth, …;
/// wgpu: the adapter's largest storage binding, 128 MiB on lavapipe), so
/// the peaks measured here hold this device's pages. On an H200 one
/// 1.03 GiB buffer took an 8.8 GiB page; a 16 GiB card would give it a
/// 4 GiB one. [`crate::pools`] replays a card's own pools for workloads
/// whose buffers it records (the scene); for the others this caveat
/// stands.
pub fn preset_caveat(device: &str) -> Option<&'static str> {
    if device.starts_with("cuda") {
        Some(
            "CubeCL's CUDA allocator sizes its pool pages from the card's memory, so the peaks measured here hold \
             this card's pages: rows for cards of another size are extrapolations that do not know theirs (a \
             buffer can cost a smaller card a whole page). Plan on the card itself before relying on its row.",
        )
    } else if device.starts_with("wgpu") {
        Some(
            "the peaks measured here hold this adapter's pool pages (up to its largest storage binding: 128 MiB \
             on lavapipe), not a CUDA card's, which are fractions of the card's memory: the rows are this device's \
             figures, not the cards' own (vramfit replays a card's own pools only for workloads whose buffers it \
             records, the scene). Plan on the card itself before relying on its row.",
        )
    } else {
        None
    }
}

use crate::frozen::BaseStorage;
use crate::precision::Precision;

/// The knobs of a training step the planner turns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knobs {
    /// Precision of the matrix work.
    pub precision: Precision,
    /// For each block, whether it is checkpointed.
    pub checkpointed: Vec<bool>,
    /// Samples per forward/backward; `batch / micro_batch` are accumulated.
    pub micro_batch: usize,
    /// How many parameter groups (largest first) are stored in bf16.
    pub low_storage: usize,
    /// Adam moments stored in bf16.
    pub low_moments: bool,
    /// Adam moments in host memory (f32; exact), where the space offers it.
    #[serde(default)]
    pub host_moments: bool,
    /// Allocator cleanup after every step.
    pub cleanup: bool,
    /// The model's attention fused (scores recomputed in the backward, never
    /// kept; exact up to summation order), where the space offers it.
    #[serde(default)]
    pub fused_attention: bool,
    /// Data-parallel ranks sharing the step, Adam's moments sharded over
    /// them (1: one process). Predicted per rank, from one rank's probes.
    #[serde(default = "one_rank")]
    pub ranks: usize,
    /// How the frozen base is stored, where the space offers the choice
    /// ([`Space::bases`]; `None`: as the workload's settings say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseStorage>,
}

fn one_rank() -> usize {
    1
}

impl Knobs {
    /// The reference: f32, nothing checkpointed, the whole batch at once.
    pub fn base(blocks: usize, batch: usize) -> Self {
        Self {
            precision: Precision::F32,
            checkpointed: vec![false; blocks],
            micro_batch: batch,
            low_storage: 0,
            low_moments: false,
            host_moments: false,
            cleanup: false,
            fused_attention: false,
            ranks: 1,
            base: None,
        }
    }

    /// The checkpoint marks as the setting `checkpoint` reads them.
    pub fn checkpoint_setting(&self) -> String {
        let on: Vec<String> = (0..self.checkpointed.len())
            .filter(|i| self.checkpointed[*i])
            .map(|i| i.to_string())
            .collect();
        match on.len() {
            0 => "none".into(),
            n if n == self.checkpointed.len() => "all".into(),
            _ => format!("list:{}", on.join(",")),
        }
    }

    /// How many knobs differ from the reference (each checkpointed block counts).
    pub fn turned(&self, batch: usize) -> usize {
        self.checkpointed.iter().filter(|c| **c).count()
            + usize::from(self.precision != Precision::F32)
            + usize::from(self.micro_batch < batch)
            + self.low_storage
            + usize::from(self.low_moments)
            + usize::from(self.host_moments)
            + usize::from(self.cleanup)
            + usize::from(self.fused_attention)
            + usize::from(self.ranks > 1)
            + usize::from(self.base.is_some_and(|b| b != BaseStorage::F32))
    }

    /// What the knobs change in the numerics, in words (empty: exact up
    /// to summation order).
    pub fn quality_costs(&self, space: &Space) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(cost) = self.base.and_then(bases::quality_cost) {
            out.push(cost);
        }
        match self.precision {
            Precision::F32 => {}
            Precision::Bf16 => out.push("bf16 matrix work (8-bit mantissa; f32 masters)".to_string()),
            Precision::F16 => {
                out.push("f16 matrix work with dynamic loss scaling (overflowing steps are skipped)".into())
            }
        }
        if self.low_storage > 0 {
            let names: Vec<&str> = space.storage_groups[..self.low_storage.min(space.storage_groups.len())]
                .iter()
                .map(|(n, _)| n.as_str())
                .collect();
            out.push(format!(
                "{} stored in bf16 (updates below half a bf16 step are lost)",
                names.join(", ")
            ));
        }
        if self.low_moments {
            out.push("Adam moments rounded to bf16".into());
        }
        if let Some(layer) = space
            .batch_statistics
            .as_ref()
            .filter(|_| self.micro_batch < space.batch)
        {
            out.push(format!(
                "{layer} normalises each micro-batch of {} by its own statistics, not the batch of {}'s",
                self.micro_batch, space.batch
            ));
        }
        out
    }

    /// The knobs in a line, for tables.
    pub fn describe(&self, batch: usize) -> String {
        let mut parts = vec![
            self.precision.name().to_string(),
            format!("checkpoint {}", self.checkpoint_setting()),
            format!("{}×{}", self.micro_batch, batch / self.micro_batch.max(1)),
        ];
        if self.low_storage > 0 {
            parts.push(format!("storage bf16 ×{}", self.low_storage));
        }
        if self.low_moments {
            parts.push("moments bf16".into());
        }
        if self.host_moments {
            parts.push("moments host".into());
        }
        if self.cleanup {
            parts.push("cleanup".into());
        }
        if self.fused_attention {
            parts.push("attention fused".into());
        }
        if self.ranks > 1 {
            parts.push(format!("{} ranks, moments sharded", self.ranks));
        }
        if let Some(base) = self.base {
            parts.push(format!("base {}", base.name()));
        }
        parts.join(" · ")
    }
}

/// What a workload offers the planner: its shape and which knobs its
/// device supports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Space {
    /// The effective batch (samples per optimiser step), kept fixed.
    pub batch: usize,
    /// Blocks of the chain.
    pub blocks: usize,
    /// Bytes of one block's input per sample in f32 (what a checkpointed block keeps).
    pub block_input_bytes: u64,
    /// Precisions the device supports (f32 first).
    pub precisions: Vec<Precision>,
    /// Parameter groups that may be stored in bf16, largest first, with their f32 bytes
    /// (empty where the device has no bf16).
    pub storage_groups: Vec<(String, u64)>,
    /// Whether moments may be stored in bf16.
    pub low_moments: bool,
    /// Whether moments may live in host memory (a GPU device: on the CPU
    /// the host is the device).
    #[serde(default)]
    pub host_moments: bool,
    /// The layer that normalises with statistics over the samples of a
    /// forward pass (`BatchNorm`), if the model has one: then a micro-batch
    /// is normalised by its own statistics, not the batch's, and splitting
    /// the batch changes the numerics.
    #[serde(default)]
    pub batch_statistics: Option<String>,
    /// Blocks that differ (a U-Net's stages, by level): per block, its
    /// share of the activations relative to the mean block (1 for equal
    /// blocks) and the bytes per sample of its input in f32. Empty: every
    /// block equal, each keeping `block_input_bytes` when checkpointed.
    #[serde(default)]
    pub block_shapes: Vec<(f64, u64)>,
    /// The precisions at which the model's attention has a fused kernel on
    /// this device (empty: no attention, or no kernel here, where fusing
    /// would change nothing).
    #[serde(default)]
    pub fused_attention: Vec<Precision>,
    /// The trainable parameters' sizes (values), in the module's order:
    /// how Adam's moments shard over data-parallel ranks (empty: unknown,
    /// no saving predicted).
    #[serde(default)]
    pub parameters: Vec<usize>,
    /// How the frozen base may be stored, best quality first: the planner
    /// calibrates each and lowers it only where nothing fits at the one
    /// before (the `bases` module). Empty: not a knob (nothing frozen, or
    /// the settings fix it).
    #[serde(default)]
    pub bases: Vec<BaseStorage>,
    /// The forward's operations per sample counted from the shapes, where
    /// the workload counts them: the step time of a deeper or longer run
    /// is the probed one scaled by them ([`work`]). `None`: scaled by
    /// differences of measured times.
    #[serde(default)]
    pub work: Option<Work>,
}

/// The sizes (values) of `model`'s trainable parameters in its order: the
/// [`Space::parameters`] a workload gives the planner.
pub fn trainable_sizes<B: burn::tensor::backend::Backend, M: burn::module::Module<B>>(model: &M) -> Vec<usize> {
    crate::params::describe(model)
        .into_iter()
        .filter(|p| p.trainable)
        .map(|p| p.shape.iter().product())
        .collect()
}

impl Space {
    /// Micro-batch sizes that divide the batch, largest first.
    pub fn micro_batches(&self) -> Vec<usize> {
        (1..=self.batch)
            .rev()
            .filter(|m| self.batch.is_multiple_of(*m))
            .collect()
    }
}

/// A workload the planner can probe.
pub trait Plannable {
    /// Its shape and the knobs its device supports.
    fn space(&self) -> Space;
    /// Runs a few steps with `knobs` at effective batch `batch` (the
    /// workload's own or a reduced one) and measures them.
    fn measure(&mut self, knobs: &Knobs, batch: usize) -> Result<Measured, ProbeError>;
    /// Where it is to be planned from a slice of its blocks ([`slice`]):
    /// itself as a [`Deep`] workload. `None` (the default): probe the whole.
    fn deep(&self) -> Option<&dyn Deep> {
        None
    }
    /// Where it is to be probed at fewer tokens a sample ([`tokens`]):
    /// itself as a [`Long`] workload. `None` (the default): at its own.
    fn long(&self) -> Option<&dyn Long> {
        None
    }
    /// Stores the frozen base as `base` in every later probe (one of
    /// [`Space::bases`]), slices and shorter probes included.
    fn at_base(&mut self, _base: BaseStorage) {}
}

/// Runs the probes and fits the model (see the module's description).
/// `probe_batch` runs the probes at a smaller effective batch and
/// extrapolates to the workload's (`None`: the workload's own). A
/// workload that asks to be planned from a slice ([`Plannable::deep`]) is
/// probed only that deep and extrapolated ([`calibrate_sliced`]).
pub fn calibrate(target: &mut dyn Plannable, probe_batch: Option<usize>) -> Result<Calibration, PlanError> {
    let offered = target.space().bases;
    if offered.is_empty() {
        calibrate_at_base(target, probe_batch)
    } else {
        bases::calibrate_bases(target, &offered, probe_batch)
    }
}

/// [`calibrate`] with the frozen base as the target stores it.
fn calibrate_at_base(target: &mut dyn Plannable, probe_batch: Option<usize>) -> Result<Calibration, PlanError> {
    if let Some(long) = target.long() {
        return calibrate_long(long, target.space(), probe_batch);
    }
    match target.deep() {
        Some(deep) => calibrate_sliced(deep, probe_batch),
        None => calibrate::calibrate(target, probe_batch),
    }
}

/// The fitted model with the probes it came from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Calibration {
    /// The workload's space.
    pub space: Space,
    /// The model.
    pub model: Model,
    /// The probes the model was fitted on.
    pub probes: Vec<ProbeRecord>,
    /// Probes of combinations the fit did not see, with their predictions.
    pub checks: Vec<ProbeRecord>,
    /// Largest relative error of the predicted peak on `checks`.
    pub peak_error: f64,
    /// Largest relative shortfall of the predicted peak on the probes and
    /// the checks (the measured peak above the prediction): the error that
    /// could break a budget.
    #[serde(default)]
    pub shortfall: f64,
    /// Largest relative error of the predicted step time on `checks`.
    pub time_error: f64,
    /// Seconds spent probing.
    pub seconds: f64,
    /// The effective batch the probes ran at.
    pub probe_batch: usize,
    /// Where the probes ran on a slice of the model's blocks: how the
    /// whole depth was extrapolated (every predicted figure then is).
    #[serde(default)]
    pub slice: Option<Slice>,
    /// Where the probes ran at fewer tokens a sample: how the run's length
    /// was extrapolated (every predicted figure then is).
    #[serde(default)]
    pub tokens: Option<TokenLaw>,
    /// The frozen base's storage every probe ran with, where the space
    /// offers the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseStorage>,
    /// The calibrations at the lower bases of [`Space::bases`], in order:
    /// each a whole calibration of its own (the `bases` module).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lower_bases: Vec<Calibration>,
}

impl Calibration {
    /// Predicted peak bytes and step ms of `knobs` at the workload's batch.
    pub fn predict(&self, knobs: &Knobs) -> (f64, f64) {
        let at = self.at_base(knobs.base);
        at.model.predict(knobs, at.space.batch)
    }

    /// The calibration as a GPU card would hold it, where the probes ran
    /// on a device whose files phases encode a copy of the state in the
    /// deciding memory (the CPU's heap, [`Measured::files_peak_bytes`]): a
    /// GPU encodes its checkpoints and final files in host memory, so its
    /// rest is the other phases' (the optimiser's, between steps). `None`
    /// where the probes measured no such copy.
    pub fn on_a_card(&self) -> Option<Calibration> {
        (self.model.files_bytes > 0.0).then(|| {
            let mut card = self.clone();
            let m = &mut card.model;
            m.rest_bytes = m.between_bytes;
            m.files_bytes = 0.0;
            for d in [&mut m.storage, &mut m.moments, &mut m.host_moments, &mut m.cleanup] {
                d.rest = d.between;
            }
            card.lower_bases = self
                .lower_bases
                .iter()
                .map(|c| c.on_a_card().unwrap_or_else(|| c.clone()))
                .collect();
            card
        })
    }
}

/// A byte count that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{text}' {why}; write e.g. 6GiB, 512MiB, 1.5GB or a number of bytes")]
pub struct SizeError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub why: String,
}

/// Parses a byte count: `6GiB`, `512MiB`, `1.5GB`, `2e9`, `123456`.
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    let fail = |why: &str| SizeError {
        text: text.into(),
        why: why.into(),
    };
    // `1_000MiB` as counts are written.
    let t = &text.trim().replace('_', "");
    // The unit is the trailing letters (a number like `2e9` or `1e3GiB`
    // keeps its exponent).
    let split = if t.parse::<f64>().is_ok() {
        t.len()
    } else {
        t.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len()
    };
    let (number, unit) = t.split_at(split);
    // The number first: `NaNGiB` or `e999gib` has none (all letters).
    let value: f64 = number.trim().parse().map_err(|_| fail("is not a size"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        "p" | "pib" => 1024f64.powi(5),
        "pb" => 1e15,
        other => {
            return Err(fail(&format!("has an unknown unit '{other}'")));
        }
    };
    let bytes = value * scale;
    // (An exponent past f64's range is infinite: too large as well.)
    if bytes >= u64::MAX as f64 {
        return Err(fail("is too large: at most 16 EiB"));
    }
    if !(bytes.is_finite() && bytes >= 1.0) {
        return Err(fail("is not a positive size"));
    }
    Ok(bytes.round() as u64)
}

/// A plan that ran out of memory and what replaced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fallback {
    /// Index of the plan that failed.
    pub from: usize,
    /// Index of the plan that took over.
    pub to: usize,
    /// The error, in words.
    pub error: String,
}

/// Runs plan 0 with `attempt(0, false)`; when an attempt fails with an
/// out-of-memory (`is_oom`), runs the next plan resumed from the run's last
/// checkpoint (`attempt(i + 1, true)`), until one finishes or the plans
/// run out (then the last error is returned).
pub fn with_fallback<S, E: std::fmt::Display>(
    plans: usize,
    mut attempt: impl FnMut(usize, bool) -> Result<S, E>,
    is_oom: impl Fn(&E) -> bool,
) -> Result<(S, Vec<Fallback>), E> {
    let mut fallbacks = Vec::new();
    let mut i = 0;
    loop {
        match attempt(i, i > 0) {
            Ok(s) => return Ok((s, fallbacks)),
            Err(e) if is_oom(&e) && i + 1 < plans => {
                fallbacks.push(Fallback {
                    from: i,
                    to: i + 1,
                    error: e.to_string(),
                });
                i += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

impl Strategy for Calibration {
    type Setting = Knobs;
    type Target = dyn Plannable;

    fn calibrate(target: &mut (dyn Plannable + 'static), probe_batch: Option<usize>) -> Result<Self, PlanError> {
        calibrate(target, probe_batch)
    }
    fn choose(&self, budget: u64) -> Result<Choice<Knobs>, PlanError> {
        self.choose_knobs(budget)
    }
    /// Twice the largest shortfall measured on the probes and checks, at
    /// least 3 %. (Predictions above the measurement cost memory, not
    /// safety; on a paged allocator they are mostly the rounding up to
    /// whole pages.)
    /// Over several bases, the largest of theirs (each base's plans are
    /// chosen with its own).
    fn margin(&self) -> f64 {
        self.bases().map(Calibration::own_margin).fold(0.0, f64::max)
    }
    fn measure(&self, target: &mut (dyn Plannable + 'static), knobs: &Knobs) -> Result<Measured, ProbeError> {
        target.measure(knobs, self.space.batch)
    }
    fn describe(&self, knobs: &Knobs) -> String {
        knobs.describe(self.space.batch)
    }
    fn account(&self) -> serde_json::Value {
        if !self.lower_bases.is_empty() {
            return serde_json::json!({
                "bases": self
                    .bases()
                    .map(|c| {
                        let mut one = c.account_at_base();
                        one["base"] = serde_json::json!(c.base.map(BaseStorage::name));
                        one
                    })
                    .collect::<Vec<_>>(),
                "probe_seconds": self.bases().map(|c| c.seconds).sum::<f64>(),
            });
        }
        self.account_at_base()
    }
}

impl Calibration {
    /// The margin of this base's calibration alone.
    pub fn own_margin(&self) -> f64 {
        (2.0 * self.shortfall).max(0.03)
    }

    /// [`Strategy::account`] of this base's calibration alone.
    fn account_at_base(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "model_peak_error": self.peak_error,
            "model_time_error": self.time_error,
            "probes": self.probes.len() + self.checks.len()
                + self.slice.as_ref().map_or(0, Slice::deeper_probes)
                + self.tokens.as_ref().map_or(0, |t| t.probes.len()),
            "probe_seconds": self.seconds,
            "extrapolated_from_slice": self.slice,
            "extrapolated_in_tokens": self.tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_bytes("6GiB"), Ok(6 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("2e9"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("1e3KiB"), Ok(1_024_000));
        assert_eq!(parse_bytes("1_000MiB"), Ok(1000 << 20));
        // No number at all is said so, not called a unit.
        for letters in ["NaNGiB", "e999gib", "GiB"] {
            let e = parse_bytes(letters).unwrap_err().to_string();
            assert!(e.contains("is not a size") && !e.contains("unit"), "{letters}: {e}");
        }
        for huge in ["1e999GiB", "1e999", "20000PiB"] {
            let e = parse_bytes(huge).unwrap_err().to_string();
            assert!(e.contains("too large"), "{huge}: {e}");
        }
        for bad in ["six", "6 GiBs", "-1GiB", "0", "nan"] {
            let e = parse_bytes(bad).unwrap_err().to_string();
            assert!(e.contains(bad.trim()), "{e}");
        }
    }

    #[test]
    fn fallback_moves_to_the_next_plan_only_on_out_of_memory() {
        let mut calls = Vec::new();
        let (v, f) = with_fallback(
            3,
            |i, resumed| {
                calls.push((i, resumed));
                if i < 2 {
                    Err(format!("out of memory in plan {i}"))
                } else {
                    Ok(i)
                }
            },
            |e: &String| e.contains("out of memory"),
        )
        .unwrap();
        assert_eq!((v, f.len()), (2, 2));
        assert_eq!(calls, vec![(0, false), (1, true), (2, true)]);
        let e = with_fallback(
            3,
            |_, _| Err::<(), _>("disk full".to_string()),
            |e| e.contains("memory"),
        );
        assert_eq!(e.unwrap_err(), "disk full");
        let e = with_fallback(
            1,
            |_, _| Err::<(), _>("out of memory".to_string()),
            |e| e.contains("memory"),
        );
        assert!(e.is_err());
    }
}
