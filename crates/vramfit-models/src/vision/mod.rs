//! Image encoders (`[model.encoder]` of `vramfit train segmenter`): a patch
//! embedding, then stages of pre-norm transformer blocks over the token
//! grid, each stage's attention global or within windows, a 2×2 merge
//! halving the grid where a stage's stride is 2. Named shapes
//! ([`VisionConfig::named`]): TinySAM's encoder (TinyViT-5M's stages at
//! 1024 px, to a 64×64 grid and SAM's 256-wide neck) and CLIP's ViT-L/14 at
//! 336 px. What trains is a setting: everything, nothing (`frozen`), or
//! LoRA adapters on the attention's queries and values (`lora:RANK`).

use burn::module::Module;
use burn::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use vramfit::activation_checkpointing::Block;
use vramfit::precision::Autocast;

use crate::config::{ConfigError, invalid};

mod encoder;
pub(crate) mod layers;

pub use encoder::{PatchEmbed, PatchMerge, VisionBlock};
pub(crate) use layers::side;
pub use layers::{LayerNorm, Mlp, MultiHead};

/// An encoder's shape and what of it trains.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VisionConfig {
    /// Image channels.
    pub channels: usize,
    /// Side of a patch, in pixels (the embedding's kernel and stride).
    pub patch: usize,
    /// Width of each stage.
    pub widths: Vec<usize>,
    /// Blocks of each stage.
    pub depths: Vec<usize>,
    /// Attention heads of each stage.
    pub heads: Vec<usize>,
    /// Side of each stage's attention windows, in tokens (0: global).
    pub windows: Vec<usize>,
    /// 1, or 2 where the stage starts by merging 2×2 tokens (halving the grid);
    /// a stage that widens at stride 1 starts with a projection of each token.
    pub strides: Vec<usize>,
    /// The MLP's hidden width over the block's.
    pub mlp_ratio: usize,
    /// Width of the image embedding the encoder hands on (SAM's neck).
    pub neck: usize,
    /// `all`, `frozen`, or `lora:RANK` (adapters on queries and values,
    /// the rest frozen).
    pub train: String,
}

impl Default for VisionConfig {
    /// A tiny two-stage encoder for tests and small runs.
    fn default() -> Self {
        Self {
            channels: 3,
            patch: 4,
            widths: vec![16, 32],
            depths: vec![1, 1],
            heads: vec![2, 2],
            windows: vec![2, 0],
            strides: vec![1, 2],
            mlp_ratio: 4,
            neck: 32,
            train: "all".into(),
        }
    }
}

/// What trains in an encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionTraining {
    /// Every parameter.
    All,
    /// None.
    Frozen,
    /// Adapters of this rank on the queries and values.
    Lora(usize),
}

/// An encoder's layer in the chain: a transformer block or a merge (of
/// different sizes: see [`crate::segmenter::SegBlock`]).
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum VisionLayer<B: Backend> {
    /// A transformer block.
    Attention(VisionBlock<B>),
    /// A 2×2 merge.
    Merge(PatchMerge<B>),
}

impl<B: Backend> Block<B, 3> for VisionLayer<B> {
    fn forward(&self, x: Tensor<B, 3>, ac: &Autocast) -> Tensor<B, 3> {
        match self {
            Self::Attention(b) => b.forward(x, ac),
            Self::Merge(m) => m.forward(x, ac),
        }
    }
}

impl VisionConfig {
    /// The named encoders: (name, source, settings).
    pub fn named(name: &str) -> Result<Self, ConfigError> {
        let all = Self::shapes();
        all.iter()
            .find(|(n, ..)| *n == name)
            .map(|(.., c)| c.clone())
            .ok_or_else(|| {
                let known: Vec<String> = all.iter().map(|(n, s, _)| format!("{n} ({s})")).collect();
                invalid(
                    "encoder",
                    format!("`{name}` is not a known encoder; the known ones: {}", known.join(", ")),
                )
            })
    }

    /// Every named encoder.
    pub fn shapes() -> Vec<(&'static str, &'static str, Self)> {
        vec![
            (
                "tinysam",
                "TinySAM's encoder: TinyViT-5M's stage widths, depths, heads and windows at 1024 px to a 64×64 \
                 grid, SAM's 256-wide neck; its first stage's convolution blocks taken as windowed attention",
                Self {
                    channels: 3,
                    patch: 4,
                    widths: vec![64, 128, 160, 320],
                    depths: vec![2, 2, 6, 2],
                    heads: vec![2, 4, 5, 10],
                    windows: vec![7, 7, 14, 7],
                    strides: vec![1, 2, 2, 1],
                    mlp_ratio: 4,
                    neck: 256,
                    train: "all".into(),
                },
            ),
            (
                "clip-l14-336",
                "CLIP ViT-L/14 at 336 px: 24 blocks 1,024 wide, 16 heads, 576 tokens",
                Self {
                    channels: 3,
                    patch: 14,
                    widths: vec![1024],
                    depths: vec![24],
                    heads: vec![16],
                    windows: vec![0],
                    strides: vec![1],
                    mlp_ratio: 4,
                    neck: 1024,
                    train: "frozen".into(),
                },
            ),
            (
                "vit-tiny16",
                "ViT-Ti/16: 12 blocks 192 wide, 3 heads, patches of 16 px",
                Self {
                    channels: 3,
                    patch: 16,
                    widths: vec![192],
                    depths: vec![12],
                    heads: vec![3],
                    windows: vec![0],
                    strides: vec![1],
                    mlp_ratio: 4,
                    neck: 192,
                    train: "frozen".into(),
                },
            ),
        ]
    }

    /// What trains.
    pub fn training(&self) -> Result<VisionTraining, ConfigError> {
        match self.train.as_str() {
            "all" => Ok(VisionTraining::All),
            "frozen" => Ok(VisionTraining::Frozen),
            t => match t.strip_prefix("lora:").map(str::parse::<usize>) {
                Some(Ok(r)) if r >= 1 => Ok(VisionTraining::Lora(r)),
                _ => Err(invalid(
                    "model.encoder.train",
                    format!("{t:?}: `all`, `frozen` or `lora:RANK` (RANK ≥ 1)"),
                )),
            },
        }
    }

    /// Pixels a token of the last stage covers.
    pub fn reduction(&self) -> usize {
        self.patch * self.strides.iter().product::<usize>()
    }

    /// Side of the last stage's grid for an image of side `image`.
    pub fn grid(&self, image: usize) -> usize {
        image / self.reduction()
    }

    /// Checks the shape against an image of side `image` (the setting
    /// `image_key`).
    pub fn check(&self, image: usize, image_key: &'static str) -> Result<(), ConfigError> {
        self.training()?;
        let stages = self.widths.len();
        if stages == 0 {
            return Err(invalid("model.encoder.widths", "an encoder has at least one stage"));
        }
        for (key, list) in [
            ("model.encoder.depths", &self.depths),
            ("model.encoder.heads", &self.heads),
            ("model.encoder.windows", &self.windows),
            ("model.encoder.strides", &self.strides),
        ] {
            if list.len() != stages {
                return Err(invalid(
                    key,
                    format!(
                        "{} entries for {stages} stages (model.encoder.widths): one a stage",
                        list.len()
                    ),
                ));
            }
        }
        for (i, (&w, &h)) in self.widths.iter().zip(&self.heads).enumerate() {
            if w == 0 || h == 0 || !w.is_multiple_of(h) {
                return Err(invalid(
                    "model.encoder.heads",
                    format!("stage {i}: {h} heads do not divide a width of {w}"),
                ));
            }
        }
        if let Some(s) = self.strides.iter().find(|&&s| s != 1 && s != 2) {
            return Err(invalid(
                "model.encoder.strides",
                format!("{s}: a stage's stride is 1 or 2"),
            ));
        }
        for (key, v) in [
            ("model.encoder.channels", self.channels),
            ("model.encoder.patch", self.patch),
            ("model.encoder.mlp_ratio", self.mlp_ratio),
            ("model.encoder.neck", self.neck),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        let reduction = self.reduction();
        if image == 0 || !image.is_multiple_of(reduction) {
            return Err(invalid(
                image_key,
                format!(
                    "an image of {image} px is not a whole number of the encoder's tokens: its patch of {} px and \
                     the stages' merges make a token {reduction} px wide; give an image side that is a multiple of \
                     {reduction}",
                    self.patch
                ),
            ));
        }
        Ok(())
    }

    /// Parameters of the encoder (its neck is the bridge's).
    pub fn parameters(&self) -> u64 {
        let mut n = (self.channels * self.patch * self.patch * self.widths[0] + self.widths[0]) as u64;
        let mut previous = self.widths[0];
        for (i, &w) in self.widths.iter().enumerate() {
            if self.strides[i] == 2 || previous != w {
                let merged = self.strides[i] * self.strides[i] * previous;
                n += (2 * merged + merged * w + w) as u64;
            }
            let hidden = w * self.mlp_ratio;
            let block = 4 * (w * w + w) + (w * hidden + hidden) + (hidden * w + w) + 4 * w;
            n += (self.depths[i] * block) as u64;
            previous = w;
        }
        n
    }

    /// The patch embedding and the layers (for square images of any side
    /// [`check`](Self::check) accepts), weights drawn from `seed`, frozen or
    /// adapted as `train` says.
    pub fn build<B: Backend>(&self, seed: u64, device: &B::Device) -> (PatchEmbed<B>, Vec<VisionLayer<B>>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let patch = PatchEmbed::new(&mut rng, self.channels, self.patch, self.widths[0], device);
        let mut layers = Vec::new();
        let mut previous = self.widths[0];
        for (i, &w) in self.widths.iter().enumerate() {
            // A stage starts with a merge where it halves the grid or widens
            // it (TinyViT's last stage widens at stride 1).
            if self.strides[i] == 2 || previous != w {
                let stride = self.strides[i];
                layers.push(VisionLayer::Merge(PatchMerge::new(
                    &mut rng, previous, w, stride, device,
                )));
            }
            for _ in 0..self.depths[i] {
                layers.push(VisionLayer::Attention(VisionBlock::new(
                    &mut rng,
                    w,
                    self.heads[i],
                    w * self.mlp_ratio,
                    self.windows[i],
                    device,
                )));
            }
            previous = w;
        }
        match self.training().unwrap_or(VisionTraining::All) {
            VisionTraining::All => (patch, layers),
            VisionTraining::Frozen => (
                vramfit::frozen::freeze(patch, |_| true),
                layers
                    .into_iter()
                    .map(|l| vramfit::frozen::freeze(l, |_| true))
                    .collect(),
            ),
            VisionTraining::Lora(rank) => {
                // The adapters' own stream: the encoder's weights are the
                // same whatever the rank.
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5669_5421);
                let layers = layers
                    .into_iter()
                    .map(|l| match vramfit::frozen::freeze(l, |_| true) {
                        VisionLayer::Attention(mut b) => {
                            b.attn.q = adapted(&mut rng, b.attn.q, rank, device);
                            b.attn.v = adapted(&mut rng, b.attn.v, rank, device);
                            VisionLayer::Attention(b)
                        }
                        merge => merge,
                    })
                    .collect();
                (vramfit::frozen::freeze(patch, |_| true), layers)
            }
        }
    }
}

/// `p` with a fresh adapter of rank `rank` (A drawn as PEFT's default
/// does, B zero: the adapted projection starts as the frozen one).
fn adapted<B: Backend>(
    rng: &mut ChaCha8Rng,
    p: vramfit::lora::Projection<B>,
    rank: usize,
    device: &B::Device,
) -> vramfit::lora::Projection<B> {
    let [inputs, outputs] = p.dims();
    let a = crate::gpt::normal(rng, [inputs, rank], (1.0 / inputs as f64).sqrt(), device);
    p.adapt(vramfit::lora::Lora::new(a, outputs))
}
