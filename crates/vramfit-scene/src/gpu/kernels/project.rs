//! Each Gaussian through the camera (EWA splatting with the low-pass, SH
//! colour for the view direction, tile rectangle) and the backward of it
//! to the Gaussian's parameters. Twin of [`crate::cpu::project`]; as
//! there, the backward recomputes the forward's intermediates instead of
//! keeping them (a few dozen floats a Gaussian).

// Kernel code is expanded by `#[cube]`, which has no `Range::contains`.
#![allow(clippy::manual_range_contains)]

use cubecl::prelude::*;

use super::sh::{basis, coefficients, color_backward, raw_channel};
use vramfit_gauss::gpu::binning::write_tile_rect;

use super::{LOW_PASS, NEAR, PROJECTED, SCREEN_GRADS};

// The layout of the intermediates `geometry` writes.
const G_P: usize = 0; // camera-space mean (3)
const G_RATIO: usize = 3; // x/z, y/z, clamped (2)
const G_CLAMPED: usize = 5; // 1 where clamped (2)
const G_Q: usize = 7; // unit quaternion (4)
const G_QN: usize = 11; // its norm
const G_R: usize = 12; // rotation matrix (9)
const G_S: usize = 21; // scales (3)
const G_M: usize = 24; // M = R S (9)
const G_SIGMA: usize = 33; // Σ = M Mᵀ (9)
const G_T: usize = 42; // T = J W (2×3)
const G_COV: usize = 48; // screen covariance a, b, c
const G_DET: usize = 51;
/// Floats of the intermediates.
const GEOMETRY: usize = 52;

/// The forward's intermediates for Gaussian `i` into `g`; false when it is
/// not drawn (behind the near plane, degenerate quaternion or covariance).
#[cube]
fn geometry(
    means: &Array<f32>,
    log_scales: &Array<f32>,
    rotations: &Array<f32>,
    cam: &Array<f32>,
    i: usize,
    g: &mut Array<f32>,
) -> bool {
    let mut ok = true;
    #[unroll]
    for r in 0..3usize {
        g[G_P + r] = cam[3 * r] * means[3 * i]
            + cam[3 * r + 1] * means[3 * i + 1]
            + cam[3 * r + 2] * means[3 * i + 2]
            + cam[9 + r];
    }
    let z = g[G_P + 2];
    if z <= NEAR {
        ok = false;
    }
    let fx = cam[12];
    let fy = cam[13];
    #[unroll]
    for a in 0..2usize {
        let limit = cam[21 + a];
        let mut ratio = g[G_P + a] / z;
        g[G_CLAMPED + a] = 0.0;
        if f32::abs(ratio) > limit {
            if ratio > 0.0 {
                ratio = limit;
            } else {
                ratio = -limit;
            }
            g[G_CLAMPED + a] = 1.0;
        }
        g[G_RATIO + a] = ratio;
    }
    // J = [[fx/z, 0, −fx r0/z], [0, fy/z, −fy r1/z]]; T = J W.
    let j00 = fx / z;
    let j02 = -fx * g[G_RATIO] / z;
    let j11 = fy / z;
    let j12 = -fy * g[G_RATIO + 1] / z;
    #[unroll]
    for k in 0..3usize {
        g[G_T + k] = j00 * cam[k] + j02 * cam[6 + k];
        g[G_T + 3 + k] = j11 * cam[3 + k] + j12 * cam[6 + k];
    }
    let qw = rotations[4 * i];
    let qx = rotations[4 * i + 1];
    let qy = rotations[4 * i + 2];
    let qz = rotations[4 * i + 3];
    let qn = f32::sqrt(qw * qw + qx * qx + qy * qy + qz * qz);
    let good_q = qn > 0.0;
    if !good_q {
        ok = false;
    }
    g[G_QN] = qn;
    let w = qw / qn;
    let x = qx / qn;
    let y = qy / qn;
    let zq = qz / qn;
    g[G_Q] = w;
    g[G_Q + 1] = x;
    g[G_Q + 2] = y;
    g[G_Q + 3] = zq;
    g[G_R] = 1.0 - 2.0 * (y * y + zq * zq);
    g[G_R + 1] = 2.0 * (x * y - w * zq);
    g[G_R + 2] = 2.0 * (x * zq + w * y);
    g[G_R + 3] = 2.0 * (x * y + w * zq);
    g[G_R + 4] = 1.0 - 2.0 * (x * x + zq * zq);
    g[G_R + 5] = 2.0 * (y * zq - w * x);
    g[G_R + 6] = 2.0 * (x * zq - w * y);
    g[G_R + 7] = 2.0 * (y * zq + w * x);
    g[G_R + 8] = 1.0 - 2.0 * (x * x + y * y);
    #[unroll]
    for k in 0..3usize {
        g[G_S + k] = f32::exp(log_scales[3 * i + k]);
    }
    #[unroll]
    for r in 0..3usize {
        #[unroll]
        for k in 0..3usize {
            g[G_M + 3 * r + k] = g[G_R + 3 * r + k] * g[G_S + k];
        }
    }
    #[unroll]
    for r in 0..3usize {
        #[unroll]
        for k in 0..3usize {
            g[G_SIGMA + 3 * r + k] = g[G_M + 3 * r] * g[G_M + 3 * k]
                + g[G_M + 3 * r + 1] * g[G_M + 3 * k + 1]
                + g[G_M + 3 * r + 2] * g[G_M + 3 * k + 2];
        }
    }
    // cov = T Σ Tᵀ + low-pass on the diagonal.
    #[unroll]
    for e in 0..3usize {
        // (a, b) = (0, 0), (0, 1), (1, 1).
        let a = comptime![e / 2];
        let b = comptime![e.div_ceil(2)];
        let mut v = 0.0f32;
        #[unroll]
        for k in 0..3usize {
            #[unroll]
            for l in 0..3usize {
                v += g[G_T + 3 * a + k] * g[G_SIGMA + 3 * k + l] * g[G_T + 3 * b + l];
            }
        }
        g[G_COV + e] = v;
    }
    g[G_COV] += LOW_PASS;
    g[G_COV + 2] += LOW_PASS;
    let det = g[G_COV] * g[G_COV + 2] - g[G_COV + 1] * g[G_COV + 1];
    g[G_DET] = det;
    let good_det = det > 0.0;
    if !good_det {
        ok = false;
    }
    ok
}

/// Projects each Gaussian: `projected[11i..]` = depth, screen mean, conic,
/// opacity, colour, radius (see [`PROJECTED`]); `rect[4i..]` = tiles `[x0, x1) ×
/// [y0, y1)`, empty when not drawn. See `cpu::project::project`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn project(
    means: &Array<f32>,
    log_scales: &Array<f32>,
    rotations: &Array<f32>,
    opacity_logits: &Array<f32>,
    sh_dc: &Array<u32>,
    sh_rest: &Array<u32>,
    cam: &Array<f32>,
    projected: &mut Array<f32>,
    rect: &mut Array<u32>,
    n: u32,
    tiles_x: u32,
    tiles_y: u32,
    #[comptime] degree: u32,
    #[comptime] storage: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let iu = i as usize;
        let mut g = Array::<f32>::new(GEOMETRY);
        let ok = geometry(means, log_scales, rotations, cam, iu, &mut g);
        let mut radius = 0.0f32;
        let mut mx = 0.0f32;
        let mut my = 0.0f32;
        if ok {
            let a = g[G_COV];
            let b = g[G_COV + 1];
            let c = g[G_COV + 2];
            let det = g[G_DET];
            let mid = 0.5 * (a + c);
            let lambda = mid + f32::sqrt(f32::max(mid * mid - det, 0.1));
            radius = f32::ceil(3.0 * f32::sqrt(lambda));
            let z = g[G_P + 2];
            mx = cam[12] * g[G_P] / z + cam[14];
            my = cam[13] * g[G_P + 1] / z + cam[15];
            let o = PROJECTED as usize * iu;
            projected[o] = z;
            projected[o + 1] = mx;
            projected[o + 2] = my;
            projected[o + 3] = c / det;
            projected[o + 4] = -b / det;
            projected[o + 5] = a / det;
            projected[o + 6] = 1.0 / (1.0 + f32::exp(-opacity_logits[iu]));
            projected[o + 10] = radius;
            // The colour seen from the camera's centre.
            let vx = means[3 * iu] - cam[18];
            let vy = means[3 * iu + 1] - cam[19];
            let vz = means[3 * iu + 2] - cam[20];
            let dist = f32::sqrt(vx * vx + vy * vy + vz * vz);
            let mut bs = Array::<f32>::new(16usize);
            let mut dbs = Array::<f32>::new(48usize);
            basis(vx / dist, vy / dist, vz / dist, &mut bs, &mut dbs, degree);
            #[unroll]
            for ch in 0..3usize {
                projected[o + 7 + ch] = f32::max(raw_channel(sh_dc, sh_rest, iu, ch, &bs, degree, storage), 0.0);
            }
        }
        // A radius that is not a number (an overflowed covariance) draws nothing.
        let valid = ok && radius >= 1.0 && radius < 3.0e38;
        write_tile_rect(rect, iu, mx, my, radius, valid, tiles_x, tiles_y);
    }
}

/// Chains each drawn Gaussian's screen gradients (`acc[9i..]`, see
/// [`SCREEN_GRADS`]) to its parameters; a Gaussian not drawn gets zeros.
/// `d_screen[2i..]` is the screen mean's gradient (what densification
/// reads). See `cpu::project::project_backward`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn project_backward(
    means: &Array<f32>,
    log_scales: &Array<f32>,
    rotations: &Array<f32>,
    opacity_logits: &Array<f32>,
    sh_dc: &Array<u32>,
    sh_rest: &Array<u32>,
    cam: &Array<f32>,
    rect: &Array<u32>,
    acc: &Array<f32>,
    d_means: &mut Array<f32>,
    d_log_scales: &mut Array<f32>,
    d_rotations: &mut Array<f32>,
    d_opacity_logits: &mut Array<f32>,
    d_sh_dc: &mut Array<f32>,
    d_sh_rest: &mut Array<f32>,
    d_screen: &mut Array<f32>,
    n: u32,
    #[comptime] degree: u32,
    #[comptime] storage: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let iu = i as usize;
        let r_len = comptime![3 * (coefficients(degree) - 1)];
        let mut g = Array::<f32>::new(GEOMETRY);
        let ok = geometry(means, log_scales, rotations, cam, iu, &mut g);
        let drawn = ok && rect[4 * iu] < rect[4 * iu + 1];
        if drawn {
            let o = SCREEN_GRADS as usize * iu;
            // Opacity: o = sigmoid(logit).
            let op = 1.0 / (1.0 + f32::exp(-opacity_logits[iu]));
            d_opacity_logits[iu] = acc[o + 5] * op * (1.0 - op);

            // Colour, through the SH and the view direction.
            let vx = means[3 * iu] - cam[18];
            let vy = means[3 * iu + 1] - cam[19];
            let vz = means[3 * iu + 2] - cam[20];
            let dist = f32::sqrt(vx * vx + vy * vy + vz * vz);
            let dx = vx / dist;
            let dy = vy / dist;
            let dz = vz / dist;
            let mut bs = Array::<f32>::new(16usize);
            let mut dbs = Array::<f32>::new(48usize);
            basis(dx, dy, dz, &mut bs, &mut dbs, degree);
            let mut d_dir = Array::<f32>::new(3usize);
            color_backward(
                sh_dc,
                sh_rest,
                iu,
                &bs,
                &dbs,
                acc,
                o + 6,
                d_sh_dc,
                d_sh_rest,
                &mut d_dir,
                degree,
                storage,
            );
            let along = d_dir[0] * dx + d_dir[1] * dy + d_dir[2] * dz;
            let mut dm0 = (d_dir[0] - along * dx) / dist;
            let mut dm1 = (d_dir[1] - along * dy) / dist;
            let mut dm2 = (d_dir[2] - along * dz) / dist;

            // Conic (a, b, c) = (C, −B, A) / det of the covariance [[A, B], [B, C]].
            let ca = g[G_COV];
            let cb = g[G_COV + 1];
            let cc = g[G_COV + 2];
            let det = g[G_DET];
            let det2 = det * det;
            let ga = acc[o + 2];
            let gb = acc[o + 3];
            let gc = acc[o + 4];
            let d_cov_a = (-ga * cc * cc + gb * cb * cc - gc * cb * cb) / det2;
            let d_cov_b = (ga * 2.0 * cb * cc - gb * (det + 2.0 * cb * cb) + gc * 2.0 * ca * cb) / det2;
            let d_cov_c = (-ga * cb * cb + gb * cb * ca - gc * ca * ca) / det2;
            // As a symmetric matrix gradient: B sits at (0, 1) and (1, 0).
            let mut gcov = Array::<f32>::new(4usize);
            gcov[0] = d_cov_a;
            gcov[1] = 0.5 * d_cov_b;
            gcov[2] = 0.5 * d_cov_b;
            gcov[3] = d_cov_c;

            // cov = T Σ Tᵀ: dΣ = Tᵀ G T, dT = 2 G T Σ.
            let mut d_sigma = Array::<f32>::new(9usize);
            #[unroll]
            for k in 0..3usize {
                #[unroll]
                for l in 0..3usize {
                    let mut v = 0.0f32;
                    #[unroll]
                    for a in 0..2usize {
                        #[unroll]
                        for b in 0..2usize {
                            v += g[G_T + 3 * a + k] * gcov[2 * a + b] * g[G_T + 3 * b + l];
                        }
                    }
                    d_sigma[3 * k + l] = v;
                }
            }
            let mut gt = Array::<f32>::new(6usize);
            #[unroll]
            for a in 0..2usize {
                #[unroll]
                for k in 0..3usize {
                    gt[3 * a + k] = gcov[2 * a] * g[G_T + k] + gcov[2 * a + 1] * g[G_T + 3 + k];
                }
            }
            let mut d_t = Array::<f32>::new(6usize);
            #[unroll]
            for a in 0..2usize {
                #[unroll]
                for k in 0..3usize {
                    let mut v = 0.0f32;
                    #[unroll]
                    for l in 0..3usize {
                        v += gt[3 * a + l] * g[G_SIGMA + 3 * l + k];
                    }
                    d_t[3 * a + k] = 2.0 * v;
                }
            }
            // T = J W: dJ = dT Wᵀ (only the entries J has).
            let mut d_j = Array::<f32>::new(6usize);
            #[unroll]
            for a in 0..2usize {
                #[unroll]
                for l in 0..3usize {
                    d_j[3 * a + l] =
                        d_t[3 * a] * cam[3 * l] + d_t[3 * a + 1] * cam[3 * l + 1] + d_t[3 * a + 2] * cam[3 * l + 2];
                }
            }

            // The camera-space mean, through the screen mean and the Jacobian.
            let fx = cam[12];
            let fy = cam[13];
            let px = g[G_P];
            let py = g[G_P + 1];
            let z = g[G_P + 2];
            let zz = z * z;
            let dsx = acc[o];
            let dsy = acc[o + 1];
            let mut dp0 = dsx * fx / z;
            let mut dp1 = dsy * fy / z;
            let mut dp2 = -dsx * fx * px / zz - dsy * fy * py / zz;
            dp2 += -d_j[0] * fx / zz - d_j[4] * fy / zz;
            // Column 2 of J: −f r / z; r = x/z unless clamped (then fixed).
            let r0 = g[G_RATIO];
            if g[G_CLAMPED] > 0.5 {
                dp2 += d_j[2] * fx * r0 / zz;
            } else {
                dp0 += -d_j[2] * fx / zz;
                dp2 += d_j[2] * 2.0 * fx * r0 / zz;
            }
            let r1 = g[G_RATIO + 1];
            if g[G_CLAMPED + 1] > 0.5 {
                dp2 += d_j[5] * fy * r1 / zz;
            } else {
                dp1 += -d_j[5] * fy / zz;
                dp2 += d_j[5] * 2.0 * fy * r1 / zz;
            }
            // p = W μ + t: dμ = Wᵀ dp.
            dm0 += cam[0] * dp0 + cam[3] * dp1 + cam[6] * dp2;
            dm1 += cam[1] * dp0 + cam[4] * dp1 + cam[7] * dp2;
            dm2 += cam[2] * dp0 + cam[5] * dp1 + cam[8] * dp2;
            d_means[3 * iu] = dm0;
            d_means[3 * iu + 1] = dm1;
            d_means[3 * iu + 2] = dm2;

            // Σ = M Mᵀ: dM = 2 dΣ M; M = R S.
            let mut d_r = Array::<f32>::new(9usize);
            #[unroll]
            for k in 0..3usize {
                let mut d_s = 0.0f32;
                #[unroll]
                for r in 0..3usize {
                    let mut v = 0.0f32;
                    #[unroll]
                    for l in 0..3usize {
                        v += d_sigma[3 * r + l] * g[G_M + 3 * l + k];
                    }
                    let d_m = 2.0 * v;
                    d_s += d_m * g[G_R + 3 * r + k];
                    d_r[3 * r + k] = d_m * g[G_S + k];
                }
                d_log_scales[3 * iu + k] = d_s * g[G_S + k];
            }
            // The rotation matrix's backward to the unit quaternion.
            let w = g[G_Q];
            let x = g[G_Q + 1];
            let y = g[G_Q + 2];
            let zq = g[G_Q + 3];
            let dqw = 2.0 * (-zq * d_r[1] + y * d_r[2] + zq * d_r[3] - x * d_r[5] - y * d_r[6] + x * d_r[7]);
            let dqx = 2.0 * (y * d_r[1] + zq * d_r[2] + y * d_r[3] - w * d_r[5] + zq * d_r[6] + w * d_r[7])
                - 4.0 * x * (d_r[4] + d_r[8]);
            let dqy = 2.0 * (x * d_r[1] + w * d_r[2] + x * d_r[3] + zq * d_r[5] - w * d_r[6] + zq * d_r[7])
                - 4.0 * y * (d_r[0] + d_r[8]);
            let dqz = 2.0 * (-w * d_r[1] + x * d_r[2] + w * d_r[3] + y * d_r[5] + x * d_r[6] + y * d_r[7])
                - 4.0 * zq * (d_r[0] + d_r[4]);
            // q̂ = q / |q|: dq = (dq̂ − (dq̂·q̂) q̂) / |q|.
            let qn = g[G_QN];
            let along_q = dqw * w + dqx * x + dqy * y + dqz * zq;
            d_rotations[4 * iu] = (dqw - along_q * w) / qn;
            d_rotations[4 * iu + 1] = (dqx - along_q * x) / qn;
            d_rotations[4 * iu + 2] = (dqy - along_q * y) / qn;
            d_rotations[4 * iu + 3] = (dqz - along_q * zq) / qn;
            d_screen[2 * iu] = dsx;
            d_screen[2 * iu + 1] = dsy;
        } else {
            #[unroll]
            for k in 0..3usize {
                d_means[3 * iu + k] = 0.0;
                d_log_scales[3 * iu + k] = 0.0;
                d_sh_dc[3 * iu + k] = 0.0;
            }
            #[unroll]
            for k in 0..4usize {
                d_rotations[4 * iu + k] = 0.0;
            }
            #[unroll]
            for k in 0..r_len {
                d_sh_rest[iu * r_len + k] = 0.0;
            }
            d_opacity_logits[iu] = 0.0;
            d_screen[2 * iu] = 0.0;
            d_screen[2 * iu + 1] = 0.0;
        }
    }
}
