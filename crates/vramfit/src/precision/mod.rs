//! Mixed precision: which float type each kind of op runs in, and the
//! dynamic loss scaler that keeps f16 gradients from underflowing.
//!
//! The policy is autocast-like and explicit: a workload calls
//! [`Autocast::linear`] / [`Autocast::matmul`] for matrix work (run in the low
//! type) and [`Autocast::full`] before norms, softmax, reductions and the loss
//! (run in f32). Parameters stay wherever their storage puts them (f32 master
//! weights by default); the low copy is a differentiable cast made inside the
//! step, so gradients flow back to the f32 masters in f32 and the optimiser
//! updates those. This module must not hold tensors between steps.

mod scaler;

pub use scaler::{LossScaler, ScalerConfig, ScalerState};

use burn::prelude::*;
use burn::tensor::FloatDType;

/// Float type the matrix work of a step runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32 (the reference).
    #[default]
    F32,
    /// Matrix work in bfloat16 (f32's range, 8-bit mantissa): no loss scaling needed.
    Bf16,
    /// Matrix work in float16 (5-bit exponent): needs dynamic loss scaling.
    F16,
}

impl Precision {
    /// Parses `f32`, `bf16` or `f16`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "f32" => Some(Self::F32),
            "bf16" => Some(Self::Bf16),
            "f16" => Some(Self::F16),
            _ => None,
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// The float type matrix work runs in.
    pub fn dtype(self) -> FloatDType {
        match self {
            Self::F32 => FloatDType::F32,
            Self::Bf16 => FloatDType::BF16,
            Self::F16 => FloatDType::F16,
        }
    }

    /// `x` rounded to this type (to nearest, ties to even), as f32.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Self::F32 => x,
            Self::Bf16 => burn::tensor::bf16::from_f32(x).to_f32(),
            Self::F16 => burn::tensor::f16::from_f32(x).to_f32(),
        }
    }

    /// Whether gradients in this type underflow without a loss scale.
    pub fn needs_loss_scaling(self) -> bool {
        self == Self::F16
    }
}

/// Casts to `dtype` only when the tensor is not already of it, so an f32
/// policy adds no nodes to the autodiff graph (between f32 and bf16 on the
/// CPU, [`crate::fused::cast`]'s one pass).
pub fn cast_to<B: Backend, const D: usize>(tensor: Tensor<B, D>, dtype: FloatDType) -> Tensor<B, D> {
    if tensor.dtype() == burn::tensor::DType::from(dtype) {
        tensor
    } else {
        crate::fused::cast(tensor, dtype)
    }
}

/// The per-step precision policy a workload's forward pass consults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Autocast {
    precision: Precision,
}

impl Autocast {
    /// Policy for `precision`.
    pub fn new(precision: Precision) -> Self {
        Self { precision }
    }

    /// The policy's precision.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Casts to the low type (matrix work's input).
    pub fn low<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        cast_to(x, self.precision.dtype())
    }

    /// Casts to f32 (norms, softmax, reductions, the loss, the residual stream).
    pub fn full<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        cast_to(x, FloatDType::F32)
    }

    /// Batched matrix product in the low type; the result stays low.
    pub fn matmul<B: Backend, const D: usize>(&self, a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
        crate::fused::matmul(self.low(a), self.low(b))
    }

    /// 2-D convolution in the low type (`x: [n, c, h, w]`); the result stays low.
    pub fn conv2d<B: Backend>(
        &self,
        x: Tensor<B, 4>,
        weight: Tensor<B, 4>,
        bias: Option<Tensor<B, 1>>,
        options: burn::tensor::ops::ConvOptions<2>,
    ) -> Tensor<B, 4> {
        burn::tensor::module::conv2d(self.low(x), self.low(weight), bias.map(|b| self.low(b)), options)
    }

    /// `x · w + b` with `x: [.., in]`, `w: [in, out]`, `b: [out]`, in the low type.
    pub fn linear<B: Backend, const D: usize>(
        &self,
        x: Tensor<B, D>,
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
    ) -> Tensor<B, D> {
        // One [rows, in] × [in, out] product, not a batched one with the
        // weight broadcast: the broadcast's backward makes a weight gradient
        // per batch entry and sums them (a [B, in, out] intermediate and
        // strided reductions); the 2-D one is a single GEMM each way.
        let dims = x.dims();
        let inputs = dims[D - 1];
        let rows = dims[..D - 1].iter().product::<usize>();
        let outputs = weight.dims()[1];
        let x = self.low(x).reshape([rows, inputs]);
        let y = match bias {
            Some(b) => crate::fused::linear(x, self.low(weight), self.low(b)),
            None => crate::fused::matmul(x, self.low(weight)),
        };
        let mut out = dims;
        out[D - 1] = outputs;
        y.reshape(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, ops::ConvOptions};

    type B = Autodiff<Flex>;

    #[test]
    fn low_precision_ops_run_low_and_send_f32_gradients_to_f32_masters() {
        let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
        let device = Default::default();
        let x = Tensor::<B, 4>::random([2, 3, 8, 8], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<B, 4>::random([4, 3, 3, 3], Distribution::Normal(0.0, 0.3), &device).require_grad();
        let opts = || ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        let reference = Autocast::new(Precision::F32).conv2d(x.clone(), w.clone(), None, opts());
        for p in [Precision::Bf16, Precision::F16] {
            let ac = Autocast::new(p);
            let y = ac.conv2d(x.clone(), w.clone(), None, opts());
            assert_eq!(
                y.dtype(),
                burn::tensor::DType::from(p.dtype()),
                "{p:?}: the result stays low"
            );
            let gap: f32 = (ac.full(y.clone()) - reference.clone()).abs().max().into_scalar();
            let scale: f32 = reference.clone().abs().max().into_scalar();
            // Inputs rounded to 8 (bf16) or 11 (f16) mantissa bits: measured 3.2e-3 and 1.3e-3 of the output range.
            eprintln!("{p:?}: conv gap {:e} of the output range", gap / scale);
            assert!(gap / scale < 2e-2, "{p:?}: {gap} of {scale}");
            let grads = ac.full(y).sum().backward();
            let d_w = w.grad(&grads).expect("the master weight gets a gradient");
            assert_eq!(
                d_w.dtype(),
                burn::tensor::DType::F32,
                "{p:?}: the master's gradient is f32"
            );
        }
        let a = Tensor::<B, 2>::random([5, 6], Distribution::Default, &device);
        let m = Autocast::new(Precision::Bf16).matmul(a.clone(), a.clone().transpose());
        assert_eq!(m.dtype(), burn::tensor::DType::BF16);
        assert_eq!(
            Autocast::new(Precision::F32).low(x.clone()).dtype(),
            burn::tensor::DType::F32,
            "f32 adds no cast"
        );
    }
}
