//! Projection and tile binning, and the projection's backward: twins of
//! [`crate::cpu::project`].

// Kernel code is expanded by `#[cube]`, which supports comparisons but not
// `Range::contains`.
#![allow(clippy::manual_range_contains)]

use cubecl::prelude::*;

use vramfit_gauss::gpu::binning::write_tile_rect;

use super::{BIG, GEOMETRY_GRADS};

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
