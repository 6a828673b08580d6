//! Tile-based top-K normalised blending: forward and its exact backward,
//! either from the selection the forward kept ([`render_keeping`],
//! [`render_backward_kept`]) or selecting again ([`render_backward`]).
//! The selection itself is [`super::top_k`]'s.

use rayon::prelude::*;

use vramfit_gauss::tile::TILE;

use super::project::{Binned, Frame, Projected, project_and_bin, project_one_backward};
use super::top_k::{
    BLEND_LANES, EPSILON, MAX_TOP_K, RowSlots, RowTopK, Selection, TileCandidates, check_top_k, slots_used,
};
use crate::params::Params;
use vramfit_gauss::Real;

/// Bands (groups of tile rows) the work is split into at most; fixed so
/// that reductions add in the same order whatever the thread count.
const MAX_BANDS: usize = 64;

/// Borrowed Gaussian parameters, flat and row major, and their channel
/// count (the colour width, which an empty set cannot tell).
#[derive(Debug, Clone, Copy)]
pub struct Splats<'a, F> {
    /// The parameter arrays.
    pub params: Params<&'a [F]>,
    /// Channels C.
    pub channels: usize,
}

impl<'a, F> Splats<'a, F> {
    /// Borrows host arrays.
    pub fn new(params: &'a Params<Vec<F>>, channels: usize) -> Self {
        Self {
            params: params.slices(),
            channels,
        }
    }

    /// Number of Gaussians.
    pub fn len(&self) -> usize {
        self.params.count()
    }

    /// True when there are no Gaussians.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Gradients with respect to each parameter tensor, same layouts.
pub type SplatGrads<F> = Params<Vec<F>>;

/// Tile rows per band.
fn band_tiles(frame: &Frame) -> usize {
    frame.tiles_y().div_ceil(MAX_BANDS).max(1)
}

/// Calls `f(row, x0, y, lanes)` for every tile row of band `band`, tile
/// by tile: the row's pixels are `x0..x0 + lanes` (those in the frame),
/// and `row` holds their top-`top_k` selections (`None`: nothing is
/// selected, for a pass that reads a kept selection).
fn for_each_row_in_band<F: Real>(
    binned: &Binned<F>,
    frame: &Frame,
    band: usize,
    top_k: Option<usize>,
    mut f: impl FnMut(&RowTopK<F>, usize, usize, usize),
) {
    let per = band_tiles(frame);
    let mut tile = TileCandidates::default();
    let mut row = RowTopK::new();
    for ty in band * per..((band + 1) * per).min(frame.tiles_y()) {
        for tx in 0..frame.tiles_x() {
            let index = ty * frame.tiles_x() + tx;
            if binned.tile(index).is_empty() {
                continue;
            }
            if let Some(k) = top_k {
                tile.gather(binned, frame, index, k);
            }
            let x0 = tx * TILE;
            let lanes = TILE.min(frame.width - x0);
            for y in ty * TILE..((ty + 1) * TILE).min(frame.height) {
                if let Some(k) = top_k {
                    tile.select_row(k, x0, y, &mut row);
                }
                f(&row, x0, y, lanes);
            }
        }
    }
}

/// Each pixel's selection from a forward render, kept for its backward so
/// that the backward does not select again (selection is most of the
/// work): per band, tile row by tile row in the order they are visited,
/// the row's 16 counts and its slots as the selection left them (ids and
/// weights, lane by lane, as many slots as the row's largest count; at
/// most 8·K + 1 bytes per lane in f32, lanes past the frame's edge
/// included), with the projection it was made from. Written a row at a
/// time and read once in order: nothing is zeroed.
#[derive(Debug)]
pub struct Kept<F> {
    bands: Vec<KeptBand<F>>,
    binned: Binned<F>,
}

/// One band's share of a [`Kept`] selection.
#[derive(Debug, Default)]
struct KeptBand<F> {
    len: Vec<u8>,
    ids: Vec<u32>,
    weights: Vec<F>,
}

impl<F: Real> KeptBand<F> {
    /// Appends a row's selections.
    fn push(&mut self, row: RowSlots<'_, F>) {
        self.len.extend_from_slice(row.len);
        self.ids.extend_from_slice(row.ids);
        self.weights.extend_from_slice(row.weights);
    }
}

/// Normalised blend of the selected colours into `px` (`[C]`, zeroed).
/// The sums are kept in registers, not in `px`: a store and a load per
/// term made each pixel one long chain through memory.
#[inline]
fn blend<F: Real>(weights: &[F], ids: &[u32], color: &[F], px: &mut [F]) {
    let c = px.len();
    let denom = F::c(EPSILON) + weights.iter().copied().sum::<F>();
    if c <= BLEND_LANES {
        let mut acc = [F::zero(); BLEND_LANES];
        for (w, id) in weights.iter().zip(ids) {
            let col = &color[*id as usize * c..(*id as usize + 1) * c];
            for (a, v) in acc.iter_mut().zip(col) {
                *a = *a + *w * *v;
            }
        }
        for (p, a) in px.iter_mut().zip(acc) {
            *p = a / denom;
        }
        return;
    }
    for (w, id) in weights.iter().zip(ids) {
        let col = &color[*id as usize * c..(*id as usize + 1) * c];
        for ch in 0..c {
            px[ch] = px[ch] + *w * col[ch];
        }
    }
    for v in px.iter_mut() {
        *v = *v / denom;
    }
}

/// Renders `[H, W, C]` (row major).
pub fn render<F: Real>(splats: &Splats<F>, frame: &Frame, top_k: usize) -> Vec<F> {
    render_into(splats, frame, top_k, false).0
}

/// Renders `[H, W, C]` and keeps each pixel's selection for [`render_backward_kept`].
pub fn render_keeping<F: Real>(splats: &Splats<F>, frame: &Frame, top_k: usize) -> (Vec<F>, Kept<F>) {
    let (out, kept) = render_into(splats, frame, top_k, true);
    (out, kept.expect("asked to keep"))
}

fn render_into<F: Real>(splats: &Splats<F>, frame: &Frame, top_k: usize, keep: bool) -> (Vec<F>, Option<Kept<F>>) {
    check_top_k(top_k);
    let c = splats.channels;
    let binned = project_and_bin(splats.params.xy, splats.params.inv_scale, splats.params.theta, frame);
    let pixels = frame.width * frame.height;
    let mut out = vec![F::zero(); pixels * c];
    let mut bands = Vec::new();
    if pixels > 0 {
        let rows = band_tiles(frame) * TILE;
        let band = rows * frame.width;
        bands = out
            .par_chunks_mut(band * c)
            .enumerate()
            .map(|(b, chunk)| {
                let p0 = b * band;
                let mut kept = KeptBand::default();
                if keep {
                    let rows = chunk.len() / c / frame.width * frame.tiles_x();
                    kept.len.reserve_exact(rows * TILE);
                    kept.ids.reserve_exact(rows * TILE * top_k);
                    kept.weights.reserve_exact(rows * TILE * top_k);
                }
                let mut selection = Selection::new();
                for_each_row_in_band(&binned, frame, b, Some(top_k), |row, x0, y, lanes| {
                    if keep {
                        kept.push(row.slots());
                    }
                    let p = y * frame.width + x0 - p0;
                    let out = &mut chunk[p * c..(p + lanes) * c];
                    if c <= BLEND_LANES {
                        row.blend(splats.params.color, c, out);
                        return;
                    }
                    let slots = row.slots();
                    for (l, px) in out.chunks_exact_mut(c).enumerate() {
                        slots.take(l, &mut selection);
                        if selection.len > 0 {
                            blend(selection.weights(), selection.ids(), splats.params.color, px);
                        }
                    }
                });
                kept
            })
            .collect();
    }
    let kept = keep.then_some(Kept { bands, binned });
    (out, kept)
}

/// One pixel's share of the gradients: `selection` is its selection, `g`
/// the gradient of its colour; adds to `acc` (per Gaussian: d_cx, d_cy,
/// d_a, d_b, d_c, d_color…).
#[inline(always)]
fn pixel_backward<F: Real>(
    selection: &Selection<F>,
    projected: &[Projected<F>],
    color: &[F],
    g: &[F],
    xy: (usize, usize),
    acc: &mut [F],
) {
    // Three channels known when compiling: the loops over them unroll.
    if g.len() == 3 {
        pixel_backward_in::<F, 3>(selection, projected, color, g, xy, acc);
    } else {
        pixel_backward_in::<F, 0>(selection, projected, color, g, xy, acc);
    }
}

/// [`pixel_backward`] with `C` channels (0: `g.len()`).
#[inline(always)]
fn pixel_backward_in<F: Real, const C: usize>(
    selection: &Selection<F>,
    projected: &[Projected<F>],
    color: &[F],
    g: &[F],
    (x, y): (usize, usize),
    acc: &mut [F],
) {
    let (ids, weights) = (selection.ids(), selection.weights());
    let c = if C == 0 { g.len() } else { C };
    let g = &g[..c];
    let stride = 5 + c;
    let half = F::c(0.5);
    let mut u = [F::zero(); MAX_TOP_K];
    let denom = F::c(EPSILON) + weights.iter().copied().sum::<F>();
    let mut weighted = F::zero();
    for ((uk, id), w) in u.iter_mut().zip(ids).zip(weights) {
        let col = &color[*id as usize * c..(*id as usize + 1) * c];
        *uk = col.iter().zip(g).fold(F::zero(), |s, (a, b)| s + *a * *b);
        weighted = weighted + *w * *uk;
    }
    let (px, py) = (F::c(x as f64 + 0.5), F::c(y as f64 + 0.5));
    // One division per pixel, not three per entry (they were a tenth of the backward).
    let inv = F::one() / denom;
    let mean = weighted * inv;
    for ((uk, &id), &w) in u.iter().zip(ids).zip(weights) {
        let id = id as usize;
        let p = &projected[id];
        let (dx, dy) = (p.cx - px, p.cy - py);
        // ∂(Σ w·u / D)/∂w_k = u_k / D − Σ w·u / D².
        let d_w = (*uk - mean) * inv;
        let d_sigma = -w * d_w;
        let (geometry, colour) = acc[id * stride..(id + 1) * stride].split_at_mut(5);
        geometry[0] = geometry[0] + d_sigma * (p.a * dx + p.b * dy);
        geometry[1] = geometry[1] + d_sigma * (p.b * dx + p.c * dy);
        geometry[2] = geometry[2] + d_sigma * half * dx * dx;
        geometry[3] = geometry[3] + d_sigma * dx * dy;
        geometry[4] = geometry[4] + d_sigma * half * dy * dy;
        let share = w * inv;
        for (a, gc) in colour.iter_mut().zip(g) {
            *a = *a + share * *gc;
        }
    }
}

/// Gradients of `Σ d_out · render(splats)` with respect to every parameter.
pub fn render_backward<F: Real>(splats: &Splats<F>, frame: &Frame, top_k: usize, d_out: &[F]) -> SplatGrads<F> {
    check_top_k(top_k);
    let binned = project_and_bin(splats.params.xy, splats.params.inv_scale, splats.params.theta, frame);
    backward_over_bands(splats, frame, d_out, |band, acc| {
        let mut selection = Selection::new();
        for_each_row_in_band(&binned, frame, band, Some(top_k), |row, x0, y, lanes| {
            let g = pixels(d_out, frame, splats.channels, (x0, y), lanes);
            row_backward(
                row.slots(),
                (x0, y, lanes),
                g,
                splats,
                &binned.projected,
                &mut selection,
                acc,
            );
        });
    })
}

/// [`render_backward`] from the selection a [`render_keeping`] of the
/// same Gaussians and frame kept: the same gradients, bit for bit, without
/// selecting again.
pub fn render_backward_kept<F: Real>(splats: &Splats<F>, frame: &Frame, kept: &Kept<F>, d_out: &[F]) -> SplatGrads<F> {
    let bands = if frame.width * frame.height == 0 {
        0
    } else {
        frame.tiles_y().div_ceil(band_tiles(frame))
    };
    assert_eq!(kept.bands.len(), bands, "kept for another frame");
    backward_over_bands(splats, frame, d_out, |band, acc| {
        // A frame without pixels has bands of tile rows but nothing kept.
        let Some(kept_band) = kept.bands.get(band) else {
            return;
        };
        let (mut rows, mut at) = (0, 0);
        let mut selection = Selection::new();
        for_each_row_in_band(&kept.binned, frame, band, None, |_, x0, y, lanes| {
            let len: &[u8; TILE] = kept_band.len[rows * TILE..(rows + 1) * TILE].try_into().expect("a row");
            rows += 1;
            let slots = at..at + TILE * slots_used(len);
            at = slots.end;
            let row = RowSlots {
                len,
                ids: &kept_band.ids[slots.clone()],
                weights: &kept_band.weights[slots],
            };
            let g = pixels(d_out, frame, splats.channels, (x0, y), lanes);
            row_backward(
                row,
                (x0, y, lanes),
                g,
                splats,
                &kept.binned.projected,
                &mut selection,
                acc,
            );
        });
        assert_eq!(rows * TILE, kept_band.len.len(), "kept for another frame");
    })
}

/// Adds a tile row's share of the gradients to `acc`, pixel by pixel
/// ([`pixel_backward`]), from its selections; `g` is the output gradient
/// of its `lanes` pixels from `(x0, y)` (`[lanes, C]`).
#[inline(always)]
fn row_backward<F: Real>(
    row: RowSlots<'_, F>,
    (x0, y, lanes): (usize, usize, usize),
    g: &[F],
    splats: &Splats<F>,
    projected: &[Projected<F>],
    selection: &mut Selection<F>,
    acc: &mut [F],
) {
    let c = splats.channels;
    for l in 0..lanes {
        row.take(l, selection);
        if selection.len > 0 {
            let g = &g[l * c..(l + 1) * c];
            pixel_backward(selection, projected, splats.params.color, g, (x0 + l, y), acc);
        }
    }
}

/// Pixels `x0..x0 + n` of row `y` of an `[H, W, C]` image (`[n, C]`).
#[inline]
fn pixels<'a, F>(image: &'a [F], frame: &Frame, c: usize, (x0, y): (usize, usize), n: usize) -> &'a [F] {
    let start = y * frame.width + x0;
    &image[start * c..(start + n) * c]
}

/// Runs `per_band(band, accumulator)` over the fixed bands in parallel,
/// adds the accumulators in band order (the same sums whatever the thread
/// count), and turns them into parameter gradients through the projection.
fn backward_over_bands<F: Real>(
    splats: &Splats<F>,
    frame: &Frame,
    d_out: &[F],
    per_band: impl Fn(usize, &mut Vec<F>) + Sync,
) -> SplatGrads<F> {
    let (n, c) = (splats.len(), splats.channels);
    assert_eq!(d_out.len(), frame.width * frame.height * c, "d_out must be [H, W, C]");
    let stride = 5 + c;
    let bands = frame.tiles_y().div_ceil(band_tiles(frame));
    let partials: Vec<Vec<F>> = (0..bands)
        .into_par_iter()
        .map(|band| {
            let mut acc = vec![F::zero(); n * stride];
            per_band(band, &mut acc);
            acc
        })
        .collect();
    // Each value is the sum of the bands' in band order (ranges of
    // Gaussians in parallel; it was a serial pass over all the bands).
    let mut acc = vec![F::zero(); n * stride];
    let span = 1024 * stride;
    acc.par_chunks_mut(span).enumerate().for_each(|(i, out)| {
        for part in &partials {
            for (t, v) in out.iter_mut().zip(&part[i * span..]) {
                *t = *t + *v;
            }
        }
    });
    let mut grads = SplatGrads::zeros(n, c);
    let p = &splats.params;
    for i in 0..n {
        let a = &acc[i * stride..(i + 1) * stride];
        let (d_xy, d_inv, d_theta) = project_one_backward(
            [p.inv_scale[2 * i], p.inv_scale[2 * i + 1]],
            p.theta[i],
            frame,
            [a[0], a[1]],
            [a[2], a[3], a[4]],
        );
        grads.xy[2 * i..2 * i + 2].copy_from_slice(&d_xy);
        grads.inv_scale[2 * i..2 * i + 2].copy_from_slice(&d_inv);
        grads.theta[i] = d_theta;
        grads.color[i * c..(i + 1) * c].copy_from_slice(&a[5..]);
    }
    grads
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::top_k::{PRUNE_FROM, select_top_k, tile_survivors};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The kept selection gives the same render and the same gradients, bit
    /// for bit, as selecting again (with more candidates in a tile than
    /// K, so that candidates miss the bound and walks stop early).
    #[test]
    fn the_kept_selection_gives_the_same_render_and_gradients() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (n, w, h, c) = (300, 70, 45, 3);
        let xy: Vec<f32> = (0..2 * n).map(|_| rng.random_range(0.0..1.0)).collect();
        let inv_scale: Vec<f32> = (0..2 * n).map(|_| 1.0 / rng.random_range(1.0..9.0)).collect();
        let theta: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        let color: Vec<f32> = (0..c * n).map(|_| rng.random_range(0.0..1.0)).collect();
        let d_out: Vec<f32> = (0..w * h * c).map(|_| rng.random_range(-1.0..1.0)).collect();
        let splats = Splats {
            params: Params {
                xy: &xy[..],
                inv_scale: &inv_scale,
                theta: &theta,
                color: &color,
            },
            channels: c,
        };
        let frame = Frame::new(w, h);
        let binned = project_and_bin(&xy, &inv_scale, &theta, &frame);
        let most = (0..frame.tiles_x() * frame.tiles_y())
            .map(|t| binned.tile(t).len())
            .max()
            .unwrap();
        assert!(most > 2 * TILE, "{most} candidates in the fullest tile");
        for top_k in [1, 5, 10, 32] {
            let (kept_render, kept) = render_keeping(&splats, &frame, top_k);
            assert_eq!(kept_render, render(&splats, &frame, top_k));
            assert_eq!(
                render_backward_kept(&splats, &frame, &kept, &d_out),
                render_backward(&splats, &frame, top_k, &d_out)
            );
        }
    }

    /// Exact ties in σ are broken by Gaussian id: every Gaussian has a twin
    /// with the same parameters (so the same σ at every pixel), against a
    /// sort of every candidate by (σ, id), for K from 1 to the largest.
    #[test]
    fn ties_in_sigma_go_to_the_lower_id() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (half, w, h) = (60, 40, 35);
        let mut xy: Vec<f32> = (0..2 * half).map(|_| rng.random_range(0.0..1.0)).collect();
        let mut inv_scale: Vec<f32> = (0..2 * half).map(|_| 1.0 / rng.random_range(2.0..12.0)).collect();
        let mut theta: Vec<f32> = (0..half).map(|_| rng.random_range(-3.0..3.0)).collect();
        xy.extend_from_within(..);
        inv_scale.extend_from_within(..);
        theta.extend_from_within(..);
        let frame = Frame::new(w, h);
        let binned = project_and_bin(&xy, &inv_scale, &theta, &frame);
        let mut tied = 0;
        for top_k in [1, 3, 10, MAX_TOP_K] {
            for y in 0..h {
                for x in 0..w {
                    let (px, py) = (x as f32 + 0.5, y as f32 + 0.5);
                    let tile = binned.tile((y / TILE) * frame.tiles_x() + x / TILE);
                    let mut reference: Vec<(f32, u32)> = tile
                        .iter()
                        .map(|&id| {
                            let p = &binned.projected[id as usize];
                            let (dx, dy) = (p.cx - px, p.cy - py);
                            (0.5 * p.a * dx * dx + 0.5 * p.c * dy * dy + p.b * dx * dy, id)
                        })
                        .filter(|(s, _)| *s >= 0.0 && s.is_finite())
                        .collect();
                    reference.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    reference.truncate(top_k);
                    tied += reference.windows(2).filter(|p| p[0].0 == p[1].0).count();
                    assert_eq!(
                        select_top_k(&binned, &frame, top_k, x, y),
                        reference,
                        "pixel ({x}, {y}), K {top_k}"
                    );
                }
            }
        }
        assert!(tied > 0, "no tie was selected");
    }

    /// Pruning a tile's candidates changes no pixel's selection: against a
    /// stable sort of every candidate's σ (computed as the kernel does), on
    /// dense tiles of round and needle-thin Gaussians far from the origin.
    #[test]
    fn pruned_tiles_select_what_all_candidates_select() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (n, w, h) = (3000, 2000, 40);
        let xy: Vec<f32> = (0..n)
            .flat_map(|_| [rng.random_range(0.9..1.0), rng.random_range(0.0..1.0)])
            .collect();
        let inv_scale: Vec<f32> = (0..n)
            .flat_map(|i| {
                let s = rng.random_range(2.0..12.0);
                if i % 3 == 0 {
                    [1.0 / s, 1.0 / (s * 30.0)]
                } else {
                    [1.0 / s, 1.0 / s]
                }
            })
            .collect();
        let theta: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        let frame = Frame::new(w, h);
        let binned = project_and_bin(&xy, &inv_scale, &theta, &frame);
        let (mut pruned, mut dense) = (0, 0);
        for top_k in [1, 4, 10] {
            for y in 0..h {
                for x in 1800..w {
                    let tile = (y / TILE) * frame.tiles_x() + x / TILE;
                    let all = binned.tile(tile);
                    let (px, py) = (x as f32 + 0.5, y as f32 + 0.5);
                    let mut reference: Vec<(f32, usize, u32)> = all
                        .iter()
                        .enumerate()
                        .map(|(slot, &id)| {
                            let p = &binned.projected[id as usize];
                            let (dx, dy) = (p.cx - px, p.cy - py);
                            (0.5 * p.a * dx * dx + 0.5 * p.c * dy * dy + p.b * dx * dy, slot, id)
                        })
                        .filter(|(s, ..)| *s >= 0.0 && s.is_finite())
                        .collect();
                    reference.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    let reference: Vec<(f32, u32)> = reference.iter().take(top_k).map(|r| (r.0, r.2)).collect();
                    assert_eq!(
                        select_top_k(&binned, &frame, top_k, x, y),
                        reference,
                        "pixel ({x}, {y}), K {top_k}"
                    );
                    if all.len() > PRUNE_FROM * top_k {
                        dense += 1;
                        let mut kept = Vec::new();
                        let bx = ((x / TILE) * TILE, ((x / TILE + 1) * TILE).min(w));
                        let by = ((y / TILE) * TILE, ((y / TILE + 1) * TILE).min(h));
                        tile_survivors(&binned.projected, all, bx, by, top_k, &mut kept);
                        pruned += all.len() - kept.len();
                    }
                }
            }
        }
        assert!(
            dense > 0 && pruned > 0,
            "{dense} dense pixels, {pruned} candidates pruned"
        );
    }
}
