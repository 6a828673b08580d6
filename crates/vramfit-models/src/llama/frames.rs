//! Frames as tokens (a video-language model): each of a sample's frames
//! through an image encoder ([`crate::vision`], frozen by default), its
//! grid averaged to `frame_grid × frame_grid` tokens and projected into
//! the LLM's width (LLaVA's two-layer projector, which trains); the
//! frames' tokens go ahead of the text's, and the loss is the text's.
//! Where a sample has more frames than the model's cap, `max_frames` of
//! them, evenly spaced, are read. The encoder runs before the chain (its
//! activations are not checkpointed: a frozen one keeps none).

use burn::module::Module;
use burn::prelude::*;
use burn::tensor::TensorData;
use vramfit::activation_checkpointing::Block;
use vramfit::precision::Autocast;

use crate::vision::{LayerNorm, Mlp, PatchEmbed, VisionLayer};

/// The frame encoder and its projector.
#[derive(Module, Debug)]
pub struct FrameEncoder<B: Backend> {
    /// A frame's patches to tokens.
    pub patch: PatchEmbed<B>,
    /// The encoder's layers.
    pub layers: Vec<VisionLayer<B>>,
    /// After the last layer.
    pub norm: LayerNorm<B>,
    /// The encoder's width → the LLM's.
    pub projector: Mlp<B>,
    grid: usize,
    max_frames: usize,
}

impl<B: Backend> FrameEncoder<B> {
    pub(crate) fn new(
        (patch, layers): (PatchEmbed<B>, Vec<VisionLayer<B>>),
        norm: LayerNorm<B>,
        projector: Mlp<B>,
        grid: usize,
        max_frames: usize,
    ) -> Self {
        Self {
            patch,
            layers,
            norm,
            projector,
            grid,
            max_frames,
        }
    }

    /// Frames read of `available`: all of them up to the cap.
    pub fn frames_used(&self, available: usize) -> usize {
        available.min(self.max_frames)
    }

    /// `video: [b, f, c, s, s]` → the frames' tokens `[b, f′·g², width]`
    /// (f32), f′ = [`frames_used`](Self::frames_used).
    pub fn forward(&self, video: Tensor<B, 5>, ac: &Autocast) -> Tensor<B, 3> {
        let [b, f, c, s, _] = video.dims();
        let used = self.frames_used(f);
        let video = if used < f {
            let keep: Vec<i64> = (0..used).map(|i| (i * f / used) as i64).collect();
            let keep = Tensor::<B, 1, Int>::from_data(TensorData::new(keep, [used]), &video.device());
            video.select(1, keep)
        } else {
            video
        };
        let mut x = self.patch.forward(video.reshape([b * used, c, s, s]), ac);
        for layer in &self.layers {
            x = layer.forward(x, ac);
        }
        let x = self.norm.forward(x, ac);
        let [_, n, w] = x.dims();
        let (g, t) = (crate::vision::side(n), self.grid);
        let k = g / t;
        let pooled = if k == 1 {
            x
        } else {
            x.reshape([b * used, t, k, t, k, w])
                .mean_dim(4)
                .mean_dim(2)
                .reshape([b * used, t * t, w])
        };
        let projected = ac.full(self.projector.forward(pooled, ac));
        let width = projected.dims()[2];
        projected.reshape([b, used * t * t, width])
    }
}
