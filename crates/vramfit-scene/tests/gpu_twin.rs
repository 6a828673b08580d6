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

/// The loss on the device (the image fit's banded SSIM kernels) gives the
/// host's loss and image gradient: one band and several (the last one
/// short), an 8-bit target (held as bytes) and an f32 one, sizes that are
/// not tile multiples.
#[test]
fn the_loss_on_the_device_matches_the_host() {
    use vramfit_scene::gpu::check::{Case, loss_gaps};
    use vramfit_scene::gpu::loss::band_rows;
    use vramfit_scene::sh_storage::ShStorage;

    let cases = standard_cases();
    // A view as short as a dataset allows (8 rows: fewer than a band's
    // least), in the bands the loss picks itself.
    let short = Case {
        width: 24,
        height: 8,
        gaussians: 30,
        degree: 1,
        seed: 9,
        sh: ShStorage::F32,
    };
    for (case, rows, eight_bit) in [
        (&cases[1], Some(1000), true),
        (&cases[2], Some(8), true),
        (&cases[2], Some(13), false),
        (&cases[4], Some(32), false),
        (&short, None, true),
        (&cases[4], None, false),
    ] {
        let r =
            loss_gaps::<WgpuRuntime>(&WgpuDevice::default(), case, rows, eight_bit).expect("the device ran the loss");
        eprintln!("{r:?}");
        assert!(r.passes(), "{case:?}: {r:?}");
    }
    // The loss's own bands: the whole of a short view, 116 rows at 720p
    // (planes within 16 MiB), no fewer than 64 at 4K.
    assert_eq!(band_rows(24, 8), 8);
    assert_eq!(band_rows(1280, 720), 116);
    assert_eq!(band_rows(3840, 2160), 64);
}

/// The device's Adam kernel and the host's Adam (what `--moments host`
/// runs) give the same parameters and moments, to the last ulp, over 20
/// steps of gradients spanning nine decades.
#[test]
fn host_adam_matches_the_device_kernel() {
    use vramfit_scene::gpu::check::check_adam;
    let report = check_adam::<WgpuRuntime>(&WgpuDevice::default(), 10_000, 20).unwrap();
    eprintln!("{report:?}");
    assert!(report.passes(), "{report:?}");
}

/// The backward taken chunk by chunk (as with the moments on the host)
/// gives the whole backward's gradients bit for bit: each Gaussian's
/// gradient reads only its own parameters and accumulator. With the SH in
/// f16 too (its groups bound at offsets into packed halves).
#[test]
fn a_chunked_backward_equals_the_whole() {
    use vramfit_scene::gpu::check::{Case, case_camera, random_scene, scene};
    use vramfit_scene::gpu::engine::{CHUNK_ALIGN, Renderer};
    use vramfit_scene::sh_storage::ShStorage;

    for sh in [ShStorage::F32, ShStorage::F16] {
        let case = Case {
            width: 40,
            height: 28,
            gaussians: 300,
            degree: 3,
            seed: 5,
            sh,
        };
        let params = random_scene(&case);
        let s = scene(&params, case.degree);
        let camera = case_camera(&case);
        let r = Renderer::<WgpuRuntime>::new(&WgpuDevice::default());
        let buffers = r.upload_as(&s, sh);
        let drawn = r.render(&buffers, &camera, [0.1, 0.2, 0.3]).unwrap();
        let d_image = r.upload_f32(&(0..3 * 40 * 28).map(|i| ((i as f32) * 0.7).sin()).collect::<Vec<_>>());
        let acc = r.backward_screen(&drawn, &d_image);
        let widths = buffers.widths();
        let screen_whole = r.upload_f32(&vec![0.0; 2 * case.gaussians]);
        let whole = r.backward_params(&buffers, &drawn, &acc, &screen_whole, 0, case.gaussians);
        let screen_parts = r.upload_f32(&vec![0.0; 2 * case.gaussians]);
        let mut parts: Vec<Vec<f32>> = vec![Vec::new(); 6];
        for first in (0..case.gaussians).step_by(CHUNK_ALIGN) {
            let count = CHUNK_ALIGN.min(case.gaussians - first);
            let part = r.backward_params(&buffers, &drawn, &acc, &screen_parts, first, count);
            for g in 0..6 {
                parts[g].extend(r.download(&part[g], count * widths[g]).unwrap());
            }
        }
        for g in 0..6 {
            let w = r.download(&whole[g], case.gaussians * widths[g]).unwrap();
            assert!(w.iter().any(|v| *v != 0.0), "{sh}: group {g} has gradients");
            assert_eq!(
                w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                parts[g].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{sh}: group {g}"
            );
        }
        let a = r.download(&screen_whole, 2 * case.gaussians).unwrap();
        let b = r.download(&screen_parts, 2 * case.gaussians).unwrap();
        assert_eq!(a, b, "{sh}: screen gradients");
    }
}

/// The kernels widen every f16 and bf16 bit pattern to the f32 the host's
/// conversion gives (zeros, subnormals, infinities and NaNs included).
#[test]
fn sixteen_bit_sh_widens_as_on_the_host() {
    use vramfit_scene::gpu::check::widening_mismatches;
    let mismatches = widening_mismatches::<WgpuRuntime>(&WgpuDevice::default()).unwrap();
    assert_eq!(mismatches, [0, 0], "patterns widened differently: [f16, bf16]");
}

/// The whole fit with its state on the device (parameters, gradients,
/// Adam's moments and densification's statistics in device buffers;
/// densification and an opacity reset on the way, which move the state to
/// the host and back) follows the CPU fit of the same scene, step by step.
#[test]
fn a_scene_fit_on_wgpu_follows_the_cpu_fit() {
    use vramfit_scene::densify::Densify;
    use vramfit_scene::fit::{Fit, Settings};
    use vramfit_scene::gpu::device_fit::DeviceFit;
    use vramfit_scene::synthetic::{SKY, Spec, dataset};

    let data = dataset(&Spec {
        views: 17,
        width: 48,
        height: 36,
        points: 600,
        ..Spec::default()
    });
    let steps = 240;
    let settings = Settings {
        steps,
        sh_every: 60,
        background: SKY.map(|v| v as f32),
        densify: Densify {
            from: 50,
            every: 50,
            reset_every: 150,
            until: 200,
            ..Densify::default()
        },
        ..Settings::default()
    };
    let mut cpu = Fit::new(data.clone(), settings.clone()).unwrap();
    let device = DeviceFit::<WgpuRuntime>::new(&WgpuDevice::default(), "wgpu");
    let mut gpu = Fit::new(data, settings).unwrap().on_device(Box::new(device)).unwrap();
    let start = [cpu.held_out_psnr().unwrap(), gpu.held_out_psnr().unwrap()];
    assert!((start[0] - start[1]).abs() < 1e-3, "the same seeded scene: {start:?}");
    let mut counts = Vec::new();
    for step in 1..=steps {
        let (c, g) = (cpu.step().unwrap(), gpu.step().unwrap());
        if step <= 10 {
            assert!(
                (c - g).abs() <= 1e-4 * c.abs(),
                "step {step}: loss {c} on the CPU, {g} on wgpu"
            );
        }
        if step % 50 == 0 {
            counts.push((cpu.len(), gpu.len()));
        }
    }
    let end = [cpu.held_out_psnr().unwrap(), gpu.held_out_psnr().unwrap()];
    eprintln!("held-out PSNR: start {start:?}, end {end:?}; Gaussians (cpu, wgpu) every 50 steps: {counts:?}");
    assert!(end[1] > start[1] + 1.0, "the wgpu fit learns: {start:?} → {end:?}");
    assert!(
        (end[0] - end[1]).abs() < 0.3,
        "the wgpu fit ends where the CPU's does: {end:?}"
    );
    assert!(
        counts.iter().any(|(c, _)| *c != counts[0].0) || counts[0].0 != 600,
        "densification ran: {counts:?}"
    );
    for (c, g) in &counts {
        assert!(c.abs_diff(*g) * 50 <= *c, "Gaussian counts {c} and {g} within 2 %");
    }
    // The host copy a checkpoint reads is the device's state.
    let params = gpu.params().unwrap();
    assert_eq!(params.len(), gpu.len());
    assert!(params.means.iter().all(|v| v.is_finite()));
}

/// The scene fit on wgpu through the run driver: the profiler reads the
/// device's allocator (its reserved high-water is the headline), the memory
/// report names the parameter groups, and a run stopped after a checkpoint
/// resumes from the checkpointed state on the device. (The backward's
/// atomic additions make two wgpu runs differ in the last bits, so the
/// resumed run is compared within a tolerance, not bit for bit as on the
/// CPU.)
#[test]
fn a_wgpu_scene_run_profiles_the_allocator_and_resumes() {
    use std::ops::ControlFlow;
    use vramfit::profile::CubeAllocator;
    use vramfit::run::{Event, RunPath, Start};
    use vramfit_scene::config::SceneConfig;
    use vramfit_scene::gpu::device_fit::placement;
    use vramfit_scene::job::{Placement, launch};

    let on_wgpu = || -> Placement {
        placement::<WgpuRuntime>(&WgpuDevice::default(), "wgpu", || {
            Box::new(CubeAllocator::<WgpuRuntime>::new(
                &WgpuDevice::default(),
                "wgpu",
                Err(vramfit::profile::NoDriverReading::NotOn("wgpu")),
            ))
        })
    };
    let config = SceneConfig {
        views: 9,
        width: 32,
        height: 24,
        points: 200,
        steps: 40,
        sh_every: 10,
        log_every: 5,
        checkpoint_every: 20,
        profile_every: 10,
        densify_from: 10,
        densify_every: 10,
        densify_until: 30,
        densify_grad_threshold: 1e-6,
        opacity_reset_every: 0,
        max_gaussians: 260,
        frame_every: 0,
        ..SceneConfig::default()
    };
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let (run, job) = launch(Start::New(config.clone(), RunPath::At(whole.clone())), on_wgpu()).unwrap();
    let summary = run
        .drive(job, |_| ControlFlow::Continue(()))
        .unwrap()
        .expect("finished");
    let s = &summary.workload;
    assert!(s.held_out_psnr_db > s.initial_psnr_db, "{s:?}");
    assert!(
        s.gaussians > 200 && s.gaussians <= 260,
        "densified within the cap: {}",
        s.gaussians
    );
    let memory: serde_json::Value = serde_json::from_slice(&std::fs::read(whole.join("memory.json")).unwrap()).unwrap();
    assert!(
        memory["source"].as_str().unwrap().contains("wgpu allocator"),
        "{}",
        memory["source"]
    );
    assert_eq!(memory["headline"]["figure"], "allocator reserved bytes");
    let text = memory.to_string();
    assert!(
        text.contains("sh_rest") && text.contains("sh_dc"),
        "groups named in the report"
    );
    // The device holds at least the parameters, gradients and moments it declares.
    let n = s.gaussians as u64;
    let declared = 4 * n * (3 + 3 + 4 + 1 + 3 + 45) * 4;
    let peak = summary.peak_memory_bytes.expect("the allocator was read");
    assert!(peak >= declared, "{peak} < {declared}");

    let cut = tmp.path().join("cut");
    let (run, job) = launch(Start::New(config, RunPath::At(cut.clone())), on_wgpu()).unwrap();
    let stopped = run
        .drive(job, |e| match e {
            Event::Checkpoint(_) => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        })
        .unwrap();
    assert!(stopped.is_none(), "stopped before the end");
    let (run, job) = launch(Start::Resume(cut.clone()), on_wgpu()).unwrap();
    let resumed = run
        .drive(job, |_| ControlFlow::Continue(()))
        .unwrap()
        .expect("finished");
    assert_eq!(resumed.steps, 40);
    let (a, b) = (resumed.workload.held_out_psnr_db, s.held_out_psnr_db);
    assert!((a - b).abs() < 0.05, "resumed {a:.4} dB, whole run {b:.4} dB");
}

/// The device memory of a scene is what its count, SH degree, image and
/// tile intersections say, to the allocator's 32-byte rounding of each
/// buffer: the SH rest coefficients are their own group of
/// 4 · 3 · ((degree + 1)² − 1) bytes a Gaussian.
#[test]
fn a_scenes_device_memory_is_what_its_layout_says() {
    use vramfit_scene::gpu::memory::{cases, measure};
    for case in cases(&[3000], &[0, 1, 3], 96, 64) {
        let r = measure::<WgpuRuntime>(&WgpuDevice::default(), &case).unwrap();
        let n = case.gaussians as u64;
        let rest = r.groups.iter().find(|(g, _)| g == "sh_rest").unwrap().1;
        let per = 4 * 3 * ((case.degree as u64 + 1).pow(2) - 1);
        assert!(
            rest == per * n || (per == 0 && rest <= 32),
            "sh_rest {rest} B for {n} Gaussians"
        );
        assert_eq!(r.groups.iter().find(|(g, _)| g == "means").unwrap().1, 12 * n);
        for (stage, buffers) in [(r.parameters, 6), (r.optimizer, 15), (r.render, 8), (r.backward, 9)] {
            assert!(
                stage.measured.abs_diff(stage.predicted) <= 32 * buffers,
                "{stage:?} in {r:?}"
            );
        }
        assert!(r.intersections > 0 && r.reserved >= r.in_use);
    }
    // A group larger than the device's largest buffer is refused before any
    // allocation (the allocator would abort the process).
    let limit = vramfit_scene::gpu::Renderer::<WgpuRuntime>::new(&WgpuDevice::default()).largest_buffer();
    let n = (limit / (45 * 4) + 1) as usize;
    let big = cases(&[n], &[3], 64, 48)[0];
    let e = measure::<WgpuRuntime>(&WgpuDevice::default(), &big)
        .unwrap_err()
        .to_string();
    assert!(e.contains("device's largest") && e.contains("SH degree"), "{e}");
}
