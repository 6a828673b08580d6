//! The top-K selection of the blend: for every pixel, the `top_k`
//! Gaussians of smallest Mahalanobis distance σ among its tile's, found a
//! tile row (16 pixels) at a time in fixed-size registers, with the tile's
//! candidates pruned first where many overlap it.

use vramfit_gauss::tile::TILE;
use vramfit_gauss::{EXP_LANES, Real, wide};

use super::project::{Binned, Frame, Projected};

/// Largest supported top-K (the selection lives on the stack).
pub const MAX_TOP_K: usize = 32;
// A kept pixel's count is a byte.
const _: () = assert!(MAX_TOP_K <= u8::MAX as usize);
/// Added to the weight sum before normalising.
pub const EPSILON: f64 = 1e-4;
/// Channels a blend sums in registers; wider colours are summed in place.
pub(super) const BLEND_LANES: usize = 4;

/// The candidates of one tile gathered into contiguous arrays, so that the
/// per-row selection streams through memory instead of chasing indices.
#[derive(Debug, Default)]
pub(super) struct TileCandidates<F> {
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
    pub(super) fn gather(&mut self, binned: &Binned<F>, frame: &Frame, tile: usize, top_k: usize) {
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
    pub(super) fn select_row(&self, top_k: usize, x0: usize, y: usize, row: &mut RowTopK<F>) {
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
pub(super) struct RowTopK<F> {
    sigma: [[F; TILE]; MAX_TOP_K],
    id: [[u32; TILE]; MAX_TOP_K],
    weight: [[F; TILE]; MAX_TOP_K],
    pub(super) len: [u8; TILE],
}

// A row's slot is one block of weights.
const _: () = assert!(TILE == EXP_LANES);

impl<F: Real> RowTopK<F> {
    pub(super) fn new() -> Self {
        Self {
            sigma: [[F::zero(); TILE]; MAX_TOP_K],
            id: [[0; TILE]; MAX_TOP_K],
            weight: [[F::zero(); TILE]; MAX_TOP_K],
            len: [0; TILE],
        }
    }

    /// Slots some lane uses.
    pub(super) fn used(&self) -> usize {
        slots_used(&self.len)
    }

    /// The row's selections, as the kept selection stores them.
    pub(super) fn slots(&self) -> RowSlots<'_, F> {
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
    pub(super) fn blend(&self, color: &[F], c: usize, out: &mut [F]) {
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
pub(super) fn slots_used(len: &[u8; TILE]) -> usize {
    len.iter().copied().max().unwrap_or(0) as usize
}

/// A tile row's selections: pixel `l` has `len[l]` entries, entry k's id
/// and weight at `ids[k·TILE + l]` and `weights[k·TILE + l]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct RowSlots<'a, F> {
    pub(super) len: &'a [u8; TILE],
    pub(super) ids: &'a [u32],
    pub(super) weights: &'a [F],
}

impl<F: Real> RowSlots<'_, F> {
    /// Pixel `l`'s selection into `pixel`.
    #[inline]
    pub(super) fn take(&self, l: usize, pixel: &mut Selection<F>) {
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
pub(super) struct Selection<F> {
    pub(super) len: usize,
    ids: [u32; MAX_TOP_K],
    weights: [F; MAX_TOP_K],
}

impl<F: Real> Selection<F> {
    pub(super) fn new() -> Self {
        Self {
            len: 0,
            ids: [0; MAX_TOP_K],
            weights: [F::zero(); MAX_TOP_K],
        }
    }

    /// The selected Gaussians.
    pub(super) fn ids(&self) -> &[u32] {
        &self.ids[..self.len]
    }

    /// Their weights.
    pub(super) fn weights(&self) -> &[F] {
        &self.weights[..self.len]
    }
}

/// Tiles with more than this many candidates per selected one are pruned.
pub(super) const PRUNE_FROM: usize = 2;

/// Appends to `out`, in order, the candidates `ids` that some pixel of the
/// tile `[x0, x1) × [y0, y1)` may select. σ is a convex quadratic in the
/// pixel centre, so its largest value over the tile is at a corner, and
/// `½·λ_min·dist²` (dist from the centre to the tile) bounds it from below.
/// Each pixel's K-th smallest σ is at most `T`, the K-th smallest of the
/// candidates' corner maxima; a candidate whose lower bound is above `T`
/// is beaten at every pixel by K others and is never selected. Both sides
/// allow for the kernels' rounding, so the selection is exactly the one
/// from all candidates.
pub(super) fn tile_survivors<F: Real>(
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

pub(super) fn check_top_k(top_k: usize) {
    assert!(
        (1..=MAX_TOP_K).contains(&top_k),
        "top_k must be in 1..={MAX_TOP_K}, got {top_k}"
    );
}
