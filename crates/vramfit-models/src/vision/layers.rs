//! The layers the image encoder and the mask decoder share: LayerNorm in
//! f32, multi-head attention without a causal mask (queries and keys may
//! come from different sequences) and a two-layer MLP with GELU, each on
//! projections that may be frozen or adapted ([`vramfit::lora::Projection`]).

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::activation::gelu;
use rand_chacha::ChaCha8Rng;
use vramfit::lora::Projection;
use vramfit::precision::Autocast;

use crate::gpt::{constant, normal};

const EPS: f64 = 1e-6;

/// Side of the square grid `tokens` tokens make.
pub(crate) fn side(tokens: usize) -> usize {
    let g = (tokens as f64).sqrt().round() as usize;
    assert_eq!(g * g, tokens, "{tokens} tokens are not a square grid");
    g
}

/// A projection `[in, out]` with a bias, drawn with σ = 1/√in.
pub(crate) fn projection<B: Backend>(
    rng: &mut ChaCha8Rng,
    inputs: usize,
    outputs: usize,
    device: &B::Device,
) -> Projection<B> {
    Projection::new(
        normal(rng, [inputs, outputs], (1.0 / inputs as f64).sqrt(), device),
        Some(constant(outputs, 0.0, device)),
    )
}

/// LayerNorm over the last axis, in f32: `(x − mean) / √(var + ε) · γ + β`.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    /// γ.
    pub weight: Param<Tensor<B, 1>>,
    /// β.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> LayerNorm<B> {
    /// γ = 1, β = 0.
    pub(crate) fn new(width: usize, device: &B::Device) -> Self {
        Self {
            weight: constant(width, 1.0, device),
            bias: constant(width, 0.0, device),
        }
    }

    /// Normalises the last axis of `x`; the result is f32.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, ac: &Autocast) -> Tensor<B, D> {
        let x = ac.full(x);
        let centred = x.clone() - x.mean_dim(D - 1);
        let var = centred.clone().powi_scalar(2).mean_dim(D - 1);
        centred / (var + EPS).sqrt() * ac.full(self.weight.val()).unsqueeze::<D>()
            + ac.full(self.bias.val()).unsqueeze::<D>()
    }
}

/// Multi-head attention of queries over keys and values (no mask): the
/// fused kernel where the backend has one ([`vramfit::fused::attention`]),
/// so the scores are never stored.
#[derive(Module, Debug)]
pub struct MultiHead<B: Backend> {
    /// Queries, `[width, inner]`.
    pub q: Projection<B>,
    /// Keys.
    pub k: Projection<B>,
    /// Values.
    pub v: Projection<B>,
    /// Output, `[inner, width]`.
    pub o: Projection<B>,
    heads: usize,
}

impl<B: Backend> MultiHead<B> {
    /// `heads` heads over an inner width of `inner` (SAM's cross-attention
    /// halves it).
    pub(crate) fn new(rng: &mut ChaCha8Rng, width: usize, inner: usize, heads: usize, device: &B::Device) -> Self {
        Self {
            q: projection(rng, width, inner, device),
            k: projection(rng, width, inner, device),
            v: projection(rng, width, inner, device),
            o: projection(rng, inner, width, device),
            heads,
        }
    }

    /// `queries: [b, t, width]` over `keys`, `values: [b, s, width]`; the
    /// result `[b, t, width]` in the low type.
    pub fn forward(
        &self,
        queries: Tensor<B, 3>,
        keys: Tensor<B, 3>,
        values: Tensor<B, 3>,
        ac: &Autocast,
    ) -> Tensor<B, 3> {
        let split = |p: &Projection<B>, x| ac.low(vramfit::fused::split_heads(p.forward(x, ac), self.heads));
        let q = split(&self.q, queries);
        let k = split(&self.k, keys);
        let v = split(&self.v, values);
        let scale = 1.0 / (q.dims()[3] as f64).sqrt();
        let mixed = vramfit::fused::attention(q, k, v, scale, false);
        self.o.forward(vramfit::fused::merge_heads(mixed), ac)
    }
}

/// `x · W₁ + b₁`, GELU (in f32), `· W₂ + b₂`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// In, `[width, hidden]`.
    pub up: Projection<B>,
    /// Out, `[hidden, out]`.
    pub down: Projection<B>,
}

impl<B: Backend> Mlp<B> {
    pub(crate) fn new(rng: &mut ChaCha8Rng, width: usize, hidden: usize, out: usize, device: &B::Device) -> Self {
        Self {
            up: projection(rng, width, hidden, device),
            down: projection(rng, hidden, out, device),
        }
    }

    /// `x: [.., width]` → `[.., out]` in the low type.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, ac: &Autocast) -> Tensor<B, D> {
        self.down.forward(gelu(ac.full(self.up.forward(x, ac))), ac)
    }
}
