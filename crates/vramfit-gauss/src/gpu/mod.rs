//! The CubeCL side both workloads share: launch shapes, buffers as kernel
//! arguments, the binning kernels, the banded SSIM + L1 loss ([`ssim`]),
//! and the measure by
//! which a GPU result is compared with its CPU twin.

pub mod binning;
pub mod ssim;

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Side of a screen tile ([`crate::tile::TILE`]) as the kernels take it.
pub const TILE: u32 = crate::tile::TILE as u32;
/// Units per cube: one per pixel of a tile, and the width of every 1-D launch.
pub const UNITS: u32 = TILE * TILE;
/// Largest cube count along one axis that every runtime accepts.
const MAX_CUBES_X: usize = 65_535;

pub use crate::device::DeviceError;

/// Launch grid for `elems` units of [`UNITS`] per cube (two axes where one
/// would exceed what every runtime accepts).
pub fn grid(elems: usize) -> CubeCount {
    let cubes = elems.div_ceil(UNITS as usize).max(1);
    if cubes <= MAX_CUBES_X {
        CubeCount::Static(cubes as u32, 1, 1)
    } else {
        CubeCount::Static(MAX_CUBES_X as u32, cubes.div_ceil(MAX_CUBES_X) as u32, 1)
    }
}

/// Cubes a static grid launches.
pub fn cubes_of(count: &CubeCount) -> usize {
    match count {
        CubeCount::Static(x, y, z) => (*x as usize) * (*y as usize) * (*z as usize),
        CubeCount::Dynamic(_) => unreachable!("grids here are static"),
    }
}

/// A 1-D cube of [`UNITS`] units.
pub fn dim() -> CubeDim {
    CubeDim::new_1d(UNITS)
}

/// `len` elements of `h` as a kernel argument (at least one: an empty
/// buffer is bound as one element that no unit reads).
pub fn array<R: Runtime>(h: &Handle, len: usize) -> ArrayArg<R> {
    // SAFETY: every caller allocates `h` with at least `len` elements of the
    // kernel's element type (f32 or u32, 4 bytes), and launches are checked.
    unsafe { ArrayArg::from_raw_parts(h.clone(), len.max(1)) }
}

fn max_abs(v: &[f32]) -> f64 {
    v.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64))
}

/// max |GPU − CPU| over max |CPU| (the absolute difference where the CPU's
/// values are all zero): a result's error relative to its scale, as the
/// GPU-versus-twin checks of both workloads measure it.
pub fn max_relative_error(gpu: &[f32], cpu: &[f32]) -> f64 {
    let diff = gpu
        .iter()
        .zip(cpu)
        .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - *b as f64).abs()));
    let scale = max_abs(cpu);
    if scale == 0.0 { diff } else { diff / scale }
}
