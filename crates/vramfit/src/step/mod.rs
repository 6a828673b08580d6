//! The training step that composes the techniques: micro-batches →
//! forward under the precision policy (blocks checkpointed as planned) →
//! loss × scale / k → backward → accumulate → unscale once and check for
//! inf/NaN → optimiser step on the f32 masters (or skip) → allocator policy.
//!
//! A model describes itself as `prelude → blocks → head` ([`Trainable`]);
//! the step, not the model, chooses the plain backward (one graph) or the
//! segmented one that recomputes checkpointed blocks. The step reports the
//! end of each phase (`forward`, `backward` per micro-batch, `optimizer`)
//! to a [`StepObserver`], which is how the profiler measures activations
//! for every workload.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use crate::activation_checkpointing::{Block, forward_backward};
use crate::allocator::Cleanup;
use crate::batch::{Accumulator, MicroBatching};
use crate::optim::ModuleAdam;
use crate::precision::{Autocast, LossScaler};
use crate::profile::{Accounted, Profiler};
use crate::storage::trainable_and_frozen_bytes;

/// A model the composed step can train: `prelude → blocks → head`, where
/// the blocks are a chain of rank-`D` activations (a stack of them where the
/// model has skip connections, see [`Block::forward_stack`]).
pub trait Trainable<B: AutodiffBackend, const D: usize>: AutodiffModule<B> {
    /// One batch of inputs and targets.
    type Batch;
    /// One block of the chain.
    type Block: AutodiffModule<B, InnerModule: Block<B::InnerBackend, D>> + Block<B, D>;

    /// Samples `range` of `batch`.
    fn micro_batch(batch: &Self::Batch, range: Range<usize>) -> Self::Batch;

    /// Device bytes of a batch (the `inputs` category).
    fn batch_bytes(batch: &Self::Batch) -> u64;

    /// Everything before the blocks (embeddings): the chain's input.
    fn prelude(&self, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, D>;

    /// The chain's input where it is more than one tensor (a multimodal
    /// model's image tokens above its prompt), its top last: by default
    /// the prelude alone. The step runs the chain from this.
    fn prelude_stack(&self, batch: &Self::Batch, autocast: &Autocast) -> Vec<Tensor<B, D>> {
        vec![self.prelude(batch, autocast)]
    }

    /// The chain of blocks.
    fn blocks(&self) -> &[Self::Block];

    /// Everything after the blocks, down to the mean loss (f32).
    fn head(&self, x: Tensor<B, D>, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, 1>;

    /// The whole forward to the mean loss as one graph.
    fn loss(&self, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, 1> {
        let mut stack = self.prelude_stack(batch, autocast);
        for block in self.blocks() {
            stack = block.forward_stack(stack, autocast);
        }
        assert_eq!(stack.len(), 1, "the last block leaves one tensor for the head");
        self.head(stack.remove(0), batch, autocast)
    }
}

/// Sees the end of each phase of a step. `walked` gives the bytes the step
/// can name at that moment (computed only if the observer asks).
pub trait StepObserver {
    /// The end of `phase` (of micro-batch `micro_batch`, where per micro-batch).
    fn phase(&mut self, phase: &str, micro_batch: Option<usize>, walked: &dyn Fn() -> Accounted);
}

/// No observer.
impl StepObserver for () {
    fn phase(&mut self, _: &str, _: Option<usize>, _: &dyn Fn() -> Accounted) {}
}

/// The profiler watching step `step`: every phase updates its high-water
/// marks; the phases are recorded with their categories when `record`.
pub struct Probe<'a> {
    /// The profiler.
    pub profiler: &'a mut Profiler,
    /// The step (1-based).
    pub step: u64,
    /// Record the categories (a profiled step), not only the high-water.
    pub record: bool,
}

impl StepObserver for Probe<'_> {
    fn phase(&mut self, phase: &str, micro_batch: Option<usize>, walked: &dyn Fn() -> Accounted) {
        self.profiler
            .observe(self.step, phase, micro_batch, self.record, walked);
    }
}

/// What one optimiser step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// Mean loss over the batch (unscaled), read from the device.
    pub loss: f64,
    /// Whether the optimiser stepped (false: inf/NaN gradients, step skipped).
    pub stepped: bool,
    /// Loss scale used this step (1 without a scaler).
    pub scale: f64,
    /// Seconds spent in the allocator cleanup, if it ran.
    pub cleanup_seconds: Option<f64>,
}

/// A step that cannot continue.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StepError {
    /// Inf/NaN with nothing to back off.
    #[error(
        "the loss or gradients became {what} at step {step} (loss {loss}); nothing was updated. \
         Lower the learning rate, or use f32 or bf16 precision, then resume from the last checkpoint"
    )]
    NonFinite {
        /// Optimiser step (1-based).
        step: u64,
        /// Loss read.
        loss: f64,
        /// `NaN` or `inf`.
        what: &'static str,
    },
    /// The device failed (for example out of memory) while the step ran.
    #[error("the device failed during step {step}: {reason}")]
    Device {
        /// Optimiser step (1-based).
        step: u64,
        /// What the backend reported.
        reason: String,
    },
    /// The loss scaler kept backing off: every step overflows.
    #[error(
        "the f16 loss scale fell to {scale:e} after {skipped} skipped steps: the gradients are inf/NaN at any scale. \
         Check the data and learning rate, or train in bf16 or f32"
    )]
    ScaleCollapsed {
        /// Current scale.
        scale: f64,
        /// Steps skipped so far.
        skipped: u64,
    },
    /// The data-parallel ranks disagree (on the step, or on the gradients they hold).
    #[error(transparent)]
    Ranks(#[from] crate::ranks::RanksApart),
}

/// A step that failed on the device: where, and what the backend said.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceFailure {
    /// Step (1-based).
    pub step: u64,
    /// Phase in which the failure surfaced.
    pub phase: String,
    /// The backend's words.
    pub message: String,
}

/// Below this the f16 loss scale cannot rescue anything (f16's smallest subnormal is 2⁻²⁴).
const MIN_SCALE: f64 = 1.0 / (1u64 << 24) as f64;

impl StepError {
    /// The device failure this is, for the run driver's out-of-memory report.
    pub fn device_failure(&self) -> Option<DeviceFailure> {
        match self {
            Self::Device { step, reason } => Some(DeviceFailure {
                step: *step,
                phase: "step".into(),
                message: reason.clone(),
            }),
            _ => None,
        }
    }
}

/// The composed training step.
pub struct Stepper<B: AutodiffBackend> {
    /// Precision policy.
    pub autocast: Autocast,
    /// Checkpoint marks, one per block.
    pub checkpointed: Vec<bool>,
    /// Batch split.
    pub batching: MicroBatching,
    /// Loss scaler (f16), if any.
    pub scaler: Option<LossScaler>,
    /// Optimiser.
    pub optimizer: ModuleAdam<B>,
    /// Allocator policy.
    pub cleanup: Cleanup,
    /// Optimiser steps attempted (taken or skipped).
    pub attempts: u64,
    /// The data-parallel ranks this step is one of (`None`: one process).
    pub ranks: Option<std::sync::Arc<dyn crate::ranks::Collective>>,
}

/// A step's summed loss, its gradients, and the parameters whose gradient
/// went to their owner on another rank.
type Gathered<B> = (
    Tensor<<B as AutodiffBackend>::InnerBackend, 1>,
    GradientsParams,
    HashSet<ParamId>,
);

impl<B: AutodiffBackend> Stepper<B> {
    /// What `model` and the optimiser hold between steps.
    pub fn accounted<M: burn::module::Module<B>>(&self, model: &M) -> Accounted {
        let (parameters, frozen_parameters) = trainable_and_frozen_bytes(model);
        Accounted {
            parameters,
            frozen_parameters,
            optimizer_state: self.optimizer.state_bytes(),
            ..Default::default()
        }
    }

    /// The summed gradients of `batch`'s micro-batches, each micro-batch's
    /// mean loss multiplied by `scale / k`, and the summed multiplied losses.
    pub fn gradients<M: Trainable<B, D>, const D: usize>(
        &self,
        model: &M,
        batch: &M::Batch,
        scale: f64,
        observer: &mut dyn StepObserver,
    ) -> (Tensor<B::InnerBackend, 1>, GradientsParams) {
        let (loss, grads, _) = self
            .gradients_to_owners(model, batch, scale, observer, None)
            .expect("without owners nothing is exchanged");
        (loss, grads)
    }

    /// As [`Stepper::gradients`]; with `owners` (on ranks with the
    /// optimizer state sharded) each micro-batch's gradients are summed
    /// over the ranks onto each parameter's owner as soon as its backward
    /// ends, and a rank accumulates only the gradients of the parameters
    /// it owns (ZeRO stage 2): the accumulator holds about 1/N of the
    /// gradients. Also returns the parameters whose gradient went to
    /// another rank.
    fn gradients_to_owners<M: Trainable<B, D>, const D: usize>(
        &self,
        model: &M,
        batch: &M::Batch,
        scale: f64,
        observer: &mut dyn StepObserver,
        owners: Option<&HashMap<ParamId, usize>>,
    ) -> Result<Gathered<B>, StepError> {
        let mut elsewhere = HashSet::new();
        let factor = scale * self.batching.loss_factor();
        let checkpointing = self.checkpointed.iter().any(|&c| c);
        let split = self.batching.accumulate > 1;
        let mut acc = Accumulator::new();
        let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
        let ((params, frozen), optimizer, inputs) = (
            trainable_and_frozen_bytes(model),
            self.optimizer.state_bytes(),
            M::batch_bytes(batch),
        );
        let walked = |gradients: u64| Accounted {
            parameters: params,
            frozen_parameters: frozen,
            gradients,
            optimizer_state: optimizer,
            inputs,
            ..Default::default()
        };
        // On data-parallel ranks, this rank's share of the micro-batches.
        let mine = match &self.ranks {
            Some(r) => crate::ranks::share(self.batching.accumulate, r.rank(), r.size()),
            None => 0..self.batching.accumulate,
        };
        for (i, range) in self.batching.ranges().enumerate().filter(|(i, _)| mine.contains(i)) {
            let micro = M::micro_batch(batch, range);
            let index = split.then_some(i);
            let held = acc.bytes(model);
            // From the first forward op to the end of the backward: another
            // thread's backward must not sweep this graph while it is built.
            let graph = crate::grads::graph_lock();
            let (value, grads) = if checkpointing {
                let input = model.prelude_stack(&micro, &self.autocast);
                forward_backward(
                    model,
                    model.blocks(),
                    &self.checkpointed,
                    &self.autocast,
                    input,
                    |x| model.head(x, &micro, &self.autocast).mul_scalar(factor),
                    || observer.phase("forward", index, &|| walked(held)),
                )
            } else {
                let scaled = model.loss(&micro, &self.autocast).mul_scalar(factor);
                observer.phase("forward", index, &|| walked(held));
                let value = scaled.clone().inner();
                (value, GradientsParams::from_grads(scaled.backward(), model))
            };
            drop(graph);
            let fresh = crate::grads::bytes(model, &grads);
            observer.phase("backward", index, &|| walked(held + fresh));
            let grads = match (owners, &self.ranks) {
                (Some(owners), Some(ranks)) => {
                    let (mine, theirs) =
                        crate::ranks::sum_gradients(model, grads, self.attempts, ranks.as_ref(), Some(owners))
                            .map_err(StepError::Ranks)?;
                    elsewhere.extend(theirs);
                    mine
                }
                _ => grads,
            };
            acc.add(model, grads);
            loss_sum = Some(match loss_sum {
                Some(s) => s + value,
                None => value,
            });
        }
        let loss_sum = loss_sum.expect("MicroBatching has at least one micro-batch");
        Ok((loss_sum, acc.finish(), elsewhere))
    }

    /// One optimiser step on `batch` (which holds `batching.micro_batch ×
    /// batching.accumulate` samples), reporting its phases to `observer`.
    pub fn step<M: Trainable<B, D>, const D: usize>(
        &mut self,
        model: M,
        batch: &M::Batch,
        lr: f64,
        device: &B::Device,
        observer: &mut dyn StepObserver,
    ) -> Result<(M, StepOutcome), StepError> {
        self.attempts += 1;
        let scale = self.scaler.as_ref().map_or(1.0, |s| s.scale());
        // On ranks with the state sharded, each parameter's owner.
        let owners = self.ranks.as_ref().and_then(|_| self.optimizer.owners(&model));
        let (loss_sum, mut grads, elsewhere) =
            self.gradients_to_owners(&model, batch, scale, observer, owners.as_ref())?;
        let mut loss = [loss_sum
            .try_into_scalar()
            .map_err(|e| StepError::Device {
                step: self.attempts,
                reason: e.to_string(),
            })?
            .elem::<f64>()
            / scale];
        // Every rank the whole step's loss and, unless the optimizer state
        // is sharded (summed onto the owners above), the whole gradient.
        if let Some(ranks) = &self.ranks {
            if owners.is_none() {
                (grads, _) = crate::ranks::sum_gradients(&model, grads, self.attempts, ranks.as_ref(), None)
                    .map_err(StepError::Ranks)?;
            }
            ranks.sum_f64(&mut loss);
        }
        let [loss] = loss;
        let mut found_inf = crate::grads::scale_and_check(&model, &mut grads, 1.0 / scale) || !loss.is_finite();
        // On ranks every rank takes the same decision: a sharded step's
        // broadcasts would wait forever for a rank that skipped it.
        if let Some(ranks) = &self.ranks {
            let mut any = [f64::from(u8::from(found_inf))];
            ranks.sum_f64(&mut any);
            found_inf = any[0] > 0.0;
        }
        let stepped = match self.scaler.as_mut() {
            Some(s) => {
                let stepped = s.update(found_inf);
                if s.scale() < MIN_SCALE {
                    return Err(StepError::ScaleCollapsed {
                        scale: s.scale(),
                        skipped: s.state().skipped_steps,
                    });
                }
                stepped
            }
            None if found_inf => {
                return Err(StepError::NonFinite {
                    step: self.attempts,
                    loss,
                    what: if loss.is_nan() { "NaN" } else { "inf" },
                });
            }
            None => true,
        };
        let model = if stepped {
            self.optimizer.step_sharded(lr, model, grads, &elsewhere)
        } else {
            model
        };
        let inputs = M::batch_bytes(batch);
        // Observed before the cleanup: the allocator's reservation is read
        // before anything can release it.
        let (parameters, frozen_parameters) = trainable_and_frozen_bytes(&model);
        observer.phase("optimizer", None, &|| Accounted {
            parameters,
            frozen_parameters,
            optimizer_state: self.optimizer.state_bytes(),
            inputs,
            ..Default::default()
        });
        let cleanup_seconds = self
            .cleanup
            .after_step::<B>(self.attempts, device)
            .map(|d| d.as_secs_f64());
        Ok((
            model,
            StepOutcome {
                loss,
                stepped,
                scale,
                cleanup_seconds,
            },
        ))
    }
}
