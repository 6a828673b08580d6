//! The renderer and SSIM as Burn operations: a backend extension
//! ([`SplatBackend`]) whose default methods run the CPU twins on host
//! copies, plus an autodiff implementation that wires their backward into
//! Burn's graph. A GPU backend overrides the methods with its kernels; the
//! fit loop, generic over the backend, does not change.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::FloatTensor;

use std::sync::Mutex;

use rayon::prelude::*;

use crate::cpu;
use crate::cpu::project::Frame;
use crate::cpu::render::{SplatGrads, Splats};
use crate::params::{HostParams, Params};
use vramfit_gauss::DeviceError;
use vramfit_gauss::picture::{CHANNELS, Picture};

/// What to render: frame, top-K and channel count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RenderSpec {
    /// Output size and zoom.
    pub frame: Frame,
    /// Gaussians blended per pixel.
    pub top_k: usize,
    /// Colour channels C.
    pub channels: usize,
}

/// Reads a float tensor of rank `D` back to the host as f32.
pub fn to_host<B: Backend, const D: usize>(t: FloatTensor<B>) -> Vec<f32> {
    Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32 just above")
}

fn from_host<B: Backend, const D: usize>(v: Vec<f32>, dims: [usize; D], device: &B::Device) -> FloatTensor<B> {
    Tensor::<B, D>::from_data(TensorData::new(v, dims), device)
        .into_primitive()
        .tensor()
}

fn device_of<B: Backend>(t: &FloatTensor<B>) -> B::Device {
    B::float_device(t)
}

/// Host copies of the parameter tensors.
fn read_host<B: Backend>(params: SplatPrimitives<B>) -> HostParams {
    params.map(to_host::<B, 2>)
}

/// Host gradients as `[N, width]` tensors on `device`.
fn grads_to_device<B: Backend>(g: SplatGrads<f32>, channels: usize, device: &B::Device) -> SplatPrimitives<B> {
    let n = g.count();
    g.map_param(|p, v| from_host::<B, 2>(v, [n, p.width(channels)], device))
}

/// The parameter tensors as primitives, `[N, width]` each (theta `[N, 1]`).
pub type SplatPrimitives<B> = Params<FloatTensor<B>>;

/// Backend extension with the splat operations (and, for the profiler,
/// the backend's memory figures).
pub trait SplatBackend: vramfit::profile::DeviceMemory {
    /// Renders `[H, W, C]`.
    fn splat_render(params: SplatPrimitives<Self>, spec: &RenderSpec) -> FloatTensor<Self> {
        let device = device_of::<Self>(&params.xy);
        let host = read_host::<Self>(params);
        let out = cpu::render::render(&Splats::new(&host, spec.channels), &spec.frame, spec.top_k);
        from_host::<Self, 3>(out, [spec.frame.height, spec.frame.width, spec.channels], &device)
    }

    /// Gradients of `Σ d_out · render` for the four parameter tensors.
    fn splat_render_backward(
        params: SplatPrimitives<Self>,
        d_out: FloatTensor<Self>,
        spec: &RenderSpec,
    ) -> SplatPrimitives<Self> {
        let device = device_of::<Self>(&params.xy);
        let host = read_host::<Self>(params);
        let d_out = to_host::<Self, 3>(d_out);
        let splats = Splats::new(&host, spec.channels);
        let g = cpu::render::render_backward(&splats, &spec.frame, spec.top_k, &d_out);
        grads_to_device::<Self>(g, spec.channels, &device)
    }

    /// Mean SSIM of `x` against `y` (both `[H, W, C]`), as a `[1]` tensor.
    fn splat_ssim(x: FloatTensor<Self>, y: FloatTensor<Self>, dims: [usize; 3]) -> FloatTensor<Self> {
        let device = device_of::<Self>(&x);
        let (x, y) = (to_host::<Self, 3>(x), to_host::<Self, 3>(y));
        let [h, w, c] = dims;
        from_host::<Self, 1>(vec![vramfit_gauss::ssim::ssim(&x, &y, h, w, c)], [1], &device)
    }

    /// Gradient of `d_ssim · ssim(x, y)` with respect to `x`.
    fn splat_ssim_backward(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        d_ssim: FloatTensor<Self>,
        dims: [usize; 3],
    ) -> FloatTensor<Self> {
        let device = device_of::<Self>(&x);
        let d = to_host::<Self, 1>(d_ssim)[0];
        let (x, y) = (to_host::<Self, 3>(x), to_host::<Self, 3>(y));
        let [h, w, c] = dims;
        from_host::<Self, 3>(vramfit_gauss::ssim::ssim_backward(&x, &y, h, w, c, d), dims, &device)
    }
}

impl SplatBackend for burn::backend::Flex {}

#[cfg(feature = "cuda")]
impl SplatBackend for burn::backend::Cuda {}

/// Means over all pixels and channels of one render against the target.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LossParts {
    /// Mean |render − target|.
    pub l1: f64,
    /// Mean SSIM.
    pub ssim: f64,
    /// Mean squared error.
    pub mse: f64,
}

impl LossParts {
    /// The fit's loss `L1 + w·(1 − SSIM)`.
    pub fn loss(&self, ssim_weight: f64) -> f64 {
        self.l1 + ssim_weight * (1.0 - self.ssim)
    }

    /// PSNR in dB for values in `[0, 1]`.
    pub fn psnr_db(&self) -> f64 {
        if self.mse > 0.0 {
            -10.0 * self.mse.log10()
        } else {
            f64::INFINITY
        }
    }
}

/// The fit's step as one fused operation: loss and parameter gradients
/// without an autodiff graph, so that nothing image-sized has to outlive
/// the call. The host version composes the CPU twins; the GPU version
/// ([`crate::gpu`]) runs band by band on a u8 target.
pub trait FusedLoss: SplatBackend {
    /// The fitted image, held the way this backend reads it.
    type Target: Send;

    /// Places the target (`band_rows` 0: automatic; the host ignores it).
    fn fused_target(picture: &Picture, top_k: usize, band_rows: usize, device: &Self::Device) -> Self::Target;

    /// Bytes the target takes on the device.
    fn fused_target_bytes(target: &Self::Target) -> u64;

    /// What the target's bytes hold, for the memory report.
    fn fused_target_name() -> &'static str {
        "target image"
    }

    /// The band heights (`band_rows`) worth probing for an image of this
    /// size, ascending; `[0]` (automatic) where the backend does not render
    /// in bands, so that its memory has no band knob.
    fn fused_band_rungs(_width: usize, _height: usize) -> Vec<usize> {
        vec![0]
    }

    /// The most scratch the loss has held at once so far, in device bytes
    /// (the workspace it declares; 0 where its scratch is ordinary heap
    /// memory that the counting allocator measures).
    fn fused_workspace_bytes(_target: &Self::Target) -> u64 {
        0
    }

    /// Rows per band of the banded loss (0 where there are no bands: the
    /// host computes the whole image at once).
    fn fused_band_rows_used(_target: &Self::Target) -> usize {
        0
    }

    /// Loss parts of the unclamped render and the gradients of
    /// `L1 + ssim_weight·(1 − SSIM)` for the four parameter tensors.
    fn fused_loss_and_grads(
        params: SplatPrimitives<Self>,
        target: &Self::Target,
        ssim_weight: f64,
    ) -> Result<(LossParts, SplatPrimitives<Self>), DeviceError>;

    /// [`FusedLoss::fused_loss_and_grads`], and, where `measure` and the
    /// backend can at no extra render, [`FusedLoss::fused_metrics`] of the
    /// same parameters (`None`: the caller measures them apart). The host
    /// measures the render the loss made; the GPU path renders band by band
    /// and leaves it to the caller.
    #[allow(clippy::type_complexity)]
    fn fused_step(
        params: SplatPrimitives<Self>,
        target: &Self::Target,
        ssim_weight: f64,
        _measure: bool,
    ) -> Result<(LossParts, SplatPrimitives<Self>, Option<LossParts>), DeviceError> {
        let (parts, grads) = Self::fused_loss_and_grads(params, target, ssim_weight)?;
        Ok((parts, grads, None))
    }

    /// Loss parts of the clamped render (the reported quality).
    fn fused_metrics(params: SplatPrimitives<Self>, target: &Self::Target) -> Result<LossParts, DeviceError>;

    /// The render of `frame` on the host, `[H, W, C]`, unclamped.
    fn fused_render_host(
        params: SplatPrimitives<Self>,
        target: &Self::Target,
        frame: &Frame,
    ) -> Result<Vec<f32>, DeviceError>;
}

/// Clamps a render to `[0, 1]`: the image a user sees, whose quality is reported.
fn clamp(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = v.clamp(0.0, 1.0);
    }
}

/// Values per parallel task in the loss's elementwise passes.
const SUM_CHUNK: usize = 1 << 16;

/// The target on the host, as f32 in `[0, 1]`, with its side of SSIM.
#[derive(Debug)]
pub struct HostTarget {
    data: Vec<f32>,
    reference: vramfit_gauss::ssim::SsimReference<f32>,
    width: usize,
    height: usize,
    top_k: usize,
    /// The step's SSIM planes, kept from step to step.
    ssim_workspace: Mutex<vramfit_gauss::ssim::SsimWorkspace<f32>>,
}

impl Clone for HostTarget {
    fn clone(&self) -> Self {
        Self {
            data: self.data.clone(),
            reference: self.reference.clone(),
            width: self.width,
            height: self.height,
            top_k: self.top_k,
            ssim_workspace: Mutex::default(),
        }
    }
}

impl HostTarget {
    /// A target of `[H, W, C]` values in `[0, 1]`, rendered with `top_k`.
    pub fn new(data: Vec<f32>, width: usize, height: usize, top_k: usize) -> Self {
        assert_eq!(data.len(), width * height * CHANNELS, "target must be [H, W, C]");
        Self {
            reference: vramfit_gauss::ssim::SsimReference::new(&data, height, width, CHANNELS),
            data,
            width,
            height,
            top_k,
            ssim_workspace: Mutex::default(),
        }
    }

    /// Loss parts of the unclamped render and the gradients of
    /// `L1 + ssim_weight·(1 − SSIM)`, with the CPU twins.
    pub fn loss_and_grads(&self, splats: &Splats<f32>, ssim_weight: f64) -> (LossParts, SplatGrads<f32>) {
        let (parts, grads, _) = self.loss_grads_and_metrics(splats, ssim_weight, false);
        (parts, grads)
    }

    /// [`HostTarget::loss_and_grads`], and with `measure` the loss parts of
    /// the clamped render too (the reported quality, as
    /// [`FusedLoss::fused_metrics`] gives them), from the same render.
    pub fn loss_grads_and_metrics(
        &self,
        splats: &Splats<f32>,
        ssim_weight: f64,
        measure: bool,
    ) -> (LossParts, SplatGrads<f32>, Option<LossParts>) {
        let (w, h) = (self.width, self.height);
        let frame = Frame::new(w, h);
        // The forward's selection is kept for the backward (8·K bytes per pixel):
        // selecting again would double the step's main cost.
        let (mut x, kept) = cpu::render::render_keeping(splats, &frame, self.top_k);
        // Scratch only: a panic that poisoned it left nothing to keep.
        let mut workspace = self
            .ssim_workspace
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let ssim = vramfit_gauss::ssim::ssim_and_backward_into(
            &x,
            &self.data,
            &self.reference,
            -(ssim_weight as f32),
            &mut workspace,
        );
        let parts = self.parts_with(&x, ssim as f64);
        // d|x − y|/dx = sign(x − y), 0 at equality; the mean divides by the count.
        let l1_scale = 1.0 / x.len() as f32;
        workspace
            .gradient_mut()
            .par_chunks_mut(SUM_CHUNK)
            .zip(x.par_chunks(SUM_CHUNK))
            .zip(self.data.par_chunks(SUM_CHUNK))
            .for_each(|((d, x), y)| {
                for ((di, a), b) in d.iter_mut().zip(x).zip(y) {
                    let diff = *a - *b;
                    if diff != 0.0 {
                        *di += l1_scale * diff.signum();
                    }
                }
            });
        // The render is done with: measured in place, in the workspace's
        // statistics planes, so the step's peak does not grow.
        let metrics = measure.then(|| {
            clamp(&mut x);
            let ssim = vramfit_gauss::ssim::ssim_against_in(&x, &self.data, &self.reference, &mut workspace);
            self.parts_with(&x, ssim as f64)
        });
        drop(x);
        let grads = cpu::render::render_backward_kept(splats, &frame, &kept, workspace.gradient_mut());
        (parts, grads, metrics)
    }

    fn render(&self, params: &HostParams, frame: &Frame) -> Vec<f32> {
        cpu::render::render(&Splats::new(params, CHANNELS), frame, self.top_k)
    }

    /// Loss parts of render `x` (clamp it first for the reported quality).
    pub fn parts(&self, x: &[f32]) -> LossParts {
        self.parts_with(
            x,
            vramfit_gauss::ssim::ssim_against(x, &self.data, &self.reference) as f64,
        )
    }

    /// Loss parts of render `x` whose SSIM is known.
    fn parts_with(&self, x: &[f32], ssim: f64) -> LossParts {
        // Summed per fixed chunk in parallel, then the chunks in order: the
        // same sums whatever the thread count.
        let partials: Vec<(f64, f64)> = x
            .par_chunks(SUM_CHUNK)
            .zip(self.data.par_chunks(SUM_CHUNK))
            .map(|(x, y)| {
                let (mut l1, mut se) = (0.0f64, 0.0f64);
                for (a, b) in x.iter().zip(y) {
                    let d = (*a - *b) as f64;
                    l1 += d.abs();
                    se += d * d;
                }
                (l1, se)
            })
            .collect();
        let (l1, se) = partials.iter().fold((0.0, 0.0), |(l, s), p| (l + p.0, s + p.1));
        let values = x.len() as f64;
        LossParts {
            l1: l1 / values,
            ssim,
            mse: se / values,
        }
    }
}

impl FusedLoss for burn::backend::Flex {
    type Target = HostTarget;

    fn fused_target(picture: &Picture, top_k: usize, _band_rows: usize, _device: &Self::Device) -> HostTarget {
        HostTarget::new(picture.data.clone(), picture.width, picture.height, top_k)
    }

    fn fused_target_bytes(target: &HostTarget) -> u64 {
        (target.data.len() * 4) as u64 + target.reference.bytes()
    }

    fn fused_target_name() -> &'static str {
        "target image and its SSIM statistics"
    }

    fn fused_loss_and_grads(
        params: SplatPrimitives<Self>,
        target: &HostTarget,
        ssim_weight: f64,
    ) -> Result<(LossParts, SplatPrimitives<Self>), DeviceError> {
        let device = device_of::<Self>(&params.xy);
        let host = read_host::<Self>(params);
        let (parts, g) = target.loss_and_grads(&Splats::new(&host, CHANNELS), ssim_weight);
        Ok((parts, grads_to_device::<Self>(g, CHANNELS, &device)))
    }

    fn fused_step(
        params: SplatPrimitives<Self>,
        target: &HostTarget,
        ssim_weight: f64,
        measure: bool,
    ) -> Result<(LossParts, SplatPrimitives<Self>, Option<LossParts>), DeviceError> {
        let device = device_of::<Self>(&params.xy);
        let host = read_host::<Self>(params);
        let (parts, g, metrics) = target.loss_grads_and_metrics(&Splats::new(&host, CHANNELS), ssim_weight, measure);
        Ok((parts, grads_to_device::<Self>(g, CHANNELS, &device), metrics))
    }

    fn fused_metrics(params: SplatPrimitives<Self>, target: &HostTarget) -> Result<LossParts, DeviceError> {
        let host = read_host::<Self>(params);
        let mut x = target.render(&host, &Frame::new(target.width, target.height));
        clamp(&mut x);
        Ok(target.parts(&x))
    }

    fn fused_render_host(
        params: SplatPrimitives<Self>,
        target: &HostTarget,
        frame: &Frame,
    ) -> Result<Vec<f32>, DeviceError> {
        Ok(target.render(&read_host::<Self>(params), frame))
    }
}

impl<B: SplatBackend, C: CheckpointStrategy> SplatBackend for Autodiff<B, C> {
    fn splat_render(params: SplatPrimitives<Self>, spec: &RenderSpec) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct RenderBackward;

        impl<B: SplatBackend> Backward<B, 4> for RenderBackward {
            type State = (SplatPrimitives<B>, RenderSpec);

            fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
                let d_out = grads.consume::<B>(&ops.node);
                let (params, spec) = ops.state;
                let d_params = B::splat_render_backward(params, d_out, &spec);
                for (parent, d) in ops.parents.into_iter().zip(d_params.into_array()) {
                    if let Some(node) = parent {
                        grads.register::<B>(node.id, d);
                    }
                }
            }
        }

        let nodes = params.as_ref().map(|p| p.node.clone()).into_array();
        let inner = params.map(|p| p.primitive);
        match RenderBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::splat_render(inner.clone(), spec);
                prep.finish((inner, *spec), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::splat_render(inner, spec)),
        }
    }

    fn splat_ssim(x: FloatTensor<Self>, y: FloatTensor<Self>, dims: [usize; 3]) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct SsimBackward;

        impl<B: SplatBackend> Backward<B, 2> for SsimBackward {
            type State = (FloatTensor<B>, FloatTensor<B>, [usize; 3]);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let d = grads.consume::<B>(&ops.node);
                let (x, y, dims) = ops.state;
                // Only the rendered image is differentiated; the target is data.
                if let Some(node) = &ops.parents[0] {
                    grads.register::<B>(node.id, B::splat_ssim_backward(x, y, d, dims));
                }
            }
        }

        match SsimBackward
            .prepare::<C>([x.node.clone(), y.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::splat_ssim(x.primitive.clone(), y.primitive.clone(), dims);
                prep.finish((x.primitive, y.primitive, dims), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::splat_ssim(x.primitive, y.primitive, dims)),
        }
    }
}

/// Parameter tensors of a set of Gaussians on backend `B`, `[N, width]` each.
pub type SplatTensors<B> = Params<Tensor<B, 2>>;

/// Renders `[H, W, C]` (differentiable on an autodiff backend).
pub fn render<B: SplatBackend>(params: &SplatTensors<B>, spec: &RenderSpec) -> Tensor<B, 3> {
    let prims = params.clone().map(|t| t.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(B::splat_render(prims, spec)))
}

/// Mean SSIM of `x` against `y`, `[1]` (differentiable in `x`).
pub fn ssim<B: SplatBackend>(x: Tensor<B, 3>, y: Tensor<B, 3>) -> Tensor<B, 1> {
    let dims = x.dims();
    let out = B::splat_ssim(x.into_primitive().tensor(), y.into_primitive().tensor(), dims);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
