//! Tile-based top-K normalised blending: forward and its exact backward,
//! which recomputes each pixel's top-K instead of storing an index map.

use rayon::prelude::*;

use super::Real;
use super::project::{Binned, Frame, TILE, project_and_bin, project_one_backward};

/// Largest supported top-K (the selection lives on the stack).
pub const MAX_TOP_K: usize = 32;
/// Added to the weight sum before normalising.
pub const EPSILON: f64 = 1e-4;
/// Bands (groups of tile rows) the work is split into at most; fixed so
/// that reductions add in the same order whatever the thread count.
const MAX_BANDS: usize = 64;

/// Borrowed Gaussian parameters, flat and row major.
#[derive(Debug, Clone, Copy)]
pub struct Splats<'a, F> {
    /// `[N, 2]` centres in `[0, 1]²`.
    pub xy: &'a [F],
    /// `[N, 2]` inverse pixel-space standard deviations.
    pub inv_scale: &'a [F],
    /// `[N]` rotations in radians.
    pub theta: &'a [F],
    /// `[N, C]` colours.
    pub color: &'a [F],
    /// Channels C.
    pub channels: usize,
}

impl<F> Splats<'_, F> {
    /// Number of Gaussians.
    pub fn len(&self) -> usize {
        self.theta.len()
    }

    /// True when there are no Gaussians.
    pub fn is_empty(&self) -> bool {
        self.theta.is_empty()
    }
}

/// Gradients with respect to each parameter tensor, same layouts.
#[derive(Debug, Clone, PartialEq)]
pub struct SplatGrads<F> {
    /// `[N, 2]`
    pub d_xy: Vec<F>,
    /// `[N, 2]`
    pub d_inv_scale: Vec<F>,
    /// `[N]`
    pub d_theta: Vec<F>,
    /// `[N, C]`
    pub d_color: Vec<F>,
}

/// The candidates of one tile gathered into contiguous arrays, so that the
/// per-pixel loop streams through memory instead of chasing indices.
#[derive(Debug, Default)]
pub struct TileCandidates<F> {
    ids: Vec<u32>,
    cx: Vec<F>,
    cy: Vec<F>,
    a: Vec<F>,
    b: Vec<F>,
    c: Vec<F>,
}

impl<F: Real> TileCandidates<F> {
    /// Gathers tile `tile`'s Gaussians (reusing the buffers).
    pub fn gather(&mut self, binned: &Binned<F>, tile: usize) {
        let ids = binned.tile(tile);
        self.ids.clear();
        self.ids.extend_from_slice(ids);
        let pick = |dst: &mut Vec<F>, f: &dyn Fn(usize) -> F| {
            dst.clear();
            dst.extend(ids.iter().map(|&i| f(i as usize)));
        };
        let p = &binned.projected;
        pick(&mut self.cx, &|i| p[i].cx);
        pick(&mut self.cy, &|i| p[i].cy);
        pick(&mut self.a, &|i| p[i].a);
        pick(&mut self.b, &|i| p[i].b);
        pick(&mut self.c, &|i| p[i].c);
    }

    /// Offset `d = centre − p` of candidate `slot` from pixel centre `(px, py)`.
    #[inline]
    fn offset(&self, slot: usize, px: F, py: F) -> (F, F) {
        (self.cx[slot] - px, self.cy[slot] - py)
    }

    /// Top-K for the pixel `(x, y)` (which must lie in the gathered tile).
    /// `scratch` holds the candidates' σ: computing them all first is a
    /// loop the compiler vectorises; the selection scan then rarely branches.
    #[inline]
    pub fn select(&self, top_k: usize, x: usize, y: usize, scratch: &mut Vec<F>) -> TopK<F> {
        let (px, py) = (F::c(x as f64 + 0.5), F::c(y as f64 + 0.5));
        let half = F::c(0.5);
        scratch.clear();
        scratch.extend(
            self.cx
                .iter()
                .zip(&self.cy)
                .zip(self.a.iter().zip(&self.b).zip(&self.c))
                .map(|((cx, cy), ((a, b), c))| {
                    let dx = *cx - px;
                    let dy = *cy - py;
                    half * *a * dx * dx + half * *c * dy * dy + *b * dx * dy
                }),
        );
        let mut top = TopK::new();
        let mut bound = F::infinity();
        for (slot, &sigma) in scratch.iter().enumerate() {
            // `sigma < bound` is false for NaN; infinite σ has zero weight.
            if sigma < bound && sigma >= F::zero() && sigma.is_finite() {
                top.offer(top_k, sigma, slot as u32);
                bound = top.bound(top_k);
            }
        }
        top
    }
}

/// The K largest weights at one pixel, kept as the K smallest exponents
/// σ (w = exp(−σ) is decreasing, so this is the same set without an exp
/// per candidate), in ascending σ; ties: the candidate met first, i.e. the
/// lower Gaussian index, wins.
#[derive(Debug, Clone, Copy)]
pub struct TopK<F> {
    sigma: [F; MAX_TOP_K],
    slot: [u32; MAX_TOP_K],
    len: usize,
}

impl<F: Real> TopK<F> {
    fn new() -> Self {
        Self {
            sigma: [F::zero(); MAX_TOP_K],
            slot: [0; MAX_TOP_K],
            len: 0,
        }
    }

    /// Largest σ that can still enter (infinite while not full).
    #[inline]
    fn bound(&self, k: usize) -> F {
        if self.len == k {
            self.sigma[k - 1]
        } else {
            F::infinity()
        }
    }

    #[inline]
    fn offer(&mut self, k: usize, sigma: F, slot: u32) {
        if self.len == k {
            self.len -= 1;
        }
        // Insert after every element with σ <= the new one (stable).
        let mut pos = self.len;
        while pos > 0 && self.sigma[pos - 1] > sigma {
            self.sigma[pos] = self.sigma[pos - 1];
            self.slot[pos] = self.slot[pos - 1];
            pos -= 1;
        }
        self.sigma[pos] = sigma;
        self.slot[pos] = slot;
        self.len += 1;
    }

    /// Number selected.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no Gaussian covers the pixel.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `(σ, gaussian id)` of the selected entries, in ascending σ.
    pub fn entries<'a>(&'a self, tile: &'a TileCandidates<F>) -> impl Iterator<Item = (F, u32)> + 'a {
        (0..self.len).map(move |k| (self.sigma[k], tile.ids[self.slot[k] as usize]))
    }

    /// Weights `exp(−σ)` of the selected entries.
    fn weights(&self) -> [F; MAX_TOP_K] {
        let mut w = [F::zero(); MAX_TOP_K];
        for (wk, sigma) in w.iter_mut().zip(&self.sigma[..self.len]) {
            *wk = (-*sigma).exp();
        }
        w
    }
}

/// Top-K selection for pixel `(x, y)`: `(σ, gaussian id)` in ascending σ.
pub fn select_top_k<F: Real>(binned: &Binned<F>, frame: &Frame, top_k: usize, x: usize, y: usize) -> Vec<(F, u32)> {
    let mut tile = TileCandidates::default();
    tile.gather(binned, (y / TILE) * frame.tiles_x() + x / TILE);
    tile.select(top_k, x, y, &mut Vec::new()).entries(&tile).collect()
}

fn check_top_k(top_k: usize) {
    assert!(
        (1..=MAX_TOP_K).contains(&top_k),
        "top_k must be in 1..={MAX_TOP_K}, got {top_k}"
    );
}

/// Tile rows per band.
fn band_tiles(frame: &Frame) -> usize {
    frame.tiles_y().div_ceil(MAX_BANDS).max(1)
}

/// Calls `f(tile, scratch, x, y)` for every pixel of band `band`, tile by tile.
fn for_each_pixel_in_band<F: Real>(
    binned: &Binned<F>,
    frame: &Frame,
    band: usize,
    mut f: impl FnMut(&TileCandidates<F>, &mut Vec<F>, usize, usize),
) {
    let per = band_tiles(frame);
    let mut tile = TileCandidates::default();
    let mut scratch = Vec::new();
    for ty in band * per..((band + 1) * per).min(frame.tiles_y()) {
        for tx in 0..frame.tiles_x() {
            let index = ty * frame.tiles_x() + tx;
            if binned.tile(index).is_empty() {
                continue;
            }
            tile.gather(binned, index);
            for y in ty * TILE..((ty + 1) * TILE).min(frame.height) {
                for x in tx * TILE..((tx + 1) * TILE).min(frame.width) {
                    f(&tile, &mut scratch, x, y);
                }
            }
        }
    }
}

/// Renders `[H, W, C]` (row major).
pub fn render<F: Real>(splats: &Splats<F>, frame: &Frame, top_k: usize) -> Vec<F> {
    check_top_k(top_k);
    let c = splats.channels;
    let binned = project_and_bin(splats.xy, splats.inv_scale, splats.theta, frame);
    let mut out = vec![F::zero(); frame.width * frame.height * c];
    if out.is_empty() {
        return out;
    }
    let rows = band_tiles(frame) * TILE;
    out.par_chunks_mut(rows * frame.width * c)
        .enumerate()
        .for_each(|(band, chunk)| {
            let y0 = band * rows;
            for_each_pixel_in_band(&binned, frame, band, |tile, scratch, x, y| {
                let top = tile.select(top_k, x, y, scratch);
                if top.is_empty() {
                    return;
                }
                let w = top.weights();
                let denom = F::c(EPSILON) + w[..top.len].iter().copied().sum::<F>();
                let px = &mut chunk[((y - y0) * frame.width + x) * c..((y - y0) * frame.width + x + 1) * c];
                for (k, (_, id)) in top.entries(tile).enumerate() {
                    let col = &splats.color[id as usize * c..(id as usize + 1) * c];
                    for ch in 0..c {
                        px[ch] = px[ch] + w[k] * col[ch];
                    }
                }
                for v in px.iter_mut() {
                    *v = *v / denom;
                }
            });
        });
    out
}

/// Gradients of `Σ d_out · render(splats)` with respect to every parameter.
pub fn render_backward<F: Real>(splats: &Splats<F>, frame: &Frame, top_k: usize, d_out: &[F]) -> SplatGrads<F> {
    check_top_k(top_k);
    let (n, c) = (splats.len(), splats.channels);
    assert_eq!(d_out.len(), frame.width * frame.height * c, "d_out must be [H, W, C]");
    let binned = project_and_bin(splats.xy, splats.inv_scale, splats.theta, frame);
    // Per-Gaussian accumulator: [d_cx, d_cy, d_a, d_b, d_c, d_color..].
    let stride = 5 + c;
    let bands = frame.tiles_y().div_ceil(band_tiles(frame));
    let partials: Vec<Vec<F>> = (0..bands)
        .into_par_iter()
        .map(|band| {
            let mut acc = vec![F::zero(); n * stride];
            let mut u = [F::zero(); MAX_TOP_K];
            let half = F::c(0.5);
            for_each_pixel_in_band(&binned, frame, band, |tile, scratch, x, y| {
                let top = tile.select(top_k, x, y, scratch);
                if top.is_empty() {
                    return;
                }
                let g = &d_out[(y * frame.width + x) * c..(y * frame.width + x + 1) * c];
                let ws = top.weights();
                let denom = F::c(EPSILON) + ws[..top.len].iter().copied().sum::<F>();
                let mut weighted = F::zero();
                for (k, (_, id)) in top.entries(tile).enumerate() {
                    let col = &splats.color[id as usize * c..(id as usize + 1) * c];
                    u[k] = (0..c).map(|ch| col[ch] * g[ch]).sum();
                    weighted = weighted + ws[k] * u[k];
                }
                let (px, py) = (F::c(x as f64 + 0.5), F::c(y as f64 + 0.5));
                for k in 0..top.len {
                    let slot = top.slot[k] as usize;
                    let id = tile.ids[slot] as usize;
                    let (dx, dy) = tile.offset(slot, px, py);
                    let (a, b, cc) = (tile.a[slot], tile.b[slot], tile.c[slot]);
                    let w = ws[k];
                    let d_w = u[k] / denom - weighted / (denom * denom);
                    let d_sigma = -w * d_w;
                    let acc = &mut acc[id * stride..(id + 1) * stride];
                    acc[0] = acc[0] + d_sigma * (a * dx + b * dy);
                    acc[1] = acc[1] + d_sigma * (b * dx + cc * dy);
                    acc[2] = acc[2] + d_sigma * half * dx * dx;
                    acc[3] = acc[3] + d_sigma * dx * dy;
                    acc[4] = acc[4] + d_sigma * half * dy * dy;
                    let share = w / denom;
                    for ch in 0..c {
                        acc[5 + ch] = acc[5 + ch] + share * g[ch];
                    }
                }
            });
            acc
        })
        .collect();
    let mut acc = vec![F::zero(); n * stride];
    for part in &partials {
        for (t, v) in acc.iter_mut().zip(part) {
            *t = *t + *v;
        }
    }
    let mut grads = SplatGrads {
        d_xy: vec![F::zero(); 2 * n],
        d_inv_scale: vec![F::zero(); 2 * n],
        d_theta: vec![F::zero(); n],
        d_color: vec![F::zero(); n * c],
    };
    for i in 0..n {
        let a = &acc[i * stride..(i + 1) * stride];
        let (d_xy, d_inv, d_theta) = project_one_backward(
            [splats.inv_scale[2 * i], splats.inv_scale[2 * i + 1]],
            splats.theta[i],
            frame,
            [a[0], a[1]],
            [a[2], a[3], a[4]],
        );
        grads.d_xy[2 * i..2 * i + 2].copy_from_slice(&d_xy);
        grads.d_inv_scale[2 * i..2 * i + 2].copy_from_slice(&d_inv);
        grads.d_theta[i] = d_theta;
        grads.d_color[i * c..(i + 1) * c].copy_from_slice(&a[5..]);
    }
    grads
}
