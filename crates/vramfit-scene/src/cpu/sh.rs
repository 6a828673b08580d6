//! Real spherical harmonics up to degree 3, as 3DGS evaluates them: the
//! basis at a unit view direction, a colour from a Gaussian's
//! coefficients (plus 0.5, clamped at 0), and the backward to the
//! coefficients and to the direction (so that a mean's gradient includes
//! the change of its colour with the viewing angle). The constants are the
//! real SH normalisations (public; the 3DGS paper's reference code uses
//! the same).

use vramfit_gauss::Real;

/// The highest degree supported.
pub const MAX_DEGREE: usize = 3;

/// Coefficients per colour channel at `degree`: (degree + 1)².
pub fn coefficients(degree: usize) -> usize {
    (degree + 1) * (degree + 1)
}

/// The degree-0 normalisation.
pub const C0: f64 = 0.282_094_791_773_878_14;
/// The degree-1 normalisation.
pub const C1: f64 = 0.488_602_511_902_919_9;
/// The degree-2 normalisations.
pub const C2: [f64; 5] = [
    1.092_548_430_592_079_2,
    -1.092_548_430_592_079_2,
    0.315_391_565_252_520_05,
    -1.092_548_430_592_079_2,
    0.546_274_215_296_039_6,
];
/// The degree-3 normalisations.
pub const C3: [f64; 7] = [
    -0.590_043_589_926_643_5,
    2.890_611_442_640_554,
    -0.457_045_799_464_465_8,
    0.373_176_332_590_115_4,
    -0.457_045_799_464_465_8,
    1.445_305_721_320_277,
    -0.590_043_589_926_643_5,
];

/// The basis at unit direction `d` for `degree` (entries past
/// [`coefficients`] are 0), and each entry's derivative with respect to
/// `d`'s three components taken as independent.
pub fn basis<F: Real>(d: [F; 3], degree: usize) -> ([F; 16], [[F; 3]; 16]) {
    assert!(degree <= MAX_DEGREE, "SH degree {degree} is above {MAX_DEGREE}");
    let c = F::c;
    let [x, y, z] = d;
    let zero = F::zero();
    let mut y_ = [zero; 16];
    let mut dy = [[zero; 3]; 16];
    y_[0] = c(C0);
    if degree >= 1 {
        y_[1] = -c(C1) * y;
        y_[2] = c(C1) * z;
        y_[3] = -c(C1) * x;
        dy[1] = [zero, -c(C1), zero];
        dy[2] = [zero, zero, c(C1)];
        dy[3] = [-c(C1), zero, zero];
    }
    if degree >= 2 {
        let (xx, yy, zz) = (x * x, y * y, z * z);
        let two = c(2.0);
        y_[4] = c(C2[0]) * x * y;
        y_[5] = c(C2[1]) * y * z;
        y_[6] = c(C2[2]) * (two * zz - xx - yy);
        y_[7] = c(C2[3]) * x * z;
        y_[8] = c(C2[4]) * (xx - yy);
        dy[4] = [c(C2[0]) * y, c(C2[0]) * x, zero];
        dy[5] = [zero, c(C2[1]) * z, c(C2[1]) * y];
        dy[6] = [c(C2[2]) * -two * x, c(C2[2]) * -two * y, c(C2[2]) * c(4.0) * z];
        dy[7] = [c(C2[3]) * z, zero, c(C2[3]) * x];
        dy[8] = [c(C2[4]) * two * x, c(C2[4]) * -two * y, zero];
    }
    if degree >= 3 {
        let (xx, yy, zz) = (x * x, y * y, z * z);
        let k = |v: f64| c(v);
        y_[9] = k(C3[0]) * y * (k(3.0) * xx - yy);
        y_[10] = k(C3[1]) * x * y * z;
        y_[11] = k(C3[2]) * y * (k(4.0) * zz - xx - yy);
        y_[12] = k(C3[3]) * z * (k(2.0) * zz - k(3.0) * xx - k(3.0) * yy);
        y_[13] = k(C3[4]) * x * (k(4.0) * zz - xx - yy);
        y_[14] = k(C3[5]) * z * (xx - yy);
        y_[15] = k(C3[6]) * x * (xx - k(3.0) * yy);
        dy[9] = [k(C3[0]) * k(6.0) * x * y, k(C3[0]) * (k(3.0) * xx - k(3.0) * yy), zero];
        dy[10] = [k(C3[1]) * y * z, k(C3[1]) * x * z, k(C3[1]) * x * y];
        dy[11] = [
            k(C3[2]) * k(-2.0) * x * y,
            k(C3[2]) * (k(4.0) * zz - xx - k(3.0) * yy),
            k(C3[2]) * k(8.0) * y * z,
        ];
        dy[12] = [
            k(C3[3]) * k(-6.0) * x * z,
            k(C3[3]) * k(-6.0) * y * z,
            k(C3[3]) * (k(6.0) * zz - k(3.0) * xx - k(3.0) * yy),
        ];
        dy[13] = [
            k(C3[4]) * (k(4.0) * zz - k(3.0) * xx - yy),
            k(C3[4]) * k(-2.0) * x * y,
            k(C3[4]) * k(8.0) * x * z,
        ];
        dy[14] = [
            k(C3[5]) * k(2.0) * x * z,
            k(C3[5]) * k(-2.0) * y * z,
            k(C3[5]) * (xx - yy),
        ];
        dy[15] = [k(C3[6]) * (k(3.0) * xx - k(3.0) * yy), k(C3[6]) * k(-6.0) * x * y, zero];
    }
    (y_, dy)
}

/// The unit direction from `from` to `to`, and the distance.
pub fn direction<F: Real>(from: [F; 3], to: [F; 3]) -> ([F; 3], F) {
    let v = [to[0] - from[0], to[1] - from[1], to[2] - from[2]];
    let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
    ([v[0] / n, v[1] / n, v[2] / n], n)
}

/// The colour seen along unit direction `d` (from the camera to the
/// Gaussian): `Σ coefficient · basis + 0.5`, clamped at 0. `dc` holds the
/// 3 degree-0 coefficients (one per channel), `rest` the others,
/// coefficient by coefficient, 3 channels each.
pub fn color<F: Real>(dc: &[F], rest: &[F], degree: usize, d: [F; 3]) -> [F; 3] {
    let (y, _) = basis(d, degree);
    let mut out = [F::c(0.5); 3];
    for (ch, o) in out.iter_mut().enumerate() {
        *o = *o + dc[ch] * y[0];
        for k in 1..coefficients(degree) {
            *o = *o + rest[(k - 1) * 3 + ch] * y[k];
        }
        *o = o.max(F::zero());
    }
    out
}

/// The backward of [`color`] for `d_color`: adds the coefficients'
/// gradients into `d_dc` and `d_rest`, and returns the gradient with
/// respect to `d` (a channel clamped at 0 passes nothing).
pub fn color_backward<F: Real>(
    dc: &[F],
    rest: &[F],
    degree: usize,
    d: [F; 3],
    d_color: [F; 3],
    d_dc: &mut [F],
    d_rest: &mut [F],
) -> [F; 3] {
    let (y, dy) = basis(d, degree);
    let n = coefficients(degree);
    let mut d_dir = [F::zero(); 3];
    for ch in 0..3 {
        let coefficient = |k: usize| if k == 0 { dc[ch] } else { rest[(k - 1) * 3 + ch] };
        let raw = F::c(0.5) + (0..n).map(|k| coefficient(k) * y[k]).sum::<F>();
        if raw <= F::zero() {
            continue;
        }
        let g = d_color[ch];
        d_dc[ch] = d_dc[ch] + g * y[0];
        for k in 1..n {
            d_rest[(k - 1) * 3 + ch] = d_rest[(k - 1) * 3 + ch] + g * y[k];
        }
        for (k, dy_k) in dy.iter().enumerate().take(n).skip(1) {
            for (dd, dy_ki) in d_dir.iter_mut().zip(dy_k) {
                *dd = *dd + g * coefficient(k) * *dy_ki;
            }
        }
    }
    d_dir
}

/// The backward of [`direction`]'s unit vector: the gradient with respect
/// to `to` for a gradient `d_dir` on the unit direction `d` at distance `n`.
pub fn direction_backward<F: Real>(d: [F; 3], n: F, d_dir: [F; 3]) -> [F; 3] {
    let along = d_dir[0] * d[0] + d_dir[1] * d[1] + d_dir[2] * d[2];
    [
        (d_dir[0] - along * d[0]) / n,
        (d_dir[1] - along * d[1]) / n,
        (d_dir[2] - along * d[2]) / n,
    ]
}
