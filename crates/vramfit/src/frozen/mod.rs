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

mod matmul;
pub mod quant;

pub use matmul::{frozen_matmul, keeps_stored_weight_on};
pub use quant::{BLOCK, Format, QuantError};

use burn::module::{Module, Param, ParamId};
use burn::prelude::*;
use burn::tensor::{FloatDType, TensorData};

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

/// A frozen `[rows, cols]` matrix block-quantized ([`quant`]), on a device.
#[derive(Module, Debug)]
pub struct Quantized<B: Backend> {
    /// The codes, packed into 32-bit words, row major.
    pub codes: Param<Tensor<B, 1, Int>>,
    /// One absmax scale per block of [`BLOCK`] values (frozen).
    pub scales: Param<Tensor<B, 1>>,
    rows: usize,
    cols: usize,
    /// NF4 when true, int8 when false.
    nf4: bool,
}

impl<B: Backend> Quantized<B> {
    /// `values` (`[rows, cols]`, row major) quantized in `format`.
    pub fn new(
        values: &[f32],
        [rows, cols]: [usize; 2],
        format: Format,
        device: &B::Device,
    ) -> Result<Self, QuantError> {
        assert_eq!(values.len(), rows * cols, "values for a [{rows}, {cols}] matrix");
        let (codes, scales) = quant::quantize(values, format)?;
        let (words, blocks) = (codes.len(), scales.len());
        Ok(Self {
            codes: Param::initialized(
                ParamId::new(),
                Tensor::from_data(TensorData::new(codes, [words]), device),
            ),
            scales: Param::from_tensor(Tensor::from_data(TensorData::new(scales, [blocks]), device))
                .set_require_grad(false),
            rows,
            cols,
            nf4: format == Format::Nf4,
        })
    }

    /// The format.
    pub fn format(&self) -> Format {
        if self.nf4 { Format::Nf4 } else { Format::Int8 }
    }

    /// `[rows, cols]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// Stored bytes (codes and scales).
    pub fn bytes(&self) -> u64 {
        self.format().bytes(self.rows * self.cols)
    }
}

/// A frozen matrix as stored, as [`frozen_matmul`] reads it.
#[derive(Debug, Clone)]
pub enum Matrix<B: Backend> {
    /// A float matrix in its stored type.
    Float(Tensor<B, 2>),
    /// A block-quantized one.
    Quantized {
        /// Packed codes.
        codes: Tensor<B, 1, Int>,
        /// Scales, one a block.
        scales: Tensor<B, 1>,
        /// `[rows, cols]`.
        dims: [usize; 2],
        /// The format.
        format: Format,
    },
}

impl<B: Backend> Matrix<B> {
    /// A quantized module's matrix.
    pub fn of(q: &Quantized<B>) -> Self {
        Self::Quantized {
            codes: q.codes.val(),
            scales: q.scales.val(),
            dims: q.dims(),
            format: q.format(),
        }
    }

    /// `[rows, cols]`.
    pub fn dims(&self) -> [usize; 2] {
        match self {
            Self::Float(t) => t.dims(),
            Self::Quantized { dims, .. } => *dims,
        }
    }

    /// The matrix in `dtype`, made now (a cast, or the dequantized values).
    pub fn materialize(&self, dtype: FloatDType) -> Tensor<B, 2> {
        match self {
            Self::Float(t) => crate::precision::cast_to(t.clone(), dtype),
            Self::Quantized {
                codes,
                scales,
                dims,
                format,
            } => crate::precision::cast_to(dequantize(codes, scales, *dims, *format), dtype),
        }
    }
}

impl<I: Backend> Matrix<burn::backend::Autodiff<I>> {
    /// The same matrix on the inner backend (no graph).
    pub fn inner(self) -> Matrix<I> {
        match self {
            Self::Float(t) => Matrix::Float(t.inner()),
            Self::Quantized {
                codes,
                scales,
                dims,
                format,
            } => Matrix::Quantized {
                codes: codes.inner(),
                scales: scales.inner(),
                dims,
                format,
            },
        }
    }
}

/// The f32 values of a quantized matrix. On the CPU the host loop of
/// [`quant::dequantize`]; elsewhere Burn's integer and gather operations
/// (a code tensor of 4 bytes a value lives while it runs).
fn dequantize<B: Backend>(
    codes: &Tensor<B, 1, Int>,
    scales: &Tensor<B, 1>,
    [rows, cols]: [usize; 2],
    format: Format,
) -> Tensor<B, 2> {
    let device = codes.device();
    if crate::backends::is_cpu::<B>() {
        let words = codes.to_data().convert::<i32>();
        let scales = scales.to_data().convert::<f32>();
        let values = quant::dequantize(
            words.as_slice::<i32>().expect("i32 codes"),
            scales.as_slice::<f32>().expect("f32 scales"),
            format,
        );
        return Tensor::from_data(TensorData::new(values, [rows, cols]), &device);
    }
    use burn::tensor::ElementConversion;
    let (per_word, bits) = (format.per_word(), format.bits());
    let mask = (1i32 << bits) - 1;
    let parts: Vec<Tensor<B, 1, Int>> = (0..per_word)
        .map(|j| {
            codes
                .clone()
                .bitwise_right_shift_scalar(((bits * j) as i32).elem())
                .bitwise_and_scalar(mask.elem())
        })
        .collect();
    let codes = Tensor::stack::<2>(parts, 1).reshape([rows * cols]);
    let levels = match format {
        Format::Nf4 => {
            Tensor::<B, 1>::from_data(TensorData::new(quant::NF4_LEVELS.to_vec(), [16]), &device).select(0, codes)
        }
        Format::Int8 => (codes.float() - 128.0) / 127.0,
    };
    let blocks = rows * cols / BLOCK;
    // A storage policy may have put the scales in 16 bits.
    let scales = crate::precision::cast_to(scales.clone(), FloatDType::F32);
    (levels.reshape([blocks, BLOCK]) * scales.reshape([blocks, 1])).reshape([rows, cols])
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
