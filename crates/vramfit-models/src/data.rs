//! Deterministic synthetic sequences with learnable structure.
//!
//! Each sample has a hidden topic `z` (one of `topics`). Its tokens follow
//! the topic's successor table: after token `a` comes `next[z][a]` with
//! probability `p_follow`, else a uniformly random token. Frames, when
//! asked for, are noisy copies of the topic's code vector, so a model that
//! reads them knows `z` from the first token on; without them it must infer
//! `z` from the transitions it has seen. Batch `s` depends only on the seed
//! and `s`, so a resumed run sees exactly the batches it would have seen.

use burn::prelude::*;
use burn::tensor::TensorData;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The task's shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    /// Tokens per sample (inputs; targets are shifted by one).
    pub tokens: usize,
    /// Hidden topics.
    pub topics: usize,
    /// Probability of following the topic's successor table.
    pub p_follow: f64,
    /// Frames per sample (0: none). The model uses at most its `max_frames`.
    pub frames: usize,
    /// Side of a frame in pixels, where the model reads frames as images
    /// (the llm's frame encoder).
    pub frame_size: usize,
    /// Seed of the tables and of every batch (and of a corpus's order).
    pub seed: u64,
    /// A corpus to train on instead of the synthetic task (`--data`):
    /// token ids (`.bin`), plain text (`.txt`) or JSON lines (`.jsonl`)
    /// ([`crate::corpus`]). Empty: the synthetic task. The llm's.
    pub data: String,
    /// Width of the ids in a `.bin` without llm.c's header: `u16`, `u32`,
    /// or empty (u16 where the vocabulary fits, as nanoGPT writes them).
    pub token_type: String,
    /// tokenizer.json for a text corpus; empty: the one beside
    /// `model.weights`.
    pub tokenizer: String,
    /// Share of the corpus's windows held out for validation (the last
    /// ones; at least one where above 0).
    pub validation: f64,
    /// Held-out windows an evaluation reads at most.
    pub eval_sequences: usize,
    /// Steps between evaluations on the held-out windows, logged with the
    /// step (0: only the final one, in `summary.json`).
    pub eval_every: u64,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            tokens: 32,
            topics: 4,
            p_follow: 0.8,
            frames: 0,
            frame_size: 32,
            seed: 7,
            data: String::new(),
            token_type: String::new(),
            tokenizer: String::new(),
            validation: 0.05,
            eval_sequences: 32,
            eval_every: 100,
        }
    }
}

/// The generator.
#[derive(Debug, Clone)]
pub struct SyntheticTask {
    config: TaskConfig,
    vocab: usize,
    frame_dim: usize,
    next: Vec<Vec<u32>>,  // [topic][token]
    codes: Vec<Vec<f32>>, // [topic][frame_dim]
}

impl SyntheticTask {
    /// Tables for `vocab` tokens and frames of `frame_dim` features.
    pub fn new(config: TaskConfig, vocab: usize, frame_dim: usize) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let next = (0..config.topics)
            .map(|_| {
                let mut perm: Vec<u32> = (0..vocab as u32).collect();
                perm.shuffle(&mut rng);
                perm
            })
            .collect();
        let codes = (0..config.topics)
            .map(|_| (0..frame_dim).map(|_| rng.random_range(-1.0f32..1.0)).collect())
            .collect();
        Self {
            config,
            vocab,
            frame_dim,
            next,
            codes,
        }
    }

    /// The task's settings.
    pub fn config(&self) -> &TaskConfig {
        &self.config
    }

    /// Cross-entropy (nats) of a predictor that knows the topic: the floor.
    pub fn entropy_floor(&self) -> f64 {
        let v = self.vocab as f64;
        let p = self.config.p_follow;
        let hit = p + (1.0 - p) / v;
        let miss = (1.0 - p) / v;
        -(hit * hit.ln() + (v - 1.0) * miss * miss.ln())
    }

    /// Batch number `step` of `size` samples.
    pub fn batch<B: Backend>(&self, step: u64, size: usize, device: &B::Device) -> TokenBatch<B> {
        let t = self.config.tokens;
        let mut tokens = Vec::with_capacity(size * t);
        let mut targets = Vec::with_capacity(size * t);
        let mut frames = Vec::with_capacity(size * self.config.frames * self.frame_dim);
        // Frames as images (no frame features): each sample's frames in
        // its topic's colour, with noise; none drawn on the shape backend.
        let side = self.config.frame_size;
        let video = self.frame_dim == 0 && self.config.frames > 0 && side > 0;
        let draw_video = video && !vramfit::shapes::is_shapes::<B>();
        let mut pixels = Vec::with_capacity(if draw_video {
            size * self.config.frames * 3 * side * side
        } else {
            0
        });
        for i in 0..size {
            let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed ^ (step.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            rng.set_stream(i as u64);
            let z = rng.random_range(0..self.config.topics);
            let mut seq = Vec::with_capacity(t + 1);
            seq.push(rng.random_range(0..self.vocab as u32));
            while seq.len() <= t {
                let prev = seq[seq.len() - 1] as usize;
                let next = if rng.random_bool(self.config.p_follow) {
                    self.next[z][prev]
                } else {
                    rng.random_range(0..self.vocab as u32)
                };
                seq.push(next);
            }
            tokens.extend(seq[..t].iter().map(|&x| x as i64));
            targets.extend(seq[1..].iter().map(|&x| x as i64));
            for _ in 0..self.config.frames {
                frames.extend(self.codes[z].iter().map(|&c| c + 0.5 * rng.random_range(-1.0f32..1.0)));
            }
            if draw_video {
                for _ in 0..self.config.frames {
                    for ch in 0..3 {
                        let colour =
                            ((z * (ch + 2) + ch) % (self.config.topics + 1)) as f32 / self.config.topics as f32;
                        pixels.extend((0..side * side).map(|_| colour + 0.1 * rng.random_range(-1.0f32..1.0)));
                    }
                }
            }
        }
        TokenBatch {
            tokens: Tensor::from_data(TensorData::new(tokens, [size, t]), device),
            targets: Tensor::from_data(TensorData::new(targets, [size, t]), device),
            frames: (self.config.frames > 0 && self.frame_dim > 0).then(|| {
                Tensor::from_data(
                    TensorData::new(frames, [size, self.config.frames, self.frame_dim]),
                    device,
                )
            }),
            video: video.then(|| {
                let shape = [size, self.config.frames, 3, side, side];
                if draw_video {
                    Tensor::from_data(TensorData::new(pixels, shape), device)
                } else {
                    Tensor::empty(shape, device)
                }
            }),
        }
    }
}

/// Inputs and next-token targets.
#[derive(Debug, Clone)]
pub struct TokenBatch<B: Backend> {
    /// `[batch, tokens]`.
    pub tokens: Tensor<B, 2, Int>,
    /// `[batch, tokens]`: the token after each input token.
    pub targets: Tensor<B, 2, Int>,
    /// `[batch, frames, frame_dim]`, when the task has frames (the transformer's).
    pub frames: Option<Tensor<B, 3>>,
    /// `[batch, frames, 3, side, side]` pixels, when the task has frames
    /// and the model reads them as images (the llm's).
    pub video: Option<Tensor<B, 5>>,
}

impl<B: Backend> TokenBatch<B> {
    /// Device bytes of the batch's tensors.
    pub fn bytes(&self) -> u64 {
        let of = |shape: burn::tensor::Shape, dtype: burn::tensor::DType| (shape.num_elements() * dtype.size()) as u64;
        of(self.tokens.shape(), self.tokens.dtype())
            + of(self.targets.shape(), self.targets.dtype())
            + self.frames.as_ref().map_or(0, |f| of(f.shape(), f.dtype()))
            + self.video.as_ref().map_or(0, |f| of(f.shape(), f.dtype()))
    }

    /// Samples `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        Self {
            tokens: self.tokens.clone().slice([range.clone()]),
            targets: self.targets.clone().slice([range.clone()]),
            frames: self.frames.clone().map(|f| f.slice([range.clone()])),
            video: self.video.clone().map(|f| f.slice([range])),
        }
    }
}

/// Mean next-token cross-entropy (nats) of `logits` (`[b·t, vocab]`, f32)
/// against `batch`'s targets: both decoders' loss.
pub fn next_token_loss<B: Backend>(logits: Tensor<B, 2>, batch: &TokenBatch<B>) -> Tensor<B, 1> {
    let [b, t] = batch.tokens.dims();
    let picked = burn::tensor::activation::log_softmax(logits, 1).gather(1, batch.targets.clone().reshape([b * t, 1]));
    picked.mean().neg()
}

/// Both decoders' fields of `summary.json`: the synthetic task's floor
/// (a corpus has none) and the tokens a second at `median_step_ms` for
/// batches of `batch_size`.
pub fn token_summary(
    data: &impl TokenData,
    batch_size: usize,
    median_step_ms: f64,
) -> serde_json::Map<String, serde_json::Value> {
    let tokens = (batch_size * data.tokens_per_sample()) as f64;
    let mut out = serde_json::Map::new();
    // The task's floor: a predictor that knows the hidden topic (nats per token).
    if let Some(floor) = data.floor() {
        out.insert("entropy_floor".into(), floor.into());
    }
    out.insert(
        "tokens_per_second".into(),
        (if median_step_ms > 0.0 {
            tokens / (median_step_ms / 1e3)
        } else {
            0.0
        })
        .into(),
    );
    out
}

/// What [`token_summary`] reads of a run's tokens.
pub trait TokenData {
    /// Input tokens a sample.
    fn tokens_per_sample(&self) -> usize;
    /// The loss no model can beat, where known (nats per token).
    fn floor(&self) -> Option<f64>;
}

impl TokenData for SyntheticTask {
    fn tokens_per_sample(&self) -> usize {
        self.config.tokens
    }
    fn floor(&self) -> Option<f64> {
        Some(self.entropy_floor())
    }
}
