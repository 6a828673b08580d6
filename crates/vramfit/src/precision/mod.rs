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

    /// Whether gradients in this type underflow without a loss scale.
    pub fn needs_loss_scaling(self) -> bool {
        self == Self::F16
    }
}

/// Casts to `dtype` only when the tensor is not already of it, so an f32
/// policy adds no nodes to the autodiff graph.
pub fn cast_to<B: Backend, const D: usize>(tensor: Tensor<B, D>, dtype: FloatDType) -> Tensor<B, D> {
    if tensor.dtype() == burn::tensor::DType::from(dtype) {
        tensor
    } else {
        tensor.cast(dtype)
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
        self.low(a).matmul(self.low(b))
    }

    /// `x · w + b` with `x: [.., in]`, `w: [in, out]`, `b: [out]`, in the low type.
    pub fn linear<B: Backend, const D: usize>(
        &self,
        x: Tensor<B, D>,
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
    ) -> Tensor<B, D> {
        let y = self.low(x).matmul(self.low(weight).unsqueeze());
        match bias {
            Some(b) => y + self.low(b).unsqueeze(),
            None => y,
        }
    }
}
