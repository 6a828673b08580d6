//! The image encoder's layers: the patch embedding (a convolution whose
//! stride is its kernel), a pre-norm transformer block whose attention is
//! global or within windows of the token grid (padded to whole windows, as
//! SAM's and TinyViT's are), and the 2×2 merge that halves the grid between
//! stages (Swin's: four neighbours' features concatenated, normed and
//! projected).

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::ops::ConvOptions;
use rand_chacha::ChaCha8Rng;
use vramfit::activation_checkpointing::Block;
use vramfit::lora::Projection;
use vramfit::precision::Autocast;

use super::layers::{LayerNorm, Mlp, MultiHead, projection};
use crate::gpt::{constant, normal};

/// Image `[b, c, H, W]` → tokens `[b, (H/p)·(W/p), width]`.
#[derive(Module, Debug)]
pub struct PatchEmbed<B: Backend> {
    /// `[width, channels, p, p]`.
    pub weight: Param<Tensor<B, 4>>,
    /// `[width]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> PatchEmbed<B> {
    pub(crate) fn new(rng: &mut ChaCha8Rng, channels: usize, patch: usize, width: usize, device: &B::Device) -> Self {
        let fan_in = (channels * patch * patch) as f64;
        Self {
            weight: normal(rng, [width, channels, patch, patch], (1.0 / fan_in).sqrt(), device),
            bias: constant(width, 0.0, device),
        }
    }

    /// The tokens in the low type, row by row of the patch grid.
    pub fn forward(&self, images: Tensor<B, 4>, ac: &Autocast) -> Tensor<B, 3> {
        let p = self.weight.dims()[2];
        let x = ac.conv2d(
            images,
            self.weight.val(),
            Some(self.bias.val()),
            ConvOptions::new([p, p], [0, 0], [1, 1], 1),
        );
        let [b, w, gh, gw] = x.dims();
        x.reshape([b, w, gh * gw]).swap_dims(1, 2)
    }
}

/// Tokens `[b, g·g, w]` of a `g × g` grid cut into windows of `win × win`
/// (the grid padded with zeros to whole windows): `[b·n², win², w]` and
/// the padded side.
fn into_windows<B: Backend>(x: Tensor<B, 3>, grid: usize, win: usize) -> (Tensor<B, 3>, usize) {
    let [b, _, w] = x.dims();
    let padded = grid.div_ceil(win) * win;
    let mut x = x.reshape([b, grid, grid, w]);
    if padded > grid {
        let device = x.device();
        let extra = padded - grid;
        let dtype = x.dtype();
        x = Tensor::cat(
            vec![x, Tensor::<B, 4>::zeros([b, extra, grid, w], &device).cast(dtype)],
            1,
        );
        x = Tensor::cat(
            vec![x, Tensor::<B, 4>::zeros([b, padded, extra, w], &device).cast(dtype)],
            2,
        );
    }
    let n = padded / win;
    let x = x
        .reshape([b, n, win, n, win, w])
        .permute([0, 1, 3, 2, 4, 5])
        .reshape([b * n * n, win * win, w]);
    (x, padded)
}

/// [`into_windows`] undone: `[b·n², win², w]` → `[b, g·g, w]`.
fn from_windows<B: Backend>(x: Tensor<B, 3>, batch: usize, grid: usize, padded: usize, win: usize) -> Tensor<B, 3> {
    let w = x.dims()[2];
    let n = padded / win;
    let x = x
        .reshape([batch, n, n, win, win, w])
        .permute([0, 1, 3, 2, 4, 5])
        .reshape([batch, padded, padded, w]);
    let x = if padded > grid {
        x.slice([0..batch, 0..grid, 0..grid, 0..w])
    } else {
        x
    };
    x.reshape([batch, grid * grid, w])
}

/// A pre-norm transformer block over a square token grid:
/// `x + attn(norm(x))`, `x + mlp(norm(x))`, the residual stream in f32.
#[derive(Module, Debug)]
pub struct VisionBlock<B: Backend> {
    /// Before attention.
    pub attn_norm: LayerNorm<B>,
    /// Self-attention (within windows where `window` > 0).
    pub attn: MultiHead<B>,
    /// Before the MLP.
    pub mlp_norm: LayerNorm<B>,
    /// Four times the width inside, by default.
    pub mlp: Mlp<B>,
    window: usize,
}

impl<B: Backend> VisionBlock<B> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rng: &mut ChaCha8Rng,
        width: usize,
        heads: usize,
        hidden: usize,
        window: usize,
        device: &B::Device,
    ) -> Self {
        Self {
            attn_norm: LayerNorm::new(width, device),
            attn: MultiHead::new(rng, width, width, heads, device),
            mlp_norm: LayerNorm::new(width, device),
            mlp: Mlp::new(rng, width, hidden, width, device),
            window,
        }
    }
}

impl<B: Backend> Block<B, 3> for VisionBlock<B> {
    fn forward(&self, x: Tensor<B, 3>, ac: &Autocast) -> Tensor<B, 3> {
        let x = ac.full(x);
        let grid = super::layers::side(x.dims()[1]);
        let normed = self.attn_norm.forward(x.clone(), ac);
        // A window as large as the grid is the whole grid: global attention.
        let mixed = if self.window == 0 || self.window >= grid {
            self.attn.forward(normed.clone(), normed.clone(), normed, ac)
        } else {
            let batch = normed.dims()[0];
            let (windows, padded) = into_windows(normed, grid, self.window);
            let mixed = self.attn.forward(windows.clone(), windows.clone(), windows, ac);
            from_windows(mixed, batch, grid, padded, self.window)
        };
        let x = x + ac.full(mixed);
        let normed = self.mlp_norm.forward(x.clone(), ac);
        x + ac.full(self.mlp.forward(normed, ac))
    }
}

/// Halves a square token grid (stride 2): each 2×2 neighbourhood's
/// features concatenated (`4·w`), normed and projected to the next stage's
/// width; at stride 1 each token's features alone, normed and projected.
#[derive(Module, Debug)]
pub struct PatchMerge<B: Backend> {
    /// Over the merged features.
    pub norm: LayerNorm<B>,
    /// `[stride²·w, w′]`.
    pub reduce: Projection<B>,
    stride: usize,
}

impl<B: Backend> PatchMerge<B> {
    pub(crate) fn new(rng: &mut ChaCha8Rng, width: usize, out: usize, stride: usize, device: &B::Device) -> Self {
        let merged = stride * stride * width;
        Self {
            norm: LayerNorm::new(merged, device),
            reduce: projection(rng, merged, out, device),
            stride,
        }
    }
}

impl<B: Backend> Block<B, 3> for PatchMerge<B> {
    fn forward(&self, x: Tensor<B, 3>, ac: &Autocast) -> Tensor<B, 3> {
        let x = if self.stride == 2 {
            let [b, n, w] = x.dims();
            let half = super::layers::side(n) / 2;
            x.reshape([b, half, 2, half, 2, w])
                .permute([0, 1, 3, 2, 4, 5])
                .reshape([b, half * half, 4 * w])
        } else {
            x
        };
        ac.full(self.reduce.forward(self.norm.forward(x, ac), ac))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn windows_cut_and_join_the_grid_exactly() {
        let device = Default::default();
        // A 5×5 grid in windows of 2: padded to 6, nine windows.
        let x = Tensor::<Flex, 3>::random([2, 25, 3], burn::tensor::Distribution::Default, &device);
        let (windows, padded) = into_windows(x.clone(), 5, 2);
        assert_eq!((windows.dims(), padded), ([18, 4, 3], 6));
        // The first window holds the grid's (0,0), (0,1), (1,0), (1,1).
        let first: Vec<f32> = windows.clone().slice([0..1, 0..4, 0..3]).into_data().to_vec().unwrap();
        let grid = x.clone().reshape([2, 5, 5, 3]);
        let want: Vec<f32> = Tensor::cat(
            vec![
                grid.clone().slice([0..1, 0..1, 0..2, 0..3]).reshape([2, 3]),
                grid.slice([0..1, 1..2, 0..2, 0..3]).reshape([2, 3]),
            ],
            0,
        )
        .into_data()
        .to_vec()
        .unwrap();
        assert_eq!(first, want);
        let back = from_windows(windows, 2, 5, 6, 2);
        back.into_data().assert_eq(&x.into_data(), true);
    }
}
