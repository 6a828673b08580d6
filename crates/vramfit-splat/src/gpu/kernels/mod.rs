//! The CubeCL kernels of the lean fit, twins of [`crate::cpu`] and split
//! as it is, stage by stage: [`project`] (projection, tile binning: count,
//! scan, scatter; and the projection's backward), [`render`] (top-K render
//! forward and backward) and [`ssim`] (the banded SSIM + L1 loss and its
//! gradient). All arrays are flat, row major, f32 unless named otherwise;
//! planes of a band are `[rows, W, C]`.
//!
//! The constants the kernels share with the CPU maths (tile side, SSIM
//! window taps and C1/C2, the blend's epsilon) are the CPU's, converted
//! here: defined once.

pub mod project;
pub mod render;
pub mod ssim;

use cubecl::prelude::*;

/// Side of a screen tile ([`crate::cpu::project::TILE`]).
pub const TILE: u32 = crate::cpu::project::TILE as u32;
/// Units per cube: one per pixel of a tile, and the width of every 1-D launch.
pub const UNITS: u32 = TILE * TILE;
/// Taps of the SSIM window ([`crate::cpu::ssim::TAPS`]).
pub const TAPS: u32 = crate::cpu::ssim::TAPS as u32;
/// Stands in for +∞ (WGSL has no infinity literal).
const BIG: f32 = 3.0e38;
/// Values per Gaussian in the gradient accumulator before the colour:
/// d_cx, d_cy, d_a, d_b, d_c.
pub const GEOMETRY_GRADS: u32 = 5;

/// Writes `value` to `a[0..len)`.
#[cube(launch)]
pub fn fill_u32(a: &mut Array<u32>, value: u32, len: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < len {
        a[i as usize] = value;
    }
}

/// Writes `value` to `a[0..len)`.
#[cube(launch)]
pub fn fill_f32(a: &mut Array<f32>, value: f32, len: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < len {
        a[i as usize] = value;
    }
}
