//! The segmenter's synthetic task: on a noisy background, discs of
//! `objects` different colours from a palette of `classes`; the prompt
//! names one of the colours present (a class token after a start token,
//! padded), and the mask is where that colour is seen (a later disc
//! covers an earlier one). Every batch is a function of the seed and the
//! step alone, so a resumed run sees the batches it would have seen.

use burn::prelude::*;
use burn::tensor::TensorData;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Images, their masks and the prompts.
#[derive(Debug, Clone)]
pub struct SegBatch<B: Backend> {
    /// `[b, channels, image, image]` in [0, 1].
    pub images: Tensor<B, 4>,
    /// `[b, 1, image, image]`, 0 or 1.
    pub masks: Tensor<B, 4>,
    /// `[b, prompt]` token ids.
    pub prompts: Tensor<B, 2, Int>,
}

impl<B: Backend> SegBatch<B> {
    /// Samples `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        Self {
            images: self.images.clone().slice([range.clone()]),
            masks: self.masks.clone().slice([range.clone()]),
            prompts: self.prompts.clone().slice([range]),
        }
    }

    /// Device bytes.
    pub fn bytes(&self) -> u64 {
        let of = |n: usize, d: burn::tensor::DType| (n * d.size()) as u64;
        of(self.images.shape().num_elements(), self.images.dtype())
            + of(self.masks.shape().num_elements(), self.masks.dtype())
            + of(self.prompts.shape().num_elements(), self.prompts.dtype())
    }
}

/// The token that starts every prompt; a class `c` is token `2 + c`, and 0 pads.
pub const START: usize = 1;

/// The synthetic task's generator.
#[derive(Debug, Clone)]
pub struct Synthetic {
    /// Image side, pixels.
    pub image: usize,
    /// Image channels.
    pub channels: usize,
    /// Prompt tokens.
    pub prompt: usize,
    /// Colours in the palette.
    pub classes: usize,
    /// Discs an image.
    pub objects: usize,
    /// The task's seed.
    pub seed: u64,
}

impl Synthetic {
    /// Class `c`'s colour, per channel in [0.1, 0.9]: spread over the
    /// palette so that neighbours differ in every channel.
    fn colour(&self, c: usize, channel: usize) -> f32 {
        let phase = (c * (channel + 1) * 7 + channel * 3) % (2 * self.classes + 1);
        0.1 + 0.8 * phase as f32 / (2 * self.classes) as f32
    }

    /// Sample `index` of batch `step`: image, mask and prompt, on the host.
    fn sample(&self, step: u64, index: usize) -> (Vec<f32>, Vec<f32>, Vec<i64>) {
        let mut rng =
            ChaCha8Rng::seed_from_u64(self.seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (index as u64) << 40);
        let s = self.image;
        let mut owner = vec![usize::MAX; s * s];
        let mut classes: Vec<usize> = (0..self.classes).collect();
        // The first `objects` of a shuffled palette.
        for i in 0..self.objects.min(self.classes) {
            let j = rng.random_range(i..self.classes);
            classes.swap(i, j);
        }
        let present = &classes[..self.objects.min(self.classes)];
        for (k, _) in present.iter().enumerate() {
            let r = rng.random_range(s as f32 / 8.0..s as f32 / 4.0).max(1.0);
            let cx = rng.random_range(r..s as f32 - r);
            let cy = rng.random_range(r..s as f32 - r);
            for y in 0..s {
                for x in 0..s {
                    let (dx, dy) = (x as f32 + 0.5 - cx, y as f32 + 0.5 - cy);
                    if dx * dx + dy * dy <= r * r {
                        owner[y * s + x] = k;
                    }
                }
            }
        }
        let target = rng.random_range(0..present.len());
        let mut image = vec![0f32; self.channels * s * s];
        for ch in 0..self.channels {
            for (p, &o) in owner.iter().enumerate() {
                let base = if o == usize::MAX {
                    0.5
                } else {
                    self.colour(present[o], ch)
                };
                image[ch * s * s + p] = base + 0.05 * rng.random_range(-1.0f32..1.0);
            }
        }
        let mask = owner.iter().map(|&o| if o == target { 1.0 } else { 0.0 }).collect();
        let mut prompt = vec![0i64; self.prompt];
        prompt[0] = START as i64;
        if self.prompt > 1 {
            prompt[1] = (2 + present[target]) as i64;
        }
        (image, mask, prompt)
    }

    /// Batch `step` of `size` samples on `device`.
    pub fn batch<B: Backend>(&self, step: u64, size: usize, device: &B::Device) -> SegBatch<B> {
        let s = self.image;
        // The shape backend holds no values: none drawn.
        if vramfit::shapes::is_shapes::<B>() {
            return SegBatch {
                images: Tensor::empty([size, self.channels, s, s], device),
                masks: Tensor::empty([size, 1, s, s], device),
                prompts: Tensor::empty([size, self.prompt], device),
            };
        }
        let (mut images, mut masks, mut prompts) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..size {
            let (image, mask, prompt) = self.sample(step, i);
            images.extend(image);
            masks.extend(mask);
            prompts.extend(prompt);
        }
        SegBatch {
            images: Tensor::from_data(TensorData::new(images, [size, self.channels, s, s]), device),
            masks: Tensor::from_data(TensorData::new(masks, [size, 1, s, s]), device),
            prompts: Tensor::from_data(TensorData::new(prompts, [size, self.prompt]), device),
        }
    }
}
