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

/// Zero-padded "same" Gaussian blur of one `[H, W]` plane into `out`,
/// with `tmp` (`H·W`) as scratch; both are overwritten, not accumulated
/// into. The window is symmetric, so this operator is its own transpose
/// (the backward uses it that way). Both passes are axpy loops over whole
/// rows, which vectorise.
fn blur_into<F: Real>(plane: &[F], h: usize, w: usize, tmp: &mut [F], out: &mut [F]) {
    let k = window::<F>();
    let r = TAPS / 2;
    // Blocks of rows per task: single rows are too small for a task each.
    let rows = (1 << 16) / w.max(1) + 1;
    tmp.par_chunks_mut(rows * w).enumerate().for_each(|(block, out)| {
        let mut padded = vec![F::zero(); w + 2 * r];
        for (i, row) in out.chunks_mut(w).enumerate() {
            let y = block * rows + i;
            padded[r..r + w].copy_from_slice(&plane[y * w..(y + 1) * w]);
            row.fill(F::zero());
            for (j, kv) in k.iter().enumerate() {
                for (o, v) in row.iter_mut().zip(&padded[j..j + w]) {
                    *o = *o + *kv * *v;
                }
            }
        }
    });
    let tmp = &*tmp;
    out.par_chunks_mut(rows * w).enumerate().for_each(|(block, out)| {
        for (i, row) in out.chunks_mut(w).enumerate() {
            let y = block * rows + i;
            row.fill(F::zero());
            for src in y.saturating_sub(r)..(y + r + 1).min(h) {
                let kv = k[src + r - y];
                for (o, v) in row.iter_mut().zip(&tmp[src * w..(src + 1) * w]) {
                    *o = *o + kv * *v;
                }
            }
        }
    });
}

/// One channel of an `[H, W, C]` image as an `[H, W]` plane.
fn plane<F: Real>(image: &[F], c: usize, ch: usize) -> Vec<F> {
    image.iter().skip(ch).step_by(c).copied().collect()
}

/// The reference image's side of SSIM, which a fit compares every render
/// with: per channel its local mean μy and E[y²]. Computed once (two of
/// the eight blurs per channel of a training step); twice the image's
/// size.
#[derive(Debug, Clone)]
pub struct SsimReference<F> {
    h: usize,
    w: usize,
    c: usize,
    /// Per channel: `[μy, E[y²]]` planes.
    planes: Vec<[Vec<F>; 2]>,
}

impl<F: Real> SsimReference<F> {
    /// The reference `y`, `[H, W, C]`.
    pub fn new(y: &[F], h: usize, w: usize, c: usize) -> Self {
        assert_eq!(y.len(), h * w * c, "y must be [H, W, C]");
        let mut tmp = vec![F::zero(); h * w];
        let planes = (0..c)
            .map(|ch| {
                let py = plane(y, c, ch);
                let yy: Vec<F> = py.iter().map(|v| *v * *v).collect();
                let (mut my, mut eyy) = (vec![F::zero(); h * w], vec![F::zero(); h * w]);
                blur_into(&py, h, w, &mut tmp, &mut my);
                blur_into(&yy, h, w, &mut tmp, &mut eyy);
                [my, eyy]
            })
            .collect();
        Self { h, w, c, planes }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        (2 * self.h * self.w * self.c * std::mem::size_of::<F>()) as u64
    }
}

/// Local statistics of one channel, `[μx, μy, E[x²], E[y²], E[xy]]`,
/// the x side blurred into `stats`' buffers (reused between channels).
struct Stats<F> {
    mx: Vec<F>,
    exx: Vec<F>,
    exy: Vec<F>,
    tmp: Vec<F>,
    px: Vec<F>,
    py: Vec<F>,
    prod: Vec<F>,
}

impl<F: Real> Stats<F> {
    fn new(n: usize) -> Self {
        let z = || vec![F::zero(); n];
        Self {
            mx: z(),
            exx: z(),
            exy: z(),
            tmp: z(),
            px: z(),
            py: z(),
            prod: z(),
        }
    }

    /// Fills the x statistics of channel `ch` against `y` and its reference.
    fn compute(&mut self, x: &[F], y: &[F], reference: &SsimReference<F>, ch: usize) {
        let (h, w, c) = (reference.h, reference.w, reference.c);
        for (d, v) in self.px.iter_mut().zip(x.iter().skip(ch).step_by(c)) {
            *d = *v;
        }
        for (d, v) in self.py.iter_mut().zip(y.iter().skip(ch).step_by(c)) {
            *d = *v;
        }
        let py = &self.py;
        blur_into(&self.px, h, w, &mut self.tmp, &mut self.mx);
        for (d, v) in self.prod.iter_mut().zip(&self.px) {
            *d = *v * *v;
        }
        blur_into(&self.prod, h, w, &mut self.tmp, &mut self.exx);
        for ((d, a), b) in self.prod.iter_mut().zip(&self.px).zip(py) {
            *d = *a * *b;
        }
        blur_into(&self.prod, h, w, &mut self.tmp, &mut self.exy);
    }

    /// SSIM terms `(A1, A2, B1, B2)` at pixel `i`: S = A1·A2 / (B1·B2).
    #[inline]
    fn terms(&self, reference: &[Vec<F>; 2], i: usize) -> (F, F, F, F) {
        let (mx, my, exx, eyy, exy) = (self.mx[i], reference[0][i], self.exx[i], reference[1][i], self.exy[i]);
        let two = F::c(2.0);
        let a1 = two * mx * my + F::c(C1);
        let a2 = two * (exy - mx * my) + F::c(C2);
        let b1 = mx * mx + my * my + F::c(C1);
        let b2 = (exx - mx * mx) + (eyy - my * my) + F::c(C2);
        (a1, a2, b1, b2)
    }
}

fn check(x: &[impl Sized], y: &[impl Sized], h: usize, w: usize, c: usize) {
    assert_eq!(x.len(), h * w * c, "x must be [H, W, C]");
    assert_eq!(y.len(), h * w * c, "y must be [H, W, C]");
}

/// Mean SSIM of `x` against `y`, both `[H, W, C]`.
pub fn ssim<F: Real>(x: &[F], y: &[F], h: usize, w: usize, c: usize) -> F {
    check(x, y, h, w, c);
    ssim_against(x, y, &SsimReference::new(y, h, w, c))
}

/// Mean SSIM of `x` against `y`, whose reference side is prepared.
pub fn ssim_against<F: Real>(x: &[F], y: &[F], reference: &SsimReference<F>) -> F {
    let (h, w, c) = (reference.h, reference.w, reference.c);
    check(x, y, h, w, c);
    let mut stats = Stats::new(h * w);
    let mut total = 0.0f64;
    for ch in 0..c {
        stats.compute(x, y, reference, ch);
        let r = &reference.planes[ch];
        total += (0..h * w)
            .into_par_iter()
            .map(|i| {
                let (a1, a2, b1, b2) = stats.terms(r, i);
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
    ssim_and_backward_against(x, y, &SsimReference::new(y, h, w, c), d_ssim)
}

/// [`ssim_and_backward`] against `y`, whose reference side is prepared.
pub fn ssim_and_backward_against<F: Real>(x: &[F], y: &[F], reference: &SsimReference<F>, d_ssim: F) -> (F, Vec<F>) {
    let (h, w, c) = (reference.h, reference.w, reference.c);
    check(x, y, h, w, c);
    let n = h * w;
    let scale = d_ssim / F::c((n * c) as f64);
    let mut d_x = vec![F::zero(); n * c];
    let mut total = 0.0f64;
    let mut stats = Stats::new(n);
    let mut coeffs = [vec![F::zero(); n], vec![F::zero(); n], vec![F::zero(); n]];
    let mut g = [vec![F::zero(); n], vec![F::zero(); n], vec![F::zero(); n]];
    let mut sv = vec![F::zero(); n];
    for ch in 0..c {
        stats.compute(x, y, reference, ch);
        let r = &reference.planes[ch];
        // ∂S/∂μx, ∂S/∂E[x²], ∂S/∂E[xy] per pixel, scaled by the upstream
        // gradient, and S itself (summed below in pixel order).
        let [c0, c1, c2] = &mut coeffs;
        c0.par_iter_mut()
            .zip(c1.par_iter_mut())
            .zip(c2.par_iter_mut())
            .zip(sv.par_iter_mut())
            .enumerate()
            .for_each(|(i, (((d0, d1), d2), s))| {
                let (a1, a2, b1, b2) = stats.terms(r, i);
                let (mx, my) = (stats.mx[i], r[0][i]);
                let two = F::c(2.0);
                let den = b1 * b2;
                let v = a1 * a2 / den;
                let d_mx = two * my * a2 / den - two * my * a1 / den - two * mx * v / b1 + two * mx * v / b2;
                *d0 = scale * d_mx;
                *d1 = scale * (-v / b2);
                *d2 = scale * (two * a1 / den);
                *s = v;
            });
        total += sv.iter().map(|v| v.to_f64().unwrap_or(f64::NAN)).sum::<f64>();
        for (cq, gq) in coeffs.iter().zip(g.iter_mut()) {
            blur_into(cq, h, w, &mut stats.tmp, gq);
        }
        for i in 0..n {
            d_x[i * c + ch] = g[0][i] + F::c(2.0) * stats.px[i] * g[1][i] + stats.py[i] * g[2][i];
        }
    }
    (F::c(total / (n * c) as f64), d_x)
}
