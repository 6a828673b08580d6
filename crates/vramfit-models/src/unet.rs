//! A convolutional U-Net with BatchNorm (or GroupNorm) for image-to-image
//! work: a stem, `depth` encoder stages (two 3×3 convolutions, each with a
//! norm and ReLU, then a 2×2 average pool), a bottleneck, `depth` decoder
//! stages (nearest 2× upsampling, the encoder's skip concatenated, two 3×3
//! convolutions) and a 1×1 head that predicts a residual added to the
//! input. Channels double per level from `width`.
//!
//! For the composed step the network is a chain of `2·depth + 1` stages
//! over a stack of activations ([`Block::forward_stack`]): an encoder
//! stage pushes its skip and the pooled tensor, a decoder stage pops the
//! tensor from below and its skip. Checkpointing a stage drops everything
//! inside it (convolution outputs, norm intermediates, ReLUs) and keeps the
//! stack it started from.
//!
//! Precision: convolutions run in the step's low type ([`Autocast`]), on
//! f32 master weights; every norm computes its statistics and normalises in
//! f32 and hands its output on in the low type.
//!
//! BatchNorm in training normalises with the statistics of the samples in
//! the forward pass, so a micro-batch of `b` is normalised differently from
//! the full batch of `k·b` (measured in the tests and docs/results/unet.md). The
//! choices: `norm = "group"` (statistics per sample: micro-batching is
//! exact), or BatchNorm with its population statistics for evaluation
//! computed after training over many samples ([`Unet::with_population`]),
//! pooled exactly whatever the micro-batch (instead of a running average
//! updated per micro-batch). In eval mode BatchNorm is per sample too.

use burn::module::{AutodiffModule, Module, Param};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::relu;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::ConvOptions;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use vramfit::activation_checkpointing::Block;
use vramfit::precision::{Autocast, Precision};
use vramfit::step::Trainable;

use crate::config::{ConfigError, FamilyConfig, invalid};
use crate::denoise::{Denoise, DenoiseConfig, ImageBatch};
use crate::family::{Family, ModelSettings};
use crate::gpt::{constant, normal};

/// The U-Net's settings (`vramfit train unet`).
pub type UnetTrainConfig = FamilyConfig<UnetConfig>;

const EPS: f64 = 1e-5;

/// Model shape (`[model]` of `vramfit train unet`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UnetConfig {
    /// Image channels in and out: 1 (luminance) or 3 (RGB).
    pub channels: usize,
    /// Channels of the first level; level `l` has `width · 2^l`.
    pub width: usize,
    /// Levels below the first (each halves the resolution).
    pub depth: usize,
    /// `batch` (BatchNorm) or `group` (GroupNorm).
    pub norm: String,
    /// GroupNorm's groups (must divide `width`).
    pub groups: usize,
}

impl Default for UnetConfig {
    fn default() -> Self {
        Self {
            channels: 3,
            width: 8,
            depth: 3,
            norm: "batch".into(),
            groups: 4,
        }
    }
}

impl UnetConfig {
    /// Channels at level `l`.
    pub fn level_channels(&self, l: usize) -> usize {
        self.width << l
    }

    /// Builds the network with weights drawn from `seed` (He normal).
    pub fn build<B: Backend>(&self, seed: u64, device: &B::Device) -> Unet<B> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let groups = if self.norm == "group" { self.groups } else { 0 };
        let c = |l| self.level_channels(l);
        let pair = |rng: &mut ChaCha8Rng, inputs: usize, outputs: usize| DoubleConv {
            conv1: Conv::new(rng, inputs, outputs, 3, 1.0, device),
            norm1: Norm::new(outputs, groups, device),
            conv2: Conv::new(rng, outputs, outputs, 3, 1.0, device),
            norm2: Norm::new(outputs, groups, device),
        };
        let stem = Conv::new(&mut rng, self.channels, c(0), 3, 1.0, device);
        let mut stages = Vec::new();
        for l in 0..self.depth {
            let inputs = if l == 0 { c(0) } else { c(l - 1) };
            stages.push(UnetStage {
                convs: pair(&mut rng, inputs, c(l)),
                kind: ENCODER,
            });
        }
        let below = if self.depth == 0 { c(0) } else { c(self.depth - 1) };
        stages.push(UnetStage {
            convs: pair(&mut rng, below, c(self.depth)),
            kind: BOTTLENECK,
        });
        for l in (0..self.depth).rev() {
            stages.push(UnetStage {
                convs: pair(&mut rng, c(l + 1) + c(l), c(l)),
                kind: DECODER,
            });
        }
        Unet {
            stem,
            stem_norm: Norm::new(c(0), groups, device),
            stages,
            // The head starts small: the untrained network is close to the identity.
            head: Conv::new(&mut rng, c(0), self.channels, 1, 0.1, device),
            head_bias: constant(self.channels, 0.0, device),
        }
    }
}

/// A 2-D convolution without bias (a norm follows), stride 1, same padding.
#[derive(Module, Debug)]
pub struct Conv<B: Backend> {
    /// `[out, in, k, k]`.
    pub weight: Param<Tensor<B, 4>>,
}

impl<B: Backend> Conv<B> {
    /// He-normal weights, times `gain`.
    fn new(rng: &mut ChaCha8Rng, inputs: usize, outputs: usize, k: usize, gain: f64, device: &B::Device) -> Self {
        let std = gain * (2.0 / (inputs * k * k) as f64).sqrt();
        Self {
            weight: normal(rng, [outputs, inputs, k, k], std, device),
        }
    }

    /// Output in the low type.
    pub fn forward(&self, x: Tensor<B, 4>, bias: Option<Tensor<B, 1>>, ac: &Autocast) -> Tensor<B, 4> {
        let k = self.weight.dims()[2];
        let pad = k / 2;
        ac.conv2d(
            x,
            self.weight.val(),
            bias,
            ConvOptions::new([1, 1], [pad, pad], [1, 1], 1),
        )
    }
}

/// BatchNorm (`groups` 0) or GroupNorm, computed in f32; the output goes on
/// in the low type.
#[derive(Module, Debug)]
pub struct Norm<B: Backend> {
    /// Scale per channel.
    pub gamma: Param<Tensor<B, 1>>,
    /// Shift per channel.
    pub beta: Param<Tensor<B, 1>>,
    /// BatchNorm's population mean per channel (eval mode; no gradient).
    pub mean: Param<Tensor<B, 1>>,
    /// BatchNorm's population variance per channel (eval mode; no gradient).
    pub var: Param<Tensor<B, 1>>,
    groups: usize,
    eval: bool,
}

impl<B: Backend> Norm<B> {
    fn new(channels: usize, groups: usize, device: &B::Device) -> Self {
        Self {
            gamma: constant(channels, 1.0, device),
            beta: constant(channels, 0.0, device),
            mean: constant(channels, 0.0, device).set_require_grad(false),
            var: constant(channels, 1.0, device).set_require_grad(false),
            groups,
            eval: false,
        }
    }

    fn forward(&self, x: Tensor<B, 4>, ac: &Autocast, record: Option<&mut Recorder>) -> Tensor<B, 4> {
        let x = ac.full(x);
        let [n, c, h, w] = x.dims();
        let per_channel = |t: Tensor<B, 1>| ac.full(t).reshape([1, c, 1, 1]);
        let y = if self.groups > 0 {
            let g = x.reshape([n, self.groups, c / self.groups * h * w]);
            let centred = g.clone() - g.mean_dim(2);
            let var = centred.clone().powi_scalar(2).mean_dim(2);
            (centred / var.add_scalar(EPS).sqrt()).reshape([n, c, h, w])
        } else if self.eval {
            (x - per_channel(self.mean.val())) / per_channel(self.var.val()).add_scalar(EPS).sqrt()
        } else {
            let mean = x.clone().mean_dim(0).mean_dim(2).mean_dim(3);
            let centred = x - mean.clone();
            let var = centred.clone().powi_scalar(2).mean_dim(0).mean_dim(2).mean_dim(3);
            if let Some(r) = record {
                r.add(mean, var.clone(), n * h * w);
            }
            centred / var.add_scalar(EPS).sqrt()
        };
        ac.low(y * per_channel(self.gamma.val()) + per_channel(self.beta.val()))
    }
}

/// Two `conv → norm → ReLU`.
#[derive(Module, Debug)]
pub struct DoubleConv<B: Backend> {
    /// First convolution.
    pub conv1: Conv<B>,
    /// Its norm.
    pub norm1: Norm<B>,
    /// Second convolution.
    pub conv2: Conv<B>,
    /// Its norm.
    pub norm2: Norm<B>,
}

impl<B: Backend> DoubleConv<B> {
    fn forward(&self, x: Tensor<B, 4>, ac: &Autocast, mut record: Option<&mut Recorder>) -> Tensor<B, 4> {
        let x = relu(
            self.norm1
                .forward(self.conv1.forward(x, None, ac), ac, record.as_deref_mut()),
        );
        relu(self.norm2.forward(self.conv2.forward(x, None, ac), ac, record))
    }
}

const ENCODER: usize = 0;
const BOTTLENECK: usize = 1;
const DECODER: usize = 2;

/// One stage of the chain: an encoder level, the bottleneck or a decoder level.
#[derive(Module, Debug)]
pub struct UnetStage<B: Backend> {
    /// The stage's convolutions.
    pub convs: DoubleConv<B>,
    kind: usize,
}

impl<B: Backend> UnetStage<B> {
    fn run(&self, mut stack: Vec<Tensor<B, 4>>, ac: &Autocast, record: Option<&mut Recorder>) -> Vec<Tensor<B, 4>> {
        let x = stack.pop().expect("a stage's stack holds its input");
        match self.kind {
            ENCODER => {
                let y = self.convs.forward(x, ac, record);
                let down = burn::tensor::module::avg_pool2d(y.clone(), [2, 2], [2, 2], [0, 0], true, false);
                stack.push(y);
                stack.push(down);
            }
            BOTTLENECK => stack.push(self.convs.forward(x, ac, record)),
            _ => {
                let skip = stack.pop().expect("a decoder stage pops its encoder's skip");
                let joined = Tensor::cat(vec![upsample2(x), skip], 1);
                stack.push(self.convs.forward(joined, ac, record));
            }
        }
        stack
    }
}

impl<B: Backend> Block<B, 4> for UnetStage<B> {
    fn forward_stack(&self, stack: Vec<Tensor<B, 4>>, autocast: &Autocast) -> Vec<Tensor<B, 4>> {
        self.run(stack, autocast, None)
    }
}

/// Nearest-neighbour 2× upsampling of `[n, c, h, w]`.
pub(crate) fn upsample2<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [n, c, h, w] = x.dims();
    x.reshape([n, c, h, 1, w, 1])
        .expand([n, c, h, 2, w, 2])
        .reshape([n, c, 2 * h, 2 * w])
}

/// The network.
#[derive(Module, Debug)]
pub struct Unet<B: Backend> {
    /// Image channels → width.
    pub stem: Conv<B>,
    /// The stem's norm.
    pub stem_norm: Norm<B>,
    /// Encoders, bottleneck, decoders, in order.
    pub stages: Vec<UnetStage<B>>,
    /// 1×1 convolution to the image channels: the residual.
    pub head: Conv<B>,
    /// The head's bias.
    pub head_bias: Param<Tensor<B, 1>>,
}

/// BatchNorm statistics gathered over many forward passes, per norm layer
/// in forward order: sample counts, Σ n·mean and Σ n·(var + mean²) per channel.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    layers: Vec<(f64, Vec<f64>, Vec<f64>)>,
    cursor: usize,
}

impl Recorder {
    fn add<B: Backend>(&mut self, mean: Tensor<B, 4>, var: Tensor<B, 4>, count: usize) {
        let host = |t: Tensor<B, 4>| t.into_data().convert::<f64>().to_vec::<f64>().expect("f64 data");
        let (m, v) = (host(mean), host(var));
        if self.cursor == self.layers.len() {
            self.layers.push((0.0, vec![0.0; m.len()], vec![0.0; m.len()]));
        }
        let (n, sum, square) = &mut self.layers[self.cursor];
        *n += count as f64;
        for (i, (m, v)) in m.iter().zip(&v).enumerate() {
            sum[i] += count as f64 * m;
            square[i] += count as f64 * (v + m * m);
        }
        self.cursor += 1;
    }

    /// Mean and variance per channel of every layer, pooled over all samples.
    pub fn population(&self) -> Vec<(Vec<f32>, Vec<f32>)> {
        self.layers
            .iter()
            .map(|(n, sum, square)| {
                let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
                let var = square.iter().zip(&mean).map(|(q, m)| (q / n - m * m).max(0.0) as f32);
                (mean.iter().map(|&m| m as f32).collect(), var.collect())
            })
            .collect()
    }
}

impl<B: Backend> Unet<B> {
    fn forward(&self, input: Tensor<B, 4>, ac: &Autocast, mut record: Option<&mut Recorder>) -> Tensor<B, 4> {
        let x = relu(
            self.stem_norm
                .forward(self.stem.forward(input, None, ac), ac, record.as_deref_mut()),
        );
        let mut stack = vec![x];
        for stage in &self.stages {
            stack = stage.run(stack, ac, record.as_deref_mut());
        }
        stack.pop().expect("the last decoder leaves one tensor")
    }

    fn head_loss(&self, x: Tensor<B, 4>, batch: &ImageBatch<B>, ac: &Autocast) -> Tensor<B, 1> {
        let residual = self.head.forward(x, Some(self.head_bias.val()), ac);
        let output = batch.input.clone() + ac.full(residual);
        (output - batch.target.clone()).powi_scalar(2).mean()
    }

    /// Mean squared error on `batch`, norms as they are (train or eval mode).
    pub fn loss_value(&self, batch: &ImageBatch<B>, ac: &Autocast) -> f64 {
        let x = self.forward(batch.input.clone(), ac, None);
        self.head_loss(x, batch, ac).into_scalar().elem::<f64>()
    }

    fn norms_mut(&mut self) -> Vec<&mut Norm<B>> {
        let mut out = vec![&mut self.stem_norm];
        for s in &mut self.stages {
            out.push(&mut s.convs.norm1);
            out.push(&mut s.convs.norm2);
        }
        out
    }

    /// Whether the network uses BatchNorm.
    pub fn batch_norm(&self) -> bool {
        self.stem_norm.groups == 0
    }

    /// BatchNorm's population statistics over `batches` (forward passes in
    /// training mode, as the step normalises; statistics pooled exactly over
    /// every sample, whatever the batches' sizes).
    pub fn population(&self, batches: impl IntoIterator<Item = ImageBatch<B>>, ac: &Autocast) -> Recorder {
        let mut record = Recorder::default();
        for batch in batches {
            record.cursor = 0;
            let _ = self.forward(batch.input, ac, Some(&mut record));
        }
        record
    }

    /// The network in eval mode: every BatchNorm normalises with the
    /// population statistics in `record`. (GroupNorm is unchanged.)
    pub fn with_population(mut self, record: &Recorder) -> Self {
        if !self.batch_norm() {
            return self;
        }
        let stats = record.population();
        let device = self.head_bias.val().device();
        assert_eq!(stats.len(), self.norms_mut().len(), "one record per norm layer");
        for (norm, (mean, var)) in self.norms_mut().into_iter().zip(stats) {
            let t = |v: Vec<f32>| {
                let n = v.len();
                Param::from_tensor(Tensor::from_data(TensorData::new(v, [n]), &device)).set_require_grad(false)
            };
            norm.mean = t(mean);
            norm.var = t(var);
            norm.eval = true;
        }
        self
    }

    /// Every norm in eval mode with the statistics it holds (a test seam:
    /// the fine-tuning case, BatchNorm frozen).
    pub fn frozen(mut self) -> Self {
        for norm in self.norms_mut() {
            norm.eval = true;
        }
        self
    }
}

impl<B: AutodiffBackend> Trainable<B, 4> for Unet<B> {
    type Batch = ImageBatch<B>;
    type Block = UnetStage<B>;

    fn micro_batch(batch: &ImageBatch<B>, range: std::ops::Range<usize>) -> ImageBatch<B> {
        batch.slice(range)
    }

    fn batch_bytes(batch: &ImageBatch<B>) -> u64 {
        batch.bytes()
    }

    fn prelude(&self, batch: &ImageBatch<B>, autocast: &Autocast) -> Tensor<B, 4> {
        relu(
            self.stem_norm
                .forward(self.stem.forward(batch.input.clone(), None, autocast), autocast, None),
        )
    }

    fn blocks(&self) -> &[UnetStage<B>] {
        &self.stages
    }

    fn head(&self, x: Tensor<B, 4>, batch: &ImageBatch<B>, autocast: &Autocast) -> Tensor<B, 1> {
        self.head_loss(x, batch, autocast)
    }
}

impl ModelSettings for UnetConfig {
    type Task = DenoiseConfig;
    const NAME: &'static str = "unet";
    const CHECKPOINT_KIND: &'static str = "vramfit.unet.checkpoint";
    const WEIGHTS_KIND: &'static str = "vramfit.unet.weights";

    fn check(&self, task: &DenoiseConfig) -> Result<(), ConfigError> {
        if !matches!(self.channels, 1 | 3) {
            return Err(invalid(
                "model.channels",
                format!("{} is not 1 (luminance) or 3 (RGB)", self.channels),
            ));
        }
        if self.width == 0 {
            return Err(invalid("model.width", "must be at least 1"));
        }
        if self.depth > 12 {
            return Err(invalid("model.depth", format!("{} levels: use at most 12", self.depth)));
        }
        match self.norm.as_str() {
            "batch" => {}
            "group" if self.groups == 0 || !self.width.is_multiple_of(self.groups) => {
                return Err(invalid(
                    "model.groups",
                    format!(
                        "{} groups do not divide width {}: pick groups dividing the width",
                        self.groups, self.width
                    ),
                ));
            }
            "group" => {}
            other => return Err(invalid("model.norm", format!("`{other}` is not one of batch, group"))),
        }
        let step = 1usize << self.depth;
        if task.resolution == 0 || !task.resolution.is_multiple_of(step) {
            return Err(invalid(
                "task.resolution",
                format!(
                    "{} is not a positive multiple of 2^depth = {step} (model.depth {}): use a multiple of {step}, or a smaller depth",
                    task.resolution, self.depth
                ),
            ));
        }
        for (name, v) in [("task.noise", task.noise), ("task.target_noise", task.target_noise)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(name, format!("{v} is not a finite σ ≥ 0")));
            }
        }
        // The source image is held as f32 planes: 8192² RGB is 805 MB.
        for (name, v) in [("task.resolution", task.resolution), ("task.source", task.source)] {
            if v > 8192 {
                return Err(invalid(
                    name,
                    format!("{v} pixels: use at most 8192 (the crops' source image is held in memory)"),
                ));
            }
        }
        Ok(())
    }

    fn rough_floats(&self, task: &DenoiseConfig) -> crate::config::RoughFloats {
        // Level l: width·2^l channels at (resolution / 2^l)²; two 3×3
        // convolutions a level on each side, a dozen maps kept.
        let (mut parameters, mut activations, mut map) = (0.0, 0.0, 0.0f64);
        for l in 0..=self.depth {
            let c = self.width as f64 * 2f64.powi(l as i32);
            let side = task.resolution as f64 / 2f64.powi(l as i32);
            parameters += 4.0 * 9.0 * c * c;
            activations += 12.0 * c * side * side;
            map = map.max(c * side * side);
        }
        crate::config::RoughFloats {
            parameters,
            frozen: 0.0,
            frozen_bytes_each: 4.0,
            activations_per_sample: activations,
            largest_per_sample: (map, "a level's feature map"),
            task: 3.0 * (task.source as f64).powi(2),
        }
    }

    fn blocks(&self) -> usize {
        2 * self.depth + 1
    }

    fn block_shapes(&self, task: &DenoiseConfig) -> Vec<(f64, u64)> {
        // Floats per sample a stage keeps, from its shapes: each conv → norm
        // → ReLU keeps about a dozen tensors of its output's size (the
        // convolution's output, the norm's f32 input, centred and
        // normalised values, the affine output, its low copy, the ReLU's),
        // plus what the stage adds around them (pooled output; upsampled
        // and concatenated input). Its input: the tensor from the stage
        // before (skips are held for the decoder whatever is checkpointed).
        const PER_CONV: f64 = 12.0;
        let c = |l: usize| self.level_channels(l) as f64;
        let area = |l: usize| ((task.resolution >> l) as f64).powi(2);
        let mut shapes = Vec::new();
        for l in 0..self.depth {
            let c_in = if l == 0 { c(0) } else { c(l - 1) };
            shapes.push((area(l) * (2.0 * PER_CONV * c(l) + c(l) / 4.0), c_in * area(l)));
        }
        let below = if self.depth == 0 { c(0) } else { c(self.depth - 1) };
        shapes.push((
            area(self.depth) * 2.0 * PER_CONV * c(self.depth),
            below * area(self.depth),
        ));
        for l in (0..self.depth).rev() {
            let joined = c(l + 1) + c(l);
            shapes.push((
                area(l) * (c(l + 1) + joined + 2.0 * PER_CONV * c(l)),
                c(l + 1) * area(l + 1),
            ));
        }
        let mean = shapes.iter().map(|s| s.0).sum::<f64>() / shapes.len() as f64;
        shapes
            .into_iter()
            .map(|(a, input)| (a / mean, (input * 4.0) as u64))
            .collect()
    }

    fn batch_statistics(&self) -> Option<String> {
        (self.norm == "batch").then(|| "BatchNorm".into())
    }

    fn defaults(config: FamilyConfig<Self>) -> FamilyConfig<Self> {
        FamilyConfig {
            steps: 200,
            batch_size: 8,
            lr: 1e-2,
            warmup_steps: 10,
            ..config
        }
    }
}

/// Held-out batches for the summary's evaluation: steps no run reaches.
const HELD_OUT: u64 = u64::MAX - 1000;

impl Family<4> for UnetConfig {
    type Net<B: AutodiffBackend> = Unet<B>;
    type Data = Denoise;

    fn init<B: AutodiffBackend>(&self, seed: u64, device: &B::Device) -> Result<Unet<B>, crate::config::ConfigError> {
        Ok(self.build(seed, device))
    }

    fn data(&self, task: &DenoiseConfig) -> Result<Denoise, ConfigError> {
        Ok(Denoise::new(task.clone(), self.channels))
    }

    fn batch<B: AutodiffBackend>(data: &Denoise, step: u64, size: usize, device: &B::Device) -> ImageBatch<B> {
        data.batch::<B>(step, size, device)
    }

    fn block_input_bytes(&self, task: &DenoiseConfig) -> u64 {
        (self.width * task.resolution * task.resolution * 4) as u64
    }

    fn summary<B: AutodiffBackend>(
        &self,
        data: &Denoise,
        net: &Unet<B>,
        batch_size: usize,
        micro_batch: usize,
        median_step_ms: f64,
        device: &B::Device,
    ) -> serde_json::Map<String, serde_json::Value> {
        // Evaluated in f32 on fixed held-out samples (64 for the statistics,
        // 32 for the loss, whatever the run's settings), run `micro_batch`
        // at a time (what fitted in training).
        let ac = Autocast::new(Precision::F32);
        let net = net.valid();
        let chunks = |step: u64, n: usize| {
            (0..n.div_ceil(micro_batch.max(1))).map(move |c| {
                let from = c * micro_batch.max(1);
                data.samples::<B::InnerBackend>(step, from..(from + micro_batch.max(1)).min(n), device)
            })
        };
        let record = net.population(chunks(HELD_OUT, 64), &ac);
        let eval = net.with_population(&record);
        let (mut sum, mut count) = (0.0, 0usize);
        for b in chunks(HELD_OUT + 1, 32) {
            let n = b.input.dims()[0];
            sum += eval.loss_value(&b, &ac) * n as f64;
            count += n;
        }
        let eval_loss = sum / count as f64;
        let r = data.config().resolution;
        let pixels = (batch_size * r * r) as f64;
        let mut out = serde_json::Map::new();
        out.insert("noise_floor".into(), data.floor().into());
        out.insert("identity_loss".into(), data.identity_loss().into());
        out.insert("eval_loss".into(), eval_loss.into());
        out.insert(
            "pixels_per_second".into(),
            (if median_step_ms > 0.0 {
                pixels / (median_step_ms / 1e3)
            } else {
                0.0
            })
            .into(),
        );
        out
    }
}
