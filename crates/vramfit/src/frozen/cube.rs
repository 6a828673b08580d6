//! A quantized matrix dequantized on CubeCL (wgpu, CUDA) in one kernel:
//! each unit reads one packed 32-bit word of codes, looks its 8 (NF4) or
//! 4 (int8) codes up in the format's levels and writes them times their
//! block's scale, in the compute type, straight into the matrix.
//!
//! What it replaces: Burn's integer operations (a shift and a mask per
//! code position, a stack, a gather of the levels, a multiply by the
//! scales, then a cast), which hold a 4-byte code, an f32 level and an f32
//! product a value at once while a matrix is rebuilt: for a 7B's MLP
//! matrix (58.7 M values) some 700 MB beside the 117 MB of bf16 it makes.
//! Here only the matrix is made. Twin: [`super::quant::dequantize`], the
//! host loop (`vramfit-models/tests/toolkit/llama.rs` checks them equal on
//! wgpu).

use burn::tensor::{DType, FloatDType, Int, Tensor, TensorPrimitive};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::quant::{self, BLOCK, Format};
use crate::fused::downcast;

/// The CubeCL backend served, without autodiff (the frozen product's
/// backward rebuilds its matrix on the inner backend).
type Cube<R> = burn_cubecl::CubeBackend<R, f32, i32, u8>;

/// Units a cube.
const UNITS: u32 = 256;

/// Word `w` of `codes` (counted across a grid of up to 65,535 cubes a
/// dimension) into `per_word` values of `out`: level `code` of `levels`
/// times the scale of its block of [`BLOCK`] values.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn dequantize_words<F: Float>(
    codes: &Array<i32>,
    scales: &Array<f32>,
    levels: &Array<f32>,
    out: &mut Array<F>,
    words: u32,
    #[comptime] bits: u32,
    #[comptime] per_word: u32,
    #[define(F)] _dtype: StorageType,
) {
    let w = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) * UNITS + UNIT_POS_X;
    if w < words {
        let word = u32::cast_from(codes[w as usize]);
        let mask = comptime!((1u32 << bits) - 1);
        #[unroll]
        for j in 0..per_word {
            let code = (word >> (j * bits)) & mask;
            let i = w * per_word + j;
            let scale = scales[(i / comptime!(BLOCK as u32)) as usize];
            out[i as usize] = F::cast_from(levels[code as usize] * scale);
        }
    }
}

/// The `[rows, cols]` matrix in `dtype` from its packed `codes` and f32
/// block `scales`, where `B` is this runtime's backend without autodiff,
/// the codes are i32 and the scales f32; else `None`.
pub(super) fn dequantize<B: burn::tensor::backend::Backend, R: CubeRuntime>(
    codes: &Tensor<B, 1, Int>,
    scales: &Tensor<B, 1>,
    [rows, cols]: [usize; 2],
    format: Format,
    dtype: FloatDType,
) -> Option<Tensor<B, 2>> {
    let codes: Tensor<Cube<R>, 1, Int> = downcast(codes.clone()).ok()?;
    let scales: Tensor<Cube<R>, 1> = downcast(scales.clone()).ok()?;
    let codes = contiguous(codes.into_primitive());
    let scales = contiguous(scales.into_primitive().tensor());
    if codes.dtype != DType::I32 || scales.dtype != DType::F32 {
        return None;
    }
    let levels: Vec<f32> = match format {
        Format::Nf4 => quant::NF4_LEVELS.to_vec(),
        Format::Int8 => (0..256).map(|c| format.level(c, 1.0)).collect(),
    };
    let levels = Tensor::<Cube<R>, 1>::from_data(
        burn::tensor::TensorData::new(levels.clone(), [levels.len()]),
        &codes.device,
    )
    .into_primitive()
    .tensor();
    let n = rows * cols;
    let dtype = DType::from(dtype);
    let out = {
        let handle = codes.client.empty(n.max(1) * dtype.size());
        CubeTensor::new_contiguous(
            codes.client.clone(),
            codes.device.clone(),
            burn::tensor::Shape::from(vec![rows, cols]),
            handle,
            dtype,
        )
    };
    let words = n / format.per_word();
    let cubes = words.div_ceil(UNITS as usize).max(1);
    let x = cubes.clamp(1, 65_535);
    dequantize_words::launch::<R>(
        &codes.client,
        CubeCount::Static(x as u32, cubes.div_ceil(x) as u32, 1),
        CubeDim::new_1d(UNITS),
        codes.clone().into_array_arg(),
        scales.into_array_arg(),
        levels.into_array_arg(),
        out.clone().into_array_arg(),
        words as u32,
        format.bits() as u32,
        format.per_word() as u32,
        dtype.into(),
    );
    let out = Tensor::<Cube<R>, 2>::from_primitive(TensorPrimitive::Float(out));
    downcast(out).ok()
}

fn contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if t.is_contiguous() { t } else { into_contiguous(t) }
}
