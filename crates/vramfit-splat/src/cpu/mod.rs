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

/// Runs `f` compiled for AVX2 when the CPU has it (checked at run time,
/// the answer cached by std), else as built: the default x86-64 target has
/// only SSE2, so the kernels' vector loops are 4 floats wide. `f` must be
/// an `#[inline(always)]` closure, and what it calls inline too: code takes
/// the target features of the function it is inlined into. AVX2 without
/// FMA changes no result: Rust never fuses a multiply and an add, nor
/// reorders a float sum, so both builds give the same bits.
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { avx2(f) };
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}
