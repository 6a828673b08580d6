//! The llm as a model family: its settings' checks and the planner's hooks
//! (slices, sequence tokens, the frozen base's search, the work counted),
//! its data (the synthetic task or a corpus), its held-out evaluation, its
//! summary and its final files (the adapters in PEFT's layout).

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramfit::frozen::BaseStorage;
use vramfit::fused::Attention;
use vramfit::plan::quality::QualityKnob;

use super::{Llama, LlamaConfig, PROBE_TOKENS, SEARCH_BASE, Training, VIDEO_SHAPE, peft, shapes};
use crate::config::{ConfigError, RoughFloats, invalid};
use crate::data::{TaskConfig, TokenBatch};
use crate::tokens::Tokens;

impl crate::family::ModelSettings for LlamaConfig {
    type Task = TaskConfig;
    const NAME: &'static str = "llm";
    const CHECKPOINT_KIND: &'static str = "vramfit.llm.checkpoint";
    const WEIGHTS_KIND: &'static str = "vramfit.llm.weights";
    const LLM_KEY: Option<&'static str> = Some("model");

    fn check(&self, task: &TaskConfig) -> Result<(), ConfigError> {
        self.validate()?;
        if task.tokens < 1 {
            return Err(invalid("task.tokens", "a sample needs at least one token"));
        }
        // The synthetic task's own settings (unused with a corpus).
        if task.data.is_empty() && (task.topics < 1 || !(0.0..=1.0).contains(&task.p_follow)) {
            return Err(invalid(
                "task",
                "the synthetic task's topics must be ≥ 1 and its p_follow in [0, 1]",
            ));
        }
        self.check_frames(task)?;
        if !(0.0..1.0).contains(&task.validation) {
            return Err(invalid(
                "task.validation",
                format!(
                    "{}: the share of the corpus held out is at least 0 and below 1 (e.g. 0.05)",
                    task.validation
                ),
            ));
        }
        if task.eval_sequences < 1 {
            return Err(invalid(
                "task.eval_sequences",
                "an evaluation reads at least one window",
            ));
        }
        if !matches!(task.token_type.as_str(), "" | "u16" | "u32") {
            return Err(invalid(
                "task.token_type",
                format!(
                    "{:?}: `u16`, `u32`, or empty (u16 where the vocabulary fits)",
                    task.token_type
                ),
            ));
        }
        if task.data.is_empty() && !task.tokenizer.is_empty() {
            return Err(invalid(
                "task.tokenizer",
                "a tokenizer reads a text corpus, and no task.data (--data FILE) is given",
            ));
        }
        let frame_tokens = self.frame_tokens(task);
        if task.tokens + frame_tokens > self.context {
            return Err(invalid(
                "task.tokens",
                format!(
                    "{} tokens{} do not fit a context of {}: lower task.tokens or raise model.context",
                    task.tokens,
                    if frame_tokens > 0 {
                        format!(" after {frame_tokens} of frames")
                    } else {
                        String::new()
                    },
                    self.context
                ),
            ));
        }
        Ok(())
    }

    /// The video model's frames at their cap, its frames' side and its text.
    fn named_task(name: &str, task: TaskConfig) -> TaskConfig {
        match name {
            VIDEO_SHAPE => TaskConfig {
                frames: 100,
                frame_size: 224,
                tokens: 256,
                ..task
            },
            _ => task,
        }
    }

    fn named(name: &str) -> Result<Self, ConfigError> {
        let all = shapes();
        all.iter()
            .find(|s| s.name == name)
            .map(|s| s.config.clone())
            .ok_or_else(|| {
                let known: Vec<String> = all.iter().map(|s| format!("{} ({})", s.name, s.source)).collect();
                invalid(
                    "shape",
                    format!("`{name}` is not a known shape; the known ones: {}", known.join(", ")),
                )
            })
    }

    fn activation_lever(&self, task: &TaskConfig) -> Option<String> {
        (self.attention == Attention::Standard && task.tokens >= crate::gpt::FUSED_PAYS_FROM_TOKENS)
            .then(|| "--attention fused (attention's scores recomputed in the backward, never stored)".into())
    }

    fn attention(&self) -> Option<Attention> {
        Some(self.attention)
    }

    /// The frames a sample reads, where it has frames; else its tokens
    /// (in steps of 64 from 128 up).
    fn quality_knob(&self, task: &TaskConfig) -> Option<QualityKnob> {
        if task.frames > 0 && self.max_frames > 0 {
            let asked = task.frames.min(self.max_frames);
            return Some(QualityKnob {
                name: "frames".into(),
                key: "task.frames".into(),
                asked,
                lower: (1..asked).collect(),
            });
        }
        let step = if task.tokens >= 128 { 64 } else { 1 };
        Some(QualityKnob {
            name: "tokens".into(),
            key: "task.tokens".into(),
            asked: task.tokens,
            lower: QualityKnob::multiples_below(task.tokens, step),
        })
    }

    fn check_kept_quality(&self, task: &TaskConfig) -> Result<(), ConfigError> {
        if self.max_frames > 0 && task.frames > self.max_frames {
            return Err(invalid(
                "task.frames",
                format!(
                    "{} frames a sample, above the model's cap of {} (model.max_frames), and keep_quality forbids \
                     reading fewer: lower task.frames to {} or raise model.max_frames",
                    task.frames, self.max_frames, self.max_frames
                ),
            ));
        }
        Ok(())
    }

    fn with_quality(task: &TaskConfig, value: usize) -> Option<TaskConfig> {
        Some(if task.frames > 0 {
            TaskConfig {
                frames: value,
                ..task.clone()
            }
        } else {
            TaskConfig {
                tokens: value,
                ..task.clone()
            }
        })
    }

    /// A 16-bit base in a type the device lacks (wgpu has no bf16). A
    /// quantized base's tables take f16 there instead of bf16.
    fn unsupported_storage(&self, supported: &dyn Fn(burn::tensor::FloatDType) -> bool) -> Option<String> {
        let storage = self.base_storage();
        (storage.format().is_none() && !supported(storage.float())).then(|| {
            format!(
                "a {} base is not supported by this device: store it in f16 (--base f16) or nf4 (--train qlora:RANK)",
                storage.name()
            )
        })
    }

    /// Under LoRA the whole base is frozen and rebuilt from the seed or
    /// `weights` (stored as `base` says): only the adapters (and a frame
    /// encoder's projector and whatever of it trains) are written.
    fn rebuilt_from_settings(&self, path: &str) -> bool {
        matches!(self.training(), Ok(Training::Lora { .. })) && !path.contains(".lora.") && !path.starts_with("frames.")
    }

    fn rebuilt_fingerprint(&self) -> Result<Option<String>, ConfigError> {
        if self.weights.is_empty() || !matches!(self.training(), Ok(Training::Lora { .. })) {
            return Ok(None);
        }
        let file = crate::safetensors::HfWeights::open(std::path::Path::new(&self.weights))
            .map_err(|why| invalid("model.weights", why.to_string()))?;
        file.fingerprint()
            .map(Some)
            .map_err(|why| invalid("model.weights", why.to_string()))
    }

    fn with_attention(self, attention: Attention) -> Self {
        Self { attention, ..self }
    }

    /// Under `search`, and under LoRA where no base is named (a run
    /// without a plan then stores it in f32): f32, the two 16-bit types
    /// (the device keeps the first it has) and NF4 where the matrices are
    /// whole blocks of 64. Not int8: it saves less than a 16-bit base
    /// halves again, and QLoRA's practice is NF4 (int8 stays a setting).
    fn bases_to_search(&self) -> Vec<BaseStorage> {
        let unnamed_lora = self.base.is_empty()
            && !self.train.starts_with("qlora:")
            && matches!(self.training(), Ok(Training::Lora { .. }));
        if self.base != SEARCH_BASE && !unnamed_lora {
            return Vec::new();
        }
        [BaseStorage::F32, BaseStorage::Bf16, BaseStorage::F16, BaseStorage::Nf4]
            .into_iter()
            .filter(|&b| self.clone().with_base(b).check_base().is_ok())
            .collect()
    }

    fn with_base(self, base: BaseStorage) -> Self {
        Self {
            base: base.name().into(),
            ..self
        }
    }

    fn blocks(&self) -> usize {
        self.depth
    }

    /// Blocks repeat unless `train` freezes single blocks (then they differ).
    fn with_blocks(&self, blocks: usize) -> Option<Self> {
        let single = matches!(self.training(), Ok(Training::Frozen(g)) if g.iter().any(|g| g.starts_with("blocks.")));
        // A slice draws its weights: a probe's bytes do not depend on
        // their values, and the checkpoint is the whole depth's.
        (!single).then(|| Self {
            depth: blocks,
            weights: String::new(),
            ..self.clone()
        })
    }

    /// Two blocks, whenever the model has more: a Llama is planned from a
    /// slice, so what is predicted is always the extrapolation.
    fn default_probe_blocks(&self) -> Option<usize> {
        (self.depth > 2 && self.with_blocks(2).is_some()).then_some(2)
    }

    /// Not where frames come before the text (a sample's sequence is then
    /// not its text's tokens).
    fn sequence_tokens(task: &TaskConfig) -> Option<usize> {
        (task.frames == 0).then_some(task.tokens)
    }

    fn with_sequence_tokens(task: &TaskConfig, tokens: usize) -> Option<TaskConfig> {
        Some(TaskConfig { tokens, ..task.clone() })
    }

    /// 128 tokens, where a sample has 512 or more: the law in tokens is
    /// fitted through 128 and 256 (its check measured in
    /// docs/results/llm.md).
    fn default_probe_tokens(&self, task: &TaskConfig) -> Option<usize> {
        (task.tokens >= 512 && task.frames == 0).then_some(PROBE_TOKENS)
    }

    /// Each block's projections (and adapters), its attention over all
    /// heads, the head's matrix (tied or not, it is a product a token).
    fn work(&self, task: &TaskConfig) -> Option<vramfit::plan::Work> {
        let [w, f, kv] = [self.width, self.ffn, self.kv_heads * self.head_width()].map(|x| x as u64);
        let adapters = self.adapter_parameters() / self.depth.max(1) as u64;
        let block = 2 * w * w + 2 * w * kv + 3 * w * f + adapters;
        Some(vramfit::plan::Work::decoder(
            task.tokens,
            block,
            self.width,
            w * self.vocab as u64,
        ))
    }

    fn rough_floats(&self, task: &TaskConfig) -> RoughFloats {
        let [w, d, v, f] = [self.width, self.depth, self.vocab, self.ffn].map(|x| x as f64);
        let t = (task.tokens + self.frame_tokens(task)) as f64;
        let scores = match self.attention {
            Attention::Standard => 2.0 * self.heads as f64 * t * t,
            _ => 0.0,
        };
        RoughFloats {
            parameters: (self.parameters() + self.adapter_parameters() + self.frame_parameters()) as f64,
            frozen: self.frozen_parameters() as f64,
            frozen_bytes_each: self.frozen_bytes() as f64 / self.frozen_parameters().max(1) as f64,
            // A block keeps some ten widths and four hidden widths a
            // position, the scores twice a head; the logits thrice.
            activations_per_sample: d * (t * (10.0 * w + 4.0 * f) + scores) + 3.0 * t * v,
            // The logits exist whole only without the chunked loss (a chunk's
            // are a fixed, small tensor then).
            largest_per_sample: crate::config::largest(&[
                (scores / 2.0, "a block's attention scores"),
                (if self.loss_chunk == 0 { t * v } else { 0.0 }, "the logits"),
                (t * f, "the MLP's hidden activations"),
            ]),
            task: task.topics as f64 * v,
        }
    }
}

impl crate::family::Family<3> for LlamaConfig {
    type Net<B: AutodiffBackend> = Llama<B>;
    type Data = Tokens;

    fn init<B: AutodiffBackend>(&self, seed: u64, device: &B::Device) -> Result<Llama<B>, ConfigError> {
        self.load(seed, device)
    }

    fn data(&self, task: &TaskConfig) -> Result<Tokens, ConfigError> {
        crate::tokens::open(task, self.vocab, &self.weights).map_err(|e| invalid("task.data", e.to_string()))
    }

    fn batch<B: AutodiffBackend>(data: &Tokens, step: u64, size: usize, device: &B::Device) -> TokenBatch<B> {
        data.batch::<B>(step, size, device)
    }

    /// Under LoRA, the adapters in PEFT's layout.
    fn files<B: AutodiffBackend>(&self, net: &Llama<B>) -> Result<Vec<(String, Vec<u8>)>, String> {
        peft::export(net, self).map_err(|e| format!("the adapters in PEFT's layout: {e}"))
    }

    fn data_fingerprint(data: &Tokens) -> Option<String> {
        match data {
            Tokens::Corpus(c) => Some(c.fingerprint().to_string()),
            Tokens::Synthetic(_) => None,
        }
    }

    fn evaluate_every(task: &TaskConfig) -> u64 {
        task.eval_every
    }

    /// The mean next-token loss over the held-out windows and its
    /// perplexity (a corpus's; the synthetic task has its floor instead),
    /// without autodiff.
    fn evaluate<B: AutodiffBackend>(
        data: &Tokens,
        net: &Llama<B>,
        micro_batch: usize,
        autocast: &vramfit::precision::Autocast,
        device: &B::Device,
    ) -> Vec<(String, f64)> {
        let Tokens::Corpus(corpus) = data else {
            return Vec::new();
        };
        use burn::module::AutodiffModule;
        let net = net.valid();
        let (mut sum, mut windows) = (0.0f64, 0usize);
        for batch in corpus.held_out::<B::InnerBackend>(micro_batch.max(1), device) {
            let n = batch.tokens.dims()[0];
            // Every window has the same tokens: the mean of the windows'
            // means is the mean over tokens.
            let loss: f32 = net.loss(&batch, autocast).into_scalar().elem();
            sum += loss as f64 * n as f64;
            windows += n;
        }
        if windows == 0 {
            return Vec::new();
        }
        let loss = sum / windows as f64;
        vec![("val_loss".into(), loss), ("val_perplexity".into(), loss.exp())]
    }

    fn block_input_bytes(&self, task: &TaskConfig) -> u64 {
        (task.tokens * self.width * 4) as u64
    }

    fn summary<B: AutodiffBackend>(
        &self,
        data: &Tokens,
        net: &Llama<B>,
        batch_size: usize,
        _: usize,
        median_step_ms: f64,
        _: &B::Device,
    ) -> serde_json::Map<String, serde_json::Value> {
        let mut out = crate::data::token_summary(data, batch_size, median_step_ms);
        if let Tokens::Corpus(c) = data {
            let (training, held_out) = c.windows();
            out.insert("data_tokens".into(), c.id_count().into());
            out.insert("training_windows".into(), training.into());
            out.insert("held_out_windows".into(), held_out.into());
            out.insert("evaluated_windows".into(), c.evaluated().into());
        }
        // What trains and what is frozen (no gradient, no moments), as stored.
        let params = vramfit::params::describe(net);
        let bytes = |trainable: bool| -> u64 {
            params
                .iter()
                .filter(|p| p.trainable == trainable)
                .map(|p| p.bytes())
                .sum()
        };
        // Counted from the settings: a quantized matrix is codes, not floats.
        out.insert(
            "parameters".into(),
            (self.parameters() + self.adapter_parameters() + self.frame_parameters()).into(),
        );
        out.insert("trainable_bytes".into(), bytes(true).into());
        // Quantized codes are integer parameters, outside `describe`'s floats.
        out.insert(
            "frozen_bytes".into(),
            (bytes(false) + vramfit::frozen::code_bytes(net)).into(),
        );
        out.insert("base".into(), self.base_storage().name().into());
        out
    }
}
