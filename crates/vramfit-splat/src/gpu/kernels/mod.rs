//! The CubeCL kernels of the lean fit, twins of [`crate::cpu`] and split
//! as it is, stage by stage: [`project`] (projection, tile binning: count,
//! scan, scatter; and the projection's backward) and [`render`] (top-K
//! render forward and backward). The banded SSIM + L1 loss and its
//! gradient are shared with the scene ([`vramfit_gauss::gpu::ssim`]). All
//! arrays are flat, row major, f32 unless named otherwise; planes of a band
//! are `[rows, W, C]`.
//!
//! The constants the kernels share with the CPU maths (tile side, the
//! blend's epsilon) are the CPU's, converted here: defined once.

pub mod project;
pub mod render;

use vramfit_gauss::gpu::{TILE, UNITS};

/// Stands in for +∞ (WGSL has no infinity literal).
const BIG: f32 = 3.0e38;
/// Values per Gaussian in the gradient accumulator before the colour:
/// d_cx, d_cy, d_a, d_b, d_c.
pub const GEOMETRY_GRADS: u32 = 5;
