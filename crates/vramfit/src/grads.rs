//! Whole-model operations on a [`GradientsParams`] container: add one into
//! another, scale and check for inf/NaN, count bytes. Micro-batch
//! accumulation, loss-scale unscaling and segmented (checkpointed) backward
//! all need them. A container is keyed by parameter id and does not know
//! tensor ranks, so every operation walks the module to learn them.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// Serialises building an autodiff graph and running its backward across
/// the threads of a process. Burn 0.21 keeps one graph table per process and
/// every `backward()` sweeps all of it for graphs that look unused; an
/// operation such as `Tensor::cat` drops its inputs' reference counts
/// before registering its own step, so a sweep from another thread in that
/// window frees steps of a graph still being built and part of its gradient
/// is silently lost (tracel-ai/burn#5573). [`crate::step::Stepper`] holds
/// this from a micro-batch's first forward operation to the end of its
/// backward; code that differentiates beside it in other threads (tests
/// computing reference gradients) takes it too. Not reentrant.
pub fn graph_lock() -> std::sync::MutexGuard<'static, ()> {
    static GRAPHS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A panic while holding it leaves nothing half-done that the lock guards.
    GRAPHS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Adds every gradient in `from` into `into` (a missing entry is inserted).
pub fn add_into<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    into: &mut GradientsParams,
    mut from: GradientsParams,
) {
    struct Add<'a, B: AutodiffBackend> {
        into: &'a mut GradientsParams,
        from: &'a mut GradientsParams,
        _b: core::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Add<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.from.remove::<B::InnerBackend, D>(param.id) {
                let sum = match self.into.remove::<B::InnerBackend, D>(param.id) {
                    Some(acc) => acc + g,
                    None => g,
                };
                self.into.register(param.id, sum);
            }
        }
    }
    module.visit(&mut Add::<B> {
        into,
        from: &mut from,
        _b: Default::default(),
    });
}

/// Multiplies every gradient by `factor` (in the gradient's own type) and
/// reports whether any element of the result is inf or NaN. One device
/// read for the whole model.
pub fn scale_and_check<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    factor: f64,
) -> bool {
    struct Scale<'a, B: AutodiffBackend> {
        grads: &'a mut GradientsParams,
        factor: f64,
        bad: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let g = if self.factor == 1.0 {
                    g
                } else {
                    g.mul_scalar(self.factor)
                };
                let bad = (g.clone().is_nan().any().float()) + (g.clone().is_inf().any().float());
                self.bad = Some(match self.bad.take() {
                    Some(b) => b + bad,
                    None => bad,
                });
                self.grads.register(param.id, g);
            }
        }
    }
    let mut v = Scale::<B> {
        grads,
        factor,
        bad: None,
    };
    module.visit(&mut v);
    match v.bad {
        Some(bad) => bad.into_scalar().elem::<f32>() != 0.0,
        None => false,
    }
}

/// Bytes held by the gradients in `grads` that belong to `module`.
pub fn bytes<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M, grads: &GradientsParams) -> u64 {
    struct Count<'a> {
        grads: &'a GradientsParams,
        bytes: u64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Count<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                self.bytes += (g.shape().num_elements() * g.dtype().size()) as u64;
            }
        }
    }
    let mut v = Count { grads, bytes: 0 };
    module.visit(&mut v);
    v.bytes
}
