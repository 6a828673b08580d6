//! What a training step needs beside the renderer: Adam on one parameter
//! group, and the statistics densification reads. Twins of
//! `crate::fit`'s Adam and `crate::densify::Stats::add`.

use cubecl::prelude::*;

use super::PROJECTED;

/// Adam's constants: the CPU twin's ([`crate::fit::ADAM`]), defined once.
const BETA1: f32 = crate::fit::ADAM.beta1;
const BETA2: f32 = crate::fit::ADAM.beta2;
const EPS: f32 = crate::fit::ADAM.eps;

/// One Adam step on `p[0..len)` with gradient `g` and moments `m`, `v`;
/// `c1`, `c2` are the bias corrections `1 − βᵗ`. Where `per` > 0 the
/// entries at `i mod per ≥ active` (SH bands not yet in use) take a zero
/// gradient.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn adam(
    p: &mut Array<f32>,
    g: &Array<f32>,
    m: &mut Array<f32>,
    v: &mut Array<f32>,
    lr: f32,
    c1: f32,
    c2: f32,
    len: u32,
    per: u32,
    active: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < len {
        let iu = i as usize;
        let mut grad = g[iu];
        if per > 0 && i % per >= active {
            grad = 0.0;
        }
        let mm = BETA1 * m[iu] + (1.0 - BETA1) * grad;
        let vv = BETA2 * v[iu] + (1.0 - BETA2) * grad * grad;
        m[iu] = mm;
        v[iu] = vv;
        p[iu] -= lr * (mm / c1) / (f32::sqrt(vv / c2) + EPS);
    }
}

/// `dst[0..len) = src[0..len)`, 32-bit words (f32 bits or packed halves):
/// a staged upload into part of a buffer.
#[cube(launch)]
pub fn copy(dst: &mut Array<u32>, src: &Array<u32>, len: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < len {
        dst[i as usize] = src[i as usize];
    }
}

/// Adds one view's statistics for each drawn Gaussian: the norm of its
/// screen mean's gradient (in normalised device coordinates: pixels × half
/// the side), one more view seen, and its largest radius.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn accumulate_stats(
    rect: &Array<u32>,
    projected: &Array<f32>,
    d_screen: &Array<f32>,
    grad: &mut Array<f32>,
    seen: &mut Array<f32>,
    max_radius: &mut Array<f32>,
    n: u32,
    half_width: f32,
    half_height: f32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let iu = i as usize;
        if rect[4 * iu] < rect[4 * iu + 1] {
            let x = d_screen[2 * iu] * half_width;
            let y = d_screen[2 * iu + 1] * half_height;
            grad[iu] += f32::sqrt(x * x + y * y);
            seen[iu] += 1.0;
            max_radius[iu] = f32::max(max_radius[iu], projected[PROJECTED as usize * iu + 10]);
        }
    }
}
