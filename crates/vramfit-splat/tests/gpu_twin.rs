//! The CubeCL kernels against their CPU twins, on wgpu. Without a GPU this
//! runs on Mesa's software Vulkan device (lavapipe, Debian package
//! `mesa-vulkan-drivers`); `.ci/run` installs it. The same check runs on
//! CUDA with `vramfit check-kernels --device cuda` on the GPU machine.
#![cfg(feature = "wgpu")]

use cubecl::Runtime;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use vramfit_splat::gpu::check::{run_case, standard_cases};

#[test]
fn gpu_kernels_match_cpu_twins() {
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let mut failed = Vec::new();
    for case in standard_cases() {
        let report = run_case(&client, &case).expect("the device ran every kernel");
        println!("{}", serde_json::to_string(&report).unwrap());
        if !report.passes() {
            failed.push(report);
        }
    }
    assert!(failed.is_empty(), "cases outside tolerance: {failed:#?}");
}
