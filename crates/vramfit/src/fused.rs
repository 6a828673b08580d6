//! Causal softmax, layer normalisation, GELU, the attention heads'
//! layout changes and the (batched) matrix product as single autodiff
//! operations on the CPU backend.
//!
//! Burn's autodiff builds softmax from elementwise operations (max,
//! subtract, exp, sum and divide, after the scale and the mask: each a pass
//! over the whole `[b, h, t, t]` score tensor, forward and again backward)
//! and a layer norm from nine. Splitting a `[b, t, h·dh]` tensor into heads
//! `[b, h, t, dh]` and merging them back are permutations that Flex copies
//! element by element (a 4-D stride walk: in the forward for the merge, in
//! the backward for each of q, k and v). Flex's GELU calls libm's erf per
//! element. On `Autodiff<Flex>` with f32 tensors, each function here is one
//! forward and one backward pass per row; the layout changes copy
//! `dh`-long runs; GELU's erf and exp are branch-free approximations that
//! the compiler vectorises (within 6e-7 of the exact erf). Together they
//! took the transformer at PyTorch's shape from 593 to 357 ms per step
//! (measured one change at a time; see the README). On every other
//! backend and type the functions are Burn's own
//! operations (the `*_reference` functions, also the tests' oracle), so GPU
//! backends, whose fusion already merges elementwise ops, see no change.
//!
//! The dispatch is by type at run time (`Any`): the models stay generic
//! over `B: Backend`, with no extra trait bound to thread through every
//! workload.

use std::any::Any;

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, TensorPrimitive};
use burn_flex::FlexTensor;
use rayon::prelude::*;

/// The backend the fused kernels serve.
type Cpu = Autodiff<Flex>;

/// Rows handed to one rayon task: enough work to amortise the task.
const ROWS_PER_TASK: usize = 32;

/// `value` as a `T` when it is one, else back as itself.
pub(crate) fn downcast<A: 'static, T: 'static>(value: A) -> Result<T, A> {
    let boxed: Box<dyn Any> = Box::new(value);
    match boxed.downcast::<T>() {
        Ok(t) => Ok(*t),
        Err(boxed) => Err(*boxed.downcast::<A>().expect("the value boxed just above")),
    }
}

/// `t` as an f32 tensor of the CPU backend, if it is one.
fn on_cpu<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Tensor<Cpu, D>, Tensor<B, D>> {
    if t.dtype() != DType::F32 {
        return Err(t);
    }
    downcast(t)
}

fn back<B: Backend, const D: usize>(t: Tensor<Cpu, D>) -> Tensor<B, D> {
    downcast(t).unwrap_or_else(|_| unreachable!("converted from B by on_cpu"))
}

/// The f32 values of a Flex tensor, row major (copied only when it is a view).
pub(crate) fn values(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(t.to_contiguous().as_slice::<f32>().expect("contiguous").to_vec()),
    }
}

fn flex(values: Vec<f32>, shape: burn::tensor::Shape) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// Softmax over the last axis of `scale · scores` (`scale > 0`) with a
/// causal mask: `scores` is `[.., t, t]` (query, key), and key `j` is
/// masked (weight 0) for query `i < j`.
pub fn causal_softmax<B: Backend, const D: usize>(scores: Tensor<B, D>, scale: f64) -> Tensor<B, D> {
    let dims = scores.dims();
    assert!(
        D >= 2 && dims[D - 1] == dims[D - 2],
        "causal softmax needs [.., t, t] scores, got {dims:?}"
    );
    // The CPU kernel takes the row maximum before scaling.
    assert!(scale > 0.0, "causal softmax scale must be positive, got {scale}");
    match on_cpu(scores) {
        Ok(s) => back(causal_softmax_cpu(s, scale as f32)),
        Err(s) => causal_softmax_reference(s, scale),
    }
}

/// [`causal_softmax`] from Burn's operations (every backend; the CPU
/// kernels' oracle): the mask as an added row of 0 / −∞ over each
/// flattened `t × t` block.
pub fn causal_softmax_reference<B: Backend, const D: usize>(scores: Tensor<B, D>, scale: f64) -> Tensor<B, D> {
    let dims = scores.dims();
    let t = dims[D - 1];
    let device = scores.device();
    let rows = Tensor::<B, 1, Int>::arange(0..t as i64, &device).reshape([t, 1]);
    let cols = Tensor::<B, 1, Int>::arange(0..t as i64, &device).reshape([1, t]);
    let bias = Tensor::<B, 2>::zeros([t, t], &device)
        .mask_fill(cols.greater(rows), f32::NEG_INFINITY)
        .reshape([1, t * t])
        .cast(burn::tensor::FloatDType::from(scores.dtype()));
    let blocks = dims.iter().product::<usize>() / (t * t);
    let masked = scores.mul_scalar(scale).reshape([blocks, t * t]) + bias;
    softmax(masked.reshape(dims), D - 1)
}

/// One causal row: query `i` of a row of length `t`; only keys `0..=i` count.
fn causal_softmax_rows(x: &[f32], y: &mut [f32], t: usize, first_row: usize, scale: f32) {
    for (r, (xr, yr)) in x.chunks_exact(t).zip(y.chunks_exact_mut(t)).enumerate() {
        let keys = (first_row + r) % t + 1;
        let (xr, (yk, masked)) = (&xr[..keys], yr.split_at_mut(keys));
        let max = xr.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) * scale;
        let mut sum = 0.0f32;
        for (o, v) in yk.iter_mut().zip(xr) {
            *o = (*v * scale - max).exp();
            sum += *o;
        }
        let inv = 1.0 / sum;
        yk.iter_mut().for_each(|o| *o *= inv);
        masked.fill(0.0);
    }
}

fn causal_softmax_forward(x: &FlexTensor, scale: f32) -> FlexTensor {
    let shape = x.layout().shape().clone();
    let t = shape[shape.num_dims() - 1];
    let x = values(x);
    let mut y = vec![0.0f32; x.len()];
    let task = ROWS_PER_TASK * t;
    y.par_chunks_mut(task)
        .zip(x.par_chunks(task))
        .enumerate()
        .for_each(|(i, (yc, xc))| causal_softmax_rows(xc, yc, t, i * ROWS_PER_TASK, scale));
    flex(y, shape)
}

/// `dx = scale · y ⊙ (dy − Σ dy ⊙ y)` per row (masked entries have y = 0).
fn softmax_backward(y: &FlexTensor, dy: &FlexTensor, scale: f32) -> FlexTensor {
    let shape = y.layout().shape().clone();
    let t = shape[shape.num_dims() - 1];
    let (y, dy) = (values(y), values(dy));
    let mut dx = vec![0.0f32; y.len()];
    let task = ROWS_PER_TASK * t;
    dx.par_chunks_mut(task)
        .zip(y.par_chunks(task).zip(dy.par_chunks(task)))
        .for_each(|(dxc, (yc, dyc))| {
            for ((o, yr), dyr) in dxc.chunks_exact_mut(t).zip(yc.chunks_exact(t)).zip(dyc.chunks_exact(t)) {
                let dot: f32 = yr.iter().zip(dyr).map(|(a, b)| a * b).sum();
                for ((o, a), b) in o.iter_mut().zip(yr).zip(dyr) {
                    *o = scale * *a * (*b - dot);
                }
            }
        });
    flex(dx, shape)
}

fn causal_softmax_cpu<const D: usize>(scores: Tensor<Cpu, D>, scale: f32) -> Tensor<Cpu, D> {
    #[derive(Debug)]
    struct CausalSoftmax;

    impl Backward<Flex, 1> for CausalSoftmax {
        // The output and the scale: the backward needs nothing else.
        type State = (FlexTensor, f32);

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let dy = grads.consume::<Flex>(&ops.node);
            let (y, scale) = ops.state;
            if let Some(node) = &ops.parents[0] {
                grads.register::<Flex>(node.id, softmax_backward(&y, &dy, scale));
            }
        }
    }

    let x = scores.into_primitive().tensor();
    let out = match CausalSoftmax
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = causal_softmax_forward(&x.primitive, scale);
            prep.finish((y.clone(), scale), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(causal_softmax_forward(&x.primitive, scale)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Layer normalisation over the last axis: `(x − mean) / √(var + eps) · γ + β`
/// (biased variance, as PyTorch's `layer_norm`).
pub fn layer_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    if gamma.dtype() == DType::F32 && beta.dtype() == DType::F32 {
        match on_cpu(x) {
            Ok(x) => {
                let (gamma, beta) = (
                    downcast(gamma).unwrap_or_else(|_| unreachable!("same backend as x")),
                    downcast(beta).unwrap_or_else(|_| unreachable!("same backend as x")),
                );
                return back(layer_norm_cpu(x, gamma, beta, eps as f32));
            }
            Err(x) => return layer_norm_reference(x, gamma, beta, eps),
        }
    }
    layer_norm_reference(x, gamma, beta, eps)
}

/// [`layer_norm`] from Burn's operations (every backend; the CPU kernels' oracle).
pub fn layer_norm_reference<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    let last = D - 1;
    let centred = x.clone() - x.mean_dim(last);
    let var = centred.clone().powi_scalar(2).mean_dim(last);
    let y = centred / var.add_scalar(eps).sqrt();
    let w = gamma.dims()[0];
    let mut shape = [1; D];
    shape[last] = w;
    y * gamma.reshape(shape) + beta.reshape(shape)
}

/// Forward state: the normalised input and each row's `1 / σ`.
#[derive(Debug, Clone)]
struct Normed {
    x_hat: Vec<f32>,
    rstd: Vec<f32>,
}

fn layer_norm_forward(x: &FlexTensor, gamma: &[f32], beta: &[f32], eps: f32) -> (FlexTensor, Normed) {
    let shape = x.layout().shape().clone();
    let w = gamma.len();
    let x = values(x);
    let rows = x.len() / w;
    let (mut y, mut x_hat, mut rstd) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()], vec![0.0f32; rows]);
    let task = ROWS_PER_TASK * w;
    y.par_chunks_mut(task)
        .zip(x_hat.par_chunks_mut(task))
        .zip(rstd.par_chunks_mut(ROWS_PER_TASK))
        .zip(x.par_chunks(task))
        .for_each(|(((yc, hc), rc), xc)| {
            for (((yr, hr), r), xr) in yc
                .chunks_exact_mut(w)
                .zip(hc.chunks_exact_mut(w))
                .zip(rc.iter_mut())
                .zip(xc.chunks_exact(w))
            {
                let mean = xr.iter().sum::<f32>() / w as f32;
                let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / w as f32;
                *r = 1.0 / (var + eps).sqrt();
                for ((((o, h), v), g), b) in yr.iter_mut().zip(hr.iter_mut()).zip(xr).zip(gamma).zip(beta) {
                    *h = (v - mean) * *r;
                    *o = *h * g + b;
                }
            }
        });
    (flex(y, shape), Normed { x_hat, rstd })
}

/// `(dx, dγ, dβ)`: with `g = dy ⊙ γ`, `dx = (g − mean(g) − x̂ · mean(g ⊙ x̂)) / σ`;
/// `dγ = Σ dy ⊙ x̂` and `dβ = Σ dy` over rows, added per task and then in
/// task order (the same sums whatever the thread count).
fn layer_norm_backward(normed: &Normed, gamma: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let w = gamma.len();
    let mut dx = vec![0.0f32; dy.len()];
    let task = ROWS_PER_TASK * w;
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(task)
        .zip(normed.x_hat.par_chunks(task))
        .zip(normed.rstd.par_chunks(ROWS_PER_TASK))
        .zip(dy.par_chunks(task))
        .map(|(((dxc, hc), rc), dyc)| {
            let (mut d_gamma, mut d_beta) = (vec![0.0f32; w], vec![0.0f32; w]);
            for (((dxr, hr), r), dyr) in dxc
                .chunks_exact_mut(w)
                .zip(hc.chunks_exact(w))
                .zip(rc)
                .zip(dyc.chunks_exact(w))
            {
                let (mut mean_g, mut mean_gh) = (0.0f32, 0.0f32);
                for (((dg, db), (d, h)), g) in d_gamma
                    .iter_mut()
                    .zip(d_beta.iter_mut())
                    .zip(dyr.iter().zip(hr))
                    .zip(gamma)
                {
                    *dg += d * h;
                    *db += d;
                    mean_g += d * g;
                    mean_gh += d * g * h;
                }
                mean_g /= w as f32;
                mean_gh /= w as f32;
                for (((o, d), h), g) in dxr.iter_mut().zip(dyr).zip(hr).zip(gamma) {
                    *o = (d * g - mean_g - h * mean_gh) * r;
                }
            }
            (d_gamma, d_beta)
        })
        .collect();
    let (mut d_gamma, mut d_beta) = (vec![0.0f32; w], vec![0.0f32; w]);
    for (dg, db) in &partials {
        d_gamma.iter_mut().zip(dg).for_each(|(a, b)| *a += b);
        d_beta.iter_mut().zip(db).for_each(|(a, b)| *a += b);
    }
    (dx, d_gamma, d_beta)
}

fn layer_norm_cpu<const D: usize>(
    x: Tensor<Cpu, D>,
    gamma: Tensor<Cpu, 1>,
    beta: Tensor<Cpu, 1>,
    eps: f32,
) -> Tensor<Cpu, D> {
    #[derive(Debug)]
    struct LayerNorm;

    impl Backward<Flex, 3> for LayerNorm {
        type State = (Normed, FlexTensor, burn::tensor::Shape);

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let dy = grads.consume::<Flex>(&ops.node);
            let (normed, gamma, shape) = ops.state;
            let (dx, d_gamma, d_beta) = layer_norm_backward(&normed, &values(&gamma), &values(&dy));
            let w = d_gamma.len();
            let [x, g, b] = ops.parents;
            if let Some(node) = x {
                grads.register::<Flex>(node.id, flex(dx, shape));
            }
            if let Some(node) = g {
                grads.register::<Flex>(node.id, flex(d_gamma, [w].into()));
            }
            if let Some(node) = b {
                grads.register::<Flex>(node.id, flex(d_beta, [w].into()));
            }
        }
    }

    let (x, gamma, beta) = (
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.into_primitive().tensor(),
    );
    let forward = || {
        let (g, b) = (values(&gamma.primitive), values(&beta.primitive));
        layer_norm_forward(&x.primitive, &g, &b, eps)
    };
    let out = match LayerNorm
        .prepare::<NoCheckpointing>([x.node.clone(), gamma.node.clone(), beta.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (y, normed) = forward();
            let shape = x.primitive.layout().shape().clone();
            prep.finish((normed, gamma.primitive.clone(), shape), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward().0),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `[b, t, h·dh]` → `[b, h, t, dh]`: the attention heads of `x`.
pub fn split_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [b, t, w] = x.dims();
    assert_eq!(w % heads, 0, "width {w} is not a multiple of {heads} heads");
    match on_cpu(x) {
        Ok(x) => back(split_heads_cpu(x, [b, heads, t, w / heads])),
        Err(x) => x.reshape([b, t, heads, w / heads]).swap_dims(1, 2),
    }
}

/// `[b, h, t, dh]` → `[b, t, h·dh]`: the heads side by side again.
pub fn merge_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 3> {
    let [b, h, t, dh] = x.dims();
    match on_cpu(x) {
        Ok(x) => back(merge_heads_cpu(x)),
        Err(x) => x.swap_dims(1, 2).reshape([b, t, h * dh]),
    }
}

/// A `[b, t, w]` Flex tensor's buffer with its offset and its batch and
/// token strides, when its last axis is dense; else a dense copy's.
fn rows3(x: &FlexTensor) -> (std::borrow::Cow<'_, [f32]>, usize, [usize; 2]) {
    let l = x.layout();
    let s = l.strides();
    if s[2] == 1 && s[0] >= 0 && s[1] >= 0 {
        let (s0, s1) = (s[0] as usize, s[1] as usize);
        return (
            std::borrow::Cow::Borrowed(x.storage::<f32>()),
            l.start_offset(),
            [s0, s1],
        );
    }
    let d = l.shape();
    (values(x), 0, [d[1] * d[2], d[2]])
}

/// `dst[b][h][t] = src[b][t][h]` for runs of `dh` values; `src` rows at
/// `offset + b·sb + t·st`.
fn heads_from_rows(src: &[f32], offset: usize, [sb, st]: [usize; 2], [b, h, t, dh]: [usize; 4]) -> Vec<f32> {
    let mut dst = vec![0.0f32; b * h * t * dh];
    dst.par_chunks_mut(t * dh).enumerate().for_each(|(bh, out)| {
        let (bi, hi) = (bh / h, bh % h);
        for (ti, run) in out.chunks_exact_mut(dh).enumerate() {
            let at = offset + bi * sb + ti * st + hi * dh;
            run.copy_from_slice(&src[at..at + dh]);
        }
    });
    dst
}

/// `dst[b][t][h] = src[b][h][t]` for runs of `dh` values (`src` dense).
fn rows_from_heads(src: &[f32], [b, h, t, dh]: [usize; 4]) -> Vec<f32> {
    let w = h * dh;
    let mut dst = vec![0.0f32; b * t * w];
    dst.par_chunks_mut(w).enumerate().for_each(|(bt, row)| {
        let (bi, ti) = (bt / t, bt % t);
        for (hi, run) in row.chunks_exact_mut(dh).enumerate() {
            let at = ((bi * h + hi) * t + ti) * dh;
            run.copy_from_slice(&src[at..at + dh]);
        }
    });
    dst
}

fn split_heads_forward(x: &FlexTensor, dims: [usize; 4]) -> FlexTensor {
    let (src, offset, strides) = rows3(x);
    flex(heads_from_rows(&src, offset, strides, dims), dims.into())
}

fn merge_heads_forward(x: &FlexTensor, [b, h, t, dh]: [usize; 4]) -> FlexTensor {
    flex(rows_from_heads(&values(x), [b, h, t, dh]), [b, t, h * dh].into())
}

/// One of the two head permutations as an autodiff operation whose
/// backward is the other.
fn heads_op<const I: usize, const O: usize>(
    x: Tensor<Cpu, I>,
    dims: [usize; 4],
    forward: fn(&FlexTensor, [usize; 4]) -> FlexTensor,
    backward: fn(&FlexTensor, [usize; 4]) -> FlexTensor,
) -> Tensor<Cpu, O> {
    #[derive(Debug)]
    struct Heads;

    impl Backward<Flex, 1> for Heads {
        type State = ([usize; 4], fn(&FlexTensor, [usize; 4]) -> FlexTensor);

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let dy = grads.consume::<Flex>(&ops.node);
            let (dims, backward) = ops.state;
            if let Some(node) = &ops.parents[0] {
                grads.register::<Flex>(node.id, backward(&dy, dims));
            }
        }
    }

    let x = x.into_primitive().tensor();
    let out = match Heads
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((dims, backward), forward(&x.primitive, dims)),
        OpsKind::UnTracked(prep) => prep.finish(forward(&x.primitive, dims)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn split_heads_cpu(x: Tensor<Cpu, 3>, dims: [usize; 4]) -> Tensor<Cpu, 4> {
    heads_op(x, dims, split_heads_forward, merge_heads_forward)
}

fn merge_heads_cpu(x: Tensor<Cpu, 4>) -> Tensor<Cpu, 3> {
    let dims = x.dims();
    heads_op(x, dims, merge_heads_forward, split_heads_forward)
}

/// `x·Φ(x)`, the exact (erf) GELU.
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match on_cpu(x) {
        Ok(x) => back(gelu_cpu(x)),
        Err(x) => burn::tensor::activation::gelu(x),
    }
}

/// erf on f32 as `x·P(x²)/Q(x²)` on `|x| ≤ 4` (erf is 1 in f32 beyond):
/// a rational least-squares fit made for vramfit (max error 2e-8 in
/// exact arithmetic, 5e-7 evaluated in f32; tested against libm below).
/// Branch-free, so loops over it vectorise.
#[inline(always)]
// P[0] is fitted (1.1283790), not 2/√π (1.1283792) spelt approximately.
#[allow(clippy::approx_constant)]
fn erf_fast(x: f32) -> f32 {
    const P: [f32; 6] = [
        1.128_379,
        0.196_220_82,
        0.053_462_9,
        0.004_002_139,
        0.000_287_957_3,
        1.974_44e-6,
    ];
    const Q: [f32; 6] = [
        1.0,
        0.507_227_36,
        0.116_463_98,
        0.015_441_535,
        0.001_215_894_9,
        3.747_228_7e-5,
    ];
    let x = x.clamp(-4.0, 4.0);
    let z = x * x;
    let p = P.iter().rev().fold(0.0f32, |acc, c| acc * z + c);
    let q = Q.iter().rev().fold(0.0f32, |acc, c| acc * z + c);
    x * p / q
}

/// `e^y` for `y ≤ 0` (`y` below −87 gives about 1e-38): `2^k · e^r` with
/// `|r| ≤ ln2/2` and a degree-6 Taylor polynomial (relative error 2e-7).
/// Branch-free, so loops over it vectorise.
#[inline(always)]
fn exp_nonpositive(y: f32) -> f32 {
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let y = y.max(-87.0);
    let k = (y * std::f32::consts::LOG2_E + ROUND) - ROUND;
    // ln 2 in two parts (the first exact in few bits), so that k·ln2 is exact.
    let r = (y - k * 0.693_359_4) + k * 2.121_944_4e-4;
    let e = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    e * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

fn gelu_forward(x: &FlexTensor) -> FlexTensor {
    let shape = x.layout().shape().clone();
    let x = values(x);
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(1 << 14)
        .zip(x.par_chunks(1 << 14))
        .for_each(|(yc, xc)| {
            for (o, v) in yc.iter_mut().zip(xc) {
                *o = 0.5 * v * (1.0 + erf_fast(v * std::f32::consts::FRAC_1_SQRT_2));
            }
        });
    flex(y, shape)
}

/// `dx = dy · (Φ(x) + x·φ(x))`.
fn gelu_backward(x: &FlexTensor, dy: &FlexTensor) -> FlexTensor {
    let shape = x.layout().shape().clone();
    let (x, dy) = (values(x), values(dy));
    let inv_sqrt_2pi = 0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(1 << 14)
        .zip(x.par_chunks(1 << 14).zip(dy.par_chunks(1 << 14)))
        .for_each(|(dc, (xc, gc))| {
            for ((o, v), g) in dc.iter_mut().zip(xc).zip(gc) {
                let cdf = 0.5 * (1.0 + erf_fast(v * std::f32::consts::FRAC_1_SQRT_2));
                let pdf = inv_sqrt_2pi * exp_nonpositive(-0.5 * v * v);
                *o = g * (cdf + v * pdf);
            }
        });
    flex(dx, shape)
}

fn gelu_cpu<const D: usize>(x: Tensor<Cpu, D>) -> Tensor<Cpu, D> {
    #[derive(Debug)]
    struct Gelu;

    impl Backward<Flex, 1> for Gelu {
        type State = FlexTensor;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let dy = grads.consume::<Flex>(&ops.node);
            if let Some(node) = &ops.parents[0] {
                grads.register::<Flex>(node.id, gelu_backward(&ops.state, &dy));
            }
        }
    }

    let x = x.into_primitive().tensor();
    let out = match Gelu
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = gelu_forward(&x.primitive);
            prep.finish(x.primitive, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(gelu_forward(&x.primitive)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `a · b` for `a: [.., m, k]`, `b: [.., k, n]` with the same leading
/// (batch) dimensions. On the CPU backend the products are written
/// straight into the result's own `Vec<f32>`: Flex's matmul makes every
/// result with `FlexTensor::empty`, a zeroed byte vector that
/// `Bytes::from_bytes_vec` then copies into a 16-byte aligned allocation
/// (a `Vec<u8>` reports alignment 1), a memset and a memcpy per product
/// that were 8 % of the transformer's step. Broadcast batch dimensions
/// and other backends and types use Burn's matmul.
pub fn matmul<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    let same_batch = a.dims()[..D - 2] == b.dims()[..D - 2];
    match (on_cpu(a), on_cpu(b)) {
        (Ok(a), Ok(b)) if same_batch => back(matmul_cpu(a, b)),
        (a, b) => {
            let a = a.map_or_else(|t| t, back);
            let b = b.map_or_else(|t| t, back);
            a.matmul(b)
        }
    }
}

/// Batched matrices as gemm reads them: each `[rows, cols]` matrix (as
/// used) `size` values after the previous one, its elements `rs` apart
/// down a column and `cs` apart along a row.
#[derive(Clone, Copy)]
struct Operand<'a> {
    values: &'a [f32],
    size: usize,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
}

impl<'a> Operand<'a> {
    /// Row-major matrices of `rows × cols`.
    fn plain(values: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            values,
            size: rows * cols,
            rows,
            cols,
            rs: cols as isize,
            cs: 1,
        }
    }

    /// The same matrices used transposed.
    fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Values from the first element of a matrix to its last, inclusive.
    fn extent(&self) -> usize {
        (self.rows - 1) * self.rs.unsigned_abs() + (self.cols - 1) * self.cs.unsigned_abs() + 1
    }
}

/// A Flex tensor's `[batch.., rows, cols]` matrices, read where they lie
/// when each is stored row major or transposed (a `swap_dims` of the last
/// two axes, as attention's `kᵀ`) and the batch is packed, or, for a
/// single matrix, when its rows are further apart than its width (a
/// `narrow` of the columns, as one of q, k, v's blocks of the joint
/// weight); copied to row major otherwise.
struct Matrices<'a> {
    values: std::borrow::Cow<'a, [f32]>,
    batch: usize,
    rows: usize,
    cols: usize,
    /// Stored as row-major `[cols, rows]` matrices.
    transposed: bool,
    /// Values between consecutive stored rows.
    stored_row_stride: usize,
}

impl<'a> Matrices<'a> {
    fn of(t: &'a FlexTensor) -> Self {
        let (batch, rows, cols) = matrices(t);
        let copied = |t: &'a FlexTensor| Self {
            values: values(t),
            batch,
            rows,
            cols,
            transposed: false,
            stored_row_stride: cols,
        };
        if batch * rows * cols == 0 {
            return copied(t);
        }
        let layout = t.layout();
        let (dims, strides) = (layout.shape().to_vec(), layout.strides());
        let d = dims.len();
        let stride_is = |axis: usize, expected: usize| dims[axis] == 1 || strides[axis] == expected as isize;
        // Row stride of the stored rows: the matrix's width, or more for
        // a single matrix.
        let (transposed, stored_row_stride) = if stride_is(d - 1, 1) && stride_is(d - 2, cols) {
            (false, cols)
        } else if stride_is(d - 2, 1) && stride_is(d - 1, rows) {
            (true, rows)
        } else if batch == 1 && strides[d - 1] == 1 && strides[d - 2] >= cols as isize {
            (false, strides[d - 2] as usize)
        } else if batch == 1 && strides[d - 2] == 1 && strides[d - 1] >= rows as isize {
            (true, strides[d - 1] as usize)
        } else {
            return copied(t);
        };
        let mut expected = rows * cols;
        let mut packed = true;
        for axis in (0..d - 2).rev() {
            packed &= stride_is(axis, expected);
            expected *= dims[axis];
        }
        let (stored_rows, stored_cols) = if transposed { (cols, rows) } else { (rows, cols) };
        let extent = (batch - 1) * rows * cols + (stored_rows - 1) * stored_row_stride + stored_cols;
        let start = layout.start_offset();
        match t.storage::<f32>().get(start..start + extent) {
            Some(values) if packed => Self {
                values: std::borrow::Cow::Borrowed(values),
                batch,
                rows,
                cols,
                transposed,
                stored_row_stride,
            },
            _ => copied(t),
        }
    }

    fn operand(&self) -> Operand<'_> {
        let stored = Operand {
            values: &self.values,
            size: self.rows * self.cols,
            rows: self.rows,
            cols: self.cols,
            rs: self.stored_row_stride as isize,
            cs: 1,
        };
        if self.transposed {
            Operand {
                rows: self.cols,
                cols: self.rows,
                ..stored
            }
            .t()
        } else {
            stored
        }
    }
}

/// `lhs · rhs` for each of `batch` pairs, into a new row-major
/// `[batch, lhs.rows, rhs.cols]` vector.
fn gemm_products(batch: usize, lhs: Operand, rhs: Operand) -> Vec<f32> {
    gemm_products_onto(batch, lhs, rhs, None)
}

/// [`gemm_products`], each result row added onto `bias` (`rhs.cols`
/// values) when given: gemm starts from the bias rows instead of a separate
/// pass that adds them afterwards.
fn gemm_products_onto(batch: usize, lhs: Operand, rhs: Operand, bias: Option<&[f32]>) -> Vec<f32> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(rhs.rows == k && bias.is_none_or(|b| b.len() == n), "operand shapes");
    if k == 0 || m * n == 0 {
        return match bias {
            Some(b) => b.repeat(batch * m),
            None => vec![0.0; batch * m * n],
        };
    }
    // Strides are never negative here (`Matrices::of` and `plain` make
    // none), so every value gemm reads lies in `values` when this holds.
    let fits =
        |o: &Operand| o.rs >= 0 && o.cs >= 0 && (batch == 0 || o.values.len() >= (batch - 1) * o.size + o.extent());
    assert!(fits(&lhs) && fits(&rhs), "operand values");
    // Flex's thresholds: threads inside one product from about 192³
    // multiply-adds; else one product per task when there are several.
    let large = m * n * k >= 192 * 192 * 192;
    let one = |i: usize, dst: &mut [std::mem::MaybeUninit<f32>], parallelism| {
        if let Some(bias) = bias {
            for row in dst.chunks_mut(n) {
                for (d, &b) in row.iter_mut().zip(bias) {
                    d.write(b);
                }
            }
        }
        // SAFETY: `dst` has room for the m·n values of product `i`, written
        // in row-major order (row stride n, column stride 1), read only
        // when the bias rows were written into it just above (`read_dst`);
        // product `i`'s operands lie inside the slices at the given strides
        // (matrix `i` starts `i·size` in, lengths asserted above).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr().cast::<f32>(),
                1,
                n as isize,
                bias.is_some(),
                lhs.values.as_ptr().add(i * lhs.size),
                lhs.cs,
                lhs.rs,
                rhs.values.as_ptr().add(i * rhs.size),
                rhs.cs,
                rhs.rs,
                if bias.is_some() { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    };
    let mut out = Vec::<f32>::with_capacity(batch * m * n);
    let spare = &mut out.spare_capacity_mut()[..batch * m * n];
    if large || batch == 1 {
        let parallelism = if large {
            gemm::Parallelism::Rayon(0)
        } else {
            gemm::Parallelism::None
        };
        for (i, dst) in spare.chunks_mut(m * n).enumerate() {
            one(i, dst, parallelism);
        }
    } else {
        spare
            .par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(i, dst)| one(i, dst, gemm::Parallelism::None));
    }
    // SAFETY: every product wrote all of its m·n values above.
    unsafe { out.set_len(batch * m * n) };
    out
}

/// (batch, rows, columns) of a Flex tensor of matrices.
fn matrices(t: &FlexTensor) -> (usize, usize, usize) {
    let dims = t.layout().shape().to_vec();
    let d = dims.len();
    (dims[..d - 2].iter().product(), dims[d - 2], dims[d - 1])
}

/// `p · q` for each of `like`'s `batch` matrices, as a tensor of `like`'s
/// shape whose matrices lie as `like`'s do: a gradient shaped like a
/// transposed view is computed as `qᵀ · pᵀ` and viewed transposed, so the
/// `swap_dims` backward that follows gets a row-major tensor, not a copy
/// to make.
fn product_like(p: Operand, q: Operand, like: &Matrices, shape: burn::tensor::Shape) -> FlexTensor {
    if like.transposed {
        let d = shape.num_dims();
        let mut stored = shape.clone();
        (stored[d - 2], stored[d - 1]) = (shape[d - 1], shape[d - 2]);
        flex(gemm_products(like.batch, q.t(), p.t()), stored).transpose(d - 2, d - 1)
    } else {
        flex(gemm_products(like.batch, p, q), shape)
    }
}

/// The gradients of `a · b` from the output's row-major `g`, for the
/// parents that want them: `da = g · bᵀ`, `db = aᵀ · g`.
fn product_backward(a: &FlexTensor, b: &FlexTensor, g: &[f32], [pa, pb]: [Option<NodeId>; 2], grads: &mut Gradients) {
    let (ma, mb) = (Matrices::of(a), Matrices::of(b));
    let g = Operand::plain(g, ma.rows, mb.cols);
    if let Some(id) = pa {
        let da = product_like(g, mb.operand().t(), &ma, a.layout().shape().clone());
        grads.register::<Flex>(id, da);
    }
    if let Some(id) = pb {
        let db = product_like(ma.operand().t(), g, &mb, b.layout().shape().clone());
        grads.register::<Flex>(id, db);
    }
}

fn matmul_cpu<const D: usize>(a: Tensor<Cpu, D>, b: Tensor<Cpu, D>) -> Tensor<Cpu, D> {
    #[derive(Debug)]
    struct Matmul;

    impl Backward<Flex, 2> for Matmul {
        type State = (FlexTensor, FlexTensor);

        fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
            let g = grads.consume::<Flex>(&ops.node);
            let (a, b) = ops.state;
            let [pa, pb] = ops.parents.map(|p| p.map(|node| node.id));
            product_backward(&a, &b, &values(&g), [pa, pb], grads);
        }
    }

    let forward = |a: &FlexTensor, b: &FlexTensor| {
        let (ma, mb) = (Matrices::of(a), Matrices::of(b));
        assert_eq!(ma.cols, mb.rows, "matmul: inner dimensions {} and {}", ma.cols, mb.rows);
        let mut shape = a.layout().shape().clone();
        shape[D - 1] = mb.cols;
        flex(gemm_products(ma.batch, ma.operand(), mb.operand()), shape)
    };
    let (a, b) = (a.into_primitive().tensor(), b.into_primitive().tensor());
    let out = match Matmul
        .prepare::<NoCheckpointing>([a.node.clone(), b.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = forward(&a.primitive, &b.primitive);
            prep.finish((a.primitive, b.primitive), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(&a.primitive, &b.primitive)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `x · w + bias` for `x: [rows, in]`, `w: [in, out]`, `bias: [out]`. On
/// the CPU backend one operation: gemm adds the products onto the bias rows,
/// and the backward sums the bias gradient over the rows of the output's
/// gradient, where Burn's broadcast add is a pass over the output forward
/// and a reduction backward. Other backends and types use Burn's matmul and
/// add.
pub fn linear<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>, bias: Tensor<B, 1>) -> Tensor<B, 2> {
    match (on_cpu(x), on_cpu(w), on_cpu(bias)) {
        (Ok(x), Ok(w), Ok(bias)) => back(linear_cpu(x, w, bias)),
        (x, w, bias) => {
            let x = x.map_or_else(|t| t, back);
            let w = w.map_or_else(|t| t, back);
            let bias = bias.map_or_else(|t| t, back);
            matmul(x, w) + bias.unsqueeze::<2>()
        }
    }
}

fn linear_cpu(x: Tensor<Cpu, 2>, w: Tensor<Cpu, 2>, bias: Tensor<Cpu, 1>) -> Tensor<Cpu, 2> {
    #[derive(Debug)]
    struct Linear;

    impl Backward<Flex, 3> for Linear {
        type State = (FlexTensor, FlexTensor);

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let g = grads.consume::<Flex>(&ops.node);
            let (x, w) = ops.state;
            let g = values(&g);
            let [px, pw, pb] = ops.parents.map(|p| p.map(|node| node.id));
            product_backward(&x, &w, &g, [px, pw], grads);
            if let Some(id) = pb {
                let n = matrices(&w).2;
                let mut sums = vec![0.0f32; n];
                for row in g.chunks(n.max(1)) {
                    for (s, v) in sums.iter_mut().zip(row) {
                        *s += v;
                    }
                }
                grads.register::<Flex>(id, flex(sums, [n].into()));
            }
        }
    }

    let forward = |x: &FlexTensor, w: &FlexTensor, bias: &FlexTensor| {
        let (mx, mw, bias) = (Matrices::of(x), Matrices::of(w), values(bias));
        assert_eq!(
            mx.cols, mw.rows,
            "linear: {} inputs against a weight of {} rows",
            mx.cols, mw.rows
        );
        assert_eq!(
            bias.len(),
            mw.cols,
            "linear: a bias of {} values for {} outputs",
            bias.len(),
            mw.cols
        );
        let y = gemm_products_onto(1, mx.operand(), mw.operand(), Some(&bias));
        flex(y, [mx.rows, mw.cols].into())
    };
    let (x, w, bias) = (
        x.into_primitive().tensor(),
        w.into_primitive().tensor(),
        bias.into_primitive().tensor(),
    );
    let out = match Linear
        .prepare::<NoCheckpointing>([x.node.clone(), w.node.clone(), bias.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = forward(&x.primitive, &w.primitive, &bias.primitive);
            prep.finish((x.primitive, w.primitive), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(&x.primitive, &w.primitive, &bias.primitive)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn close(a: Vec<f32>, b: Vec<f32>, tol: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0.0f32, f32::max);
        assert!(worst <= tol, "{what}: largest relative difference {worst:e} > {tol:e}");
        assert!(
            b.iter().any(|v| v.abs() > 1e-3),
            "{what}: all ~0, the case tests nothing"
        );
    }

    fn host<const D: usize>(t: Tensor<Cpu, D>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    /// The fused softmax's value and gradient are Burn's decomposed ones, on
    /// a non-contiguous input (a transposed view, as attention makes).
    /// The gemm products' value and both gradients are Burn's matmul's, on
    /// transposed (non-contiguous) operands: 2-D, with shapes large enough
    /// for gemm's threads, and batched as attention's.
    #[test]
    fn matmul_matches_burns() {
        let d = Default::default();
        for (m, k, n) in [(37, 19, 23), (256, 200, 192)] {
            let a = Tensor::<Cpu, 2>::random([k, m], Distribution::Normal(0.0, 1.0), &d).require_grad();
            let b = Tensor::<Cpu, 2>::random([k, n], Distribution::Normal(0.0, 1.0), &d).require_grad();
            let up = Tensor::<Cpu, 2>::random([m, n], Distribution::Normal(0.0, 1.0), &d);
            let view = |t: Tensor<Cpu, 2>| t.transpose();
            check_matmul(&a, &b, up, view, |t| t, "2-D");
        }
        let a = Tensor::<Cpu, 4>::random([2, 3, 9, 5], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let b = Tensor::<Cpu, 4>::random([2, 3, 7, 5], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let up = Tensor::<Cpu, 4>::random([2, 3, 9, 7], Distribution::Normal(0.0, 1.0), &d);
        check_matmul(&a, &b, up, |t| t, |t| t.swap_dims(2, 3), "batched");
        // A transposed block of columns: the stored rows further apart than their width.
        let a = Tensor::<Cpu, 2>::random([37, 19], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let b = Tensor::<Cpu, 2>::random([23, 19 + 5], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let up = Tensor::<Cpu, 2>::random([37, 23], Distribution::Normal(0.0, 1.0), &d);
        let block = |t: Tensor<Cpu, 2>| t.narrow(1, 1, 19).transpose();
        check_matmul(&a, &b, up, |t| t, block, "transposed column block");
        // A batch read from an offset into its buffer (a narrow of the batch axis).
        let a = Tensor::<Cpu, 4>::random([4, 3, 9, 5], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let b = Tensor::<Cpu, 4>::random([2, 3, 5, 7], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let up = Tensor::<Cpu, 4>::random([2, 3, 9, 7], Distribution::Normal(0.0, 1.0), &d);
        check_matmul(&a, &b, up, |t| t.narrow(0, 1, 2), |t| t, "batch at an offset");
    }

    fn check_matmul<const D: usize>(
        a: &Tensor<Cpu, D>,
        b: &Tensor<Cpu, D>,
        up: Tensor<Cpu, D>,
        view_a: impl Fn(Tensor<Cpu, D>) -> Tensor<Cpu, D>,
        view_b: impl Fn(Tensor<Cpu, D>) -> Tensor<Cpu, D>,
        what: &str,
    ) {
        let fused = matmul(view_a(a.clone()), view_b(b.clone()));
        let reference = view_a(a.clone()).matmul(view_b(b.clone()));
        close(host(fused.clone()), host(reference.clone()), 1e-5, what);
        let g_fused = (fused * up.clone()).sum().backward();
        let g_ref = (reference * up).sum().backward();
        for (t, side) in [(a, "d_a"), (b, "d_b")] {
            close(
                t.grad(&g_fused).unwrap().into_data().into_vec().unwrap(),
                t.grad(&g_ref).unwrap().into_data().into_vec().unwrap(),
                1e-5,
                &format!("{what} {side}"),
            );
        }
    }

    /// The bias-seeded product and its three gradients are Burn's matmul
    /// and broadcast add's: small, and large enough for gemm's threads and
    /// its blocking over the inner dimension; x a transposed view, the
    /// weight a block of columns of a wider one (rows further apart than
    /// its width, read in place).
    #[test]
    fn linear_matches_burns_matmul_and_add() {
        let d = Default::default();
        for (rows, inputs, outputs) in [(37, 19, 23), (300, 600, 257)] {
            let x = Tensor::<Cpu, 2>::random([inputs, rows], Distribution::Normal(0.0, 1.0), &d).require_grad();
            let wide =
                Tensor::<Cpu, 2>::random([inputs, outputs + 9], Distribution::Normal(0.0, 1.0), &d).require_grad();
            let w = || wide.clone().narrow(1, 4, outputs);
            let bias = Tensor::<Cpu, 1>::random([outputs], Distribution::Normal(0.0, 1.0), &d).require_grad();
            let up = Tensor::<Cpu, 2>::random([rows, outputs], Distribution::Normal(0.0, 1.0), &d);
            // One graph at a time: a backward consumes the graph of every
            // node it reaches.
            let fused = linear(x.clone().transpose(), w(), bias.clone());
            let y_fused = host(fused.clone());
            let g_fused = (fused * up.clone()).sum().backward();
            let reference = x.clone().transpose().matmul(w()) + bias.clone().unsqueeze::<2>();
            let y_ref = host(reference.clone());
            let g_ref = (reference * up).sum().backward();
            let what = format!("{rows}×{inputs}×{outputs}");
            close(y_fused, y_ref, 1e-5, &what);
            let grad = |g: &Gradients, t: &Tensor<Cpu, 2>| t.grad(g).unwrap().into_data().into_vec().unwrap();
            close(grad(&g_fused, &x), grad(&g_ref, &x), 1e-5, &format!("{what} d_x"));
            close(grad(&g_fused, &wide), grad(&g_ref, &wide), 1e-5, &format!("{what} d_w"));
            close(
                bias.grad(&g_fused).unwrap().into_data().into_vec().unwrap(),
                bias.grad(&g_ref).unwrap().into_data().into_vec().unwrap(),
                1e-5,
                &format!("{what} d_bias"),
            );
        }
    }

    /// Row-major, transposed and column-block matrices are read where they
    /// lie; a layout gemm cannot stride through is copied.
    #[test]
    fn matrices_are_read_in_place_where_they_lie() {
        let d = Default::default();
        let t = Tensor::<Flex, 4>::random([2, 3, 5, 7], Distribution::Default, &d);
        let w = Tensor::<Flex, 2>::random([6, 12], Distribution::Default, &d);
        let cases = [
            (t.clone().into_primitive().tensor(), true, false, "row major"),
            (t.clone().swap_dims(2, 3).into_primitive().tensor(), true, true, "kᵀ"),
            (
                w.clone().narrow(1, 4, 4).into_primitive().tensor(),
                true,
                false,
                "column block",
            ),
            (
                w.transpose().narrow(0, 4, 4).into_primitive().tensor(),
                true,
                true,
                "its transpose",
            ),
            (
                t.clone().narrow(0, 1, 1).into_primitive().tensor(),
                true,
                false,
                "a batch at an offset",
            ),
            (
                t.swap_dims(1, 2).into_primitive().tensor(),
                false,
                false,
                "heads swapped",
            ),
        ];
        for (tensor, in_place, transposed, what) in cases {
            let m = Matrices::of(&tensor);
            let borrowed = matches!(m.values, std::borrow::Cow::Borrowed(_));
            assert_eq!((borrowed, m.transposed), (in_place, transposed), "{what}");
        }
    }

    #[test]
    fn causal_softmax_matches_burns_operations() {
        let d = Default::default();
        let x = Tensor::<Cpu, 4>::random([2, 3, 7, 7], Distribution::Normal(0.0, 2.0), &d).require_grad();
        let up = Tensor::<Cpu, 4>::random([2, 3, 7, 7], Distribution::Normal(0.0, 1.0), &d);
        let view = |x: Tensor<Cpu, 4>| x.swap_dims(2, 3);
        let fused = causal_softmax(view(x.clone()), 0.3);
        let reference = causal_softmax_reference(view(x.clone()), 0.3);
        close(host(fused.clone()), host(reference.clone()), 1e-6, "softmax");
        let g_fused = x.grad(&(fused * up.clone()).sum().backward()).unwrap();
        let g_ref = x.grad(&(reference * up).sum().backward()).unwrap();
        close(
            g_fused.into_data().into_vec().unwrap(),
            g_ref.into_data().into_vec().unwrap(),
            1e-5,
            "softmax gradient",
        );
    }

    /// The fused layer norm's value and its three gradients are Burn's
    /// decomposed ones, on rows more than one task long.
    #[test]
    fn layer_norm_matches_burns_operations() {
        let d = Default::default();
        let x = Tensor::<Cpu, 3>::random([3, 40, 24], Distribution::Normal(0.5, 2.0), &d).require_grad();
        let gamma = Tensor::<Cpu, 1>::random([24], Distribution::Normal(1.0, 0.3), &d).require_grad();
        let beta = Tensor::<Cpu, 1>::random([24], Distribution::Normal(0.0, 0.3), &d).require_grad();
        let up = Tensor::<Cpu, 3>::random([3, 40, 24], Distribution::Normal(0.0, 1.0), &d);
        let fused = layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-5);
        let reference = layer_norm_reference(x.clone(), gamma.clone(), beta.clone(), 1e-5);
        close(host(fused.clone()), host(reference.clone()), 1e-5, "layer norm");
        let gf = (fused * up.clone()).sum().backward();
        let gr = (reference * up).sum().backward();
        let v = |t: Tensor<Flex, 3>| t.into_data().into_vec::<f32>().unwrap();
        let v1 = |t: Tensor<Flex, 1>| t.into_data().into_vec::<f32>().unwrap();
        close(v(x.grad(&gf).unwrap()), v(x.grad(&gr).unwrap()), 1e-4, "d_x");
        close(
            v1(gamma.grad(&gf).unwrap()),
            v1(gamma.grad(&gr).unwrap()),
            1e-4,
            "d_gamma",
        );
        close(v1(beta.grad(&gf).unwrap()), v1(beta.grad(&gr).unwrap()), 1e-4, "d_beta");
    }

    /// Other types take Burn's operations: f64 values are not truncated.
    #[test]
    fn other_types_keep_burns_operations() {
        let d = Default::default();
        let x = Tensor::<Cpu, 2>::from_floats([[0.1, 0.2], [0.3, 0.4]], &d).cast(burn::tensor::FloatDType::F64);
        assert_eq!(x.dtype(), DType::F64);
        let y = causal_softmax(x.clone(), 1.0);
        assert_eq!(y.dtype(), DType::F64);
        assert_eq!(
            y.into_data().into_vec::<f64>().unwrap(),
            host_f64(causal_softmax_reference(x, 1.0))
        );
    }

    /// Splitting a narrowed view (as q, k and v are cut from one
    /// projection) and merging back give Burn's reshapes and permutations,
    /// values and gradients.
    #[test]
    fn head_split_and_merge_match_burns_operations() {
        let d = Default::default();
        let qkv = Tensor::<Cpu, 3>::random([2, 5, 3 * 12], Distribution::Normal(0.0, 1.0), &d).require_grad();
        let up = Tensor::<Cpu, 3>::random([2, 5, 12], Distribution::Normal(0.0, 1.0), &d);
        let scale = Tensor::<Cpu, 4>::random([2, 3, 5, 4], Distribution::Normal(0.0, 1.0), &d);
        let run = |fused: bool| {
            let view = qkv.clone().narrow(2, 12, 12);
            let heads = if fused {
                split_heads(view, 3)
            } else {
                view.reshape([2, 5, 3, 4]).swap_dims(1, 2)
            };
            assert_eq!(heads.dims(), [2, 3, 5, 4]);
            let mixed = heads * scale.clone();
            let merged = if fused {
                merge_heads(mixed)
            } else {
                mixed.swap_dims(1, 2).reshape([2, 5, 12])
            };
            let grads = (merged.clone() * up.clone()).sum().backward();
            (
                host(merged),
                qkv.grad(&grads).unwrap().into_data().into_vec::<f32>().unwrap(),
            )
        };
        let ((fv, fg), (rv, rg)) = (run(true), run(false));
        assert_eq!(fv, rv, "values");
        assert_eq!(fg, rg, "gradients");
        assert!(
            rg.iter().any(|v| *v != 0.0) && rg.contains(&0.0),
            "only the narrowed third has gradients"
        );
    }

    /// The vectorisable erf and exp against libm's, over their whole range.
    #[test]
    fn erf_and_exp_approximations_are_close_to_libm() {
        let (mut erf_err, mut exp_rel) = (0.0f64, 0.0f64);
        for i in -600_000i32..=600_000 {
            let x = i as f64 * 1e-5;
            erf_err = erf_err.max((erf_fast(x as f32) as f64 - libm_erf(x)).abs());
            let y = -(i.abs() as f32) * 1.45e-4; // 0 … −87
            exp_rel = exp_rel.max(((exp_nonpositive(y) as f64) / (y as f64).exp() - 1.0).abs());
        }
        assert!(erf_err < 6e-7, "erf: largest error {erf_err:e}");
        assert!(exp_rel < 5e-7, "exp: largest relative error {exp_rel:e}");
    }

    /// erf in f64 from its series and continued fraction (the test's oracle).
    fn libm_erf(x: f64) -> f64 {
        let a = x.abs();
        let v = if a < 2.5 {
            // Maclaurin series: converges fast here.
            let (mut term, mut sum, mut n) = (a, a, 0.0f64);
            while term.abs() > 1e-17 * sum.abs() {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * std::f64::consts::FRAC_2_SQRT_PI
        } else {
            // erfc by its continued fraction, evaluated from the tail.
            let mut f = 0.0f64;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (a + f);
            }
            1.0 - (-a * a).exp() / (a + f) / std::f64::consts::PI.sqrt()
        };
        v.copysign(x)
    }

    /// The fused GELU's value and gradient are Burn's (libm erf) within
    /// the approximation's error.
    #[test]
    fn gelu_matches_burns_operation() {
        let d = Default::default();
        let x = Tensor::<Cpu, 2>::random([64, 300], Distribution::Normal(0.0, 3.0), &d).require_grad();
        let up = Tensor::<Cpu, 2>::random([64, 300], Distribution::Normal(0.0, 1.0), &d);
        let fused = gelu(x.clone());
        let reference = burn::tensor::activation::gelu(x.clone());
        close(host(fused.clone()), host(reference.clone()), 2e-6, "gelu");
        let gf = x.grad(&(fused * up.clone()).sum().backward()).unwrap();
        let gr = x.grad(&(reference * up).sum().backward()).unwrap();
        close(
            gf.into_data().into_vec().unwrap(),
            gr.into_data().into_vec().unwrap(),
            2e-6,
            "gelu gradient",
        );
    }

    fn host_f64<const D: usize>(t: Tensor<Cpu, D>) -> Vec<f64> {
        t.into_data().into_vec::<f64>().unwrap()
    }
}
