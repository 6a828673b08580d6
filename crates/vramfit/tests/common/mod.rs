//! A model shared by the integration tests: a chain of linear maps.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramfit::activation_checkpointing::Block;
use vramfit::precision::Autocast;
use vramfit::step::Trainable;

/// A chain of `[n, n]` linear maps: each block keeps its `[b, n]` input for backward.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub w: Param<Tensor<B, 2>>,
}

impl<B: Backend> Block<B, 2> for Linear<B> {
    fn forward(&self, x: Tensor<B, 2>, _: &Autocast) -> Tensor<B, 2> {
        x.matmul(self.w.val())
    }
}

#[derive(Module, Debug)]
pub struct Chain<B: Backend> {
    pub blocks: Vec<Linear<B>>,
}

impl<B: AutodiffBackend> Trainable<B, 2> for Chain<B> {
    type Batch = Tensor<B, 2>;
    type Block = Linear<B>;

    fn micro_batch(batch: &Self::Batch, range: std::ops::Range<usize>) -> Self::Batch {
        batch.clone().slice([range])
    }
    fn batch_bytes(batch: &Self::Batch) -> u64 {
        (batch.shape().num_elements() * 4) as u64
    }
    fn prelude(&self, batch: &Self::Batch, _: &Autocast) -> Tensor<B, 2> {
        batch.clone()
    }
    fn blocks(&self) -> &[Linear<B>] {
        &self.blocks
    }
    fn head(&self, x: Tensor<B, 2>, _: &Self::Batch, _: &Autocast) -> Tensor<B, 1> {
        x.sum()
    }
}

/// `k` blocks of `[n, n]` weights drawn with variance `1/n`.
pub fn chain<B: Backend>(k: usize, n: usize, device: &B::Device) -> Chain<B> {
    let scale = 1.0 / (n as f64).sqrt();
    Chain {
        blocks: (0..k)
            .map(|_| Linear {
                w: Param::from_tensor(Tensor::random(
                    [n, n],
                    burn::tensor::Distribution::Normal(0.0, scale),
                    device,
                )),
            })
            .collect(),
    }
}
