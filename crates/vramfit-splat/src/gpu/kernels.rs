//! The CubeCL kernels of the lean fit, twins of [`crate::cpu`]: projection,
//! tile binning (count, scan, scatter), top-K render forward and backward,
//! and the banded SSIM + L1 pipeline. All arrays are flat, row major, f32
//! unless named otherwise; planes of a band are `[rows, W, C]`.
//!
//! Selection rule, as on the CPU: a pixel blends the K candidates with the
//! smallest `(σ, gaussian id)`. Candidates reach a tile in any order (the
//! scatter uses atomics), so the id breaks ties explicitly.

// Kernel code is expanded by `#[cube]`, which supports comparisons but not
// `Range::contains`.
#![allow(clippy::manual_range_contains)]

use cubecl::prelude::*;

/// Side of a screen tile (must equal [`crate::cpu::project::TILE`]).
pub const TILE: u32 = 16;
/// Units per cube: one per pixel of a tile, and the width of every 1-D launch.
pub const UNITS: u32 = TILE * TILE;
/// Taps of the SSIM window (must match [`crate::cpu::ssim`]).
pub const TAPS: u32 = 11;
/// Added to the weight sum before normalising (as on the CPU).
const EPSILON: f32 = 1e-4;
/// Stands in for +∞ (WGSL has no infinity literal).
const BIG: f32 = 3.0e38;
const NO_ID: u32 = 0xFFFF_FFFF;
/// Values per Gaussian in the gradient accumulator before the colour:
/// d_cx, d_cy, d_a, d_b, d_c.
pub const GEOMETRY_GRADS: u32 = 5;

/// Writes `value` to `a[0..len)`.
#[cube(launch)]
pub fn fill_u32(a: &mut Array<u32>, value: u32, len: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < len {
        a[i as usize] = value;
    }
}

/// Writes `value` to `a[0..len)`.
#[cube(launch)]
pub fn fill_f32(a: &mut Array<f32>, value: f32, len: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < len {
        a[i as usize] = value;
    }
}

/// True for a finite value (false for NaN, whose comparisons all fail).
#[cube]
fn finite(v: f32) -> bool {
    v > -BIG && v < BIG
}

/// Projects each Gaussian: `conic[5i..]` = centre and conic `(cx, cy, a, b,
/// c)`, `rect[4i..]` = tile rectangle `[x0, x1) × [y0, y1)` (empty when
/// culled). See `cpu::project::project_one`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn project(
    xy: &Array<f32>,
    inv_scale: &Array<f32>,
    theta: &Array<f32>,
    conic: &mut Array<f32>,
    rect: &mut Array<u32>,
    n: u32,
    width: f32,
    height: f32,
    zoom_x: f32,
    zoom_y: f32,
    tiles_x: u32,
    tiles_y: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let iu = i as usize;
        let cx = xy[2 * iu] * width;
        let cy = xy[2 * iu + 1] * height;
        let t = theta[iu];
        let s = f32::sin(t);
        let co = f32::cos(t);
        let q1 = inv_scale[2 * iu];
        let q2 = inv_scale[2 * iu + 1];
        let p1 = q1 * q1;
        let p2 = q2 * q2;
        let a = (p1 * co * co + p2 * s * s) / (zoom_x * zoom_x);
        let c = (p1 * s * s + p2 * co * co) / (zoom_y * zoom_y);
        let b = (p1 - p2) * s * co / (zoom_x * zoom_y);
        conic[5 * iu] = cx;
        conic[5 * iu + 1] = cy;
        conic[5 * iu + 2] = a;
        conic[5 * iu + 3] = b;
        conic[5 * iu + 4] = c;
        let mut x0 = 0u32;
        let mut x1 = 0u32;
        let mut y0 = 0u32;
        let mut y1 = 0u32;
        let det_x = a * c - b * b;
        let det_sigma = 1.0 / det_x;
        if det_x > 0.0 && finite(det_sigma) && det_sigma > 1e-12 && finite(cx) && finite(cy) {
            let s11 = c * det_sigma;
            let s22 = a * det_sigma;
            let m = 0.5 * (s11 + s22);
            let lambda = m + f32::sqrt(f32::max(m * m - det_sigma, 0.1));
            let r = f32::ceil(3.0 * f32::sqrt(lambda));
            if finite(r) {
                let tile = TILE as f32;
                let tx = tiles_x as f32;
                let ty = tiles_y as f32;
                x0 = u32::cast_from(f32::clamp(f32::floor((cx - r) / tile), 0.0, tx));
                x1 = u32::cast_from(f32::clamp(f32::ceil((cx + r) / tile), 0.0, tx));
                y0 = u32::cast_from(f32::clamp(f32::floor((cy - r) / tile), 0.0, ty));
                y1 = u32::cast_from(f32::clamp(f32::ceil((cy + r) / tile), 0.0, ty));
                if x0 >= x1 || y0 >= y1 {
                    x0 = 0;
                    x1 = 0;
                    y0 = 0;
                    y1 = 0;
                }
            }
        }
        rect[4 * iu] = x0;
        rect[4 * iu + 1] = x1;
        rect[4 * iu + 2] = y0;
        rect[4 * iu + 3] = y1;
    }
}

/// Counts the (Gaussian, tile) pairs of each tile in tile rows
/// `[row0, row1)`: `counts[(ty − row0)·tiles_x + tx] += 1`.
#[cube(launch)]
pub fn count_pairs(rect: &Array<u32>, counts: &mut Array<Atomic<u32>>, n: u32, tiles_x: u32, row0: u32, row1: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let iu = i as usize;
        let x0 = rect[4 * iu];
        let x1 = rect[4 * iu + 1];
        let y0 = u32::max(rect[4 * iu + 2], row0);
        let y1 = u32::min(rect[4 * iu + 3], row1);
        for ty in y0..y1 {
            for tx in x0..x1 {
                counts[((ty - row0) * tiles_x + tx) as usize].fetch_add(1u32);
            }
        }
    }
}

/// Exclusive prefix sum of `counts[0..m)` into `offsets[0..=m]`, in one
/// cube of [`UNITS`] units (each sums a contiguous run, then the runs'
/// totals are scanned in shared memory).
#[cube(launch)]
pub fn exclusive_scan(counts: &Array<u32>, offsets: &mut Array<u32>, m: u32) {
    let per = m.div_ceil(UNITS);
    let begin = u32::min(UNIT_POS * per, m);
    let end = u32::min(begin + per, m);
    let mut sum = 0u32;
    for i in begin..end {
        sum += counts[i as usize];
    }
    let mut part = SharedMemory::<u32>::new(UNITS as usize);
    part[UNIT_POS as usize] = sum;
    sync_cube();
    if UNIT_POS == 0 {
        let mut run = 0u32;
        for j in 0..UNITS {
            let v = part[j as usize];
            part[j as usize] = run;
            run += v;
        }
        offsets[m as usize] = run;
    }
    sync_cube();
    let mut run = part[UNIT_POS as usize];
    for i in begin..end {
        offsets[i as usize] = run;
        run += counts[i as usize];
    }
}

/// Writes each Gaussian's index into the slots of the tiles it overlaps in
/// tile rows `[row0, row1)`; `fill` (zeroed) hands out slots within a tile.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn scatter_pairs(
    rect: &Array<u32>,
    offsets: &Array<u32>,
    fill: &mut Array<Atomic<u32>>,
    ids: &mut Array<u32>,
    n: u32,
    tiles_x: u32,
    row0: u32,
    row1: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let iu = i as usize;
        let x0 = rect[4 * iu];
        let x1 = rect[4 * iu + 1];
        let y0 = u32::max(rect[4 * iu + 2], row0);
        let y1 = u32::min(rect[4 * iu + 3], row1);
        for ty in y0..y1 {
            for tx in x0..x1 {
                let t = ((ty - row0) * tiles_x + tx) as usize;
                let slot = offsets[t] + fill[t].fetch_add(1u32);
                ids[slot as usize] = i;
            }
        }
    }
}

/// The top-K of pixel centre `(px, py)` over the candidates
/// `ids[start..end)` of this cube's tile: `(σ, id)` ascending in
/// `sigma`/`sel`; returns how many were selected. Every unit of the cube
/// must call it (candidates are staged through shared memory in chunks).
#[cube]
#[allow(clippy::too_many_arguments)]
fn select_top_k(
    ids: &Array<u32>,
    start: u32,
    end: u32,
    conic: &Array<f32>,
    px: f32,
    py: f32,
    sigma: &mut Array<f32>,
    sel: &mut Array<u32>,
    #[comptime] k: usize,
) -> u32 {
    let kk = comptime!(k as u32);
    let mut s_cx = SharedMemory::<f32>::new(UNITS as usize);
    let mut s_cy = SharedMemory::<f32>::new(UNITS as usize);
    let mut s_a = SharedMemory::<f32>::new(UNITS as usize);
    let mut s_b = SharedMemory::<f32>::new(UNITS as usize);
    let mut s_c = SharedMemory::<f32>::new(UNITS as usize);
    let mut s_id = SharedMemory::<u32>::new(UNITS as usize);
    let mut len = 0u32;
    let mut bound = BIG.runtime();
    let mut bound_id = NO_ID.runtime();
    let mut chunk = start;
    while chunk < end {
        let j = chunk + UNIT_POS;
        if j < end {
            let id = ids[j as usize];
            let g = (5 * id) as usize;
            let u = UNIT_POS as usize;
            s_id[u] = id;
            s_cx[u] = conic[g];
            s_cy[u] = conic[g + 1];
            s_a[u] = conic[g + 2];
            s_b[u] = conic[g + 3];
            s_c[u] = conic[g + 4];
        }
        sync_cube();
        let count = u32::min(end - chunk, UNITS);
        for q in 0..count {
            let qu = q as usize;
            let dx = s_cx[qu] - px;
            let dy = s_cy[qu] - py;
            let sg = 0.5 * s_a[qu] * dx * dx + 0.5 * s_c[qu] * dy * dy + s_b[qu] * dx * dy;
            let id = s_id[qu];
            if sg >= 0.0 && sg < BIG && (sg < bound || (sg == bound && id < bound_id)) {
                if len == kk {
                    len -= 1;
                }
                let mut pos = len;
                let mut moving = true;
                while moving {
                    if pos == 0 {
                        moving = false;
                    } else {
                        let ps = sigma[(pos - 1) as usize];
                        let pid = sel[(pos - 1) as usize];
                        if ps < sg || (ps == sg && pid < id) {
                            moving = false;
                        } else {
                            sigma[pos as usize] = ps;
                            sel[pos as usize] = pid;
                            pos -= 1;
                        }
                    }
                }
                sigma[pos as usize] = sg;
                sel[pos as usize] = id;
                len += 1;
                if len == kk {
                    bound = sigma[(kk - 1) as usize];
                    bound_id = sel[(kk - 1) as usize];
                }
            }
        }
        sync_cube();
        chunk += UNITS;
    }
    len
}

/// Renders rows `[ry0, ry1)` into `out` (`[ry1 − ry0, W, C]`). One cube per
/// tile, from tile row `launch_row0`; the binning starts at tile row
/// `bin_row0`. Pixels no Gaussian covers are 0.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn render_tiles(
    offsets: &Array<u32>,
    ids: &Array<u32>,
    conic: &Array<f32>,
    color: &Array<f32>,
    out: &mut Array<f32>,
    width: u32,
    tiles_x: u32,
    bin_row0: u32,
    launch_row0: u32,
    ry0: u32,
    ry1: u32,
    #[comptime] k: usize,
    #[comptime] channels: usize,
) {
    let ty = launch_row0 + CUBE_POS_Y;
    let t = ((ty - bin_row0) * tiles_x + CUBE_POS_X) as usize;
    let x = CUBE_POS_X * TILE + UNIT_POS % TILE;
    let y = ty * TILE + UNIT_POS / TILE;
    let px = x as f32 + 0.5;
    let py = y as f32 + 0.5;
    let mut sigma = Array::<f32>::new(k);
    let mut sel = Array::<u32>::new(k);
    let len = select_top_k(ids, offsets[t], offsets[t + 1], conic, px, py, &mut sigma, &mut sel, k);
    if x < width && y >= ry0 && y < ry1 {
        let mut w = Array::<f32>::new(k);
        let mut denom = EPSILON.runtime();
        for j in 0..len {
            let wj = f32::exp(-sigma[j as usize]);
            w[j as usize] = wj;
            denom += wj;
        }
        let base = (((y - ry0) * width + x) as usize) * channels;
        #[unroll]
        for ch in 0..channels {
            let mut acc = 0.0f32;
            for j in 0..len {
                acc += w[j as usize] * color[sel[j as usize] as usize * channels + ch];
            }
            out[base + ch] = acc / denom;
        }
    }
}

/// Accumulates the gradient of `Σ d_out · render` into `acc` (per Gaussian:
/// [`GEOMETRY_GRADS`] then C colour values) for rows `[gy0, gy1)`, whose
/// `d_out` is `[gy1 − gy0, W, C]`. Recomputes each pixel's top-K.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn render_backward_tiles(
    offsets: &Array<u32>,
    ids: &Array<u32>,
    conic: &Array<f32>,
    color: &Array<f32>,
    d_out: &Array<f32>,
    acc: &mut Array<Atomic<f32>>,
    width: u32,
    tiles_x: u32,
    bin_row0: u32,
    launch_row0: u32,
    gy0: u32,
    gy1: u32,
    #[comptime] k: usize,
    #[comptime] channels: usize,
) {
    let ty = launch_row0 + CUBE_POS_Y;
    let t = ((ty - bin_row0) * tiles_x + CUBE_POS_X) as usize;
    let x = CUBE_POS_X * TILE + UNIT_POS % TILE;
    let y = ty * TILE + UNIT_POS / TILE;
    let px = x as f32 + 0.5;
    let py = y as f32 + 0.5;
    let mut sigma = Array::<f32>::new(k);
    let mut sel = Array::<u32>::new(k);
    let len = select_top_k(ids, offsets[t], offsets[t + 1], conic, px, py, &mut sigma, &mut sel, k);
    if x < width && y >= gy0 && y < gy1 && len > 0 {
        let base = (((y - gy0) * width + x) as usize) * channels;
        let mut w = Array::<f32>::new(k);
        let mut u = Array::<f32>::new(k);
        let mut denom = EPSILON.runtime();
        for j in 0..len {
            let wj = f32::exp(-sigma[j as usize]);
            w[j as usize] = wj;
            denom += wj;
        }
        let mut weighted = 0.0f32;
        for j in 0..len {
            let id = sel[j as usize] as usize;
            let mut uj = 0.0f32;
            #[unroll]
            for ch in 0..channels {
                uj += color[id * channels + ch] * d_out[base + ch];
            }
            u[j as usize] = uj;
            weighted += w[j as usize] * uj;
        }
        let stride = GEOMETRY_GRADS as usize + channels;
        for j in 0..len {
            let id = sel[j as usize] as usize;
            let g = 5 * id;
            let dx = conic[g] - px;
            let dy = conic[g + 1] - py;
            let a = conic[g + 2];
            let b = conic[g + 3];
            let c = conic[g + 4];
            let wj = w[j as usize];
            let d_w = u[j as usize] / denom - weighted / (denom * denom);
            let d_sigma = -wj * d_w;
            let o = id * stride;
            acc[o].fetch_add(d_sigma * (a * dx + b * dy));
            acc[o + 1].fetch_add(d_sigma * (b * dx + c * dy));
            acc[o + 2].fetch_add(d_sigma * 0.5 * dx * dx);
            acc[o + 3].fetch_add(d_sigma * dx * dy);
            acc[o + 4].fetch_add(d_sigma * 0.5 * dy * dy);
            let share = wj / denom;
            #[unroll]
            for ch in 0..channels {
                acc[o + 5 + ch].fetch_add(share * d_out[base + ch]);
            }
        }
    }
}

/// Chains each Gaussian's accumulated (centre, conic, colour) gradient back
/// to its parameters. See `cpu::project::project_one_backward`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn project_backward(
    inv_scale: &Array<f32>,
    theta: &Array<f32>,
    acc: &Array<f32>,
    d_xy: &mut Array<f32>,
    d_inv_scale: &mut Array<f32>,
    d_theta: &mut Array<f32>,
    d_color: &mut Array<f32>,
    n: u32,
    width: f32,
    height: f32,
    zoom_x: f32,
    zoom_y: f32,
    #[comptime] channels: usize,
) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let iu = i as usize;
        let o = iu * (GEOMETRY_GRADS as usize + channels);
        d_xy[2 * iu] = acc[o] * width;
        d_xy[2 * iu + 1] = acc[o + 1] * height;
        let da = acc[o + 2] / (zoom_x * zoom_x);
        let db = acc[o + 3] / (zoom_x * zoom_y);
        let dc = acc[o + 4] / (zoom_y * zoom_y);
        let t = theta[iu];
        let s = f32::sin(t);
        let co = f32::cos(t);
        let q1 = inv_scale[2 * iu];
        let q2 = inv_scale[2 * iu + 1];
        d_inv_scale[2 * iu] = 2.0 * q1 * (da * co * co + db * s * co + dc * s * s);
        d_inv_scale[2 * iu + 1] = 2.0 * q2 * (da * s * s - db * s * co + dc * co * co);
        let diff = q1 * q1 - q2 * q2;
        let sin2 = f32::sin(2.0 * t);
        let cos2 = f32::cos(2.0 * t);
        d_theta[iu] = -da * diff * sin2 + db * diff * cos2 + dc * diff * sin2;
        #[unroll]
        for ch in 0..channels {
            d_color[iu * channels + ch] = acc[o + 5 + ch];
        }
    }
}

/// Target value `[0, 1]` at flat index `i` of the u8 image packed four to a u32.
#[cube]
fn target_at(target: &Array<u32>, i: u32) -> f32 {
    let word = target[(i / 4) as usize];
    let byte = (word >> ((i % 4) * 8)) & 255u32;
    f32::cast_from(byte) / 255.0
}

/// Render value at band row `row`, optionally clamped to `[0, 1]`.
#[cube]
fn render_at(render: &Array<f32>, i: u32, #[comptime] clamp: bool) -> f32 {
    let v = render[i as usize];
    if comptime!(clamp) { f32::clamp(v, 0.0, 1.0) } else { v }
}

/// Horizontal window sums of `x, y, x², y², xy` (x the render, y the target)
/// for the render band rows `[ry0, ry0 + rows)`: five planes in `h5`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn hblur_stats(
    render: &Array<f32>,
    target: &Array<u32>,
    window: &Array<f32>,
    h5: &mut Array<f32>,
    width: u32,
    rows: u32,
    ry0: u32,
    #[comptime] channels: usize,
    #[comptime] clamp: bool,
) {
    let e = ABSOLUTE_POS as u32;
    let c = comptime!(channels as u32);
    let plane = rows * width * c;
    if e < plane {
        let row = e / (width * c);
        let x = (e / c) % width;
        let ch = e % c;
        let img_row = (ry0 + row) * width * c;
        let mut s = Array::<f32>::new(5usize);
        #[unroll]
        for q in 0..5usize {
            s[q] = 0.0;
        }
        for j in 0..TAPS {
            let xs = x + j;
            // xs − 5 in [0, W), written without going negative.
            if xs >= TAPS / 2 && xs < width + TAPS / 2 {
                let col = xs - TAPS / 2;
                let kv = window[j as usize];
                let xv = render_at(render, (row * width + col) * c + ch, clamp);
                let yv = target_at(target, img_row + col * c + ch);
                s[0] += kv * xv;
                s[1] += kv * yv;
                s[2] += kv * (xv * xv);
                s[3] += kv * (yv * yv);
                s[4] += kv * (xv * yv);
            }
        }
        #[unroll]
        for q in 0..5usize {
            h5[(q as u32 * plane + e) as usize] = s[q];
        }
    }
}

/// Sums `v` over the cube in shared memory; unit 0 gets the total.
#[cube]
fn cube_sum(v: f32, shared: &mut SharedMemory<f32>) -> f32 {
    shared[UNIT_POS as usize] = v;
    sync_cube();
    let mut stride = (UNITS / 2).runtime();
    while stride > 0 {
        if UNIT_POS < stride {
            shared[UNIT_POS as usize] += shared[(UNIT_POS + stride) as usize];
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

/// Vertical window sums of `h5` → local statistics → SSIM per value, for
/// rows `[cy0, cy0 + rows)`. With `coeffs`, writes the three SSIM
/// derivative planes `∂S/∂μx, ∂S/∂E[x²], ∂S/∂E[xy]` times `scale` to
/// `coef3`. For rows in `[y0, y1)` adds SSIM, |x − y| and (x − y)² to
/// per-cube partial sums (`partials[3·cube ..]`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn ssim_terms(
    h5: &Array<f32>,
    render: &Array<f32>,
    target: &Array<u32>,
    window: &Array<f32>,
    coef3: &mut Array<f32>,
    partials: &mut Array<f32>,
    width: u32,
    height: u32,
    h_rows: u32,
    ry0: u32,
    cy0: u32,
    rows: u32,
    y0: u32,
    y1: u32,
    scale: f32,
    #[comptime] channels: usize,
    #[comptime] clamp: bool,
    #[comptime] coeffs: bool,
) {
    let e = ABSOLUTE_POS as u32;
    let c = comptime!(channels as u32);
    let plane = rows * width * c;
    let h_plane = h_rows * width * c;
    let mut ssim = 0.0f32;
    let mut l1 = 0.0f32;
    let mut se = 0.0f32;
    if e < plane {
        let row = e / (width * c);
        let rest = e % (width * c);
        let y = cy0 + row;
        let mut s = Array::<f32>::new(5usize);
        #[unroll]
        for q in 0..5usize {
            s[q] = 0.0;
        }
        for j in 0..TAPS {
            let ys = y + j;
            if ys >= TAPS / 2 && ys < height + TAPS / 2 {
                let src = ((ys - TAPS / 2 - ry0) * width * c + rest) as usize;
                let kv = window[j as usize];
                #[unroll]
                for q in 0..5usize {
                    s[q] += kv * h5[q * h_plane as usize + src];
                }
            }
        }
        let mx = s[0];
        let my = s[1];
        let a1 = 2.0 * mx * my + 1e-4;
        let a2 = 2.0 * (s[4] - mx * my) + 9e-4;
        let b1 = mx * mx + my * my + 1e-4;
        let b2 = (s[2] - mx * mx) + (s[3] - my * my) + 9e-4;
        let den = b1 * b2;
        let sv = a1 * a2 / den;
        if comptime!(coeffs) {
            let d_mx = 2.0 * my * a2 / den - 2.0 * my * a1 / den - 2.0 * mx * sv / b1 + 2.0 * mx * sv / b2;
            coef3[e as usize] = scale * d_mx;
            coef3[(plane + e) as usize] = scale * (-sv / b2);
            coef3[(2 * plane + e) as usize] = scale * (2.0 * a1 / den);
        }
        if y >= y0 && y < y1 {
            let xv = render_at(render, (y - ry0) * width * c + rest, clamp);
            let yv = target_at(target, y * width * c + rest);
            ssim = sv;
            l1 = f32::abs(xv - yv);
            se = (xv - yv) * (xv - yv);
        }
    }
    let mut shared = SharedMemory::<f32>::new(UNITS as usize);
    let t_ssim = cube_sum(ssim, &mut shared);
    let t_l1 = cube_sum(l1, &mut shared);
    let t_se = cube_sum(se, &mut shared);
    if UNIT_POS == 0 {
        let cube = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
        partials[3 * cube] = t_ssim;
        partials[3 * cube + 1] = t_l1;
        partials[3 * cube + 2] = t_se;
    }
}

/// Horizontal window sums of the three coefficient planes (`rows` rows).
#[cube(launch)]
pub fn hblur_coeffs(
    coef3: &Array<f32>,
    window: &Array<f32>,
    hc3: &mut Array<f32>,
    width: u32,
    rows: u32,
    #[comptime] channels: usize,
) {
    let e = ABSOLUTE_POS as u32;
    let c = comptime!(channels as u32);
    let plane = rows * width * c;
    if e < plane {
        let x = (e / c) % width;
        let row_start = e - (x * c + e % c);
        let ch = e % c;
        let mut s = Array::<f32>::new(3usize);
        #[unroll]
        for q in 0..3usize {
            s[q] = 0.0;
        }
        for j in 0..TAPS {
            let xs = x + j;
            if xs >= TAPS / 2 && xs < width + TAPS / 2 {
                let src = row_start + (xs - TAPS / 2) * c + ch;
                let kv = window[j as usize];
                #[unroll]
                for q in 0..3usize {
                    s[q] += kv * coef3[(q as u32 * plane + src) as usize];
                }
            }
        }
        #[unroll]
        for q in 0..3usize {
            hc3[(q as u32 * plane + e) as usize] = s[q];
        }
    }
}

/// Gradient of the loss with respect to the render for rows
/// `[y0, y0 + rows)`: the vertical window sums of `hc3` (rows from `cy0`)
/// give the SSIM part, `l1_scale · sign(x − y)` the L1 part.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn render_grad(
    hc3: &Array<f32>,
    render: &Array<f32>,
    target: &Array<u32>,
    window: &Array<f32>,
    d_render: &mut Array<f32>,
    width: u32,
    height: u32,
    hc_rows: u32,
    cy0: u32,
    ry0: u32,
    y0: u32,
    rows: u32,
    l1_scale: f32,
    #[comptime] channels: usize,
) {
    let e = ABSOLUTE_POS as u32;
    let c = comptime!(channels as u32);
    let plane = rows * width * c;
    let hc_plane = hc_rows * width * c;
    if e < plane {
        let row = e / (width * c);
        let rest = e % (width * c);
        let y = y0 + row;
        let mut g = Array::<f32>::new(3usize);
        #[unroll]
        for q in 0..3usize {
            g[q] = 0.0;
        }
        for j in 0..TAPS {
            let ys = y + j;
            if ys >= TAPS / 2 && ys < height + TAPS / 2 {
                let src = ((ys - TAPS / 2 - cy0) * width * c + rest) as usize;
                let kv = window[j as usize];
                #[unroll]
                for q in 0..3usize {
                    g[q] += kv * hc3[q * hc_plane as usize + src];
                }
            }
        }
        let xv = render[((y - ry0) * width * c + rest) as usize];
        let yv = target_at(target, y * width * c + rest);
        let diff = xv - yv;
        let mut sign = 0.0f32;
        if diff > 0.0 {
            sign = 1.0;
        }
        if diff < 0.0 {
            sign = -1.0;
        }
        d_render[e as usize] = g[0] + 2.0 * xv * g[1] + yv * g[2] + l1_scale * sign;
    }
}
