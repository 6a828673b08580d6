//! Fitting the built-in scene on the CPU twin: the held-out PSNR rises
//! through training, and a fit is deterministic.

use vramfit_scene::fit::{Fit, Settings};
use vramfit_scene::synthetic::{SKY, Spec, dataset};

fn small() -> Spec {
    Spec {
        views: 17,
        width: 48,
        height: 36,
        points: 600,
        ..Spec::default()
    }
}

fn settings(steps: u64) -> Settings {
    Settings {
        steps,
        sh_every: steps / 4,
        background: SKY.map(|v| v as f32),
        ..Settings::default()
    }
}

#[test]
fn held_out_psnr_rises_through_training() {
    let data = dataset(&small());
    let steps = 400;
    let mut fit = Fit::new(data, settings(steps)).unwrap();
    let start = fit.held_out_psnr().unwrap();
    let mut curve = vec![(0, start)];
    let mut losses = Vec::new();
    for s in 1..=steps {
        losses.push(fit.step().unwrap());
        if s % 100 == 0 {
            curve.push((s, fit.held_out_psnr().unwrap()));
        }
    }
    eprintln!("held-out PSNR by step: {curve:?}");
    let first: f32 = losses[..20].iter().sum::<f32>() / 20.0;
    let last: f32 = losses[losses.len() - 20..].iter().sum::<f32>() / 20.0;
    eprintln!("loss: first 20 steps {first:.4}, last 20 {last:.4}");
    let end = curve.last().unwrap().1;
    assert!(end > start + 1.0, "held-out PSNR {start:.2} → {end:.2} dB");
    assert!(last < first, "the loss falls: {first} → {last}");
}

#[test]
fn a_fit_is_deterministic() {
    let data = dataset(&Spec {
        views: 9,
        width: 24,
        height: 16,
        points: 80,
        ..Spec::default()
    });
    let run = || {
        let mut fit = Fit::new(data.clone(), settings(20)).unwrap();
        let losses: Vec<f32> = (0..20).map(|_| fit.step().unwrap()).collect();
        let params = fit.params().unwrap().clone();
        (losses, params)
    };
    assert_eq!(run(), run());
}

#[test]
fn densification_grows_to_the_cap_and_never_past_it() {
    let data = dataset(&Spec {
        views: 9,
        width: 32,
        height: 24,
        points: 120,
        ..Spec::default()
    });
    let cap = 157;
    let mut s = settings(60);
    s.densify = vramfit_scene::densify::Densify {
        from: 5,
        until: 100,
        every: 5,
        // Every drawn Gaussian is a candidate: only the cap holds the count.
        grad_threshold: 1e-12,
        reset_every: 0,
        max_gaussians: cap,
        ..Default::default()
    };
    let mut fit = Fit::new(data.clone(), s.clone()).unwrap();
    let mut most = 0;
    for _ in 0..60 {
        fit.step().unwrap();
        let n = fit.len();
        most = most.max(n);
        assert!(n <= cap, "{n} Gaussians past the cap of {cap}");
        let p = fit.params().unwrap();
        assert_eq!(
            [
                p.means.len(),
                p.log_scales.len(),
                p.rotations.len(),
                p.sh_dc.len(),
                p.sh_rest.len()
            ],
            [3 * n, 3 * n, 4 * n, 3 * n, 45 * n],
            "every group the same Gaussians"
        );
    }
    let d = fit.densified;
    eprintln!(
        "most {most}; cloned {}, split {}, pruned {}, left out at the cap {}",
        d.cloned, d.split, d.pruned, d.capped
    );
    assert_eq!(most, cap, "grew to the cap");
    assert!(d.capped > 0 && d.cloned + d.split >= cap - 120);

    // A cap below the sparse points seeds an evenly spaced subset.
    s.densify.max_gaussians = 50;
    assert_eq!(Fit::new(data, s).unwrap().len(), 50);
}

/// The built-in scene written as a COLMAP dataset (`vramfit sample scene`)
/// and read back trains as the built-in one does: the same cameras and
/// points, the images rounded to 8 bits, the same held-out PSNR to within
/// what that rounding moves.
#[test]
fn the_builtin_scene_written_as_colmap_trains_the_same() {
    let data = dataset(&small());
    let dir = tempfile::tempdir().unwrap();
    vramfit_scene::colmap::write(dir.path(), &data).unwrap();
    let read = vramfit_scene::colmap::read(dir.path()).unwrap();
    assert_eq!(read.views.len(), data.views.len());
    assert_eq!(read.split(), data.split());
    let steps = 200;
    let run = |d| {
        let mut fit = Fit::new(d, settings(steps)).unwrap();
        for _ in 0..steps {
            fit.step().unwrap();
        }
        (fit.held_out_psnr().unwrap(), fit.len())
    };
    let (a, b) = (run(data), run(read));
    eprintln!("held-out PSNR: built-in {:.4} dB, written and read {:.4} dB", a.0, b.0);
    assert_eq!(a.1, b.1, "the same Gaussians");
    assert!((a.0 - b.0).abs() < 0.05, "built-in {a:?}, COLMAP copy {b:?}");
}
