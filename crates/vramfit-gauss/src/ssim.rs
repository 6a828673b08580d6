//! SSIM with an 11-tap separable Gaussian window (σ = 1.5), zero padding,
//! C1 = 0.01², C2 = 0.03², averaged over pixels and channels; and its
//! gradient with respect to the first image, recomputing the local
//! statistics instead of keeping derivative maps.

use rayon::prelude::*;

use crate::{Real, wide};

/// Taps of the Gaussian window (the GPU kernels use this one).
pub const TAPS: usize = 11;
const SIGMA: f64 = 1.5;
pub const C1: f64 = 0.01 * 0.01;
pub const C2: f64 = 0.03 * 0.03;

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

/// Output columns summed together: their sums stay in registers while the
/// taps are added, instead of each tap reading and writing the whole row.
const LANES: usize = 16;

/// `out[i] = Σ_j k[j]·rows[j][i]` for each output column, the taps added in
/// order from zero (so the sums are those of one axpy per tap). On x86-64
/// with AVX2 the same code is compiled eight lanes wide (the default
/// target has four): the same operations in the same order, so the same
/// sums, bit for bit.
#[inline]
fn weighted_rows<F: Real>(rows: &[(F, &[F])], out: &mut [F]) {
    wide(
        #[inline(always)]
        || weighted_rows_any(rows, out),
    );
}

#[inline(always)]
fn weighted_rows_any<F: Real>(rows: &[(F, &[F])], out: &mut [F]) {
    let mut blocks = out.chunks_exact_mut(LANES);
    let mut start = 0;
    for block in &mut blocks {
        let mut acc = [F::zero(); LANES];
        for (kv, row) in rows {
            let src: &[F; LANES] = row[start..start + LANES].try_into().expect("a block of LANES");
            for (a, v) in acc.iter_mut().zip(src) {
                *a = *a + *kv * *v;
            }
        }
        let block: &mut [F; LANES] = block.try_into().expect("a block of LANES");
        *block = acc;
        start += LANES;
    }
    for (i, o) in blocks.into_remainder().iter_mut().enumerate() {
        *o = rows.iter().fold(F::zero(), |a, (kv, row)| a + *kv * row[start + i]);
    }
}

/// Rows of a plane per parallel task: single rows are too small a task.
fn rows_per_task(w: usize) -> usize {
    (1 << 16) / w.max(1) + 1
}

/// Zero-padded "same" Gaussian blur of an `[H, W]` plane into `out`, with
/// `tmp` (`H·W`) as scratch; both are overwritten, not accumulated into.
/// `row_of(y, dst)` writes the plane's row `y` into `dst` (`W` long), so
/// a plane that is a channel of an image or a product of two is never
/// stored. The window is symmetric, so this operator is its own transpose
/// (the backward uses it that way). Both passes sum a block of output
/// columns over the taps in registers ([`weighted_rows`]).
fn blur_rows<F: Real>(h: usize, w: usize, row_of: impl Fn(usize, &mut [F]) + Sync, tmp: &mut [F], out: &mut [F]) {
    if h * w == 0 {
        return;
    }
    let k = window::<F>();
    let r = TAPS / 2;
    let rows = rows_per_task(w);
    tmp.par_chunks_mut(rows * w).enumerate().for_each(|(block, out)| {
        let mut padded = vec![F::zero(); w + 2 * r];
        for (i, row) in out.chunks_mut(w).enumerate() {
            row_of(block * rows + i, &mut padded[r..r + w]);
            let taps: [(F, &[F]); TAPS] = std::array::from_fn(|j| (k[j], &padded[j..j + w]));
            weighted_rows(&taps, row);
        }
    });
    let tmp = &*tmp;
    out.par_chunks_mut(rows * w).enumerate().for_each(|(block, out)| {
        let mut taps = Vec::with_capacity(TAPS);
        for (i, row) in out.chunks_mut(w).enumerate() {
            let y = block * rows + i;
            taps.clear();
            taps.extend(
                (y.saturating_sub(r)..(y + r + 1).min(h)).map(|src| (k[src + r - y], &tmp[src * w..(src + 1) * w])),
            );
            weighted_rows(&taps, row);
        }
    });
}

/// [`blur_rows`] of a stored `[H, W]` plane.
fn blur_into<F: Real>(plane: &[F], h: usize, w: usize, tmp: &mut [F], out: &mut [F]) {
    blur_rows(h, w, |y, dst| dst.copy_from_slice(&plane[y * w..(y + 1) * w]), tmp, out);
}

/// Writes `f(x, y)` of channel `ch`'s row `row` of two `[H, W, C]` images into `dst`.
#[inline]
fn channel_row<F: Real>(x: &[F], y: &[F], c: usize, ch: usize, row: usize, dst: &mut [F], f: impl Fn(F, F) -> F) {
    let w = dst.len();
    let (x, y) = (&x[row * w * c..(row + 1) * w * c], &y[row * w * c..(row + 1) * w * c]);
    for ((d, xv), yv) in dst
        .iter_mut()
        .zip(x.iter().skip(ch).step_by(c))
        .zip(y.iter().skip(ch).step_by(c))
    {
        *d = f(*xv, *yv);
    }
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

/// Local statistics of one channel's x side, `[μx, E[x²], E[xy]]`, and a
/// blur's scratch plane: buffers reused between channels.
#[derive(Debug, Default)]
struct Stats<F> {
    mx: Vec<F>,
    exx: Vec<F>,
    exy: Vec<F>,
    tmp: Vec<F>,
}

impl<F: Real> Stats<F> {
    /// Fills the x statistics of channel `ch` against `y` (`[H, W, C]`).
    fn compute(&mut self, x: &[F], y: &[F], reference: &SsimReference<F>, ch: usize) {
        let (h, w, c) = (reference.h, reference.w, reference.c);
        blur_rows(
            h,
            w,
            |r, d| channel_row(x, y, c, ch, r, d, |a, _| a),
            &mut self.tmp,
            &mut self.mx,
        );
        blur_rows(
            h,
            w,
            |r, d| channel_row(x, y, c, ch, r, d, |a, _| a * a),
            &mut self.tmp,
            &mut self.exx,
        );
        blur_rows(
            h,
            w,
            |r, d| channel_row(x, y, c, ch, r, d, |a, b| a * b),
            &mut self.tmp,
            &mut self.exy,
        );
    }

    /// SSIM terms `(A1, A2, B1, B2)` at pixel `i`: S = A1·A2 / (B1·B2).
    #[inline]
    fn terms(&self, reference: &[Vec<F>; 2], i: usize) -> (F, F, F, F) {
        terms(self.mx[i], reference[0][i], self.exx[i], reference[1][i], self.exy[i])
    }
}

/// SSIM terms `(A1, A2, B1, B2)` from the local statistics: S = A1·A2 / (B1·B2).
#[inline]
fn terms<F: Real>(mx: F, my: F, exx: F, eyy: F, exy: F) -> (F, F, F, F) {
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
    ssim_against(x, y, &SsimReference::new(y, h, w, c))
}

/// Mean SSIM of `x` against `y`, whose reference side is prepared.
pub fn ssim_against<F: Real>(x: &[F], y: &[F], reference: &SsimReference<F>) -> F {
    ssim_against_in(x, y, reference, &mut SsimWorkspace::default())
}

/// [`ssim_against`] in a workspace's statistics planes (the gradient the
/// workspace holds is left as it is).
pub fn ssim_against_in<F: Real>(x: &[F], y: &[F], reference: &SsimReference<F>, workspace: &mut SsimWorkspace<F>) -> F {
    let (h, w, c) = (reference.h, reference.w, reference.c);
    check(x, y, h, w, c);
    let n = h * w;
    workspace.fit_stats(n);
    let stats = &mut workspace.stats;
    // Summed per fixed task, then the tasks in order: the same sum
    // whatever the thread count (rayon's `sum` splits by the pool).
    let task = rows_per_task(w) * w.max(1);
    let mut total = 0.0f64;
    for ch in 0..c {
        stats.compute(x, y, reference, ch);
        let r = &reference.planes[ch];
        let stats = &*stats;
        let sums: Vec<f64> = (0..n.div_ceil(task))
            .into_par_iter()
            .map(|t| {
                (t * task..((t + 1) * task).min(n))
                    .map(|i| {
                        let (a1, a2, b1, b2) = stats.terms(r, i);
                        (a1 * a2 / (b1 * b2)).to_f64().unwrap_or(f64::NAN)
                    })
                    .sum::<f64>()
            })
            .collect();
        total += sums.iter().sum::<f64>();
    }
    F::c(total / (n * c) as f64)
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
    let mut workspace = SsimWorkspace::default();
    let value = ssim_and_backward_into(x, y, reference, d_ssim, &mut workspace);
    (value, workspace.d_x)
}

/// The planes of [`ssim_and_backward_into`], kept between calls (a fit
/// makes one every step): allocated and zeroed each time, they were a
/// dozen image-sized planes written by one thread while the other waited.
/// Every plane is overwritten before it is read, so none is cleared.
#[derive(Debug, Default)]
pub struct SsimWorkspace<F> {
    stats: Stats<F>,
    coeffs: [Vec<F>; 3],
    g: [Vec<F>; 3],
    sv: Vec<F>,
    d_x: Vec<F>,
}

impl<F: Real> SsimWorkspace<F> {
    /// Sizes the planes for `n` pixels of `c` channels (a no-op when they are).
    fn fit(&mut self, n: usize, c: usize) {
        self.fit_stats(n);
        for v in [&mut self.sv].into_iter().chain(&mut self.coeffs).chain(&mut self.g) {
            v.resize(n, F::zero());
        }
        self.d_x.resize(n * c, F::zero());
    }

    /// Sizes the statistics planes alone (what the value of SSIM needs).
    fn fit_stats(&mut self, n: usize) {
        let s = &mut self.stats;
        for v in [&mut s.mx, &mut s.exx, &mut s.exy, &mut s.tmp] {
            v.resize(n, F::zero());
        }
    }

    /// The gradient the last [`ssim_and_backward_into`] wrote, `[H, W, C]`.
    pub fn gradient_mut(&mut self) -> &mut [F] {
        &mut self.d_x
    }
}

/// [`ssim_and_backward_against`] in `workspace`: returns the mean SSIM; the
/// gradient is [`SsimWorkspace::gradient_mut`].
pub fn ssim_and_backward_into<F: Real>(
    x: &[F],
    y: &[F],
    reference: &SsimReference<F>,
    d_ssim: F,
    workspace: &mut SsimWorkspace<F>,
) -> F {
    let (h, w, c) = (reference.h, reference.w, reference.c);
    check(x, y, h, w, c);
    let n = h * w;
    let scale = d_ssim / F::c((n * c) as f64);
    workspace.fit(n, c);
    let SsimWorkspace {
        stats,
        coeffs,
        g,
        sv,
        d_x,
    } = workspace;
    let mut total = 0.0f64;
    let task = rows_per_task(w) * w.max(1);
    for ch in 0..c {
        stats.compute(x, y, reference, ch);
        let r = &reference.planes[ch];
        // ∂S/∂μx, ∂S/∂E[x²], ∂S/∂E[xy] per pixel, scaled by the upstream
        // gradient; S itself summed per task (fixed tasks: the same sum
        // whatever the thread count). Plain slices, so the loop vectorises.
        let [c0, c1, c2] = &mut *coeffs;
        let sums: Vec<f64> = c0
            .par_chunks_mut(task)
            .zip(c1.par_chunks_mut(task))
            .zip(c2.par_chunks_mut(task))
            .zip(sv.par_chunks_mut(task))
            .enumerate()
            .map(|(t, (((d0, d1), d2), s))| {
                let span = t * task..t * task + d0.len();
                let (mx, exx, exy) = (
                    &stats.mx[span.clone()],
                    &stats.exx[span.clone()],
                    &stats.exy[span.clone()],
                );
                let (my, eyy) = (&r[0][span.clone()], &r[1][span]);
                wide(
                    #[inline(always)]
                    || {
                        for i in 0..d0.len() {
                            let (a1, a2, b1, b2) = terms(mx[i], my[i], exx[i], eyy[i], exy[i]);
                            let (mx, my) = (mx[i], my[i]);
                            let two = F::c(2.0);
                            let den = b1 * b2;
                            let v = a1 * a2 / den;
                            let d_mx =
                                two * my * a2 / den - two * my * a1 / den - two * mx * v / b1 + two * mx * v / b2;
                            d0[i] = scale * d_mx;
                            d1[i] = scale * (-v / b2);
                            d2[i] = scale * (two * a1 / den);
                            s[i] = v;
                        }
                    },
                );
                // Apart from the loop above, which an f64 sum would keep scalar.
                s.iter().map(|v| v.to_f64().unwrap_or(f64::NAN)).sum::<f64>()
            })
            .collect();
        total += sums.iter().sum::<f64>();
        for (cq, gq) in coeffs.iter().zip(g.iter_mut()) {
            blur_into(cq, h, w, &mut stats.tmp, gq);
        }
        // dx = g0 + 2·x·g1 + y·g2, into channel ch of d_x.
        let g = &*g;
        d_x.par_chunks_mut(task * c.max(1)).enumerate().for_each(|(t, out)| {
            let o = t * task;
            for (j, ((d, xv), yv)) in out
                .iter_mut()
                .skip(ch)
                .step_by(c)
                .zip(x[o * c..].iter().skip(ch).step_by(c))
                .zip(y[o * c..].iter().skip(ch).step_by(c))
                .enumerate()
            {
                let i = o + j;
                *d = g[0][i] + F::c(2.0) * *xv * g[1][i] + *yv * g[2][i];
            }
        });
    }
    F::c(total / (n * c) as f64)
}
