//! The Burn ops against their CPU twins, and the fit loop's behaviour on
//! every backend present (Flex; wgpu with the `wgpu` feature).

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vramfit_gauss::picture::Picture;
use vramfit_gauss::ssim::ssim_backward;
use vramfit_splat::config::FitConfig;
use vramfit_splat::cpu::project::Frame;
use vramfit_splat::cpu::render::{Splats, render_backward};
use vramfit_splat::fit::Fit;
use vramfit_splat::op::{self, FusedLoss, RenderSpec, SplatBackend, SplatTensors};
use vramfit_splat::params::{Param, Params};
use vramfit_splat::sample;

type Ad = Autodiff<Flex>;

fn host<const D: usize>(t: Tensor<Flex, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

#[test]
fn autodiff_gradients_are_the_cpu_twins() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (n, w, h) = (30, 40, 28);
    let xy: Vec<f32> = (0..2 * n).map(|_| rng.random_range(0.0..1.0)).collect();
    let inv_scale: Vec<f32> = (0..2 * n).map(|_| 1.0 / rng.random_range(1.0..6.0)).collect();
    let theta: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
    let color: Vec<f32> = (0..3 * n).map(|_| rng.random_range(0.0..1.0)).collect();
    let target: Vec<f32> = (0..w * h * 3).map(|_| rng.random_range(0.0..1.0)).collect();
    let d = Default::default();
    let t2 = |v: &Vec<f32>, cols: usize| {
        Tensor::<Ad, 2>::from_data(TensorData::new(v.clone(), [v.len() / cols, cols]), &d).require_grad()
    };
    let host_params = Params {
        xy,
        inv_scale,
        theta,
        color,
    };
    let params: SplatTensors<Ad> = host_params.as_ref().map_param(|p, v| t2(v, p.width(3)));
    let spec = RenderSpec {
        frame: Frame::new(w, h),
        top_k: 10,
        channels: 3,
    };
    let target_t = Tensor::<Ad, 3>::from_data(TensorData::new(target.clone(), [h, w, 3]), &d);

    // Loss = ssim(render, target): the op's gradients must be the twins'.
    // The graph is built and differentiated under the process's graph lock.
    let graph = vramfit::grads::graph_lock();
    let render = op::render(&params, &spec);
    let render_host = host(render.clone().inner());
    let loss = op::ssim(render, target_t);
    let grads = loss.backward();
    drop(graph);
    let d_render = ssim_backward(&render_host, &target, h, w, 3, 1.0f32);
    let expected = render_backward(&Splats::new(&host_params, 3), &spec.frame, 10, &d_render);
    let got = params.map(|p| host(p.grad(&grads).unwrap()));
    for p in Param::ALL {
        assert_eq!(
            got[p],
            expected[p],
            "d_{} from Burn's autodiff differs from the CPU twin",
            p.name()
        );
    }
    assert!(expected.xy.iter().any(|v| v.abs() > 1e-6));
}

vramfit::test_backends!(
    a_short_fit_raises_psnr_clearly,
    a_checkpoint_round_trip_continues_identically,
    a_device_out_of_memory_writes_oom_json_and_keeps_what_was_written,
);

fn a_short_fit_raises_psnr_clearly<B: AutodiffBackend + SplatBackend>()
where
    B::InnerBackend: FusedLoss,
{
    let picture = Picture::from_rgb8(&sample::procedural(96, 64));
    let config = FitConfig {
        gaussians: 300,
        steps: 300,
        add_every: 50,
        check_every: 50,
        ..Default::default()
    };
    let mut fit = Fit::<B>::new(&picture, &config, &Default::default()).unwrap();
    let (_, before, ssim_before) = fit.evaluate().unwrap();
    while !fit.finished() {
        fit.step(false, &mut ()).unwrap();
    }
    let (_, after, ssim_after) = fit.evaluate().unwrap();
    assert_eq!(fit.len(), 300, "progressive addition reaches N");
    // Measured: 12.4 dB → 16.4 dB on this image (σ = 5 px starts blurry at
    // this size); a 3 dB gain cannot come from noise.
    assert!(after > before + 3.0, "PSNR {before:.2} → {after:.2} dB");
    assert!(ssim_after > ssim_before, "SSIM {ssim_before:.3} → {ssim_after:.3}");
}

fn a_checkpoint_round_trip_continues_identically<B: AutodiffBackend + SplatBackend>()
where
    B::InnerBackend: FusedLoss,
{
    let picture = Picture::from_rgb8(&sample::procedural(48, 40));
    let config = FitConfig {
        gaussians: 80,
        steps: 90,
        add_every: 20,
        check_every: 10,
        stall_limit: 30,
        ..Default::default()
    };
    let d = Default::default();
    let mut whole = Fit::<B>::new(&picture, &config, &d).unwrap();
    let mut first = Fit::<B>::new(&picture, &config, &d).unwrap();
    for _ in 0..45 {
        whole.step(false, &mut ()).unwrap();
        first.step(false, &mut ()).unwrap();
    }
    let bytes = first.checkpoint().to_bytes();
    drop(first);
    let ckpt = vramfit::run::ArrayFile::from_bytes(&bytes, "mem").unwrap();
    // A checkpoint whose arrays disagree on the Gaussians is refused.
    let mut forged = ckpt.clone();
    let (shape, values) = forged.arrays.get_mut("color").unwrap();
    values.truncate(values.len() - 3);
    shape[0] -= 1;
    let refused = Fit::<B>::resume(&picture, &config, &forged, &d)
        .err()
        .map(|e| e.to_string());
    assert!(
        refused.as_ref().is_some_and(|e| e.contains("array 'color' holds")),
        "{refused:?}"
    );
    let mut resumed = Fit::<B>::resume(&picture, &config, &ckpt, &d).unwrap();
    while !whole.finished() {
        whole.step(false, &mut ()).unwrap();
    }
    while !resumed.finished() {
        resumed.step(false, &mut ()).unwrap();
    }
    assert_eq!(whole.step_count(), resumed.step_count());
    let name = B::name(&d);
    if name.contains("flex") {
        assert_eq!(whole.gaussians(), resumed.gaussians(), "bit for bit on the CPU");
    } else {
        // The GPU backward adds gradients with atomics, whose order varies run
        // to run: no two GPU runs are bit-identical, resumed or not. The
        // resumed fit must land where the uninterrupted one does (measured on
        // lavapipe: centres within 2.6e-5, PSNR equal to 1e-3 dB).
        let (a, b) = (whole.gaussians(), resumed.gaussians());
        assert_eq!(a.len(), b.len());
        let gap = a
            .params
            .xy
            .iter()
            .zip(&b.params.xy)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let (pa, pb) = (whole.evaluate().unwrap().1, resumed.evaluate().unwrap().1);
        eprintln!("{name}: resumed fit, xy gap {gap:e}, PSNR {pa:.3} vs {pb:.3} dB");
        assert!(gap < 1e-2 && (pa - pb).abs() < 0.05, "xy gap {gap}, PSNR {pa} vs {pb}");
    }
}

fn a_device_out_of_memory_writes_oom_json_and_keeps_what_was_written<B: AutodiffBackend + SplatBackend>()
where
    B::InnerBackend: FusedLoss,
{
    use std::ops::ControlFlow;
    use vramfit::run::FailAt;
    use vramfit_splat::SplatError;
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("in.png");
    vramfit_gauss::picture::save_png(&image, &sample::procedural(64, 48)).unwrap();
    let config = FitConfig {
        image: image.display().to_string(),
        gaussians: 120,
        steps: 400,
        add_every: 30,
        check_every: 20,
        log_every: 10,
        frame_every: 0,
        checkpoint_every: 20,
        profile_every: 10,
        ..Default::default()
    };
    let out = tmp.path().join("r");
    let (run, workload) = vramfit_splat::job::launch::<B>(
        vramfit::run::Start::New(config, vramfit::run::RunPath::At(out.clone())),
        &Default::default(),
        "test",
    )
    .unwrap();
    // Step 45 fails at its sync as a device out-of-memory would (cubecl's words).
    let failing = FailAt {
        inner: workload,
        step: 45,
        fail: |step| SplatError::Device {
            step,
            phase: "forward_backward",
            message: "An io error happened during launch\nCaused by:\n  can't allocate buffer of size: 536870912"
                .into(),
        },
    };
    let msg = run
        .drive(failing, |_| ControlFlow::Continue(()))
        .expect_err("step 45 fails")
        .to_string();
    assert!(
        msg.contains("out of device memory at step 45 (forward_backward)")
            && msg.contains("allocating 512.0 MiB")
            && msg.contains("oom.json")
            && msg.contains("target image"),
        "{msg}"
    );
    let oom: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("oom.json")).unwrap()).unwrap();
    assert_eq!(oom["step"], 45);
    assert_eq!(oom["requested_bytes"], 512 << 20);
    assert_eq!(oom["last_recorded_phases"][0]["step"], 40);
    assert!(oom["largest_tensors"].as_array().unwrap().len() >= 5);
    // Nothing already written is lost, and the run is not mistaken for a finished one.
    let lines = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines, 4, "metrics of steps 10..40");
    assert!(out.join("checkpoints/step-00000040.ckpt").is_file());
    assert!(out.join("memory.json").is_file() && out.join("error.json").is_file());
    assert!(!out.join("summary.json").exists());
}

#[test]
fn a_diverging_learning_rate_stops_the_fit_at_the_step_it_happens() {
    let picture = Picture::from_rgb8(&sample::procedural(64, 64));
    let config = FitConfig {
        gaussians: 50,
        steps: 40,
        lr_inv_scale: 1e20,
        ..Default::default()
    };
    let mut fit = Fit::<Ad>::new(&picture, &config, &Default::default()).unwrap();
    let err = loop {
        match fit.step(false, &mut ()) {
            Ok(_) => assert!(!fit.finished(), "the fit ran to its end with a learning rate of 1e20"),
            Err(e) => break e,
        }
    };
    let failed_at = fit.step_count() + 1;
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "step {failed_at}: the `inv_scale` parameters became NaN, infinite or too large"
        )) && msg.contains("lower `lr_inv_scale`")
            && msg.contains("--resume"),
        "{msg}"
    );
    // Every step that succeeded left finite parameters behind.
    let before = Fit::<Ad>::new(&picture, &config, &Default::default()).map(|mut f| {
        for _ in 1..failed_at {
            f.step(false, &mut ()).unwrap();
        }
        f.gaussians()
    });
    let g = before.unwrap();
    assert!(g.params.iter().flat_map(|(_, v)| v).all(|v| v.is_finite()));
}
