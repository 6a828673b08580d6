//! Properties of the CPU twins: gradients against central finite
//! differences (in f64), top-K selection and binning against brute force.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vramfit_gauss::ssim::{ssim, ssim_and_backward, ssim_backward};
use vramfit_gauss::tile::TILE;
use vramfit_splat::cpu::project::{Frame, project_and_bin, project_one};
use vramfit_splat::cpu::render::{Splats, render, render_backward};
use vramfit_splat::cpu::top_k::select_top_k;
use vramfit_splat::params::{Param, Params};

struct Case {
    params: Params<Vec<f64>>,
    channels: usize,
}

impl Case {
    /// Rotated, anisotropic Gaussians clustered so that they overlap.
    fn random(rng: &mut ChaCha8Rng, n: usize, channels: usize) -> Self {
        let mut xy = Vec::new();
        let mut inv_scale = Vec::new();
        for _ in 0..n {
            xy.push(rng.random_range(0.25..0.75));
            xy.push(rng.random_range(0.25..0.75));
            inv_scale.push(1.0 / rng.random_range(1.5..5.0));
            inv_scale.push(1.0 / rng.random_range(1.5..5.0));
        }
        let theta = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        let color = (0..n * channels).map(|_| rng.random_range(-0.5..1.5)).collect();
        Self {
            params: Params {
                xy,
                inv_scale,
                theta,
                color,
            },
            channels,
        }
    }

    fn splats(&self) -> Splats<'_, f64> {
        Splats::new(&self.params, self.channels)
    }
}

/// Every pixel's selected Gaussian ids, leaving out weights too small to
/// move the output (exp underflow makes many exact zero-weight ties, and
/// swapping those changes nothing).
fn selections(case: &Case, frame: &Frame, top_k: usize) -> Vec<Vec<u32>> {
    let p = &case.params;
    let binned = project_and_bin(&p.xy, &p.inv_scale, &p.theta, frame);
    (0..frame.height)
        .flat_map(|y| (0..frame.width).map(move |x| (x, y)))
        .map(|(x, y)| {
            select_top_k(&binned, frame, top_k, x, y)
                .into_iter()
                .filter(|t| (-t.0).exp() > 1e-14)
                .map(|t| t.1)
                .collect()
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Checks every parameter's analytic gradient of `Σ d_out · render`
/// against a central difference; returns (coordinates checked, skipped
/// because they sit on a selection tie).
// The index loop perturbs `case` in place between renders: no iterator fits.
#[allow(clippy::needless_range_loop)]
fn check_render_gradients(frame: Frame, n: usize, channels: usize, top_k: usize, seed: u64) -> (usize, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut case = Case::random(&mut rng, n, channels);
    let d_out: Vec<f64> = (0..frame.width * frame.height * channels)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let g = render_backward(&case.splats(), &frame, top_k, &d_out);
    let analytic = g;
    let h = 1e-6;
    let (mut checked, mut skipped) = (0, 0);
    for which in Param::ALL {
        let name = which.name();
        for i in 0..case.params[which].len() {
            let orig = case.params[which][i];
            case.params[which][i] = orig + h;
            let plus = dot(&render(&case.splats(), &frame, top_k), &d_out);
            let sel_plus = selections(&case, &frame, top_k);
            case.params[which][i] = orig - h;
            let minus = dot(&render(&case.splats(), &frame, top_k), &d_out);
            let sel_minus = selections(&case, &frame, top_k);
            case.params[which][i] = orig;
            // Top-K blending jumps where the K-th and (K+1)-th weights tie:
            // a difference across such a jump measures the jump, not the slope.
            if sel_plus != sel_minus {
                skipped += 1;
                continue;
            }
            checked += 1;
            let numeric = (plus - minus) / (2.0 * h);
            let a = analytic[which][i];
            // f64 central differences at h = 1e-6 agree to ~1e-8 here; the
            // bound leaves room for the exp() curvature.
            assert!(
                (a - numeric).abs() <= 1e-6 + 1e-5 * numeric.abs(),
                "d_{name}[{i}]: analytic {a} vs finite difference {numeric} (seed {seed}, top_k {top_k})"
            );
        }
    }
    assert!(
        analytic.iter().flat_map(|(_, v)| v).any(|v| v.abs() > 1e-3),
        "gradients are all ~0: the case tests nothing"
    );
    (checked, skipped)
}

#[test]
fn render_gradients_match_finite_differences_all_blended() {
    // 37×23 is not a multiple of the tile size; K ≥ N blends everything.
    for seed in 0..4 {
        let (_, skipped) = check_render_gradients(Frame::new(37, 23), 7, 3, 32, seed);
        assert_eq!(skipped, 0, "with K ≥ N the selection never changes");
    }
}

#[test]
fn render_gradients_match_finite_differences_with_top_k_cut() {
    // K < N: the selection changes from pixel to pixel.
    let (mut checked, mut skipped) = (0, 0);
    for seed in 10..14 {
        let (c, s) = check_render_gradients(Frame::new(29, 31), 9, 2, 3, seed);
        checked += c;
        skipped += s;
    }
    // Seed 13 puts Gaussians 7 and 8 on a near-tie at one pixel: 7 of 252.
    assert!(
        skipped * 10 <= checked + skipped,
        "{skipped} of {} coordinates sit on a selection tie",
        checked + skipped
    );
}

#[test]
fn render_gradients_match_finite_differences_when_zoomed() {
    let frame = Frame {
        width: 40,
        height: 26,
        zoom_x: 1.25,
        zoom_y: 0.8,
    };
    check_render_gradients(frame, 6, 3, 4, 21);
}

#[test]
fn ssim_gradient_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (h, w, c) = (13, 17, 3);
    let y: Vec<f64> = (0..h * w * c).map(|_| rng.random_range(0.0..1.0)).collect();
    let mut x: Vec<f64> = y.iter().map(|v| v + rng.random_range(-0.3..0.3)).collect();
    let analytic = ssim_backward(&x, &y, h, w, c, 1.0);
    // The fused value and gradient are the separate ones.
    let (value, fused) = ssim_and_backward(&x, &y, h, w, c, 1.0);
    assert!((value - ssim(&x, &y, h, w, c)).abs() < 1e-12, "{value}");
    assert_eq!(fused, analytic);
    let step = 1e-6;
    for i in 0..x.len() {
        let orig = x[i];
        x[i] = orig + step;
        let plus = ssim(&x, &y, h, w, c);
        x[i] = orig - step;
        let minus = ssim(&x, &y, h, w, c);
        x[i] = orig;
        let numeric = (plus - minus) / (2.0 * step);
        assert!(
            (analytic[i] - numeric).abs() <= 1e-8 + 1e-5 * numeric.abs(),
            "d_x[{i}]: analytic {} vs finite difference {numeric}",
            analytic[i]
        );
    }
    assert!(analytic.iter().any(|v| v.abs() > 1e-4));
}

/// An image without pixels has no SSIM (NaN) and an empty gradient; no
/// blur or parallel split panics on it.
#[test]
fn ssim_of_an_empty_image_is_nan_without_a_panic() {
    for (h, w) in [(0, 7), (5, 0)] {
        let (value, gradient) = ssim_and_backward::<f32>(&[], &[], h, w, 3, 1.0);
        assert!(value.is_nan(), "{h}x{w}: {value}");
        assert!(gradient.is_empty());
        assert!(ssim::<f32>(&[], &[], h, w, 3).is_nan());
    }
}

#[test]
fn ssim_of_an_image_with_itself_is_one_and_drops_with_noise() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (h, w, c) = (20, 24, 3);
    let y: Vec<f64> = (0..h * w * c).map(|_| rng.random_range(0.0..1.0)).collect();
    assert!((ssim(&y, &y, h, w, c) - 1.0).abs() < 1e-12);
    // Noise with the variance of the signal itself: SSIM ≈ 2σ²/(σ² + 2σ²) ≈ 0.67.
    let x: Vec<f64> = y.iter().map(|v| v + rng.random_range(-0.5..0.5)).collect();
    let s = ssim(&x, &y, h, w, c);
    assert!((0.5..0.8).contains(&s), "{s}");
}

#[test]
fn top_k_selection_and_binning_match_brute_force() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let frame = Frame::new(53, 45);
    for round in 0..5 {
        let n = 40;
        let xy: Vec<f32> = (0..2 * n).map(|_| rng.random_range(-0.1..1.1)).collect();
        let inv_scale: Vec<f32> = (0..2 * n).map(|_| 1.0 / rng.random_range(0.5..12.0)).collect();
        let theta: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        // Two exact duplicates: equal weights everywhere, the lower index must win.
        let (mut xy, mut inv_scale, mut theta) = (xy, inv_scale, theta);
        for k in 0..2 {
            xy[2 * (n - 1 - k)] = xy[2 * k];
            xy[2 * (n - 1 - k) + 1] = xy[2 * k + 1];
            inv_scale[2 * (n - 1 - k)] = inv_scale[2 * k];
            inv_scale[2 * (n - 1 - k) + 1] = inv_scale[2 * k + 1];
            theta[n - 1 - k] = theta[k];
        }
        let binned = project_and_bin(&xy, &inv_scale, &theta, &frame);
        for ty in 0..frame.tiles_y() {
            for tx in 0..frame.tiles_x() {
                let expected: Vec<u32> = (0..n)
                    .filter(|&i| {
                        let p = project_one(
                            [xy[2 * i], xy[2 * i + 1]],
                            [inv_scale[2 * i], inv_scale[2 * i + 1]],
                            theta[i],
                            &frame,
                        );
                        let [x0, x1, y0, y1] = p.tiles;
                        (x0 as usize..x1 as usize).contains(&tx) && (y0 as usize..y1 as usize).contains(&ty)
                    })
                    .map(|i| i as u32)
                    .collect();
                assert_eq!(
                    binned.tile(ty * frame.tiles_x() + tx),
                    expected.as_slice(),
                    "tile ({tx}, {ty})"
                );
            }
        }
        for k in [1usize, 3, 10] {
            for y in 0..frame.height {
                for x in 0..frame.width {
                    let tile = (y / TILE) * frame.tiles_x() + x / TILE;
                    let (px, py) = (x as f32 + 0.5, y as f32 + 0.5);
                    let mut all: Vec<(f32, u32)> = binned
                        .tile(tile)
                        .iter()
                        .filter_map(|&id| {
                            let g = &binned.projected[id as usize];
                            let (dx, dy) = (g.cx - px, g.cy - py);
                            let s = 0.5 * g.a * dx * dx + 0.5 * g.c * dy * dy + g.b * dx * dy;
                            (s >= 0.0 && s.is_finite()).then_some((s, id))
                        })
                        .collect();
                    // Largest w = exp(−σ) first, i.e. smallest σ; ties: lower id.
                    all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    all.truncate(k);
                    let got = select_top_k(&binned, &frame, k, x, y);
                    assert_eq!(got, all, "round {round}, k {k}, pixel ({x}, {y})");
                }
            }
        }
    }
}
