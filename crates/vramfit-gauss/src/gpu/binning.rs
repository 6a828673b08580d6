//! The binning kernels both workloads launch: a Gaussian's tile rectangle
//! (written by each workload's projection), the (Gaussian, tile) pairs of a
//! band of tile rows counted, scanned and scattered into per-tile lists in
//! device memory; and buffer fills. Twins of [`crate::tile::bin_rects`].

use cubecl::prelude::*;

use super::{TILE, UNITS};

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
