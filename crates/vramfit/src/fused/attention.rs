//! Attention as one autodiff operation that never holds the score matrix
//! (FlashAttention-2's algorithm on the CPU, a block of query rows at a
//! time through gemm).
//!
//! Standard attention keeps `softmax(scale · Q Kᵀ)`, `[b, h, t, t]`, for its
//! backward: at 2,048 tokens, 8 heads and a batch of 4, 512 MiB a layer.
//! Here the forward keeps Q, K, V, the output and one log-sum-exp per query
//! row (`O(t)` a head beyond the inputs), and the backward recomputes each
//! row's scores from them. Each thread's scratch is one block of query
//! rows' scores (two in the backward).

#[allow(unused_imports)]
use super::*;

/// Softmax attention of `q` over `k`, `v` (each `[b, h, t, dh]`; `k` and `v`
/// may have another length `s`): `softmax(scale · q kᵀ) v`, with key `j`
/// masked for query `i < j` when `causal` (then `t` must equal `s`). On
/// Flex and CubeCL (wgpu, CUDA), with or without autodiff, the fused
/// operation; elsewhere [`attention_reference`] (Burn's operations, which
/// keep the scores). f16 and bf16 inputs (all three the same type): the
/// CubeCL kernels read them as they are and write the output and the
/// gradients in their type (f32 inside: scores, softmax, accumulators,
/// log-sum-exps); for the CPU's fused attention they are widened to f32
/// (it then keeps f32 copies of Q, K and V) and the output is given back
/// in their type.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    scale: f64,
    causal: bool,
) -> Tensor<B, 4> {
    let [b, h, t, dh] = q.dims();
    let [kb, kh, s, kd] = k.dims();
    assert!(
        [kb, kh, kd] == [b, h, dh] && v.dims() == [b, h, s, v.dims()[3]] && v.dims()[3] > 0,
        "attention: q {:?}, k {:?}, v {:?} do not match",
        q.dims(),
        k.dims(),
        v.dims()
    );
    assert!(
        !causal || t == s,
        "causal attention needs as many keys as queries ({t} and {s})"
    );
    assert!(scale > 0.0, "attention scale must be positive, got {scale}");
    assert!(
        t * s * dh > 0,
        "attention needs at least one query and one key and a head width of at least 1, got q {:?}, k {:?}",
        q.dims(),
        k.dims()
    );
    let (scale, qkv) = (scale as f32, (q, k, v));
    let qkv = match on::<B, Cpu>(qkv, WIDE, |q, k, v| attention_cpu(q, k, v, scale, causal)) {
        Ok(out) => return out,
        Err(qkv) => qkv,
    };
    // Without autodiff (a checkpointed block's first forward runs on the
    // inner backend): the same forward, or Burn's operations would hold
    // every head's scores at once for the call.
    let qkv = match on::<B, Flex>(qkv, WIDE, |q, k, v| forward_flex(q, k, v, scale, causal)) {
        Ok(out) => return out,
        Err(qkv) => qkv,
    };
    #[cfg(feature = "wgpu")]
    let qkv = match on_cube::<B, cubecl::wgpu::WgpuRuntime>(qkv, scale, causal) {
        Ok(out) => return out,
        Err(qkv) => qkv,
    };
    #[cfg(feature = "cuda")]
    let qkv = match on_cube::<B, cubecl::cuda::CudaRuntime>(qkv, scale, causal) {
        Ok(out) => return out,
        Err(qkv) => qkv,
    };
    // The shape backend: the CubeCL kernels' allocations, described.
    let qkv = match on::<B, Autodiff<crate::shapes::Shapes>>(qkv, SHAPED, |q, k, v| {
        super::on_shapes::attention(q, k, v, causal)
    }) {
        Ok(out) => return out,
        Err(qkv) => qkv,
    };
    let qkv =
        match on::<B, crate::shapes::Shapes>(qkv, SHAPED, |q, k, v| super::on_shapes::forward_only(q, k, v, causal)) {
            Ok(out) => return out,
            Err(qkv) => qkv,
        };
    let (q, k, v) = qkv;
    let low = q.dtype();
    if matches!(low, DType::F16 | DType::BF16) && k.dtype() == low && v.dtype() == low && Attention::is_fused_on::<B>()
    {
        // The CPU's fused attention reads f32: widened for it (f32 copies
        // of Q, K and V kept for the backward), the output given back low.
        let wide = |t: Tensor<B, 4>| t.cast(burn::tensor::FloatDType::F32);
        return attention(wide(q), wide(k), wide(v), scale as f64, causal).cast(low);
    }
    attention_reference(q, k, v, scale as f64, causal)
}

/// The input types the CPU's fused attention reads.
const WIDE: &[DType] = &[DType::F32];

/// The input types the shape backend's twin of the CubeCL kernels takes.
const SHAPED: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// The input types the CubeCL kernels read (f32 accumulation inside).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
const ANY_FLOAT: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// Queries, keys and values.
type Qkv<B> = (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>);

/// `f` on the three as tensors of backend `C`, where `B` is `C` and the
/// three share one of `dtypes`; else the three back.
fn on<B: Backend, C: Backend>(
    (q, k, v): Qkv<B>,
    dtypes: &[DType],
    f: impl FnOnce(Tensor<C, 4>, Tensor<C, 4>, Tensor<C, 4>) -> Tensor<C, 4>,
) -> Result<Tensor<B, 4>, Qkv<B>> {
    let same = std::any::TypeId::of::<B>() == std::any::TypeId::of::<C>();
    let dtype = q.dtype();
    if !same || !dtypes.contains(&dtype) || k.dtype() != dtype || v.dtype() != dtype {
        return Err((q, k, v));
    }
    let as_c = |t: Tensor<B, 4>| downcast::<_, Tensor<C, 4>>(t).unwrap_or_else(|_| unreachable!("B is C"));
    Ok(downcast(f(as_c(q), as_c(k), as_c(v))).unwrap_or_else(|_| unreachable!("C is B")))
}

/// The CubeCL kernels on runtime `R`, with autodiff or without.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn on_cube<B: Backend, R: burn_cubecl::CubeRuntime>(
    qkv: Qkv<B>,
    scale: f32,
    causal: bool,
) -> Result<Tensor<B, 4>, Qkv<B>> {
    use super::cube::{self, Cube};
    on::<B, Autodiff<Cube<R>>>(qkv, ANY_FLOAT, |q, k, v| cube::attention(q, k, v, scale, causal))
        .or_else(|qkv| on::<B, Cube<R>>(qkv, ANY_FLOAT, |q, k, v| cube::forward_only(q, k, v, scale, causal)))
}

/// The fused forward alone, on Flex without autodiff.
fn forward_flex(
    q: Tensor<Flex, 4>,
    k: Tensor<Flex, 4>,
    v: Tensor<Flex, 4>,
    scale: f32,
    causal: bool,
) -> Tensor<Flex, 4> {
    let d = Dims::of(q.dims(), v.dims(), scale, causal);
    let [b, h, t, _] = q.dims();
    let (q, k, v) = (
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
    );
    let (o, _) = forward_all(&d, &values(&q), &values(&k), &values(&v));
    Tensor::from_primitive(TensorPrimitive::Float(flex(o, [b, h, t, d.dv].into())))
}

/// [`attention`] from Burn's operations (every backend; the fused
/// operation's oracle): the scores, the mask, softmax, the product.
pub fn attention_reference<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    scale: f64,
    causal: bool,
) -> Tensor<B, 4> {
    let scores = q.matmul(k.swap_dims(2, 3)); // [b, h, t, s]
    let attn = if causal {
        causal_softmax_reference(scores, scale)
    } else {
        softmax(scores.mul_scalar(scale), 3)
    };
    attn.matmul(v)
}

/// How a model computes attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// The scores as a tensor, kept for the backward (`[b, h, t, t]`).
    #[default]
    Standard,
    /// [`attention`]: no score tensor (kernels on the CPU, wgpu and CUDA;
    /// Burn's operations elsewhere, see [`Attention::is_fused_on`]).
    Fused,
}

impl Attention {
    /// Whether [`attention`] is the fused operation on backend `B` (for
    /// f32, f16 and bf16 inputs alike); elsewhere it is Burn's operations,
    /// which keep the scores.
    pub fn is_fused_on<B: Backend>() -> bool {
        #[allow(unused_mut)]
        let mut cube = false;
        #[cfg(feature = "wgpu")]
        {
            cube |= is::<B, super::cube::Cube<cubecl::wgpu::WgpuRuntime>>();
        }
        #[cfg(feature = "cuda")]
        {
            cube |= is::<B, super::cube::Cube<cubecl::cuda::CudaRuntime>>();
        }
        crate::backends::is_cpu::<B>() || cube || crate::shapes::is_shapes::<B>()
    }
}

/// Whether `B` is `C` or `C` with autodiff.
#[allow(dead_code)]
fn is<B: 'static, C: Backend>() -> bool {
    let b = std::any::TypeId::of::<B>();
    b == std::any::TypeId::of::<C>() || b == std::any::TypeId::of::<Autodiff<C>>()
}

impl std::str::FromStr for Attention {
    type Err = crate::settings::UnknownValue;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "standard" => Ok(Self::Standard),
            "fused" => Ok(Self::Fused),
            other => Err(crate::settings::UnknownValue {
                setting: "attention",
                given: other.into(),
                choices: "standard (the scores kept as a tensor) or fused (recomputed in the backward, never stored)",
            }),
        }
    }
}

impl std::fmt::Display for Attention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Standard => "standard",
            Self::Fused => "fused",
        })
    }
}

/// The shapes of one call: `bh` heads of `t` queries over `s` keys, `dh`
/// wide (queries and keys) and `dv` wide (values).
#[derive(Debug, Clone, Copy)]
struct Dims {
    t: usize,
    s: usize,
    dh: usize,
    dv: usize,
    scale: f32,
    causal: bool,
}

impl Dims {
    /// The shapes of a call with `q` `[b, h, t, dh]` and `v` `[b, h, s, dv]`.
    fn of(q: [usize; 4], v: [usize; 4], scale: f32, causal: bool) -> Self {
        Self {
            t: q[2],
            s: v[2],
            dh: q[3],
            dv: v[3],
            scale,
            causal,
        }
    }

    /// Keys query `i` sees.
    fn keys(&self, i: usize) -> usize {
        if self.causal { i + 1 } else { self.s }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums: the compiler vectorises this; one running sum it
    // would not (f32 addition is not associative).
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// Query rows a block's products take at once: the scores' scratch is
/// `QUERY_BLOCK × s` floats a thread (1 MiB at 4,096 keys), never `t × s`.
/// Measured at 1,024 tokens (the transformer's step, 2 threads): 32 rows
/// 801 ms, 64 rows 751 ms, 128 rows 777 ms; one row at a time with
/// vectorised dots was 1,515 ms.
const QUERY_BLOCK: usize = 64;

/// Rows `first..first + rows` of a row-major matrix `cols` wide, as gemm
/// reads it.
fn rows_of(values: &[f32], first: usize, rows: usize, cols: usize) -> Operand<'_> {
    Operand::plain(&values[first * cols..(first + rows) * cols], rows, cols)
}

/// `dst = (dst if accumulate, else 0) + beta · lhs · rhs`, `dst` row major
/// with `lhs.rows` rows of `rhs.cols`, on this thread.
fn product(dst: &mut [f32], accumulate: bool, beta: f32, lhs: Operand, rhs: Operand) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(rhs.rows, k, "inner dimensions");
    assert!(dst.len() >= m * n, "destination size");
    if m * n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    let fits = |o: &Operand| o.rs >= 0 && o.cs >= 0 && o.values.len() >= o.extent();
    assert!(fits(&lhs) && fits(&rhs), "operand shapes");
    // SAFETY: `dst` holds m·n values written row major (row stride n,
    // column stride 1) and read only when accumulating; every element gemm
    // reads of `lhs` and `rhs` lies within their slices at the given
    // (non-negative) strides (extents asserted above).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.values.as_ptr(),
            lhs.cs,
            lhs.rs,
            rhs.values.as_ptr(),
            rhs.cs,
            rhs.rs,
            if accumulate { 1.0 } else { 0.0 },
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Keys the block of `rows` queries from `first` needs (the last row's).
fn block_keys(d: &Dims, first: usize, rows: usize) -> usize {
    d.keys(first + rows - 1)
}

/// One head's forward, `QUERY_BLOCK` query rows at a time: the scores by
/// one product, each row's softmax (its log-sum-exp kept), the output by a
/// second product. `scores` is the thread's scratch.
fn head_forward(d: &Dims, q: &[f32], k: &[f32], v: &[f32], o: &mut [f32], lse: &mut [f32], scores: &mut [f32]) {
    for first in (0..d.t).step_by(QUERY_BLOCK) {
        let rows = QUERY_BLOCK.min(d.t - first);
        let keys = block_keys(d, first, rows);
        let s = &mut scores[..rows * keys];
        product(
            s,
            false,
            d.scale,
            rows_of(q, first, rows, d.dh),
            rows_of(k, 0, keys, d.dh).t(),
        );
        for (r, row) in s.chunks_exact_mut(keys).enumerate() {
            let seen = d.keys(first + r);
            let (live, masked) = row.split_at_mut(seen);
            let max = live.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
            let mut sum = 0.0f32;
            for x in live.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            let inv = 1.0 / sum;
            live.iter_mut().for_each(|x| *x *= inv);
            masked.fill(0.0);
            lse[first + r] = max + sum.ln();
        }
        product(
            &mut o[first * d.dv..(first + rows) * d.dv],
            false,
            1.0,
            Operand::plain(s, rows, keys),
            rows_of(v, 0, keys, d.dv),
        );
    }
}

/// One head's backward (FlashAttention-2), a block of query rows at a
/// time: `D_i = dO_i · O_i`; the probabilities again from the scores and
/// the log-sum-exp; `dP = dO Vᵀ`, `dS = P ⊙ (dP − D)`; `dQ = scale dS K`,
/// `dK += scale dSᵀ Q`, `dV += Pᵀ dO`. `scratch` holds two blocks of scores.
#[allow(clippy::too_many_arguments)]
fn head_backward(
    d: &Dims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    lse: &[f32],
    d_o: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    scratch: &mut [f32],
) {
    dk.fill(0.0);
    dv.fill(0.0);
    let (p_all, ds_all) = scratch.split_at_mut(QUERY_BLOCK * d.s);
    for first in (0..d.t).step_by(QUERY_BLOCK) {
        let rows = QUERY_BLOCK.min(d.t - first);
        let keys = block_keys(d, first, rows);
        let (p, ds) = (&mut p_all[..rows * keys], &mut ds_all[..rows * keys]);
        let q_block = rows_of(q, first, rows, d.dh);
        let do_block = rows_of(d_o, first, rows, d.dv);
        product(p, false, d.scale, q_block, rows_of(k, 0, keys, d.dh).t());
        product(ds, false, 1.0, do_block, rows_of(v, 0, keys, d.dv).t());
        for (r, (pr, dsr)) in p.chunks_exact_mut(keys).zip(ds.chunks_exact_mut(keys)).enumerate() {
            let i = first + r;
            let seen = d.keys(i);
            let di = dot(&d_o[i * d.dv..(i + 1) * d.dv], &o[i * d.dv..(i + 1) * d.dv]);
            for (x, g) in pr[..seen].iter_mut().zip(&mut dsr[..seen]) {
                *x = (*x - lse[i]).exp();
                *g = *x * (*g - di);
            }
            pr[seen..].fill(0.0);
            dsr[seen..].fill(0.0);
        }
        let block = |values| Operand::plain(values, rows, keys);
        product(
            &mut dq[first * d.dh..(first + rows) * d.dh],
            false,
            d.scale,
            block(ds),
            rows_of(k, 0, keys, d.dh),
        );
        product(&mut dk[..keys * d.dh], true, d.scale, block(ds).t(), q_block);
        product(&mut dv[..keys * d.dv], true, 1.0, block(p).t(), do_block);
    }
}

/// The forward over every head in parallel: the output `[bh, t, dv]` and
/// the log-sum-exps `[bh, t]`.
fn forward_all(d: &Dims, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let bh = q.len() / (d.t * d.dh);
    let mut o = vec![0.0f32; bh * d.t * d.dv];
    let mut lse = vec![0.0f32; bh * d.t];
    o.par_chunks_mut(d.t * d.dv)
        .zip(lse.par_chunks_mut(d.t))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; QUERY_BLOCK * d.s],
            |scores, (n, (oh, lh))| {
                let (qh, kh, vh) = (
                    &q[n * d.t * d.dh..(n + 1) * d.t * d.dh],
                    &k[n * d.s * d.dh..(n + 1) * d.s * d.dh],
                    &v[n * d.s * d.dv..(n + 1) * d.s * d.dv],
                );
                head_forward(d, qh, kh, vh, oh, lh, scores);
            },
        );
    (o, lse)
}

pub(super) fn attention_cpu(
    q: Tensor<Cpu, 4>,
    k: Tensor<Cpu, 4>,
    v: Tensor<Cpu, 4>,
    scale: f32,
    causal: bool,
) -> Tensor<Cpu, 4> {
    #[derive(Debug)]
    struct Attention;

    /// What the backward needs: the inputs, the output (shared with the
    /// graph, not a copy), the log-sum-exps (`O(t)` a head) and the shapes;
    /// never the scores.
    type Saved = (FlexTensor, FlexTensor, FlexTensor, FlexTensor, Vec<f32>, Dims);

    impl Backward<Flex, 3> for Attention {
        type State = Saved;

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let d_o = grads.consume::<Flex>(&ops.node);
            let (q, k, v, o, lse, d) = ops.state;
            let (qv, kv, vv, ov, dov) = (values(&q), values(&k), values(&v), values(&o), values(&d_o));
            let bh = qv.len() / (d.t * d.dh);
            let mut dq = vec![0.0f32; qv.len()];
            let mut dk = vec![0.0f32; kv.len()];
            let mut dv = vec![0.0f32; vv.len()];
            dq.par_chunks_mut(d.t * d.dh)
                .zip(dk.par_chunks_mut(d.s * d.dh))
                .zip(dv.par_chunks_mut(d.s * d.dv))
                .enumerate()
                .for_each_init(
                    || vec![0.0f32; 2 * QUERY_BLOCK * d.s],
                    |scratch, (n, ((dqh, dkh), dvh))| {
                        let (tq, tk, tv) = (n * d.t * d.dh, n * d.s * d.dh, n * d.s * d.dv);
                        head_backward(
                            &d,
                            &qv[tq..tq + d.t * d.dh],
                            &kv[tk..tk + d.s * d.dh],
                            &vv[tv..tv + d.s * d.dv],
                            &ov[n * d.t * d.dv..(n + 1) * d.t * d.dv],
                            &lse[n * d.t..(n + 1) * d.t],
                            &dov[n * d.t * d.dv..(n + 1) * d.t * d.dv],
                            dqh,
                            dkh,
                            dvh,
                            scratch,
                        );
                    },
                );
            debug_assert_eq!(bh * d.t, lse.len());
            let shape = |t: &FlexTensor| t.layout().shape().clone();
            for (parent, (grad, like)) in ops.parents.iter().zip([(dq, &q), (dk, &k), (dv, &v)]) {
                if let Some(node) = parent {
                    grads.register::<Flex>(node.id, flex(grad, shape(like)));
                }
            }
        }
    }

    let d = Dims::of(q.dims(), v.dims(), scale, causal);
    let dv = d.dv;
    let (q, k, v) = (
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
    );
    let mut out_shape = q.primitive.layout().shape().clone();
    out_shape[3] = dv;
    let run = |q: &FlexTensor, k: &FlexTensor, v: &FlexTensor| forward_all(&d, &values(q), &values(k), &values(v));
    let out = match Attention
        .prepare::<NoCheckpointing>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (o, lse) = run(&q.primitive, &k.primitive, &v.primitive);
            let y = flex(o, out_shape);
            prep.finish((q.primitive, k.primitive, v.primitive, y.clone(), lse, d), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(flex(run(&q.primitive, &k.primitive, &v.primitive).0, out_shape)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
