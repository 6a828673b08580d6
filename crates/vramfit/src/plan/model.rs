//! The memory and time model, fitted on one probe per knob.
//!
//! The peak is the larger of two parts, each measured on its own by the
//! profiler's phase records: the step's forward and backward, and the rest
//! (optimiser, checkpoint writes, final files). With `m` samples per
//! micro-batch and `k` micro-batches, the step part is
//!
//! `fixed + storage·f(groups) + moments + cleanup + [k > 1]·accumulator
//!   + ρ(precision) · m · (outside + chain_peak(blocks, marks))`
//!
//! and the rest is `rest + what precision, storage, moments and cleanup
//! add to it`, where `outside` is what a sample keeps outside the blocks (embeddings,
//! head, loss) and each block keeps `activations` per sample when plain and
//! its `input` when checkpointed ([`super::chain`]). Step time:
//!
//! `fixed_ms + π(precision) · (k·micro_batch_ms + B·sample_ms + B·recompute·|marks|)
//!   + storage_ms·f(groups) + moments_ms + cleanup_ms`.
//!
//! Where the model's attention can be fused, the fixed bytes, the outside
//! and block costs and the time per sample are fitted a second time from
//! three probes with it fused ([`FusedCosts`]): fusing changes the blocks'
//! activations, not a constant.
//!
//! Every coefficient comes from differences between probes, so the model
//! is exact on the probes it was fitted on; its error is measured on
//! combinations it did not see.

use std::borrow::Cow;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::chain::{BlockCost, chain_peak};
use super::{Calibration, Knobs, Measured, PlanError, Plannable, Space};
use crate::precision::Precision;

/// The fitted coefficients (bytes, milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Bytes that do not scale with the micro-batch.
    pub fixed_bytes: f64,
    /// Bytes per sample outside the blocks.
    pub outside_bytes: f64,
    /// The mean block's costs per sample (bytes; recomputation in ms).
    pub block: BlockCost,
    /// Blocks in the chain.
    pub blocks: usize,
    /// Blocks that differ: each one's activation share of the mean block's
    /// and its input bytes per sample ([`super::Space::block_shapes`]);
    /// empty: every block is `block`.
    #[serde(default)]
    pub block_shapes: Vec<(f64, u64)>,
    /// Bytes the gradient accumulator adds when `k > 1`.
    pub accumulator_bytes: f64,
    /// Per lower precision: its ratio on the per-sample bytes, on the
    /// step's scaled time, and the bytes it adds to the rest.
    pub precisions: Vec<(Precision, f64, f64, f64)>,
    /// What storing every group in bf16 adds (negative: saves).
    pub storage: Delta,
    /// For `low_storage = g`, the share of the parameters' bytes in those groups.
    pub storage_share: Vec<f64>,
    /// What bf16 moments add.
    pub moments: Delta,
    /// What moments in host memory add (negative bytes: the moments leave
    /// the device; time: the copies and the host's update).
    #[serde(default)]
    pub host_moments: Delta,
    /// What cleanup after every step adds.
    pub cleanup: Delta,
    /// Bytes of the rest (outside forward and backward) with the base knobs.
    pub rest_bytes: f64,
    /// Of the rest, the phases that write files, where they hold a copy of
    /// the state in the figure's memory ([`Measured::files_peak_bytes`];
    /// 0: not known), and the others: the probe that gave `rest_bytes`.
    #[serde(default)]
    pub files_bytes: f64,
    /// See `files_bytes`.
    #[serde(default)]
    pub between_bytes: f64,
    /// The allocator reserves whole pages of this many bytes (1: no pages
    /// seen): the greatest common divisor of the probes' readings.
    #[serde(default = "one")]
    pub page_bytes: u64,
    /// The micro-batch the per-sample bytes were measured down to.
    #[serde(default)]
    pub least_probed_micro_batch: usize,
    /// What a micro-batch of one measured above the linear law (bytes that
    /// do not shrink with the micro-batch below the probed ones: per-channel
    /// buffers, kernel scratch). Plans below the probed micro-batch get a
    /// share of it in proportion to how far below they are.
    #[serde(default)]
    pub below_probed_bytes: f64,
    /// No step is predicted faster than this: half the fastest probe
    /// (noisy deltas can otherwise add up to nothing).
    #[serde(default)]
    pub floor_ms: f64,
    /// Time per step that does not scale with the batch (the optimiser).
    pub fixed_ms: f64,
    /// Time per micro-batch beyond its samples (launches, graph set-up).
    pub micro_batch_ms: f64,
    /// Time per sample.
    pub sample_ms: f64,
    /// The costs with the attention fused, where the space offers it.
    #[serde(default)]
    pub fused_attention: Option<FusedCosts>,
    /// The trainable parameters' sizes in the module's order
    /// ([`Space::parameters`]): what sharding the moments over ranks saves.
    #[serde(default)]
    pub parameters: Vec<usize>,
}

/// The terms that fusing the attention changes, fitted from its own probes
/// (plain, a smaller batch, every block checkpointed) as the base's are:
/// it shrinks each block's activations, may add scratch that does not
/// scale with the batch, and changes the time per sample and recomputation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FusedCosts {
    /// Bytes that do not scale with the micro-batch.
    pub fixed_bytes: f64,
    /// Bytes per sample outside the blocks.
    pub outside_bytes: f64,
    /// The mean block's costs per sample.
    pub block: BlockCost,
    /// Time per step that does not scale with the batch.
    pub fixed_ms: f64,
    /// Time per sample.
    pub sample_ms: f64,
    /// Per lower precision at which it is fused: its own bytes and time
    /// ratios (the plain attention's are not the fused one's: its scores
    /// were most of what a lower precision shrank or grew).
    #[serde(default)]
    pub precisions: Vec<(Precision, f64, f64)>,
}

/// What one knob adds to the step's peak, the rest's peak and the step time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// Bytes added to the forward/backward peak.
    pub step: f64,
    /// Bytes added to the peak of the other phases.
    pub rest: f64,
    /// Milliseconds added per step.
    pub ms: f64,
}

/// One probe: its knobs, batch, measurement and the model's prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
    /// What it varies.
    pub name: String,
    /// Its knobs.
    pub knobs: Knobs,
    /// Its effective batch.
    pub batch: usize,
    /// What it measured.
    pub measured: Measured,
    /// The model's peak for it (bytes).
    pub predicted_peak: f64,
    /// The model's step time for it (ms).
    pub predicted_ms: f64,
}

impl ProbeRecord {
    /// Relative error of the predicted peak.
    pub fn peak_error(&self) -> f64 {
        (self.predicted_peak - self.measured.peak_bytes as f64).abs() / (self.measured.peak_bytes as f64).max(1.0)
    }

    /// How far the measured peak is above the prediction, relative (0 when below).
    pub fn shortfall(&self) -> f64 {
        ((self.measured.peak_bytes as f64 - self.predicted_peak) / (self.measured.peak_bytes as f64).max(1.0)).max(0.0)
    }

    /// Relative error of the predicted step time.
    pub fn time_error(&self) -> f64 {
        (self.predicted_ms - self.measured.step_ms).abs() / self.measured.step_ms.max(1e-9)
    }
}

impl Model {
    /// The model of a step with `knobs`: this one, or with the fused
    /// attention's terms where they ask for it.
    pub fn with(&self, knobs: &Knobs) -> Cow<'_, Model> {
        match self.fused_attention.as_ref().filter(|_| knobs.fused_attention) {
            Some(f) => Cow::Owned(Model {
                fixed_bytes: f.fixed_bytes,
                outside_bytes: f.outside_bytes,
                block: f.block,
                fixed_ms: f.fixed_ms,
                sample_ms: f.sample_ms,
                // Its own ratios where probed; what a precision adds to the rest is the plain one's.
                precisions: self
                    .precisions
                    .iter()
                    .map(|&(p, rho, pi, rest)| {
                        let own = f.precisions.iter().find(|x| x.0 == p);
                        let (rho, pi) = own.map_or((rho, pi), |&(_, r, t)| (r, t));
                        (p, rho, pi, rest)
                    })
                    .collect(),
                fused_attention: None,
                ..self.clone()
            }),
            None => Cow::Borrowed(self),
        }
    }

    /// (bytes ratio, time ratio, bytes added to the rest) of precision `p`.
    fn precision(&self, p: Precision) -> (f64, f64, f64) {
        self.precisions
            .iter()
            .find(|(q, ..)| *q == p)
            .map_or((1.0, 1.0, 0.0), |(_, m, t, r)| (*m, *t, *r))
    }

    /// What the knobs other than the batch split and checkpointing add.
    fn deltas(&self, knobs: &Knobs) -> Delta {
        let share = self.share(knobs.low_storage);
        let parts = [
            (self.storage, share),
            (self.moments, if knobs.low_moments { 1.0 } else { 0.0 }),
            (self.host_moments, if knobs.host_moments { 1.0 } else { 0.0 }),
            (self.cleanup, if knobs.cleanup { 1.0 } else { 0.0 }),
        ];
        parts.iter().fold(Delta::default(), |a, (d, f)| Delta {
            step: a.step + d.step * f,
            rest: a.rest + d.rest * f,
            ms: a.ms + d.ms * f,
        })
    }

    /// What sharding Adam's moments over `knobs.ranks` ranks adds on the
    /// rank that keeps the most (arithmetic, not probed), and the moments'
    /// bytes it saves: the other ranks' moments leave it (8 bytes a value
    /// in f32, 4 in bf16, none on the device when they live on the host).
    /// Summing each micro-batch's gradients onto their owners right after
    /// its backward holds one more f32 copy of the largest parameter and
    /// one exchange slice beside the step's gradients
    /// ([`crate::ranks::sum_gradients`]; a bound: on the CPU the copy is
    /// the gradient's own buffer), and the owner's broadcast one f32 copy
    /// of it in the optimizer's phase.
    fn sharding(&self, knobs: &Knobs) -> (Delta, f64) {
        if knobs.ranks <= 1 || self.parameters.is_empty() {
            return (Delta::default(), 0.0);
        }
        let per_value = match (knobs.host_moments, knobs.low_moments) {
            (true, _) => 0.0,
            (false, true) => 4.0,
            (false, false) => 8.0,
        };
        let all: usize = self.parameters.iter().sum();
        let kept = crate::optim::shard_loads(&self.parameters, knobs.ranks)
            .into_iter()
            .max()
            .unwrap_or(all);
        let saved = per_value * (all - kept) as f64;
        let largest = self.parameters.iter().copied().max().unwrap_or(0);
        let exchange = 4.0 * (largest + largest.min(crate::ranks::EXCHANGE_VALUES)) as f64;
        let delta = Delta {
            step: exchange - saved,
            rest: exchange - saved,
            ms: 0.0,
        };
        (delta, saved)
    }

    /// The rest's bytes on `knobs`' ranks, `base` being the one-rank rest's
    /// difference from the base probe's (precision and the other knobs).
    /// Where the probes told the phases that write files from the others
    /// ([`Model::files_bytes`]), a sharded rank's files phases save the
    /// other ranks' moments twice (the moments held and their encoded copy
    /// in the file; measured on a 2-rank transformer: 30.1 MiB of copies on
    /// one rank, 20.0 on a sharded one) and hold no exchange; its other
    /// phases save them once and hold the exchange.
    fn rest(&self, knobs: &Knobs, base: f64) -> f64 {
        let (sharded, saved) = self.sharding(knobs);
        if self.files_bytes > 0.0 && saved > 0.0 {
            (self.between_bytes + base + sharded.rest).max(self.files_bytes + base - 2.0 * saved)
        } else {
            self.rest_bytes + base + sharded.rest
        }
    }

    /// The share of the gradients a rank accumulates over its micro-batches:
    /// with the moments sharded, only its own parameters' (the values of
    /// the rank that keeps the most), the others' being summed onto their
    /// owners after each backward (ZeRO stage 2).
    fn accumulated_share(&self, knobs: &Knobs) -> f64 {
        let all: usize = self.parameters.iter().sum();
        if knobs.ranks <= 1 || all == 0 {
            return 1.0;
        }
        let kept = crate::optim::shard_loads(&self.parameters, knobs.ranks)
            .into_iter()
            .max()
            .unwrap_or(all);
        kept as f64 / all as f64
    }

    fn share(&self, groups: usize) -> f64 {
        self.storage_share
            .get(groups)
            .copied()
            .unwrap_or(if groups == 0 { 0.0 } else { 1.0 })
    }

    /// The chain's blocks, per sample.
    pub fn chain(&self) -> Vec<BlockCost> {
        shaped(self.block, self.blocks, &self.block_shapes)
    }

    /// The chain's blocks, per sample, in a step with `knobs`.
    pub fn chain_for(&self, knobs: &Knobs) -> Vec<BlockCost> {
        self.with(knobs).chain()
    }

    /// The step part's bytes that do not depend on the checkpoint marks,
    /// the factor (`ρ·m`) that turns the chain's per-sample peak into
    /// bytes, and the rest part's bytes.
    pub fn split(&self, knobs: &Knobs, batch: usize) -> (f64, f64, f64) {
        if let Cow::Owned(fused) = self.with(knobs) {
            return fused.split(knobs, batch);
        }
        let m = knobs.micro_batch.max(1) as f64;
        let (rho, _, rest) = self.precision(knobs.precision);
        let d = self.deltas(knobs);
        // Each rank sums its own share of the micro-batches: one alone
        // needs no accumulator.
        let accumulating = batch / knobs.micro_batch.max(1) / knobs.ranks.max(1) > 1;
        let q = self.least_probed_micro_batch;
        let below = if knobs.micro_batch < q && q > 1 {
            self.below_probed_bytes * (q - knobs.micro_batch) as f64 / (q - 1) as f64
        } else {
            0.0
        };
        let outside = self.fixed_bytes
            + d.step
            + self.sharding(knobs).0.step
            + if accumulating {
                self.accumulator_bytes * self.accumulated_share(knobs)
            } else {
                0.0
            }
            + rho * m * self.outside_bytes
            + below;
        (outside, rho * m, self.rest(knobs, rest + d.rest))
    }

    /// Predicted peak bytes (in whole pages) and step ms of `knobs` at effective batch `batch`.
    pub fn predict(&self, knobs: &Knobs, batch: usize) -> (f64, f64) {
        if let Cow::Owned(fused) = self.with(knobs) {
            return fused.predict(knobs, batch);
        }
        let (outside, scale, rest) = self.split(knobs, batch);
        let step = outside + scale * chain_peak(&self.chain(), &knobs.checkpointed);
        (self.pages_up(step.max(rest)), self.time(knobs, batch))
    }

    /// `bytes` rounded up to whole pages.
    pub fn pages_up(&self, bytes: f64) -> f64 {
        let page = self.page_bytes.max(1) as f64;
        (bytes / page).ceil() * page
    }

    /// `bytes` rounded down to whole pages.
    pub fn pages_down(&self, bytes: f64) -> f64 {
        let page = self.page_bytes.max(1) as f64;
        (bytes / page).floor() * page
    }

    /// Predicted step ms.
    pub fn time(&self, knobs: &Knobs, batch: usize) -> f64 {
        if let Cow::Owned(fused) = self.with(knobs) {
            return fused.time(knobs, batch);
        }
        // On ranks, each runs its share of the micro-batches (the
        // gradients' exchange is not modelled).
        let ranks = knobs.ranks.max(1) as f64;
        let k = ((batch / knobs.micro_batch.max(1)).max(1) as f64 / ranks).max(1.0);
        let b = batch as f64 / ranks;
        let (_, pi, _) = self.precision(knobs.precision);
        let recompute = super::chain::recompute(&self.chain(), &knobs.checkpointed);
        let scaled = k * self.micro_batch_ms + b * self.sample_ms + b * recompute;
        (self.fixed_ms + pi * scaled + self.deltas(knobs).ms).max(self.floor_ms)
    }
}

/// The chain of `n` blocks whose mean is `mean`, shaped by `shapes` (each
/// block's activation share and input bytes; empty: `n` equal blocks).
fn shaped(mean: BlockCost, n: usize, shapes: &[(f64, u64)]) -> Vec<BlockCost> {
    if shapes.len() != n {
        return vec![mean; n];
    }
    shapes
        .iter()
        .map(|&(share, input)| BlockCost {
            activations: mean.activations * share,
            input: input as f64,
            recompute: mean.recompute * share,
        })
        .collect()
}

/// The mean block's activations per sample, from the plain step's bytes
/// per sample and the all-checkpointed step's: `per_sample − n·a +
/// chain_peak(all marked) = all`. The left side falls as `a` grows (the
/// chain's peak grows by at most one block's share of it), so it is found
/// by bisection; for equal blocks it is `s + (per_sample − all)/(n − 1)`.
fn mean_activations(per_sample: f64, all: f64, s: f64, n: usize, shapes: &[(f64, u64)]) -> f64 {
    if shapes.len() != n {
        return s + (per_sample - all) / (n - 1) as f64;
    }
    let marks = vec![true; n];
    let f = |a: f64| {
        let chain = shaped(
            BlockCost {
                activations: a,
                input: s,
                recompute: 0.0,
            },
            n,
            shapes,
        );
        per_sample - n as f64 * a + chain_peak(&chain, &marks) - all
    };
    let (mut lo, mut hi) = (0.0, per_sample.max(1.0) / n as f64 * 2.0);
    while f(hi) > 0.0 && hi < 1e18 {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if f(mid) > 0.0 { lo = mid } else { hi = mid }
    }
    0.5 * (lo + hi)
}

/// Probe step times closer than this share of the base's are not told
/// apart: a knob whose time differs by less is given none.
pub const TIME_RESOLUTION: f64 = 0.05;

/// `delta` ms, or 0 when it is within the probes' resolution of `base` ms.
fn resolved(delta: f64, base: f64) -> f64 {
    if delta.abs() < TIME_RESOLUTION * base {
        0.0
    } else {
        delta
    }
}

/// What a knob's probe `m` adds to the rest, against the base probe `b`.
/// A rest that reads exactly the step's peak is the step's pages still
/// held (a pool whose reserved bytes only grow), not a reading of its own:
/// the knob is then taken to leave the rest alone; otherwise it is the
/// difference from the base's own reading, or from `rest` (the least rest
/// seen) where the base's rest was hidden under its step.
fn rest_delta(m: &Measured, b: &Measured, rest: f64) -> f64 {
    let own = |x: &Measured| x.rest_peak_bytes != x.step_peak_bytes;
    match (own(m), own(b)) {
        (false, _) => 0.0,
        (true, true) => m.rest_peak_bytes as f64 - b.rest_peak_bytes as f64,
        (true, false) => m.rest_peak_bytes as f64 - rest,
    }
}

fn one() -> u64 {
    1
}

/// Readings that share a divisor of at least this are taken as whole pages.
const LEAST_PAGE: u64 = 64 << 10;

/// The greatest common divisor of the probes' readings, where it is a page
/// size (at least 64 KiB); else 1. A heap's readings share no such divisor.
fn page_bytes(measured: impl Iterator<Item = Measured>) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let g = measured
        .flat_map(|m| [m.peak_bytes, m.step_peak_bytes, m.rest_peak_bytes])
        .filter(|b| *b > 0)
        .fold(0, gcd);
    if g >= LEAST_PAGE { g } else { 1 }
}

/// The micro-batch the probes compare with the whole probe batch: the
/// divisor of `batch` nearest a quarter of it.
fn small_micro_batch(batch: usize) -> usize {
    (1..batch)
        .filter(|d| batch.is_multiple_of(*d))
        .min_by_key(|d| (4 * d).abs_diff(batch))
        .unwrap_or(1)
}

/// The mean block's costs and the bytes per sample outside the blocks,
/// from a plain step (`plain`, `per_sample` bytes a sample above
/// `fixed_bytes`) and the same step with every block checkpointed (`all`),
/// both at batch `p`. Plain: outside + n·a per sample (a: the mean block's
/// activations). All checkpointed: outside + the chain's peak with every
/// block marked; for equal blocks (n−1)·s + a (the last block recomputed on
/// top of n−1 inputs). Solved for a.
fn blocks(
    space: &Space,
    per_sample: f64,
    fixed_bytes: f64,
    plain: &Measured,
    all: &Measured,
    p: usize,
) -> (BlockCost, f64) {
    let n = space.blocks;
    let kept = (all.step_peak_bytes as f64 - fixed_bytes) / p as f64;
    let s = space.block_input_bytes as f64;
    let a = mean_activations(per_sample, kept, s, n, &space.block_shapes);
    let block = BlockCost {
        activations: a,
        input: s,
        recompute: ((all.step_ms - plain.step_ms) / (n * p) as f64).max(0.0),
    };
    (block, per_sample - n as f64 * a)
}

/// The fused attention's terms: probed plain at batch `p`, at the smaller
/// batch `q` and (with two blocks or more) with every block checkpointed,
/// and fitted as the base's are (the micro-batch overhead is the base's).
fn fused_costs(
    run: &mut impl FnMut(&str, Knobs, usize, &mut Vec<ProbeRecord>) -> Result<Measured, PlanError>,
    space: &Space,
    model: &Model,
    (p, q): (usize, usize),
    probes: &mut Vec<ProbeRecord>,
) -> Result<FusedCosts, PlanError> {
    let n = space.blocks;
    let fused = |batch: usize| Knobs {
        fused_attention: true,
        ..Knobs::base(n, batch)
    };
    let mf = run("attention fused", fused(p), p, probes)?;
    // Each lower precision it is fused at, against the fused f32 probe.
    let mut precisions = Vec::new();
    for &precision in space.fused_attention.iter().filter(|x| **x != Precision::F32) {
        let mx = run(
            &format!("attention fused, {}", precision.name()),
            Knobs { precision, ..fused(p) },
            p,
            probes,
        )?;
        precisions.push((precision, mx.step_peak_bytes, mx.step_ms));
    }
    let mh = run("attention fused, smaller batch", fused(q), q, probes)?;
    let per_sample = (mf.step_peak_bytes as f64 - mh.step_peak_bytes as f64) / (p - q) as f64;
    let fixed_bytes = mf.step_peak_bytes as f64 - p as f64 * per_sample;
    let sample_ms = ((mf.step_ms - mh.step_ms) / (p - q) as f64).max(0.0);
    let mut costs = FusedCosts {
        fixed_bytes,
        outside_bytes: per_sample,
        block: BlockCost {
            activations: 0.0,
            input: 0.0,
            recompute: 0.0,
        },
        fixed_ms: (mf.step_ms - model.micro_batch_ms - p as f64 * sample_ms).max(0.0),
        sample_ms,
        precisions: Vec::new(),
    };
    // As the plain attention's: the share of the step's scaled bytes and time.
    let (fixed_bytes, fixed_ms) = (costs.fixed_bytes, costs.fixed_ms);
    costs.precisions = precisions
        .into_iter()
        .map(|(precision, bytes, ms)| {
            let rho = (bytes as f64 - fixed_bytes) / (mf.step_peak_bytes as f64 - fixed_bytes).max(1.0);
            let pi = (ms - fixed_ms) / (mf.step_ms - fixed_ms).max(1e-9);
            (precision, rho, pi)
        })
        .collect();
    if n >= 2 {
        let ma = run(
            "attention fused, checkpoint all",
            Knobs {
                checkpointed: vec![true; n],
                ..fused(p)
            },
            p,
            probes,
        )?;
        (costs.block, costs.outside_bytes) = blocks(space, per_sample, fixed_bytes, &mf, &ma, p);
    }
    Ok(costs)
}

pub(super) fn calibrate(target: &mut dyn Plannable, probe_batch: Option<usize>) -> Result<Calibration, PlanError> {
    let started = Instant::now();
    let space = target.space();
    let p = probe_batch.unwrap_or(space.batch);
    if space.batch < 2 {
        return Err(PlanError::Setting(format!(
            "planning needs a batch of at least 2 (batch_size is {}): the planner learns the bytes per sample \
             from two batch sizes",
            space.batch
        )));
    }
    if p < 2 || p > space.batch {
        return Err(PlanError::Setting(format!(
            "--probe-batch {p}: probes need an effective batch from 2 to the run's {}",
            space.batch
        )));
    }
    let q = small_micro_batch(p);
    let n = space.blocks;
    let base = Knobs::base(n, p);
    let mut probes: Vec<ProbeRecord> = Vec::new();
    let mut run =
        |name: &str, knobs: Knobs, batch: usize, probes: &mut Vec<ProbeRecord>| -> Result<Measured, PlanError> {
            let measured = target.measure(&knobs, batch).map_err(|why| PlanError::Probe {
                probe: format!("{name} ({})", knobs.describe(batch)),
                why,
            })?;
            probes.push(ProbeRecord {
                name: name.into(),
                knobs,
                batch,
                measured,
                predicted_peak: 0.0,
                predicted_ms: 0.0,
            });
            Ok(measured)
        };
    // A first run pays for what later runs reuse (thread pools, compiled
    // kernels, the allocator's first pages): it is run and not counted.
    run("warm-up", base.clone(), p, &mut Vec::new())?;
    let mb = run("base", base.clone(), p, &mut probes)?;
    let mh = run("smaller batch", Knobs::base(n, q), q, &mut probes)?;
    let mm = run(
        "micro-batches",
        Knobs {
            micro_batch: q,
            ..base.clone()
        },
        p,
        &mut probes,
    )?;
    let (pb, ph, pm) = (
        mb.step_peak_bytes as f64,
        mh.step_peak_bytes as f64,
        mm.step_peak_bytes as f64,
    );
    let per_sample = (pb - ph) / (p - q) as f64;
    let fixed_bytes = pb - p as f64 * per_sample;
    let k = (p / q) as f64;
    let micro_batch_ms = ((mm.step_ms - mb.step_ms) / (k - 1.0)).max(0.0);
    let sample_ms = ((mb.step_ms - mh.step_ms) / (p - q) as f64).max(0.0);
    let fixed_ms = (mb.step_ms - micro_batch_ms - p as f64 * sample_ms).max(0.0);
    let mut model = Model {
        fixed_bytes,
        outside_bytes: per_sample,
        block: BlockCost {
            activations: 0.0,
            input: 0.0,
            recompute: 0.0,
        },
        blocks: n,
        block_shapes: space.block_shapes.clone(),
        accumulator_bytes: (pm - ph).max(0.0),
        precisions: Vec::new(),
        storage: Delta::default(),
        storage_share: Vec::new(),
        moments: Delta::default(),
        host_moments: Delta::default(),
        cleanup: Delta::default(),
        rest_bytes: mb.rest_peak_bytes as f64,
        files_bytes: 0.0,
        between_bytes: 0.0,
        page_bytes: 1,
        least_probed_micro_batch: q,
        below_probed_bytes: 0.0,
        floor_ms: 0.0,
        fixed_ms,
        micro_batch_ms,
        sample_ms,
        fused_attention: None,
        parameters: space.parameters.clone(),
    };
    // Below the probed micro-batch the law is extrapolated: a micro-batch
    // of one measures what does not shrink with it (per-channel buffers,
    // kernel scratch), which plans below `q` are given in proportion.
    let mut lone = Vec::new();
    if q > 1 {
        let m1 = run("batch of one", Knobs::base(n, 1), 1, &mut lone)?;
        model.below_probed_bytes = (m1.step_peak_bytes as f64 - fixed_bytes - per_sample).max(0.0);
    }
    if n >= 2 {
        let ma = run(
            "checkpoint all",
            Knobs {
                checkpointed: vec![true; n],
                ..base.clone()
            },
            p,
            &mut probes,
        )?;
        (model.block, model.outside_bytes) = blocks(&space, per_sample, fixed_bytes, &mb, &ma, p);
    }
    // The rest with the base's precision, storage and moments. On a pool
    // allocator whose reserved bytes only grow, the phases after a step
    // still hold the pages the step reserved, so each probe's rest reads
    // at least its step's peak: the probe with the leanest exact step
    // bounds the rest most tightly, and the least reading is taken.
    run(
        "leanest exact step",
        Knobs {
            micro_batch: q,
            checkpointed: vec![n >= 2; n],
            ..base.clone()
        },
        p,
        &mut probes,
    )?;
    let leanest = probes
        .iter()
        .map(|r| r.measured)
        .min_by_key(|m| m.rest_peak_bytes)
        .expect("probes ran");
    model.rest_bytes = leanest.rest_peak_bytes as f64;
    (model.files_bytes, model.between_bytes) = (leanest.files_peak_bytes as f64, leanest.between_peak_bytes as f64);
    // Its rest holds a batch of one's inputs: not a bound on the run's rest.
    probes.append(&mut lone);
    let scaled_ms = (mb.step_ms - fixed_ms).max(1e-9);
    for &precision in space.precisions.iter().filter(|x| **x != Precision::F32) {
        let mx = run(
            precision.name(),
            Knobs {
                precision,
                ..base.clone()
            },
            p,
            &mut probes,
        )?;
        let rho = (mx.step_peak_bytes as f64 - fixed_bytes) / (pb - fixed_bytes).max(1.0);
        let pi = (mx.step_ms - fixed_ms) / scaled_ms;
        let rest = rest_delta(&mx, &mb, model.rest_bytes);
        model.precisions.push((precision, rho, pi, rest));
    }
    let rest_bytes = model.rest_bytes;
    let delta = |m: Measured| Delta {
        step: m.step_peak_bytes as f64 - pb,
        rest: rest_delta(&m, &mb, rest_bytes),
        ms: resolved(m.step_ms - mb.step_ms, mb.step_ms),
    };
    if !space.storage_groups.is_empty() {
        let g = space.storage_groups.len();
        let m = run(
            "storage bf16",
            Knobs {
                low_storage: g,
                ..base.clone()
            },
            p,
            &mut probes,
        )?;
        model.storage = delta(m);
        let total: u64 = space.storage_groups.iter().map(|(_, b)| b).sum();
        let mut acc = 0;
        model.storage_share = std::iter::once(0.0)
            .chain(space.storage_groups.iter().map(|(_, b)| {
                acc += b;
                acc as f64 / total.max(1) as f64
            }))
            .collect();
    }
    if space.low_moments {
        let m = run(
            "moments bf16",
            Knobs {
                low_moments: true,
                ..base.clone()
            },
            p,
            &mut probes,
        )?;
        model.moments = delta(m);
    }
    if space.host_moments {
        let m = run(
            "moments host",
            Knobs {
                host_moments: true,
                ..base.clone()
            },
            p,
            &mut probes,
        )?;
        model.host_moments = delta(m);
    }
    let m = run(
        "cleanup",
        Knobs {
            cleanup: true,
            ..base.clone()
        },
        p,
        &mut probes,
    )?;
    model.cleanup = delta(m);
    if space.fused_attention.contains(&Precision::F32) {
        model.fused_attention = Some(fused_costs(&mut run, &space, &model, (p, q), &mut probes)?);
    }

    // Combinations the fit did not see: the exact knobs together, then
    // every knob that changes the numerics together.
    let mut checks = Vec::new();
    let alternate: Vec<bool> = (0..n).map(|i| n >= 2 && i % 2 == 0).collect();
    run(
        "check: exact knobs combined",
        Knobs {
            micro_batch: q,
            checkpointed: alternate,
            cleanup: true,
            ..base.clone()
        },
        p,
        &mut checks,
    )?;
    if model.fused_attention.is_some() {
        run(
            "check: fused attention with the exact knobs",
            Knobs {
                micro_batch: q,
                checkpointed: (0..n).map(|i| n >= 2 && i % 2 == 1).collect(),
                fused_attention: true,
                ..base.clone()
            },
            p,
            &mut checks,
        )?;
    }
    let lowest = space.precisions.last().copied().unwrap_or(Precision::F32);
    if lowest != Precision::F32 || !space.storage_groups.is_empty() || space.low_moments {
        run(
            "check: numerics knobs combined",
            Knobs {
                precision: lowest,
                checkpointed: vec![n >= 2; n],
                low_storage: space.storage_groups.len(),
                low_moments: space.low_moments,
                fused_attention: model.fused_attention.is_some() && space.fused_attention.contains(&lowest),
                ..base.clone()
            },
            p,
            &mut checks,
        )?;
    }
    // The lean corner of each precision, where a micro-batch below the
    // probed one (at most half of it, dividing the batch) meets partial checkpointing: the model's
    // terms are fitted away from it (constant scratch is scaled as if per
    // sample), so its error there is measured and, through the margin,
    // planned around. (Half, not one: at batch 256 a micro-batch of one
    // is 256 passes nobody plans, and its error would widen every plan's
    // margin.)
    let corner = (1..=q / 2).rev().find(|d| p.is_multiple_of(*d)).unwrap_or(1);
    for &precision in space.precisions.iter().filter(|_| q > 1) {
        run(
            &format!("check: lean corner, {}", precision.name()),
            Knobs {
                precision,
                micro_batch: corner,
                checkpointed: (0..n).map(|i| n >= 2 && i % 2 == 1).collect(),
                ..base.clone()
            },
            p,
            &mut checks,
        )?;
    }
    model.page_bytes = page_bytes(probes.iter().chain(&checks).map(|r| r.measured));
    model.floor_ms = 0.5 * probes.iter().map(|r| r.measured.step_ms).fold(f64::INFINITY, f64::min);
    for r in probes.iter_mut().chain(checks.iter_mut()) {
        (r.predicted_peak, r.predicted_ms) = model.predict(&r.knobs, r.batch);
    }
    let worst = |f: fn(&ProbeRecord) -> f64| checks.iter().map(f).fold(0.0, f64::max);
    // The margin covers the largest shortfall on anything measured: a probe
    // the fitted model under-predicts is as much a warning as a check (a
    // threaded backend's U-Net probe at 2×4, checkpointed, came in 7 % over
    // its fit while every check was within 3 %, and a plan beside it 11 %).
    let shortfall = probes
        .iter()
        .chain(&checks)
        .map(ProbeRecord::shortfall)
        .fold(0.0, f64::max);
    Ok(Calibration {
        peak_error: worst(ProbeRecord::peak_error),
        shortfall,
        time_error: worst(ProbeRecord::time_error),
        space,
        model,
        probes,
        checks,
        seconds: started.elapsed().as_secs_f64(),
        probe_batch: p,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Space, calibrate};

    /// A workload whose figures follow a known law (with a gradient buffer
    /// that the law does not name): the fit must recover it.
    struct Synthetic;

    impl Plannable for Synthetic {
        fn space(&self) -> Space {
            Space {
                batch: 32,
                blocks: 6,
                block_input_bytes: 1000,
                precisions: vec![Precision::F32, Precision::Bf16],
                storage_groups: vec![("embed".into(), 3000), ("blocks".into(), 1000)],
                low_moments: true,
                host_moments: true,
                batch_statistics: None,
                block_shapes: Vec::new(),
                fused_attention: vec![Precision::F32, Precision::Bf16],
                parameters: Vec::new(),
            }
        }

        fn measure(&mut self, k: &Knobs, batch: usize) -> Result<Measured, String> {
            // Fused attention: a third of the activations, 1,500 bytes of
            // scratch, a fifth slower a sample and in recomputation.
            let fused = if k.fused_attention { 1.2 } else { 1.0 };
            let blocks = vec![
                BlockCost {
                    activations: if k.fused_attention { 3000.0 } else { 9000.0 },
                    input: 1000.0,
                    recompute: 0.1,
                };
                6
            ];
            let rho = if k.precision == Precision::Bf16 { 0.55 } else { 1.0 };
            let m = k.micro_batch as f64;
            let storage = -2000.0 * [0.0, 0.75, 1.0][k.low_storage];
            let peak = 50_000.0
                + if k.fused_attention { 1500.0 } else { 0.0 }
                + storage
                + if k.low_moments { -4000.0 } else { 0.0 }
                + if k.host_moments { -8000.0 } else { 0.0 }
                + if batch > k.micro_batch { 4000.0 } else { 0.0 }
                + rho * m * (3000.0 + chain_peak(&blocks, &k.checkpointed));
            // Between steps: the optimiser and checkpoint copies, no activations.
            let rest = 60_000.0
                + if k.low_moments { -4000.0 } else { 0.0 }
                + if k.host_moments { -8000.0 } else { 0.0 }
                + storage;
            let kk = (batch / k.micro_batch) as f64;
            let marked = k.checkpointed.iter().filter(|x| **x).count() as f64;
            let ms = 5.0 + kk * 0.5 + batch as f64 * fused * (1.0 + 0.1 * marked);
            Ok(Measured {
                peak_bytes: peak.max(rest).round() as u64,
                step_peak_bytes: peak.round() as u64,
                rest_peak_bytes: rest.round() as u64,
                files_peak_bytes: 0,
                between_peak_bytes: 0,
                step_ms: ms,
                seconds: 0.0,
            })
        }
    }

    #[test]
    fn fit_recovers_a_known_law_and_predicts_unseen_combinations() {
        let c = calibrate(&mut Synthetic, None).unwrap();
        assert!(c.peak_error < 1e-3, "{:?}", c.checks);
        assert!(c.time_error < 1e-6, "{:?}", c.checks);
        assert!((c.model.block.activations - 9000.0).abs() < 1.0, "{:?}", c.model);
        assert!((c.model.outside_bytes - 3000.0).abs() < 10.0, "{:?}", c.model);
        let f = c.model.fused_attention.expect("the space offers it");
        assert!((f.block.activations - 3000.0).abs() < 1.0, "{f:?}");
        assert!((f.fixed_bytes - c.model.fixed_bytes - 1500.0).abs() < 10.0, "{f:?}");
        assert!(
            (f.block.recompute - 0.12).abs() < 1e-9 && (f.sample_ms - 1.2).abs() < 1e-9,
            "{f:?}"
        );
        assert!(c.checks.iter().any(|r| r.knobs.fused_attention), "{:?}", c.checks);
        assert_eq!(f.precisions.len(), 1, "{f:?}");
        assert!((f.precisions[0].1 - 0.55).abs() < 1e-3, "{f:?}");
        // Extrapolation from probes at an eighth of the batch.
        let small = calibrate(&mut Synthetic, Some(4)).unwrap();
        for fused_attention in [false, true] {
            let knobs = Knobs {
                micro_batch: 16,
                checkpointed: vec![true, false, true, false, false, false],
                fused_attention,
                ..Knobs::base(6, 32)
            };
            let (peak, ms) = small.predict(&knobs);
            let truth = Synthetic.measure(&knobs, 32).unwrap();
            assert!((peak - truth.peak_bytes as f64).abs() / (truth.peak_bytes as f64) < 1e-3);
            assert!((ms - truth.step_ms).abs() / truth.step_ms < 1e-6);
        }
    }

    #[test]
    fn pages_are_learned_from_paged_readings_only() {
        let m = |peak: u64| Measured {
            peak_bytes: peak,
            step_peak_bytes: peak,
            rest_peak_bytes: peak,
            files_peak_bytes: 0,
            between_peak_bytes: 0,
            step_ms: 1.0,
            seconds: 0.0,
        };
        const MIB: u64 = 1 << 20;
        assert_eq!(page_bytes([176, 48, 96, 40].map(|x| m(x * MIB)).into_iter()), 8 * MIB);
        assert_eq!(page_bytes([19_293_184, 8_808_448, 10_695_168].map(m).into_iter()), 1);
    }
}
