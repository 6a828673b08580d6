//! The fused attention on CubeCL (wgpu, CUDA): the CPU version's twin,
//! tiled through shared memory as FlashAttention-2 is.
//!
//! The forward gives each cube a block of [`UNITS`] query rows of one head
//! (one unit a row): the cube loads a tile of keys and values into shared
//! memory, every unit scores its row against the whole tile, and the
//! online softmax is updated once per tile (the tile's maximum, one
//! rescale of the running sum and output), so a key is read from device
//! memory once per query block instead of once per query. It writes the
//! output and each row's log-sum-exp. The backward is the same tiles in
//! two launches: query blocks over key tiles make dQ (and `δ = dO·O`, the
//! row's term of the softmax backward, from the saved log-sum-exp), then
//! key blocks over query tiles (queries, dO, log-sum-exps and δ in shared
//! memory) make dK and dV, so neither needs atomics. Nothing is `[t, s]`:
//! the memory beyond the inputs is the output, one log-sum-exp and one δ a
//! query row. A unit keeps its row and accumulators in local arrays, so
//! the head widths are compile-time (a kernel per width); a tile holds as
//! many rows as fit in 16 KiB of shared memory (wgpu's default limit), at
//! most one a unit.
//!
//! Inputs in f32, f16 or bf16 (the element type is a launch argument):
//! read into f32 (shared memory, a unit's row and accumulators, the
//! log-sum-exps and δ are f32), the output and gradients written in the
//! inputs' type, so 16-bit attention keeps 16-bit Q, K, V and O for the
//! backward. Not yet: tensor cores (the tile products are scalar f32).

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

/// Units per cube, and query (or key) rows per block.
const UNITS: u32 = 64;

/// Bytes of shared memory a tile may take: wgpu's default limit for a
/// workgroup (CUDA allows 48 KiB without opting in).
const SHARED_BYTES: usize = 16 * 1024;

/// Rows of a tile of `floats` values a row: as many as fit in
/// [`SHARED_BYTES`], at most [`UNITS`].
const fn tile_rows(floats: usize) -> usize {
    let rows = SHARED_BYTES / 4 / floats;
    if rows > UNITS as usize { UNITS as usize } else { rows }
}

/// The cube's index, whatever the grid's shape ([`blocks`]).
#[cube]
fn cube_index() -> u32 {
    CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X
}

/// Copies rows `[first, first + rows)` of the `[count, width]` rows that
/// start at row `base` of `from` into `tile` (zeros past `count`), each
/// unit a stride of the values, scaled by `scale`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_tile<F: Float>(
    from: &Array<F>,
    tile: &mut SharedMemory<f32>,
    base: u32,
    first: u32,
    count: u32,
    scale: f32,
    #[comptime] rows: usize,
    #[comptime] width: usize,
) {
    let passes = comptime!((rows * width).div_ceil(UNITS as usize));
    for pass in 0..passes {
        let e = pass * UNITS as usize + UNIT_POS as usize;
        if e < comptime!(rows * width) {
            let r = (e / width) as u32;
            let mut x = 0.0f32;
            if first + r < count {
                x = f32::cast_from(from[((base + first + r) as usize) * width + e % width]) * scale;
            }
            tile[e] = x;
        }
    }
}

/// `Σ_c row[c] · tile[at + c]`: a row against a tile's row.
#[cube]
fn dot_tile(row: &Array<f32>, tile: &SharedMemory<f32>, at: usize, #[comptime] width: usize) -> f32 {
    let mut x = 0.0f32;
    for c in 0..width {
        x += row[c] * tile[at + c];
    }
    x
}

/// A block of query rows' softmax attention over their keys, a key tile at
/// a time: each row's output and log-sum-exp. `q` `[heads·t, dh]`, `k`
/// `[heads·s, dh]`, `v` `[heads·s, dv]`; key `j` is masked for query
/// `i < j` when causal. Cube `c` is block `c % q_blocks` of head
/// `c / q_blocks`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_tiles<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    o: &mut Array<F>,
    lse: &mut Array<f32>,
    cubes: u32,
    q_blocks: u32,
    t: u32,
    s: u32,
    scale: f32,
    #[comptime] dh: usize,
    #[comptime] dv: usize,
    #[comptime] causal: bool,
    #[define(F)] _dtype: StorageType,
) {
    let cube = cube_index();
    // Uniform across the cube: a cube past the grid's work leaves whole.
    if cube < cubes {
        let bk = comptime!(tile_rows(dh + dv));
        let bk32 = comptime!(bk as u32);
        let head = cube / q_blocks;
        let first = (cube % q_blocks) * UNITS;
        let i = first + UNIT_POS;
        let live = i < t;
        let row = (head * t + i) as usize;
        let mut kt = SharedMemory::<f32>::new(comptime!(bk * dh));
        let mut vt = SharedMemory::<f32>::new(comptime!(bk * dv));
        let mut qi = Array::<f32>::new(dh);
        for c in 0..dh {
            qi[c] = 0.0;
            if live {
                qi[c] = f32::cast_from(q[row * dh + c]) * scale;
            }
        }
        let mut acc = Array::<f32>::new(dv);
        for c in 0..dv {
            acc[c] = 0.0;
        }
        let mut scores = Array::<f32>::new(bk);
        let mut m = LOWEST.runtime();
        let mut l = 0.0f32;
        // The keys the block's last row sees, and this row's.
        let mut end = s;
        let mut mine = s;
        if comptime!(causal) {
            end = u32::min(s, first + UNITS);
            mine = i + 1;
        }
        let tiles = end.div_ceil(bk32);
        for tile in 0..tiles {
            let j0 = tile * bk32;
            load_tile(k, &mut kt, head * s, j0, s, 1.0, bk, dh);
            load_tile(v, &mut vt, head * s, j0, s, 1.0, bk, dv);
            sync_cube();
            if live && mine > j0 {
                let count = u32::min(bk32, u32::min(mine, s) - j0) as usize;
                let mut top = m;
                for jj in 0..count {
                    let x = dot_tile(&qi, &kt, jj * dh, dh);
                    scores[jj] = x;
                    top = f32::max(top, x);
                }
                let shrink = f32::exp(m - top);
                l *= shrink;
                for c in 0..dv {
                    acc[c] *= shrink;
                }
                for jj in 0..count {
                    let p = f32::exp(scores[jj] - top);
                    l += p;
                    for c in 0..dv {
                        acc[c] += p * vt[jj * dv + c];
                    }
                }
                m = top;
            }
            sync_cube();
        }
        if live {
            for c in 0..dv {
                o[row * dv + c] = F::cast_from(acc[c] / l);
            }
            lse[row] = m + f32::ln(l);
        }
    }
}

/// dQ of a block of query rows over the key tiles, and each row's
/// `δ = dO·O`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn backward_query_tiles<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    o: &Array<F>,
    lse: &Array<f32>,
    d_o: &Array<F>,
    dq: &mut Array<F>,
    delta: &mut Array<f32>,
    cubes: u32,
    q_blocks: u32,
    t: u32,
    s: u32,
    scale: f32,
    #[comptime] dh: usize,
    #[comptime] dv: usize,
    #[comptime] causal: bool,
    #[define(F)] _dtype: StorageType,
) {
    let cube = cube_index();
    if cube < cubes {
        let bk = comptime!(tile_rows(dh + dv));
        let bk32 = comptime!(bk as u32);
        let head = cube / q_blocks;
        let first = (cube % q_blocks) * UNITS;
        let i = first + UNIT_POS;
        let live = i < t;
        let row = (head * t + i) as usize;
        let mut kt = SharedMemory::<f32>::new(comptime!(bk * dh));
        let mut vt = SharedMemory::<f32>::new(comptime!(bk * dv));
        let mut qi = Array::<f32>::new(dh);
        let mut acc = Array::<f32>::new(dh);
        for c in 0..dh {
            qi[c] = 0.0;
            acc[c] = 0.0;
            if live {
                qi[c] = f32::cast_from(q[row * dh + c]) * scale;
            }
        }
        let mut gi = Array::<f32>::new(dv);
        let mut di = 0.0f32;
        for c in 0..dv {
            gi[c] = 0.0;
            if live {
                gi[c] = f32::cast_from(d_o[row * dv + c]);
                di += gi[c] * f32::cast_from(o[row * dv + c]);
            }
        }
        let mut li = 0.0f32;
        if live {
            li = lse[row];
        }
        let mut end = s;
        let mut mine = s;
        if comptime!(causal) {
            end = u32::min(s, first + UNITS);
            mine = i + 1;
        }
        let tiles = end.div_ceil(bk32);
        for tile in 0..tiles {
            let j0 = tile * bk32;
            load_tile(k, &mut kt, head * s, j0, s, 1.0, bk, dh);
            load_tile(v, &mut vt, head * s, j0, s, 1.0, bk, dv);
            sync_cube();
            if live && mine > j0 {
                let count = u32::min(bk32, u32::min(mine, s) - j0) as usize;
                for jj in 0..count {
                    let p = f32::exp(dot_tile(&qi, &kt, jj * dh, dh) - li);
                    let dp = dot_tile(&gi, &vt, jj * dv, dv);
                    let ds = p * (dp - di);
                    for c in 0..dh {
                        acc[c] += ds * kt[jj * dh + c];
                    }
                }
            }
            sync_cube();
        }
        if live {
            for c in 0..dh {
                dq[row * dh + c] = F::cast_from(acc[c] * scale);
            }
            delta[row] = di;
        }
    }
}

/// dK and dV of a block of key rows over the query tiles that see them
/// (queries, dO, log-sum-exps and δ in shared memory). Cube `c` is block
/// `c % k_blocks` of head `c / k_blocks`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn backward_key_tiles<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    d_o: &Array<F>,
    dk: &mut Array<F>,
    dvv: &mut Array<F>,
    cubes: u32,
    k_blocks: u32,
    t: u32,
    s: u32,
    scale: f32,
    #[comptime] dh: usize,
    #[comptime] dv: usize,
    #[comptime] causal: bool,
    #[define(F)] _dtype: StorageType,
) {
    let cube = cube_index();
    if cube < cubes {
        let bq = comptime!(tile_rows(dh + dv + 2));
        let bq32 = comptime!(bq as u32);
        let head = cube / k_blocks;
        let first = (cube % k_blocks) * UNITS;
        let j = first + UNIT_POS;
        let live = j < s;
        let key = (head * s + j) as usize;
        let mut qt = SharedMemory::<f32>::new(comptime!(bq * dh));
        let mut gt = SharedMemory::<f32>::new(comptime!(bq * dv));
        let mut lt = SharedMemory::<f32>::new(bq);
        let mut dt = SharedMemory::<f32>::new(bq);
        let mut kj = Array::<f32>::new(dh);
        let mut gk = Array::<f32>::new(dh);
        for c in 0..dh {
            kj[c] = 0.0;
            gk[c] = 0.0;
            if live {
                kj[c] = f32::cast_from(k[key * dh + c]);
            }
        }
        let mut vj = Array::<f32>::new(dv);
        let mut gv = Array::<f32>::new(dv);
        for c in 0..dv {
            vj[c] = 0.0;
            gv[c] = 0.0;
            if live {
                vj[c] = f32::cast_from(v[key * dv + c]);
            }
        }
        // The first query the block's first key is seen by.
        let mut start = 0u32;
        if comptime!(causal) {
            start = u32::min(first, t);
        }
        let tiles = (t - start).div_ceil(bq32);
        for tile in 0..tiles {
            let i0 = start + tile * bq32;
            // Queries scaled as the forward scales them, so the score is
            // the same product.
            load_tile(q, &mut qt, head * t, i0, t, scale, bq, dh);
            load_tile(d_o, &mut gt, head * t, i0, t, 1.0, bq, dv);
            load_tile(lse, &mut lt, head * t, i0, t, 1.0, bq, 1usize);
            load_tile(delta, &mut dt, head * t, i0, t, 1.0, bq, 1usize);
            sync_cube();
            if live {
                let count = u32::min(bq32, t - i0) as usize;
                for ii in 0..count {
                    let mut seen = true;
                    if comptime!(causal) {
                        seen = i0 + ii as u32 >= j;
                    }
                    if seen {
                        let x = dot_tile(&kj, &qt, ii * dh, dh);
                        let p = f32::exp(x - lt[ii]);
                        let dp = dot_tile(&vj, &gt, ii * dv, dv);
                        for c in 0..dv {
                            gv[c] += p * gt[ii * dv + c];
                        }
                        let ds = p * (dp - dt[ii]);
                        for c in 0..dh {
                            gk[c] += ds * qt[ii * dh + c];
                        }
                    }
                }
            }
            sync_cube();
        }
        if live {
            for c in 0..dh {
                dk[key * dh + c] = F::cast_from(gk[c]);
            }
            for c in 0..dv {
                dvv[key * dv + c] = F::cast_from(gv[c]);
            }
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

/// The grid of a launch over `heads` heads of `rows` rows each, a block of
/// [`UNITS`] rows a cube: the count, the cubes that have work, and the
/// blocks a head.
fn blocks(heads: usize, rows: usize) -> (CubeCount, u32, u32) {
    let per_head = rows.div_ceil(UNITS as usize).max(1);
    let cubes = heads * per_head;
    // At most 65,535 cubes a dimension (wgpu's limit); the rest go to y.
    let x = cubes.clamp(1, 65_535);
    (
        CubeCount::Static(x as u32, cubes.div_ceil(x).max(1) as u32, 1),
        cubes as u32,
        per_head as u32,
    )
}

fn contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if t.is_contiguous() { t } else { into_contiguous(t) }
}

/// A tensor of `shape` and `dtype` on `like`'s device, its values unset.
fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: &[usize], dtype: DType) -> CubeTensor<R> {
    let n: usize = shape.iter().product();
    let handle = like.client.empty(n.max(1) * dtype.size());
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        burn::tensor::Shape::from(shape.to_vec()),
        handle,
        dtype,
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
    let o = empty(q, &[d.batch, d.heads, d.t, d.dv], q.dtype);
    let lse = empty(q, &[d.batch, d.heads, d.t], DType::F32);
    let (count, cubes, q_blocks) = blocks(d.bh(), d.t);
    forward_tiles::launch::<R>(
        &q.client,
        count,
        CubeDim::new_1d(UNITS),
        arg(q),
        arg(k),
        arg(v),
        arg(&o),
        arg(&lse),
        cubes,
        q_blocks,
        d.t as u32,
        d.s as u32,
        d.scale,
        d.dh,
        d.dv,
        d.causal,
        q.dtype.into(),
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
            let ([q, k, v, o], lse, d) = ops.state;
            // The kernels read dO as Q's type (the gradient of the output,
            // which is in that type; cast if a caller's graph gave another).
            let d_o = grads.consume::<Cube<R>>(&ops.node);
            let d_o = if d_o.dtype == q.dtype {
                d_o
            } else {
                burn_cubecl::kernel::cast(d_o, q.dtype)
            };
            let d_o = contiguous(d_o);
            let dq = empty(&q, &[d.batch, d.heads, d.t, d.dh], q.dtype);
            let dk = empty(&q, &[d.batch, d.heads, d.s, d.dh], q.dtype);
            let dv = empty(&q, &[d.batch, d.heads, d.s, d.dv], q.dtype);
            let delta = empty(&q, &[d.bh() * d.t], DType::F32);
            let (count, cubes, q_blocks) = blocks(d.bh(), d.t);
            backward_query_tiles::launch::<R>(
                &q.client,
                count,
                CubeDim::new_1d(UNITS),
                arg(&q),
                arg(&k),
                arg(&v),
                arg(&o),
                arg(&lse),
                arg(&d_o),
                arg(&dq),
                arg(&delta),
                cubes,
                q_blocks,
                d.t as u32,
                d.s as u32,
                d.scale,
                d.dh,
                d.dv,
                d.causal,
                q.dtype.into(),
            );
            let (count, cubes, k_blocks) = blocks(d.bh(), d.s);
            backward_key_tiles::launch::<R>(
                &q.client,
                count,
                CubeDim::new_1d(UNITS),
                arg(&q),
                arg(&k),
                arg(&v),
                arg(&lse),
                arg(&delta),
                arg(&d_o),
                arg(&dk),
                arg(&dv),
                cubes,
                k_blocks,
                d.t as u32,
                d.s as u32,
                d.scale,
                d.dh,
                d.dv,
                d.causal,
                q.dtype.into(),
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
