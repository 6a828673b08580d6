//! The fused attention on CubeCL (wgpu, CUDA): the CPU version's twin,
//! one unit per row.
//!
//! The forward runs one unit per query row: an online softmax over the
//! row's keys (a running maximum and sum, the output accumulated and
//! rescaled as the maximum rises), writing the row's output and its
//! log-sum-exp. The backward is FlashAttention-2's in two launches: one
//! unit per query row recomputes its probabilities from the log-sum-exp
//! and makes dQ (and `δ = dO·O`, the row's term of the softmax backward),
//! then one unit per key row goes over the queries that see it and makes
//! dK and dV, so neither needs atomics. Nothing is `[t, s]`: the memory
//! beyond the inputs is the output, one log-sum-exp and one `δ` per query
//! row. Each unit keeps its query (or key) row and its accumulators in
//! local arrays, so the head widths are compile-time (a kernel per width).
//!
//! These are not tiled through shared memory: they are the memory
//! technique on the device and the CPU's twin, not a fast GPU attention.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

/// The CubeCL backend the kernels serve, without autodiff.
pub(super) type Cube<R> = CubeBackend<R, f32, i32, u8>;

/// Stands in for −∞ (WGSL has no infinity literal).
const LOWEST: f32 = -3.0e38;

/// Units per cube.
const UNITS: u32 = 64;

/// The softmax attention of one query row over its keys: its output row
/// and log-sum-exp. `q` `[rows, dh]` (`rows` = heads × t), `k` `[heads·s,
/// dh]`, `v` `[heads·s, dv]`; key `j` is masked for query `i < j` when
/// causal.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_rows(
    q: &Array<f32>,
    k: &Array<f32>,
    v: &Array<f32>,
    o: &mut Array<f32>,
    lse: &mut Array<f32>,
    rows: u32,
    t: u32,
    s: u32,
    scale: f32,
    #[comptime] dh: usize,
    #[comptime] dv: usize,
    #[comptime] causal: bool,
) {
    let row = ABSOLUTE_POS as u32;
    if row < rows {
        let head = row / t;
        let i = row % t;
        let mut qi = Array::<f32>::new(dh);
        for c in 0..dh {
            qi[c] = q[row as usize * dh + c] * scale;
        }
        let mut acc = Array::<f32>::new(dv);
        for c in 0..dv {
            acc[c] = 0.0;
        }
        let mut m = LOWEST.runtime();
        let mut l = 0.0f32;
        let end = if comptime!(causal) { i + 1 } else { s };
        for j in 0..end {
            let key = (head * s + j) as usize;
            let x = score(&qi, k, key * dh, dh);
            let top = f32::max(m, x);
            let shrink = f32::exp(m - top);
            let p = f32::exp(x - top);
            l = l * shrink + p;
            for c in 0..dv {
                acc[c] = acc[c] * shrink + p * v[key * dv + c];
            }
            m = top;
        }
        for c in 0..dv {
            o[row as usize * dv + c] = acc[c] / l;
        }
        lse[row as usize] = m + f32::ln(l);
    }
}

/// `Σ_c qi[c] · k[at + c]`: a query row (already scaled) against a key row.
#[cube]
fn score(qi: &Array<f32>, k: &Array<f32>, at: usize, #[comptime] dh: usize) -> f32 {
    let mut x = 0.0f32;
    for c in 0..dh {
        x += qi[c] * k[at + c];
    }
    x
}

/// dQ of one query row, and its `δ = dO·O`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn backward_queries(
    q: &Array<f32>,
    k: &Array<f32>,
    v: &Array<f32>,
    o: &Array<f32>,
    lse: &Array<f32>,
    d_o: &Array<f32>,
    dq: &mut Array<f32>,
    delta: &mut Array<f32>,
    rows: u32,
    t: u32,
    s: u32,
    scale: f32,
    #[comptime] dh: usize,
    #[comptime] dv: usize,
    #[comptime] causal: bool,
) {
    let row = ABSOLUTE_POS as u32;
    if row < rows {
        let head = row / t;
        let i = row % t;
        let mut qi = Array::<f32>::new(dh);
        let mut acc = Array::<f32>::new(dh);
        for c in 0..dh {
            qi[c] = q[row as usize * dh + c] * scale;
            acc[c] = 0.0;
        }
        let mut di = 0.0f32;
        for c in 0..dv {
            di += d_o[row as usize * dv + c] * o[row as usize * dv + c];
        }
        let li = lse[row as usize];
        let end = if comptime!(causal) { i + 1 } else { s };
        for j in 0..end {
            let key = (head * s + j) as usize;
            let p = f32::exp(score(&qi, k, key * dh, dh) - li);
            let mut dp = 0.0f32;
            for c in 0..dv {
                dp += d_o[row as usize * dv + c] * v[key * dv + c];
            }
            let ds = p * (dp - di);
            for c in 0..dh {
                acc[c] += ds * k[key * dh + c];
            }
        }
        for c in 0..dh {
            dq[row as usize * dh + c] = acc[c] * scale;
        }
        delta[row as usize] = di;
    }
}

/// dK and dV of one key row, over the queries that see it.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn backward_keys(
    q: &Array<f32>,
    k: &Array<f32>,
    v: &Array<f32>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    d_o: &Array<f32>,
    dk: &mut Array<f32>,
    dvv: &mut Array<f32>,
    keys: u32,
    t: u32,
    s: u32,
    scale: f32,
    #[comptime] dh: usize,
    #[comptime] dv: usize,
    #[comptime] causal: bool,
) {
    let key = ABSOLUTE_POS as u32;
    if key < keys {
        let head = key / s;
        let j = key % s;
        let mut kj = Array::<f32>::new(dh);
        let mut gk = Array::<f32>::new(dh);
        for c in 0..dh {
            kj[c] = k[key as usize * dh + c];
            gk[c] = 0.0;
        }
        let mut gv = Array::<f32>::new(dv);
        for c in 0..dv {
            gv[c] = 0.0;
        }
        let mut start = 0u32;
        if comptime!(causal) {
            start = j;
        }
        for i in start..t {
            let row = (head * t + i) as usize;
            // The forward's score, the same operations in the same order.
            let mut x = 0.0f32;
            for c in 0..dh {
                x += q[row * dh + c] * scale * kj[c];
            }
            let p = f32::exp(x - lse[row]);
            let mut dp = 0.0f32;
            for c in 0..dv {
                let g = d_o[row * dv + c];
                gv[c] += p * g;
                dp += g * v[key as usize * dv + c];
            }
            let ds = p * (dp - delta[row]);
            for c in 0..dh {
                gk[c] += ds * q[row * dh + c];
            }
        }
        for c in 0..dh {
            dk[key as usize * dh + c] = gk[c] * scale;
        }
        for c in 0..dv {
            dvv[key as usize * dv + c] = gv[c];
        }
    }
}

/// Shapes of a call: `heads` = batch × heads.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape4 {
    batch: usize,
    heads: usize,
    t: usize,
    s: usize,
    dh: usize,
    dv: usize,
    scale: f32,
    causal: bool,
}

impl Shape4 {
    fn of<R: CubeRuntime>(q: &CubeTensor<R>, v: &CubeTensor<R>, scale: f32, causal: bool) -> Self {
        let (qs, vs) = (q.meta.shape(), v.meta.shape());
        Self {
            batch: qs[0],
            heads: qs[1],
            t: qs[2],
            s: vs[2],
            dh: qs[3],
            dv: vs[3],
            scale,
            causal,
        }
    }

    fn bh(&self) -> usize {
        self.batch * self.heads
    }
}

fn grid(units: usize) -> CubeCount {
    // At most 65,535 cubes a dimension (wgpu's limit); rows past it go to y.
    let cubes = units.div_ceil(UNITS as usize).max(1);
    let x = cubes.min(65_535);
    CubeCount::Static(x as u32, cubes.div_ceil(x) as u32, 1)
}

fn contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if t.is_contiguous() { t } else { into_contiguous(t) }
}

fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: &[usize]) -> CubeTensor<R> {
    let n: usize = shape.iter().product();
    let handle = like.client.empty(n.max(1) * 4);
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        burn::tensor::Shape::from(shape.to_vec()),
        handle,
        DType::F32,
    )
}

fn arg<R: CubeRuntime>(t: &CubeTensor<R>) -> ArrayArg<R> {
    t.clone().into_array_arg()
}

/// The forward: output `[b, h, t, dv]` and log-sum-exps `[b, h, t]`.
fn forward<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
    d: Shape4,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let o = empty(q, &[d.batch, d.heads, d.t, d.dv]);
    let lse = empty(q, &[d.batch, d.heads, d.t]);
    let rows = d.bh() * d.t;
    forward_rows::launch::<R>(
        &q.client,
        grid(rows),
        CubeDim::new_1d(UNITS),
        arg(q),
        arg(k),
        arg(v),
        arg(&o),
        arg(&lse),
        rows as u32,
        d.t as u32,
        d.s as u32,
        d.scale,
        d.dh,
        d.dv,
        d.causal,
    );
    (o, lse)
}

/// The fused attention without autodiff (a checkpointed block's first forward).
pub(super) fn forward_only<R: CubeRuntime>(
    q: Tensor<Cube<R>, 4>,
    k: Tensor<Cube<R>, 4>,
    v: Tensor<Cube<R>, 4>,
    scale: f32,
    causal: bool,
) -> Tensor<Cube<R>, 4> {
    let [q, k, v] = [q, k, v].map(|t| contiguous(t.into_primitive().tensor()));
    let d = Shape4::of(&q, &v, scale, causal);
    Tensor::from_primitive(TensorPrimitive::Float(forward(&q, &k, &v, d).0))
}

/// The fused attention as one autodiff operation on CubeCL.
pub(super) fn attention<R: CubeRuntime>(
    q: Tensor<Autodiff<Cube<R>>, 4>,
    k: Tensor<Autodiff<Cube<R>>, 4>,
    v: Tensor<Autodiff<Cube<R>>, 4>,
    scale: f32,
    causal: bool,
) -> Tensor<Autodiff<Cube<R>>, 4> {
    #[derive(Debug)]
    struct Attention;

    /// The inputs, the output, the log-sum-exps and the shapes.
    type Saved<R> = ([CubeTensor<R>; 4], CubeTensor<R>, Shape4);

    impl<R: CubeRuntime> Backward<Cube<R>, 3> for Attention {
        type State = Saved<R>;

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let d_o = contiguous(grads.consume::<Cube<R>>(&ops.node));
            let ([q, k, v, o], lse, d) = ops.state;
            let dq = empty(&q, &[d.batch, d.heads, d.t, d.dh]);
            let dk = empty(&q, &[d.batch, d.heads, d.s, d.dh]);
            let dv = empty(&q, &[d.batch, d.heads, d.s, d.dv]);
            let delta = empty(&q, &[d.bh() * d.t]);
            let (rows, keys) = (d.bh() * d.t, d.bh() * d.s);
            backward_queries::launch::<R>(
                &q.client,
                grid(rows),
                CubeDim::new_1d(UNITS),
                arg(&q),
                arg(&k),
                arg(&v),
                arg(&o),
                arg(&lse),
                arg(&d_o),
                arg(&dq),
                arg(&delta),
                rows as u32,
                d.t as u32,
                d.s as u32,
                d.scale,
                d.dh,
                d.dv,
                d.causal,
            );
            backward_keys::launch::<R>(
                &q.client,
                grid(keys),
                CubeDim::new_1d(UNITS),
                arg(&q),
                arg(&k),
                arg(&v),
                arg(&lse),
                arg(&delta),
                arg(&d_o),
                arg(&dk),
                arg(&dv),
                keys as u32,
                d.t as u32,
                d.s as u32,
                d.scale,
                d.dh,
                d.dv,
                d.causal,
            );
            for (parent, grad) in ops.parents.iter().zip([dq, dk, dv]) {
                if let Some(node) = parent {
                    grads.register::<Cube<R>>(node.id, grad);
                }
            }
        }
    }

    let [q, k, v] = [q, k, v].map(|t| t.into_primitive().tensor());
    let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
    let [qp, kp, vp] = [q.primitive, k.primitive, v.primitive].map(contiguous);
    let d = Shape4::of(&qp, &vp, scale, causal);
    let out = match Attention.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (o, lse) = forward(&qp, &kp, &vp, d);
            prep.finish(([qp, kp, vp, o.clone()], lse, d), o)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(&qp, &kp, &vp, d).0),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
