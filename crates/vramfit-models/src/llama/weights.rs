//! Where a Llama's base weights come from: drawn from the seed (in
//! parallel, a stream a block) or read from a Hugging Face checkpoint, one
//! tensor at a time.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::TensorData;
use rand_chacha::ChaCha8Rng;

use crate::gpt::{constant, normal_parallel};

/// Where a base model's weights come from: drawn from a seed, or read from
/// a checkpoint in the Hugging Face layout (its names; projections
/// `[out, in]`, transposed here into `[in, out]`).
pub(super) enum Weights {
    Drawn(Box<ChaCha8Rng>),
    Read {
        file: crate::safetensors::HfWeights,
        /// The first read that failed (the rest are then zeros, unused).
        failed: Option<String>,
    },
}

impl Weights {
    fn values(file: &crate::safetensors::HfWeights, failed: &mut Option<String>, name: &str, count: usize) -> Vec<f32> {
        if failed.is_none() {
            match file.read_f32(name) {
                Ok(v) => return v,
                Err(e) => *failed = Some(e.to_string()),
            }
        }
        vec![0.0; count]
    }

    /// A projection's weight `[in, out]` (normal, σ `std`, where drawn).
    pub(super) fn matrix<B: Backend>(
        &mut self,
        name: &str,
        [inputs, outputs]: [usize; 2],
        std: f64,
        device: &B::Device,
    ) -> Param<Tensor<B, 2>> {
        match self {
            Weights::Drawn(rng) => normal_parallel(rng, [inputs, outputs], std, device),
            // The shape backend holds no values: the checkpoint's are not read.
            Weights::Read { .. } if vramfit::shapes::is_shapes::<B>() => {
                Param::from_tensor(Tensor::empty([inputs, outputs], device))
            }
            Weights::Read { file, failed } => {
                let stored = Self::values(file, failed, name, inputs * outputs); // [out, in]
                let mut t = vec![0.0f32; stored.len()];
                for (o, row) in stored.chunks_exact(inputs).enumerate() {
                    for (i, &x) in row.iter().enumerate() {
                        t[i * outputs + o] = x;
                    }
                }
                Param::from_tensor(Tensor::from_data(TensorData::new(t, [inputs, outputs]), device))
            }
        }
    }

    /// The token embedding `[vocab, width]` (normal, σ 0.02, where drawn).
    pub(super) fn table<B: Backend>(
        &mut self,
        name: &str,
        shape: [usize; 2],
        device: &B::Device,
    ) -> Param<Tensor<B, 2>> {
        match self {
            Weights::Drawn(rng) => normal_parallel(rng, shape, 0.02, device),
            Weights::Read { .. } if vramfit::shapes::is_shapes::<B>() => {
                Param::from_tensor(Tensor::empty(shape, device))
            }
            Weights::Read { file, failed } => {
                let values = Self::values(file, failed, name, shape[0] * shape[1]);
                Param::from_tensor(Tensor::from_data(TensorData::new(values, shape), device))
            }
        }
    }

    /// A norm's scale or a bias (`value` everywhere, where drawn).
    pub(super) fn vector<B: Backend>(
        &mut self,
        name: &str,
        n: usize,
        value: f32,
        device: &B::Device,
    ) -> Param<Tensor<B, 1>> {
        match self {
            Weights::Drawn(_) => constant(n, value, device),
            Weights::Read { file, failed } => {
                let values = Self::values(file, failed, name, n);
                Param::from_tensor(Tensor::from_data(TensorData::new(values, [n]), device))
            }
        }
    }
}
