//! A frozen base at its true size: parameters that take no gradient,
//! stored in f32, bf16, f16, or block-quantized (NF4, int8), and used by a
//! projection that never keeps a compute-type copy of them.
//!
//! - [`BaseStorage`]: how a frozen base is stored (`model.base`).
//! - [`Quantized`]: a block-quantized matrix as a Burn module (packed codes
//!   and scales, [`quant`]).
//! - [`Matrix`]: a frozen matrix as stored, as the product reads it.
//! - [`linear`]: `x · W (+ b)` whose backward keeps `W` as stored and
//!   rebuilds the compute-type matrix when it needs it ([`frozen_matmul`]).
//! - [`freeze`]: a module's parameters picked by path taking no gradient.
//!
//! This module must not hold a dequantized or cast matrix beyond the
//! product that uses it.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube;
mod matmul;
mod matrix;
mod on_shapes;
pub mod quant;

pub use matmul::{frozen_matmul, keeps_stored_weight_on};
pub use matrix::{Matrix, Quantized};
pub use quant::{BLOCK, Format, QuantError};

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::FloatDType;

use crate::precision::Autocast;

/// How a frozen base is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseStorage {
    /// f32, as trained.
    #[default]
    F32,
    /// bfloat16: half the bytes, f32's range.
    Bf16,
    /// float16: half the bytes.
    F16,
    /// Projections in NF4 (blocks of 64, f32 scales: 4.5 bits a weight);
    /// the embedding and head in bf16, norms in f32 (QLoRA's layout).
    Nf4,
    /// Projections in 8-bit absmax (blocks of 64: 8.5 bits a weight); the
    /// embedding and head in bf16, norms in f32.
    Int8,
}

impl BaseStorage {
    /// Every storage, as [`name`](Self::name) gives it.
    pub const ALL: [BaseStorage; 5] = [Self::F32, Self::Bf16, Self::F16, Self::Nf4, Self::Int8];

    /// Parses `f32`, `bf16`, `f16`, `nf4` or `int8`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == text)
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::Nf4 => "nf4",
            Self::Int8 => "int8",
        }
    }

    /// The quantized format of the projections, if any.
    pub fn format(self) -> Option<Format> {
        match self {
            Self::Nf4 => Some(Format::Nf4),
            Self::Int8 => Some(Format::Int8),
            _ => None,
        }
    }

    /// The float type of frozen tensors that are not quantized (vectors,
    /// tables, and matrices of a float storage).
    pub fn float(self) -> FloatDType {
        match self {
            Self::F32 => FloatDType::F32,
            Self::F16 => FloatDType::F16,
            Self::Bf16 | Self::Nf4 | Self::Int8 => FloatDType::BF16,
        }
    }

    /// Stored bytes of a frozen `[in, out]` matrix of `values` values.
    pub fn matrix_bytes(self, values: u64) -> u64 {
        match self.format() {
            Some(f) => f.bytes(values as usize),
            None => values * burn::tensor::DType::from(self.float()).size() as u64,
        }
    }
}

/// `x · W + b` for a frozen `W` (`x: [.., in]`, `W: [in, out]`), in the
/// compute type: `W` kept as stored ([`frozen_matmul`]); `b`, where given,
/// added in the compute type (it may train).
pub fn linear<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    w: &Matrix<B>,
    bias: Option<Tensor<B, 1>>,
    ac: &Autocast,
) -> Tensor<B, D> {
    let dims = x.dims();
    let [inputs, outputs] = w.dims();
    assert_eq!(
        dims[D - 1],
        inputs,
        "linear: input width {} for a [{inputs}, {outputs}] weight",
        dims[D - 1]
    );
    let rows = dims[..D - 1].iter().product::<usize>();
    let y = frozen_matmul(ac.low(x).reshape([rows, inputs]), w);
    let y = match bias {
        Some(b) => y + ac.low(b).unsqueeze::<2>(),
        None => y,
    };
    let mut out = dims;
    out[D - 1] = outputs;
    y.reshape(out)
}

/// `module` with the parameters whose dotted path `frozen` picks taking no
/// gradient (none kept, no moments).
pub fn freeze<B: Backend, M: Module<B>>(module: M, frozen: impl Fn(&str) -> bool) -> M {
    struct Freeze<F> {
        path: crate::params::PathTracker,
        frozen: F,
    }
    impl<B: Backend, F: Fn(&str) -> bool> burn::module::ModuleMapper<B> for Freeze<F> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name)
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit()
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            if (self.frozen)(&self.path.path()) {
                param.set_require_grad(false)
            } else {
                param
            }
        }
    }
    module.map(&mut Freeze {
        path: crate::params::PathTracker::default(),
        frozen,
    })
}

/// Bytes of `module`'s quantized codes (its integer parameters): what
/// [`crate::params::describe`], which lists float parameters, leaves out.
pub fn code_bytes<B: Backend, M: Module<B>>(module: &M) -> u64 {
    struct Count(u64);
    impl<B: Backend> burn::module::ModuleVisitor<B> for Count {
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            let t = param.val();
            self.0 += (t.shape().num_elements() * t.dtype().size()) as u64;
        }
    }
    let mut c = Count(0);
    module.visit(&mut c);
    c.0
}

#[cfg(test)]
mod tests;
