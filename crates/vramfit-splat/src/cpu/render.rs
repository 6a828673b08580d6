//! Tile-based top-K normalised blending: forward and its exact backward,
//! either from the selection the forward kept ([`render_keeping`],
//! [`render_backward_kept`]) or selecting again ([`render_backward`]).
//! A tile row's 16 pixels are selected together ([`TileCandidates`]).

use rayon::prelude::*;

use vramfit_gauss::tile::TILE;

use super::project::{Binned, Frame, Projected, project_and_bin, project_one_backward};
use crate::params::Params;
use vramfit_gauss::{EXP_LANES, Real, wide};

/// Largest supported top-K (the selection lives on the stack).
pub const MAX_TOP_K: usize = 32;
// A kept pixel's count is a byte.
const _: () = assert!(MAX_TOP_K <= u8::MAX as usize);
/// Added to the weight sum before normalising.
pub const EPSILON: f64 = 1e-4;
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

/// The candidates of one tile gathered into contiguous arrays, so that the
/// per-row selection streams through memory instead of chasing indices.
#[derive(Debug, Default)]
struct TileCandidates<F> {
    ids: Vec<u32>,
    /// (σ at the tile's centre, id): the scan order, reused between tiles.
    order: Vec<(F, u32)>,
    cx: Vec<F>,
    cy: Vec<F>,
    a: Vec<F>,
    b: Vec<F>,
    c: Vec<F>,
}

impl<F: Real> TileCandidates<F> {
    /// Gathers tile `tile`'s Gaussians (reusing the buffers), without those
    /// that no pixel of the tile can select ([`tile_survivors`]), in their
    /// binned order: every pixel's selection is the one from all of them.
    fn gather(&mut self, binned: &Binned<F>, frame: &Frame, tile: usize, top_k: usize) {
        let all = binned.tile(tile);
        self.ids.clear();
        if all.len() > PRUNE_FROM * top_k {
            let (tx, ty) = (tile % frame.tiles_x(), tile / frame.tiles_x());
            let bx = (tx * TILE, ((tx + 1) * TILE).min(frame.width));
            let by = (ty * TILE, ((ty + 1) * TILE).min(frame.height));
            tile_survivors(&binned.projected, all, bx, by, top_k, &mut self.ids);
        } else {
            self.ids.extend_from_slice(all);
        }
        // Scanned nearest first (σ at the tile's centre), the selection
        // fills with good candidates and its bounds tighten at once, so
        // most later candidates miss every lane's bound and walks stay
        // short; ties are broken by Gaussian id, so the order of the scan
        // does not change what is selected.
        let (tx, ty) = (tile % frame.tiles_x(), tile / frame.tiles_x());
        let (mx, my) = (
            F::c((tx * TILE) as f64 + 0.5 * TILE as f64),
            F::c((ty * TILE) as f64 + 0.5 * TILE as f64),
        );
        let p = &binned.projected;
        let centre = |i: u32| {
            let g = &p[i as usize];
            let (dx, dy) = (g.cx - mx, g.cy - my);
            let s = F::c(0.5) * g.a * dx * dx + F::c(0.5) * g.c * dy * dy + g.b * dx * dy;
            if s.is_nan() { F::infinity() } else { s }
        };
        // Each key computed once, not once per comparison.
        self.order.clear();
        self.order.extend(self.ids.iter().map(|&i| (centre(i), i)));
        self.order
            .sort_by(|a, b| a.0.partial_cmp(&b.0).expect("not NaN").then(a.1.cmp(&b.1)));
        self.ids.clear();
        self.ids.extend(self.order.iter().map(|o| o.1));
        let ids = &self.ids;
        let pick = |dst: &mut Vec<F>, f: &dyn Fn(usize) -> F| {
            dst.clear();
            dst.extend(ids.iter().map(|&i| f(i as usize)));
        };
        pick(&mut self.cx, &|i| p[i].cx);
        pick(&mut self.cy, &|i| p[i].cy);
        pick(&mut self.a, &|i| p[i].a);
        pick(&mut self.b, &|i| p[i].b);
        pick(&mut self.c, &|i| p[i].c);
    }

    /// Top-K of each pixel of the tile row from `(x0, y)`: pixel `x0 + l`'s
    /// selection goes to lane `l` of `row` (lanes past the frame's edge
    /// are selected too, and ignored). The row's pixels are selected
    /// together, one candidate at a time for all of them, with compares and
    /// blends instead of branches: per pixel, the selection had a
    /// mispredicted branch every few candidates. The result does not depend
    /// on the order candidates are offered in ((σ, id) is a total order),
    /// so it is the same as a plain scan's.
    fn select_row(&self, top_k: usize, x0: usize, y: usize, row: &mut RowTopK<F>) {
        wide(
            #[inline(always)]
            || self.select_row_here(top_k, x0, y, row),
        )
    }

    #[inline(always)]
    fn select_row_here(&self, top_k: usize, x0: usize, y: usize, row: &mut RowTopK<F>) {
        let half = F::c(0.5);
        let py = F::c(y as f64 + 0.5);
        let px: [F; TILE] = std::array::from_fn(|l| F::c((x0 + l) as f64 + 0.5));
        let RowTopK { sigma, id: ids, .. } = row;
        let (sigma, ids) = (&mut sigma[..top_k], &mut ids[..top_k]);
        // Empty slots: any valid σ is below them.
        sigma.fill([F::infinity(); TILE]);
        ids.fill([u32::MAX; TILE]);
        let last = top_k - 1;
        // Slots from `filled` on are empty in every lane.
        let mut filled = 0;
        for (j, &id) in self.ids.iter().enumerate() {
            let (cx, a, b) = (self.cx[j], self.a[j], self.b[j]);
            let dy = self.cy[j] - py;
            let cdy = half * self.c[j] * dy * dy;
            // σ as a single pixel's would be (same operations, same order);
            // NaN where it cannot be selected (infinite: zero weight;
            // rounding-negative: not a weight above 1), which no compare passes.
            let mut s = [F::zero(); TILE];
            for (s, px) in s.iter_mut().zip(px) {
                let dx = cx - px;
                let v = half * a * dx * dx + cdy + b * dx * dy;
                *s = if v >= F::zero() && v <= F::max_value() {
                    v
                } else {
                    F::nan()
                };
            }
            if !any_below(&s, id, &sigma[last], &ids[last]) {
                continue;
            }
            // Down from the first slot empty in every lane (those below it
            // stay empty): a slot takes the one above it where the candidate
            // is below that too, else the candidate where it is below this
            // one; the walk stops where no lane moves further.
            let first = filled.min(last);
            filled += 1;
            for k in (0..=first).rev() {
                let (upper, lower) = sigma.split_at_mut(k);
                let (upper_ids, lower_ids) = ids.split_at_mut(k);
                let (slot, slot_id) = (&mut lower[0], &mut lower_ids[0]);
                // Slot 0 has nothing above: an empty one is never taken.
                let (prev, prev_id) = match (upper.last(), upper_ids.last()) {
                    (Some(p), Some(i)) => (*p, *i),
                    _ => ([F::neg_infinity(); TILE], [0; TILE]),
                };
                let mut moved = false;
                for l in 0..TILE {
                    let here = below(s[l], id, slot[l], slot_id[l]);
                    let above = below(s[l], id, prev[l], prev_id[l]);
                    slot[l] = if above {
                        prev[l]
                    } else if here {
                        s[l]
                    } else {
                        slot[l]
                    };
                    slot_id[l] = if above {
                        prev_id[l]
                    } else if here {
                        id
                    } else {
                        slot_id[l]
                    };
                    moved |= above;
                }
                if !moved {
                    break;
                }
            }
        }
        for (n, l) in row.len.iter_mut().zip(0..TILE) {
            *n = row.sigma[..top_k].iter().take_while(|s| s[l] < F::infinity()).count() as u8;
        }
        // The weights of the slots some lane uses, a slot (one block of
        // lanes) at a time: an empty slot's σ is infinite, its weight 0.
        let used = row.used();
        for (w, s) in row.weight[..used].iter_mut().zip(&row.sigma) {
            *w = F::exp_neg(s);
        }
    }
}

/// Whether `(σ, id)` is below `(slot, slot_id)` in (σ, id) order; no
/// branch, so that it runs on whole vectors of lanes.
#[inline(always)]
fn below<F: Real>(s: F, id: u32, slot: F, slot_id: u32) -> bool {
    (s < slot) | ((s == slot) & (id < slot_id))
}

/// Whether `(σ, id)` is below `(slot, slot_id)` in any lane.
#[inline(always)]
fn any_below<F: Real>(s: &[F; TILE], id: u32, slot: &[F; TILE], slot_id: &[u32; TILE]) -> bool {
    let mut any = false;
    for l in 0..TILE {
        any |= below(s[l], id, slot[l], slot_id[l]);
    }
    any
}

/// The selections of one tile row's pixels, lane by lane: slot k of
/// pixel `l` is `(sigma[k][l], id[k][l])`, in ascending (σ, id), and its
/// weight `exp(−σ)`.
#[derive(Debug)]
struct RowTopK<F> {
    sigma: [[F; TILE]; MAX_TOP_K],
    id: [[u32; TILE]; MAX_TOP_K],
    weight: [[F; TILE]; MAX_TOP_K],
    len: [u8; TILE],
}

// A row's slot is one block of weights.
const _: () = assert!(TILE == EXP_LANES);

impl<F: Real> RowTopK<F> {
    fn new() -> Self {
        Self {
            sigma: [[F::zero(); TILE]; MAX_TOP_K],
            id: [[0; TILE]; MAX_TOP_K],
            weight: [[F::zero(); TILE]; MAX_TOP_K],
            len: [0; TILE],
        }
    }

    /// Slots some lane uses.
    fn used(&self) -> usize {
        slots_used(&self.len)
    }

    /// The row's selections, as the kept selection stores them.
    fn slots(&self) -> RowSlots<'_, F> {
        let used = self.used();
        RowSlots {
            len: &self.len,
            ids: self.id[..used].as_flattened(),
            weights: self.weight[..used].as_flattened(),
        }
    }

    /// The normalised blends of the row's pixels into `out` (`[lanes, c]`,
    /// zeroed; `c` ≤ [`BLEND_LANES`]), all lanes together: the same sums,
    /// in the same order, as [`blend`]'s for each pixel (a slot past a
    /// pixel's count adds nothing to it).
    fn blend(&self, color: &[F], c: usize, out: &mut [F]) {
        wide(
            #[inline(always)]
            || {
                let mut acc = [[F::zero(); TILE]; BLEND_LANES];
                let mut sum = [F::zero(); TILE];
                for k in 0..self.used() {
                    for (l, sum) in sum.iter_mut().enumerate() {
                        let taken = k < self.len[l] as usize;
                        let w = if taken { self.weight[k][l] } else { F::zero() };
                        *sum = *sum + w;
                    }
                    for (ch, acc) in acc[..c].iter_mut().enumerate() {
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let taken = k < self.len[l] as usize;
                            let id = if taken { self.id[k][l] as usize } else { 0 };
                            let term = self.weight[k][l] * color[id * c + ch];
                            *acc = *acc + if taken { term } else { F::zero() };
                        }
                    }
                }
                for (l, px) in out.chunks_exact_mut(c).enumerate() {
                    if self.len[l] > 0 {
                        let denom = F::c(EPSILON) + sum[l];
                        for (p, acc) in px.iter_mut().zip(&acc) {
                            *p = acc[l] / denom;
                        }
                    }
                }
            },
        )
    }
}

/// Slots some lane of a row uses: its largest count.
fn slots_used(len: &[u8; TILE]) -> usize {
    len.iter().copied().max().unwrap_or(0) as usize
}

/// A tile row's selections: pixel `l` has `len[l]` entries, entry k's id
/// and weight at `ids[k·TILE + l]` and `weights[k·TILE + l]`.
#[derive(Debug, Clone, Copy)]
struct RowSlots<'a, F> {
    len: &'a [u8; TILE],
    ids: &'a [u32],
    weights: &'a [F],
}

impl<F: Real> RowSlots<'_, F> {
    /// Pixel `l`'s selection into `pixel`.
    #[inline]
    fn take(&self, l: usize, pixel: &mut Selection<F>) {
        let len = self.len[l] as usize;
        for (k, (id, w)) in pixel.ids[..len].iter_mut().zip(&mut pixel.weights[..len]).enumerate() {
            *id = self.ids[k * TILE + l];
            *w = self.weights[k * TILE + l];
        }
        pixel.len = len;
    }
}

/// One pixel's selection: the K largest weights `w = exp(−σ)`, found as
/// the K smallest σ (w is decreasing: the same set without an exp per
/// candidate), in ascending σ; ties: the lower Gaussian index wins.
#[derive(Debug)]
struct Selection<F> {
    len: usize,
    ids: [u32; MAX_TOP_K],
    weights: [F; MAX_TOP_K],
}

impl<F: Real> Selection<F> {
    fn new() -> Self {
        Self {
            len: 0,
            ids: [0; MAX_TOP_K],
            weights: [F::zero(); MAX_TOP_K],
        }
    }

    /// The selected Gaussians.
    fn ids(&self) -> &[u32] {
        &self.ids[..self.len]
    }

    /// Their weights.
    fn weights(&self) -> &[F] {
        &self.weights[..self.len]
    }
}

/// Tiles with more than this many candidates per selected one are pruned.
const PRUNE_FROM: usize = 2;

/// Appends to `out`, in order, the candidates `ids` that some pixel of the
/// tile `[x0, x1) × [y0, y1)` may select. σ is a convex quadratic in the
/// pixel centre, so its largest value over the tile is at a corner, and
/// `½·λ_min·dist²` (dist from the centre to the tile) bounds it from below.
/// Each pixel's K-th smallest σ is at most `T`, the K-th smallest of the
/// candidates' corner maxima; a candidate whose lower bound is above `T`
/// is beaten at every pixel by K others and is never selected. Both sides
/// allow for the kernels' rounding, so the selection is exactly the one
/// from all candidates.
fn tile_survivors<F: Real>(
    projected: &[Projected<F>],
    ids: &[u32],
    (x0, x1): (usize, usize),
    (y0, y1): (usize, usize),
    top_k: usize,
    out: &mut Vec<u32>,
) {
    // Pixel centres of the tile's corners.
    let (lx, hx) = (x0 as f64 + 0.5, x1 as f64 - 0.5);
    let (ly, hy) = (y0 as f64 + 0.5, y1 as f64 - 0.5);
    // Eight times the kernels' float epsilon: every rounding bound below is loose.
    let eps = 8.0 * F::epsilon().to_f64().unwrap_or(1e-6);
    let bounds: Vec<(f64, f64)> = ids
        .iter()
        .map(|&i| {
            let p = &projected[i as usize];
            let [cx, cy, a, b, c] = [p.cx, p.cy, p.a, p.b, p.c].map(|v| v.to_f64().unwrap_or(f64::NAN));
            let sigma = |dx: f64, dy: f64| 0.5 * a * dx * dx + 0.5 * c * dy * dy + b * dx * dy;
            let far = [(lx, ly), (hx, ly), (lx, hy), (hx, hy)]
                .map(|(x, y)| sigma(cx - x, cy - y))
                .into_iter()
                .fold(f64::NEG_INFINITY, f64::max);
            // The kernels' σ at a pixel of the tile differs from the exact one
            // by the rounding of d = centre − pixel (relative to the coordinates,
            // not to d) and of the products (relative to the largest term).
            let reach = (cx - lx)
                .abs()
                .max((cx - hx).abs())
                .max((cy - ly).abs().max((cy - hy).abs()));
            let (ex, ey) = (eps * (cx.abs() + hx), eps * (cy.abs() + hy));
            let slack = eps * (0.5 * a.abs() + 0.5 * c.abs() + b.abs()) * reach * reach
                + (a.abs() + b.abs()) * reach * ex
                + (c.abs() + b.abs()) * reach * ey
                + f64::MIN_POSITIVE;
            let (dx, dy) = ((lx - cx).max(cx - hx).max(0.0), (ly - cy).max(cy - hy).max(0.0));
            let lambda_min = 0.5 * (a + c) - (0.25 * (a - c) * (a - c) + b * b).sqrt();
            let near = 0.5 * lambda_min.max(0.0) * (dx * dx + dy * dy);
            // NaN anywhere: keep the candidate (it is never selected anyway).
            if far.is_nan() || near.is_nan() || slack.is_nan() {
                (f64::INFINITY, f64::NEG_INFINITY)
            } else {
                (far + slack, near - slack)
            }
        })
        .collect();
    let mut highs: Vec<f64> = bounds.iter().map(|b| b.0).collect();
    let k = top_k.min(highs.len()) - 1;
    let (_, t, _) = highs.select_nth_unstable_by(k, f64::total_cmp);
    let t = *t;
    out.extend(ids.iter().zip(&bounds).filter(|(_, b)| b.1 <= t).map(|(i, _)| *i));
}

/// Top-K selection for pixel `(x, y)`: `(σ, gaussian id)` in ascending σ.
pub fn select_top_k<F: Real>(binned: &Binned<F>, frame: &Frame, top_k: usize, x: usize, y: usize) -> Vec<(F, u32)> {
    check_top_k(top_k);
    let mut tile = TileCandidates::default();
    tile.gather(binned, frame, (y / TILE) * frame.tiles_x() + x / TILE, top_k);
    let mut row = RowTopK::new();
    tile.select_row(top_k, x / TILE * TILE, y, &mut row);
    let l = x % TILE;
    (0..row.len[l] as usize)
        .map(|k| (row.sigma[k][l], row.id[k][l]))
        .collect()
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

/// Channels a blend sums in registers; wider colours are summed in place.
const BLEND_LANES: usize = 4;

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
