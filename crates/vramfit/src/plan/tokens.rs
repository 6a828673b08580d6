//! Planning a long sequence from probes at fewer tokens.
//!
//! A sequence model's probes cost in proportion to the tokens a sample
//! has (more where attention is standard): a 2-block slice of a 7B at
//! 2,048 tokens is several TFLOP a step. Everything the planner fits falls
//! into two kinds: bytes and time that do not depend on the tokens
//! (parameters, gradients, moments, the optimiser, files, what a knob
//! adds in proportion to the parameters), and bytes and time per sample,
//! which do. Of the per-sample bytes, what a block keeps is
//! `α·t + β·t²` (the `t²` part: attention's scores, where they are
//! kept), the block's checkpoint input is the shape's own (exact), and
//! what the prelude and head hold is per token (embeddings, logits).
//!
//! So the planner calibrates fully at `t₀` tokens ([`Long::probe_tokens`],
//! on a slice where the workload asks for one), then runs plain steps at
//! `t₁ = 2·t₀`, at two batches (and with the attention fused too, where
//! the space has it): they give a block's bytes at a second length, and
//! the two lengths give `α` and `β`; what the step holds outside the
//! samples may grow with the tokens too (a causal mask is the step's, not
//! a sample's), and its growth from `t₀` to `t₁` is carried on as `t²`.
//! The step time per sample follows `c₁·t + c₂·t²` through the two plain
//! steps (of the slice: where the head's time, linear in t, is a large
//! share of the slice's, the whole depth's time at long lengths comes out
//! low; time ranks plans, bytes decide them). A step with every block
//! checkpointed at `t₁` is predicted from the law before it is measured:
//! the law's check, recorded and printed ([`TokenLaw::check_error`]); a
//! check under its measurement widens the planner's margin by as much.
//! Every figure at the run's tokens is then an extrapolation, and
//! [`super::Calibration::tokens`] says so.

use serde::{Deserialize, Serialize};

use super::chain::peak_with_head;
use super::cost_model::shaped;
use super::{Calibration, Knobs, Measured, PlanError, Plannable, ProbeError, ProbeRecord};

/// A workload whose samples are sequences, to be probed at fewer tokens.
pub trait Long {
    /// Tokens a sample has in the run.
    fn tokens(&self) -> usize;
    /// Tokens the full calibration runs at (below [`Long::tokens`]).
    fn probe_tokens(&self) -> usize;
    /// The workload at `tokens` a sample, everything else as it is (the
    /// same slice of its blocks, where it is planned from one).
    fn shortened(&self, tokens: usize) -> Result<Box<dyn Plannable>, ProbeError>;
}

/// How a calibration was extrapolated in tokens: what `plan.json` and the
/// printout name as not measured at the run's length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLaw {
    /// Tokens a sample has in the run, which every prediction is for.
    pub tokens: usize,
    /// The two lengths probed: the full calibration's and the plain steps'.
    pub probed: [usize; 2],
    /// A block's bytes per sample: `[α, β]` of `α·t + β·t²`.
    pub block: [f64; 2],
    /// The same with the attention fused, where the space has it.
    pub fused_block: Option<[f64; 2]>,
    /// What the step's bytes outside the samples grew by from the first
    /// length to the second (taken as growing with t² beyond).
    #[serde(default)]
    pub fixed_growth_bytes: f64,
    /// The step's time per sample, `[c₁, c₂]` of `c₁·t + c₂·t²` (ms).
    pub time: [f64; 2],
    /// The steps at the second length (plain; fused; checkpoint all).
    pub probes: Vec<ProbeRecord>,
    /// The checkpointed step's forward/backward peak at the second length,
    /// predicted from the law against measured (relative; positive: over).
    pub check_error: Option<f64>,
    /// Where the time was scaled by the counted work ([`super::Work`]):
    /// the plain step at the second length predicted from it, against its
    /// measurement (relative; positive: over).
    #[serde(default)]
    pub time_check_error: Option<f64>,
    /// What was scaled, in words.
    pub scaled: Vec<String>,
}

/// `[a, b]` of `a·t + b·t²` through `(t0, y0)` and `(t1, y1)`; where the
/// two points bend it down (noise, or a per-token cost that shrinks),
/// linear at the larger of the two per-token rates (the larger prediction).
fn law(t0: f64, y0: f64, t1: f64, y1: f64) -> [f64; 2] {
    let b = (y1 / t1 - y0 / t0) / (t1 - t0);
    if b >= 0.0 {
        [y0 / t0 - b * t0, b]
    } else {
        [(y0 / t0).max(y1 / t1), 0.0]
    }
}

fn at([a, b]: [f64; 2], t: f64) -> f64 {
    a * t + b * t * t
}

/// Calibrates `long` (whose space at the run's tokens is `space`) at
/// fewer tokens and extrapolates (see the module's description).
pub fn calibrate_long(
    long: &dyn Long,
    space: super::Space,
    probe_batch: Option<usize>,
) -> Result<Calibration, PlanError> {
    let (tokens, t0) = (long.tokens(), long.probe_tokens());
    if t0 == 0 || t0 >= tokens {
        return Err(PlanError::Setting(format!(
            "probes at {t0} tokens for a run of {tokens}: give a probe length from 1 to {}",
            tokens.saturating_sub(1)
        )));
    }
    let t1 = (2 * t0).min(tokens);
    let probe_error = |what: String| {
        move |why: ProbeError| PlanError::Probe {
            probe: what.clone(),
            why: why.to_string(),
        }
    };
    let mut short = long
        .shortened(t0)
        .map_err(probe_error(format!("the workload at {t0} tokens")))?;
    let cal = super::calibrate_at_base(short.as_mut(), probe_batch)?;
    drop(short);
    // The steps at t₁ run as deep as the calibration's did.
    let longer = long
        .shortened(t1)
        .map_err(probe_error(format!("the workload at {t1} tokens")))?;
    let mut longer = match (&cal.slice, longer.deep()) {
        (Some(slice), Some(deep)) => deep
            .sliced(slice.blocks)
            .map_err(probe_error(format!("the {}-block slice at {t1} tokens", slice.blocks)))?,
        _ => longer,
    };
    let p = cal.probe_batch;
    let k = cal.slice.as_ref().map_or(cal.model.blocks, |s| s.blocks);
    let work_t1 = longer.space().work;
    // The probed depth's bytes outside the samples: the whole depth's less
    // what the extrapolation added per block.
    let added = cal
        .slice
        .as_ref()
        .map_or(0.0, |s| (s.depth - s.blocks) as f64 * s.per_block_fixed_bytes);
    let mut probes = Vec::new();
    let mut run = |name: &str, knobs: Knobs, batch: usize| -> Result<Measured, PlanError> {
        let measured = longer.measure(&knobs, batch).map_err(|why| PlanError::Probe {
            probe: format!("{name} at {t1} tokens ({})", knobs.describe(batch)),
            why: why.to_string(),
        })?;
        probes.push(ProbeRecord {
            name: format!("{name} at {t1} tokens"),
            knobs,
            batch,
            measured,
            predicted_peak: 0.0,
            predicted_ms: 0.0,
        });
        Ok(measured)
    };
    let (f0, f1) = (t0 as f64, t1 as f64);
    let (r1, r) = (f1 / f0, tokens as f64 / f0);
    let model = &cal.model;
    // Per sample and per step at t₁, from two batches (as at t₀): what
    // does not scale with the batch may grow with the tokens too (a
    // causal mask of t² is one step's, not a sample's).
    let plain = run("plain", Knobs::base(k, p), p)?;
    let q = model.least_probed_micro_batch;
    let (per_sample, fixed_growth) = if (1..p).contains(&q) {
        let smaller = run("smaller batch", Knobs::base(k, q), q)?;
        let step = |m: &Measured| m.step_peak_bytes as f64;
        let per_sample = (step(&plain) - step(&smaller)) / (p - q) as f64;
        let fixed = step(&plain) - p as f64 * per_sample;
        (per_sample, (fixed - (model.fixed_bytes - added)).max(0.0))
    } else {
        (
            (plain.step_peak_bytes as f64 - (model.fixed_bytes - added)) / p as f64,
            0.0,
        )
    };
    // A block's bytes at t₁: a sample's, less what the prelude and head
    // hold (per token, as at t₀).
    let block_of = |per_sample: f64, outside: f64| (per_sample - (outside + model.head_bytes) * r1) / k as f64;
    let block = law(
        f0,
        model.block.activations,
        f1,
        block_of(per_sample, model.outside_bytes),
    );
    // The growth of the step's own bytes, taken as t² (the larger reading
    // between the two lengths' t and t²).
    let fixed_at = |t: f64| fixed_growth * (t * t - f0 * f0) / (f1 * f1 - f0 * f0);
    let fused_block = match &model.fused_attention {
        Some(f) => {
            let fused = run(
                "attention fused",
                Knobs {
                    fused_attention: true,
                    ..Knobs::base(k, p)
                },
                p,
            )?;
            let per_sample = (fused.step_peak_bytes as f64 - (f.fixed_bytes - added + fixed_growth)) / p as f64;
            Some(law(f0, f.block.activations, f1, block_of(per_sample, f.outside_bytes)))
        }
        None => None,
    };
    // The time per sample: the base step's at t₀ (on the probed depth)
    // and the plain step's at t₁, less what does not scale with the batch.
    let base_ms = cal
        .probes
        .iter()
        .find(|r| r.name == "base")
        .expect("every calibration probes a base")
        .measured
        .step_ms;
    // Where the fitted overhead is most of the step (its fit then is the
    // noise between steps of one sample and two: a 7B's 2-block slice
    // measured 1,815 and 2,062 ms), the law runs through the whole steps.
    let overhead = model.fixed_ms + model.micro_batch_ms;
    let overhead = if overhead < 0.5 * base_ms { overhead } else { 0.0 };
    let time = law(
        f0,
        (base_ms - overhead).max(1e-9),
        f1,
        (plain.step_ms - overhead).max(1e-9),
    );
    // Where the workload counts its work, the time grows as the counted
    // operations do (a block's recomputation as a block's); the two-point
    // law is then the check: the plain step at t₁ from the count.
    let counted = match (cal.space.work, space.work) {
        (Some(w0), Some(w)) => {
            super::work::ratio(w.total(space.blocks), w0.total(space.blocks)).zip(super::work::ratio(w.block, w0.block))
        }
        _ => None,
    };
    let time_check_error = match (cal.space.work, work_t1, counted) {
        (Some(w0), Some(w1), Some(_)) => {
            let predicted = overhead + (base_ms - overhead).max(0.0) * w1.total(k) / w0.total(k);
            Some(predicted / plain.step_ms.max(1e-9) - 1.0)
        }
        _ => None,
    };
    let (time_ratio, recompute_ratio) = match counted {
        Some(both) => both,
        None => {
            let r = at(time, tokens as f64) / at(time, f0);
            (r, r)
        }
    };
    let s1 = space.block_input_bytes as f64 * f1 / tokens as f64;
    // The law's check: every block checkpointed at t₁, predicted first.
    let check_error = if k >= 2 {
        let chain = shaped(
            super::chain::BlockCost {
                activations: at(block, f1),
                input: s1,
                recompute: 0.0,
            },
            k,
            &[],
        );
        let predicted = model.fixed_bytes - added
            + fixed_growth
            + p as f64 * (model.outside_bytes * r1 + peak_with_head(&chain, &vec![true; k], model.head_bytes * r1));
        let all = Knobs {
            checkpointed: vec![true; k],
            ..Knobs::base(k, p)
        };
        let measured = run("checkpoint all", all, p)?;
        if let Some(record) = probes.last_mut() {
            record.predicted_peak = predicted;
        }
        Some(predicted / measured.step_peak_bytes as f64 - 1.0)
    } else {
        None
    };
    drop(longer);
    let seconds: f64 = probes.iter().map(|r| r.measured.seconds).sum();
    let t = tokens as f64;
    let s = space.block_input_bytes as f64;
    let mut grown = model.clone();
    grown.fixed_bytes += fixed_at(t);
    grown.outside_bytes *= r;
    grown.head_bytes *= r;
    grown.below_probed_bytes *= r;
    grown.block.activations = at(block, t);
    grown.block.input = s;
    grown.block.recompute *= recompute_ratio;
    grown.sample_ms *= time_ratio;
    grown.block_shapes = space.block_shapes.clone();
    if let (Some(f), Some(fb)) = (grown.fused_attention.as_mut(), fused_block) {
        f.fixed_bytes += fixed_at(t);
        f.outside_bytes *= r;
        f.block.activations = at(fb, t);
        f.block.input = s;
        f.block.recompute *= recompute_ratio;
        f.sample_ms *= time_ratio;
    }
    // A check under its measurement widens the margin by as much.
    let shortfall = cal.shortfall.max(check_error.map_or(0.0, |e| -e));
    let law = TokenLaw {
        tokens,
        fixed_growth_bytes: fixed_growth,
        probed: [t0, t1],
        block,
        fused_block,
        time,
        probes,
        check_error,
        time_check_error,
        scaled: vec![
            format!("the prelude's and head's bytes per sample by the tokens ({r:.2}×)"),
            format!(
                "a block's bytes per sample by α·t + β·t² through {t0} and {t1} tokens ({:.2}×)",
                grown.block.activations / model.block.activations.max(1.0)
            ),
            match time_check_error {
                Some(e) => format!(
                    "the step's time per sample by the forward's operations counted from the shapes \
                     ({time_ratio:.2}×; the plain step at {t1} tokens from them {:+.1} % off its measurement)",
                    e * 100.0
                ),
                None => format!("the step's time per sample by c₁·t + c₂·t² ({time_ratio:.2}×)"),
            },
        ],
    };
    Ok(Calibration {
        space,
        model: grown,
        seconds: cal.seconds + seconds,
        shortfall,
        tokens: Some(law),
        ..cal
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::chain::BlockCost;
    use crate::plan::{Deep, Space};
    use crate::precision::Precision;

    /// A sequence model with a known law: per sample, each block keeps
    /// `30·t + 0.5·t²` bytes, its input `4·t`, the prelude and head `10·t`
    /// and `50·t` at the forward's end; 20,000 bytes of parameters a block;
    /// a causal mask of `2·t²` bytes a step.
    #[derive(Clone, Copy)]
    struct Seq {
        blocks: usize,
        tokens: usize,
        probe: usize,
        /// Its work counted ([`crate::plan::Work`], in the time law's units).
        counted: bool,
    }

    impl Plannable for Seq {
        fn space(&self) -> Space {
            Space {
                batch: 4,
                blocks: self.blocks,
                block_input_bytes: 4 * self.tokens as u64,
                precisions: vec![Precision::F32],
                storage_groups: Vec::new(),
                low_moments: false,
                host_moments: false,
                batch_statistics: None,
                block_shapes: Vec::new(),
                fused_attention: Vec::new(),
                parameters: vec![5_000; self.blocks],
                bases: Vec::new(),
                work: self.counted.then(|| {
                    let t = self.tokens as f64;
                    crate::plan::Work {
                        outside: 0.0,
                        block: 0.01 * t + 1e-4 * t * t,
                        attention: 1e-4 * t * t,
                    }
                }),
            }
        }

        fn measure(&mut self, k: &Knobs, batch: usize) -> Result<Measured, ProbeError> {
            let t = self.tokens as f64;
            let block = BlockCost {
                activations: 30.0 * t + 0.5 * t * t,
                input: 4.0 * t,
                recompute: 0.0,
            };
            let chain = vec![block; self.blocks];
            let m = k.micro_batch as f64;
            let fixed = 7_000.0 + 20_000.0 * self.blocks as f64;
            let accumulator = if batch > k.micro_batch {
                20_000.0 * self.blocks as f64
            } else {
                0.0
            };
            // A causal mask of 2·t² bytes a step.
            let mask = 2.0 * t * t;
            let step = fixed + mask + accumulator + m * (10.0 * t + peak_with_head(&chain, &k.checkpointed, 50.0 * t));
            let ms = 2.0 + batch as f64 * self.blocks as f64 * (0.01 * t + 1e-4 * t * t);
            Ok(Measured {
                peak_bytes: step as u64,
                step_peak_bytes: step as u64,
                rest_peak_bytes: fixed as u64,
                files_peak_bytes: 0,
                between_peak_bytes: 0,
                step_ms: ms,
                seconds: 0.0,
            })
        }

        fn deep(&self) -> Option<&dyn Deep> {
            Some(self)
        }
    }

    impl Deep for Seq {
        fn depth(&self) -> usize {
            self.blocks
        }
        fn probe_blocks(&self) -> usize {
            2
        }
        fn sliced(&self, blocks: usize) -> Result<Box<dyn Plannable>, ProbeError> {
            Ok(Box::new(Seq { blocks, ..*self }))
        }
    }

    impl Long for Seq {
        fn tokens(&self) -> usize {
            self.tokens
        }
        fn probe_tokens(&self) -> usize {
            self.probe
        }
        fn shortened(&self, tokens: usize) -> Result<Box<dyn Plannable>, ProbeError> {
            Ok(Box::new(Seq { tokens, ..*self }))
        }
    }

    /// Times by the two-point law, and by the counted work (whose check
    /// at the second length is then exact).
    #[test]
    fn a_short_slice_predicts_the_long_deep_model() {
        for counted in [false, true] {
            predicts_the_long_deep_model(counted);
        }
    }

    fn predicts_the_long_deep_model(counted: bool) {
        let whole = Seq {
            blocks: 16,
            tokens: 1024,
            probe: 64,
            counted,
        };
        let cal = calibrate_long(&whole, whole.space(), None).unwrap();
        let law = cal.tokens.as_ref().expect("extrapolated in tokens");
        assert_eq!(law.probed, [64, 128]);
        assert!(
            (law.block[0] - 30.0).abs() < 1e-6 && (law.block[1] - 0.5).abs() < 1e-9,
            "{:?}",
            law.block
        );
        assert!(law.check_error.unwrap().abs() < 1e-9, "{law:?}");
        assert_eq!(law.time_check_error.is_some(), counted, "{law:?}");
        assert!(law.time_check_error.unwrap_or(0.0).abs() < 1e-6, "{law:?}");
        let mut truth = whole;
        for knobs in [
            Knobs::base(16, 4),
            Knobs {
                checkpointed: vec![true; 16],
                ..Knobs::base(16, 4)
            },
            Knobs {
                micro_batch: 1,
                checkpointed: (0..16).map(|i| i % 2 == 0).collect(),
                ..Knobs::base(16, 4)
            },
        ] {
            let (peak, ms) = cal.predict(&knobs);
            let measured = truth.measure(&knobs, 4).unwrap();
            let bytes = measured.peak_bytes as f64;
            assert!(
                (peak - bytes).abs() / bytes < 1e-3,
                "{}: predicted {peak}, measured {bytes}",
                knobs.describe(4)
            );
            assert!(
                (ms - measured.step_ms).abs() / measured.step_ms < 1e-3,
                "{ms} vs {}",
                measured.step_ms
            );
        }
    }

    #[test]
    fn the_law_bends_only_up() {
        assert_eq!(law(1.0, 2.0, 2.0, 8.0), [0.0, 2.0]);
        // Bent down by the second point: linear at the larger rate.
        assert_eq!(law(1.0, 4.0, 2.0, 6.0), [4.0, 0.0]);
    }
}
