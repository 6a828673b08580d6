//! The training toolkit's properties on the built-in models, the
//! transformer's, the llm's and the U-Net's in one test binary: each binary builds the
//! training stack for every backend present again, which on wgpu took
//! minutes a binary (the two: 339 s of compile time in CI's lavapipe build,
//! cargo --timings). Adam's moments on the host stay in a binary of their
//! own (`host_moments.rs`: they read the device's bytes in use).

#[path = "../common/mod.rs"]
mod common;
mod llama;
mod peft;
mod segmenter;
mod transformer;
mod unet;
