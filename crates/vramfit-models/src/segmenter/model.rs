//! The segmenter as one chain for the composed step: the prelude embeds
//! the image's patches and the prompt's tokens; then the encoder's layers
//! (over the image tokens), the bridge (SAM's neck to the image embedding;
//! the embedding pooled to the LLM's grid and projected into the LLM's
//! width, LLaVA's two-layer projector, ahead of the prompt), the LLM's
//! blocks, the prompt block (the LLM's last position normed and projected:
//! with a learned mask token, the decoder's two tokens), the two-way
//! layers, and the join that hands the head one tensor. Every link is a
//! block, so any of them may be checkpointed; the stack between them holds
//! the prompt beside the image tokens, then the image embedding beside the
//! sequence, then beside the decoder's tokens.

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramfit::activation_checkpointing::Block;
use vramfit::lora::Projection;
use vramfit::precision::Autocast;
use vramfit::step::Trainable;

use super::data::SegBatch;
use super::mask_decoder::{MaskHead, TwoWayLayer, mask_loss};
use crate::llama::{LlamaBlock, RmsNorm};
use crate::vision::{LayerNorm, Mlp, PatchEmbed, VisionLayer};

/// The neck and the projector: `[prompt, image tokens]` → `[image
/// embedding, image tokens in the LLM's width ++ prompt]`.
#[derive(Module, Debug)]
pub struct Bridge<B: Backend> {
    /// Encoder width → neck width.
    pub neck: Projection<B>,
    /// After it.
    pub neck_norm: LayerNorm<B>,
    /// Neck width → the LLM's, two layers with GELU between.
    pub projector: Mlp<B>,
    llm_grid: usize,
}

impl<B: Backend> Bridge<B> {
    pub(crate) fn new(neck: Projection<B>, neck_norm: LayerNorm<B>, projector: Mlp<B>, llm_grid: usize) -> Self {
        Self {
            neck,
            neck_norm,
            projector,
            llm_grid,
        }
    }
}

impl<B: Backend> Block<B, 3> for Bridge<B> {
    fn forward_stack(&self, mut stack: Vec<Tensor<B, 3>>, ac: &Autocast) -> Vec<Tensor<B, 3>> {
        let tokens = stack.pop().expect("the bridge's stack holds the image tokens");
        let prompt = ac.full(stack.pop().expect("the bridge's stack holds the prompt"));
        let image = self.neck_norm.forward(self.neck.forward(tokens, ac), ac);
        let [b, n, d] = image.dims();
        // The embedding averaged over k×k tokens to the LLM's grid.
        let (g, s) = (crate::vision::side(n), self.llm_grid);
        let k = g / s;
        let pooled = if k == 1 {
            image.clone()
        } else {
            image
                .clone()
                .reshape([b, s, k, s, k, d])
                .mean_dim(4)
                .mean_dim(2)
                .reshape([b, s * s, d])
        };
        let seen = ac.full(self.projector.forward(pooled, ac));
        stack.push(image);
        stack.push(Tensor::cat(vec![seen, prompt], 1));
        stack
    }
}

/// The LLM's answer as the decoder's prompt: `[image, sequence]` →
/// `[image, (mask token, last position normed and projected)]`.
#[derive(Module, Debug)]
pub struct PromptBlock<B: Backend> {
    /// The LLM's final norm.
    pub final_norm: RmsNorm<B>,
    /// LLM width → the decoder's.
    pub to_decoder: Projection<B>,
    /// SAM's mask token, `[1, 1, d]`.
    pub mask_token: Param<Tensor<B, 3>>,
}

impl<B: Backend> PromptBlock<B> {
    pub(crate) fn new(final_norm: RmsNorm<B>, to_decoder: Projection<B>, mask_token: Param<Tensor<B, 3>>) -> Self {
        Self {
            final_norm,
            to_decoder,
            mask_token,
        }
    }
}

impl<B: Backend> Block<B, 3> for PromptBlock<B> {
    fn forward_stack(&self, mut stack: Vec<Tensor<B, 3>>, ac: &Autocast) -> Vec<Tensor<B, 3>> {
        let sequence = stack.pop().expect("the prompt block's stack holds the sequence");
        let [b, t, w] = sequence.dims();
        let last = self.final_norm.forward(sequence.slice([0..b, t - 1..t, 0..w]), ac);
        let answer = ac.full(self.to_decoder.forward(last, ac));
        let d = answer.dims()[2];
        let mask = ac.full(self.mask_token.val()).expand([b, 1, d]);
        stack.push(Tensor::cat(vec![mask, answer], 1));
        stack
    }
}

/// `[image, tokens]` → `image ++ tokens` (one tensor for the head).
#[derive(Module, Debug, Clone)]
pub struct Join;

impl<B: Backend> Block<B, 3> for Join {
    fn forward_stack(&self, mut stack: Vec<Tensor<B, 3>>, ac: &Autocast) -> Vec<Tensor<B, 3>> {
        let tokens = ac.full(stack.pop().expect("the join's stack holds the tokens"));
        let image = ac.full(stack.pop().expect("the join's stack holds the image"));
        stack.push(Tensor::cat(vec![image, tokens], 1));
        stack
    }
}

/// A link of the chain. Its variants differ in size (a few KB of handles
/// each, once a link in one `Vec`): boxing them would need `Module` for
/// `Box`, which Burn's derive does not give.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum SegBlock<B: Backend> {
    /// The encoder's.
    Vision(VisionLayer<B>),
    /// The neck and the projector.
    Bridge(Bridge<B>),
    /// The LLM's.
    Llm(LlamaBlock<B>),
    /// The LLM's answer to the decoder's tokens.
    Prompt(PromptBlock<B>),
    /// The decoder's.
    TwoWay(TwoWayLayer<B>),
    /// The stack joined.
    Join(Join),
}

impl<B: Backend> Block<B, 3> for SegBlock<B> {
    fn forward_stack(&self, stack: Vec<Tensor<B, 3>>, ac: &Autocast) -> Vec<Tensor<B, 3>> {
        match self {
            Self::Vision(l) => l.forward_stack(stack, ac),
            Self::Bridge(l) => l.forward_stack(stack, ac),
            Self::Llm(l) => l.forward_stack(stack, ac),
            Self::Prompt(l) => l.forward_stack(stack, ac),
            Self::TwoWay(l) => l.forward_stack(stack, ac),
            Self::Join(l) => Block::<B, 3>::forward_stack(l, stack, ac),
        }
    }
}

/// The segmenter.
#[derive(Module, Debug)]
pub struct Segmenter<B: Backend> {
    /// The image's patches to tokens.
    pub patch: PatchEmbed<B>,
    /// The LLM's token embedding (the prompt's).
    pub embedding: Param<Tensor<B, 2>>,
    /// The chain.
    pub blocks: Vec<SegBlock<B>>,
    /// The decoder's head.
    pub head: MaskHead<B>,
}

impl<B: Backend> Segmenter<B> {
    /// The prelude's stack: `[prompt embedded (f32), image tokens]`.
    pub fn embed(&self, batch: &SegBatch<B>, ac: &Autocast) -> Vec<Tensor<B, 3>> {
        let [b, t] = batch.prompts.dims();
        let table = self.embedding.val();
        let w = table.dims()[1];
        let prompt = ac.full(
            table
                .select(0, batch.prompts.clone().reshape([b * t]))
                .reshape([b, t, w]),
        );
        vec![prompt, self.patch.forward(batch.images.clone(), ac)]
    }

    /// Mask logits `[b, 1, image, image]` from the chain's output.
    pub fn logits(&self, x: Tensor<B, 3>, side: usize, ac: &Autocast) -> Tensor<B, 4> {
        let [b, n, d] = x.dims();
        let image = x.clone().slice([0..b, 0..n - 2, 0..d]);
        let tokens = x.slice([0..b, n - 2..n, 0..d]);
        self.head.forward(image, tokens, side, ac)
    }

    /// Mask logits of `batch` through every block.
    pub fn predict(&self, batch: &SegBatch<B>, ac: &Autocast) -> Tensor<B, 4> {
        let mut stack = self.embed(batch, ac);
        for block in &self.blocks {
            stack = block.forward_stack(stack, ac);
        }
        self.logits(stack.remove(0), batch.masks.dims()[2], ac)
    }
}

impl<B: AutodiffBackend> Trainable<B, 3> for Segmenter<B> {
    type Batch = SegBatch<B>;
    type Block = SegBlock<B>;

    fn micro_batch(batch: &Self::Batch, range: std::ops::Range<usize>) -> Self::Batch {
        batch.slice(range)
    }

    fn batch_bytes(batch: &Self::Batch) -> u64 {
        batch.bytes()
    }

    /// The stack's top: the image tokens.
    fn prelude(&self, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, 3> {
        self.patch.forward(batch.images.clone(), autocast)
    }

    fn prelude_stack(&self, batch: &Self::Batch, autocast: &Autocast) -> Vec<Tensor<B, 3>> {
        self.embed(batch, autocast)
    }

    fn blocks(&self) -> &[SegBlock<B>] {
        &self.blocks
    }

    fn head(&self, x: Tensor<B, 3>, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, 1> {
        let logits = self.logits(x, batch.masks.dims()[2], autocast);
        mask_loss(logits, batch.masks.clone())
    }
}
