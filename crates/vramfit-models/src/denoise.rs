//! The U-Net's task: denoising crops of the procedural sample image
//! (`vramfit_sample::procedural`), deterministic per step.
//!
//! Sample `i` of step `s` is a `resolution²` crop at a position drawn from
//! `(seed, s, i)`; its input is the crop plus Gaussian noise of σ `noise`,
//! its target the same crop plus independent noise of σ `target_noise`
//! (Noise2Noise: a network trained on noisy targets learns the clean image,
//! since the target noise is independent of the input and has zero mean).
//! The loss is the mean squared error per value. Its known floor is
//! `target_noise²`: no function of the input predicts the target's own
//! noise, so no model's expected loss goes below it; returning the noisy
//! input scores `noise² + target_noise²` (the identity's loss). A denoiser
//! lands between the two, at the floor plus its error on the clean image.

use burn::prelude::*;
use burn::tensor::TensorData;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The task's settings (`[task]` of `vramfit train unet`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DenoiseConfig {
    /// Side of each square crop, in pixels (divisible by 2^model.depth).
    pub resolution: usize,
    /// Noise σ added to the input (pixel values in [0, 1]).
    pub noise: f64,
    /// Noise σ added to the target: the loss's floor is its square.
    pub target_noise: f64,
    /// Side of the procedural image crops are taken from (at least `resolution`).
    pub source: usize,
    /// Seed of crop positions and noise.
    pub seed: u64,
}

impl Default for DenoiseConfig {
    fn default() -> Self {
        Self {
            resolution: 64,
            noise: 0.2,
            target_noise: 0.05,
            source: 512,
            seed: 11,
        }
    }
}

/// Noisy inputs and noisy targets, `[n, channels, r, r]` each.
#[derive(Debug, Clone)]
pub struct ImageBatch<B: Backend> {
    /// The noisy crops.
    pub input: Tensor<B, 4>,
    /// The same crops with independent noise.
    pub target: Tensor<B, 4>,
}

impl<B: Backend> ImageBatch<B> {
    /// Device bytes of the batch.
    pub fn bytes(&self) -> u64 {
        ((self.input.shape().num_elements() + self.target.shape().num_elements()) * self.input.dtype().size()) as u64
    }

    /// Samples `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        Self {
            input: self.input.clone().slice([range.clone()]),
            target: self.target.clone().slice([range]),
        }
    }
}

/// The generator: the source image, planar, values in [0, 1].
#[derive(Debug, Clone)]
pub struct Denoise {
    config: DenoiseConfig,
    channels: usize,
    /// `[channels][source²]`.
    planes: Vec<Vec<f32>>,
}

impl Denoise {
    /// The source image for `config` with `channels` (1: luminance, 3: RGB).
    pub fn new(config: DenoiseConfig, channels: usize) -> Self {
        let side = config.source.max(config.resolution);
        let image = vramfit_sample::procedural(side as u32, side as u32);
        let raw = image.as_raw();
        let value = |p: usize, c: usize| raw[p * 3 + c] as f32 / 255.0;
        let planes = if channels == 1 {
            vec![
                (0..side * side)
                    .map(|p| 0.299 * value(p, 0) + 0.587 * value(p, 1) + 0.114 * value(p, 2))
                    .collect(),
            ]
        } else {
            (0..3)
                .map(|c| (0..side * side).map(|p| value(p, c)).collect())
                .collect()
        };
        Self {
            config: DenoiseConfig { source: side, ..config },
            channels,
            planes,
        }
    }

    /// The task's settings.
    pub fn config(&self) -> &DenoiseConfig {
        &self.config
    }

    /// The loss no model's expectation goes below: `target_noise²`.
    pub fn floor(&self) -> f64 {
        self.config.target_noise.powi(2)
    }

    /// The loss of returning the noisy input: `noise² + target_noise²`.
    pub fn identity_loss(&self) -> f64 {
        self.config.noise.powi(2) + self.floor()
    }

    /// Batch `step` of `size` samples (sample `i` depends only on the seed, `step` and `i`).
    pub fn batch<B: Backend>(&self, step: u64, size: usize, device: &B::Device) -> ImageBatch<B> {
        self.samples(step, 0..size, device)
    }

    /// Samples `range` of step `step`: what `batch(step, n)` holds there, made alone.
    pub fn samples<B: Backend>(&self, step: u64, range: std::ops::Range<usize>, device: &B::Device) -> ImageBatch<B> {
        let (r, side, ch) = (self.config.resolution, self.config.source, self.channels);
        let size = range.len();
        let per = ch * r * r;
        let mut input = Vec::with_capacity(size * per);
        let mut target = Vec::with_capacity(size * per);
        for i in range {
            let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            rng.set_stream(i as u64);
            let (x0, y0) = (rng.random_range(0..=side - r), rng.random_range(0..=side - r));
            for plane in &self.planes {
                for y in 0..r {
                    for &clean in &plane[(y0 + y) * side + x0..][..r] {
                        input.push(clean + (self.config.noise * gaussian(&mut rng)) as f32);
                        target.push(clean + (self.config.target_noise * gaussian(&mut rng)) as f32);
                    }
                }
            }
        }
        let shape = [size, ch, r, r];
        ImageBatch {
            input: Tensor::from_data(TensorData::new(input, shape), device),
            target: Tensor::from_data(TensorData::new(target, shape), device),
        }
    }
}

/// A standard normal draw (Box–Muller), the same on every platform.
fn gaussian(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}
