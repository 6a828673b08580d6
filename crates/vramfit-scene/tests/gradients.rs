//! The CPU twin's backward against central finite differences in f64, on
//! small random scenes: SH colour alone (degrees 0–3), one Gaussian's
//! projection (inside the frustum and clamped far outside it), and whole
//! renders with overlap, a Gaussian behind the camera and Gaussians over
//! the image's edge.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vramfit_scene::cpu::camera::Camera;
use vramfit_scene::cpu::project::{Gaussian, ProjectedGrads, project, project_backward};
use vramfit_scene::cpu::render::{Scene, render, render_backward};
use vramfit_scene::cpu::sh::{coefficients, color, color_backward, direction, direction_backward};

const EPS: f64 = 1e-6;

/// Largest difference between `analytic` and `numeric`, relative to the
/// largest numeric value of the group (an absolute floor for all-zero groups).
fn error(analytic: &[f64], numeric: &[f64]) -> f64 {
    assert_eq!(analytic.len(), numeric.len());
    let scale = numeric.iter().fold(1e-9_f64, |m, v| m.max(v.abs()));
    analytic
        .iter()
        .zip(numeric)
        .map(|(a, n)| (a - n).abs() / scale)
        .fold(0.0, f64::max)
}

/// Central differences of `f` at `x` along each coordinate.
fn numeric(x: &[f64], mut f: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    let mut at = x.to_vec();
    (0..x.len())
        .map(|i| {
            at[i] = x[i] + EPS;
            let up = f(&at);
            at[i] = x[i] - EPS;
            let down = f(&at);
            at[i] = x[i];
            (up - down) / (2.0 * EPS)
        })
        .collect()
}

fn camera() -> Camera {
    Camera::look_at([0.3, -4.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0], 40, 28, 0.9)
}

#[test]
fn sh_colour_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for degree in 0..=3 {
        let rest_len = 3 * (coefficients(degree) - 1);
        // Degree-0 terms large enough that no channel is clamped at 0.
        let dc: Vec<f64> = (0..3).map(|_| rng.random_range(1.5..2.5)).collect();
        let rest: Vec<f64> = (0..rest_len).map(|_| rng.random_range(-0.3..0.3)).collect();
        let from = [0.1, -0.2, 0.3];
        let to: Vec<f64> = (0..3).map(|_| rng.random_range(-2.0..2.0)).collect();
        let w = [0.7, -1.1, 0.4];
        let loss = |dc: &[f64], rest: &[f64], to: &[f64]| {
            let (d, _) = direction(from, [to[0], to[1], to[2]]);
            let c = color(dc, rest, degree, d);
            (0..3).map(|i| w[i] * c[i]).sum::<f64>()
        };
        let (d, n) = direction(from, [to[0], to[1], to[2]]);
        let (mut g_dc, mut g_rest) = (vec![0.0; 3], vec![0.0; rest_len]);
        let g_dir = color_backward(&dc, &rest, degree, d, w, &mut g_dc, &mut g_rest);
        let g_to = direction_backward(d, n, g_dir);
        let e_dc = error(&g_dc, &numeric(&dc, |x| loss(x, &rest, &to)));
        let e_rest = error(&g_rest, &numeric(&rest, |x| loss(&dc, x, &to)));
        let e_to = error(&g_to, &numeric(&to, |x| loss(&dc, &rest, x)));
        assert!(
            e_dc < 1e-7 && e_rest < 1e-7 && e_to < 1e-6,
            "degree {degree}: {e_dc:e} {e_rest:e} {e_to:e}"
        );
    }
}

/// One Gaussian's parameters as one vector: mean, log scale, rotation,
/// opacity logit, SH dc, SH rest.
fn split(x: &[f64]) -> Gaussian<'_, f64> {
    Gaussian {
        mean: [x[0], x[1], x[2]],
        log_scale: [x[3], x[4], x[5]],
        rotation: [x[6], x[7], x[8], x[9]],
        opacity_logit: x[10],
        sh_dc: &x[11..14],
        sh_rest: &x[14..],
    }
}

#[test]
fn projection_backward_matches_finite_differences() {
    let cam = camera();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    // Inside the frustum, and far to the side (the Jacobian clamped; large
    // enough that its footprint still reaches the image).
    for (case, mean, log_scales) in [
        ("inside", [0.2, 0.1, -0.1], -2.5..-1.0),
        ("clamped", [6.0, 0.5, 0.3], 1.0..1.5),
    ] {
        for degree in 0..=3 {
            let rest_len = 3 * (coefficients(degree) - 1);
            let mut x: Vec<f64> = mean.to_vec();
            x.extend((0..3).map(|_| rng.random_range(log_scales.clone())));
            x.extend((0..4).map(|_| rng.random_range(-1.0..1.0)));
            x.push(rng.random_range(-1.0..1.0));
            x.extend((0..3).map(|_| rng.random_range(1.5..2.5)));
            x.extend((0..rest_len).map(|_| rng.random_range(-0.3..0.3)));
            let w = ProjectedGrads {
                mean: [0.3, -0.7],
                conic: [1.3, -0.4, 0.9],
                opacity: 0.8,
                color: [0.5, -0.6, 0.2],
            };
            let loss = |x: &[f64]| {
                let p = project(&split(x), degree, &cam).expect("drawn");
                w.mean[0] * p.mean[0]
                    + w.mean[1] * p.mean[1]
                    + (0..3)
                        .map(|i| w.conic[i] * p.conic[i] + w.color[i] * p.color[i])
                        .sum::<f64>()
                    + w.opacity * p.opacity
            };
            if case == "clamped" {
                let p = project(&split(&x), degree, &cam).expect("a large Gaussian off to the side is drawn");
                assert!(p.mean[0] > cam.width as f64, "off the image: {:?}", p.mean);
            }
            let (mut g_dc, mut g_rest) = (vec![0.0; 3], vec![0.0; rest_len]);
            let g = project_backward(&split(&x), degree, &cam, &w, &mut g_dc, &mut g_rest);
            let mut analytic: Vec<f64> = g.mean.to_vec();
            analytic.extend(g.log_scale);
            analytic.extend(g.rotation);
            analytic.push(g.opacity_logit);
            analytic.extend(g_dc);
            analytic.extend(g_rest);
            let num = numeric(&x, loss);
            for (name, range) in [
                ("mean", 0..3),
                ("log_scale", 3..6),
                ("rotation", 6..10),
                ("opacity", 10..11),
                ("sh", 11..x.len()),
            ] {
                let e = error(&analytic[range.clone()], &num[range.clone()]);
                assert!(
                    e < 1e-5,
                    "{case}, degree {degree}, {name}: {e:e}\n{:?}\n{:?}",
                    &analytic[range.clone()],
                    &num[range]
                );
            }
        }
    }
}

/// A random scene of `n` Gaussians around the origin, one of them behind
/// the camera, two over the image's edges, and one nearly opaque (its α
/// clamped at 0.99 near its centre).
fn scene_params(rng: &mut ChaCha8Rng, n: usize, degree: usize) -> Vec<Vec<f64>> {
    let rest = 3 * (coefficients(degree) - 1);
    let mut means: Vec<f64> = (0..3 * n).map(|_| rng.random_range(-0.9..0.9)).collect();
    // Behind the camera (it sits at y = −4 looking along +y).
    means[0..3].copy_from_slice(&[0.0, -6.0, 1.0]);
    // Over the left and right edges.
    means[3..6].copy_from_slice(&[-1.9, 0.0, 0.0]);
    means[6..9].copy_from_slice(&[1.95, 0.3, 0.2]);
    // Nearly opaque and wide, in the middle: several pixel centres see α = 0.99.
    means[9..12].copy_from_slice(&[0.05, 0.0, 0.05]);
    let mut opacity: Vec<f64> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
    opacity[3] = 6.0;
    let mut log_scales: Vec<f64> = (0..3 * n).map(|_| rng.random_range(-2.2..-1.2)).collect();
    log_scales[9..12].copy_from_slice(&[-0.6, -0.5, -0.55]);
    vec![
        means,
        log_scales,
        (0..4 * n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        opacity,
        (0..3 * n).map(|_| rng.random_range(1.5..2.5)).collect(),
        (0..rest * n).map(|_| rng.random_range(-0.3..0.3)).collect(),
    ]
}

fn scene(p: &[Vec<f64>], degree: usize) -> Scene<'_, f64> {
    Scene {
        means: &p[0],
        log_scales: &p[1],
        rotations: &p[2],
        opacity_logits: &p[3],
        sh_dc: &p[4],
        sh_rest: &p[5],
        degree,
    }
}

#[test]
fn render_backward_matches_finite_differences() {
    let cam = camera();
    let background = [0.2, 0.1, 0.3];
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for degree in 0..=3 {
        let params = scene_params(&mut rng, 9, degree);
        let weights: Vec<f64> = (0..3 * cam.width * cam.height)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let loss = |p: &[Vec<f64>]| -> f64 {
            let r = render(&scene(p, degree), &cam, background);
            r.image.iter().zip(&weights).map(|(v, w)| v * w).sum()
        };
        let rendered = render(&scene(&params, degree), &cam, background);
        assert!(
            rendered.projected[0].is_none(),
            "the Gaussian behind the camera is not drawn"
        );
        assert!(rendered.bins.intersections() > 9, "the Gaussians overlap tiles");
        let grads = render_backward(&scene(&params, degree), &cam, background, &rendered, &weights);
        let analytic = grads.groups();
        let names = ["means", "log_scales", "rotations", "opacity_logits", "sh_dc", "sh_rest"];
        for (group, name) in names.iter().enumerate() {
            let num = numeric(&params[group], |x| {
                let mut p = params.clone();
                p[group] = x.to_vec();
                loss(&p)
            });
            let e = error(analytic[group], &num);
            assert!(
                e < 1e-5,
                "degree {degree}, {name}: {e:e}\n{:?}\n{:?}",
                analytic[group],
                num
            );
        }
        assert!(
            grads.means[0..3].iter().all(|g| *g == 0.0),
            "nothing flows to a Gaussian not drawn"
        );
    }
}

#[test]
fn one_gaussian_composites_over_the_background_as_the_formula_says() {
    let cam = camera();
    // A round Gaussian at the point the camera looks at, degree 0, grey.
    let dc = (0.6 - 0.5) / 0.282_094_791_773_878_14;
    let p = vec![
        vec![0.0, 0.0, 0.0],
        vec![(0.3f64).ln(); 3],
        vec![1.0, 0.0, 0.0, 0.0],
        vec![0.0],
        vec![dc; 3],
        vec![],
    ];
    let bg = [0.2, 0.1, 0.3];
    let r = render(&scene(&p, 0), &cam, bg);
    let g = r.projected[0].expect("drawn");
    assert!((g.opacity - 0.5).abs() < 1e-12 && g.color.iter().all(|c| (c - 0.6).abs() < 1e-12));
    for (x, y) in [(20, 14), (23, 12), (5, 5)] {
        let d = [g.mean[0] - (x as f64 + 0.5), g.mean[1] - (y as f64 + 0.5)];
        let power = -0.5 * (g.conic[0] * d[0] * d[0] + g.conic[2] * d[1] * d[1]) - g.conic[1] * d[0] * d[1];
        let alpha = 0.5 * power.exp();
        let alpha = if alpha < 1.0 / 255.0 { 0.0 } else { alpha };
        for (ch, bg_ch) in bg.iter().enumerate() {
            let want = alpha * 0.6 + (1.0 - alpha) * bg_ch;
            let got = r.image[3 * (y * cam.width + x) + ch];
            assert!(
                (got - want).abs() < 1e-12,
                "pixel ({x}, {y}) channel {ch}: {got} vs {want}"
            );
        }
    }
    // An empty scene is the background.
    let empty = vec![vec![]; 6];
    let r = render(&scene(&empty, 0), &cam, bg);
    assert!(r.image.chunks(3).all(|px| px == bg));
}
