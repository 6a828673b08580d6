//! The fused attention on a backend against its twins: the output and the
//! gradients of Q, K and V of `Σ up · attention(q, k, v)`, compared with
//! the CPU's fused attention and with the standard attention on the same
//! backend. One body for the toolkit's test (every backend present) and
//! `vramfit check-kernels` (the CubeCL kernels on CUDA or wgpu).

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde::Serialize;

use super::{Attention, attention, attention_reference};

/// One attention call's shape.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Case {
    /// Batch.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Queries (t).
    pub queries: usize,
    /// Keys and values (s).
    pub keys: usize,
    /// Width of a query and a key head.
    pub head_width: usize,
    /// Width of a value head.
    pub value_width: usize,
    /// Key `j` masked for query `i < j`.
    pub causal: bool,
}

impl Case {
    const fn new(shape: (usize, usize, usize, usize, usize, usize, bool)) -> Self {
        let (batch, heads, queries, keys, head_width, value_width, causal) = shape;
        Self {
            batch,
            heads,
            queries,
            keys,
            head_width,
            value_width,
            causal,
        }
    }

    /// The largest relative gap to the CPU's fused attention allowed: both
    /// sum in f32 over the keys, in different orders, so the gap grows
    /// like the square root of their count.
    pub fn tolerance(&self) -> f32 {
        1e-4 * (self.keys.max(self.queries) as f32 / 128.0).sqrt().max(1.0)
    }
}

/// Causal and not, head widths 16 to 128, lengths that are multiples of
/// no tile (past one block of 64 rows, and several key tiles: 16 rows at
/// width 128 + 128, 32 at 64 + 64, 64 at 32 + 32), more keys than queries
/// and fewer, a value width of its own: small enough for a software device.
pub fn standard_cases() -> Vec<Case> {
    [
        (2, 3, 7, 7, 16, 16, true),
        (1, 2, 70, 70, 64, 64, true),
        (2, 1, 13, 29, 24, 40, false),
        (1, 1, 5, 5, 128, 128, false),
        (1, 2, 2, 2, 16, 16, true),
        (1, 1, 100, 100, 128, 128, true),
        (1, 2, 130, 77, 32, 32, false),
        (2, 1, 67, 150, 96, 64, false),
    ]
    .into_iter()
    .map(Case::new)
    .collect()
}

/// Lengths a GPU trains at (thousands of rows, many cubes).
pub fn large_cases() -> Vec<Case> {
    [
        (2, 8, 1024, 1024, 64, 64, true),
        (1, 4, 777, 1500, 128, 128, false),
        (1, 2, 2048, 2048, 32, 32, true),
    ]
    .into_iter()
    .map(Case::new)
    .collect()
}

/// What one case measured: for the output, dQ, dK and dV in that order,
/// the largest `|x − y| / (1 + |y|)` against each twin.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// The case.
    pub case: Case,
    /// Whether the backend runs the fused operation (a kernel) at all:
    /// elsewhere `attention` is Burn's operations and the check is moot.
    pub fused_kernel: bool,
    /// Against the CPU's fused attention.
    pub to_cpu: [f32; 4],
    /// Against the standard attention on this backend.
    pub to_standard: [f32; 4],
    /// The forward without autodiff (a checkpointed block's first
    /// forward) gave the same values, bit for bit.
    pub plain_forward_equal: bool,
    /// Every compared tensor has a value above 1e-3 (a check of zeros
    /// against zeros proves nothing).
    pub non_trivial: bool,
}

impl CaseReport {
    /// The compared tensors, in the order of the gaps.
    pub const NAMES: [&str; 4] = ["output", "dq", "dk", "dv"];

    /// Within tolerance of the CPU's twin, and within 1e-2 of the standard
    /// attention here: a wrong mask, scale or index is off by far more.
    /// The standard attention is not held to the CPU's tolerance because on
    /// CUDA Burn's f32 matrix products run on TF32 tensor cores (cubek's
    /// matmul, where the device has them): measured 1.6e-3 on an H200.
    pub fn passes(&self) -> bool {
        let tol = self.case.tolerance();
        self.fused_kernel
            && self.plain_forward_equal
            && self.non_trivial
            && self.to_cpu.iter().all(|g| *g <= tol)
            && self.to_standard.iter().all(|g| *g <= STANDARD_TOLERANCE)
    }
}

/// How far the fused attention may be from the standard attention on the
/// same device ([`CaseReport::passes`]).
pub const STANDARD_TOLERANCE: f32 = 1e-2;

/// Whether Burn's f32 matrix products on the backend named `name`
/// (`Backend::name`) may run on TF32 tensor cores (a 10-bit mantissa):
/// cubek's matmul takes them on CUDA devices that have them, so there the
/// standard attention is only about 1e-3 from an f32 one.
pub fn may_use_tf32(name: &str) -> bool {
    name.to_ascii_lowercase().contains("cuda")
}

/// Runs one case on backend `B` (its default device) and on the CPU.
pub fn run_case<B: AutodiffBackend>(case: &Case) -> CaseReport {
    let here = run::<B>(case, true);
    let standard = run::<B>(case, false);
    let cpu = run::<crate::backends::Flex>(case, true);
    let gap = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0.0f32, |m, g| m.max(g))
    };
    let gaps = |twin: &Run| std::array::from_fn(|i| gap(&here.values[i], &twin.values[i]));
    CaseReport {
        case: *case,
        fused_kernel: Attention::is_fused_on::<B>(),
        to_cpu: gaps(&cpu),
        to_standard: gaps(&standard),
        plain_forward_equal: here.plain_forward_equal && cpu.plain_forward_equal,
        non_trivial: standard.values.iter().all(|v| v.iter().any(|x| x.abs() > 1e-3)),
    }
}

struct Run {
    /// Output, dQ, dK, dV.
    values: [Vec<f32>; 4],
    plain_forward_equal: bool,
}

/// Output and the gradients of Q, K, V of `Σ up · attention(q, k, v)` on
/// `B`, fused or standard.
fn run<B: AutodiffBackend>(case: &Case, fused: bool) -> Run {
    let _graph = crate::grads::graph_lock();
    let device = Default::default();
    let Case {
        batch: b,
        heads: h,
        queries: t,
        keys: s,
        head_width: dh,
        value_width: dv,
        causal,
    } = *case;
    let shapes = [[b, h, t, dh], [b, h, s, dh], [b, h, s, dv], [b, h, t, dv]];
    let tensor = |i: usize| {
        Tensor::<B, 4>::from_data(
            TensorData::new(values(shapes[i].iter().product(), i as u64 + 1), shapes[i]),
            &device,
        )
    };
    let (q, k, v, up) = (
        tensor(0).require_grad(),
        tensor(1).require_grad(),
        tensor(2).require_grad(),
        tensor(3),
    );
    let scale = 1.0 / (dh as f64).sqrt();
    let host = |t: Tensor<B::InnerBackend, 4>| t.into_data().into_vec::<f32>().expect("f32 values");
    let out = if fused {
        attention(q.clone(), k.clone(), v.clone(), scale, causal)
    } else {
        attention_reference(q.clone(), k.clone(), v.clone(), scale, causal)
    };
    let plain_forward_equal = !fused || {
        let plain = attention(q.clone().inner(), k.clone().inner(), v.clone().inner(), scale, causal);
        host(plain) == host(out.clone().inner())
    };
    let grads = (out.clone() * up).sum().backward();
    let grad = |x: &Tensor<B, 4>| host(x.grad(&grads).expect("a gradient for every input"));
    Run {
        values: [host(out.inner()), grad(&q), grad(&k), grad(&v)],
        plain_forward_equal,
    }
}

/// Values in [-2, 2) from a seed (the same on every backend).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}
