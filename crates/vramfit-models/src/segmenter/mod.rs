//! A segmenter on an LLM (`vramfit train segmenter`), as LISA and PRS-Med
//! build one: an image encoder ([`crate::vision`]) whose tokens, pooled
//! and projected, an LLM of the Llama family reads ahead of a prompt; the
//! LLM's last position, projected, prompts SAM's mask decoder
//! ([`mask_decoder`]) over the encoder's image embedding, to a mask at the
//! image's resolution; the loss is binary cross-entropy plus Dice. The LLM
//! is any of the llm family's settings: frozen with LoRA adapters, its
//! base stored in 16 bits or NF4 ([`vramfit::frozen`]), or trained. Named
//! shapes: `prs-med` (TinySAM's encoder and Mistral-7B at 1024 px) and the
//! tiny default. The task is synthetic ([`data`]): discs of colours, a
//! prompt naming one, its mask.

use burn::module::Param;
use burn::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::config::{ConfigError, invalid};
use crate::llama::LlamaConfig;
use crate::vision::{LayerNorm, Mlp, VisionConfig};

pub mod data;
mod family;
pub mod folder;
pub mod mask_decoder;
pub mod model;
pub mod source;

pub use data::{SegBatch, Synthetic};
pub use family::held_out_dice;
pub use mask_decoder::MaskDecoderConfig;
pub use model::{SegBlock, Segmenter};
pub use source::SegData;

/// A training run of the segmenter.
pub type SegmenterTrainConfig = crate::config::FamilyConfig<SegmenterConfig>;

/// The `[model]` settings of `vramfit train segmenter`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SegmenterConfig {
    /// The image encoder.
    pub encoder: VisionConfig,
    /// The LLM (the llm family's settings: `train`, `base`, `attention`…).
    pub llm: LlamaConfig,
    /// The mask decoder.
    pub decoder: MaskDecoderConfig,
    /// Side of the grid of image tokens the LLM reads: the encoder's grid
    /// averaged over squares to it (it must divide the encoder's grid).
    pub llm_grid: usize,
}

impl Default for SegmenterConfig {
    /// A tiny segmenter for tests and small runs.
    fn default() -> Self {
        Self {
            encoder: VisionConfig::default(),
            llm: LlamaConfig {
                vocab: 16,
                width: 32,
                depth: 2,
                heads: 4,
                kv_heads: 2,
                ffn: 64,
                context: 64,
                ..Default::default()
            },
            decoder: MaskDecoderConfig {
                depth: 1,
                heads: 2,
                mlp: 64,
                cross_downsample: 2,
            },
            llm_grid: 2,
        }
    }
}

/// The `[task]` of `vramfit train segmenter`: the synthetic task.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SegmenterTask {
    /// Side of the images and masks, pixels.
    pub image: usize,
    /// Tokens of a prompt.
    pub prompt: usize,
    /// Colours in the palette (each a prompt's class).
    pub classes: usize,
    /// Discs an image.
    pub objects: usize,
    /// Seed of every batch.
    pub seed: u64,
    /// Steps between evaluations of the Dice on held-out images (0: the
    /// final one only, in `summary.json`).
    pub eval_every: u64,
    /// Held-out images an evaluation reads.
    pub eval_images: usize,
    /// A folder of images and masks to train on instead of the synthetic
    /// task ([`folder`]: `images/` and `masks/`); empty: the synthetic task.
    pub data: String,
}

impl Default for SegmenterTask {
    fn default() -> Self {
        Self {
            image: 32,
            prompt: 4,
            classes: 4,
            objects: 2,
            seed: 7,
            eval_every: 0,
            eval_images: 16,
            data: String::new(),
        }
    }
}

/// The named segmenters: (name, source, settings).
pub fn shapes() -> Vec<(&'static str, &'static str, SegmenterConfig)> {
    let mistral = <LlamaConfig as crate::family::ModelSettings>::named("mistral-7b").expect("a known shape");
    vec![(
        "prs-med",
        "PRS-Med's system: TinySAM's encoder at 1024 px, Mistral-7B (LLaVA-Med's) with LoRA of rank 16 reading \
         16×16 pooled image tokens, SAM's mask decoder",
        SegmenterConfig {
            encoder: VisionConfig::named("tinysam").expect("a known encoder"),
            llm: LlamaConfig {
                train: "lora:16".into(),
                ..mistral
            },
            decoder: MaskDecoderConfig::default(),
            llm_grid: 16,
        },
    )]
}

impl SegmenterConfig {
    /// The encoder's grid for images of side `image`.
    pub fn grid(&self, image: usize) -> usize {
        self.encoder.grid(image)
    }

    /// Checks the settings against the task.
    pub fn check_task(&self, task: &SegmenterTask) -> Result<(), ConfigError> {
        self.encoder.check(task.image, "task.image")?;
        self.llm.validate()?;
        let d = self.encoder.neck;
        if !d.is_multiple_of(8) || !d.is_multiple_of(self.decoder.heads.max(1)) {
            return Err(invalid(
                "model.encoder.neck",
                format!(
                    "{d}: the mask decoder works at the neck's width, which its upscaling divides by 8 and its {} \
                     heads must divide",
                    self.decoder.heads
                ),
            ));
        }
        let inner = d / self.decoder.cross_downsample.max(1);
        if self.decoder.cross_downsample == 0 || !inner.is_multiple_of(self.decoder.heads) {
            return Err(invalid(
                "model.decoder.cross_downsample",
                format!(
                    "the cross-attention's inner width {d}/{} must be whole and divided by {} heads",
                    self.decoder.cross_downsample, self.decoder.heads
                ),
            ));
        }
        for (key, v) in [
            ("model.decoder.depth", self.decoder.depth),
            ("model.decoder.heads", self.decoder.heads),
            ("model.decoder.mlp", self.decoder.mlp),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        let grid = self.grid(task.image);
        if self.llm_grid == 0 || !grid.is_multiple_of(self.llm_grid) {
            return Err(invalid(
                "model.llm_grid",
                format!(
                    "{}: the LLM's grid of image tokens averages squares of the encoder's {grid}×{grid} grid (at \
                     {} px): give a divisor of {grid}",
                    self.llm_grid, task.image
                ),
            ));
        }
        if task.prompt < 2 {
            return Err(invalid(
                "task.prompt",
                "a prompt holds a start token and a class: at least 2",
            ));
        }
        if task.classes < 1 || task.objects < 1 || task.objects > task.classes {
            return Err(invalid(
                "task.objects",
                format!(
                    "{} discs of {} colours: at least one disc, and no more discs than colours",
                    task.objects, task.classes
                ),
            ));
        }
        if task.image < 8 {
            return Err(invalid("task.image", "an image is at least 8 px wide"));
        }
        if self.llm.vocab < 2 + task.classes {
            return Err(invalid(
                "model.llm.vocab",
                format!(
                    "{} tokens cannot name {} classes after the start token: at least {}",
                    self.llm.vocab,
                    task.classes,
                    2 + task.classes
                ),
            ));
        }
        let tokens = self.llm_grid * self.llm_grid + task.prompt;
        if tokens > self.llm.context {
            return Err(invalid(
                "model.llm.context",
                format!(
                    "{tokens} tokens ({}² image tokens and a prompt of {}) do not fit a context of {}",
                    self.llm_grid, task.prompt, self.llm.context
                ),
            ));
        }
        if !task.data.is_empty() && self.encoder.channels != 3 {
            return Err(invalid(
                "model.encoder.channels",
                format!(
                    "{}: a folder's images are read as RGB: 3 channels",
                    self.encoder.channels
                ),
            ));
        }
        if task.eval_images < 1 {
            return Err(invalid("task.eval_images", "an evaluation reads at least one image"));
        }
        Ok(())
    }

    /// Parameters of the whole model (the LLM's without its head).
    pub fn parameters(&self) -> u64 {
        let wl = self.llm.width as u64;
        let head = if self.llm.tie_head {
            0
        } else {
            wl * self.llm.vocab as u64
        };
        self.llm.parameters() - head + self.own_parameters()
    }

    /// Parameters outside the LLM: the encoder, the bridge, the prompt
    /// block and the mask decoder.
    pub fn own_parameters(&self) -> u64 {
        let d = self.encoder.neck as u64;
        let we = *self.encoder.widths.last().unwrap_or(&0) as u64;
        let wl = self.llm.width as u64;
        let bridge = we * d + d + 2 * d + d * wl + wl + wl * wl + wl;
        let inner = d / self.decoder.cross_downsample.max(1) as u64;
        let attn = |i: u64| 3 * (d * i + i) + i * d + d;
        let m = self.decoder.mlp as u64;
        let layer = attn(d) + 2 * attn(inner) + (2 * d * m + m + d) + 8 * d;
        // The last attention and its norm, the two 3×3 convolutions with
        // the norm between them, the mask token's MLP.
        let upscale = (9 * d * d / 4 + d / 4) + d / 2 + (9 * (d / 4) * (d / 8) + d / 8);
        let head = attn(inner) + 2 * d + upscale + (d * d + d) + (d * d / 8 + d / 8);
        let prompt = wl * d + d + d;
        self.encoder.parameters() + bridge + self.decoder.depth as u64 * layer + head + prompt
    }

    /// The model (for square images of any side [`check_task`](Self::check_task)
    /// accepts), weights drawn from `seed` (the LLM's read from its
    /// checkpoint where it names one).
    pub fn load<B: Backend>(&self, seed: u64, device: &B::Device) -> Result<Segmenter<B>, ConfigError> {
        // No LM head: the segmenter reads the LLM's last position only.
        let llm = LlamaConfig {
            tie_head: true,
            ..self.llm.clone()
        }
        .load::<B>(seed, device)?;
        let (patch, layers) = self.encoder.build::<B>(seed ^ 0x7669_7369, device);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d61_736b);
        let d = self.encoder.neck;
        let we = *self.encoder.widths.last().expect("checked: a stage");
        let wl = self.llm.width;
        let bridge = model::Bridge::new(
            crate::vision::layers::projection(&mut rng, we, d, device),
            LayerNorm::new(d, device),
            Mlp::new(&mut rng, d, wl, wl, device),
            self.llm_grid,
        );
        let prompt = model::PromptBlock::new(
            llm.final_norm,
            crate::vision::layers::projection(&mut rng, wl, d, device),
            Param::from_tensor(crate::gpt::normal(&mut rng, [1, 1, d], 1.0, device).val()),
        );
        let mut blocks: Vec<SegBlock<B>> = layers.into_iter().map(SegBlock::Vision).collect();
        blocks.push(SegBlock::Bridge(bridge));
        blocks.extend(llm.blocks.into_iter().map(SegBlock::Llm));
        blocks.push(SegBlock::Prompt(prompt));
        for _ in 0..self.decoder.depth {
            blocks.push(SegBlock::TwoWay(mask_decoder::TwoWayLayer::new(
                &mut rng,
                &self.decoder,
                d,
                device,
            )));
        }
        blocks.push(SegBlock::Join(model::Join));
        Ok(Segmenter {
            patch,
            embedding: llm.embedding,
            blocks,
            head: mask_decoder::MaskHead::new(&mut rng, &self.decoder, d, device),
        })
    }

    /// Links of the chain.
    pub fn chain_blocks(&self) -> usize {
        let merges = self
            .encoder
            .widths
            .iter()
            .enumerate()
            .filter(|&(i, &w)| self.encoder.strides[i] == 2 || i > 0 && self.encoder.widths[i - 1] != w)
            .count();
        merges + self.encoder.depths.iter().sum::<usize>() + 1 + self.llm.depth + 1 + self.decoder.depth + 1
    }
}
