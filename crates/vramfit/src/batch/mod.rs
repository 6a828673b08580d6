//! Micro-batching with gradient accumulation: `k` micro-batches of `b`
//! samples give the update of one batch of `k·b` with a mean-reduced loss.
//!
//! Each micro-batch's mean loss is multiplied by `1/k` before backward and
//! the gradients are summed ([`Accumulator`]); the optimiser steps once per
//! batch. Per-sample operations (LayerNorm, attention) make the two exactly
//! the same up to float summation order; BatchNorm's batch statistics are
//! computed per micro-batch and so differ, as they do in PyTorch.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;

use crate::grads::add_into;

/// How one optimiser step's batch is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MicroBatching {
    /// Samples per micro-batch (`b`).
    pub micro_batch: usize,
    /// Micro-batches per optimiser step (`k`).
    pub accumulate: usize,
}

/// A batch split that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MicroBatchError {
    /// `b · k` is not the batch.
    #[error(
        "micro_batch {micro_batch} × accumulate {accumulate} = {product} does not equal batch_size {batch}: \
         set them so that micro_batch × accumulate = batch_size (for example {hint})"
    )]
    DoesNotDivide {
        /// The batch.
        batch: usize,
        /// `b`.
        micro_batch: usize,
        /// `k`.
        accumulate: usize,
        /// `b · k`.
        product: usize,
        /// A split that works, keeping the given `b` where it divides the
        /// batch (a user who asked for a micro-batch wants that one), else
        /// the given `k`; or why none keeps either.
        hint: String,
    },
    /// A zero.
    #[error("micro_batch and accumulate must be at least 1 (got micro_batch {micro_batch}, accumulate {accumulate})")]
    Zero {
        /// `b`.
        micro_batch: usize,
        /// `k`.
        accumulate: usize,
    },
}

impl MicroBatching {
    /// The whole batch at once.
    pub fn whole(batch: usize) -> Self {
        Self {
            micro_batch: batch,
            accumulate: 1,
        }
    }

    /// Checks that `micro_batch × accumulate = batch`.
    pub fn validate(&self, batch: usize) -> Result<(), MicroBatchError> {
        if self.micro_batch == 0 || self.accumulate == 0 {
            return Err(MicroBatchError::Zero {
                micro_batch: self.micro_batch,
                accumulate: self.accumulate,
            });
        }
        let product = self.micro_batch * self.accumulate;
        if product != batch {
            let (b, k) = (self.micro_batch, self.accumulate);
            let hint = if batch.is_multiple_of(b) {
                format!("accumulate = {} with micro_batch = {b}", batch / b)
            } else if batch.is_multiple_of(k) {
                format!("micro_batch = {} with accumulate = {k}", batch / k)
            } else if b == k {
                format!("none keeps either: {batch} is not divisible by {k}")
            } else {
                format!("none keeps either: {batch} is divisible by neither {b} nor {k}")
            };
            return Err(MicroBatchError::DoesNotDivide {
                batch,
                micro_batch: self.micro_batch,
                accumulate: self.accumulate,
                product,
                hint,
            });
        }
        Ok(())
    }

    /// Sample ranges of the micro-batches, in order.
    pub fn ranges(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        (0..self.accumulate).map(|i| i * self.micro_batch..(i + 1) * self.micro_batch)
    }

    /// The factor each micro-batch's mean loss is multiplied by.
    pub fn loss_factor(&self) -> f64 {
        1.0 / self.accumulate as f64
    }
}

/// Sums the gradients of the micro-batches of one optimiser step.
#[derive(Default)]
pub struct Accumulator {
    grads: GradientsParams,
    count: usize,
}

impl Accumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one micro-batch's gradients.
    pub fn add<B: AutodiffBackend, M: AutodiffModule<B>>(&mut self, module: &M, grads: GradientsParams) {
        if self.count == 0 {
            self.grads = grads;
        } else {
            add_into(module, &mut self.grads, grads);
        }
        self.count += 1;
    }

    /// Bytes of the gradients summed so far.
    pub fn bytes<B: AutodiffBackend, M: AutodiffModule<B>>(&self, module: &M) -> u64 {
        if self.count == 0 {
            0
        } else {
            crate::grads::bytes(module, &self.grads)
        }
    }

    /// The summed gradients.
    pub fn finish(self) -> GradientsParams {
        self.grads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_the_split() {
        assert!(
            MicroBatching {
                micro_batch: 4,
                accumulate: 2
            }
            .validate(8)
            .is_ok()
        );
        let e = MicroBatching {
            micro_batch: 3,
            accumulate: 2,
        }
        .validate(8)
        .unwrap_err();
        assert!(e.to_string().contains("micro_batch = 4 with accumulate = 2"), "{e}");
        // A micro-batch given alone is kept: the accumulation is what to change.
        let e = MicroBatching {
            micro_batch: 4,
            accumulate: 1,
        }
        .validate(8)
        .unwrap_err();
        assert!(e.to_string().contains("accumulate = 2 with micro_batch = 4"), "{e}");
        let e = MicroBatching {
            micro_batch: 3,
            accumulate: 3,
        }
        .validate(8)
        .unwrap_err();
        assert!(e.to_string().contains("not divisible by 3"), "{e}");
        assert!(
            MicroBatching {
                micro_batch: 0,
                accumulate: 2
            }
            .validate(8)
            .is_err()
        );
        let r: Vec<_> = MicroBatching {
            micro_batch: 3,
            accumulate: 2,
        }
        .ranges()
        .collect();
        assert_eq!(r, [0..3, 3..6]);
    }
}
