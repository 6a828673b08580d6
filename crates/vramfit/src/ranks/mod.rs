//! Data-parallel ranks (issue 30): N processes, each running its share of
//! an optimiser step's micro-batches, their gradients summed across the
//! processes before every process takes the same optimiser step.
//!
//! A step of k micro-batches on N ranks gives rank r the micro-batches
//! `r·k/N .. (r+1)·k/N` (k must be a multiple of N); each micro-batch's
//! loss is already scaled by 1/k, so the sum over ranks of the ranks'
//! summed gradients is the one-process step's gradient, up to the order of
//! the additions. Every rank then holds the same gradient and takes the
//! same optimiser step, so the parameters stay equal on every rank.
//!
//! With the optimizer state sharded ([`crate::optim::ModuleAdam::sharded`])
//! each parameter's Adam moments live on one rank only, its owner: its
//! gradient is summed onto the owner alone, which updates it and broadcasts
//! the new values (ZeRO stage 2: the other ranks drop that gradient before
//! the optimizer step).
//!
//! The engine is MPI (the `mpi` feature: Open MPI or MPICH, launched by
//! `mpirun`; docs/design/ranks.md says why); [`Collective`] is what the step
//! needs of it, so a single process needs no engine at all.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use crate::remedy::Remedy;

/// What a data-parallel step needs of the engine.
pub trait Collective: Send + Sync {
    /// This process's rank, from 0.
    fn rank(&self) -> usize;
    /// Ranks in the run.
    fn size(&self) -> usize;
    /// Replaces `values` on every rank by their elementwise sum over the ranks.
    fn sum_f32(&self, values: &mut [f32]);
    /// As [`Collective::sum_f32`], for f64.
    fn sum_f64(&self, values: &mut [f64]);
    /// Replaces `values` on rank `root` by their elementwise sum over the
    /// ranks; on the other ranks `values` are left as they were.
    fn reduce_f32(&self, values: &mut [f32], root: usize);
    /// Replaces `values` on every rank by rank `root`'s.
    fn broadcast_f32(&self, values: &mut [f32], root: usize);
    /// Waits until every rank has arrived.
    fn barrier(&self);
    /// The bytes this rank has handed to each kind of collective so far
    /// (what it passed in, not what the engine put on the wire).
    fn handed(&self) -> Handed {
        Handed::default()
    }
}

/// Bytes one rank handed to the collectives, by kind: the buffers it
/// passed, counted once a call. What the engine sends over the wire for
/// them depends on its algorithm: a bandwidth-optimal all-reduce sends
/// 2(N−1)/N of its buffer from each rank, a reduce or a broadcast (N−1)/N.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Handed {
    /// All-reduces (every rank gets the sum): gradients without sharding,
    /// the step's checks and loss.
    pub summed: u64,
    /// Reduces to one rank (the parameter's owner, when sharded).
    pub reduced: u64,
    /// Broadcasts (sharded parameters from their owner), sent or received.
    pub broadcast: u64,
}

impl Handed {
    /// What was handed between `earlier` and `self`.
    pub fn since(self, earlier: Handed) -> Handed {
        Handed {
            summed: self.summed - earlier.summed,
            reduced: self.reduced - earlier.reduced,
            broadcast: self.broadcast - earlier.broadcast,
        }
    }
    /// Every kind together.
    pub fn total(self) -> u64 {
        self.summed + self.reduced + self.broadcast
    }
}

static WORLD: std::sync::OnceLock<std::sync::Arc<dyn Collective>> = std::sync::OnceLock::new();

/// Makes `collective` the ranks of this process's run (once; `false` when
/// the process had joined already).
pub fn join(collective: std::sync::Arc<dyn Collective>) -> bool {
    WORLD.set(collective).is_ok()
}

/// The ranks this process joined, if any.
pub fn world() -> Option<std::sync::Arc<dyn Collective>> {
    WORLD.get().cloned()
}

/// This process's rank among the ranks on its own machine, as the MPI
/// launcher says (Open MPI, MPICH, Slurm); 0 when none does. A rank on a
/// GPU uses the GPU of this index: one GPU a rank.
pub fn local_rank() -> usize {
    ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(0)
}

/// The micro-batches (of `accumulate`) that rank `rank` of `size` runs.
pub fn share(accumulate: usize, rank: usize, size: usize) -> Range<usize> {
    let per = accumulate / size.max(1);
    rank * per..(rank + 1) * per
}

/// A split that does not give every rank the same number of micro-batches.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{ranks} ranks cannot share {accumulate} micro-batches evenly: make accumulate a multiple of the ranks \
     (e.g. {}, the same batch of {batch}) or use {fits} ranks",
    Remedy::MicroBatches { micro: *micro, accumulate: *suggested }
)]
pub struct UnevenSplit {
    /// Ranks asked for.
    pub ranks: usize,
    /// Micro-batches a step.
    pub accumulate: usize,
    /// A micro-batch that would work.
    pub micro: usize,
    /// The accumulation that goes with it.
    pub suggested: usize,
    /// The batch.
    pub batch: usize,
    /// A rank count that divides the accumulation.
    pub fits: usize,
}

/// Checks that `ranks` share `accumulate` micro-batches of `micro_batch` evenly.
pub fn check_split(micro_batch: usize, accumulate: usize, ranks: usize) -> Result<(), UnevenSplit> {
    if ranks > 0 && accumulate.is_multiple_of(ranks) {
        return Ok(());
    }
    let batch = micro_batch * accumulate;
    let micro = (1..=batch / ranks.max(1))
        .rev()
        .find(|m| batch.is_multiple_of(*m) && (batch / m).is_multiple_of(ranks))
        .unwrap_or(1);
    let fits = (1..=ranks).rev().find(|r| accumulate.is_multiple_of(*r)).unwrap_or(1);
    Err(UnevenSplit {
        ranks,
        accumulate,
        micro,
        suggested: batch / micro,
        batch,
        fits,
    })
}

/// Sums `grads` (those of `module`'s parameters, at optimiser step
/// `step`) over the ranks of `collective`, one parameter at a time in the
/// module's order: its gradient to f32 on the host, summed, put back in
/// its own type on its own device in place of the rank's own. A parameter
/// at a time, sent in slices of [`EXCHANGE_VALUES`], bounds what the
/// exchange adds to the step's memory: the host copy of one gradient (none
/// on the CPU, where the tensor's buffer becomes the values) and one slice,
/// where one exchange of everything would hold two copies of all the
/// gradients at once. Every rank must be at the same step and hold
/// gradients of the same parameters: checked first (the error says what
/// differs), since a mismatch would sum unrelated numbers (a rank resumed
/// from an older checkpoint than the others, a different model).
///
/// With `owners` (the optimizer state sharded: each parameter's rank), a
/// gradient is summed onto its owner alone (ZeRO stage 2): the owner keeps
/// the sum, the others drop theirs and the parameter's id is returned
/// among those whose update comes from another rank.
pub fn sum_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: GradientsParams,
    step: u64,
    collective: &dyn Collective,
    owners: Option<&HashMap<ParamId, usize>>,
) -> Result<(GradientsParams, HashSet<ParamId>), RanksApart> {
    struct Count<'a> {
        grads: &'a GradientsParams,
        count: usize,
        values: usize,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Count<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                self.count += 1;
                self.values += g.shape().num_elements();
            }
        }
    }
    struct Sum<'a> {
        grads: GradientsParams,
        collective: &'a dyn Collective,
        owners: Option<&'a HashMap<ParamId, usize>>,
        elsewhere: HashSet<ParamId>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Sum<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let (shape, dtype, device) = (g.dims(), g.dtype(), g.device());
                let mut values = g
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .expect("converted to f32");
                let owner = self.owners.map(|o| {
                    *o.get(&param.id)
                        .expect("the optimizer gave every parameter with a gradient an owner")
                });
                match owner {
                    Some(owner) => {
                        self.collective.reduce_f32(&mut values, owner);
                        if owner != self.collective.rank() {
                            self.elsewhere.insert(param.id);
                            return;
                        }
                    }
                    None => self.collective.sum_f32(&mut values),
                }
                let summed = Tensor::<B::InnerBackend, D>::from_data(TensorData::new(values, shape), &device);
                let summed = if dtype == burn::tensor::DType::F32 {
                    summed
                } else {
                    summed.cast(dtype)
                };
                self.grads.register(param.id, summed);
            }
        }
    }
    let mut counted = Count {
        grads: &grads,
        count: 0,
        values: 0,
    };
    module.visit(&mut counted);
    let (count, values) = (counted.count, counted.values);
    // Every rank at the same step, with the same parameters and sizes: the
    // sums are `size` times ours, and so are the squares' sums (values that
    // differ cannot match both: their squares' mean exceeds their mean's
    // square).
    let (s, c, l) = (step as f64, count as f64, values as f64);
    let own = [s, s * s, c, c * c, l, l * l];
    let mut check = own;
    collective.sum_f64(&mut check);
    let n = collective.size() as f64;
    if check != own.map(|x| x * n) {
        return Err(RanksApart {
            rank: collective.rank(),
            ranks: collective.size(),
            step,
            gradients: count,
            values,
            sums: check,
        });
    }
    let mut sum = Sum {
        grads,
        collective,
        owners,
        elsewhere: HashSet::new(),
    };
    module.visit(&mut sum);
    Ok((sum.grads, sum.elsewhere))
}

/// Ranks that are not at the same step with the same gradients.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "rank {rank} is at step {step} with {gradients} gradients ({values} values), and the {ranks} ranks together are \
     not all there (sums {sums:?}): a rank resumed from another checkpoint than the others, or runs another model. \
     Resume every rank from the same step: delete the checkpoints newer than the newest one every rank's directory \
     holds (RUN/checkpoints and RUN/ranks/rank-*/checkpoints)"
)]
pub struct RanksApart {
    /// This rank.
    pub rank: usize,
    /// Ranks in the run.
    pub ranks: usize,
    /// This rank's step.
    pub step: u64,
    /// Gradients this rank holds.
    pub gradients: usize,
    /// Their values.
    pub values: usize,
    /// The ranks' sums of (step, step², count, count², values, values²).
    pub sums: [f64; 6],
}

/// The most values one exchange sends at a time: the send buffer an
/// all-reduce holds beside the values it sums (1 MiB of f32).
pub const EXCHANGE_VALUES: usize = 1 << 18;

/// One process: the sums are the values.
#[derive(Debug, Clone, Copy, Default)]
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn sum_f32(&self, _values: &mut [f32]) {}
    fn sum_f64(&self, _values: &mut [f64]) {}
    fn reduce_f32(&self, _values: &mut [f32], _root: usize) {}
    fn broadcast_f32(&self, _values: &mut [f32], _root: usize) {}
    fn barrier(&self) {}
}

/// The ranks of an MPI job (`mpirun -n N …`; one process alone is a job of
/// one rank).
#[cfg(feature = "mpi")]
pub mod mpi {
    use std::sync::atomic::{AtomicU64, Ordering};

    use ::mpi::collective::SystemOperation;
    use ::mpi::traits::*;

    /// The world communicator of this process's MPI job.
    pub struct Mpi {
        world: ::mpi::topology::SimpleCommunicator,
        rank: usize,
        size: usize,
        /// Bytes handed to all-reduces, reduces and broadcasts.
        handed: [AtomicU64; 3],
    }

    /// Counts `values`' bytes into `counter`.
    fn count<T>(counter: &AtomicU64, values: &[T]) {
        counter.fetch_add(std::mem::size_of_val(values) as u64, Ordering::Relaxed);
    }

    // MPI is initialised with `Threading::Serialized`: any thread may call
    // it while no two calls overlap, and the step calls it from one thread
    // at a time.
    unsafe impl Send for Mpi {}
    unsafe impl Sync for Mpi {}

    /// Finalises MPI when dropped (at the end of `main`): MPI may be
    /// initialised once a process, and a rank that exits without
    /// finalising is reported by `mpirun` as having failed.
    pub struct Session {
        _universe: ::mpi::environment::Universe,
    }

    /// Initialises MPI (a process started without `mpirun` is a job of one
    /// rank); `None` when it cannot be (or was already).
    pub fn init() -> Option<(Session, Mpi)> {
        let (universe, _) = ::mpi::initialize_with_threading(::mpi::Threading::Serialized)?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let handed = Default::default();
        Some((
            Session { _universe: universe },
            Mpi {
                world,
                rank,
                size,
                handed,
            },
        ))
    }

    impl super::Collective for Mpi {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn sum_f32(&self, values: &mut [f32]) {
            // In slices, so that the send buffer MPI needs beside the values
            // is one slice (1 MiB), not a copy of them all.
            count(&self.handed[0], values);
            for slice in values.chunks_mut(super::EXCHANGE_VALUES) {
                let send = slice.to_vec();
                self.world.all_reduce_into(&send[..], slice, SystemOperation::sum());
            }
        }
        fn sum_f64(&self, values: &mut [f64]) {
            count(&self.handed[0], values);
            let send = values.to_vec();
            self.world.all_reduce_into(&send[..], values, SystemOperation::sum());
        }
        fn reduce_f32(&self, values: &mut [f32], root: usize) {
            // In slices, as the sums.
            count(&self.handed[1], values);
            let (mine, root) = (root == self.rank, self.world.process_at_rank(root as i32));
            for slice in values.chunks_mut(super::EXCHANGE_VALUES) {
                if mine {
                    let send = slice.to_vec();
                    root.reduce_into_root(&send[..], slice, SystemOperation::sum());
                } else {
                    // Only the root needs a buffer apart from what it sends.
                    root.reduce_into(&*slice, SystemOperation::sum());
                }
            }
        }
        fn broadcast_f32(&self, values: &mut [f32], root: usize) {
            // In slices, as the sums: MPI's counts are 32-bit.
            count(&self.handed[2], values);
            for slice in values.chunks_mut(super::EXCHANGE_VALUES) {
                self.world.process_at_rank(root as i32).broadcast_into(slice);
            }
        }
        fn handed(&self) -> super::Handed {
            let [summed, reduced, broadcast] = self.handed.each_ref().map(|c| c.load(Ordering::Relaxed));
            super::Handed {
                summed,
                reduced,
                broadcast,
            }
        }
        fn barrier(&self) {
            self.world.barrier();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_share_the_micro_batches_in_order_and_refuse_an_uneven_split() {
        assert_eq!(share(4, 0, 2), 0..2);
        assert_eq!(share(4, 1, 2), 2..4);
        assert_eq!(share(8, 3, 4), 6..8);
        assert!(check_split(2, 4, 2).is_ok() && check_split(1, 8, 4).is_ok());
        let e = check_split(4, 1, 2).unwrap_err();
        assert_eq!((e.micro, e.suggested, e.fits), (2, 2, 1), "{e}");
        assert!(e.to_string().contains("micro-batches of 2, 2 a step"), "{e}");
        let e = check_split(1, 3, 2).unwrap_err();
        // A batch of 3 cannot be split over 2 ranks at all: micro-batches of 1 leave 3.
        assert_eq!(e.fits, 1, "{e}");
    }
}
