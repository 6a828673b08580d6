//! A Llama-family decoder (`vramfit train llm`): token embedding, pre-norm
//! blocks of RMSNorm, grouped-query causal attention with rotary positions
//! and a SwiGLU MLP, a final RMSNorm and a head (untied unless the shape
//! ties it). Named shapes from the models' published configurations
//! ([`shapes`], `--shape NAME`), each setting overridable. As the GPT
//! family: matrix work through [`Autocast`], norms, softmax, the residual
//! stream and the loss in f32, no dropout (a checkpointed block recomputes
//! exactly what it computed).
//!
//! What trains is a setting (`model.train`, `--train`): everything
//! (`all`), low-rank adapters on the attention projections and the base
//! frozen (`lora:R`; `lora:R:mlp` adapts the MLP too), or everything but
//! the named groups (`frozen:embedding,blocks.0-3,...`). A frozen
//! parameter takes no gradient, so it holds no gradient and no moments.

use burn::module::Param;
use burn::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use vramfit::frozen::BaseStorage;
use vramfit::fused::Attention;

use crate::config::{ConfigError, invalid};

mod block;
mod decoder;
mod family;
pub mod frames;
pub mod hf_config;
pub mod merge;
mod named_shapes;
pub mod peft;
mod training;
mod weights;

use crate::gpt::normal;
pub use block::{LlamaBlock, Lora, Proj, RmsNorm, rotary};
pub use decoder::Llama;
pub use named_shapes::{Shape, shapes};
pub use training::Training;
use weights::Weights;

/// The video-language model's named shape (Qwen2-1.5B reading frames).
pub const VIDEO_SHAPE: &str = "qwen2-1.5b-video";

/// Tokens the planner probes a long run at by default.
pub const PROBE_TOKENS: usize = 128;

/// `model.base` that lets the planner choose the frozen base's storage.
pub const SEARCH_BASE: &str = "search";

/// A training run of the family.
pub type LlmConfig = crate::config::FamilyConfig<LlamaConfig>;

/// The `[model]` settings of `vramfit train llm`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Residual stream width.
    pub width: usize,
    /// Blocks.
    pub depth: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads (grouped-query attention: each serves
    /// heads / kv_heads query heads; equal to `heads`, multi-head).
    pub kv_heads: usize,
    /// The MLP's hidden width (SwiGLU: gate and up, then down).
    pub ffn: usize,
    /// Longest sequence (rotary positions need no table; the data's
    /// tokens must fit it).
    pub context: usize,
    /// Rotary base θ.
    pub rope_theta: f64,
    /// RMSNorm's ε.
    pub norm_eps: f64,
    /// Biases on the q, k and v projections (Qwen2 has them).
    pub qkv_bias: bool,
    /// The head is the token embedding transposed.
    pub tie_head: bool,
    /// How attention is computed.
    pub attention: Attention,
    /// What trains: `all`, `lora:RANK` (`lora:RANK:mlp`: the MLP too), or
    /// `frozen:GROUP,...` (`embedding`, `head`, `final_norm`, `blocks`,
    /// `blocks.I`, `blocks.I-J`); `qlora:RANK` is `lora:RANK` with the base
    /// in NF4.
    pub train: String,
    /// Positions whose logits the loss computes at once
    /// ([`vramfit::chunked_loss`]: the same loss and gradients, a chunk's
    /// logits alive instead of all of them); 0: all at once.
    pub loss_chunk: usize,
    /// How the frozen base of a LoRA run is stored (`f32`, `bf16`, `f16`,
    /// `nf4`, `int8`; [`vramfit::frozen::BaseStorage`]): the projections
    /// in it (quantized: blocks of 64 with a scale each), the embedding and
    /// head in its 16-bit type (bf16 for the quantized ones, f16 on a
    /// device without bf16), norms and biases in it or, quantized, in f32.
    /// Empty: f32, or nf4 under `qlora:RANK`. `search` ([`SEARCH_BASE`]):
    /// the planner chooses among f32, 16 bits and NF4, lowering it only
    /// where nothing fits at the one before.
    pub base: String,
    /// A safetensors checkpoint in the Hugging Face layout (a directory
    /// holding `model.safetensors` or its index and shards, or one file)
    /// to start from; empty: weights drawn from the seed. Checked against
    /// the shape before anything is built. The key `--weights` sets.
    pub weights: String,
    /// A LoRA adapter in PEFT's layout (a folder with adapter_config.json
    /// and adapter_model.safetensors, as PEFT and vramfit's runs write
    /// them) to continue from instead of fresh adapters; of the run's rank
    /// and targets. The key `--adapter` sets.
    pub adapter: String,
    /// Most frames a sample contributes, as tokens ahead of its text
    /// ([`frames`]: a video-language model); 0: the model reads no frames.
    pub max_frames: usize,
    /// The encoder each frame goes through (where `max_frames` > 0).
    pub frame_encoder: crate::vision::VisionConfig,
    /// Side of a frame's grid of tokens in the LLM: the encoder's grid
    /// averaged over squares to it.
    pub frame_grid: usize,
}

impl Default for LlamaConfig {
    fn default() -> Self {
        Self {
            vocab: 64,
            width: 64,
            depth: 4,
            heads: 4,
            kv_heads: 2,
            ffn: 172,
            context: 256,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            qkv_bias: false,
            tie_head: false,
            attention: Attention::Standard,
            train: "all".into(),
            loss_chunk: vramfit::chunked_loss::DEFAULT_CHUNK,
            base: String::new(),
            weights: String::new(),
            adapter: String::new(),
            max_frames: 0,
            frame_encoder: crate::vision::VisionConfig {
                train: "frozen".into(),
                ..Default::default()
            },
            frame_grid: 2,
        }
    }
}

impl LlamaConfig {
    /// Width of a head.
    pub fn head_width(&self) -> usize {
        self.width / self.heads.max(1)
    }

    /// Parameters the model holds.
    pub fn parameters(&self) -> u64 {
        let [v, w] = [self.vocab, self.width].map(|x| x as u64);
        let head = if self.tie_head { 0 } else { w * v };
        v * w + self.depth as u64 * self.block_parameters() + w + head
    }

    /// Parameters of one block.
    fn block_parameters(&self) -> u64 {
        let [w, f] = [self.width, self.ffn].map(|x| x as u64);
        let kv = (self.kv_heads * self.head_width()) as u64;
        let bias = if self.qkv_bias { w + 2 * kv } else { 0 };
        2 * w * w + 2 * w * kv + bias + 3 * w * f + 2 * w
    }

    /// Parameters of the LoRA adapters `train` adds (0: none).
    pub fn adapter_parameters(&self) -> u64 {
        let Ok(Training::Lora { rank, mlp }) = self.training() else {
            return 0;
        };
        let [w, f, r] = [self.width, self.ffn, rank].map(|x| x as u64);
        let kv = (self.kv_heads * self.head_width()) as u64;
        // An adapter of an `in → out` projection holds rank·(in + out).
        let attention = r * ((w + w) + 2 * (w + kv) + (w + w));
        let feed = if mlp { 3 * r * (w + f) } else { 0 };
        self.depth as u64 * (attention + feed)
    }

    /// Parameters `train` freezes (no gradient, no moments).
    pub fn frozen_parameters(&self) -> u64 {
        let (v, w) = (self.vocab as u64, self.width as u64);
        match self.training() {
            Ok(Training::All) | Err(_) => 0,
            Ok(Training::Lora { .. }) => self.parameters(),
            Ok(Training::Frozen(groups)) => groups
                .iter()
                .map(|g| match g.as_str() {
                    "embedding" => v * w,
                    "head" if !self.tie_head => w * v,
                    "final_norm" => w,
                    "blocks" => self.depth as u64 * self.block_parameters(),
                    g if g.starts_with("blocks.") => self.block_parameters(),
                    _ => 0,
                })
                .sum(),
        }
    }

    /// Bytes of the frozen parameters as stored (`model.base`): under LoRA
    /// the projections in the base's type or quantized, the embedding and
    /// head in its 16-bit type, the norms in it (f32 under a quantized base).
    pub fn frozen_bytes(&self) -> u64 {
        let frozen = self.frozen_parameters();
        if !matches!(self.training(), Ok(Training::Lora { .. })) {
            return 4 * frozen;
        }
        // Where the planner chooses (`search`), the leanest it may choose:
        // the floor asks whether anything can fit.
        let storage = match crate::config::ModelSettings::bases_to_search(self).last() {
            Some(&leanest) if self.base == SEARCH_BASE => leanest,
            _ => self.base_storage(),
        };
        let [w, v] = [self.width, self.vocab].map(|x| x as u64);
        let tables = v * w * if self.tie_head { 1 } else { 2 };
        let norms = w * (2 * self.depth as u64 + 1);
        let biases = if self.qkv_bias {
            self.depth as u64 * (w + 2 * (self.kv_heads * self.head_width()) as u64)
        } else {
            0
        };
        let matrices = frozen - tables - norms - biases;
        let vector_bytes = burn::tensor::DType::from(storage.float()).size() as u64;
        // Norms and biases stay f32 beside a quantized base.
        let norm_bytes = if storage.format().is_some() { 4 } else { vector_bytes };
        storage.matrix_bytes(matrices) + vector_bytes * tables + norm_bytes * (norms + biases)
    }

    /// Parameters of the frame encoder and its projector (0: none).
    pub fn frame_parameters(&self) -> u64 {
        let Some(&w) = self.frame_encoder.widths.last().filter(|_| self.max_frames > 0) else {
            return 0;
        };
        let [w, l] = [w as u64, self.width as u64];
        self.frame_encoder.parameters() + 2 * w + (w * l + l) + (l * l + l)
    }

    /// Tokens the frames of a sample of `task` put ahead of its text.
    pub fn frame_tokens(&self, task: &crate::data::TaskConfig) -> usize {
        if self.max_frames == 0 {
            return 0;
        }
        task.frames.min(self.max_frames) * self.frame_grid * self.frame_grid
    }

    /// The frames of `task` against the model's frame encoder.
    pub(crate) fn check_frames(&self, task: &crate::data::TaskConfig) -> Result<(), ConfigError> {
        if task.frames == 0 {
            return Ok(());
        }
        if self.max_frames == 0 {
            return Err(invalid(
                "task.frames",
                format!(
                    "{} frames a sample, and this model reads none: give a shape with a frame encoder (--shape \
                     {VIDEO_SHAPE}) or set model.max_frames",
                    task.frames
                ),
            ));
        }
        if !task.data.is_empty() {
            return Err(invalid(
                "task.frames",
                "frames are drawn for the synthetic task; a corpus of text has none (leave task.frames at 0)",
            ));
        }
        self.frame_encoder.check(task.frame_size, "task.frame_size")?;
        let grid = self.frame_encoder.grid(task.frame_size);
        if self.frame_grid == 0 || !grid.is_multiple_of(self.frame_grid) {
            return Err(invalid(
                "model.frame_grid",
                format!(
                    "{}: a frame's tokens average squares of the encoder's {grid}×{grid} grid (at {} px): give a \
                     divisor of {grid}",
                    self.frame_grid, task.frame_size
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !self.adapter.is_empty() && !matches!(self.training()?, Training::Lora { .. }) {
            return Err(invalid(
                "model.adapter",
                format!(
                    "{}: an adapter continues a LoRA run, and this run trains `{}`: give --train lora:RANK (the \
                     adapter's rank)",
                    self.adapter, self.train
                ),
            ));
        }
        for (key, v) in [
            ("model.vocab", self.vocab),
            ("model.width", self.width),
            ("model.depth", self.depth),
            ("model.heads", self.heads),
            ("model.kv_heads", self.kv_heads),
            ("model.ffn", self.ffn),
            ("model.context", self.context),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if !self.width.is_multiple_of(self.heads) || !self.head_width().is_multiple_of(2) {
            return Err(invalid(
                "model.heads",
                format!(
                    "{} heads of width {} {} a width of {}: the heads must divide the width into an even head \
                     width (rotary positions turn pairs of values)",
                    self.heads,
                    self.width as f64 / self.heads as f64,
                    if self.width.is_multiple_of(self.heads) {
                        "make"
                    } else {
                        "do not make"
                    },
                    self.width
                ),
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(invalid(
                "model.kv_heads",
                format!(
                    "{} key and value heads do not divide {} query heads: each must serve the same number",
                    self.kv_heads, self.heads
                ),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(invalid("model.rope_theta", "must be a number above 1 (e.g. 10000)"));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return Err(invalid("model.norm_eps", "must be a positive number (e.g. 1e-5)"));
        }
        if let Training::Frozen(groups) = self.training()?
            && self.tie_head
            && groups.iter().any(|g| g == "head")
        {
            return Err(invalid(
                "model.train",
                "`head` is the embedding in this shape (tie_head): freeze `embedding`",
            ));
        }
        if let Training::Frozen(groups) = self.training()? {
            let has = |g: &str| groups.iter().any(|x| x == g);
            let blocks = has("blocks") || (0..self.depth).all(|i| has(&format!("blocks.{i}")));
            let head = has("head") || (self.tie_head && has("embedding"));
            if blocks && head && has("embedding") && has("final_norm") {
                return Err(invalid(
                    "model.train",
                    format!(
                        "`{}` freezes every group: nothing would train; leave a group out, or train adapters \
                         (lora:RANK)",
                        self.train
                    ),
                ));
            }
        }
        if self.vocab < 2 {
            return Err(invalid(
                "model.vocab",
                format!(
                    "{}: with fewer than 2 tokens every prediction is certain (the loss is 0 from the start): \
                     nothing to learn; give 2 or more",
                    self.vocab
                ),
            ));
        }
        self.check_base()?;
        if !self.weights.is_empty() {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// The tensors a Hugging Face checkpoint of this shape holds: name
    /// and shape (projections `[out, in]`, as `torch.nn.Linear` keeps them).
    pub fn hf_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (w, f, v) = (self.width, self.ffn, self.vocab);
        let kv = self.kv_heads * self.head_width();
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, w])];
        for i in 0..self.depth {
            let at = |name: &str| format!("model.layers.{i}.{name}");
            out.push((at("input_layernorm.weight"), vec![w]));
            for (p, rows) in [("q", w), ("k", kv), ("v", kv), ("o", w)] {
                out.push((at(&format!("self_attn.{p}_proj.weight")), vec![rows, w]));
                if self.qkv_bias && p != "o" {
                    out.push((at(&format!("self_attn.{p}_proj.bias")), vec![rows]));
                }
            }
            out.push((at("post_attention_layernorm.weight"), vec![w]));
            for (p, shape) in [("gate", [f, w]), ("up", [f, w]), ("down", [w, f])] {
                out.push((at(&format!("mlp.{p}_proj.weight")), shape.to_vec()));
            }
        }
        out.push(("model.norm.weight".into(), vec![w]));
        if !self.tie_head {
            out.push(("lm_head.weight".into(), vec![v, w]));
        }
        out
    }

    /// The checkpoint `weights` names, checked against this shape: every
    /// tensor there with its shape, nothing of another model.
    fn checkpoint(&self) -> Result<crate::safetensors::HfWeights, ConfigError> {
        let bad = |why: String| invalid("model.weights", why);
        let path = std::path::Path::new(&self.weights);
        let file = crate::safetensors::HfWeights::open(path).map_err(|e| bad(e.to_string()))?;
        if path.is_dir() {
            hf_config::check(self, path).map_err(|e| bad(e.to_string()))?;
        }
        let expected = self.hf_tensors();
        for (name, shape) in &expected {
            match file.shape(name) {
                None => {
                    return Err(bad(format!(
                        "{}: no tensor `{name}`: not a Llama-family checkpoint of this shape (depth {}, qkv_bias {}, tie_head {})",
                        self.weights, self.depth, self.qkv_bias, self.tie_head
                    )));
                }
                Some(got) if got != shape.as_slice() => {
                    return Err(bad(format!(
                        "{}: `{name}` is {got:?}, this shape's is {shape:?}: the checkpoint is of another shape (set model.width, depth, heads, kv_heads, ffn and vocab to its config.json's)",
                        self.weights
                    )));
                }
                Some(_) => {}
            }
        }
        let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
        // Rotary tables some exports keep, and a tied head's copy, are not weights.
        let extra: Vec<&str> = file
            .names()
            .filter(|n| {
                let ignored = n.ends_with("rotary_emb.inv_freq") || (self.tie_head && *n == "lm_head.weight");
                !(known.contains(n) || ignored)
            })
            .collect();
        if let Some(first) = extra.first() {
            return Err(bad(format!(
                "{}: {} tensor(s) this shape has no place for (`{first}` first): a checkpoint of a deeper or different model",
                self.weights,
                extra.len()
            )));
        }
        Ok(file)
    }

    /// What trains ([`Training`]).
    pub fn training(&self) -> Result<Training, ConfigError> {
        Training::parse(&self.train, self.depth, self.width)
    }

    /// How the frozen base is stored: `base`, or NF4 under `qlora:RANK`
    /// (checked by `validate`: an unknown name, and `search` before the
    /// planner has chosen, read as f32 here).
    pub fn base_storage(&self) -> BaseStorage {
        match BaseStorage::parse(&self.base) {
            Some(storage) => storage,
            None if self.train.starts_with("qlora:") => BaseStorage::Nf4,
            None => BaseStorage::F32,
        }
    }

    /// The base's storage checked against what trains and the shapes.
    fn check_base(&self) -> Result<(), ConfigError> {
        let bad = |why: String| Err(invalid("model.base", why));
        let names: Vec<&str> = BaseStorage::ALL.iter().map(|s| s.name()).collect();
        if self.base == SEARCH_BASE {
            return match self.training()? {
                Training::Lora { .. } if !self.train.starts_with("qlora:") => Ok(()),
                Training::Lora { .. } => bad(format!(
                    "qlora stores the base in nf4; for the planner to choose the base's storage give lora:RANK with \
                     model.base={SEARCH_BASE}"
                )),
                Training::All | Training::Frozen(_) => bad(format!(
                    "model.base={SEARCH_BASE} lets the planner choose how the frozen base is stored, and `{}` does \
                     not freeze the base: give --train lora:RANK",
                    self.train
                )),
            };
        }
        if !self.base.is_empty() && BaseStorage::parse(&self.base).is_none() {
            return bad(format!(
                "`{}` is not a storage type: give one of {}, or {SEARCH_BASE} (the planner chooses)",
                self.base,
                names.join(", ")
            ));
        }
        let storage = self.base_storage();
        if self.train.starts_with("qlora:") && storage != BaseStorage::Nf4 {
            return bad(format!(
                "qlora stores the base in nf4, model.base says {}: give lora:RANK with model.base={}",
                storage.name(),
                storage.name()
            ));
        }
        if storage == BaseStorage::F32 {
            return Ok(());
        }
        match self.training()? {
            Training::Lora { .. } => {}
            Training::All | Training::Frozen(_) => {
                return bad(format!(
                    "a {} base stores frozen weights, and `{}` does not freeze the base: give --train lora:RANK (or \
                     qlora:RANK), which freezes it and trains adapters",
                    storage.name(),
                    self.train
                ));
            }
        }
        if let Some(format) = storage.format() {
            let (w, f) = (self.width, self.ffn);
            let kv = self.kv_heads * self.head_width();
            for (name, count) in [
                ("q_proj and o_proj", w * w),
                ("k_proj and v_proj", w * kv),
                ("gate_proj, up_proj and down_proj", w * f),
            ] {
                if !count.is_multiple_of(vramfit::frozen::BLOCK) {
                    return bad(format!(
                        "{name} hold {count} weights, not a whole number of {}'s blocks of {}: store the base in bf16 \
                         (model.base=bf16) or choose widths whose products are multiples of {}",
                        format_name(format),
                        vramfit::frozen::BLOCK,
                        vramfit::frozen::BLOCK
                    ));
                }
            }
        }
        Ok(())
    }

    /// The network with weights drawn from `seed` (normal, σ 0.02; the
    /// projections into the residual stream σ 0.02/√(2·depth); norms 1),
    /// its parameters frozen and adapters added as `train` says (adapters:
    /// A normal with σ 1/√in, B zero, so the adapted model starts as the
    /// base; scale 1).
    pub fn init<B: Backend>(&self, seed: u64, device: &B::Device) -> Llama<B> {
        // Drawn values are finite and `validate` checked the blocks, so
        // every matrix quantizes.
        let (base, _) = self.base::<B>(&mut Weights::Drawn(Box::new(ChaCha8Rng::seed_from_u64(seed))), device);
        self.adapted(base, seed, device)
    }

    /// [`init`](Self::init) with the base read from the checkpoint
    /// `weights` names (bf16 and f16 values exactly), where it names one.
    /// With `adapter` set, its adapters replace the drawn ones.
    pub fn load<B: Backend>(&self, seed: u64, device: &B::Device) -> Result<Llama<B>, ConfigError> {
        let model = self.load_base(seed, device)?;
        let model = if self.adapter.is_empty() {
            model
        } else {
            peft::apply(model, std::path::Path::new(&self.adapter), self, device)?
        };
        Ok(Llama {
            frames: self.frame_encoder(seed, device),
            ..model
        })
    }

    /// The frame encoder and its projector, where the model reads frames
    /// (the encoder's weights drawn from `seed`; the projector trains).
    fn frame_encoder<B: Backend>(&self, seed: u64, device: &B::Device) -> Option<frames::FrameEncoder<B>> {
        if self.max_frames == 0 {
            return None;
        }
        let e = &self.frame_encoder;
        let width = *e.widths.last()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6672_616d);
        Some(frames::FrameEncoder::new(
            e.build::<B>(seed ^ 0x7669_6465, device),
            crate::vision::LayerNorm::new(width, device),
            crate::vision::Mlp::new(&mut rng, width, self.width, self.width, device),
            self.frame_grid,
            self.max_frames,
        ))
    }

    fn load_base<B: Backend>(&self, seed: u64, device: &B::Device) -> Result<Llama<B>, ConfigError> {
        if self.base == SEARCH_BASE {
            return Err(invalid(
                "model.base",
                "`search` lets the planner choose how the frozen base is stored, and this run has no plan: give \
                 --budget (train), or plan it first (vramfit plan), or name the storage (--base f32, bf16, f16, nf4 \
                 or int8)",
            ));
        }
        if self.weights.is_empty() {
            return Ok(self.init(seed, device));
        }
        let mut read = Weights::Read {
            file: self.checkpoint()?,
            failed: None,
        };
        let (base, quantizing) = self.base::<B>(&mut read, device);
        match (read, quantizing) {
            (Weights::Read { failed: Some(why), .. }, _) => Err(invalid("model.weights", why)),
            (_, Some(why)) => Err(invalid(
                "model.weights",
                format!(
                    "{}: {why}: the base cannot be stored in {} (model.base=bf16 keeps such values as they are)",
                    self.weights,
                    self.base_storage().name()
                ),
            )),
            _ => Ok(self.adapted(base, seed, device)),
        }
    }

    /// `model` frozen and given adapters as `train` says.
    fn adapted<B: Backend>(&self, model: Llama<B>, seed: u64, device: &B::Device) -> Llama<B> {
        match self.training().unwrap_or(Training::All) {
            Training::All => model,
            Training::Lora { rank, mlp } => {
                // The adapters' own stream: the base's weights are the
                // full model's whatever the rank.
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x4c6f_5241);
                let mut model = vramfit::frozen::freeze(model, |_| true);
                for block in &mut model.blocks {
                    let mut adapt = |p: &mut Proj<B>| {
                        let [inputs, outputs] = p.dims();
                        let a = normal(&mut rng, [inputs, rank], 1.0 / (inputs as f64).sqrt(), device);
                        p.lora = Some(Lora::new(a, outputs));
                    };
                    for p in [&mut block.q, &mut block.k, &mut block.v, &mut block.o] {
                        adapt(p);
                    }
                    if mlp {
                        for p in [&mut block.gate, &mut block.up, &mut block.down] {
                            adapt(p);
                        }
                    }
                }
                model
            }
            Training::Frozen(groups) => vramfit::frozen::freeze(model, |path| {
                groups.iter().any(|g| path == g || path.starts_with(&format!("{g}.")))
            }),
        }
    }

    /// The network, its weights drawn or read: every parameter trainable,
    /// or, where `train` freezes the whole base (LoRA), frozen and stored
    /// as `model.base` says (16-bit, or the projections quantized with the
    /// embedding and head in bf16), each tensor as it is made.
    /// The first matrix that could not be quantized is named beside it.
    fn base<B: Backend>(&self, weights: &mut Weights, device: &B::Device) -> (Llama<B>, Option<String>) {
        let (w, kv) = (self.width, self.kv_heads * self.head_width());
        let frozen_base = matches!(self.training(), Ok(Training::Lora { .. })).then(|| self.base_storage());
        // Norms stay f32 under a quantized base (QLoRA's layout), take the
        // base's type under a 16-bit one; tables (embedding, head) take it.
        let vector = |p: Param<Tensor<B, 1>>| match frozen_base {
            Some(storage) if storage.format().is_none() => vramfit::lora::frozen_float(p, storage.float()),
            Some(_) => p.set_require_grad(false),
            None => p,
        };
        // A quantized base's tables in bf16, or f16 where the device has no bf16.
        let tables = match frozen_base {
            Some(storage) if storage.format().is_some() && !B::supports_dtype(device, burn::tensor::DType::BF16) => {
                burn::tensor::FloatDType::F16
            }
            Some(storage) => storage.float(),
            None => burn::tensor::FloatDType::F32,
        };
        let table = |p: Param<Tensor<B, 2>>| match frozen_base {
            Some(_) => vramfit::lora::frozen_float(p, tables),
            None => p,
        };
        // The first matrix that could not be quantized.
        let mut quantizing: Option<String> = None;
        let residual = 0.02 / (2.0 * self.depth as f64).sqrt();
        let blocks = (0..self.depth)
            .map(|i| {
                let at = |name: &str| format!("model.layers.{i}.{name}");
                // A frozen base is stored small as each matrix is made, so the
                // f32 model never exists whole.
                let mut proj = |name: &str, inputs, outputs, std, bias: bool| {
                    let p = Proj::new(
                        weights.matrix(&at(&format!("{name}.weight")), [inputs, outputs], std, device),
                        bias.then(|| weights.vector(&at(&format!("{name}.bias")), outputs, 0.0, device)),
                    );
                    let Some(storage) = frozen_base else {
                        return p;
                    };
                    match p.frozen_as(storage) {
                        Ok(p) => p,
                        Err(e) => {
                            // Drawn weights are finite and `validate` checked the
                            // blocks: a read tensor's values (NaN, ∞) fail here.
                            quantizing.get_or_insert_with(|| format!("`{}`: {e}", at(&format!("{name}.weight"))));
                            Proj::new(
                                Param::from_tensor(Tensor::zeros([inputs, outputs], device)).set_require_grad(false),
                                None,
                            )
                        }
                    }
                };
                let (q, k, v) = (
                    proj("self_attn.q_proj", w, w, 0.02, self.qkv_bias),
                    proj("self_attn.k_proj", w, kv, 0.02, self.qkv_bias),
                    proj("self_attn.v_proj", w, kv, 0.02, self.qkv_bias),
                );
                let o = proj("self_attn.o_proj", w, w, residual, false);
                let (gate, up) = (
                    proj("mlp.gate_proj", w, self.ffn, 0.02, false),
                    proj("mlp.up_proj", w, self.ffn, 0.02, false),
                );
                let down = proj("mlp.down_proj", self.ffn, w, residual, false);
                let mut norm = |name: &str| RmsNorm {
                    weight: vector(weights.vector(&at(name), w, 1.0, device)),
                    eps: self.norm_eps,
                };
                LlamaBlock {
                    attn_norm: norm("input_layernorm.weight"),
                    q,
                    k,
                    v,
                    o,
                    mlp_norm: norm("post_attention_layernorm.weight"),
                    gate,
                    up,
                    down,
                    heads: self.heads,
                    kv_heads: self.kv_heads,
                    rope_theta: self.rope_theta,
                    fused_attention: self.attention == Attention::Fused,
                }
            })
            .collect();
        let embedding = table(weights.table("model.embed_tokens.weight", [self.vocab, w], device));
        let model = Llama {
            loss_chunk: if self.loss_chunk == 0 {
                usize::MAX
            } else {
                self.loss_chunk
            },
            embedding,
            blocks,
            final_norm: RmsNorm {
                weight: vector(weights.vector("model.norm.weight", w, 1.0, device)),
                eps: self.norm_eps,
            },
            head: (!self.tie_head).then(|| table(weights.matrix("lm_head.weight", [w, self.vocab], 0.02, device))),
            frames: None,
        };
        (model, quantizing)
    }
}

fn format_name(format: vramfit::frozen::Format) -> &'static str {
    match format {
        vramfit::frozen::Format::Nf4 => "nf4",
        vramfit::frozen::Format::Int8 => "int8",
    }
}
