//! Operations fused into one autodiff operation each where Burn's take
//! several passes: causal softmax, layer normalisation, GELU, the attention
//! heads' layout changes and the (batched) matrix product on the CPU
//! backend, and the attention itself on every backend (below).
//!
//! Burn's autodiff builds softmax from elementwise operations (max,
//! subtract, exp, sum and divide, after the scale and the mask: each a pass
//! over the whole `[b, h, t, t]` score tensor, forward and again backward)
//! and a layer norm from nine. Splitting a `[b, t, h·dh]` tensor into heads
//! `[b, h, t, dh]` and merging them back are permutations that Flex copies
//! element by element (a 4-D stride walk: in the forward for the merge, in
//! the backward for each of q, k and v). Flex's GELU calls libm's erf per
//! element. On `Autodiff<Flex>` with f32 tensors, each function here is one
//! forward and one backward pass per row; the layout changes copy
//! `dh`-long runs; GELU's erf and exp are branch-free approximations that
//! the compiler vectorises (within 6e-7 of the exact erf). Together they
//! took the transformer at PyTorch's shape from 593 to 357 ms per step
//! (measured one change at a time: docs/results/cpu-speed.md). On every other
//! backend and type the functions are Burn's own
//! operations (the `*_reference` functions, also the tests' oracle), so GPU
//! backends, whose fusion already merges elementwise ops, see no change.
//! Two exceptions reach further: the fused attention (`attention.rs`) has
//! CubeCL kernels for wgpu and CUDA too (`cube.rs`), and bf16 products,
//! casts and rotary positions have CPU paths of their own (`gemm_bf16.rs`,
//! `cast.rs`, `rotary.rs`; docs/design/cpu-bf16.md).
//!
//! The dispatch is by type at run time (`Any`): the models stay generic
//! over `B: Backend`, with no extra trait bound to thread through every
//! workload.

use std::any::Any;

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, TensorPrimitive};
use burn_flex::FlexTensor;
use rayon::prelude::*;

/// The backend the fused kernels serve.
type Cpu = Autodiff<Flex>;

/// Rows handed to one rayon task: enough work to amortise the task.
const ROWS_PER_TASK: usize = 32;

/// `value` as a `T` when it is one, else back as itself.
pub(crate) fn downcast<A: 'static, T: 'static>(value: A) -> Result<T, A> {
    let boxed: Box<dyn Any> = Box::new(value);
    match boxed.downcast::<T>() {
        Ok(t) => Ok(*t),
        Err(boxed) => Err(*boxed.downcast::<A>().expect("the value boxed just above")),
    }
}

/// [`AsOnADevice`] guards held.
static AS_ON_A_DEVICE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// While held, the CPU's kernels here are off (process-wide): every
/// function of this module takes Burn's own operations, as on a CubeCL
/// device, so that a step run on the CPU makes the tensors a device's step
/// makes, one for one. A heap recording of such a step is a device's
/// allocation sequence ([`crate::pools::trace_on_cpu`]).
#[derive(Debug)]
#[must_use = "the CPU's kernels are back on when this is dropped"]
pub struct AsOnADevice(());

/// Turns the CPU's kernels off until the guard (and every other one held)
/// is dropped.
pub fn as_on_a_device() -> AsOnADevice {
    AS_ON_A_DEVICE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    AsOnADevice(())
}

/// Whether an [`AsOnADevice`] guard is held: a CPU run stands for a device's.
pub fn is_as_on_a_device() -> bool {
    AS_ON_A_DEVICE.load(std::sync::atomic::Ordering::Relaxed) > 0
}

impl Drop for AsOnADevice {
    fn drop(&mut self) {
        AS_ON_A_DEVICE.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `t` as an f32 tensor of the CPU backend, if it is one (and the CPU's
/// kernels are on).
fn on_cpu<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Tensor<Cpu, D>, Tensor<B, D>> {
    f32_on::<Cpu, B, D>(t)
}

/// `t` as an f32 tensor of backend `C` (Flex, with autodiff or without),
/// if it is one and the CPU's kernels are on.
fn f32_on<C: Backend, B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Tensor<C, D>, Tensor<B, D>> {
    if t.dtype() != DType::F32 || is_as_on_a_device() {
        return Err(t);
    }
    downcast(t)
}

/// `t` as a bf16 tensor of backend `C`, if it is one and the CPU's
/// kernels are on.
fn bf16_on<C: Backend, B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Tensor<C, D>, Tensor<B, D>> {
    if t.dtype() != DType::BF16 || is_as_on_a_device() {
        return Err(t);
    }
    downcast(t)
}

/// A tensor made by [`on_cpu`], [`f32_on`] or [`bf16_on`] back as `B`.
fn back<C: Backend, B: Backend, const D: usize>(t: Tensor<C, D>) -> Tensor<B, D> {
    downcast(t).unwrap_or_else(|_| unreachable!("converted from B"))
}

/// The f32 values of a Flex tensor, row major (copied only when it is a view).
pub(crate) fn values(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(t.to_contiguous().as_slice::<f32>().expect("contiguous").to_vec()),
    }
}

fn flex<E: burn::tensor::Element>(values: Vec<E>, shape: burn::tensor::Shape) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

mod attention;
mod cast;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube;
mod gelu;
mod gemm_bf16;
mod heads;
mod layer_norm;
mod linear;
mod matmul;
mod on_shapes;
mod products;
mod rotary;
mod softmax;
#[cfg(test)]
mod tests;

pub use attention::{Attention, attention, attention_reference};
pub use cast::cast;
pub use gelu::gelu;
pub use heads::{merge_heads, split_heads};
pub use layer_norm::{layer_norm, layer_norm_reference};
pub use linear::linear;
pub use matmul::matmul;
pub use rotary::{rotary, rotary_reference};
pub use softmax::{causal_softmax, causal_softmax_reference};
#[allow(unused_imports)]
use {
    attention::*, cast::*, gelu::*, heads::*, layer_norm::*, linear::*, matmul::*, products::*, rotary::*, softmax::*,
};
