//! Fitting a scene's Gaussians to its training views on the CPU twin, as
//! 3DGS trains them (without densification yet): one view a step, loss
//! `(1 − λ) L1 + λ (1 − SSIM)` with λ = 0.2, Adam with the reference
//! learning rates per parameter group (positions scaled by the scene's
//! extent and decayed exponentially over the run), the SH degree raised by
//! one every `sh_every` steps, Gaussians seeded from the sparse points.
//! The SH "rest" coefficients are held at the final degree from the start;
//! a band not yet active is zero and receives no update, which renders
//! exactly as the lower degree does.

use vramfit_splat::cpu::ssim::ssim_and_backward;

use crate::cpu::camera::Camera;
use crate::cpu::render::{SceneGrads, render, render_backward};
use crate::cpu::sh::coefficients;
use crate::dataset::{Dataset, DatasetError};
use crate::densify::{Densify, Report, Row, Stats, apply, apply_params, plan};
pub use crate::params::{GROUPS, INITIAL_OPACITY, Params};

/// Weight of the SSIM term in the loss.
pub const LAMBDA_SSIM: f32 = 0.2;
/// Learning rates per parameter group (the 3DGS reference's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearningRates {
    /// Positions at the first step, times the scene's extent.
    pub means: f32,
    /// Positions at the last step, times the extent (exponential in between).
    pub means_final: f32,
    /// Log scales.
    pub log_scales: f32,
    /// Rotations.
    pub rotations: f32,
    /// Opacity logits.
    pub opacity: f32,
    /// Degree-0 SH.
    pub sh_dc: f32,
    /// Higher SH (a twentieth of the degree-0 rate).
    pub sh_rest: f32,
}

impl Default for LearningRates {
    fn default() -> Self {
        Self {
            means: 1.6e-4,
            means_final: 1.6e-6,
            log_scales: 5e-3,
            rotations: 1e-3,
            opacity: 0.05,
            sh_dc: 2.5e-3,
            sh_rest: 2.5e-3 / 20.0,
        }
    }
}

/// How a scene is fitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Optimiser steps (one view each).
    pub steps: u64,
    /// The final SH degree (0–3).
    pub sh_degree: usize,
    /// Steps between raising the SH degree by one.
    pub sh_every: u64,
    /// The colour behind the Gaussians.
    pub background: [f32; 3],
    /// Learning rates.
    pub lr: LearningRates,
    /// Growing and pruning, and the cap on the number of Gaussians.
    pub densify: Densify,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            steps: 30_000,
            sh_degree: 3,
            sh_every: 1_000,
            background: [0.0; 3],
            lr: LearningRates::default(),
            densify: Densify::default(),
        }
    }
}

/// Adam's moments for one group.
#[derive(Debug, Clone, PartialEq)]
struct Moments {
    m: Vec<f32>,
    v: Vec<f32>,
}

/// The scene's extent: 1.1 × the largest distance of a training camera's
/// centre from their mean (the positions' learning rate scales with it).
pub fn extent(cameras: &[&Camera]) -> f32 {
    let n = cameras.len().max(1) as f64;
    let centres: Vec<[f64; 3]> = cameras.iter().map(|c| c.center()).collect();
    let mean: [f64; 3] = std::array::from_fn(|k| centres.iter().map(|c| c[k]).sum::<f64>() / n);
    let far = centres
        .iter()
        .map(|c| (0..3).map(|k| (c[k] - mean[k]).powi(2)).sum::<f64>().sqrt())
        .fold(0.0, f64::max);
    (1.1 * far.max(1e-6)) as f32
}

/// A fit in progress: the dataset, the parameters, their Adam state and
/// the step.
pub struct Fit {
    data: Dataset,
    settings: Settings,
    train: Vec<usize>,
    held_out: Vec<usize>,
    extent: f32,
    /// The parameters.
    pub params: Params,
    moments: Vec<Moments>,
    /// Steps done.
    pub step: u64,
    /// The loss of the last step.
    pub last_loss: f32,
    /// What densification reads, since the last one.
    pub stats: Stats,
    /// What densification has done over the fit (this session).
    pub densified: Report,
}

/// PSNR of `x` against `y` (values in [0, 1]).
pub fn psnr(x: &[f32], y: &[f32]) -> f64 {
    let mse = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / x.len().max(1) as f64;
    10.0 * (1.0 / mse.max(1e-12)).log10()
}

impl Fit {
    /// A fit of `data` seeded from its sparse points.
    pub fn new(data: Dataset, settings: Settings) -> Result<Self, DatasetError> {
        let params = Params::from_points(&data, settings.sh_degree, settings.densify.max_gaussians)?;
        let (train, held_out) = data.split();
        if train.is_empty() {
            return Err(DatasetError::Invalid(
                "no training views: the dataset needs at least two views".into(),
            ));
        }
        let cameras: Vec<&Camera> = train.iter().map(|&i| &data.views[i].camera).collect();
        let extent = extent(&cameras);
        let n = params.len();
        let moments = params
            .groups()
            .iter()
            .map(|g| Moments {
                m: vec![0.0; g.len()],
                v: vec![0.0; g.len()],
            })
            .collect();
        Ok(Self {
            extent,
            data,
            settings,
            train,
            held_out,
            params,
            moments,
            step: 0,
            last_loss: f32::NAN,
            stats: Stats::new(n),
            densified: Report::default(),
        })
    }

    /// The SH degree in use at step `step` (1-based).
    pub fn active_degree(&self, step: u64) -> usize {
        let raised = (step.saturating_sub(1) / self.settings.sh_every.max(1)) as usize;
        raised.min(self.settings.sh_degree)
    }

    /// One step on the next training view; returns the loss.
    pub fn step(&mut self) -> f32 {
        let grads = self.forward_backward();
        self.optimize(&grads);
        self.last_loss
    }

    /// The first half of a step: render the next training view, the loss
    /// and every parameter's gradient (the step counter advances).
    pub fn forward_backward(&mut self) -> SceneGrads<f32> {
        self.step += 1;
        let view = &self.data.views[self.train[(self.step as usize - 1) % self.train.len()]];
        let camera = &view.camera;
        let background = self.settings.background;
        let scene = self.params.scene();
        let rendered = render(&scene, camera, background);
        let n = rendered.image.len() as f32;
        let (h, w) = (camera.height, camera.width);
        let (ssim, d_ssim) = ssim_and_backward(&rendered.image, &view.image, h, w, 3, -LAMBDA_SSIM);
        let l1: f32 = rendered
            .image
            .iter()
            .zip(&view.image)
            .map(|(x, y)| (x - y).abs())
            .sum::<f32>()
            / n;
        let d_image: Vec<f32> = rendered
            .image
            .iter()
            .zip(&view.image)
            .zip(&d_ssim)
            .map(|((x, y), s)| (1.0 - LAMBDA_SSIM) * (x - y).signum() / n + s)
            .collect();
        let mut grads = render_backward(&scene, camera, background, &rendered, &d_image);
        if self.step < self.settings.densify.until {
            for (i, p) in rendered.projected.iter().enumerate() {
                if let Some(p) = p {
                    let g = [grads.screen_means[2 * i], grads.screen_means[2 * i + 1]];
                    self.stats.add(i, g, p.radius as f32, w, h);
                }
            }
        }
        self.mask_inactive_bands(&mut grads);
        self.last_loss = (1.0 - LAMBDA_SSIM) * l1 + LAMBDA_SSIM * (1.0 - ssim);
        grads
    }

    /// The second half: Adam on every group, then densification and the
    /// opacity reset when their step has come.
    pub fn optimize(&mut self, grads: &SceneGrads<f32>) {
        self.adam(grads);
        let (d, step) = (self.settings.densify, self.step);
        if step >= d.from && step < d.until && d.every > 0 && step.is_multiple_of(d.every) {
            self.densify(step > d.reset_every && d.reset_every > 0);
        }
        if d.reset_every > 0 && step < d.until && step.is_multiple_of(d.reset_every) {
            self.reset_opacity();
        }
    }

    /// Grows and prunes the Gaussians ([`crate::densify`]); the moments of
    /// new ones start at zero, the statistics start over.
    fn densify(&mut self, prune_large: bool) {
        let (rows, report) = plan(
            &self.params,
            &self.stats,
            &self.settings.densify,
            self.extent,
            prune_large,
        );
        self.params = apply_params(&self.params, &rows, self.step);
        let widths = self.params.widths();
        for (m, width) in self.moments.iter_mut().zip(widths) {
            let fresh = |_: &[f32], _: usize, _: u8| Vec::new();
            m.m = apply(&m.m, width, &rows, true, fresh);
            m.v = apply(&m.v, width, &rows, true, fresh);
        }
        self.stats = Stats::new(rows.len());
        let t = &mut self.densified;
        (t.cloned, t.split, t.pruned, t.capped) = (
            t.cloned + report.cloned,
            t.split + report.split,
            t.pruned + report.pruned,
            t.capped + report.capped,
        );
        debug_assert!(
            rows.iter()
                .all(|r| !matches!(r, Row::Keep(i) if *i >= rows.len() + report.pruned + report.split))
        );
    }

    /// Opacities lowered to 0.01 (the larger ones), their moments cleared.
    fn reset_opacity(&mut self) {
        let ceiling = (0.01f32 / 0.99).ln();
        for v in &mut self.params.opacity_logits {
            *v = v.min(ceiling);
        }
        let m = &mut self.moments[3];
        m.m.fill(0.0);
        m.v.fill(0.0);
    }

    /// The dataset.
    pub fn data(&self) -> &Dataset {
        &self.data
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Adam's first and second moments, group by group in [`GROUPS`]' order.
    pub fn moments(&self) -> Vec<(&[f32], &[f32])> {
        self.moments.iter().map(|m| (m.m.as_slice(), m.v.as_slice())).collect()
    }

    /// Restores the parameters, Adam's moments (as [`Fit::moments`] gives
    /// them), the densification statistics and the step of a checkpoint
    /// (the number of Gaussians may differ from the seeded fit's); an error
    /// names a group whose length does not fit the others.
    pub fn restore(
        &mut self,
        params: Params,
        moments: Vec<(Vec<f32>, Vec<f32>)>,
        stats: Stats,
        step: u64,
    ) -> Result<(), String> {
        let n = params.len();
        for (i, (g, width)) in params.groups().iter().zip(params.widths()).enumerate() {
            let (m, v) = &moments[i];
            if g.len() != n * width || m.len() != g.len() || v.len() != g.len() {
                return Err(format!(
                    "{}: {} values (moments {} and {}) for {n} Gaussians of {width}",
                    GROUPS[i],
                    g.len(),
                    m.len(),
                    v.len()
                ));
            }
        }
        if [stats.grad.len(), stats.seen.len(), stats.max_radius.len()] != [n; 3] {
            return Err(format!("densification statistics for other than {n} Gaussians"));
        }
        self.params = params;
        self.moments = moments.into_iter().map(|(m, v)| Moments { m, v }).collect();
        self.stats = stats;
        self.step = step;
        Ok(())
    }

    /// Zeroes the gradients of the SH bands above the degree in use.
    fn mask_inactive_bands(&self, grads: &mut SceneGrads<f32>) {
        let active = 3 * (coefficients(self.active_degree(self.step)) - 1);
        let per = 3 * (coefficients(self.params.degree) - 1);
        if per == 0 {
            return;
        }
        for block in grads.sh_rest.chunks_mut(per) {
            block[active..].fill(0.0);
        }
    }

    fn adam(&mut self, grads: &SceneGrads<f32>) {
        const BETA1: f32 = 0.9;
        const BETA2: f32 = 0.999;
        const EPS: f32 = 1e-15;
        let lr = self.settings.lr;
        let t = (self.step as f32 / self.settings.steps.max(1) as f32).min(1.0);
        let means_lr = (lr.means.ln() * (1.0 - t) + lr.means_final.ln() * t).exp() * self.extent;
        let rates = [means_lr, lr.log_scales, lr.rotations, lr.opacity, lr.sh_dc, lr.sh_rest];
        let gs = grads.groups();
        let (c1, c2) = (1.0 - BETA1.powi(self.step as i32), 1.0 - BETA2.powi(self.step as i32));
        for (((group, m), g), rate) in self
            .params
            .groups_mut()
            .into_iter()
            .zip(&mut self.moments)
            .zip(gs)
            .zip(rates)
        {
            for i in 0..group.len() {
                m.m[i] = BETA1 * m.m[i] + (1.0 - BETA1) * g[i];
                m.v[i] = BETA2 * m.v[i] + (1.0 - BETA2) * g[i] * g[i];
                group[i] -= rate * (m.m[i] / c1) / ((m.v[i] / c2).sqrt() + EPS);
            }
        }
    }

    /// View `index` rendered by the current Gaussians, as PNG bytes.
    pub fn render_view(&self, index: usize) -> Result<Vec<u8>, String> {
        let v = &self.data.views[index];
        let image = render(&self.params.scene(), &v.camera, self.settings.background).image;
        let rgb = vramfit_splat::picture::to_rgb8(v.camera.width, v.camera.height, &image);
        vramfit_splat::picture::encode_png(&rgb).map_err(|e| e.to_string())
    }

    /// Mean PSNR over the held-out views (the training views when none is held out).
    pub fn held_out_psnr(&self) -> f64 {
        let views = if self.held_out.is_empty() {
            &self.train
        } else {
            &self.held_out
        };
        let scene = self.params.scene();
        let total: f64 = views
            .iter()
            .map(|&i| {
                let v = &self.data.views[i];
                psnr(&render(&scene, &v.camera, self.settings.background).image, &v.image)
            })
            .sum();
        total / views.len() as f64
    }
}
