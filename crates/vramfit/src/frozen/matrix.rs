//! A frozen matrix as stored: [`Quantized`] (block-quantized codes and
//! scales, a Burn module) and [`Matrix`] (float or quantized, as the
//! product reads it), made in a compute type only when asked
//! ([`Matrix::materialize`]).

use burn::module::{Param, ParamId};
use burn::prelude::*;
use burn::tensor::{FloatDType, TensorData};

use super::quant::{self, BLOCK, Format, QuantError};

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

    /// A `[rows, cols]` matrix in `format` whose codes and scales are
    /// buffers of their sizes with no values set: for the shape backend
    /// ([`crate::shapes`]), where there are no values to quantize. Refused
    /// as [`Quantized::new`] refuses a count that is not whole blocks.
    pub fn unset([rows, cols]: [usize; 2], format: Format, device: &B::Device) -> Result<Self, QuantError> {
        let count = rows * cols;
        if !count.is_multiple_of(BLOCK) {
            return Err(QuantError::Blocks { count });
        }
        let (words, blocks) = (count / format.per_word(), count / BLOCK);
        Ok(Self {
            codes: Param::initialized(ParamId::new(), Tensor::empty([words], device)),
            scales: Param::from_tensor(Tensor::empty([blocks], device)).set_require_grad(false),
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
            } => dequantize(codes, scales, *dims, *format, dtype),
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

/// The values of a quantized matrix in `dtype`. On the CPU the host loop
/// of [`quant::dequantize`]; on CubeCL one kernel that writes the matrix
/// in `dtype` ([`super::cube`]); elsewhere Burn's integer and gather
/// operations (a code tensor of 4 bytes a value lives while it runs).
fn dequantize<B: Backend>(
    codes: &Tensor<B, 1, Int>,
    scales: &Tensor<B, 1>,
    dims: [usize; 2],
    format: Format,
    dtype: FloatDType,
) -> Tensor<B, 2> {
    #[cfg(feature = "wgpu")]
    if let Some(m) = super::cube::dequantize::<B, cubecl::wgpu::WgpuRuntime>(codes, scales, dims, format, dtype) {
        return m;
    }
    #[cfg(feature = "cuda")]
    if let Some(m) = super::cube::dequantize::<B, cubecl::cuda::CudaRuntime>(codes, scales, dims, format, dtype) {
        return m;
    }
    if let Some(m) = super::on_shapes::dequantize::<B>(codes, scales, dims, dtype) {
        return m;
    }
    crate::precision::cast_to(dequantize_f32(codes, scales, dims, format), dtype)
}

/// The f32 values of a quantized matrix, by the host loop on the CPU and
/// Burn's operations elsewhere.
fn dequantize_f32<B: Backend>(
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
