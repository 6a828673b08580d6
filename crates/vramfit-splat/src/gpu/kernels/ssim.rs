//! The banded SSIM + L1 loss and its gradient: twins of [`vramfit_gauss::ssim`].

// Kernel code is expanded by `#[cube]`, which supports comparisons but not
// `Range::contains`.
#![allow(clippy::manual_range_contains)]

use cubecl::prelude::*;

use super::{TAPS, UNITS};

/// SSIM's stabilising constants ([`vramfit_gauss::ssim`]).
const C1: f32 = vramfit_gauss::ssim::C1 as f32;
const C2: f32 = vramfit_gauss::ssim::C2 as f32;

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
        let a1 = 2.0 * mx * my + C1;
        let a2 = 2.0 * (s[4] - mx * my) + C2;
        let b1 = mx * mx + my * my + C1;
        let b2 = (s[2] - mx * mx) + (s[3] - my * my) + C2;
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
