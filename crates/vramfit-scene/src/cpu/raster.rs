//! Screen-space Gaussians binned into tiles and composited front to back.
//!
//! Each drawn Gaussian goes into the list of every tile its radius box
//! touches; a tile's list is ordered by depth (nearest first, ties by id).
//! A pixel walks its tile's list: `α = min(0.99, o · exp(−½ δᵀ conic δ))`
//! with `δ` from the pixel's centre to the Gaussian's mean, an `α` below
//! 1/255 is skipped, colour accumulates as `C += T α c` and transmittance
//! as `T ← T (1 − α)`, and the walk stops before a Gaussian that would
//! take `T` below 10⁻⁴; the background shows through what is left:
//! `C + T · background`.
//!
//! What the backward needs is kept per pixel, not per Gaussian: the final
//! transmittance and how far along its list the pixel walked. The backward
//! walks the same entries back to front and recovers each `T` by dividing
//! by `1 − α` (α ≤ 0.99, so the division is safe). Its gradients are the
//! exact derivatives of this forward: where `α` is clamped at 0.99 nothing
//! flows to the opacity or the shape (3DGS's reference passes them on as
//! if unclamped).

use super::camera::Camera;
use super::project::{Projected, ProjectedGrads};
use vramfit_gauss::Real;
use vramfit_gauss::tile::{TILE, bin_rects};

/// The largest opacity a Gaussian reaches at a pixel.
pub const MAX_ALPHA: f64 = 0.99;
/// Contributions below this are skipped.
pub const MIN_ALPHA: f64 = 1.0 / 255.0;
/// A pixel stops before its transmittance would fall below this.
pub const MIN_TRANSMITTANCE: f64 = 1e-4;

/// Per tile (row by row), the drawn Gaussians' ids, nearest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Bins {
    /// Tiles across.
    pub tiles_x: usize,
    /// The lists, `ty * tiles_x + tx`.
    pub lists: Vec<Vec<u32>>,
}

impl Bins {
    /// Tile intersections: the entries of every list (what sorting and
    /// the lists' memory scale with).
    pub fn intersections(&self) -> usize {
        self.lists.iter().map(Vec::len).sum()
    }
}

/// Bins the drawn Gaussians (`None`: not drawn) into the camera's tiles.
pub fn bin<F: Real>(projected: &[Option<Projected<F>>], camera: &Camera) -> Bins {
    let (tiles_x, tiles_y) = camera.tiles();
    let binned = bin_rects(projected.iter().map(|p| p.as_ref().map(|p| p.tiles)), tiles_x, tiles_y);
    let depth = |id: u32| {
        projected[id as usize]
            .as_ref()
            .expect("binned Gaussians are drawn")
            .depth
    };
    let lists = (0..binned.tiles())
        .map(|t| {
            let mut keyed: Vec<(F, u32)> = binned.tile(t).iter().map(|&id| (depth(id), id)).collect();
            keyed.sort_by(|a, b| a.0.partial_cmp(&b.0).expect("depths are numbers").then(a.1.cmp(&b.1)));
            keyed.into_iter().map(|(_, id)| id).collect()
        })
        .collect();
    Bins { tiles_x, lists }
}

/// What the forward keeps per pixel for the backward.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept<F> {
    /// Transmittance after the last contributor.
    pub final_t: Vec<F>,
    /// Entries of the tile's list walked (the last contributor's index + 1).
    pub walked: Vec<u32>,
}

/// One Gaussian at one pixel centre: the offset from the pixel to the
/// mean, `exp(power)` and `α` (`None`: skipped).
fn at_pixel<F: Real>(p: &Projected<F>, px: F, py: F) -> Option<([F; 2], F, F)> {
    let d = [p.mean[0] - px, p.mean[1] - py];
    let [a, b, c] = p.conic;
    let power = -F::c(0.5) * (a * d[0] * d[0] + c * d[1] * d[1]) - b * d[0] * d[1];
    if power > F::zero() {
        return None;
    }
    let g = power.exp();
    let alpha = (p.opacity * g).min(F::c(MAX_ALPHA));
    (alpha >= F::c(MIN_ALPHA)).then_some((d, g, alpha))
}

/// The pixels of tile `t`, as (x, y, index in the image).
fn tile_pixels(camera: &Camera, tiles_x: usize, t: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let (tx, ty) = (t % tiles_x, t / tiles_x);
    let ys = ty * TILE..((ty + 1) * TILE).min(camera.height);
    ys.flat_map(move |y| (tx * TILE..((tx + 1) * TILE).min(camera.width)).map(move |x| (x, y, y * camera.width + x)))
}

/// The image (row by row, 3 channels a pixel) and what the backward needs.
pub fn composite<F: Real>(
    projected: &[Option<Projected<F>>],
    bins: &Bins,
    camera: &Camera,
    background: [F; 3],
) -> (Vec<F>, Kept<F>) {
    let pixels = camera.width * camera.height;
    let mut image = vec![F::zero(); 3 * pixels];
    let mut kept = Kept {
        final_t: vec![F::one(); pixels],
        walked: vec![0; pixels],
    };
    for (t, list) in bins.lists.iter().enumerate() {
        for (x, y, i) in tile_pixels(camera, bins.tiles_x, t) {
            let (px, py) = (F::c(x as f64 + 0.5), F::c(y as f64 + 0.5));
            let mut transmittance = F::one();
            let mut color = [F::zero(); 3];
            let mut walked = 0;
            for (n, &id) in list.iter().enumerate() {
                let p = projected[id as usize].as_ref().expect("binned Gaussians are drawn");
                let Some((_, _, alpha)) = at_pixel(p, px, py) else {
                    continue;
                };
                let next = transmittance * (F::one() - alpha);
                if next < F::c(MIN_TRANSMITTANCE) {
                    break;
                }
                for (c, pc) in color.iter_mut().zip(p.color) {
                    *c = *c + pc * alpha * transmittance;
                }
                transmittance = next;
                walked = n + 1;
            }
            for ch in 0..3 {
                image[3 * i + ch] = color[ch] + transmittance * background[ch];
            }
            kept.final_t[i] = transmittance;
            kept.walked[i] = walked as u32;
        }
    }
    (image, kept)
}

/// The backward of [`composite`] for `d_image`: per Gaussian, the
/// gradients with respect to its screen mean, conic, opacity and colour
/// (zero for those not drawn).
pub fn composite_backward<F: Real>(
    projected: &[Option<Projected<F>>],
    bins: &Bins,
    camera: &Camera,
    background: [F; 3],
    kept: &Kept<F>,
    d_image: &[F],
) -> Vec<ProjectedGrads<F>> {
    let mut grads = vec![ProjectedGrads::default(); projected.len()];
    let half = F::c(0.5);
    for (t, list) in bins.lists.iter().enumerate() {
        for (x, y, i) in tile_pixels(camera, bins.tiles_x, t) {
            let (px, py) = (F::c(x as f64 + 0.5), F::c(y as f64 + 0.5));
            let d_pixel = [d_image[3 * i], d_image[3 * i + 1], d_image[3 * i + 2]];
            let final_t = kept.final_t[i];
            let d_background: F = (0..3).map(|ch| background[ch] * d_pixel[ch]).sum();
            let mut transmittance = final_t;
            // The colour accumulated behind the current entry, relative to the
            // transmittance just behind it.
            let mut behind = [F::zero(); 3];
            let (mut last_alpha, mut last_color) = (F::zero(), [F::zero(); 3]);
            for &id in list[..kept.walked[i] as usize].iter().rev() {
                let p = projected[id as usize].as_ref().expect("binned Gaussians are drawn");
                let Some((d, g, alpha)) = at_pixel(p, px, py) else {
                    continue;
                };
                transmittance = transmittance / (F::one() - alpha);
                let grad = &mut grads[id as usize];
                let mut d_alpha = F::zero();
                for ch in 0..3 {
                    behind[ch] = last_alpha * last_color[ch] + (F::one() - last_alpha) * behind[ch];
                    last_color[ch] = p.color[ch];
                    d_alpha = d_alpha + (p.color[ch] - behind[ch]) * d_pixel[ch];
                    grad.color[ch] = grad.color[ch] + alpha * transmittance * d_pixel[ch];
                }
                d_alpha = d_alpha * transmittance - final_t / (F::one() - alpha) * d_background;
                last_alpha = alpha;
                if p.opacity * g >= F::c(MAX_ALPHA) {
                    continue; // clamped: α does not move with the opacity or the shape
                }
                grad.opacity = grad.opacity + g * d_alpha;
                let d_power = p.opacity * d_alpha * g;
                let [a, b, c] = p.conic;
                grad.mean[0] = grad.mean[0] - d_power * (a * d[0] + b * d[1]);
                grad.mean[1] = grad.mean[1] - d_power * (c * d[1] + b * d[0]);
                grad.conic[0] = grad.conic[0] - d_power * half * d[0] * d[0];
                grad.conic[1] = grad.conic[1] - d_power * d[0] * d[1];
                grad.conic[2] = grad.conic[2] - d_power * half * d[1] * d[1];
            }
        }
    }
    grads
}
