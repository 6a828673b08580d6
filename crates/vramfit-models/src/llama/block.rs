//! A Llama decoder block and its parts: RMSNorm, rotary positions,
//! grouped-query attention and the SwiGLU MLP over projections that may be
//! frozen, stored small or adapted ([`vramfit::lora::Projection`]).

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::activation::silu;
use vramfit::activation_checkpointing::Block;
use vramfit::precision::Autocast;

/// A projection `x · W (+ b)`, `W: [in, out]`, frozen and stored small or
/// trained, with a low-rank adapter where the model has one
/// ([`vramfit::lora`]).
pub type Proj<B> = vramfit::lora::Projection<B>;

pub use vramfit::lora::Lora;

/// RMSNorm: `x / √(mean(x²) + ε) · γ`, in f32.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// γ.
    pub weight: Param<Tensor<B, 1>>,
    pub(super) eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Normalises the last axis of `x`.
    pub fn forward(&self, x: Tensor<B, 3>, ac: &Autocast) -> Tensor<B, 3> {
        let x = ac.full(x);
        let scale = (x.clone().powi_scalar(2).mean_dim(2) + self.eps).sqrt().recip();
        x * scale * ac.full(self.weight.val()).unsqueeze::<3>()
    }
}

/// Rotary positions on `x: [b, h, t, dh]` (f32; positions 0..t): each pair
/// (i, i + dh/2) turned by position · θ^(−2i/dh), as Llama's reference
/// does ("rotate half"); one operation on the CPU.
pub use vramfit::fused::rotary;

/// One decoder block.
#[derive(Module, Debug)]
pub struct LlamaBlock<B: Backend> {
    /// Norm before attention.
    pub attn_norm: RmsNorm<B>,
    /// Query projection.
    pub q: Proj<B>,
    /// Key projection (kv_heads heads).
    pub k: Proj<B>,
    /// Value projection (kv_heads heads).
    pub v: Proj<B>,
    /// Output projection.
    pub o: Proj<B>,
    /// Norm before the MLP.
    pub mlp_norm: RmsNorm<B>,
    /// SwiGLU gate.
    pub gate: Proj<B>,
    /// SwiGLU up.
    pub up: Proj<B>,
    /// SwiGLU down.
    pub down: Proj<B>,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) rope_theta: f64,
    pub(super) fused_attention: bool,
}

impl<B: Backend> LlamaBlock<B> {
    /// `x: [b, kv, t, dh]` with each head repeated for the query heads it serves.
    fn shared(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let group = self.heads / self.kv_heads;
        if group == 1 {
            return x;
        }
        let [b, kv, t, dh] = x.dims();
        x.unsqueeze_dim::<5>(2)
            .repeat_dim(2, group)
            .reshape([b, kv * group, t, dh])
    }
}

impl<B: Backend> Block<B, 3> for LlamaBlock<B> {
    fn forward(&self, x: Tensor<B, 3>, ac: &Autocast) -> Tensor<B, 3> {
        let dh = x.dims()[2] / self.heads;
        let normed = self.attn_norm.forward(x.clone(), ac);
        let split = |p: &Proj<B>, heads| vramfit::fused::split_heads(p.forward(normed.clone(), ac), heads);
        let q = rotary(ac.full(split(&self.q, self.heads)), self.rope_theta);
        // K rounded to the low type before its heads are repeated (both
        // paths' products take it low): the repeat is then in 16 bits.
        let k = self.shared(ac.low(rotary(ac.full(split(&self.k, self.kv_heads)), self.rope_theta)));
        // V in the low type too: a projection with an adapter gives its sum
        // in f32 (base and adapter added in f32), one without it in the low
        // type; the fused attention takes Q, K and V in one type (the
        // standard path's product rounds V the same way).
        let v = self.shared(ac.low(split(&self.v, self.kv_heads)));
        let scale = 1.0 / (dh as f64).sqrt();
        let mixed = if self.fused_attention {
            // Q rounded to the low type after the rotation, as the
            // standard path's product rounds it.
            vramfit::fused::attention(ac.low(q), k, v, scale, true)
        } else {
            let scores = ac.full(ac.matmul(q, k.swap_dims(2, 3))); // [b, h, t, t]
            let attn = vramfit::fused::causal_softmax(scores, scale);
            ac.matmul(attn, v)
        };
        let x = x + ac.full(self.o.forward(vramfit::fused::merge_heads(mixed), ac));
        let normed = self.mlp_norm.forward(x.clone(), ac);
        let hidden = silu(ac.full(self.gate.forward(normed.clone(), ac))) * ac.full(self.up.forward(normed, ac));
        x + ac.full(self.down.forward(hidden, ac))
    }
}
