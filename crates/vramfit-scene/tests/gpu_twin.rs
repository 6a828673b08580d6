//! The scene renderer's CubeCL kernels against the CPU twin, on wgpu (in
//! CI: Mesa's software Vulkan device, lavapipe). The same check runs on
//! CUDA with `vramfit check-kernels --device cuda` on the GPU machine.
#![cfg(feature = "wgpu")]

use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use vramfit_scene::gpu::check::{run_case, standard_cases};

#[test]
fn scene_kernels_match_the_cpu_twin() {
    let mut failed = Vec::new();
    for case in standard_cases() {
        let report = run_case::<WgpuRuntime>(&WgpuDevice::default(), &case).expect("the device ran every kernel");
        println!("{}", serde_json::to_string(&report).unwrap());
        assert!(
            report.intersections[1] > case.gaussians / 2,
            "the case draws: {report:?}"
        );
        if !report.passes() {
            failed.push(report);
        }
    }
    assert!(failed.is_empty(), "cases outside tolerance: {failed:#?}");
}
