//! Growing and pruning the Gaussians during a fit, as 3DGS does, under a
//! cap the user (and the planner) sets and that densification never
//! exceeds. Every `every` steps between `from` and `until`: a Gaussian
//! whose mean screen-position gradient (in normalised device coordinates,
//! averaged over the steps it was drawn) reaches `grad_threshold` is
//! cloned when small (largest scale ≤ `percent_dense` × the scene's
//! extent) or split in two when large (each drawn from the Gaussian, its
//! scales divided by 1.6); Gaussians below `min_opacity` are pruned, and,
//! after the first opacity reset, those wider than `max_screen_radius`
//! pixels or a tenth of the extent. The candidates grow largest gradient
//! first until the cap is reached. Every `reset_every` steps the
//! opacities are lowered to 0.01 (their Adam moments cleared).

use crate::cpu::project::rotation_matrix;
use crate::params::Params;

/// When and how to densify.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Densify {
    /// First step that densifies.
    pub from: u64,
    /// No densification from this step on.
    pub until: u64,
    /// Steps between densifications.
    pub every: u64,
    /// Mean screen-position gradient (NDC units) that makes a Gaussian grow.
    pub grad_threshold: f32,
    /// Largest scale, as a fraction of the extent, of a Gaussian cloned rather than split.
    pub percent_dense: f32,
    /// Gaussians less opaque than this are pruned.
    pub min_opacity: f32,
    /// Steps between opacity resets (0: none).
    pub reset_every: u64,
    /// After the first reset, Gaussians wider than this many pixels are pruned.
    pub max_screen_radius: f32,
    /// The most Gaussians the fit may hold.
    pub max_gaussians: usize,
}

impl Default for Densify {
    fn default() -> Self {
        Self {
            from: 500,
            until: 15_000,
            every: 100,
            grad_threshold: 2e-4,
            percent_dense: 0.01,
            min_opacity: 0.005,
            reset_every: 3_000,
            max_screen_radius: 20.0,
            max_gaussians: 1_000_000,
        }
    }
}

/// What densification reads, per Gaussian, accumulated between densifications.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stats {
    /// Sum of the screen-position gradient's norm over the steps it was drawn.
    pub grad: Vec<f32>,
    /// Steps it was drawn.
    pub seen: Vec<f32>,
    /// Its largest screen radius (pixels).
    pub max_radius: Vec<f32>,
}

impl Stats {
    /// Zeroed statistics for `n` Gaussians.
    pub fn new(n: usize) -> Self {
        Self {
            grad: vec![0.0; n],
            seen: vec![0.0; n],
            max_radius: vec![0.0; n],
        }
    }

    /// Records Gaussian `i` drawn at `radius` pixels with screen-mean
    /// gradient `g` (pixels) in a `width × height` image.
    pub fn add(&mut self, i: usize, g: [f32; 2], radius: f32, width: usize, height: usize) {
        // d/d(ndc) = d/d(pixel) × half the image's side.
        let (x, y) = (g[0] * width as f32 / 2.0, g[1] * height as f32 / 2.0);
        self.grad[i] += (x * x + y * y).sqrt();
        self.seen[i] += 1.0;
        self.max_radius[i] = self.max_radius[i].max(radius);
    }
}

/// Where a Gaussian of the new set comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    /// Gaussian `i` as it was.
    Keep(usize),
    /// A copy of Gaussian `i`.
    Clone(usize),
    /// Sample `k` (0 or 1) of Gaussian `i`, split.
    Split(usize, u8),
}

/// What a densification did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Report {
    /// Gaussians cloned.
    pub cloned: usize,
    /// Gaussians split in two.
    pub split: usize,
    /// Gaussians pruned.
    pub pruned: usize,
    /// Candidates left out because the cap was reached.
    pub capped: usize,
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// The new set's rows (kept first, then clones, then split samples).
pub fn plan(p: &Params, stats: &Stats, d: &Densify, extent: f32, prune_large: bool) -> (Vec<Row>, Report) {
    let n = p.len();
    let max_scale = |i: usize| {
        p.log_scales[3 * i..3 * i + 3]
            .iter()
            .fold(f32::MIN, |m, v| m.max(*v))
            .exp()
    };
    let prune: Vec<bool> = (0..n)
        .map(|i| {
            sigmoid(p.opacity_logits[i]) < d.min_opacity
                || (prune_large && (stats.max_radius[i] > d.max_screen_radius || max_scale(i) > 0.1 * extent))
        })
        .collect();
    let mut report = Report {
        pruned: prune.iter().filter(|x| **x).count(),
        ..Report::default()
    };
    let avg = |i: usize| {
        if stats.seen[i] > 0.0 {
            stats.grad[i] / stats.seen[i]
        } else {
            0.0
        }
    };
    let mut candidates: Vec<usize> = (0..n).filter(|&i| !prune[i] && avg(i) >= d.grad_threshold).collect();
    candidates.sort_by(|&a, &b| avg(b).total_cmp(&avg(a)).then(a.cmp(&b)));
    let mut count = n - report.pruned;
    let (mut clones, mut splits) = (Vec::new(), Vec::new());
    for i in candidates {
        // A clone or a split each adds one Gaussian.
        if count + 1 > d.max_gaussians {
            report.capped += 1;
            continue;
        }
        count += 1;
        if max_scale(i) <= d.percent_dense * extent {
            clones.push(i);
        } else {
            splits.push(i);
        }
    }
    report.cloned = clones.len();
    report.split = splits.len();
    let mut rows: Vec<Row> = (0..n)
        .filter(|&i| !prune[i] && !splits.contains(&i))
        .map(Row::Keep)
        .collect();
    rows.extend(clones.iter().map(|&i| Row::Clone(i)));
    rows.extend(splits.iter().flat_map(|&i| [Row::Split(i, 0), Row::Split(i, 1)]));
    debug_assert!(rows.len() <= d.max_gaussians.max(n - report.pruned));
    (rows, report)
}

/// A standard normal sample, the same for the same (`step`, `i`, `k`, `axis`).
fn normal(step: u64, i: usize, k: u8, axis: usize) -> f32 {
    let uniform = |salt: u64| {
        let mut z = step
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add((i as u64) << 8 | (k as u64) << 4 | axis as u64)
            .wrapping_add(salt.wrapping_mul(0xD1B5_4A32_D192_ED03));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let (u1, u2) = (uniform(1).max(1e-300), uniform(2));
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// The rows of one per-Gaussian array `values` (`width` values a Gaussian):
/// kept and cloned rows copy, split rows come from `split` (the old row
/// and the sample index), and `fresh` rows (clones and splits) of state
/// that starts over are zero when `zero_new`.
pub fn apply(
    values: &[f32],
    width: usize,
    rows: &[Row],
    zero_new: bool,
    split: impl Fn(&[f32], usize, u8) -> Vec<f32>,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * width);
    for row in rows {
        match *row {
            Row::Keep(i) => out.extend_from_slice(&values[width * i..width * (i + 1)]),
            _ if zero_new => out.extend(std::iter::repeat_n(0.0, width)),
            Row::Clone(i) => out.extend_from_slice(&values[width * i..width * (i + 1)]),
            Row::Split(i, k) => out.extend(split(&values[width * i..width * (i + 1)], i, k)),
        }
    }
    out
}

/// The parameters of the new set: split samples drawn from their
/// Gaussian (at `step`), with their scales divided by 1.6.
pub fn apply_params(p: &Params, rows: &[Row], step: u64) -> Params {
    let copy = |v: &[f32], _: usize, _: u8| v.to_vec();
    let rest = p.sh_rest.len() / p.len().max(1);
    let means = apply(&p.means, 3, rows, false, |m, i, k| {
        let s: Vec<f32> = p.log_scales[3 * i..3 * i + 3].iter().map(|v| v.exp()).collect();
        let q = &p.rotations[4 * i..4 * i + 4];
        let norm = q.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        let r = rotation_matrix([q[0] / norm, q[1] / norm, q[2] / norm, q[3] / norm]);
        let z: Vec<f32> = (0..3).map(|a| normal(step, i, k, a) * s[a]).collect();
        (0..3)
            .map(|a| m[a] + (0..3).map(|b| r[a][b] * z[b]).sum::<f32>())
            .collect()
    });
    Params {
        means,
        log_scales: apply(&p.log_scales, 3, rows, false, |s, _, _| {
            s.iter().map(|v| v - 1.6f32.ln()).collect()
        }),
        rotations: apply(&p.rotations, 4, rows, false, copy),
        opacity_logits: apply(&p.opacity_logits, 1, rows, false, copy),
        sh_dc: apply(&p.sh_dc, 3, rows, false, copy),
        sh_rest: apply(&p.sh_rest, rest, rows, false, copy),
        degree: p.degree,
    }
}
