//! The step's work counted from the shapes: what the planner scales a
//! measured step time by where it extrapolates to a model it did not run
//! (a deeper one, [`super::slice`]; longer samples, [`super::tokens`]).
//!
//! Differences of measured times are the noise of the machine at the
//! sizes that matter: a Mistral-7B's 2-block slice and its 3-block step
//! differed by −504 ms a block on 2 cores, which made the whole depth's
//! time per sample the slice's. Counted operations cannot be negative,
//! and their ratio carries the measured rate of the probed step (the
//! rate of this device at this shape) to the whole: time per sample at
//! the whole shape = time per sample probed × work(whole) / work(probed).
//! That assumes the rate does not change between the two shapes, which
//! the planner checks against the one longer or deeper step it measures
//! anyway and reports.
//!
//! Counted: the forward's floating-point operations per sample (a
//! matrix of `n` values is `2·n` a token; the attention's scores and
//! weighted sum `4·t·width` a token over the whole `t×t`, as the kernels
//! compute it before the causal mask). The backward is a fixed multiple
//! of the forward for blocks that repeat, so it cancels in the ratio.

use serde::{Deserialize, Serialize};

/// Forward floating-point operations per sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Work {
    /// Outside the blocks (the head; an embedding's lookup counts none).
    pub outside: f64,
    /// Each block (the blocks are equal).
    pub block: f64,
    /// Of `block`, the attention's scores and weighted sum (the part that
    /// grows as `t²`).
    pub attention: f64,
}

impl Work {
    /// A decoder's work per sample of `tokens` tokens: each block's
    /// projections hold `block_weights` values, its attention spans
    /// `attention_width` (heads × head width), and the head holds
    /// `head_weights` values.
    pub fn decoder(tokens: usize, block_weights: u64, attention_width: usize, head_weights: u64) -> Self {
        let t = tokens as f64;
        let attention = 4.0 * t * t * attention_width as f64;
        Self {
            outside: 2.0 * t * head_weights as f64,
            block: 2.0 * t * block_weights as f64 + attention,
            attention,
        }
    }

    /// The whole forward `blocks` deep.
    pub fn total(&self, blocks: usize) -> f64 {
        self.outside + blocks as f64 * self.block
    }
}

/// `to / from`, where both are counted and positive.
pub fn ratio(to: f64, from: f64) -> Option<f64> {
    (to > 0.0 && from > 0.0 && to.is_finite() && from.is_finite()).then(|| to / from)
}

/// How often predicted step times order two plans as their measured times
/// do: of the pairs of `(predicted, measured)` whose measurements differ by
/// more than the probes' resolution ([`super::cost_model::TIME_RESOLUTION`]),
/// `(agreeing, counted)`. Two plans predicted at the same time do not
/// agree (the prediction does not order them); until 2026-11-29 such a
/// pair agreed or not by the order the plans were listed in.
pub fn order_agreement(times: &[(f64, f64)]) -> (usize, usize) {
    let mut agree = 0;
    let mut counted = 0;
    for (i, a) in times.iter().enumerate() {
        for b in &times[i + 1..] {
            if (a.1 - b.1).abs() <= super::cost_model::TIME_RESOLUTION * a.1.max(b.1) {
                continue;
            }
            counted += 1;
            if a.0 != b.0 && (a.0 < b.0) == (a.1 < b.1) {
                agree += 1;
            }
        }
    }
    (agree, counted)
}

impl super::Calibration {
    /// What the predicted step times rest on, in words, for tables: each
    /// says its time basis.
    pub fn time_basis(&self) -> String {
        let counted = self.slice.as_ref().is_some_and(|s| s.time_check_error.is_some())
            || self.tokens.as_ref().is_some_and(|t| t.time_check_error.is_some());
        let checks: Vec<String> = self
            .slice
            .iter()
            .filter_map(|s| {
                s.time_check_error
                    .map(|e| format!("{} blocks {:+.0} %", s.deeper.knobs.checkpointed.len(), e * 100.0))
            })
            .chain(self.tokens.iter().filter_map(|t| {
                t.time_check_error
                    .map(|e| format!("{} tokens {:+.0} %", t.probed[1], e * 100.0))
            }))
            .collect();
        if counted {
            format!(
                "estimates: the probed steps' times on this device, scaled to the whole by the forward's operations \
                 counted from the shapes (checked on the one deeper or longer step measured: {}); this device's \
                 rate, not a card's",
                checks.join(", ")
            )
        } else if self.slice.is_some() || self.tokens.is_some() {
            "estimates: the probed steps' times on this device, extrapolated by differences of measured times \
             (noisy at large sizes); this device's rate, not a card's"
                .into()
        } else {
            "the probed steps' times on this device, fitted; this device's rate, not a card's".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_compared_on_pairs_measured_apart() {
        // (1, 10) and (2, 20) agree; (3, 15) is out of order with (2, 20);
        // (2.5, 20.5) is within 5 % of (2, 20) and not counted with it.
        let times = [(1.0, 10.0), (2.0, 20.0), (3.0, 15.0), (2.5, 20.5)];
        assert_eq!(order_agreement(&times), (3, 5));
        assert_eq!(order_agreement(&[]), (0, 0));
        // Predicted alike, measured apart: not ordered, in either listing.
        assert_eq!(order_agreement(&[(5.0, 10.0), (5.0, 20.0)]), (0, 1));
        assert_eq!(order_agreement(&[(5.0, 20.0), (5.0, 10.0)]), (0, 1));
    }

    #[test]
    fn a_decoders_work_grows_with_depth_and_as_the_square_of_the_tokens_in_attention() {
        // Mistral-7B's shapes: 4096 wide, 8 of 32 heads for K and V, an MLP of 14,336, 32,000 tokens.
        let block = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14_336;
        let w = Work::decoder(2048, block, 4096, 4096 * 32_000);
        // 2·2048·218 M ≈ 0.89 TFLOP of projections a block, 4·2048²·4096 ≈ 69 GFLOP of attention.
        assert!((w.block - 2.0 * 2048.0 * block as f64 - w.attention).abs() < 1.0);
        assert!((w.attention - 4.0 * 2048.0f64.powi(2) * 4096.0).abs() < 1.0);
        let slice = w.total(2);
        assert!((w.total(32) / slice - 13.0).abs() < 1.0, "{}", w.total(32) / slice);
        // Twice the tokens: twice the projections, four times the attention.
        let long = Work::decoder(4096, block, 4096, 4096 * 32_000);
        assert!((long.attention / w.attention - 4.0).abs() < 1e-12);
        assert!((long.outside / w.outside - 2.0).abs() < 1e-12);
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(-1.0, 2.0), None);
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
    }
}
