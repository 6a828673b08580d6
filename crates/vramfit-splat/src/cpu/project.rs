//! Per-Gaussian projection (conic, radius, tile rectangle) and binning of
//! (Gaussian, tile) pairs, with the derivatives the backward pass needs.

use vramfit_gauss::Real;
use vramfit_gauss::tile::{TILE, bin_rects};

/// Image size and the mapping from fitted to rendered pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Frame {
    /// Rendered width in pixels.
    pub width: usize,
    /// Rendered height in pixels.
    pub height: usize,
    /// Rendered pixels per fitted pixel along x (1 while fitting).
    pub zoom_x: f64,
    /// Rendered pixels per fitted pixel along y (1 while fitting).
    pub zoom_y: f64,
}

impl Frame {
    /// A frame rendered at the fitted resolution.
    pub fn new(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            zoom_x: 1.0,
            zoom_y: 1.0,
        }
    }

    /// Tiles along x.
    pub fn tiles_x(&self) -> usize {
        self.width.div_ceil(TILE)
    }

    /// Tiles along y.
    pub fn tiles_y(&self) -> usize {
        self.height.div_ceil(TILE)
    }
}

/// One Gaussian after projection to the rendered frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct Projected<F> {
    /// Pixel-space centre.
    pub cx: F,
    /// Pixel-space centre.
    pub cy: F,
    /// Conic `X = Σ⁻¹ = [[a, b], [b, c]]` in rendered pixels.
    pub a: F,
    /// Off-diagonal of the conic.
    pub b: F,
    /// Second diagonal entry of the conic.
    pub c: F,
    /// Tile rectangle `[x0, x1) × [y0, y1)`; empty when culled.
    pub tiles: [u32; 4],
}

/// Projects one Gaussian. `X = R·diag(p²)·Rᵀ` with `p = inv_scale`, so the
/// conic needs no matrix inverse; rendering at another size maps
/// `Σ' = Z·Σ·Z`, i.e. `X' = Z⁻¹·X·Z⁻¹`.
pub fn project_one<F: Real>(xy: [F; 2], inv_scale: [F; 2], theta: F, frame: &Frame) -> Projected<F> {
    let (zx, zy) = (F::c(frame.zoom_x), F::c(frame.zoom_y));
    let cx = xy[0] * F::c(frame.width as f64);
    let cy = xy[1] * F::c(frame.height as f64);
    let (s, co) = theta.sin_cos();
    let (p1, p2) = (inv_scale[0] * inv_scale[0], inv_scale[1] * inv_scale[1]);
    let a = (p1 * co * co + p2 * s * s) / (zx * zx);
    let c = (p1 * s * s + p2 * co * co) / (zy * zy);
    let b = (p1 - p2) * s * co / (zx * zy);
    let mut out = Projected {
        cx,
        cy,
        a,
        b,
        c,
        tiles: [0; 4],
    };
    let det_x = a * c - b * b;
    let det_sigma = F::one() / det_x;
    // Kept only with a finite, non-degenerate covariance (NaN fails every test).
    let valid =
        det_x > F::zero() && det_sigma.is_finite() && det_sigma > F::c(1e-12) && cx.is_finite() && cy.is_finite();
    if !valid {
        return out;
    }
    let (s11, s22) = (c * det_sigma, a * det_sigma);
    let m = F::c(0.5) * (s11 + s22);
    let lambda = m + (m * m - det_sigma).max(F::c(0.1)).sqrt();
    let r = (F::c(3.0) * lambda.sqrt()).ceil();
    if !r.is_finite() {
        return out;
    }
    let (tx, ty) = (frame.tiles_x() as f64, frame.tiles_y() as f64);
    let t = F::c(TILE as f64);
    let clamp = |v: F, hi: f64| v.to_f64().unwrap_or(0.0).clamp(0.0, hi) as u32;
    out.tiles = [
        clamp(((cx - r) / t).floor(), tx),
        clamp(((cx + r) / t).ceil(), tx),
        clamp(((cy - r) / t).floor(), ty),
        clamp(((cy + r) / t).ceil(), ty),
    ];
    if out.tiles[0] >= out.tiles[1] || out.tiles[2] >= out.tiles[3] {
        out.tiles = [0; 4];
    }
    out
}

/// Chains the gradient of one projected Gaussian back to its parameters:
/// returns `(d_xy, d_inv_scale, d_theta)`.
pub fn project_one_backward<F: Real>(
    inv_scale: [F; 2],
    theta: F,
    frame: &Frame,
    d_centre: [F; 2],
    d_conic: [F; 3],
) -> ([F; 2], [F; 2], F) {
    let (zx, zy) = (F::c(frame.zoom_x), F::c(frame.zoom_y));
    let d_xy = [
        d_centre[0] * F::c(frame.width as f64),
        d_centre[1] * F::c(frame.height as f64),
    ];
    // Gradient w.r.t. the unzoomed conic.
    let da = d_conic[0] / (zx * zx);
    let db = d_conic[1] / (zx * zy);
    let dc = d_conic[2] / (zy * zy);
    let (s, co) = theta.sin_cos();
    let (q1, q2) = (inv_scale[0], inv_scale[1]);
    let two = F::c(2.0);
    // a = p1²cos² + p2²sin², b = (p1² − p2²) sin cos, c = p1²sin² + p2²cos².
    let d_q1 = two * q1 * (da * co * co + db * s * co + dc * s * s);
    let d_q2 = two * q2 * (da * s * s - db * s * co + dc * co * co);
    let diff = q1 * q1 - q2 * q2;
    let (sin2, cos2) = ((two * theta).sin(), (two * theta).cos());
    let d_theta = -da * diff * sin2 + db * diff * cos2 + dc * diff * sin2;
    (d_xy, [d_q1, d_q2], d_theta)
}

/// Projected Gaussians and, per tile, the indices of the Gaussians whose
/// rectangle overlaps it, in ascending Gaussian order.
#[derive(Debug, Clone)]
pub struct Binned<F> {
    /// One entry per Gaussian.
    pub projected: Vec<Projected<F>>,
    /// `offsets[t]..offsets[t + 1]` indexes `ids` for tile `t` (row major).
    pub offsets: Vec<usize>,
    /// Gaussian indices, grouped by tile.
    pub ids: Vec<u32>,
}

impl<F> Binned<F> {
    /// The Gaussians binned to tile `(tx, ty)`.
    pub fn tile(&self, tile_index: usize) -> &[u32] {
        &self.ids[self.offsets[tile_index]..self.offsets[tile_index + 1]]
    }
}

/// Projects every Gaussian and bins the (Gaussian, tile) pairs: count,
/// prefix sum, scatter (in Gaussian order, so ties keep the lower index).
pub fn project_and_bin<F: Real>(xy: &[F], inv_scale: &[F], theta: &[F], frame: &Frame) -> Binned<F> {
    let n = theta.len();
    let projected: Vec<Projected<F>> = (0..n)
        .map(|i| {
            project_one(
                [xy[2 * i], xy[2 * i + 1]],
                [inv_scale[2 * i], inv_scale[2 * i + 1]],
                theta[i],
                frame,
            )
        })
        .collect();
    let lists = bin_rects(
        projected.iter().map(|p| Some(p.tiles.map(|v| v as usize))),
        frame.tiles_x(),
        frame.tiles_y(),
    );
    Binned {
        projected,
        offsets: lists.offsets,
        ids: lists.ids,
    }
}
