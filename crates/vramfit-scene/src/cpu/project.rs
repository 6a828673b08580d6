//! One 3D Gaussian seen by a camera: its screen mean, the conic (inverse)
//! of its screen covariance (EWA splatting: `Σ' = J W Σ Wᵀ Jᵀ` plus a
//! 0.3-pixel low-pass on the diagonal), its opacity, its colour for the
//! view direction, its radius (three standard deviations of the larger
//! axis) and the tiles it covers; and the backward of all of it to the
//! Gaussian's parameters. The backward recomputes the forward's
//! intermediates rather than keeping them: per Gaussian they are a few
//! dozen floats, cheaper to redo than to store for millions.
//!
//! Parameters as 3DGS stores them: the mean, the scale as its log, the
//! rotation as a quaternion (w, x, y, z; normalised in use), the opacity
//! as a logit, and the SH coefficients (degree 0 and the rest apart).

use super::camera::Camera;
use super::sh::{color, color_backward, direction, direction_backward};
use vramfit_gauss::Real;
use vramfit_gauss::tile::TILE;

/// Gaussians nearer the camera than this (in its z) are not drawn.
pub const NEAR: f64 = 0.2;

/// Added to the screen covariance's diagonal: every Gaussian covers at
/// least about a pixel (an anti-aliasing low-pass).
pub const LOW_PASS: f64 = 0.3;

/// How far past the image's edges (as a multiple of the half field of
/// view) the Jacobian is evaluated: a Gaussian far outside is linearised
/// there, which keeps its screen footprint finite.
pub const FRUSTUM_SLACK: f64 = 1.3;

/// One Gaussian's parameters.
#[derive(Debug, Clone, Copy)]
pub struct Gaussian<'a, F> {
    /// Mean in the world.
    pub mean: [F; 3],
    /// Log of the scale along each of its axes.
    pub log_scale: [F; 3],
    /// Rotation quaternion (w, x, y, z), not necessarily unit.
    pub rotation: [F; 4],
    /// Opacity as a logit.
    pub opacity_logit: F,
    /// Degree-0 SH coefficients, one per channel.
    pub sh_dc: &'a [F],
    /// The other SH coefficients, coefficient by coefficient, 3 channels each.
    pub sh_rest: &'a [F],
}

/// What the rasteriser needs of one Gaussian.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Projected<F> {
    /// Depth: z in the camera's frame.
    pub depth: F,
    /// Screen mean, pixels.
    pub mean: [F; 2],
    /// Inverse screen covariance (a, b, c): `[[a, b], [b, c]]`.
    pub conic: [F; 3],
    /// Opacity in (0, 1).
    pub opacity: F,
    /// Colour for this view.
    pub color: [F; 3],
    /// Radius in pixels (three standard deviations of the larger axis).
    pub radius: usize,
    /// Tiles covered: columns `tiles[0]..tiles[1]`, rows `tiles[2]..tiles[3]`.
    pub tiles: [usize; 4],
}

/// Gradients with respect to a [`Projected`]'s continuous fields.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProjectedGrads<F> {
    /// Screen mean.
    pub mean: [F; 2],
    /// Conic (a, b, c).
    pub conic: [F; 3],
    /// Opacity.
    pub opacity: F,
    /// Colour.
    pub color: [F; 3],
}

/// Gradients with respect to one Gaussian's parameters (its SH
/// coefficients' are added in place by [`project_backward`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GaussianGrads<F> {
    /// Mean.
    pub mean: [F; 3],
    /// Log scale.
    pub log_scale: [F; 3],
    /// Rotation quaternion (as given, before normalisation).
    pub rotation: [F; 4],
    /// Opacity logit.
    pub opacity_logit: F,
}

type M3<F> = [[F; 3]; 3];

fn mat3<F: Real>(c: &[[f64; 3]; 3]) -> M3<F> {
    c.map(|row| row.map(F::c))
}

/// The rotation matrix of unit quaternion (w, x, y, z).
pub fn rotation_matrix<F: Real>([w, x, y, z]: [F; 4]) -> M3<F> {
    let (one, two) = (F::one(), F::c(2.0));
    [
        [
            one - two * (y * y + z * z),
            two * (x * y - w * z),
            two * (x * z + w * y),
        ],
        [
            two * (x * y + w * z),
            one - two * (x * x + z * z),
            two * (y * z - w * x),
        ],
        [
            two * (x * z - w * y),
            two * (y * z + w * x),
            one - two * (x * x + y * y),
        ],
    ]
}

/// The gradient with respect to a unit quaternion of `g`, a gradient on
/// [`rotation_matrix`]'s entries.
fn rotation_matrix_backward<F: Real>([w, x, y, z]: [F; 4], g: &M3<F>) -> [F; 4] {
    let (two, four) = (F::c(2.0), F::c(4.0));
    let dw = two * (-z * g[0][1] + y * g[0][2] + z * g[1][0] - x * g[1][2] - y * g[2][0] + x * g[2][1]);
    let dx = two * (y * g[0][1] + z * g[0][2] + y * g[1][0] - w * g[1][2] + z * g[2][0] + w * g[2][1])
        - four * x * (g[1][1] + g[2][2]);
    let dy = two * (x * g[0][1] + w * g[0][2] + x * g[1][0] + z * g[1][2] - w * g[2][0] + z * g[2][1])
        - four * y * (g[0][0] + g[2][2]);
    let dz = two * (-w * g[0][1] + x * g[0][2] + w * g[1][0] + y * g[1][2] + x * g[2][0] + y * g[2][1])
        - four * z * (g[0][0] + g[1][1]);
    [dw, dx, dy, dz]
}

/// The forward's intermediates, recomputed by the backward.
struct Geometry<F> {
    /// Mean in the camera's frame.
    p: [F; 3],
    /// x/z and y/z, clamped to the slack frustum, and whether each was clamped.
    ratio: [F; 2],
    clamped: [bool; 2],
    /// World-to-camera rotation.
    w: M3<F>,
    /// Unit quaternion, its norm, its matrix, the scales.
    q: [F; 4],
    q_norm: F,
    r: M3<F>,
    s: [F; 3],
    /// `M = R S` and `Σ = M Mᵀ`.
    m: M3<F>,
    sigma: M3<F>,
    /// `T = J W` (2×3).
    t: [[F; 3]; 2],
    /// The screen covariance with the low-pass: `[[a, b], [b, c]]`.
    cov: [F; 3],
    det: F,
}

fn geometry<F: Real>(g: &Gaussian<F>, camera: &Camera) -> Option<Geometry<F>> {
    let w = mat3::<F>(&camera.rotation);
    let t_cam = camera.translation.map(F::c);
    let p: [F; 3] = std::array::from_fn(|i| (0..3).map(|k| w[i][k] * g.mean[k]).sum::<F>() + t_cam[i]);
    if p[2] <= F::c(NEAR) {
        return None;
    }
    let (fx, fy) = (F::c(camera.fx), F::c(camera.fy));
    let limits = [
        F::c(FRUSTUM_SLACK * camera.width as f64 / (2.0 * camera.fx)),
        F::c(FRUSTUM_SLACK * camera.height as f64 / (2.0 * camera.fy)),
    ];
    let mut ratio = [p[0] / p[2], p[1] / p[2]];
    let mut clamped = [false; 2];
    for i in 0..2 {
        if ratio[i].abs() > limits[i] {
            ratio[i] = limits[i] * ratio[i].signum();
            clamped[i] = true;
        }
    }
    let z = p[2];
    let j = [
        [fx / z, F::zero(), -fx * ratio[0] / z],
        [F::zero(), fy / z, -fy * ratio[1] / z],
    ];
    let q_norm = g.rotation.iter().map(|v| *v * *v).sum::<F>().sqrt();
    // Also refuses a NaN norm.
    if q_norm.is_nan() || q_norm <= F::zero() {
        return None;
    }
    let q = g.rotation.map(|v| v / q_norm);
    let r = rotation_matrix(q);
    let s = g.log_scale.map(|v| v.exp());
    let m: M3<F> = std::array::from_fn(|i| std::array::from_fn(|k| r[i][k] * s[k]));
    let sigma: M3<F> = std::array::from_fn(|i| std::array::from_fn(|k| (0..3).map(|l| m[i][l] * m[k][l]).sum()));
    let t: [[F; 3]; 2] = std::array::from_fn(|i| std::array::from_fn(|k| (0..3).map(|l| j[i][l] * w[l][k]).sum()));
    let tst = |a: usize, b: usize| -> F {
        (0..3)
            .map(|k| (0..3).map(|l| t[a][k] * sigma[k][l] * t[b][l]).sum::<F>())
            .sum()
    };
    let low = F::c(LOW_PASS);
    let cov = [tst(0, 0) + low, tst(0, 1), tst(1, 1) + low];
    let det = cov[0] * cov[2] - cov[1] * cov[1];
    if det.is_nan() || det <= F::zero() {
        return None;
    }
    Some(Geometry {
        p,
        ratio,
        clamped,
        w,
        q,
        q_norm,
        r,
        s,
        m,
        sigma,
        t,
        cov,
        det,
    })
}

/// The Gaussian on the screen, or `None` when it is not drawn (behind the
/// near plane, degenerate, or covering no tile).
pub fn project<F: Real>(g: &Gaussian<F>, degree: usize, camera: &Camera) -> Option<Projected<F>> {
    let geo = geometry(g, camera)?;
    let [a, b, c] = geo.cov;
    let conic = [c / geo.det, -b / geo.det, a / geo.det];
    let mid = F::c(0.5) * (a + c);
    let lambda = mid + (mid * mid - geo.det).max(F::c(0.1)).sqrt();
    let radius = (F::c(3.0) * lambda.sqrt()).ceil().to_usize()?;
    let z = geo.p[2];
    let mean = [
        F::c(camera.fx) * geo.p[0] / z + F::c(camera.cx),
        F::c(camera.fy) * geo.p[1] / z + F::c(camera.cy),
    ];
    let (tiles_x, tiles_y) = camera.tiles();
    let span = |centre: F, tiles: usize| -> (usize, usize) {
        let r = F::c(radius as f64);
        let tile = F::c(TILE as f64);
        let lo = ((centre - r) / tile).floor().max(F::zero()).min(F::c(tiles as f64));
        let hi = ((centre + r) / tile).ceil().max(F::zero()).min(F::c(tiles as f64));
        (lo.to_usize().unwrap_or(0), hi.to_usize().unwrap_or(0))
    };
    let (x0, x1) = span(mean[0], tiles_x);
    let (y0, y1) = span(mean[1], tiles_y);
    if radius == 0 || x0 >= x1 || y0 >= y1 {
        return None;
    }
    let centre = camera.center().map(F::c);
    let (dir, _) = direction(centre, g.mean);
    Some(Projected {
        depth: z,
        mean,
        conic,
        opacity: sigmoid(g.opacity_logit),
        color: color(g.sh_dc, g.sh_rest, degree, dir),
        radius,
        tiles: [x0, x1, y0, y1],
    })
}

fn sigmoid<F: Real>(v: F) -> F {
    F::one() / (F::one() + (-v).exp())
}

/// The backward of [`project`] for the gradients `d` on its output: the
/// gradients with respect to the Gaussian's parameters; its SH
/// coefficients' are added into `d_sh_dc` and `d_sh_rest`. Call it only
/// for a Gaussian that [`project`] drew.
pub fn project_backward<F: Real>(
    g: &Gaussian<F>,
    degree: usize,
    camera: &Camera,
    d: &ProjectedGrads<F>,
    d_sh_dc: &mut [F],
    d_sh_rest: &mut [F],
) -> GaussianGrads<F> {
    let Some(geo) = geometry(g, camera) else {
        return GaussianGrads::default();
    };
    let zero = F::zero();
    let mut out = GaussianGrads::default();

    // Opacity: o = sigmoid(logit).
    let o = sigmoid(g.opacity_logit);
    out.opacity_logit = d.opacity * o * (F::one() - o);

    // Colour, through the SH and the view direction.
    let centre = camera.center().map(F::c);
    let (dir, dist) = direction(centre, g.mean);
    let d_dir = color_backward(g.sh_dc, g.sh_rest, degree, dir, d.color, d_sh_dc, d_sh_rest);
    out.mean = direction_backward(dir, dist, d_dir);

    // Conic (a, b, c) = (C, −B, A) / det of the covariance [[A, B], [B, C]].
    let [ca, cb, cc] = geo.cov;
    let det2 = geo.det * geo.det;
    let [ga, gb, gc] = d.conic;
    let d_cov_a = (-ga * cc * cc + gb * cb * cc - gc * cb * cb) / det2;
    let d_cov_b = (ga * F::c(2.0) * cb * cc - gb * (geo.det + F::c(2.0) * cb * cb) + gc * F::c(2.0) * ca * cb) / det2;
    let d_cov_c = (-ga * cb * cb + gb * cb * ca - gc * ca * ca) / det2;
    // As a symmetric matrix gradient: B sits at (0, 1) and (1, 0).
    let half = F::c(0.5);
    let g_cov = [[d_cov_a, half * d_cov_b], [half * d_cov_b, d_cov_c]];

    // cov = T Σ Tᵀ: dΣ = Tᵀ G T, dT = 2 G T Σ.
    let t = &geo.t;
    let d_sigma: M3<F> = std::array::from_fn(|k| {
        std::array::from_fn(|l| {
            (0..2)
                .map(|a| (0..2).map(|b| t[a][k] * g_cov[a][b] * t[b][l]).sum::<F>())
                .sum()
        })
    });
    let gt: [[F; 3]; 2] = std::array::from_fn(|a| std::array::from_fn(|k| (0..2).map(|b| g_cov[a][b] * t[b][k]).sum()));
    let d_t: [[F; 3]; 2] = std::array::from_fn(|a| {
        std::array::from_fn(|k| F::c(2.0) * (0..3).map(|l| gt[a][l] * geo.sigma[l][k]).sum::<F>())
    });
    // T = J W: dJ = dT Wᵀ.
    let d_j: [[F; 3]; 2] =
        std::array::from_fn(|a| std::array::from_fn(|l| (0..3).map(|k| d_t[a][k] * geo.w[l][k]).sum()));

    // The camera-space mean, through the screen mean and the Jacobian.
    let (fx, fy) = (F::c(camera.fx), F::c(camera.fy));
    let [x, y, z] = geo.p;
    let mut d_p = [zero; 3];
    d_p[0] = d_p[0] + d.mean[0] * fx / z;
    d_p[1] = d_p[1] + d.mean[1] * fy / z;
    d_p[2] = d_p[2] - d.mean[0] * fx * x / (z * z) - d.mean[1] * fy * y / (z * z);
    // J = [[fx/z, 0, −fx r0/z], [0, fy/z, −fy r1/z]] with r = x/z, y/z (clamped: constant).
    d_p[2] = d_p[2] - d_j[0][0] * fx / (z * z) - d_j[1][1] * fy / (z * z);
    for (i, f) in [(0, fx), (1, fy)] {
        let r = geo.ratio[i];
        if geo.clamped[i] {
            // −f r / z with r fixed.
            d_p[2] = d_p[2] + d_j[i][2] * f * r / (z * z);
        } else {
            // −f x / z²: d/dx = −f / z², d/dz = 2 f x / z³.
            d_p[i] = d_p[i] - d_j[i][2] * f / (z * z);
            d_p[2] = d_p[2] + d_j[i][2] * F::c(2.0) * f * r / (z * z);
        }
    }
    // p = W μ + t: dμ = Wᵀ dp.
    for (k, m) in out.mean.iter_mut().enumerate() {
        *m = *m + (0..3).map(|i| geo.w[i][k] * d_p[i]).sum::<F>();
    }

    // Σ = M Mᵀ: dM = 2 dΣ M (dΣ symmetric); M = R S.
    let d_m: M3<F> = std::array::from_fn(|i| {
        std::array::from_fn(|k| F::c(2.0) * (0..3).map(|l| d_sigma[i][l] * geo.m[l][k]).sum::<F>())
    });
    for (k, d_log_scale) in out.log_scale.iter_mut().enumerate() {
        let d_s = (0..3).map(|i| d_m[i][k] * geo.r[i][k]).sum::<F>();
        *d_log_scale = d_s * geo.s[k];
    }
    let d_r: M3<F> = std::array::from_fn(|i| std::array::from_fn(|k| d_m[i][k] * geo.s[k]));
    let d_q = rotation_matrix_backward(geo.q, &d_r);
    // q̂ = q / |q|: dq = (dq̂ − (dq̂·q̂) q̂) / |q|.
    let along = (0..4).map(|i| d_q[i] * geo.q[i]).sum::<F>();
    out.rotation = std::array::from_fn(|i| (d_q[i] - along * geo.q[i]) / geo.q_norm);
    out
}
