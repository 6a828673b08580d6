//! The memory and time model, fitted on one probe per knob.
//!
//! The peak is the larger of two parts, each measured on its own by the
//! profiler's phase records: the step's forward and backward, and the rest
//! (optimiser, checkpoint writes, final files). With `m` samples per
//! micro-batch and `k` micro-batches, the step part is
//!
//! `fixed + storage·f(groups) + moments + cleanup + [k > 1]·accumulator
//!   + ρ(precision) · m · (outside + peak_with_head(blocks, marks, head))`
//!
//! and the rest is `rest + what precision, storage, moments and cleanup
//! add to it`, where `outside` is what a sample keeps outside the blocks
//! throughout (embeddings, loss), `head` what it holds at the forward's
//! end on top of all the chain keeps (fitted from a depth slice, else 0
//! and in `outside`), and each block keeps `activations` per sample when
//! plain and its `input` when checkpointed ([`super::chain`]). Step time:
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

use serde::{Deserialize, Serialize};

use super::chain::{BlockCost, peak_with_head};
use super::{Knobs, Measured};
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
    /// Bytes per sample the head holds at the forward's end on top of all
    /// the chain keeps ([`super::chain::peak_with_head`]); fitted only from
    /// a depth slice (two depths tell it apart), else 0.
    #[serde(default)]
    pub head_bytes: f64,
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
    /// Of those, bytes added to the phases that write no files (the
    /// optimiser's, between steps), where the probes told them apart (on
    /// the CPU, whose files phases hold a copy of the state); else `rest`.
    #[serde(default)]
    pub between: f64,
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
            between: a.between + d.between * f,
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
            between: exchange - saved,
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

    /// The chain's peak per sample with `marks`, the head included.
    fn chain_peak(&self, marks: &[bool]) -> f64 {
        peak_with_head(&self.chain(), marks, self.head_bytes)
    }

    /// The head's bytes per sample in a step with `knobs`.
    pub fn head_for(&self, knobs: &Knobs) -> f64 {
        self.with(knobs).head_bytes
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

    /// The predicted peaks of the two parts, not rounded to pages: the
    /// forward and backward's, and the other phases' (optimiser, files).
    pub fn parts(&self, knobs: &Knobs, batch: usize) -> (f64, f64) {
        let model = self.with(knobs);
        let (outside, scale, rest) = model.split(knobs, batch);
        (outside + scale * model.chain_peak(&knobs.checkpointed), rest)
    }

    /// Predicted peak bytes (in whole pages) and step ms of `knobs` at effective batch `batch`.
    pub fn predict(&self, knobs: &Knobs, batch: usize) -> (f64, f64) {
        if let Cow::Owned(fused) = self.with(knobs) {
            return fused.predict(knobs, batch);
        }
        let (outside, scale, rest) = self.split(knobs, batch);
        let step = outside + scale * self.chain_peak(&knobs.checkpointed);
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
pub(super) fn shaped(mean: BlockCost, n: usize, shapes: &[(f64, u64)]) -> Vec<BlockCost> {
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

/// Probe step times closer than this share of the base's are not told
/// apart: a knob whose time differs by less is given none.
pub const TIME_RESOLUTION: f64 = 0.05;

fn one() -> u64 {
    1
}
