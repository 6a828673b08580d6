//! `x · W` for a frozen `W` as one autodiff operation whose backward keeps
//! `W` as it is stored and rebuilds the compute-type matrix when it needs it.
//!
//! Burn's matmul keeps its right operand for the input's gradient. For a
//! frozen weight stored in 16 bits and used in f32 (or stored in f32 and
//! used in bf16, or quantized), that operand is a cast or a dequantized
//! copy: kept for the backward, one per projection, it is a second copy of
//! the base model for the whole step (a 7B's f32 casts are 28 GB). Here the
//! state is the stored weight itself (a handle, no copy); the backward
//! casts or dequantizes it again, uses it and drops it, as QLoRA does.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::{FloatDType, TensorPrimitive};

use super::matrix::Matrix;
use crate::fused::downcast;

/// `x · W` (`x: [rows, in]` in the compute type, `W: [in, out]`), the
/// product in `x`'s type. On Flex, CubeCL and the shape backend with autodiff, the operation
/// that keeps only the stored `W`; on other backends (and without
/// autodiff, where nothing is kept) Burn's product with `W` made in `x`'s
/// type.
pub fn frozen_matmul<B: Backend>(x: Tensor<B, 2>, w: &Matrix<B>) -> Tensor<B, 2> {
    let x = match on::<B, burn::backend::Flex>(x, w) {
        Ok(y) => return y,
        Err(x) => x,
    };
    #[cfg(feature = "wgpu")]
    let x = match on::<B, burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8>>(x, w) {
        Ok(y) => return y,
        Err(x) => x,
    };
    #[cfg(feature = "cuda")]
    let x = match on::<B, burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>(x, w) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let x = match on::<B, crate::shapes::Shapes>(x, w) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let dtype = float_dtype(&x);
    crate::fused::matmul(x, w.materialize(dtype))
}

/// Whether [`frozen_matmul`] keeps only the stored weight on backend `B`.
pub fn keeps_stored_weight_on<B: Backend>() -> bool {
    #[allow(unused_mut)]
    let mut yes = is_autodiff_of::<B, burn::backend::Flex>() || is_autodiff_of::<B, crate::shapes::Shapes>();
    #[cfg(feature = "wgpu")]
    {
        yes |= is_autodiff_of::<B, burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8>>();
    }
    #[cfg(feature = "cuda")]
    {
        yes |= is_autodiff_of::<B, burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>();
    }
    yes
}

fn is_autodiff_of<B: 'static, I: Backend>() -> bool {
    std::any::TypeId::of::<B>() == std::any::TypeId::of::<Autodiff<I>>()
}

fn float_dtype<B: Backend, const D: usize>(x: &Tensor<B, D>) -> FloatDType {
    match x.dtype() {
        burn::tensor::DType::BF16 => FloatDType::BF16,
        burn::tensor::DType::F16 => FloatDType::F16,
        _ => FloatDType::F32,
    }
}

/// The operation on `Autodiff<I>` when `B` is it; else `x` back.
fn on<B: Backend, I: Backend>(x: Tensor<B, 2>, w: &Matrix<B>) -> Result<Tensor<B, 2>, Tensor<B, 2>> {
    if !is_autodiff_of::<B, I>() {
        return Err(x);
    }
    let x: Tensor<Autodiff<I>, 2> = downcast(x).unwrap_or_else(|_| unreachable!("B is Autodiff<I>"));
    let w: Matrix<Autodiff<I>> = downcast(w.clone()).unwrap_or_else(|_| unreachable!("B is Autodiff<I>"));
    Ok(downcast(tracked::<I>(x, w.inner())).unwrap_or_else(|_| unreachable!("B is Autodiff<I>")))
}

#[derive(Debug)]
struct FrozenMatmul;

impl<I: Backend> Backward<I, 1> for FrozenMatmul {
    /// The weight as stored.
    type State = Matrix<I>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = Tensor::<I, 2>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        if let Some(parent) = &ops.parents[0] {
            // dx = g · Wᵀ, with W rebuilt in g's type for this product only.
            let w = ops.state.materialize(float_dtype(&g));
            let dx = crate::fused::matmul(g, w.transpose());
            grads.register::<I>(parent.id, dx.into_primitive().tensor());
        }
    }
}

fn tracked<I: Backend>(x: Tensor<Autodiff<I>, 2>, w: Matrix<I>) -> Tensor<Autodiff<I>, 2> {
    let x = x.into_primitive().tensor();
    let forward = |x: I::FloatTensorPrimitive, w: &Matrix<I>| {
        let x = Tensor::<I, 2>::from_primitive(TensorPrimitive::Float(x));
        let dtype = float_dtype(&x);
        crate::fused::matmul(x, w.materialize(dtype)).into_primitive().tensor()
    };
    let out = match FrozenMatmul
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = forward(x.primitive, &w);
            prep.finish(w, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, &w)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
