//! The Burn ops against their CPU twins, and the fit loop's behaviour.

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vramfit_splat::config::FitConfig;
use vramfit_splat::cpu::project::Frame;
use vramfit_splat::cpu::render::{Splats, render_backward};
use vramfit_splat::cpu::ssim::ssim_backward;
use vramfit_splat::fit::Fit;
use vramfit_splat::op::{self, RenderSpec, SplatTensors};
use vramfit_splat::picture::Picture;
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
    let params = SplatTensors {
        xy: t2(&xy, 2),
        inv_scale: t2(&inv_scale, 2),
        theta: t2(&theta, 1),
        color: t2(&color, 3),
    };
    let spec = RenderSpec {
        frame: Frame::new(w, h),
        top_k: 10,
        channels: 3,
    };
    let target_t = Tensor::<Ad, 3>::from_data(TensorData::new(target.clone(), [h, w, 3]), &d);

    // Loss = ssim(render, target): the op's gradients must be the twins'.
    let render = op::render(&params, &spec);
    let render_host = host(render.clone().inner());
    let loss = op::ssim(render, target_t);
    let grads = loss.backward();
    let d_render = ssim_backward(&render_host, &target, h, w, 3, 1.0f32);
    let splats = Splats {
        xy: &xy,
        inv_scale: &inv_scale,
        theta: &theta,
        color: &color,
        channels: 3,
    };
    let expected = render_backward(&splats, &spec.frame, 10, &d_render);
    let got = params.to_array().map(|p| host(p.grad(&grads).unwrap()));
    for (name, g, e) in [
        ("xy", &got[0], &expected.d_xy),
        ("inv_scale", &got[1], &expected.d_inv_scale),
        ("theta", &got[2], &expected.d_theta),
        ("color", &got[3], &expected.d_color),
    ] {
        assert_eq!(g, e, "d_{name} from Burn's autodiff differs from the CPU twin");
    }
    assert!(expected.d_xy.iter().any(|v| v.abs() > 1e-6));
}

#[test]
fn a_short_fit_raises_psnr_clearly() {
    let picture = Picture::from_rgb8(&sample::procedural(96, 64));
    let config = FitConfig {
        gaussians: 300,
        steps: 300,
        add_every: 50,
        check_every: 50,
        ..Default::default()
    };
    let mut fit = Fit::<Ad>::new(&picture, &config, &Default::default()).unwrap();
    let (_, before, ssim_before) = fit.evaluate().unwrap();
    while !fit.finished() {
        fit.step(false).unwrap();
    }
    let (_, after, ssim_after) = fit.evaluate().unwrap();
    assert_eq!(fit.len(), 300, "progressive addition reaches N");
    // Measured: 12.4 dB → 16.4 dB on this image (σ = 5 px starts blurry at
    // this size); a 3 dB gain cannot come from noise.
    assert!(after > before + 3.0, "PSNR {before:.2} → {after:.2} dB");
    assert!(ssim_after > ssim_before, "SSIM {ssim_before:.3} → {ssim_after:.3}");
}

#[test]
fn a_checkpoint_round_trip_continues_identically() {
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
    let mut whole = Fit::<Ad>::new(&picture, &config, &d).unwrap();
    let mut first = Fit::<Ad>::new(&picture, &config, &d).unwrap();
    for _ in 0..45 {
        whole.step(false).unwrap();
        first.step(false).unwrap();
    }
    let bytes = first.checkpoint().to_bytes();
    drop(first);
    let ckpt = vramfit::run::ArrayFile::from_bytes(&bytes, "mem").unwrap();
    let mut resumed = Fit::<Ad>::resume(&picture, &config, &ckpt, &d).unwrap();
    while !whole.finished() {
        whole.step(false).unwrap();
    }
    while !resumed.finished() {
        resumed.step(false).unwrap();
    }
    assert_eq!(whole.step_count(), resumed.step_count());
    assert_eq!(whole.gaussians(), resumed.gaussians());
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
        match fit.step(false) {
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
            f.step(false).unwrap();
        }
        f.gaussians()
    });
    let g = before.unwrap();
    assert!(
        g.xy.iter()
            .chain(&g.inv_scale)
            .chain(&g.theta)
            .chain(&g.color)
            .all(|v| v.is_finite())
    );
}
