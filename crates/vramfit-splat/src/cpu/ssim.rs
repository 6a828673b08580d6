//! SSIM with an 11-tap separable Gaussian window (σ = 1.5), zero padding,
//! C1 = 0.01², C2 = 0.03², averaged over pixels and channels; and its
//! gradient with respect to the first image, recomputing the local
//! statistics instead of keeping derivative maps.

use rayon::prelude::*;

use super::Real;

const TAPS: usize = 11;
const SIGMA: f64 = 1.5;
const C1: f64 = 0.01 * 0.01;
const C2: f64 = 0.03 * 0.03;

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

/// Zero-padded "same" Gaussian blur of one `[H, W]` plane. The window is
/// symmetric, so this operator is its own transpose (used by the backward).
fn blur<F: Real>(plane: &[F], h: usize, w: usize) -> Vec<F> {
    let k = window::<F>();
    let r = TAPS / 2;
    let mut tmp = vec![F::zero(); h * w];
    tmp.par_chunks_mut(w).enumerate().for_each(|(y, row)| {
        let src = &plane[y * w..(y + 1) * w];
        for (x, out) in row.iter_mut().enumerate() {
            let lo = x.saturating_sub(r);
            let hi = (x + r + 1).min(w);
            *out = (lo..hi).map(|j| k[j + r - x] * src[j]).sum();
        }
    });
    let mut out = vec![F::zero(); h * w];
    out.par_chunks_mut(w).enumerate().for_each(|(y, row)| {
        let lo = y.saturating_sub(r);
        let hi = (y + r + 1).min(h);
        for i in lo..hi {
            let kv = k[i + r - y];
            let src = &tmp[i * w..(i + 1) * w];
            for (o, s) in row.iter_mut().zip(src) {
                *o = *o + kv * *s;
            }
        }
    });
    out
}

/// Local statistics of one channel: means and second moments.
struct Stats<F> {
    mx: Vec<F>,
    my: Vec<F>,
    exx: Vec<F>,
    eyy: Vec<F>,
    exy: Vec<F>,
}

fn plane<F: Real>(img: &[F], c: usize, ch: usize, f: impl Fn(F) -> F + Sync) -> Vec<F> {
    img.par_iter().skip(ch).step_by(c).map(|&v| f(v)).collect()
}

fn stats<F: Real>(x: &[F], y: &[F], h: usize, w: usize, c: usize, ch: usize) -> (Vec<F>, Vec<F>, Stats<F>) {
    let px = plane(x, c, ch, |v| v);
    let py = plane(y, c, ch, |v| v);
    let sq = |a: &[F], b: &[F]| -> Vec<F> { a.par_iter().zip(b).map(|(p, q)| *p * *q).collect() };
    let s = Stats {
        mx: blur(&px, h, w),
        my: blur(&py, h, w),
        exx: blur(&sq(&px, &px), h, w),
        eyy: blur(&sq(&py, &py), h, w),
        exy: blur(&sq(&px, &py), h, w),
    };
    (px, py, s)
}

/// Per-pixel SSIM terms `(A1, A2, B1, B2)`.
fn terms<F: Real>(s: &Stats<F>, i: usize) -> (F, F, F, F) {
    let (mx, my) = (s.mx[i], s.my[i]);
    let two = F::c(2.0);
    let a1 = two * mx * my + F::c(C1);
    let a2 = two * (s.exy[i] - mx * my) + F::c(C2);
    let b1 = mx * mx + my * my + F::c(C1);
    let b2 = (s.exx[i] - mx * mx) + (s.eyy[i] - my * my) + F::c(C2);
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
        let (_, _, s) = stats(x, y, h, w, c, ch);
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
    check(x, y, h, w, c);
    let scale = d_ssim / F::c((h * w * c) as f64);
    let mut d_x = vec![F::zero(); h * w * c];
    for ch in 0..c {
        let (px, py, s) = stats(x, y, h, w, c, ch);
        // ∂S/∂μx, ∂S/∂E[x²], ∂S/∂E[xy] per pixel (S = A1·A2 / (B1·B2)).
        let coeffs: Vec<(F, F, F)> = (0..h * w)
            .into_par_iter()
            .map(|i| {
                let (a1, a2, b1, b2) = terms(&s, i);
                let (mx, my) = (s.mx[i], s.my[i]);
                let two = F::c(2.0);
                let den = b1 * b2;
                let sv = a1 * a2 / den;
                let d_mx = two * my * a2 / den - two * my * a1 / den - two * mx * sv / b1 + two * mx * sv / b2;
                let d_exx = -sv / b2;
                let d_exy = two * a1 / den;
                (scale * d_mx, scale * d_exx, scale * d_exy)
            })
            .collect();
        let g_m = blur(&coeffs.iter().map(|t| t.0).collect::<Vec<_>>(), h, w);
        let g_xx = blur(&coeffs.iter().map(|t| t.1).collect::<Vec<_>>(), h, w);
        let g_xy = blur(&coeffs.iter().map(|t| t.2).collect::<Vec<_>>(), h, w);
        for i in 0..h * w {
            d_x[i * c + ch] = g_m[i] + F::c(2.0) * px[i] * g_xx[i] + py[i] * g_xy[i];
        }
    }
    d_x
}
