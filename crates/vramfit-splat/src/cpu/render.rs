//! Tile-based top-K normalised blending: forward and its exact backward,
//! which recomputes each pixel's top-K instead of storing an index map.

use rayon::prelude::*;

use super::Real;
use super::project::{Binned, Frame, Projected, TILE, project_and_bin, project_one_backward};

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

/// The K largest weights at one pixel, in descending order (ties: the
/// Gaussian met first, i.e. the lower index, wins).
#[derive(Debug, Clone, Copy)]
pub struct TopK<F> {
    /// Selected `(weight, gaussian id, dx, dy)`.
    pub items: [(F, u32, F, F); MAX_TOP_K],
    /// Number selected.
    pub len: usize,
}

impl<F: Real> TopK<F> {
    fn new() -> Self {
        Self { items: [(F::zero(), 0, F::zero(), F::zero()); MAX_TOP_K], len: 0 }
    }

    fn offer(&mut self, k: usize, item: (F, u32, F, F)) {
        if self.len == k {
            if !(item.0 > self.items[k - 1].0) {
                return;
            }
            self.len -= 1;
        }
        // Insert after every element with a weight >= the new one (stable).
        let mut pos = self.len;
        while pos > 0 && self.items[pos - 1].0 < item.0 {
            self.items[pos] = self.items[pos - 1];
            pos -= 1;
        }
        self.items[pos] = item;
        self.len += 1;
    }

    /// The selected entries.
    pub fn as_slice(&self) -> &[(F, u32, F, F)] {
        &self.items[..self.len]
    }
}

/// Weight of a projected Gaussian at pixel centre `(px, py)`, with the
/// offset `d = centre − p`; `None` when σ < 0 or not finite.
fn weight<F: Real>(g: &Projected<F>, px: F, py: F) -> Option<(F, F, F)> {
    let dx = g.cx - px;
    let dy = g.cy - py;
    let half = F::c(0.5);
    let sigma = half * g.a * dx * dx + half * g.c * dy * dy + g.b * dx * dy;
    if !(sigma >= F::zero()) || !sigma.is_finite() {
        return None;
    }
    Some(((-sigma).exp(), dx, dy))
}

/// Top-K selection for pixel `(x, y)` among the Gaussians binned to its tile.
pub fn select_top_k<F: Real>(binned: &Binned<F>, frame: &Frame, top_k: usize, x: usize, y: usize) -> TopK<F> {
    let tile = (y / TILE) * frame.tiles_x() + x / TILE;
    let (px, py) = (F::c(x as f64 + 0.5), F::c(y as f64 + 0.5));
    let mut top = TopK::new();
    for &id in binned.tile(tile) {
        if let Some((w, dx, dy)) = weight(&binned.projected[id as usize], px, py) {
            top.offer(top_k, (w, id, dx, dy));
        }
    }
    top
}

fn check_top_k(top_k: usize) {
    assert!((1..=MAX_TOP_K).contains(&top_k), "top_k must be in 1..={MAX_TOP_K}, got {top_k}");
}

/// Rows of pixels per band, a multiple of the tile size.
fn band_rows(frame: &Frame) -> usize {
    frame.tiles_y().div_ceil(MAX_BANDS).max(1) * TILE
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
    let rows = band_rows(frame);
    out.par_chunks_mut(rows * frame.width * c).enumerate().for_each(|(band, chunk)| {
        let y0 = band * rows;
        for (row, line) in chunk.chunks_mut(frame.width * c).enumerate() {
            for x in 0..frame.width {
                let top = select_top_k(&binned, frame, top_k, x, y0 + row);
                if top.len == 0 {
                    continue;
                }
                let denom = F::c(EPSILON) + top.as_slice().iter().map(|t| t.0).sum::<F>();
                let px = &mut line[x * c..(x + 1) * c];
                for &(w, id, _, _) in top.as_slice() {
                    let col = &splats.color[id as usize * c..(id as usize + 1) * c];
                    for ch in 0..c {
                        px[ch] = px[ch] + w * col[ch];
                    }
                }
                for v in px.iter_mut() {
                    *v = *v / denom;
                }
            }
        }
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
    let rows = band_rows(frame);
    let bands = frame.height.div_ceil(rows);
    let partials: Vec<Vec<F>> = (0..bands)
        .into_par_iter()
        .map(|band| {
            let mut acc = vec![F::zero(); n * stride];
            let mut u = [F::zero(); MAX_TOP_K];
            for y in band * rows..((band + 1) * rows).min(frame.height) {
                for x in 0..frame.width {
                    let top = select_top_k(&binned, frame, top_k, x, y);
                    if top.len == 0 {
                        continue;
                    }
                    let g = &d_out[(y * frame.width + x) * c..(y * frame.width + x + 1) * c];
                    let denom = F::c(EPSILON) + top.as_slice().iter().map(|t| t.0).sum::<F>();
                    let mut weighted = F::zero();
                    for (k, &(w, id, _, _)) in top.as_slice().iter().enumerate() {
                        let col = &splats.color[id as usize * c..(id as usize + 1) * c];
                        u[k] = (0..c).map(|ch| col[ch] * g[ch]).sum();
                        weighted = weighted + w * u[k];
                    }
                    for (k, &(w, id, dx, dy)) in top.as_slice().iter().enumerate() {
                        let p = &binned.projected[id as usize];
                        let d_w = u[k] / denom - weighted / (denom * denom);
                        let d_sigma = -w * d_w;
                        let a = &mut acc[id as usize * stride..(id as usize + 1) * stride];
                        let half = F::c(0.5);
                        a[0] = a[0] + d_sigma * (p.a * dx + p.b * dy);
                        a[1] = a[1] + d_sigma * (p.b * dx + p.c * dy);
                        a[2] = a[2] + d_sigma * half * dx * dx;
                        a[3] = a[3] + d_sigma * dx * dy;
                        a[4] = a[4] + d_sigma * half * dy * dy;
                        let share = w / denom;
                        for ch in 0..c {
                            a[5 + ch] = a[5 + ch] + share * g[ch];
                        }
                    }
                }
            }
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
