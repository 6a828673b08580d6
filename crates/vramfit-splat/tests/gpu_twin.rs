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

/// The whole fit (Burn tensors, Adam, the fused banded loss through the
/// Burn glue) on the GPU path reaches the CPU path's quality.
#[test]
fn gpu_fit_matches_cpu_fit() {
    use burn::backend::{Autodiff, Flex};
    use vramfit_gauss::picture::Picture;
    use vramfit_splat::config::FitConfig;
    use vramfit_splat::fit::Fit;
    use vramfit_splat::gpu::backend::WgpuBackend;
    use vramfit_splat::sample;

    let picture = Picture::from_rgb8(&sample::procedural(96, 64));
    let config = FitConfig {
        gaussians: 150,
        steps: 150,
        progressive: false,
        band_rows: 32,
        log_every: 50,
        check_every: 50,
        ..Default::default()
    };
    let mut cpu = Fit::<Autodiff<Flex>>::new(&picture, &config, &Default::default()).unwrap();
    let mut gpu = Fit::<Autodiff<WgpuBackend>>::new(&picture, &config, &Default::default()).unwrap();
    let start = gpu.evaluate().unwrap().1;
    while !cpu.finished() {
        let c = cpu.step(false, &mut ()).unwrap();
        let g = gpu.step(false, &mut ()).unwrap();
        assert!(
            (c.loss - g.loss).abs() < 1e-3,
            "step {}: cpu loss {} gpu loss {}",
            c.step,
            c.loss,
            g.loss
        );
    }
    assert!(gpu.finished());
    let (_, cpu_psnr, _) = cpu.evaluate().unwrap();
    let (_, gpu_psnr, _) = gpu.evaluate().unwrap();
    println!("PSNR: start {start:.3} dB, cpu {cpu_psnr:.3} dB, gpu {gpu_psnr:.3} dB");
    assert!(gpu_psnr > start + 2.0, "the GPU fit must improve: {start} → {gpu_psnr}");
    assert!(
        (gpu_psnr - cpu_psnr).abs() < 0.3,
        "cpu {cpu_psnr} dB vs gpu {gpu_psnr} dB"
    );
}
