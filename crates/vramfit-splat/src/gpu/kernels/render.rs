//! Top-K render forward and backward: twins of [`crate::cpu::render`].
//!
//! Selection rule, as on the CPU: a pixel blends the K candidates with the
//! smallest `(σ, gaussian id)`. Candidates reach a tile in any order (the
//! scatter uses atomics), so the id breaks ties explicitly.

// Kernel code is expanded by `#[cube]`, which supports comparisons but not
// `Range::contains`.
#![allow(clippy::manual_range_contains)]

use cubecl::prelude::*;

use super::{BIG, GEOMETRY_GRADS, TILE, UNITS};

/// Added to the weight sum before normalising ([`crate::cpu::top_k::EPSILON`]).
const EPSILON: f32 = crate::cpu::top_k::EPSILON as f32;
const NO_ID: u32 = 0xFFFF_FFFF;

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
