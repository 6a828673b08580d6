//! Plain-Rust twins of the splat kernels: the CPU execution path and the
//! oracle that the GPU kernels are tested against.
//!
//! Every function here is generic over the float type so that the
//! finite-difference tests can run in f64; the Burn ops use f32. Work is
//! split into fixed bands of tile rows (not by thread count), so results are
//! bit-identical from run to run whatever the number of threads.

pub mod project;
pub mod render;
pub mod ssim;

use num_traits::Float;

/// Float type the CPU kernels run in (f32 in production, f64 in tests).
pub trait Real: Float + Send + Sync + Default + std::iter::Sum + std::fmt::Debug + 'static {
    /// Converts an f64 constant.
    fn c(v: f64) -> Self;
}

impl Real for f32 {
    fn c(v: f64) -> Self {
        v as f32
    }
}

impl Real for f64 {
    fn c(v: f64) -> Self {
        v
    }
}
