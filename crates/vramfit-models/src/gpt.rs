//! A GPT-style decoder: token and learned position embeddings, pre-norm
//! blocks (causal multi-head attention, GELU MLP), a final norm and a head
//! tied to the token embedding; optionally a prefix of "frame" embeddings
//! per sample (projected feature vectors, capped at `max_frames`), the
//! video-language case. Matrix work goes through [`Autocast`]; norms,
//! softmax, the residual stream and the loss are f32. No dropout, so a
//! checkpointed block recomputes exactly what it computed in forward.

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::backend::AutodiffBackend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vramfit::activation_checkpointing::Block;
use vramfit::precision::Autocast;
use vramfit::step::Trainable;

pub use crate::data::TokenBatch;

/// The transformer's settings (`vramfit train transformer`).
pub type TrainConfig = crate::config::FamilyConfig<GptConfig>;

/// Model shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// Embedding width.
    pub width: usize,
    /// Blocks.
    pub depth: usize,
    /// Attention heads (must divide `width`).
    pub heads: usize,
    /// Longest sequence (frames + tokens) the position table covers.
    pub context: usize,
    /// MLP hidden width = `mlp_ratio × width`.
    pub mlp_ratio: usize,
    /// Length of one frame's feature vector (0: no frame prefix).
    pub frame_dim: usize,
    /// At most this many frames per sample are used (evenly spaced).
    pub max_frames: usize,
    /// `standard` (the scores kept for the backward, `[b, h, t, t]` a
    /// layer) or `fused` (recomputed in the backward, never stored).
    pub attention: vramfit::fused::Attention,
}

impl Default for GptConfig {
    fn default() -> Self {
        Self {
            vocab: 64,
            width: 64,
            depth: 4,
            heads: 4,
            context: 64,
            mlp_ratio: 4,
            frame_dim: 0,
            max_frames: 0,
            attention: vramfit::fused::Attention::Standard,
        }
    }
}

/// A model shape that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model.{key}: {problem}")]
pub struct GptConfigError {
    /// The setting.
    pub key: &'static str,
    /// What is wrong and what to do.
    pub problem: String,
}

impl GptConfig {
    /// Checks the shape.
    pub fn validate(&self) -> Result<(), GptConfigError> {
        let err = |key, problem: String| Err(GptConfigError { key, problem });
        for (key, v) in [
            ("vocab", self.vocab),
            ("width", self.width),
            ("depth", self.depth),
            ("heads", self.heads),
            ("context", self.context),
            ("mlp_ratio", self.mlp_ratio),
        ] {
            if v == 0 {
                return err(key, "must be at least 1".into());
            }
        }
        if self.vocab < 2 {
            return err(
                "vocab",
                "1: with one token every prediction is certain (the loss is 0 from the start): nothing to learn; \
                 give 2 or more"
                    .into(),
            );
        }
        if !self.width.is_multiple_of(self.heads) {
            return err(
                "heads",
                format!(
                    "{} heads do not divide width {}; pick heads dividing the width",
                    self.heads, self.width
                ),
            );
        }
        if self.frame_dim > 0 && self.max_frames == 0 {
            return err(
                "max_frames",
                "is 0 while frame_dim is set: set max_frames ≥ 1 or frame_dim = 0".into(),
            );
        }
        if self.max_frames >= self.context {
            return err(
                "max_frames",
                format!(
                    "{} leaves no room for tokens in context {}",
                    self.max_frames, self.context
                ),
            );
        }
        Ok(())
    }

    /// Frames a sample with `available` frames contributes.
    pub fn frames_used(&self, available: usize) -> usize {
        if self.frame_dim == 0 {
            0
        } else {
            available.min(self.max_frames)
        }
    }

    /// Builds the model with weights drawn from `seed` (normal, σ 0.02;
    /// residual projections σ 0.02/√(2·depth), as GPT-2).
    pub fn init<B: Backend>(&self, seed: u64, device: &B::Device) -> Gpt<B> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = self.width;
        let hidden = self.mlp_ratio * w;
        let residual_std = 0.02 / (2.0 * self.depth as f64).sqrt();
        let blocks = (0..self.depth)
            .map(|_| GptBlock {
                norm1: Norm::new(w, device),
                qkv: Dense::new(&mut rng, w, 3 * w, 0.02, device),
                proj: Dense::new(&mut rng, w, w, residual_std, device),
                norm2: Norm::new(w, device),
                mlp_in: Dense::new(&mut rng, w, hidden, 0.02, device),
                mlp_out: Dense::new(&mut rng, hidden, w, residual_std, device),
                heads: self.heads,
                fused_attention: self.attention == vramfit::fused::Attention::Fused,
            })
            .collect();
        Gpt {
            token_embedding: normal(&mut rng, [self.vocab, w], 0.02, device),
            position_embedding: normal(&mut rng, [self.context, w], 0.02, device),
            frame_projection: (self.frame_dim > 0).then(|| Dense::new(&mut rng, self.frame_dim, w, 0.02, device)),
            blocks,
            final_norm: Norm::new(w, device),
            max_frames: self.max_frames,
        }
    }
}

pub(crate) fn normal<B: Backend, const D: usize>(
    rng: &mut ChaCha8Rng,
    shape: [usize; D],
    std: f64,
    device: &B::Device,
) -> Param<Tensor<B, D>> {
    if vramfit::shapes::is_shapes::<B>() {
        return undrawn(shape, device);
    }
    let n: usize = shape.iter().product();
    // From the seeded stream: the same weights on every backend.
    let values: Vec<f32> = (0..n).map(|_| box_muller(rng, std)).collect();
    Param::from_tensor(Tensor::from_data(TensorData::new(values, shape), device))
}

/// One draw of N(0, std²) from two uniforms of `rng` (Box–Muller).
fn box_muller(rng: &mut ChaCha8Rng, std: f64) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * std) as f32
}

/// Values drawn per block of [`DRAW_BLOCK`]: each block's own stream.
const DRAW_BLOCK: usize = 1 << 20;

/// [`normal`] drawn on every thread: the tensor takes one seed from `rng`,
/// each block of a million values its own ChaCha stream of that seed, so
/// the values are the same whatever the threads (not [`normal`]'s: the
/// streams differ). A 7B's 7.2 billion weights are drawn in seconds a
/// billion, not minutes.
pub(crate) fn normal_parallel<B: Backend, const D: usize>(
    rng: &mut ChaCha8Rng,
    shape: [usize; D],
    std: f64,
    device: &B::Device,
) -> Param<Tensor<B, D>> {
    use rayon::prelude::*;
    if vramfit::shapes::is_shapes::<B>() {
        return undrawn(shape, device);
    }
    let n: usize = shape.iter().product();
    let seed = rng.random::<u64>();
    let mut values = vec![0f32; n];
    values.par_chunks_mut(DRAW_BLOCK).enumerate().for_each(|(i, block)| {
        let mut stream = ChaCha8Rng::seed_from_u64(seed);
        stream.set_stream(i as u64);
        for v in block {
            *v = box_muller(&mut stream, std);
        }
    });
    Param::from_tensor(Tensor::from_data(TensorData::new(values, shape), device))
}

/// A parameter of `shape` on the shape backend, which holds no values:
/// one buffer of its size, as the upload of drawn values makes, without
/// drawing billions of them.
fn undrawn<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Param<Tensor<B, D>> {
    Param::from_tensor(Tensor::empty(shape, device))
}

pub(crate) fn constant<B: Backend>(n: usize, value: f32, device: &B::Device) -> Param<Tensor<B, 1>> {
    Param::from_tensor(Tensor::from_data(TensorData::new(vec![value; n], [n]), device))
}

/// `x · W + b`.
#[derive(Module, Debug)]
pub struct Dense<B: Backend> {
    /// `[in, out]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> Dense<B> {
    fn new(rng: &mut ChaCha8Rng, inputs: usize, outputs: usize, std: f64, device: &B::Device) -> Self {
        Self {
            weight: normal(rng, [inputs, outputs], std, device),
            bias: constant(outputs, 0.0, device),
        }
    }

    /// Output in the low type.
    pub fn forward(&self, x: Tensor<B, 3>, ac: &Autocast) -> Tensor<B, 3> {
        ac.linear(x, self.weight.val(), Some(self.bias.val()))
    }

    /// Outputs `start..start + len` alone, in the low type: the layer
    /// restricted to those columns of its weight and bias.
    pub fn forward_columns(&self, x: Tensor<B, 3>, start: usize, len: usize, ac: &Autocast) -> Tensor<B, 3> {
        let weight = self.weight.val().narrow(1, start, len);
        ac.linear(x, weight, Some(self.bias.val().narrow(0, start, len)))
    }
}

/// Layer normalisation, in f32.
#[derive(Module, Debug)]
pub struct Norm<B: Backend> {
    /// Scale `[width]`.
    pub gamma: Param<Tensor<B, 1>>,
    /// Shift `[width]`.
    pub beta: Param<Tensor<B, 1>>,
}

impl<B: Backend> Norm<B> {
    fn new(width: usize, device: &B::Device) -> Self {
        Self {
            gamma: constant(width, 1.0, device),
            beta: constant(width, 0.0, device),
        }
    }

    /// Normalises the last axis; input of any type, output f32.
    pub fn forward(&self, x: Tensor<B, 3>, ac: &Autocast) -> Tensor<B, 3> {
        // One fused operation on the CPU backend (see `vramfit::fused`).
        vramfit::fused::layer_norm(ac.full(x), ac.full(self.gamma.val()), ac.full(self.beta.val()), 1e-5)
    }
}

/// One pre-norm block: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Module, Debug)]
pub struct GptBlock<B: Backend> {
    /// Before attention.
    pub norm1: Norm<B>,
    /// Query, key and value projections, fused `[w, 3w]`.
    pub qkv: Dense<B>,
    /// Attention output projection.
    pub proj: Dense<B>,
    /// Before the MLP.
    pub norm2: Norm<B>,
    /// MLP up.
    pub mlp_in: Dense<B>,
    /// MLP down.
    pub mlp_out: Dense<B>,
    heads: usize,
    fused_attention: bool,
}

impl<B: Backend> Block<B, 3> for GptBlock<B> {
    fn forward(&self, x: Tensor<B, 3>, ac: &Autocast) -> Tensor<B, 3> {
        let w = x.dims()[2];
        let (h, dh) = (self.heads, w / self.heads);
        let normed = self.norm1.forward(x.clone(), ac);
        // q, k and v as three products with column blocks of the joint
        // weight, not one product narrowed three ways: the backward of a
        // narrow of the [b, t, 3w] output fills a zero tensor of that size
        // per block and adds the three (on the CPU 18 MB of zeros and two
        // 6 MB sums per layer at PyTorch's shape); a narrow of the weight
        // costs that at the weight's size. Head layout changes as single
        // copies on the CPU (see `vramfit::fused`).
        let heads = |i: usize| vramfit::fused::split_heads(self.qkv.forward_columns(normed.clone(), i * w, w, ac), h); // [b, h, t, dh]
        let (q, k, v) = (heads(0), heads(1), heads(2));
        let scale = 1.0 / (dh as f64).sqrt();
        let mixed = if self.fused_attention {
            // No score tensor: recomputed row by row in the backward (in
            // f32 inside; Q, K, V and the output kept in the low type where
            // the kernels read it, as the standard path's products do).
            vramfit::fused::attention(ac.low(q), ac.low(k), ac.low(v), scale, true)
        } else {
            let scores = ac.full(ac.matmul(q, k.swap_dims(2, 3))); // [b, h, t, t]
            // Scale, causal mask and softmax as one operation on the CPU
            // backend (see `vramfit::fused`), Burn's operations elsewhere.
            let attn = vramfit::fused::causal_softmax(scores, scale);
            ac.matmul(attn, v)
        };
        let mixed = vramfit::fused::merge_heads(mixed); // [b, t, w]
        let x = x + ac.full(self.proj.forward(mixed, ac));
        let hidden = vramfit::fused::gelu(self.mlp_in.forward(self.norm2.forward(x.clone(), ac), ac));
        x + ac.full(self.mlp_out.forward(hidden, ac))
    }
}

/// The decoder.
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    /// `[vocab, width]`, also the output head (tied).
    pub token_embedding: Param<Tensor<B, 2>>,
    /// `[context, width]`.
    pub position_embedding: Param<Tensor<B, 2>>,
    /// Frame features → width, when the model takes frames.
    pub frame_projection: Option<Dense<B>>,
    /// The blocks.
    pub blocks: Vec<GptBlock<B>>,
    /// Before the head.
    pub final_norm: Norm<B>,
    max_frames: usize,
}

impl<B: Backend> Gpt<B> {
    /// Frames used: all if within the cap, else `max_frames` evenly spaced.
    fn capped_frames(&self, frames: Tensor<B, 3>) -> Tensor<B, 3> {
        let n = frames.dims()[1];
        if n <= self.max_frames {
            return frames;
        }
        let keep: Vec<i64> = (0..self.max_frames).map(|i| (i * n / self.max_frames) as i64).collect();
        let keep = Tensor::<B, 1, Int>::from_data(TensorData::new(keep, [self.max_frames]), &frames.device());
        frames.select(1, keep)
    }

    /// Embeddings (frames then tokens) plus positions: `[b, frames + tokens, w]`, f32.
    pub fn embed(&self, batch: &TokenBatch<B>, ac: &Autocast) -> Tensor<B, 3> {
        let [b, t] = batch.tokens.dims();
        let table = self.token_embedding.val();
        let w = table.dims()[1];
        let tokens = ac.full(
            table
                .select(0, batch.tokens.clone().reshape([b * t]))
                .reshape([b, t, w]),
        );
        let x = match (&self.frame_projection, &batch.frames) {
            (Some(p), Some(frames)) => {
                let f = ac.full(p.forward(self.capped_frames(frames.clone()), ac));
                Tensor::cat(vec![f, tokens], 1)
            }
            _ => tokens,
        };
        let len = x.dims()[1];
        x + ac
            .full(self.position_embedding.val().narrow(0, 0, len))
            .unsqueeze::<3>()
    }

    /// Mean next-token cross-entropy (f32) from the last block's output.
    pub fn head_loss(&self, x: Tensor<B, 3>, batch: &TokenBatch<B>, ac: &Autocast) -> Tensor<B, 1> {
        let [b, t] = batch.tokens.dims();
        let len = x.dims()[1];
        let x = self.final_norm.forward(x, ac).narrow(1, len - t, t); // token positions only
        let w = x.dims()[2];
        let logits = ac.full(ac.matmul(x.reshape([b * t, w]), self.token_embedding.val().transpose())); // [b·t, vocab]
        crate::data::next_token_loss(logits, batch)
    }

    /// The whole forward to the loss, as one graph.
    pub fn loss(&self, batch: &TokenBatch<B>, ac: &Autocast) -> Tensor<B, 1> {
        let mut x = self.embed(batch, ac);
        for block in &self.blocks {
            x = block.forward(x, ac);
        }
        self.head_loss(x, batch, ac)
    }
}

impl<B: AutodiffBackend> Trainable<B, 3> for Gpt<B> {
    type Batch = TokenBatch<B>;
    type Block = GptBlock<B>;

    fn micro_batch(batch: &Self::Batch, range: std::ops::Range<usize>) -> Self::Batch {
        batch.slice(range)
    }

    fn batch_bytes(batch: &Self::Batch) -> u64 {
        batch.bytes()
    }

    fn prelude(&self, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, 3> {
        self.embed(batch, autocast)
    }

    fn blocks(&self) -> &[GptBlock<B>] {
        &self.blocks
    }

    fn head(&self, x: Tensor<B, 3>, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, 1> {
        self.head_loss(x, batch, autocast)
    }
}

/// The sequence length from which `vramfit train` offers the fused
/// attention to lower the activations (below it the scores are too small a
/// share for its scratch to pay).
pub const FUSED_PAYS_FROM_TOKENS: usize = 128;

impl crate::family::ModelSettings for GptConfig {
    type Task = crate::data::TaskConfig;
    const NAME: &'static str = "transformer";
    const CHECKPOINT_KIND: &'static str = "vramfit.transformer.checkpoint";
    const WEIGHTS_KIND: &'static str = "vramfit.transformer.weights";

    fn check(&self, task: &Self::Task) -> Result<(), crate::config::ConfigError> {
        use crate::config::invalid;
        self.validate().map_err(|e| invalid("model", e.to_string()))?;
        if task.tokens < 1 || task.topics < 1 || !(0.0..=1.0).contains(&task.p_follow) {
            return Err(invalid("task", "tokens and topics must be ≥ 1 and p_follow in [0, 1]"));
        }
        if !task.data.is_empty() {
            return Err(invalid(
                "task.data",
                "`train transformer` trains on its synthetic task; a corpus is the llm's (`train llm --data FILE`)",
            ));
        }
        if task.frames > 0 && self.frame_dim == 0 {
            return Err(invalid(
                "task.frames",
                "the task has frames but model.frame_dim is 0: set model.frame_dim and model.max_frames",
            ));
        }
        let length = self.frames_used(task.frames) + task.tokens;
        if length > self.context {
            return Err(invalid(
                "model.context",
                format!(
                    "{} frames + {} tokens = {length} positions do not fit a context of {}: raise model.context or lower task.tokens / model.max_frames",
                    self.frames_used(task.frames),
                    task.tokens,
                    self.context
                ),
            ));
        }
        Ok(())
    }

    fn activation_lever(&self, task: &Self::Task) -> Option<String> {
        // The scores are t² a head: at short sequences they are a small
        // part of the activations, and the fused kernel's own scratch can
        // outweigh them (measured at 32 tokens: +7 KB).
        (self.attention == vramfit::fused::Attention::Standard && task.tokens >= FUSED_PAYS_FROM_TOKENS)
            .then(|| "--attention fused (attention's scores recomputed in the backward, never stored)".into())
    }

    fn attention(&self) -> Option<vramfit::fused::Attention> {
        Some(self.attention)
    }

    fn with_attention(self, attention: vramfit::fused::Attention) -> Self {
        Self { attention, ..self }
    }

    fn blocks(&self) -> usize {
        self.depth
    }

    fn with_blocks(&self, blocks: usize) -> Option<Self> {
        Some(Self {
            depth: blocks,
            ..self.clone()
        })
    }

    /// Each block's four attention matrices and its MLP over the frames'
    /// and tokens' positions, the head's matrix.
    fn work(&self, task: &Self::Task) -> Option<vramfit::plan::Work> {
        let w = self.width as u64;
        Some(vramfit::plan::Work::decoder(
            self.frames_used(task.frames) + task.tokens,
            (4 + 2 * self.mlp_ratio as u64) * w * w,
            self.width,
            w * self.vocab as u64,
        ))
    }

    fn rough_floats(&self, task: &Self::Task) -> crate::config::RoughFloats {
        let [w, d, v, r] = [self.width, self.depth, self.vocab, self.mlp_ratio].map(|x| x as f64);
        let t = (self.frames_used(task.frames) + task.tokens) as f64;
        let block = (4.0 + 2.0 * r) * w * w;
        // The fused attention keeps no scores.
        let scores = match self.attention {
            vramfit::fused::Attention::Standard => 2.0 * self.heads as f64 * t * t,
            _ => 0.0,
        };
        crate::config::RoughFloats {
            parameters: 2.0 * v * w + (self.context + self.frame_dim) as f64 * w + d * block,
            frozen: 0.0,
            frozen_bytes_each: 4.0,
            // A block keeps some ten widths and the MLP's hidden a position,
            // and the scores twice a head; the logits thrice.
            activations_per_sample: d * (t * w * (10.0 + 2.0 * r) + scores) + 3.0 * t * v,
            largest_per_sample: crate::config::largest(&[
                (scores / 2.0, "a block's attention scores"),
                (t * v, "the logits"),
                (t * w * r, "the MLP's hidden activations"),
            ]),
            // A next-token table a topic, and a code a topic.
            task: task.topics as f64 * (v + self.frame_dim as f64),
        }
    }
}

impl crate::family::Family<3> for GptConfig {
    type Net<B: AutodiffBackend> = Gpt<B>;
    type Data = crate::data::SyntheticTask;

    fn init<B: AutodiffBackend>(&self, seed: u64, device: &B::Device) -> Result<Gpt<B>, crate::config::ConfigError> {
        Ok(GptConfig::init(self, seed, device))
    }

    fn data(&self, task: &Self::Task) -> Result<Self::Data, crate::config::ConfigError> {
        Ok(crate::data::SyntheticTask::new(
            task.clone(),
            self.vocab,
            self.frame_dim,
        ))
    }

    fn batch<B: AutodiffBackend>(data: &Self::Data, step: u64, size: usize, device: &B::Device) -> TokenBatch<B> {
        data.batch::<B>(step, size, device)
    }

    fn block_input_bytes(&self, task: &Self::Task) -> u64 {
        ((self.frames_used(task.frames) + task.tokens) * self.width * 4) as u64
    }

    fn summary<B: AutodiffBackend>(
        &self,
        data: &Self::Data,
        _: &Gpt<B>,
        batch_size: usize,
        _: usize,
        median_step_ms: f64,
        _: &B::Device,
    ) -> serde_json::Map<String, serde_json::Value> {
        crate::data::token_summary(data, batch_size, median_step_ms)
    }
}
