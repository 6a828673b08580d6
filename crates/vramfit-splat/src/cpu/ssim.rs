//! SSIM with an 11-tap separable Gaussian window (σ = 1.5), zero padding,
//! C1 = 0.01², C2 = 0.03², averaged over pixels and channels; and its
//! gradient with respect to the first image, recomputing the local
//! statistics instead of keeping derivative maps.

use rayon::prelude::*;

use super::Real;

/// Taps of the Gaussian window (the GPU kernels use this one).
pub const TAPS: usize = 11;
const SIGMA: f64 = 1.5;
pub(crate) const C1: f64 = 0.01 * 0.01;
pub(crate) const C2: f64 = 0.03 * 0.03;

fn window<F: Real>() -> [F; TAPS] {
    let mut k = [0.0f64; TAPS];
    let half = (TAPS / 2) as f64;
    for (i, v) in k.iter_mut().enumerate() {
        let d = i as f64 - half;
        *v = (-d * d / (2.0 * SIGMA * SIGMA)).exp();
    }
    let total: f64 = k.iter().sum();
    k.map(|v| F::c(v / total))
}

/// The window in f32, for the GPU kernels.
pub fn window_f32() -> [f32; TAPS] {
    window::<f32>()
}

/// Zero-padded "same" Gaussian blur of one `[H, W]` plane. The window is
/// symmetric, so this operator is its own transpose (the backward uses it
/// that way). Both passes are axpy loops over whole rows, which vectorise.
fn blur<F: Real>(plane: &[F], h: usize, w: usize) -> Vec<F> {
    let k = window::<F>();
    let r = TAPS / 2;
    // Blocks of rows per task: single rows are too small for a task each.
    let rows = (1 << 16) / w.max(1) + 1;
    let mut tmp = vec![F::zero(); h * w];
    tmp.par_chunks_mut(rows * w).enumerate().for_each(|(block, out)| {
        let mut padded = vec![F::zero(); w + 2 * r];
        for (i, row) in out.chunks_mut(w).enumerate() {
            let y = block * rows + i;
            padded[r..r + w].copy_from_slice(&plane[y * w..(y + 1) * w]);
            for (j, kv) in k.iter().enumerate() {
                for (o, v) in row.iter_mut().zip(&padded[j..j + w]) {
                    *o = *o + *kv * *v;
                }
            }
        }
    });
    let mut out = vec![F::zero(); h * w];
    out.par_chunks_mut(rows * w).enumerate().for_each(|(block, out)| {
        for (i, row) in out.chunks_mut(w).enumerate() {
            let y = block * rows + i;
            for src in y.saturating_sub(r)..(y + r + 1).min(h) {
                let kv = k[src + r - y];
                for (o, v) in row.iter_mut().zip(&tmp[src * w..(src + 1) * w]) {
                    *o = *o + kv * *v;
                }
            }
        }
    });
    out
}

/// Local statistics of one channel: `[μx, μy, E[x²], E[y²], E[xy]]` planes.
fn stats<F: Real>(x: &[F], y: &[F], h: usize, w: usize, c: usize, ch: usize) -> [Vec<F>; 5] {
    let px: Vec<F> = x.iter().skip(ch).step_by(c).copied().collect();
    let py: Vec<F> = y.iter().skip(ch).step_by(c).copied().collect();
    let prod = |a: &[F], b: &[F]| -> Vec<F> { a.iter().zip(b).map(|(p, q)| *p * *q).collect() };
    let (xx, yy, xy) = (prod(&px, &px), prod(&py, &py), prod(&px, &py));
    [
        blur(&px, h, w),
        blur(&py, h, w),
        blur(&xx, h, w),
        blur(&yy, h, w),
        blur(&xy, h, w),
    ]
}

/// SSIM terms `(A1, A2, B1, B2)` at pixel `i`: S = A1·A2 / (B1·B2).
#[inline]
fn terms<F: Real>(s: &[Vec<F>; 5], i: usize) -> (F, F, F, F) {
    let (mx, my, exx, eyy, exy) = (s[0][i], s[1][i], s[2][i], s[3][i], s[4][i]);
    let two = F::c(2.0);
    let a1 = two * mx * my + F::c(C1);
    let a2 = two * (exy - mx * my) + F::c(C2);
    let b1 = mx * mx + my * my + F::c(C1);
    let b2 = (exx - mx * mx) + (eyy - my * my) + F::c(C2);
    (a1, a2, b1, b2)
}

fn check(x: &[impl Sized], y: &[impl Sized], h: usize, w: usize, c: usize) {
    assert_eq!(x.len(), h * w * c, "x must be [H, W, C]");
    assert_eq!(y.len(), h * w * c, "y must be [H, W, C]");
}

/// Mean SSIM of `x` against `y`, both `[H, W, C]`.
pub fn ssim<F: Real>(x: &[F], y: &[F], h: usize, w: usize, c: usize) -> F {
    check(x, y, h, w, c);
    let mut total = 0.0f64;
    for ch in 0..c {
        let s = stats(x, y, h, w, c, ch);
        total += (0..h * w)
            .into_par_iter()
            .map(|i| {
                let (a1, a2, b1, b2) = terms(&s, i);
                (a1 * a2 / (b1 * b2)).to_f64().unwrap_or(f64::NAN)
            })
            .sum::<f64>();
    }
    F::c(total / (h * w * c) as f64)
}

/// Gradient of `d_ssim · ssim(x, y)` with respect to `x`, `[H, W, C]`.
pub fn ssim_backward<F: Real>(x: &[F], y: &[F], h: usize, w: usize, c: usize, d_ssim: F) -> Vec<F> {
    ssim_and_backward(x, y, h, w, c, d_ssim).1
}

/// Mean SSIM of `x` against `y` and the gradient of `d_ssim · ssim(x, y)`
/// with respect to `x`, from one computation of the local statistics (a
/// training step needs both; apart they blur every plane twice).
pub fn ssim_and_backward<F: Real>(x: &[F], y: &[F], h: usize, w: usize, c: usize, d_ssim: F) -> (F, Vec<F>) {
    check(x, y, h, w, c);
    let scale = d_ssim / F::c((h * w * c) as f64);
    let mut d_x = vec![F::zero(); h * w * c];
    let mut total = 0.0f64;
    for ch in 0..c {
        let s = stats(x, y, h, w, c, ch);
        // ∂S/∂μx, ∂S/∂E[x²], ∂S/∂E[xy] per pixel, scaled by the upstream
        // gradient, and S itself (summed below in pixel order).
        let coeffs: Vec<([F; 3], F)> = (0..h * w)
            .into_par_iter()
            .map(|i| {
                let (a1, a2, b1, b2) = terms(&s, i);
                let (mx, my) = (s[0][i], s[1][i]);
                let two = F::c(2.0);
                let den = b1 * b2;
                let sv = a1 * a2 / den;
                let d_mx = two * my * a2 / den - two * my * a1 / den - two * mx * sv / b1 + two * mx * sv / b2;
                ([scale * d_mx, scale * (-sv / b2), scale * (two * a1 / den)], sv)
            })
            .collect();
        total += coeffs.iter().map(|t| t.1.to_f64().unwrap_or(f64::NAN)).sum::<f64>();
        let g: Vec<Vec<F>> = (0..3)
            .map(|q| blur(&coeffs.iter().map(|t| t.0[q]).collect::<Vec<F>>(), h, w))
            .collect();
        for i in 0..h * w {
            let (xv, yv) = (x[i * c + ch], y[i * c + ch]);
            d_x[i * c + ch] = g[0][i] + F::c(2.0) * xv * g[1][i] + yv * g[2][i];
        }
    }
    (F::c(total / (h * w * c) as f64), d_x)
}
