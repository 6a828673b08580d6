//! Planning a model deeper than the probing machine holds, from a slice.
//!
//! A model whose blocks repeat (a transformer's, a Llama's) costs
//! `prelude + N·block + head` in every term the planner fits. The planner
//! probes the workload only `k` blocks deep at its real width, context and
//! batch ([`Deep::sliced`]): the whole calibration on that slice, and one
//! more plain step `k + m` blocks deep (`m = 1`, or on a paged allocator
//! enough blocks to span [`PAGES_SPANNED`] pages by the counted
//! parameters: a difference of one block would be quantised to a page).
//! Then:
//!
//! - what each block adds outside the samples (its parameters, gradients,
//!   moments) is the difference between the two depths' steps with every
//!   block checkpointed, less the inputs the extra blocks keep, over `m`;
//!   what a sample keeps per plain block is then the difference between
//!   the two depths' plain steps less that, per sample. At one depth the
//!   two cannot be told apart from what the head holds at the forward's
//!   end (a checkpointed step's peak is there when the head's logits
//!   outweigh a block), so the slice's own split is replaced: the head's
//!   bytes ([`super::cost_model::Model::head_bytes`]) are what remains of the
//!   slice's plain-minus-checkpointed difference (measured: a 2-block
//!   split put TinyLlama's checkpointed peak 20 % under; the fused
//!   attention's block is solved again with that head);
//! - the copies in the rest phases and the step time per block are the
//!   difference between the two depths' plain steps, over `m`;
//! - what bf16 storage of every group does is measured at both depths too
//!   (it is not in proportion to the stored bytes: a block's and the
//!   head's weights are cast for their matmuls, the embedding's looked-up
//!   rows only; scaling the slice's effect by the stored bytes put it
//!   7 % over on TinyLlama; a plan that stores only some groups still gets
//!   a share of it by their stored bytes, which credits the embedding with
//!   more than it saves: not measured per group); what another knob adds in proportion to the
//!   parameters (bf16 or host moments, the gradient accumulator, a
//!   precision's copies) is scaled by the ratio of the parameters it acts
//!   on, counted at both depths by the slices' own [`Space`]s
//!   (arithmetic, not measured);
//! - the whole depth's space (its parameters and storage groups) is
//!   extrapolated from the two slices' in the same way ([`deepened`]).
//!
//! Nothing of the whole model is built to plan it. Every figure this gives
//! is an extrapolation, and [`Calibration::slice`] says so; a verification
//! probe, where the whole model fits the machine, measures it.

use serde::{Deserialize, Serialize};

use super::cost_model::Model;
use super::{Calibration, Knobs, PlanError, Plannable, ProbeError, ProbeRecord, Space};

/// A workload whose blocks repeat, to be planned from a slice of it.
pub trait Deep {
    /// Blocks of the whole workload.
    fn depth(&self) -> usize;
    /// Blocks of the slice the planner probes (at least 1).
    fn probe_blocks(&self) -> usize;
    /// The workload `blocks` deep, everything else as it is.
    fn sliced(&self, blocks: usize) -> Result<Box<dyn Plannable>, ProbeError>;
}

/// How a calibration was extrapolated from a slice: what `plan.json` and
/// the printout name as not measured on the whole model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slice {
    /// Blocks of the probed slice.
    pub blocks: usize,
    /// Blocks of the whole model, which every prediction is for.
    pub depth: usize,
    /// The plain step `deeper.knobs.checkpointed.len()` blocks deep.
    pub deeper: ProbeRecord,
    /// The same depth's step with every block checkpointed (a slice of two
    /// blocks or more).
    #[serde(default)]
    pub deeper_checkpointed: Option<ProbeRecord>,
    /// The same depth's step with every group stored in bf16, where the
    /// space has groups.
    #[serde(default)]
    pub deeper_stored: Option<ProbeRecord>,
    /// Bytes a sample keeps per plain block and the head holds at the
    /// forward's end, fitted from the two depths (0 and the slice's own
    /// split where they were not).
    #[serde(default)]
    pub per_block_activation_bytes: f64,
    /// See `per_block_activation_bytes`.
    #[serde(default)]
    pub head_bytes: f64,
    /// What each block adds outside the samples' activations, fitted from
    /// the two depths: bytes to the step's peak, bytes to the rest's peak
    /// and ms to the step.
    pub per_block_fixed_bytes: f64,
    /// See `per_block_fixed_bytes`.
    pub per_block_rest_bytes: f64,
    /// See `per_block_fixed_bytes` (a difference of two measured times,
    /// which the noise can make negative: not what the time is scaled by
    /// where the work is counted).
    pub per_block_ms: f64,
    /// Where the time was scaled by the counted work ([`super::Work`]):
    /// the deeper plain step's time predicted from it, against its
    /// measurement (relative; positive: over).
    #[serde(default)]
    pub time_check_error: Option<f64>,
    /// What was scaled by arithmetic rather than fitted, in words.
    pub scaled: Vec<String>,
}

impl Slice {
    /// Steps run deeper than the slice (plain, checkpointed, stored).
    pub fn deeper_probes(&self) -> usize {
        1 + usize::from(self.deeper_checkpointed.is_some()) + usize::from(self.deeper_stored.is_some())
    }
}

/// The space of a workload `depth` blocks deep, from its spaces at two
/// depths (`at` and the deeper `next`): every storage group's bytes and
/// the trainable parameters' list grown by what one block adds.
pub fn deepened(at: &Space, next: &Space, depth: usize) -> Space {
    let k = at.blocks;
    let extra = depth.saturating_sub(k);
    let m = next.blocks.saturating_sub(k).max(1) as u64;
    let mut storage_groups: Vec<(String, u64)> = next
        .storage_groups
        .iter()
        .map(|(name, bytes)| {
            let before = at.storage_groups.iter().find(|(n, _)| n == name).map_or(0, |(_, b)| *b);
            (name.clone(), before + extra as u64 * bytes.saturating_sub(before) / m)
        })
        .collect();
    // Largest first, as a space lists them (the order can change with depth).
    storage_groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Space {
        blocks: depth,
        storage_groups,
        parameters: repeated_block(&at.parameters, &next.parameters, m as usize, extra),
        ..at.clone()
    }
}

/// `at`'s parameter sizes with a block of those that `next` (`m` blocks
/// deeper) adds repeated `extra` times where `next` has it: after their
/// common prefix. (Where the head happens to start like a block, what is
/// repeated is a rotation of the block's sizes: the same sizes, so the
/// same sums.)
fn repeated_block(at: &[usize], next: &[usize], m: usize, extra: usize) -> Vec<usize> {
    let added = next.len().saturating_sub(at.len()) / m.max(1);
    if added == 0 {
        return at.to_vec();
    }
    let common = at.iter().zip(next).take_while(|(a, b)| a == b).count();
    let block = &next[common..common + added];
    let mut out = at[..common].to_vec();
    for _ in 0..extra {
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&at[common..]);
    out
}

/// Bytes in the storage groups, trainable values, and bytes of all
/// parameters in f32 (the groups hold them all, where the space has any).
fn total(space: &Space) -> (f64, f64, f64) {
    let stored = space.storage_groups.iter().map(|(_, b)| *b as f64).sum::<f64>();
    let trainable = space.parameters.iter().sum::<usize>() as f64;
    (stored, trainable, if stored > 0.0 { stored } else { 4.0 * trainable })
}

/// `whole / slice`, 1 where the slice has none.
fn growth(whole: f64, slice: f64) -> f64 {
    if slice > 0.0 { whole / slice } else { 1.0 }
}

/// Calibrates `deep` from a slice of it (see the module's description).
pub fn calibrate_sliced(deep: &dyn Deep, probe_batch: Option<usize>) -> Result<Calibration, PlanError> {
    let (k, depth) = (deep.probe_blocks(), deep.depth());
    if k == 0 || k >= depth {
        return Err(PlanError::Setting(format!(
            "a slice of {k} block(s) of a model {depth} blocks deep: give a probe slice from 1 to {} blocks",
            depth.saturating_sub(1)
        )));
    }
    let probe = |blocks: usize| {
        deep.sliced(blocks).map_err(|why| PlanError::Probe {
            probe: format!("the {blocks}-block slice"),
            why: why.to_string(),
        })
    };
    let mut slice = probe(k)?;
    let cal = super::calibrate::calibrate(slice.as_mut(), probe_batch)?;
    drop(slice);
    let p = cal.probe_batch;
    // (Counting needs the model one block deeper built: only where pages are.)
    let m = if cal.model.page_bytes > 1 {
        blocks_spanning_pages(&cal, probe(k + 1)?.space(), p, depth - k)
    } else {
        1
    };
    let mut deeper = probe(k + m)?;
    let knobs = Knobs::base(k + m, p);
    let measured = deeper.measure(&knobs, p).map_err(|why| PlanError::Probe {
        probe: format!("{m} block(s) deeper ({})", knobs.describe(p)),
        why: why.to_string(),
    })?;
    let record = |name: String, knobs: Knobs, measured| ProbeRecord {
        name,
        knobs,
        batch: p,
        measured,
        predicted_peak: 0.0,
        predicted_ms: 0.0,
    };
    let probed = |name: &str| cal.probes.iter().find(|r| r.name == name).map(|r| r.measured);
    let next = deeper.space();
    // A knob's step at the deeper depth, recorded under `what`.
    let mut at_depth = |what: &str, knobs: Knobs| -> Result<ProbeRecord, PlanError> {
        let measured = deeper.measure(&knobs, p).map_err(|why| PlanError::Probe {
            probe: format!("{m} block(s) deeper ({})", knobs.describe(p)),
            why: why.to_string(),
        })?;
        Ok(record(
            format!("{m} block(s) deeper, {what} ({} blocks)", k + m),
            knobs,
            measured,
        ))
    };
    // The same depth checkpointed, where the slice was (two blocks or more).
    let checkpointed = match probed("checkpoint all") {
        Some(_) => Some(at_depth(
            "checkpoint all",
            Knobs {
                checkpointed: vec![true; k + m],
                ..Knobs::base(k + m, p)
            },
        )?),
        None => None,
    };
    // Every group stored in bf16 at the same depth, where the slice probed
    // it: what storage does per block (it is not in proportion to the
    // stored bytes: the head's and blocks' weights are cast for their
    // matmuls, the embedding's rows only are looked up).
    let stored = match probed("storage bf16") {
        Some(_) if !next.storage_groups.is_empty() => Some(at_depth(
            "storage bf16",
            Knobs {
                low_storage: next.storage_groups.len(),
                ..Knobs::base(k + m, p)
            },
        )?),
        _ => None,
    };
    drop(deeper);
    let base = probed("base").expect("every calibration probes a base");
    let space = deepened(&cal.space, &next, depth);
    let probes = Depths {
        base,
        checkpointed: probed("checkpoint all"),
        fused_checkpointed: probed("attention fused, checkpoint all"),
        deeper: record(format!("{m} block(s) deeper ({} blocks)", k + m), knobs, measured),
        deeper_checkpointed: checkpointed,
        stored: probed("storage bf16"),
        deeper_stored: stored,
    };
    let extra_seconds = [&probes.deeper_checkpointed, &probes.deeper_stored]
        .iter()
        .filter_map(|r| r.as_ref())
        .map(|r| r.measured.seconds)
        .sum::<f64>();
    let (model, record) = deepened_model(&cal.model, &cal.space, &space, probes);
    let seconds = cal.seconds + measured.seconds + extra_seconds;
    Ok(Calibration {
        space,
        model,
        seconds,
        slice: Some(record),
        ..cal
    })
}

/// Pages the deeper probe's extra blocks should span by their counted
/// bytes: the per-block difference is then off by at most a page over
/// that many.
pub const PAGES_SPANNED: f64 = 8.0;

/// How many blocks deeper than the slice the second probe runs on a paged
/// allocator: enough blocks for their
/// parameters, gradients, moments and a batch `p` of activations (counted
/// from the space `next`, one block deeper, and the slice's fit) to span
/// [`PAGES_SPANNED`] pages, at most `room`.
fn blocks_spanning_pages(cal: &Calibration, next: Space, p: usize, room: usize) -> usize {
    let page = cal.model.page_bytes.max(1);
    let ((_, trainable_at, all_at), (_, trainable, all)) = (total(&cal.space), total(&next));
    // f32 parameters, their f32 gradients and two f32 moments.
    let per_block = (all - all_at) + 12.0 * (trainable - trainable_at) + p as f64 * cal.model.block.activations;
    ((PAGES_SPANNED * page as f64 / per_block.max(1.0)).ceil() as usize).clamp(1, room)
}

/// The steps at the slice's depth and deeper, at one batch.
struct Depths {
    /// The slice's plain step.
    base: super::Measured,
    /// The slice's step with every block checkpointed, where probed.
    checkpointed: Option<super::Measured>,
    /// The same with the attention fused, where probed.
    fused_checkpointed: Option<super::Measured>,
    /// The plain step deeper.
    deeper: ProbeRecord,
    /// The deeper step with every block checkpointed, where probed.
    deeper_checkpointed: Option<ProbeRecord>,
    /// The slice's step with every group stored in bf16, where probed.
    stored: Option<super::Measured>,
    /// The deeper step with every group stored in bf16, where probed.
    deeper_stored: Option<ProbeRecord>,
}

/// What a sample keeps per plain block and the head holds, from the two
/// depths' plain and checkpointed steps (`None` where either was not
/// probed, or they do not give a block at least its input), and what each
/// block adds outside the samples: `(activations, head, per-block bytes)`.
/// The slice's model `model` is `k` blocks deep, fitted with no head.
fn split_by_depth(model: &Model, at: &Space, probes: &Depths) -> Option<(f64, f64, f64)> {
    let (all, deeper_all) = (probes.checkpointed?, probes.deeper_checkpointed.as_ref()?.measured);
    let (k, p) = (at.blocks as f64, probes.deeper.batch as f64);
    let m = probes.deeper.knobs.checkpointed.len().saturating_sub(at.blocks).max(1) as f64;
    let s = at.block_input_bytes as f64;
    let step = |x: &super::Measured| x.step_peak_bytes as f64;
    let fixed = (step(&deeper_all) - step(&all)) / m - p * s;
    let activations = ((step(&probes.deeper.measured) - step(&probes.base)) / m - fixed) / p;
    if activations < s || fixed < 0.0 {
        return None;
    }
    // Per sample, plain less checkpointed at the slice's depth is
    // min(k(a − s), head + (k − 1)(a − s)): where the head decides, only
    // a lower bound on it shows, and the least head is the larger
    // prediction for plans whose recomputation could decide instead.
    let plain = model.outside_bytes + k * model.block.activations;
    let kept = (step(&all) - model.fixed_bytes) / p;
    let head = (plain - kept - (k - 1.0) * (activations - s)).max(0.0);
    Some((activations, head, fixed))
}

/// The block's activations with the attention fused, solved again with the
/// head: from `plain − kept = min(k·x, head + (k − 1)·x)`, `x = a − s`.
fn fused_split(f: &mut super::FusedCosts, k: f64, s: f64, p: f64, head: f64, all: &super::Measured) {
    let plain = f.outside_bytes + k * f.block.activations;
    let difference = plain - (all.step_peak_bytes as f64 - f.fixed_bytes) / p;
    let x = if difference / k <= head || k < 2.0 {
        difference / k
    } else {
        (difference - head) / (k - 1.0)
    };
    f.block.activations = s + x.max(0.0);
    f.outside_bytes = plain - k * f.block.activations - head;
}

/// What a knob's probe `knob` adds against the plain probe `plain` at the
/// same depth, and whether its rest is a reading of its own (both rests
/// not just the step's pages still held).
fn knob_delta(knob: &super::Measured, plain: &super::Measured) -> (super::Delta, bool) {
    let own = |x: &super::Measured| x.rest_peak_bytes != x.step_peak_bytes;
    let rest = knob.rest_peak_bytes as f64 - plain.rest_peak_bytes as f64;
    let delta = super::Delta {
        step: knob.step_peak_bytes as f64 - plain.step_peak_bytes as f64,
        rest,
        between: if knob.files_peak_bytes > 0 && plain.files_peak_bytes > 0 {
            knob.between_peak_bytes as f64 - plain.between_peak_bytes as f64
        } else {
            rest
        },
        ms: 0.0,
    };
    (delta, own(knob) && own(plain))
}

/// A knob's effect at the whole depth from its probes at the slice's
/// depth (`at`, against `base`) and `m` blocks deeper (`deeper`, against
/// `deeper_plain`): its step's bytes linear in the blocks; its rest's too
/// where all four read their own, else `fitted`'s scaled by `r`, as its
/// time is.
fn grown_delta(
    fitted: super::Delta,
    (at, base): (&super::Measured, &super::Measured),
    (deeper, deeper_plain): (&super::Measured, &super::Measured),
    (m, extra, r): (f64, f64, f64),
) -> super::Delta {
    let ((a, own_at), (d, own_deeper)) = (knob_delta(at, base), knob_delta(deeper, deeper_plain));
    let grow = |a: f64, d: f64| a + extra * (d - a) / m;
    let (rest, between) = if own_at && own_deeper {
        (grow(a.rest, d.rest), grow(a.between, d.between))
    } else {
        (fitted.rest * r, fitted.between * r)
    };
    super::Delta {
        step: grow(a.step, d.step),
        rest,
        between,
        ms: fitted.ms * r,
    }
}

/// The slice's model (`model`, fitted on `at`) grown to the whole space,
/// with the two depths' steps (`probes`, at one batch).
fn deepened_model(model: &Model, at: &Space, whole: &Space, probes: Depths) -> (Model, Slice) {
    let (base, deeper, p) = (&probes.base, &probes.deeper.measured, probes.deeper.batch);
    let extra = (whole.blocks - at.blocks) as f64;
    let m = probes.deeper.knobs.checkpointed.len().saturating_sub(at.blocks).max(1) as f64;
    let mut model = model.clone();
    // Each extra block's step adds its parameters' bytes and a batch of
    // its activations (the split from the two depths where it was probed,
    // else the slice's own).
    let per_block_fixed = match split_by_depth(&model, at, &probes) {
        Some((activations, head, fixed)) => {
            let k = at.blocks as f64;
            let s = at.block_input_bytes as f64;
            let plain = model.outside_bytes + k * model.block.activations;
            model.block.activations = activations;
            model.outside_bytes = plain - k * activations - head;
            model.head_bytes = head;
            if let (Some(f), Some(all)) = (model.fused_attention.as_mut(), probes.fused_checkpointed.as_ref()) {
                fused_split(f, k, s, p as f64, head, all);
            }
            fixed
        }
        None => (deeper.step_peak_bytes as f64 - base.step_peak_bytes as f64) / m - p as f64 * model.block.activations,
    };
    let model = &model;
    let per_block_rest = (deeper.rest_peak_bytes as f64 - base.rest_peak_bytes as f64) / m;
    let per_block_ms = (deeper.step_ms - base.step_ms) / m;
    let ((stored_at, trainable_at, all_at), (stored, trainable, all)) = (total(at), total(whole));
    let (r_stored, r_trainable, r_all) = (
        growth(stored, stored_at),
        growth(trainable, trainable_at),
        growth(all, all_at),
    );
    let scale = |d: super::Delta, r: f64| super::Delta {
        step: d.step * r,
        rest: d.rest * r,
        between: d.between * r,
        ms: d.ms * r,
    };
    let files = |x: f64, per: f64| if x > 0.0 { x + extra * per } else { 0.0 };
    let per_block_files = (deeper.files_peak_bytes as f64 - base.files_peak_bytes as f64) / m;
    let per_block_between = (deeper.between_peak_bytes as f64 - base.between_peak_bytes as f64) / m;
    // The time per sample grows as the forward's counted operations do
    // (`super::work`), where the workload counts them; else the extra
    // block's time is its samples' (its optimiser share is not told apart
    // at one batch), never below none.
    let counted = at
        .work
        .and_then(|w| super::work::ratio(w.total(whole.blocks), w.total(at.blocks)));
    let per_block_sample_ms = (per_block_ms / p as f64).max(0.0);
    let sample_growth =
        counted.unwrap_or_else(|| growth(model.sample_ms + extra * per_block_sample_ms, model.sample_ms));
    // The counted growth's check: the deeper plain step's time from it.
    let time_check_error = at.work.filter(|_| counted.is_some()).map(|w| {
        let deeper_blocks = probes.deeper.knobs.checkpointed.len();
        let growth = w.total(deeper_blocks) / w.total(at.blocks);
        let predicted = model.fixed_ms + model.micro_batch_ms + p as f64 * model.sample_ms * growth;
        predicted / deeper.step_ms.max(1e-9) - 1.0
    });
    let total_stored: f64 = whole.storage_groups.iter().map(|(_, b)| *b as f64).sum();
    let mut acc = 0.0;
    let storage_share = if model.storage_share.is_empty() {
        Vec::new()
    } else {
        std::iter::once(0.0)
            .chain(whole.storage_groups.iter().map(|(_, b)| {
                acc += *b as f64;
                acc / total_stored.max(1.0)
            }))
            .collect()
    };
    let grown = Model {
        fixed_bytes: model.fixed_bytes + extra * per_block_fixed,
        blocks: whole.blocks,
        accumulator_bytes: model.accumulator_bytes * r_trainable,
        precisions: model
            .precisions
            .iter()
            .map(|&(p, rho, pi, rest)| (p, rho, pi, rest * r_all))
            .collect(),
        storage: match &probes.deeper_stored {
            Some(r) if let Some(stored) = &probes.stored => grown_delta(
                model.storage,
                (stored, base),
                (&r.measured, deeper),
                (m, extra, r_stored),
            ),
            _ => scale(model.storage, r_stored),
        },
        storage_share,
        moments: scale(model.moments, r_trainable),
        host_moments: scale(model.host_moments, r_trainable),
        // Cleanup returns cached pages: nothing proportional to count.
        cleanup: model.cleanup,
        rest_bytes: model.rest_bytes + extra * per_block_rest,
        files_bytes: files(model.files_bytes, per_block_files),
        between_bytes: files(model.between_bytes, per_block_between),
        sample_ms: model.sample_ms * sample_growth,
        fused_attention: model.fused_attention.clone().map(|f| super::FusedCosts {
            fixed_bytes: f.fixed_bytes + extra * per_block_fixed,
            sample_ms: f.sample_ms * sample_growth,
            ..f
        }),
        parameters: whole.parameters.clone(),
        ..model.clone()
    };
    let slice = Slice {
        blocks: at.blocks,
        depth: whole.blocks,
        per_block_activation_bytes: model.block.activations,
        head_bytes: model.head_bytes,
        per_block_fixed_bytes: per_block_fixed,
        per_block_rest_bytes: per_block_rest,
        per_block_ms,
        time_check_error,
        scaled: vec![
            if probes.deeper_stored.is_some() {
                format!(
                    "bf16 storage's bytes by the blocks (from the two depths), its time by the stored parameters ({r_stored:.2}×)"
                )
            } else {
                format!("bf16 storage's saving by the stored parameters ({r_stored:.2}×)")
            },
            format!(
                "bf16 and host moments' savings and the gradient accumulator by the trainable parameters \
                 ({r_trainable:.2}×)"
            ),
            format!("each precision's bytes outside the step by all parameters ({r_all:.2}×)"),
            match (counted, time_check_error) {
                (Some(g), Some(e)) => format!(
                    "the time per sample by the forward's operations counted from the shapes ({g:.2}×; the \
                     {}-block step's time from them {:+.1} % off its measurement)",
                    probes.deeper.knobs.checkpointed.len(),
                    e * 100.0
                ),
                _ => "the extra blocks' time as time per sample (their optimiser share is not told apart)".into(),
            },
        ],
        deeper: probes.deeper,
        deeper_checkpointed: probes.deeper_checkpointed,
        deeper_stored: probes.deeper_stored,
    };
    (grown, slice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Measured;
    use crate::plan::chain::{BlockCost, peak_with_head};
    use crate::precision::Precision;

    /// A model `blocks` deep whose figures follow a known law: a prelude
    /// and head of 40,000 parameter bytes, 10,000 a block; activations of
    /// 900 bytes a block a sample and 300 outside, and `head` bytes a
    /// sample at the forward's end; 16 bytes a trainable parameter's byte
    /// in gradients and moments.
    #[derive(Clone)]
    struct Tower {
        blocks: usize,
        head: f64,
        /// The work counted ([`crate::plan::Work`], in the time law's
        /// units), and steps deeper than two blocks timed 40 % fast (the
        /// noise that made a 7B's per-block time negative).
        counted: bool,
    }

    const PRELUDE: f64 = 40_000.0;
    const BLOCK: f64 = 10_000.0;

    impl Plannable for Tower {
        fn space(&self) -> Space {
            let n = self.blocks;
            Space {
                batch: 8,
                blocks: n,
                block_input_bytes: 100,
                precisions: vec![Precision::F32],
                storage_groups: vec![
                    ("blocks".into(), (BLOCK * n as f64) as u64),
                    ("embed".into(), PRELUDE as u64),
                ],
                low_moments: true,
                host_moments: false,
                batch_statistics: None,
                block_shapes: Vec::new(),
                fused_attention: Vec::new(),
                parameters: std::iter::once(PRELUDE as usize / 4)
                    .chain((0..n).flat_map(|_| [BLOCK as usize / 8; 2]))
                    .collect(),
                bases: Vec::new(),
                work: self.counted.then_some(crate::plan::Work {
                    outside: 0.5,
                    block: 1.0,
                    attention: 0.0,
                }),
            }
        }

        fn measure(&mut self, k: &Knobs, batch: usize) -> Result<Measured, ProbeError> {
            let n = self.blocks as f64;
            let params = PRELUDE + BLOCK * n;
            let blocks = vec![
                BlockCost {
                    activations: 900.0,
                    input: 100.0,
                    recompute: 0.1,
                };
                self.blocks
            ];
            let stored: f64 = self.space().storage_groups[..k.low_storage]
                .iter()
                .map(|(_, b)| *b as f64)
                .sum();
            let state = params * 3.0 - stored / 2.0 - if k.low_moments { params } else { 0.0 };
            let accumulator = if batch > k.micro_batch { params } else { 0.0 };
            let m = k.micro_batch as f64;
            let step =
                5_000.0 + state + accumulator + m * (300.0 + peak_with_head(&blocks, &k.checkpointed, self.head));
            let rest = 6_000.0 + state * 1.5;
            let marked = k.checkpointed.iter().filter(|x| **x).count() as f64;
            let ms = 1.0 + (batch / k.micro_batch) as f64 * 0.2 + batch as f64 * (0.5 + n * (1.0 + 0.1 * marked / n));
            let ms = if self.counted && self.blocks > 2 && self.blocks < 24 {
                0.6 * ms
            } else {
                ms
            };
            Ok(Measured {
                peak_bytes: step.max(rest) as u64,
                step_peak_bytes: step as u64,
                rest_peak_bytes: rest as u64,
                files_peak_bytes: 0,
                between_peak_bytes: 0,
                step_ms: ms,
                seconds: 0.0,
            })
        }
    }

    impl Deep for Tower {
        fn depth(&self) -> usize {
            self.blocks
        }
        fn probe_blocks(&self) -> usize {
            2
        }
        fn sliced(&self, blocks: usize) -> Result<Box<dyn Plannable>, ProbeError> {
            Ok(Box::new(Tower { blocks, ..self.clone() }))
        }
    }

    /// With no head, and with a head whose bytes at the forward's end
    /// outweigh a block's recomputation (where a split at one depth fails).
    #[test]
    fn a_two_block_slice_predicts_the_whole_depth() {
        for head in [0.0, 2_000.0] {
            predicts_the_whole_depth(head, false);
        }
    }

    /// Where the work is counted, the time grows by it: a deeper step
    /// timed fast (a negative time a block by difference) moves no
    /// prediction, and the check says how far off it was.
    #[test]
    fn counted_work_scales_the_time_whatever_the_deeper_step_measured() {
        let slice = predicts_the_whole_depth(0.0, true);
        assert!(slice.per_block_ms < 0.0, "{slice:?}");
        let e = slice.time_check_error.expect("checked");
        assert!((e - (1.0 / 0.6 - 1.0)).abs() < 1e-9, "{e}");
        assert!(
            slice.scaled.iter().any(|s| s.contains("counted from the shapes")),
            "{slice:?}"
        );
    }

    fn predicts_the_whole_depth(head: f64, counted: bool) -> Slice {
        let tower = |blocks| Tower { blocks, head, counted };
        let whole = tower(24);
        let cal = calibrate_sliced(&whole, None).unwrap();
        assert_eq!(cal.space, deepened(&tower(2).space(), &tower(3).space(), 24));
        assert_eq!(cal.space.parameters, tower(24).space().parameters);
        assert_eq!(cal.space.storage_groups, whole.space().storage_groups);
        let slice = cal.slice.as_ref().expect("extrapolated");
        assert_eq!((slice.blocks, slice.depth), (2, 24));
        let mut truth = whole.clone();
        for knobs in [
            Knobs::base(24, 8),
            Knobs {
                checkpointed: vec![true; 24],
                ..Knobs::base(24, 8)
            },
            Knobs {
                micro_batch: 2,
                checkpointed: (0..24).map(|i| i % 3 == 0).collect(),
                low_storage: 1,
                low_moments: true,
                ..Knobs::base(24, 8)
            },
        ] {
            let (peak, ms) = cal.predict(&knobs);
            let measured = truth.measure(&knobs, 8).unwrap();
            let bytes = measured.peak_bytes as f64;
            assert!(
                (peak - bytes).abs() / bytes < 2e-3,
                "head {head}, {}: predicted {peak}, measured {bytes}",
                knobs.describe(8)
            );
            assert!(
                (ms - measured.step_ms).abs() / measured.step_ms < 1e-6,
                "{ms} {measured:?}"
            );
        }
        slice.clone()
    }

    #[test]
    fn a_slice_as_deep_as_the_model_is_refused() {
        struct Shallow;
        impl Deep for Shallow {
            fn depth(&self) -> usize {
                2
            }
            fn probe_blocks(&self) -> usize {
                2
            }
            fn sliced(&self, blocks: usize) -> Result<Box<dyn Plannable>, ProbeError> {
                Ok(Box::new(Tower {
                    blocks,
                    head: 0.0,
                    counted: false,
                }))
            }
        }
        let e = calibrate_sliced(&Shallow, None).unwrap_err().to_string();
        assert!(e.contains("from 1 to 1"), "{e}");
    }

    #[test]
    fn the_block_repeats_after_the_common_prefix() {
        assert_eq!(
            repeated_block(&[4, 1, 2, 1, 2, 9], &[4, 1, 2, 1, 2, 1, 2, 9], 1, 2),
            vec![4, 1, 2, 1, 2, 1, 2, 1, 2, 9]
        );
        // A head that starts like a block: a rotation, the same sizes.
        let grown = repeated_block(&[4, 1, 2, 1, 2, 1], &[4, 1, 2, 1, 2, 1, 2, 1], 1, 1);
        assert_eq!(grown.iter().sum::<usize>(), 4 + 3 * 3 + 1);
        // Two blocks deeper: one of them repeated.
        assert_eq!(
            repeated_block(&[4, 1, 2, 9], &[4, 1, 2, 1, 2, 1, 2, 9], 2, 3),
            vec![4, 1, 2, 1, 2, 1, 2, 1, 2, 9]
        );
    }
}
