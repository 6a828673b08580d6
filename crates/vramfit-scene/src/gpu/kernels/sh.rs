//! Spherical harmonics up to degree 3 on the device: the basis and its
//! derivative at a unit direction, one colour channel, and the colour's
//! backward. Twin of [`crate::cpu::sh`], whose normalisations these are.

use cubecl::prelude::*;

use crate::cpu::sh::{C0 as K0, C1 as K1, C2 as K2, C3 as K3};

const C0: f32 = K0 as f32;
const C1: f32 = K1 as f32;
const C20: f32 = K2[0] as f32;
const C21: f32 = K2[1] as f32;
const C22: f32 = K2[2] as f32;
const C23: f32 = K2[3] as f32;
const C24: f32 = K2[4] as f32;
const C30: f32 = K3[0] as f32;
const C31: f32 = K3[1] as f32;
const C32: f32 = K3[2] as f32;
const C33: f32 = K3[3] as f32;
const C34: f32 = K3[4] as f32;
const C35: f32 = K3[5] as f32;
const C36: f32 = K3[6] as f32;

/// The basis at unit direction (x, y, z) into `out[0..16)` (0 past the
/// degree's coefficients) and each entry's derivative with respect to the
/// three components into `grad[3k..3k + 3)`.
#[cube]
pub fn basis(x: f32, y: f32, z: f32, out: &mut Array<f32>, grad: &mut Array<f32>, #[comptime] degree: u32) {
    #[unroll]
    for k in 0..16usize {
        out[k] = 0.0;
    }
    #[unroll]
    for k in 0..48usize {
        grad[k] = 0.0;
    }
    out[0] = C0;
    if comptime![degree >= 1] {
        out[1] = -C1 * y;
        out[2] = C1 * z;
        out[3] = -C1 * x;
        grad[4] = -C1;
        grad[8] = C1;
        grad[9] = -C1;
    }
    if comptime![degree >= 2] {
        let xx = x * x;
        let yy = y * y;
        let zz = z * z;
        out[4] = C20 * x * y;
        out[5] = C21 * y * z;
        out[6] = C22 * (2.0 * zz - xx - yy);
        out[7] = C23 * x * z;
        out[8] = C24 * (xx - yy);
        grad[12] = C20 * y;
        grad[13] = C20 * x;
        grad[16] = C21 * z;
        grad[17] = C21 * y;
        grad[18] = C22 * -2.0 * x;
        grad[19] = C22 * -2.0 * y;
        grad[20] = C22 * 4.0 * z;
        grad[21] = C23 * z;
        grad[23] = C23 * x;
        grad[24] = C24 * 2.0 * x;
        grad[25] = C24 * -2.0 * y;
    }
    if comptime![degree >= 3] {
        let xx = x * x;
        let yy = y * y;
        let zz = z * z;
        out[9] = C30 * y * (3.0 * xx - yy);
        out[10] = C31 * x * y * z;
        out[11] = C32 * y * (4.0 * zz - xx - yy);
        out[12] = C33 * z * (2.0 * zz - 3.0 * xx - 3.0 * yy);
        out[13] = C34 * x * (4.0 * zz - xx - yy);
        out[14] = C35 * z * (xx - yy);
        out[15] = C36 * x * (xx - 3.0 * yy);
        grad[27] = C30 * 6.0 * x * y;
        grad[28] = C30 * (3.0 * xx - 3.0 * yy);
        grad[30] = C31 * y * z;
        grad[31] = C31 * x * z;
        grad[32] = C31 * x * y;
        grad[33] = C32 * -2.0 * x * y;
        grad[34] = C32 * (4.0 * zz - xx - 3.0 * yy);
        grad[35] = C32 * 8.0 * y * z;
        grad[36] = C33 * -6.0 * x * z;
        grad[37] = C33 * -6.0 * y * z;
        grad[38] = C33 * (6.0 * zz - 3.0 * xx - 3.0 * yy);
        grad[39] = C34 * (4.0 * zz - 3.0 * xx - yy);
        grad[40] = C34 * -2.0 * x * y;
        grad[41] = C34 * 8.0 * x * z;
        grad[42] = C35 * 2.0 * x * z;
        grad[43] = C35 * -2.0 * y * z;
        grad[44] = C35 * (xx - yy);
        grad[45] = C36 * (3.0 * xx - 3.0 * yy);
        grad[46] = C36 * -6.0 * x * y;
    }
}

/// SH coefficients per channel at `degree`.
pub fn coefficients(degree: u32) -> usize {
    crate::cpu::sh::coefficients(degree as usize)
}

/// Coefficient `at` of an SH group stored as `storage` says
/// ([`crate::sh_storage::ShStorage::code`]: 0 f32 bits, 1 f16 or 2 bf16
/// packed two to a word, element `2k` in the low half), widened to f32.
/// The decoding is integer arithmetic, so it needs no 16-bit float
/// support from the device.
#[cube]
#[allow(unused_assignments)] // every branch sets `value`; the kernel language wants it declared first
pub fn sh_value(group: &Array<u32>, at: usize, #[comptime] storage: u32) -> f32 {
    let mut value = 0.0f32;
    if comptime![storage == 0] {
        value = f32::reinterpret(group[at]);
    } else {
        let word = group[at / 2];
        let bits = (word >> (16 * (at % 2) as u32)) & 0xffff;
        if comptime![storage == 2] {
            value = f32::reinterpret(bits << 16);
        } else {
            let sign = (bits & 0x8000) << 16;
            let exponent = (bits >> 10) & 0x1f;
            let mantissa = bits & 0x3ff;
            if exponent == 0 {
                // Zero or subnormal: mantissa × 2⁻²⁴.
                value = f32::cast_from(mantissa) * 5.960_464_5e-8;
                if sign != 0 {
                    value = -value;
                }
            } else if exponent == 31 {
                value = f32::reinterpret(sign | 0x7f80_0000 | (mantissa << 13));
            } else {
                value = f32::reinterpret(sign | ((exponent + 112) << 23) | (mantissa << 13));
            }
        }
    }
    value
}

/// Channel `ch` of Gaussian `i`'s colour before the clamp at 0:
/// `0.5 + Σ coefficient · basis`.
#[cube]
pub fn raw_channel(
    sh_dc: &Array<u32>,
    sh_rest: &Array<u32>,
    i: usize,
    #[comptime] ch: usize,
    b: &Array<f32>,
    #[comptime] degree: u32,
    #[comptime] storage: u32,
) -> f32 {
    let n = comptime![coefficients(degree)];
    let r = comptime![3 * (coefficients(degree) - 1)];
    let mut v = 0.5 + sh_value(sh_dc, 3 * i + ch, storage) * b[0];
    #[unroll]
    for k in 1..n {
        v += sh_value(sh_rest, i * r + (k - 1) * 3 + ch, storage) * b[k];
    }
    v
}

/// The backward of Gaussian `i`'s colour for `d_color` (3 values from
/// `d_color[dc0..]`): writes the coefficients' gradients (0 for a channel
/// clamped at 0; f32 whatever the storage) and returns the gradient with
/// respect to the direction in `d_dir[0..3)`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn color_backward(
    sh_dc: &Array<u32>,
    sh_rest: &Array<u32>,
    i: usize,
    b: &Array<f32>,
    db: &Array<f32>,
    d_color: &Array<f32>,
    dc0: usize,
    d_sh_dc: &mut Array<f32>,
    d_sh_rest: &mut Array<f32>,
    d_dir: &mut Array<f32>,
    #[comptime] degree: u32,
    #[comptime] storage: u32,
) {
    let n = comptime![coefficients(degree)];
    let r = comptime![3 * (coefficients(degree) - 1)];
    d_dir[0] = 0.0;
    d_dir[1] = 0.0;
    d_dir[2] = 0.0;
    #[unroll]
    for ch in 0..3usize {
        let raw = raw_channel(sh_dc, sh_rest, i, ch, b, degree, storage);
        let mut g = d_color[dc0 + ch];
        if raw <= 0.0 {
            g = 0.0;
        }
        d_sh_dc[3 * i + ch] = g * b[0];
        #[unroll]
        for k in 1..n {
            let at = i * r + (k - 1) * 3 + ch;
            d_sh_rest[at] = g * b[k];
            let coefficient = sh_value(sh_rest, at, storage);
            #[unroll]
            for c in 0..3usize {
                d_dir[c] += g * coefficient * db[3 * k + c];
            }
        }
    }
}

/// Widens `n` coefficients of `group` (stored as `storage` says) into
/// `out`: the device's reading, checked against the host's.
#[cube(launch)]
pub fn widen(group: &Array<u32>, out: &mut Array<f32>, n: u32, #[comptime] storage: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        out[i as usize] = sh_value(group, i as usize, storage);
    }
}
