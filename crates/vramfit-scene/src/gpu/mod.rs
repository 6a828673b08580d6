//! The GPU path of the renderer: CubeCL kernels ([`kernels`]), twins of
//! [`crate::cpu`] stage by stage, put together by [`engine::Renderer`]
//! (generic over CubeCL runtimes: CUDA in production, wgpu so that the
//! check against the twin runs on a software Vulkan device in CI), and the
//! check itself ([`check`]); [`device_fit`] keeps a fit's state on the device and
//! [`loss`] computes its loss there; [`memory`] measures what a scene takes
//! there; [`plan`] fits it into a budget.

pub mod check;
pub mod device_fit;
pub mod engine;
pub mod kernels;
pub mod loss;
pub mod memory;
pub mod plan;

pub use engine::{Drawn, Renderer, SceneBuffers};
