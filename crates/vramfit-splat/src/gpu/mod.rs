//! The GPU path: CubeCL kernels ([`kernels`]) and the lean banded fit
//! ([`engine::Lean`]) they make up, generic over CubeCL runtimes (CUDA in
//! production; wgpu lets the GPU-versus-CPU check run on a software Vulkan
//! device), plus the Burn glue that plugs them into [`crate::op`].

pub mod backend;
pub mod check;
pub mod engine;
pub mod kernels;

pub use engine::{Lean, ParamBuffers};
