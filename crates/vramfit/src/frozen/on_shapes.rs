//! The quantized matrix's dequantization on the shape backend: what the
//! CubeCL kernel (`cube.rs`) allocates, the matrix in the compute type and
//! nothing else, described without computing.

use burn::prelude::*;
use burn::tensor::{FloatDType, TensorPrimitive};

use crate::fused::downcast;
use crate::shapes::{Shapes, contiguous, kernel};

/// The `[rows, cols]` matrix in `dtype` where `B` is the shape backend; else `None`.
pub(super) fn dequantize<B: Backend>(
    codes: &Tensor<B, 1, Int>,
    scales: &Tensor<B, 1>,
    [rows, cols]: [usize; 2],
    dtype: FloatDType,
) -> Option<Tensor<B, 2>> {
    let codes: Tensor<Shapes, 1, Int> = downcast(codes.clone()).ok()?;
    let scales: Tensor<Shapes, 1> = downcast(scales.clone()).ok()?;
    let codes = contiguous(codes.into_primitive());
    let scales = contiguous(scales.into_primitive().tensor());
    let dtype = burn::tensor::DType::from(dtype);
    let m = kernel(
        "vramfit.dequantize",
        &[&codes, &scales],
        &[([rows, cols].into(), dtype)],
    )
    .remove(0);
    downcast(Tensor::<Shapes, 2>::from_primitive(TensorPrimitive::Float(m))).ok()
}
