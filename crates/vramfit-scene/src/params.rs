//! A scene's Gaussians as parameter arrays, one per group (the groups a
//! memory report and a checkpoint name), and their seeding from a
//! dataset's sparse points.

use crate::cpu::render::Scene;
use crate::cpu::sh::{MAX_DEGREE, coefficients};
use crate::dataset::{Dataset, DatasetError, Point};

/// The parameter groups' names, as memory reports and checkpoints name them.
pub const GROUPS: [&str; 6] = ["means", "log_scales", "rotations", "opacity", "sh_dc", "sh_rest"];

/// A seeded Gaussian's opacity.
pub const INITIAL_OPACITY: f32 = 0.1;
/// SH degree-0 constant: a coefficient `c` gives colour `C0 · c + 0.5`.
const C0: f32 = 0.282_094_8;

/// Points seeded at random where a dataset has none (NeRF-synthetic).
pub const RANDOM_POINTS: usize = 10_000;

/// `count` grey points, uniform in a cube around the point the cameras
/// look at (least squares over their optical axes), of half-side a third
/// of the cameras' mean distance to it: where the scene must be.
fn random_points(data: &Dataset, count: usize) -> Result<Vec<Point>, DatasetError> {
    let cameras: Vec<&crate::cpu::camera::Camera> = data.views.iter().map(|v| &v.camera).collect();
    // Σ (I − d dᵀ) p = Σ (I − d dᵀ) c over the axes (centre c, direction d).
    let (mut a, mut b) = ([[0.0f64; 3]; 3], [0.0f64; 3]);
    for cam in &cameras {
        let (c, d) = (cam.center(), cam.rotation[2]);
        for i in 0..3 {
            for j in 0..3 {
                let m = f64::from(i == j) - d[i] * d[j];
                a[i][j] += m;
                b[i] += m * c[j];
            }
        }
    }
    let det = |m: &[[f64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let d = det(&a);
    if cameras.len() < 2 || d.abs() < 1e-9 {
        return Err(DatasetError::Invalid(
            "no sparse points, and the cameras do not look at a common place to seed Gaussians around".into(),
        ));
    }
    // Cramer's rule.
    let target: [f64; 3] = std::array::from_fn(|k| {
        let mut m = a;
        for i in 0..3 {
            m[i][k] = b[i];
        }
        det(&m) / d
    });
    let mean_distance = cameras
        .iter()
        .map(|c| (0..3).map(|i| (c.center()[i] - target[i]).powi(2)).sum::<f64>().sqrt())
        .sum::<f64>()
        / cameras.len() as f64;
    let half = mean_distance / 3.0;
    let mut state = 0x5EED_u64;
    let mut uniform = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    Ok((0..count)
        .map(|_| Point {
            position: std::array::from_fn(|i| target[i] + half * (2.0 * uniform() - 1.0)),
            color: [128; 3],
        })
        .collect())
}

/// The Gaussians as parameter arrays (the groups of [`Scene`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Means.
    pub means: Vec<f32>,
    /// Log scales.
    pub log_scales: Vec<f32>,
    /// Rotations (w, x, y, z).
    pub rotations: Vec<f32>,
    /// Opacity logits.
    pub opacity_logits: Vec<f32>,
    /// Degree-0 SH.
    pub sh_dc: Vec<f32>,
    /// The other SH, at the final degree.
    pub sh_rest: Vec<f32>,
    /// The final degree `sh_rest` is laid out for.
    pub degree: usize,
}

impl Params {
    /// Gaussians seeded from the sparse points of `data` (a dataset without
    /// any, NeRF-synthetic's, gets [`RANDOM_POINTS`] grey ones at random
    /// where its cameras look): at each point,
    /// its colour, round with the scale of the mean distance to its three
    /// nearest neighbours, opacity [`INITIAL_OPACITY`].
    /// At most `cap` of them: when the dataset has more points, an evenly
    /// spaced subset.
    pub fn from_points(data: &Dataset, degree: usize, cap: usize) -> Result<Self, DatasetError> {
        if degree > MAX_DEGREE {
            return Err(DatasetError::Invalid(format!(
                "SH degree {degree} is above {MAX_DEGREE}: give 0 to {MAX_DEGREE}"
            )));
        }
        if cap == 0 {
            return Err(DatasetError::Invalid("the cap on Gaussians must be at least 1".into()));
        }
        let random;
        let all = if data.points.is_empty() {
            random = random_points(data, cap.min(RANDOM_POINTS))?;
            &random
        } else {
            &data.points
        };
        let points: Vec<crate::dataset::Point> = if all.len() > cap {
            (0..cap).map(|k| all[k * all.len() / cap]).collect()
        } else {
            all.clone()
        };
        let points = &points;
        if points.is_empty() {
            return Err(DatasetError::Invalid(
                "the dataset has no sparse points to seed the Gaussians from".into(),
            ));
        }
        let n = points.len();
        let mut log_scales = Vec::with_capacity(3 * n);
        for (i, p) in points.iter().enumerate() {
            let mut nearest = [f64::INFINITY; 3];
            for (j, q) in points.iter().enumerate() {
                if i == j {
                    continue;
                }
                let d2: f64 = (0..3).map(|k| (p.position[k] - q.position[k]).powi(2)).sum();
                if d2 < nearest[2] {
                    nearest[2] = d2;
                    nearest.sort_by(f64::total_cmp);
                }
            }
            let finite: Vec<f64> = nearest.into_iter().filter(|d| d.is_finite()).collect();
            let mean = if finite.is_empty() {
                1e-2
            } else {
                finite.iter().sum::<f64>() / finite.len() as f64
            };
            let scale = mean.max(1e-7).sqrt().ln() as f32;
            log_scales.extend([scale; 3]);
        }
        let logit = (INITIAL_OPACITY / (1.0 - INITIAL_OPACITY)).ln();
        Ok(Self {
            means: points.iter().flat_map(|p| p.position.map(|v| v as f32)).collect(),
            log_scales,
            rotations: (0..n).flat_map(|_| [1.0, 0.0, 0.0, 0.0]).collect(),
            opacity_logits: vec![logit; n],
            sh_dc: points
                .iter()
                .flat_map(|p| p.color.map(|c| (c as f32 / 255.0 - 0.5) / C0))
                .collect(),
            sh_rest: vec![0.0; n * 3 * (coefficients(degree) - 1)],
            degree,
        })
    }

    /// The scene these parameters describe, rendered at their final degree.
    pub fn scene(&self) -> Scene<'_, f32> {
        Scene {
            means: &self.means,
            log_scales: &self.log_scales,
            rotations: &self.rotations,
            opacity_logits: &self.opacity_logits,
            sh_dc: &self.sh_dc,
            sh_rest: &self.sh_rest,
            degree: self.degree,
        }
    }

    /// Gaussians.
    pub fn len(&self) -> usize {
        self.opacity_logits.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.opacity_logits.is_empty()
    }

    /// Values a Gaussian in each group, in [`GROUPS`]' order.
    pub fn widths(&self) -> [usize; 6] {
        crate::cpu::render::group_widths(self.degree)
    }

    /// The groups in [`GROUPS`]' order.
    pub fn groups(&self) -> [&Vec<f32>; 6] {
        [
            &self.means,
            &self.log_scales,
            &self.rotations,
            &self.opacity_logits,
            &self.sh_dc,
            &self.sh_rest,
        ]
    }

    /// The groups in [`GROUPS`]' order, to change.
    pub fn groups_mut(&mut self) -> [&mut Vec<f32>; 6] {
        [
            &mut self.means,
            &mut self.log_scales,
            &mut self.rotations,
            &mut self.opacity_logits,
            &mut self.sh_dc,
            &mut self.sh_rest,
        ]
    }
}
