//! What vramfit's two Gaussian splatting workloads share: the 2D image
//! fitter (`vramfit-splat`) and the 3D scenes (`vramfit-scene`) render
//! Gaussians into the same screen tiles, bin them the same way, score
//! pictures with the same SSIM and read and write the same pictures.
//!
//! - [`Real`]: the CPU twins' float type, f32 or f64 for finite differences;
//! - [`tile`]: the tile side and binning of tile rectangles on the CPU;
//! - [`ssim`]: SSIM and its gradient (the CPU twin of the GPU loss);
//! - [`picture`]: images in and out, with errors that say what to do;
//! - `gpu` (feature `gpu`): CubeCL launch helpers, the binning kernels,
//!   the banded SSIM + L1 loss kernels, a device error type and the
//!   measure a GPU-versus-twin check uses.

mod device;
#[cfg(feature = "gpu")]
pub mod gpu;
mod jpeg_scan;
pub use jpeg_scan::CutShort;
pub mod picture;
mod real;
pub mod ssim;
pub mod tile;

pub use device::DeviceError;
pub use real::{EXP_LANES, Real, wide};
