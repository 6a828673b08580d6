//! Projection and tile binning, and the projection's backward: twins of
//! [`crate::cpu::project`].

// Kernel code is expanded by `#[cube]`, which supports comparisons but not
// `Range::contains`.
#![allow(clippy::manual_range_contains)]

use cubecl::prelude::*;

use super::{BIG, GEOMETRY_GRADS, TILE, UNITS};

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
        let det_x = a * c - b * b;
        let det_sigma = 1.0 / det_x;
        let mut r = 0.0f32;
        let valid = det_x > 0.0 && finite(det_sigma) && det_sigma > 1e-12 && finite(cx) && finite(cy);
        if valid {
            let s11 = c * det_sigma;
            let s22 = a * det_sigma;
            let m = 0.5 * (s11 + s22);
            let lambda = m + f32::sqrt(f32::max(m * m - det_sigma, 0.1));
            r = f32::ceil(3.0 * f32::sqrt(lambda));
        }
        write_tile_rect(rect, iu, cx, cy, r, valid && finite(r), tiles_x, tiles_y);
    }
}

/// Writes the tiles `[x0, x1) × [y0, y1)` that a disc of `radius` pixels
/// around (`cx`, `cy`) touches into `rect[4i..]`, clamped to the screen;
/// an empty rectangle (all zero) when `valid` is false or nothing is on
/// screen. Shared by the 2D fitter's and the 3D scene's projections.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn write_tile_rect(
    rect: &mut Array<u32>,
    i: usize,
    cx: f32,
    cy: f32,
    radius: f32,
    valid: bool,
    tiles_x: u32,
    tiles_y: u32,
) {
    let mut x0 = 0u32;
    let mut x1 = 0u32;
    let mut y0 = 0u32;
    let mut y1 = 0u32;
    if valid {
        let tile = TILE as f32;
        let tx = tiles_x as f32;
        let ty = tiles_y as f32;
        x0 = u32::cast_from(f32::clamp(f32::floor((cx - radius) / tile), 0.0, tx));
        x1 = u32::cast_from(f32::clamp(f32::ceil((cx + radius) / tile), 0.0, tx));
        y0 = u32::cast_from(f32::clamp(f32::floor((cy - radius) / tile), 0.0, ty));
        y1 = u32::cast_from(f32::clamp(f32::ceil((cy + radius) / tile), 0.0, ty));
        if x0 >= x1 || y0 >= y1 {
            x0 = 0;
            x1 = 0;
            y0 = 0;
            y1 = 0;
        }
    }
    rect[4 * i] = x0;
    rect[4 * i + 1] = x1;
    rect[4 * i + 2] = y0;
    rect[4 * i + 3] = y1;
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
