//! SAM's mask decoder, at the encoder's neck width `d`: a two-way
//! transformer between the prompt's tokens (a learned mask token and the
//! LLM's answer) and the image embedding (each layer: the tokens attend to
//! themselves, to the image, go through an MLP; the image attends to the
//! tokens; post-norm), a last attention of the tokens to the image, the
//! embedding upscaled 4× (here nearest 2× upsampling and a 3×3
//! convolution twice, where SAM has transposed convolutions), the mask
//! token's MLP output dotted with every upscaled pixel, and the logits
//! resized bilinearly to the image (as products: [`resize_bilinear`]). Positions enter as fixed 2-D sine
//! encodings of the grid added to the image's keys and queries (SAM's are
//! random Fourier features), so any image size runs on the same weights.
//! The loss is SAM's: binary cross-entropy plus Dice, in f32.

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::{gelu, sigmoid};
use burn::tensor::ops::ConvOptions;
use rand_chacha::ChaCha8Rng;
use vramfit::activation_checkpointing::Block;
use vramfit::precision::Autocast;

use crate::gpt::{constant, normal};
use crate::unet::upsample2;
use crate::vision::{LayerNorm, Mlp, MultiHead};

/// SAM's mask decoder's settings (its width is the encoder's neck).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MaskDecoderConfig {
    /// Two-way layers.
    pub depth: usize,
    /// Attention heads.
    pub heads: usize,
    /// The tokens' MLP's hidden width.
    pub mlp: usize,
    /// The cross-attentions' inner width is the width over this.
    pub cross_downsample: usize,
}

impl Default for MaskDecoderConfig {
    /// SAM's.
    fn default() -> Self {
        Self {
            depth: 2,
            heads: 8,
            mlp: 2048,
            cross_downsample: 2,
        }
    }
}

/// Fixed sine encodings of a `grid × grid` token grid, `[1, grid², width]`
/// (f32): half the channels for the row, half for the column. Computed
/// once a process for each grid and width (every layer of every step
/// uses them).
pub(crate) fn positions<B: Backend>(grid: usize, width: usize, device: &B::Device) -> Tensor<B, 3> {
    type Tables = std::collections::HashMap<(usize, usize), std::sync::Arc<Vec<f32>>>;
    static TABLES: std::sync::Mutex<Option<Tables>> = std::sync::Mutex::new(None);
    let table = {
        let mut tables = TABLES.lock().unwrap_or_else(|p| p.into_inner());
        tables
            .get_or_insert_with(Default::default)
            .entry((grid, width))
            .or_insert_with(|| std::sync::Arc::new(sines(grid, width)))
            .clone()
    };
    Tensor::from_data(TensorData::new(table.to_vec(), [1, grid * grid, width]), device)
}

/// The transformer's encoding of a position, once for the row (the first
/// half of the channels) and once for the column: sines then cosines of
/// the position over 10000^(j/quarter).
fn sines(grid: usize, width: usize) -> Vec<f32> {
    let half = width / 2;
    let quarter = (half / 2).max(1);
    let mut v = vec![0f32; grid * grid * width];
    for r in 0..grid {
        for c in 0..grid {
            let row = &mut v[(r * grid + c) * width..][..width];
            for (i, x) in row.iter_mut().enumerate() {
                let (coord, j) = if i < half { (r, i) } else { (c, i - half) };
                let angle = coord as f64 / 10_000f64.powf((j % quarter) as f64 / quarter as f64);
                *x = if j < quarter { angle.sin() } else { angle.cos() } as f32;
            }
        }
    }
    v
}

/// One two-way layer: tokens `[b, 2, d]` and image `[b, g², d]` in, both out.
#[derive(Module, Debug)]
pub struct TwoWayLayer<B: Backend> {
    /// Tokens over tokens.
    pub self_attn: MultiHead<B>,
    /// After it.
    pub norm1: LayerNorm<B>,
    /// Tokens over the image.
    pub token_to_image: MultiHead<B>,
    /// After it.
    pub norm2: LayerNorm<B>,
    /// The tokens' MLP.
    pub mlp: Mlp<B>,
    /// After it.
    pub norm3: LayerNorm<B>,
    /// The image over the tokens.
    pub image_to_token: MultiHead<B>,
    /// After it.
    pub norm4: LayerNorm<B>,
}

impl<B: Backend> TwoWayLayer<B> {
    pub(crate) fn new(rng: &mut ChaCha8Rng, config: &MaskDecoderConfig, width: usize, device: &B::Device) -> Self {
        let inner = width / config.cross_downsample;
        Self {
            self_attn: MultiHead::new(rng, width, width, config.heads, device),
            norm1: LayerNorm::new(width, device),
            token_to_image: MultiHead::new(rng, width, inner, config.heads, device),
            norm2: LayerNorm::new(width, device),
            mlp: Mlp::new(rng, width, config.mlp, width, device),
            norm3: LayerNorm::new(width, device),
            image_to_token: MultiHead::new(rng, width, inner, config.heads, device),
            norm4: LayerNorm::new(width, device),
        }
    }
}

impl<B: Backend> Block<B, 3> for TwoWayLayer<B> {
    /// The stack `[image, tokens]` to `[image′, tokens′]`.
    fn forward_stack(&self, mut stack: Vec<Tensor<B, 3>>, ac: &Autocast) -> Vec<Tensor<B, 3>> {
        let tokens = ac.full(stack.pop().expect("the decoder's stack holds the tokens"));
        let image = ac.full(stack.pop().expect("the decoder's stack holds the image"));
        let [_, n, d] = image.dims();
        let pe = positions::<B>(crate::vision::side(n), d, &image.device());
        let t = self.norm1.forward(
            tokens.clone() + ac.full(self.self_attn.forward(tokens.clone(), tokens.clone(), tokens, ac)),
            ac,
        );
        let keys = image.clone() + pe.clone();
        let t = self.norm2.forward(
            t.clone() + ac.full(self.token_to_image.forward(t, keys.clone(), image.clone(), ac)),
            ac,
        );
        let t = self.norm3.forward(t.clone() + ac.full(self.mlp.forward(t, ac)), ac);
        let image = self.norm4.forward(
            image + ac.full(self.image_to_token.forward(keys, t.clone(), t.clone(), ac)),
            ac,
        );
        stack.push(image);
        stack.push(t);
        stack
    }
}

/// A 3×3 convolution with a bias, same padding.
#[derive(Module, Debug)]
pub struct Conv3<B: Backend> {
    /// `[out, in, 3, 3]`.
    pub weight: Param<Tensor<B, 4>>,
    /// `[out]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> Conv3<B> {
    fn new(rng: &mut ChaCha8Rng, inputs: usize, outputs: usize, device: &B::Device) -> Self {
        Self {
            weight: normal(rng, [outputs, inputs, 3, 3], (2.0 / (9 * inputs) as f64).sqrt(), device),
            bias: constant(outputs, 0.0, device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>, ac: &Autocast) -> Tensor<B, 4> {
        ac.conv2d(
            x,
            self.weight.val(),
            Some(self.bias.val()),
            ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
        )
    }
}

/// After the two-way layers: the tokens' last look at the image, the
/// upscaling and the mask token's product with every upscaled pixel.
#[derive(Module, Debug)]
pub struct MaskHead<B: Backend> {
    /// Tokens over the image.
    pub final_attn: MultiHead<B>,
    /// After it.
    pub final_norm: LayerNorm<B>,
    /// `d → d/4` after the first 2× upsampling.
    pub up1: Conv3<B>,
    /// Over the channels after `up1`.
    pub up_norm: LayerNorm<B>,
    /// `d/4 → d/8` after the second.
    pub up2: Conv3<B>,
    /// The mask token to `d/8` (the hypernetwork).
    pub hyper: Mlp<B>,
}

impl<B: Backend> MaskHead<B> {
    pub(crate) fn new(rng: &mut ChaCha8Rng, config: &MaskDecoderConfig, width: usize, device: &B::Device) -> Self {
        Self {
            final_attn: MultiHead::new(rng, width, width / config.cross_downsample, config.heads, device),
            final_norm: LayerNorm::new(width, device),
            up1: Conv3::new(rng, width, width / 4, device),
            up_norm: LayerNorm::new(width / 4, device),
            up2: Conv3::new(rng, width / 4, width / 8, device),
            hyper: Mlp::new(rng, width, width, width / 8, device),
        }
    }

    /// Mask logits `[b, 1, image, image]` (f32) from the image `[b, g², d]`
    /// and the tokens `[b, 2, d]` (the mask token first).
    pub fn forward(&self, image: Tensor<B, 3>, tokens: Tensor<B, 3>, side: usize, ac: &Autocast) -> Tensor<B, 4> {
        let [b, n, d] = image.dims();
        let g = crate::vision::side(n);
        let pe = positions::<B>(g, d, &image.device());
        let keys = image.clone() + pe;
        let tokens = self.final_norm.forward(
            tokens.clone() + ac.full(self.final_attn.forward(tokens, keys, image.clone(), ac)),
            ac,
        );
        let mask_token = tokens.slice([0..b, 0..1, 0..d]);
        // [b, g², d] → [b, d, g, g].
        let x = image.swap_dims(1, 2).reshape([b, d, g, g]);
        let x = self.up1.forward(upsample2(x), ac);
        // LayerNorm over the channels (SAM's LayerNorm2d).
        let x = self.up_norm.forward(x.permute([0, 2, 3, 1]), ac).permute([0, 3, 1, 2]);
        let x = ac.full(self.up2.forward(upsample2(gelu(x)), ac));
        let x = gelu(x);
        let [_, c, h, w] = x.dims();
        let weights = ac.full(self.hyper.forward(mask_token, ac)); // [b, 1, d/8]
        let logits = ac
            .full(ac.matmul(weights, x.reshape([b, c, h * w])))
            .reshape([b, 1, h, w]);
        if h == side {
            logits
        } else {
            resize_bilinear(logits, side)
        }
    }
}

/// The bilinear weights taking `from` samples to `to` (half-pixel
/// centres, edges clamped: PyTorch's `align_corners=False`), `[to, from]`.
fn bilinear_weights(from: usize, to: usize) -> Vec<f32> {
    let mut m = vec![0f32; to * from];
    let scale = from as f64 / to as f64;
    for (i, row) in m.chunks_exact_mut(from).enumerate() {
        let x = ((i as f64 + 0.5) * scale - 0.5).clamp(0.0, (from - 1) as f64);
        let left = x.floor() as usize;
        let right = (left + 1).min(from - 1);
        let t = (x - left as f64) as f32;
        row[left] += 1.0 - t;
        row[right] += t;
    }
    m
}

/// `x: [b, c, h, w]` resized bilinearly to `[b, c, side, side]`, as two
/// products with the weights (rows, then columns): Burn's `interpolate`
/// has no bilinear backward on CubeCL (wgpu, CUDA: it panics), products
/// have one everywhere; equal to it on the CPU (tested).
pub fn resize_bilinear<B: Backend>(x: Tensor<B, 4>, side: usize) -> Tensor<B, 4> {
    let [b, c, h, w] = x.dims();
    let device = x.device();
    let rows = Tensor::<B, 2>::from_data(TensorData::new(bilinear_weights(h, side), [side, h]), &device);
    let cols = Tensor::<B, 2>::from_data(TensorData::new(bilinear_weights(w, side), [side, w]), &device);
    let x = x.reshape([b * c, h, w]);
    let x = rows.unsqueeze::<3>().matmul(x); // [b·c, side, w]
    let x = x.matmul(cols.transpose().unsqueeze::<3>()); // [b·c, side, side]
    x.reshape([b, c, side, side])
}

/// SAM's loss: the mean binary cross-entropy of the logits against the
/// mask plus the mean over samples of 1 − Dice (soft, smoothed by 1).
pub fn mask_loss<B: Backend>(logits: Tensor<B, 4>, masks: Tensor<B, 4>) -> Tensor<B, 1> {
    let [b, _, h, w] = logits.dims();
    let x = logits;
    let y = masks;
    // max(x, 0) − x·y + log(1 + e^(−|x|)): stable for any x.
    let bce = (x.clone().clamp_min(0.0) - x.clone() * y.clone() + x.clone().abs().neg().exp().log1p()).mean();
    let p = sigmoid(x).reshape([b, h * w]);
    let y = y.reshape([b, h * w]);
    let overlap = (p.clone() * y.clone()).sum_dim(1);
    let total = p.sum_dim(1) + y.sum_dim(1);
    let dice = (overlap * 2.0 + 1.0) / (total + 1.0);
    bce + (dice.neg() + 1.0).mean()
}

/// The Dice of thresholded logits (> 0) against the mask, a sample each.
pub fn dice<B: Backend>(logits: Tensor<B, 4>, masks: Tensor<B, 4>) -> Vec<f64> {
    let [b, _, h, w] = logits.dims();
    let p = logits.greater_elem(0.0).float().reshape([b, h * w]);
    let y = masks.reshape([b, h * w]);
    let overlap: Vec<f32> = (p.clone() * y.clone())
        .sum_dim(1)
        .into_data()
        .to_vec()
        .unwrap_or_default();
    let total: Vec<f32> = (p.sum_dim(1) + y.sum_dim(1)).into_data().to_vec().unwrap_or_default();
    overlap
        .iter()
        .zip(&total)
        .map(|(&o, &t)| if t == 0.0 { 1.0 } else { 2.0 * o as f64 / t as f64 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::module::interpolate;
    use burn::tensor::ops::{InterpolateMode, InterpolateOptions};

    #[test]
    fn the_bilinear_resize_is_burns_interpolate() {
        let device = Default::default();
        for (h, side) in [(4, 8), (16, 64), (5, 12), (8, 8)] {
            let x = Tensor::<Flex, 4>::random([2, 3, h, h], burn::tensor::Distribution::Default, &device);
            let want = interpolate(
                x.clone(),
                [side, side],
                InterpolateOptions::new(InterpolateMode::Bilinear).with_align_corners(false),
            );
            let got = resize_bilinear(x, side);
            let gap: f32 = (got - want).abs().max().into_scalar();
            assert!(gap < 1e-5, "{h} → {side}: {gap}");
        }
    }
}
