//! The backends one test body runs on: Flex always, wgpu where the crate
//! under test is built with its `wgpu` feature (Mesa's software Vulkan in
//! CI), as candle's `test_device!` does for its devices.
//!
//! ```ignore
//! fn checkpointed_gradients_equal_plain<B: AutodiffBackend>() { /* … */ }
//! vramfit::test_backends!(checkpointed_gradients_equal_plain);
//! ```
//! expands to a module per body with a `flex` test and, under the calling
//! crate's `wgpu` or `cuda` feature, a `wgpu` or `cuda` test (that feature
//! must enable `vramfit/wgpu` or `vramfit/cuda`; the `cuda` tests run on a
//! GPU machine, never in CI).

/// Flex with autodiff: the CPU backend every test runs on.
pub type Flex = burn::backend::Autodiff<burn::backend::Flex>;

/// wgpu (CubeCL) with autodiff.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Autodiff<burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8>>;

/// CUDA (CubeCL) with autodiff: the backend `--device cuda` trains on.
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Autodiff<burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>;

/// wgpu (CubeCL) under Burn's operation fusion, with autodiff: operations
/// are queued and chains of them run as one generated kernel.
#[cfg(feature = "fusion")]
pub type WgpuFusion =
    burn::backend::Autodiff<burn_fusion::Fusion<burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8>>>;

/// True when `B` is the CPU backend (Flex, with or without autodiff): the
/// host is the device, so host memory saves it nothing.
pub fn is_cpu<B: 'static>() -> bool {
    let b = std::any::TypeId::of::<B>();
    b == std::any::TypeId::of::<burn::backend::Flex>() || b == std::any::TypeId::of::<Flex>()
}

/// Instantiates each generic test body `fn body<B>()` on every backend present.
#[macro_export]
macro_rules! test_backends {
    ($($body:ident),+ $(,)?) => {$(
        mod $body {
            #[test]
            fn flex() {
                super::$body::<$crate::backends::Flex>();
            }
            #[cfg(feature = "wgpu")]
            #[test]
            fn wgpu() {
                super::$body::<$crate::backends::Wgpu>();
            }
            #[cfg(feature = "cuda")]
            #[test]
            fn cuda() {
                super::$body::<$crate::backends::Cuda>();
            }
        }
    )+};
}
