//! The scene workload: 3D Gaussian splatting with view-dependent colour in
//! spherical harmonics (3DGS), the system whose memory was studied most
//! closely. Built as the 2D fitter was: a CPU twin of the renderer first
//! ([`cpu`]), generic over the float type so that its backward is proven
//! against finite differences in f64; the CubeCL kernels, the training
//! loop come on top of it. The data: views with cameras and sparse points
//! ([`dataset`]), read and written in COLMAP's text format ([`colmap`]),
//! and a built-in synthetic scene rendered by an independent ray caster
//! ([`synthetic`]).

pub mod allocation;
pub mod colmap;
pub mod config;
pub mod cpu;
pub mod dataset;
pub mod densify;
pub mod error;
pub mod fit;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod job;
pub mod nerf;
pub mod params;
pub mod plan;
pub mod ply;
pub mod sh_storage;
pub mod synthetic;
pub mod view;
