//! The fit loop, generic over the backend: render → L1 + w·(1 − SSIM) →
//! backward → Adam per parameter group → error-guided addition → stall
//! schedule. All state lives in [`Fit`] and round-trips through a
//! checkpoint, so a resumed fit continues exactly where it stopped.

use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::backend::AutodiffBackend;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use vramfit::optim::{Adam, AdamConfig, AdamMoments};
use vramfit::profile::{Accounted, Category, NamedTensor};
use vramfit::run::ArrayFile;
use vramfit::step::StepObserver;
use vramfit_gauss::DeviceError;

use crate::SplatError;
use crate::config::FitConfig;
use crate::cpu::project::Frame;
use crate::gaussians::Gaussians;
use crate::init::{self, NewGaussians};
use crate::op::{FusedLoss, LossParts, RenderSpec, SplatBackend, SplatPrimitives, SplatTensors};
use crate::params::{Param, Params, values_per_gaussian};
use vramfit_gauss::picture::{CHANNELS, Picture};

/// PSNR gain (dB) that counts as progress for the stall schedule.
const PSNR_PROGRESS: f64 = 0.1;
/// SSIM gain that counts as progress for the stall schedule.
const SSIM_PROGRESS: f64 = 1e-3;
/// Learning-rate factor after the stall decay.
const DECAY: f64 = 0.1;

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Step number just completed (1-based).
    pub step: u64,
    /// Loss of the parameters entering the step.
    pub loss: f32,
    /// PSNR (dB) of the clamped render entering the step, when measured.
    pub psnr_db: Option<f64>,
    /// SSIM of the clamped render entering the step, when measured.
    pub ssim: Option<f64>,
    /// Gaussians after the step.
    pub gaussians: usize,
    /// Gaussians added by this step.
    pub added: usize,
    /// True when the stall schedule decayed the learning rates at this step.
    pub decayed: bool,
    /// The render entering the step, `[H, W, C]` on the host, when asked for.
    pub frame: Option<Vec<f32>>,
}

/// Schedule state that must survive a restart.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Schedule {
    additions_done: u64,
    lr_scale: f64,
    decayed: bool,
    stall: u64,
    best_psnr: f64,
    best_ssim: f64,
    stopped: bool,
}

/// A fit in progress on backend `B`.
pub struct Fit<B: AutodiffBackend + SplatBackend>
where
    B::InnerBackend: FusedLoss,
{
    config: FitConfig,
    spec: RenderSpec,
    target: <B::InnerBackend as FusedLoss>::Target,
    blurred_target: Vec<f32>,
    params: SplatTensors<B::InnerBackend>,
    moments: Params<AdamMoments<B::InnerBackend, 2>>,
    adam: Adam,
    step: u64,
    schedule: Schedule,
    device: B::Device,
    /// [`fingerprint`] of the image, kept in checkpoints.
    image_fingerprint: u64,
}

/// Parameter `p`'s host values as an `[N, width]` tensor.
fn tensor2<B: Backend>(p: Param, v: Vec<f32>, device: &B::Device) -> Tensor<B, 2> {
    let cols = p.width(CHANNELS);
    let rows = v.len() / cols;
    Tensor::from_data(TensorData::new(v, [rows, cols]), device)
}

fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32 just above")
}

impl<B: AutodiffBackend + SplatBackend> Fit<B>
where
    B::InnerBackend: FusedLoss,
{
    /// Starts a fit: validates the settings and places the initial Gaussians.
    pub fn new(picture: &Picture, config: &FitConfig, device: &B::Device) -> Result<Self, SplatError> {
        picture.check_fittable()?;
        config.validate(picture.pixels())?;
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let g = init::initial(picture, config.initial_count(), &mut rng);
        let params: SplatTensors<_> = g.map_param(|p, v| tensor2(p, v, device));
        let moments = params.as_ref().map(AdamMoments::zeros_like);
        Ok(Self {
            config: config.clone(),
            spec: RenderSpec {
                frame: Frame::new(picture.width, picture.height),
                top_k: config.top_k,
                channels: CHANNELS,
            },
            target: <B::InnerBackend as FusedLoss>::fused_target(picture, config.top_k, config.band_rows, device),
            blurred_target: init::blur(picture, init::blur_size(picture.width, picture.height)),
            image_fingerprint: fingerprint(picture),
            params,
            moments,
            adam: Adam::new(AdamConfig::default()),
            step: 0,
            schedule: Schedule {
                lr_scale: 1.0,
                best_psnr: f64::NEG_INFINITY,
                best_ssim: f64::NEG_INFINITY,
                ..Default::default()
            },
            device: device.clone(),
        })
    }

    /// The target as this backend holds it.
    pub fn target(&self) -> &<B::InnerBackend as FusedLoss>::Target {
        &self.target
    }

    /// Steps completed.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Gaussians present.
    pub fn len(&self) -> usize {
        self.params.theta.dims()[0]
    }

    /// True when no Gaussian is present (never, after a valid start).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the step budget is spent or the stall schedule stopped the fit.
    pub fn finished(&self) -> bool {
        self.schedule.stopped || self.step >= self.config.steps
    }

    /// True when the stall schedule stopped the fit early.
    pub fn stopped_early(&self) -> bool {
        self.schedule.stopped
    }

    fn all_present(&self) -> bool {
        self.len() >= self.config.gaussians
    }

    /// What the fit holds between steps: parameters, Adam moments (two per
    /// parameter) and the target; its workspace (the GPU engine's scratch).
    /// On the host the loss also keeps its SSIM planes between steps (14
    /// f32 per pixel, [`vramfit_gauss::ssim::SsimWorkspace`]): heap memory the
    /// counting allocator measures in the peak, not listed here.
    pub fn accounted(&self) -> Accounted {
        let parameters = (self.len() * values_per_gaussian(CHANNELS) * 4) as u64;
        Accounted {
            parameters,
            optimizer_state: 2 * parameters,
            inputs: <B::InnerBackend as FusedLoss>::fused_target_bytes(&self.target),
            workspace: <B::InnerBackend as FusedLoss>::fused_workspace_bytes(&self.target),
            ..Default::default()
        }
    }

    /// One optimiser step, reporting its phases to `observer`. `want_frame`
    /// also returns the render.
    pub fn step(&mut self, want_frame: bool, observer: &mut dyn StepObserver) -> Result<StepReport, SplatError> {
        let c = &self.config;
        let next = self.step + 1;
        let entering = self.primitives();
        // Render, loss and backward as one fused call: no autodiff graph keeps
        // image-sized tensors alive (on the GPU it runs band by band).
        // Quality is measured on the render entering the step: the host
        // measures the loss's own render; elsewhere it is rendered again below.
        let measure = next.is_multiple_of(c.log_every) || next.is_multiple_of(c.check_every) || next == c.steps;
        let (parts, grads, measured) =
            <B::InnerBackend as FusedLoss>::fused_step(entering.clone(), &self.target, c.ssim_weight, measure)
                .map_err(Self::device_error(next, "forward_backward"))?;
        let loss_value = parts.loss(c.ssim_weight) as f32;
        if !loss_value.is_finite() {
            return Err(SplatError::NonFinite {
                step: self.step + 1,
                value: loss_value,
            });
        }
        let held = self.accounted();
        observer.phase("forward_backward", None, &|| Accounted {
            gradients: held.parameters,
            ..held
        });
        let lrs = c.learning_rates().map(|lr| lr * self.schedule.lr_scale);
        self.adam.begin_step();
        let adam = &self.adam;
        let updated =
            self.params
                .clone()
                .zip(grads)
                .zip(self.moments.as_mut())
                .zip(lrs)
                .map(|(((param, grad), m), lr)| {
                    adam.update(param, Tensor::from_primitive(TensorPrimitive::Float(grad)), m, lr)
                });
        let before = std::mem::replace(&mut self.params, updated);
        if let Some(group) = self.non_finite_group() {
            return Err(SplatError::NonFiniteParameters {
                step: next,
                group: group.name(),
                lr: lrs[group],
            });
        }
        let held = self.accounted();
        observer.phase("optimizer", None, &|| held);
        self.step += 1;

        let step = self.step;
        let (mut psnr_db, mut ssim) = (None, None);
        if measure {
            let m = match measured {
                Some(m) => m,
                None => self.metrics_of(Self::primitives_of(&before), step)?,
            };
            psnr_db = Some(m.psnr_db());
            ssim = Some(m.ssim);
        }
        // The render entering the step, when a frame or an addition needs it.
        let adding = self.config.progressive
            && step.is_multiple_of(self.config.add_every)
            && step < self.config.steps
            && self.schedule.additions_done < self.config.add_rounds;
        let render = if want_frame || adding {
            Some(self.render_host_of(Self::primitives_of(&before), &self.spec.frame.clone(), step)?)
        } else {
            None
        };
        drop(before);
        let mut added = 0;
        // No addition on the last step (see `adding`): nothing would be left to fit them.
        if adding {
            added = self.add_gaussians(render.as_deref().expect("rendered for the addition"));
        }
        if measure || render.is_some() {
            let held = self.accounted();
            observer.phase("metrics", None, &|| held);
        }
        let mut decayed = false;
        if step.is_multiple_of(self.config.check_every) && self.all_present() && added == 0 {
            decayed = self.update_schedule(psnr_db.unwrap_or(f64::NEG_INFINITY), ssim.unwrap_or(f64::NEG_INFINITY));
        }
        Ok(StepReport {
            step,
            loss: loss_value,
            psnr_db,
            ssim,
            gaussians: self.len(),
            added,
            decayed,
            frame: if want_frame { render } else { None },
        })
    }

    /// The first parameter group holding a NaN, an infinity or a value whose
    /// square overflows f32 (the renderer squares the inverse scales: that
    /// overflow is where NaN comes from), if any; one small read-back.
    fn non_finite_group(&self) -> Option<Param> {
        let flags = self.params.clone().map(|p| (p.clone() * p).is_finite().all().float());
        let all_finite = host(Tensor::cat(flags.into_array().to_vec(), 0));
        all_finite.iter().position(|ok| *ok != 1.0).map(|i| Param::ALL[i])
    }

    fn primitives_of(params: &SplatTensors<B::InnerBackend>) -> SplatPrimitives<B::InnerBackend> {
        params.clone().map(|t| t.into_primitive().tensor())
    }

    fn primitives(&self) -> SplatPrimitives<B::InnerBackend> {
        Self::primitives_of(&self.params)
    }

    fn device_error(step: u64, phase: &'static str) -> impl FnOnce(DeviceError) -> SplatError {
        move |e| SplatError::Device {
            step,
            phase,
            message: e.to_string(),
        }
    }

    fn metrics_of(&self, params: SplatPrimitives<B::InnerBackend>, step: u64) -> Result<LossParts, SplatError> {
        <B::InnerBackend as FusedLoss>::fused_metrics(params, &self.target).map_err(Self::device_error(step, "metrics"))
    }

    fn render_host_of(
        &self,
        params: SplatPrimitives<B::InnerBackend>,
        frame: &Frame,
        step: u64,
    ) -> Result<Vec<f32>, SplatError> {
        <B::InnerBackend as FusedLoss>::fused_render_host(params, &self.target, frame)
            .map_err(Self::device_error(step, "render"))
    }

    /// Error-guided addition from the render entering this step.
    fn add_gaussians(&mut self, render: &[f32]) -> usize {
        let round = self.schedule.additions_done;
        self.schedule.additions_done += 1;
        let m = self.config.added_in_round(self.len());
        if m == 0 {
            return 0;
        }
        // One stream per round, so a resumed fit draws the same Gaussians.
        let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed ^ (0x5eed_0000 + round));
        let frame = &self.spec.frame;
        let new: NewGaussians =
            init::error_guided(&self.blurred_target, render, frame.width, frame.height, m, &mut rng);
        let d = &self.device;
        let add = new.map_param(|p, v| tensor2(p, v, d));
        self.params = self.params.clone().zip(add).map(|(p, a)| Tensor::cat(vec![p, a], 0));
        for mo in self.moments.as_mut().into_array() {
            mo.append_zero_rows(m);
        }
        m
    }

    /// Stall schedule; returns true when it decayed the learning rates.
    fn update_schedule(&mut self, psnr_db: f64, ssim: f64) -> bool {
        let s = &mut self.schedule;
        if psnr_db > s.best_psnr + PSNR_PROGRESS || ssim > s.best_ssim + SSIM_PROGRESS {
            s.best_psnr = s.best_psnr.max(psnr_db);
            s.best_ssim = s.best_ssim.max(ssim);
            s.stall = 0;
            return false;
        }
        s.stall += self.config.check_every;
        if s.stall < self.config.stall_limit {
            return false;
        }
        s.stall = 0;
        if s.decayed {
            s.stopped = true;
            false
        } else {
            s.decayed = true;
            s.lr_scale *= DECAY;
            true
        }
    }

    /// Every tensor the fit keeps between steps, largest first.
    pub fn tensors(&self) -> Vec<NamedTensor> {
        let target = <B::InnerBackend as FusedLoss>::fused_target_bytes(&self.target);
        let name = <B::InnerBackend as FusedLoss>::fused_target_name();
        let mut out = vec![NamedTensor::new(name, target, Category::Inputs)];
        for (p, t) in self.params.iter() {
            let bytes = (t.dims().iter().product::<usize>() * 4) as u64;
            out.push(NamedTensor::new(p.name(), bytes, Category::Parameters));
            out.push(NamedTensor::new(
                format!("adam_m_{}", p.name()),
                bytes,
                Category::OptimizerState,
            ));
            out.push(NamedTensor::new(
                format!("adam_v_{}", p.name()),
                bytes,
                Category::OptimizerState,
            ));
        }
        let workspace = <B::InnerBackend as FusedLoss>::fused_workspace_bytes(&self.target);
        if workspace > 0 {
            out.push(NamedTensor::new(
                "band scratch (largest held at once)",
                workspace,
                Category::Workspace,
            ));
        }
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
        out
    }

    /// The current Gaussians on the host.
    pub fn gaussians(&self) -> Gaussians {
        let f = &self.spec.frame;
        Gaussians {
            width: f.width,
            height: f.height,
            channels: CHANNELS,
            params: self.params.clone().map(host),
        }
    }

    /// Renders the current Gaussians and measures PSNR and SSIM of the
    /// clamped render: `(render [H, W, C], psnr_db, ssim)`.
    pub fn evaluate(&self) -> Result<(Vec<f32>, f64, f64), SplatError> {
        let mut render = self.render_host_of(self.primitives(), &self.spec.frame, self.step)?;
        render.iter_mut().for_each(|v| *v = v.clamp(0.0, 1.0));
        let m = self.metrics_of(self.primitives(), self.step)?;
        Ok((render, m.psnr_db(), m.ssim))
    }

    /// Every piece of state, as a checkpoint.
    pub fn checkpoint(&self) -> ArrayFile {
        let s = &self.schedule;
        let mut f = ArrayFile::new(
            "checkpoint",
            json!({
                "step": self.step, "adam_step": self.adam.step, "additions_done": s.additions_done,
                "lr_scale": s.lr_scale, "decayed": s.decayed, "stall": s.stall,
                "best_psnr": finite_or_null(s.best_psnr), "best_ssim": finite_or_null(s.best_ssim), "stopped": s.stopped,
                "width": self.spec.frame.width, "height": self.spec.frame.height,
                "image_fingerprint": format!("{:016x}", self.image_fingerprint),
            }),
        );
        for (p, t) in self.params.iter() {
            let dims = t.dims().to_vec();
            let m = &self.moments[p];
            f.insert(p.name(), dims.clone(), host(t.clone()));
            f.insert(&format!("adam_m_{}", p.name()), dims.clone(), host(m.m.clone()));
            f.insert(&format!("adam_v_{}", p.name()), dims, host(m.v.clone()));
        }
        f
    }

    /// Restores a fit from a checkpoint written by [`Fit::checkpoint`] for
    /// the same image and settings.
    pub fn resume(
        picture: &Picture,
        config: &FitConfig,
        ckpt: &ArrayFile,
        device: &B::Device,
    ) -> Result<Self, SplatError> {
        let mut fit = Self::new(picture, config, device)?;
        let invalid = |why: String| {
            SplatError::File(vramfit::run::ArrayFileError::Invalid {
                path: "checkpoint".into(),
                why,
            })
        };
        if ckpt.kind != "checkpoint" {
            return Err(invalid(format!("holds '{}', not a checkpoint", ckpt.kind)));
        }
        let m = &ckpt.meta;
        let u = |k: &str| {
            m.get(k)
                .and_then(|v| v.as_u64())
                .ok_or_else(|| invalid(format!("metadata lacks '{k}'")))
        };
        let fl = |k: &str| m.get(k).and_then(|v| v.as_f64());
        let b = |k: &str| m.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
        if (u("width")? as usize, u("height")? as usize) != (picture.width, picture.height) {
            return Err(invalid("it was written for an image of another size".into()));
        }
        // Checkpoints from before the fingerprint was kept have none.
        if let Some(then) = m.get("image_fingerprint").and_then(|v| v.as_str())
            && then != format!("{:016x}", fingerprint(picture))
        {
            return Err(invalid(
                "it was written for another image of the same size: the image's content changed since (put the \
                 original back to resume, or start a new run)"
                    .into(),
            ));
        }
        fit.step = u("step")?;
        fit.adam.step = u("adam_step")?;
        fit.schedule = Schedule {
            additions_done: u("additions_done")?,
            lr_scale: fl("lr_scale").unwrap_or(1.0),
            decayed: b("decayed"),
            stall: u("stall")?,
            best_psnr: fl("best_psnr").unwrap_or(f64::NEG_INFINITY),
            best_ssim: fl("best_ssim").unwrap_or(f64::NEG_INFINITY),
            stopped: b("stopped"),
        };
        // Every array a whole number of the same Gaussians: anything else
        // would fail in the first step's operations.
        let gaussians = ckpt
            .get(Param::Xy.name())
            .map_or(0, |v| v.len() / Param::Xy.width(CHANNELS));
        let get = |p: Param, n: &str| {
            let v = ckpt.get(n).ok_or_else(|| invalid(format!("array '{n}' is missing")))?;
            let cols = p.width(CHANNELS);
            if v.len() != gaussians * cols {
                return Err(invalid(format!(
                    "array '{n}' holds {} values, not {gaussians} Gaussians of {cols}",
                    v.len()
                )));
            }
            Ok(tensor2::<B::InnerBackend>(p, v.to_vec(), device))
        };
        fit.params = Params::try_from_fn(|p| get(p, p.name()))?;
        fit.moments = Params::try_from_fn(|p| {
            Ok::<_, SplatError>(AdamMoments {
                m: get(p, &format!("adam_m_{}", p.name()))?,
                v: get(p, &format!("adam_v_{}", p.name()))?,
            })
        })?;
        Ok(fit)
    }
}

fn finite_or_null(v: f64) -> serde_json::Value {
    if v.is_finite() {
        json!(v)
    } else {
        serde_json::Value::Null
    }
}

/// FNV-1a over a picture's values: tells a resume whether the image is the
/// one the run was fitting (its path alone does not).
pub fn fingerprint(picture: &Picture) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in &picture.data {
        for byte in v.to_bits().to_le_bytes() {
            h ^= byte as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
