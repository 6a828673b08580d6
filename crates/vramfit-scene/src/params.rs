//! A scene's Gaussians as parameter arrays, one per group (the groups a
//! memory report and a checkpoint name), and their seeding from a
//! dataset's sparse points.

use crate::cpu::render::Scene;
use crate::cpu::sh::{MAX_DEGREE, coefficients};
use crate::dataset::{Dataset, DatasetError};

/// The parameter groups' names, as memory reports and checkpoints name them.
pub const GROUPS: [&str; 6] = ["means", "log_scales", "rotations", "opacity", "sh_dc", "sh_rest"];

/// A seeded Gaussian's opacity.
pub const INITIAL_OPACITY: f32 = 0.1;
/// SH degree-0 constant: a coefficient `c` gives colour `C0 · c + 0.5`.
const C0: f32 = 0.282_094_8;

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
    /// Gaussians seeded from the sparse points of `data`: at each point,
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
        let all = &data.points;
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
        [3, 3, 4, 1, 3, 3 * (coefficients(self.degree) - 1)]
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
