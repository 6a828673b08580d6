//! Fitting a scene's Gaussians to its training views on the CPU twin, as
//! 3DGS trains them (without densification yet): one view a step, loss
//! `(1 − λ) L1 + λ (1 − SSIM)` with λ = 0.2, Adam with the reference
//! learning rates per parameter group (positions scaled by the scene's
//! extent and decayed exponentially over the run), the SH degree raised by
//! one every `sh_every` steps, Gaussians seeded from the sparse points.
//! The SH "rest" coefficients are held at the final degree from the start;
//! a band not yet active is zero and receives no update, which renders
//! exactly as the lower degree does.

use std::cell::{Cell, Ref, RefCell};

use vramfit_gauss::DeviceError;
use vramfit_gauss::ssim::{ssim, ssim_and_backward};

use crate::cpu::camera::Camera;
use crate::cpu::render::{SceneGrads, render, render_backward};
use crate::cpu::sh::coefficients;
use crate::dataset::{Dataset, DatasetError};
use crate::densify::{Densify, Report, Row, Stats, apply, apply_params, plan};
pub use crate::params::{GROUPS, INITIAL_OPACITY, Params};

/// Adam's constants (the 3DGS reference's ε), for the CPU twin and for
/// moments kept on the host; the device kernel
/// (`crate::gpu::kernels::train::adam`) writes the same arithmetic.
pub const ADAM: vramfit::optim::HostAdam = vramfit::optim::HostAdam {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-15,
};

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

/// A fit's state between steps, on the host: the parameters, Adam's first
/// and second moments (group by group in [`GROUPS`]' order) and what
/// densification reads.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// The parameters.
    pub params: Params,
    /// Adam's (m, v) per group.
    pub moments: Vec<(Vec<f32>, Vec<f32>)>,
    /// Densification's statistics since the last densification.
    pub stats: Stats,
}

impl State {
    /// `params` with Adam's moments at zero and fresh densification
    /// statistics: a fit's state before its first step.
    pub fn fresh(params: Params) -> Self {
        let n = params.len();
        Self {
            moments: params
                .groups()
                .iter()
                .map(|g| (vec![0.0; g.len()], vec![0.0; g.len()]))
                .collect(),
            stats: Stats::new(n),
            params,
        }
    }
}

/// Why a fit's call failed.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// The device running it.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A state that does not fit this fit (a checkpoint of another scene).
    #[error("{0}")]
    Mismatch(String),
    /// A view could not be encoded as a picture.
    #[error("the view does not encode as PNG: {0}")]
    Picture(String),
}

/// A device that holds a fit's state between steps and runs its steps (the
/// CubeCL renderer: `crate::gpu::device_fit`). The host copy in [`Fit`] is then
/// brought up to date only when something reads it.
pub trait SceneDevice {
    /// What the device is, for reports.
    fn name(&self) -> String;
    /// Replaces the device's state with `state`.
    fn load(&mut self, state: &State) -> Result<(), DeviceError>;
    /// Copies the device's state into `state`.
    fn store(&self, state: &mut State) -> Result<(), DeviceError>;
    /// The image of the current Gaussians through `camera`.
    fn render(&self, camera: &Camera, background: [f32; 3]) -> Result<Vec<f32>, DeviceError>;
    /// Renders one view, computes the loss against `target` and keeps every
    /// parameter's gradient; adds densification's statistics when `stats`.
    /// Returns the loss.
    fn forward_backward(
        &mut self,
        camera: &Camera,
        background: [f32; 3],
        target: &[f32],
        stats: bool,
    ) -> Result<f32, DeviceError>;
    /// One Adam step on every group with the kept gradients (`rates` per
    /// group, bias corrections `c1`, `c2`; SH rest values at or past
    /// `active_rest` of each Gaussian's take no gradient).
    fn optimize(&mut self, rates: [f32; 6], c1: f32, c2: f32, active_rest: usize) -> Result<(), DeviceError>;
    /// Device bytes held now by each category: parameters, gradients,
    /// optimizer state, workspace (the render's buffers).
    fn held_bytes(&self) -> [u64; 4];
    /// Host bytes of optimizer state kept for the device (its moments when
    /// they live on the host), and the bytes the last step copied between
    /// host and device.
    fn host_bytes(&self) -> [u64; 2] {
        [0, 0]
    }
    /// With the moments on the host: the last step's milliseconds in the
    /// copies between host and device (each timed on its own, after the
    /// device's queued work) and in the host's Adam; `None` otherwise.
    fn host_times(&self) -> Option<[f64; 2]> {
        None
    }
    /// Returns the allocator's unused pools to the device (after the queued
    /// work is done): the time the cleanup itself took (not the wait).
    fn cleanup(&self) -> Result<std::time::Duration, DeviceError> {
        Ok(std::time::Duration::ZERO)
    }
}

/// The loss `(1 − λ) L1 + λ (1 − SSIM)` of `image` against `target`
/// (`[H, W, 3]`) and its gradient with respect to `image`.
pub fn loss_and_gradient(image: &[f32], target: &[f32], width: usize, height: usize) -> (f32, Vec<f32>) {
    let n = image.len() as f32;
    let (ssim, d_ssim) = ssim_and_backward(image, target, height, width, 3, -LAMBDA_SSIM);
    let l1: f32 = image.iter().zip(target).map(|(x, y)| (x - y).abs()).sum::<f32>() / n;
    let d_image = image
        .iter()
        .zip(target)
        .zip(&d_ssim)
        .map(|((x, y), s)| (1.0 - LAMBDA_SSIM) * sign(x - y) / n + s)
        .collect();
    ((1.0 - LAMBDA_SSIM) * l1 + LAMBDA_SSIM * (1.0 - ssim), d_image)
}

/// −1, 0 or 1: L1's gradient is 0 where the render equals the target (as
/// PyTorch's and the device kernel's are; `f32::signum` gives ±1 at ±0,
/// which an 8-bit target met exactly by a background pixel exposed).
fn sign(d: f32) -> f32 {
    if d > 0.0 {
        1.0
    } else if d < 0.0 {
        -1.0
    } else {
        0.0
    }
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

/// A fit in progress: the dataset, the state (on the host, or on a device
/// with a host copy kept up to date on demand) and the step.
pub struct Fit {
    data: Dataset,
    settings: Settings,
    train: Vec<usize>,
    held_out: Vec<usize>,
    extent: f32,
    state: RefCell<State>,
    device: Option<Box<dyn SceneDevice>>,
    /// The host copy is behind the device's state.
    stale: Cell<bool>,
    /// The CPU path's gradients between the two halves of a step.
    grads: Option<SceneGrads<f32>>,
    gaussians: usize,
    /// Steps done.
    pub step: u64,
    /// The loss of the last step.
    pub last_loss: f32,
    /// What densification has done over the fit (this session).
    pub densified: Report,
}

/// PSNR of `x` against `y` (values in [0, 1]).
pub fn psnr(x: &[f32], y: &[f32]) -> f64 {
    let mse = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / x.len().max(1) as f64;
    10.0 * (1.0 / mse.max(1e-12)).log10()
}

impl Fit {
    /// A fit of `data` seeded from its sparse points, on the CPU.
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
        Ok(Self {
            extent,
            data,
            settings,
            train,
            held_out,
            state: RefCell::new(State::fresh(params)),
            device: None,
            stale: Cell::new(false),
            grads: None,
            gaussians: n,
            step: 0,
            last_loss: f32::NAN,
            densified: Report::default(),
        })
    }

    /// True when some Gaussian's centre is inside some training view (a
    /// fit where none is sees nothing to fit: every camera looks away).
    pub fn any_visible(&self) -> bool {
        let state = self.state.borrow();
        let means = &state.params.means;
        self.train.iter().any(|&i| {
            let camera = &self.data.views[i].camera;
            means
                .chunks_exact(3)
                .any(|m| camera.sees([m[0] as f64, m[1] as f64, m[2] as f64]))
        })
    }

    /// Moves the fit's state to `device`, which runs its steps from now on.
    pub fn on_device(mut self, mut device: Box<dyn SceneDevice>) -> Result<Self, FitError> {
        self.sync()?;
        device.load(&self.state.borrow())?;
        self.device = Some(device);
        Ok(self)
    }

    /// The device running the steps (`None`: the CPU twin).
    pub fn device_name(&self) -> Option<String> {
        self.device.as_ref().map(|d| d.name())
    }

    /// Device bytes by category (parameters, gradients, optimizer state,
    /// workspace) when a device runs the fit.
    pub fn device_bytes(&self) -> Option<[u64; 4]> {
        self.device.as_ref().map(|d| d.held_bytes())
    }

    /// Host bytes of the device's optimizer state and the bytes its last
    /// step moved ([`SceneDevice::host_bytes`]; zeros on the CPU twin).
    pub fn host_bytes(&self) -> [u64; 2] {
        self.device.as_ref().map_or([0, 0], |d| d.host_bytes())
    }

    /// The last step's copy and host-Adam milliseconds
    /// ([`SceneDevice::host_times`]).
    pub fn host_times(&self) -> Option<[f64; 2]> {
        self.device.as_ref().and_then(|d| d.host_times())
    }

    /// Returns the device allocator's unused pools ([`SceneDevice::cleanup`]):
    /// the time it took, or `None` on the CPU twin.
    pub fn cleanup_device(&self) -> Result<Option<std::time::Duration>, FitError> {
        Ok(self.device.as_ref().map(|d| d.cleanup()).transpose()?)
    }

    /// Brings the host copy up to date with the device.
    fn sync(&self) -> Result<(), FitError> {
        if self.stale.get()
            && let Some(d) = &self.device
        {
            d.store(&mut self.state.borrow_mut())?;
            self.stale.set(false);
        }
        Ok(())
    }

    /// The state (read from the device first when one runs the fit).
    pub fn state(&self) -> Result<Ref<'_, State>, FitError> {
        self.sync()?;
        Ok(self.state.borrow())
    }

    /// The parameters (read from the device first when one runs the fit).
    pub fn params(&self) -> Result<Ref<'_, Params>, FitError> {
        Ok(Ref::map(self.state()?, |s| &s.params))
    }

    /// Gaussians now.
    pub fn len(&self) -> usize {
        self.gaussians
    }

    /// True when no Gaussian is left.
    pub fn is_empty(&self) -> bool {
        self.gaussians == 0
    }

    /// The SH degree in use at step `step` (1-based).
    pub fn active_degree(&self, step: u64) -> usize {
        let raised = (step.saturating_sub(1) / self.settings.sh_every.max(1)) as usize;
        raised.min(self.settings.sh_degree)
    }

    /// One step on the next training view; returns the loss.
    pub fn step(&mut self) -> Result<f32, FitError> {
        self.forward_backward()?;
        self.optimize()?;
        Ok(self.last_loss)
    }

    /// The first half of a step: render the next training view, the loss
    /// and every parameter's gradient, kept for [`Fit::optimize`] (the
    /// step counter advances).
    pub fn forward_backward(&mut self) -> Result<(), FitError> {
        self.step += 1;
        let view = &self.data.views[self.train[(self.step as usize - 1) % self.train.len()]];
        let camera = &view.camera;
        let background = self.settings.background;
        let stats = self.step < self.settings.densify.until;
        if let Some(device) = &mut self.device {
            self.last_loss = device.forward_backward(camera, background, &view.image, stats)?;
            self.stale.set(true);
            return Ok(());
        }
        let state = &mut *self.state.borrow_mut();
        let scene = state.params.scene();
        let rendered = render(&scene, camera, background);
        let (loss, d_image) = loss_and_gradient(&rendered.image, &view.image, camera.width, camera.height);
        let mut grads = render_backward(&scene, camera, background, &rendered, &d_image);
        if stats {
            for (i, p) in rendered.projected.iter().enumerate() {
                if let Some(p) = p {
                    let g = [grads.screen_means[2 * i], grads.screen_means[2 * i + 1]];
                    state.stats.add(i, g, p.radius as f32, camera.width, camera.height);
                }
            }
        }
        mask_inactive_bands(&mut grads.sh_rest, self.rest_active(), state.params.widths()[5]);
        self.grads = Some(grads);
        self.last_loss = loss;
        Ok(())
    }

    /// SH rest values of a Gaussian in use at the current step.
    fn rest_active(&self) -> usize {
        3 * (coefficients(self.active_degree(self.step)) - 1)
    }

    /// The second half: Adam on every group, then densification and the
    /// opacity reset when their step has come.
    pub fn optimize(&mut self) -> Result<(), FitError> {
        const BETA1: f32 = ADAM.beta1;
        const BETA2: f32 = ADAM.beta2;
        let lr = self.settings.lr;
        let t = (self.step as f32 / self.settings.steps.max(1) as f32).min(1.0);
        let means_lr = (lr.means.ln() * (1.0 - t) + lr.means_final.ln() * t).exp() * self.extent;
        let rates = [means_lr, lr.log_scales, lr.rotations, lr.opacity, lr.sh_dc, lr.sh_rest];
        let (c1, c2) = (1.0 - BETA1.powi(self.step as i32), 1.0 - BETA2.powi(self.step as i32));
        let active = self.rest_active();
        if let Some(device) = &mut self.device {
            device.optimize(rates, c1, c2, active)?;
        } else {
            let grads = self
                .grads
                .take()
                .ok_or(DeviceError::OutOfOrder("optimize before forward_backward"))?;
            adam(&mut self.state.borrow_mut(), &grads, rates, c1, c2);
        }
        let (d, step) = (self.settings.densify, self.step);
        let densify = step >= d.from && step < d.until && d.every > 0 && step.is_multiple_of(d.every);
        let reset = d.reset_every > 0 && step < d.until && step.is_multiple_of(d.reset_every);
        if densify || reset {
            self.sync()?;
            if densify {
                self.densify(step > d.reset_every && d.reset_every > 0);
            }
            if reset {
                reset_opacity(&mut self.state.borrow_mut());
            }
            if let Some(device) = &mut self.device {
                device.load(&self.state.borrow())?;
            }
        }
        Ok(())
    }

    /// Grows and prunes the Gaussians ([`crate::densify`]) on the host
    /// copy; the moments of new ones start at zero, the statistics start
    /// over.
    fn densify(&mut self, prune_large: bool) {
        let state = &mut *self.state.borrow_mut();
        let (rows, report) = plan(
            &state.params,
            &state.stats,
            &self.settings.densify,
            self.extent,
            prune_large,
        );
        state.params = apply_params(&state.params, &rows, self.step);
        let widths = state.params.widths();
        for ((m, v), width) in state.moments.iter_mut().zip(widths) {
            let fresh = |_: &[f32], _: usize, _: u8| Vec::new();
            *m = apply(m, width, &rows, true, fresh);
            *v = apply(v, width, &rows, true, fresh);
        }
        state.stats = Stats::new(rows.len());
        self.gaussians = rows.len();
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

    /// The dataset.
    pub fn data(&self) -> &Dataset {
        &self.data
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Restores the state and the step of a checkpoint (the number of
    /// Gaussians may differ from the seeded fit's); an error names a group
    /// whose length does not fit the others.
    pub fn restore(&mut self, state: State, step: u64) -> Result<(), FitError> {
        let n = state.params.len();
        for (i, (g, width)) in state.params.groups().iter().zip(state.params.widths()).enumerate() {
            let (m, v) = &state.moments[i];
            if g.len() != n * width || m.len() != g.len() || v.len() != g.len() {
                return Err(FitError::Mismatch(format!(
                    "{}: {} values (moments {} and {}) for {n} Gaussians of {width}",
                    GROUPS[i],
                    g.len(),
                    m.len(),
                    v.len()
                )));
            }
        }
        let s = &state.stats;
        if [s.grad.len(), s.seen.len(), s.max_radius.len()] != [n; 3] {
            return Err(FitError::Mismatch(format!(
                "densification statistics for other than {n} Gaussians"
            )));
        }
        if let Some(device) = &mut self.device {
            device.load(&state)?;
        }
        *self.state.borrow_mut() = state;
        self.stale.set(false);
        self.gaussians = n;
        self.step = step;
        Ok(())
    }

    /// The image of view `index` by the current Gaussians (`[H, W, 3]`).
    pub fn render_image(&self, index: usize) -> Result<Vec<f32>, FitError> {
        let v = &self.data.views[index];
        match &self.device {
            Some(d) => Ok(d.render(&v.camera, self.settings.background)?),
            None => Ok(render(&self.state.borrow().params.scene(), &v.camera, self.settings.background).image),
        }
    }

    /// View `index` rendered by the current Gaussians, as PNG bytes.
    pub fn render_view(&self, index: usize) -> Result<Vec<u8>, FitError> {
        let v = &self.data.views[index];
        let image = self.render_image(index)?;
        let rgb = vramfit_gauss::picture::to_rgb8(v.camera.width, v.camera.height, &image);
        vramfit_gauss::picture::encode_png(&rgb).map_err(|e| FitError::Picture(e.to_string()))
    }

    /// The views evaluated: the held-out ones (the training views when none is held out).
    fn evaluated(&self) -> &[usize] {
        if self.held_out.is_empty() {
            &self.train
        } else {
            &self.held_out
        }
    }

    /// Mean PSNR over the held-out views (the training views when none is held out).
    pub fn held_out_psnr(&self) -> Result<f64, FitError> {
        let views = self.evaluated();
        let mut total = 0.0;
        for &i in views {
            total += psnr(&self.render_image(i)?, &self.data.views[i].image);
        }
        Ok(total / views.len() as f64)
    }

    /// Mean SSIM (11×11 Gaussian window, as the 3DGS papers report it) over
    /// the same views, the render clamped to [0, 1] as an image file holds it.
    pub fn held_out_ssim(&self) -> Result<f64, FitError> {
        let views = self.evaluated();
        let mut total = 0.0;
        for &i in views {
            let v = &self.data.views[i];
            let image: Vec<f32> = self.render_image(i)?.iter().map(|x| x.clamp(0.0, 1.0)).collect();
            total += ssim(&image, &v.image, v.camera.height, v.camera.width, 3) as f64;
        }
        Ok(total / views.len() as f64)
    }
}

/// Zeroes the gradients of the SH bands above those in use: `active` of
/// each Gaussian's `per` rest values.
pub(crate) fn mask_inactive_bands(sh_rest: &mut [f32], active: usize, per: usize) {
    if per == 0 {
        return;
    }
    for block in sh_rest.chunks_mut(per) {
        block[active..].fill(0.0);
    }
}

/// One Adam step of every group on the host.
fn adam(state: &mut State, grads: &SceneGrads<f32>, rates: [f32; 6], c1: f32, c2: f32) {
    for (((group, (m, v)), g), rate) in state
        .params
        .groups_mut()
        .into_iter()
        .zip(&mut state.moments)
        .zip(grads.groups())
        .zip(rates)
    {
        ADAM.step(group, g, m, v, rate, c1, c2);
    }
}

/// Opacities lowered to 0.01 (the larger ones), their moments cleared.
fn reset_opacity(state: &mut State) {
    let ceiling = (0.01f32 / 0.99).ln();
    for v in &mut state.params.opacity_logits {
        *v = v.min(ceiling);
    }
    let (m, v) = &mut state.moments[3];
    m.fill(0.0);
    v.fill(0.0);
}
