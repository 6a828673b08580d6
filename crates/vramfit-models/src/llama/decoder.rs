//! The Llama decoder: the embedding, the blocks, the final norm and the
//! head, whose loss is computed a chunk of positions at a time
//! ([`vramfit::chunked_loss`]); a [`Trainable`] for the step.

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramfit::activation_checkpointing::Block;
use vramfit::precision::Autocast;
use vramfit::step::Trainable;

use super::block::{LlamaBlock, RmsNorm};
use crate::data::TokenBatch;

/// The decoder.
#[derive(Module, Debug)]
pub struct Llama<B: Backend> {
    /// Token embedding, `[vocab, width]`.
    pub embedding: Param<Tensor<B, 2>>,
    /// The blocks.
    pub blocks: Vec<LlamaBlock<B>>,
    /// Norm before the head.
    pub final_norm: RmsNorm<B>,
    /// Head, `[width, vocab]` (`None`: the embedding transposed).
    pub head: Option<Param<Tensor<B, 2>>>,
    /// Positions whose logits exist at once in the loss.
    pub(super) loss_chunk: usize,
    /// The frame encoder, where the model reads frames as tokens.
    pub frames: Option<super::frames::FrameEncoder<B>>,
}

impl<B: Backend> Llama<B> {
    /// The embedded tokens, `[b, t, width]`, after the frames' tokens
    /// where the model reads the batch's frames.
    pub fn embed(&self, batch: &TokenBatch<B>, ac: &Autocast) -> Tensor<B, 3> {
        let text = self.embed_tokens(batch.tokens.clone(), ac);
        match (&self.frames, &batch.video) {
            (Some(encoder), Some(video)) => Tensor::cat(vec![encoder.forward(video.clone(), ac), text], 1),
            _ => text,
        }
    }

    /// `tokens: [b, t]` embedded, `[b, t, width]`.
    fn embed_tokens(&self, tokens: Tensor<B, 2, Int>, ac: &Autocast) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        let table = self.embedding.val();
        let w = table.dims()[1];
        ac.full(table.select(0, tokens.reshape([b * t])).reshape([b, t, w]))
    }

    /// The head, `[width, vocab]` (the embedding transposed when tied).
    fn head_matrix(&self) -> Tensor<B, 2> {
        match &self.head {
            Some(h) => h.val(),
            None => self.embedding.val().transpose(),
        }
    }

    /// The mean next-token loss (nats) of the blocks' output `x`.
    pub fn head_loss(&self, x: Tensor<B, 3>, batch: &TokenBatch<B>, ac: &Autocast) -> Tensor<B, 1> {
        let [b, t] = batch.tokens.dims();
        // The text's positions (the frames' tokens ahead of them have no targets).
        let [_, all, w] = x.dims();
        let x = if all > t {
            x.slice([0..b, all - t..all, 0..w])
        } else {
            x
        };
        let x = self.final_norm.forward(x, ac);
        let head = self.head_matrix();
        // A chunk of positions' logits at a time (a frozen head used as stored).
        vramfit::chunked_loss::chunked_cross_entropy(
            x.reshape([b * t, w]),
            head,
            batch.targets.clone().reshape([b * t]),
            self.loss_chunk,
            ac,
        )
    }

    /// The logits of every position, `[b, t, vocab]`, through every block
    /// (all of them at once: for reading a model's predictions and for
    /// checks against a reference; training takes [`loss`](Self::loss),
    /// which holds a chunk of positions' logits at a time).
    pub fn logits(&self, tokens: Tensor<B, 2, Int>, ac: &Autocast) -> Tensor<B, 3> {
        let mut x = self.embed_tokens(tokens, ac);
        for block in &self.blocks {
            x = block.forward(x, ac);
        }
        let x = self.final_norm.forward(x, ac);
        let [b, t, w] = x.dims();
        let head = self.head_matrix();
        let vocab = head.dims()[1];
        ac.full(ac.matmul(x.reshape([b * t, w]), head)).reshape([b, t, vocab])
    }

    /// The loss of `batch` through every block.
    pub fn loss(&self, batch: &TokenBatch<B>, ac: &Autocast) -> Tensor<B, 1> {
        let mut x = self.embed(batch, ac);
        for block in &self.blocks {
            x = block.forward(x, ac);
        }
        self.head_loss(x, batch, ac)
    }
}

impl<B: AutodiffBackend> Trainable<B, 3> for Llama<B> {
    type Batch = TokenBatch<B>;
    type Block = LlamaBlock<B>;

    fn micro_batch(batch: &Self::Batch, range: std::ops::Range<usize>) -> Self::Batch {
        batch.slice(range)
    }

    fn batch_bytes(batch: &Self::Batch) -> u64 {
        batch.bytes()
    }

    fn prelude(&self, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, 3> {
        self.embed(batch, autocast)
    }

    fn blocks(&self) -> &[LlamaBlock<B>] {
        &self.blocks
    }

    fn head(&self, x: Tensor<B, 3>, batch: &Self::Batch, autocast: &Autocast) -> Tensor<B, 1> {
        self.head_loss(x, batch, autocast)
    }
}
