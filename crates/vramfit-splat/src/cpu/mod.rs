//! Plain-Rust twins of the splat kernels: the CPU execution path and the
//! oracle that the GPU kernels are tested against.
//!
//! Every function here is generic over the float type so that the
//! finite-difference tests can run in f64; the Burn ops use f32. Work is
//! split into fixed bands of tile rows (not by thread count), so results are
//! bit-identical from run to run whatever the number of threads.

pub mod project;
pub mod render;
pub mod top_k;
