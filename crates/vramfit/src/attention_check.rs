//! The fused attention on a backend against its twins: the output and the
//! gradients of Q, K and V of `Σ up · attention(q, k, v)`, compared with
//! the CPU's fused attention and with the standard attention on the same
//! backend. One body for the toolkit's test (every backend present) and
//! `vramfit check-kernels` (the CubeCL kernels on CUDA or wgpu).

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde::Serialize;

use crate::fused::{Attention, attention, attention_reference};
use crate::precision::{Precision, cast_to};

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
    /// The type of Q, K, V (and so of the output and the gradients). In
    /// f16 and bf16 the twins run in f32 on the same values (rounded to the
    /// type), so the gap is the kernel's plus one rounding of the result.
    pub inputs: Precision,
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
            inputs: Precision::F32,
        }
    }

    /// The case with Q, K and V in `inputs`.
    const fn with(self, inputs: Precision) -> Self {
        Self { inputs, ..self }
    }

    /// Whether backend `B`'s default device has the case's input type.
    pub fn runs_on<B: Backend>(&self) -> bool {
        B::supports_dtype(&Default::default(), burn::tensor::DType::from(self.inputs.dtype()))
    }

    /// The largest relative gap to the CPU's fused attention allowed: both
    /// sum in f32 over the keys, in different orders, so the gap grows
    /// like the square root of their count.
    pub fn tolerance(&self) -> f32 {
        1e-4 * (self.keys.max(self.queries) as f32 / 128.0).sqrt().max(1.0) + self.rounding()
    }

    /// What one rounding of a result to the input type adds to a gap: half
    /// a unit in the last place, relative (f16 2⁻¹¹, bf16 2⁻⁸), twice.
    pub fn rounding(&self) -> f32 {
        match self.inputs {
            Precision::F32 => 0.0,
            Precision::F16 => 2f32.powi(-10),
            Precision::Bf16 => 2f32.powi(-7),
        }
    }
}

/// Causal and not, head widths 16 to 128, lengths that are multiples of
/// no tile (past one block of 64 rows, and several key tiles: 16 rows at
/// width 128 + 128, 32 at 64 + 64, 64 at 32 + 32), more keys than queries
/// and fewer, a value width of its own, and three of them in f16 and bf16
/// (a caller skips the types its device lacks, [`Case::runs_on`]): small
/// enough for a software device.
pub fn standard_cases() -> Vec<Case> {
    let f32_cases = [
        (2, 3, 7, 7, 16, 16, true),
        (1, 2, 70, 70, 64, 64, true),
        (2, 1, 13, 29, 24, 40, false),
        (1, 1, 5, 5, 128, 128, false),
        (1, 2, 2, 2, 16, 16, true),
        (1, 1, 100, 100, 128, 128, true),
        (1, 2, 130, 77, 32, 32, false),
        (2, 1, 67, 150, 96, 64, false),
    ]
    .map(Case::new);
    let sixteen_bit = [2, 5, 7]
        .into_iter()
        .flat_map(|i| [Precision::F16, Precision::Bf16].map(|p| f32_cases[i].with(p)));
    f32_cases.into_iter().chain(sixteen_bit).collect()
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
            && self
                .to_standard
                .iter()
                .all(|g| *g <= STANDARD_TOLERANCE + self.case.rounding())
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

/// Runs one case on backend `B` (its default device) and on the CPU; the
/// twins in f32 on the case's values.
pub fn run_case<B: AutodiffBackend>(case: &Case) -> CaseReport {
    let here = run::<B>(case, true, case.inputs);
    let standard = run::<B>(case, false, Precision::F32);
    let cpu = run::<crate::backends::Flex>(case, true, Precision::F32);
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
/// `B`, fused or standard, with the case's values in `dtype`.
fn run<B: AutodiffBackend>(case: &Case, fused: bool, dtype: Precision) -> Run {
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
        inputs,
    } = *case;
    let shapes = [[b, h, t, dh], [b, h, s, dh], [b, h, s, dv], [b, h, t, dv]];
    let tensor = |i: usize| {
        let values = values(shapes[i].iter().product(), i as u64 + 1);
        let exact = values.into_iter().map(|x| inputs.round(x)).collect::<Vec<_>>();
        let wide = Tensor::<B, 4>::from_data(TensorData::new(exact, shapes[i]), &device);
        cast_to(wide, dtype.dtype())
    };
    let (q, k, v, up) = (
        tensor(0).require_grad(),
        tensor(1).require_grad(),
        tensor(2).require_grad(),
        tensor(3),
    );
    let scale = 1.0 / (dh as f64).sqrt();
    let host = |t: Tensor<B::InnerBackend, 4>| {
        cast_to(t, burn::tensor::FloatDType::F32)
            .into_data()
            .into_vec::<f32>()
            .expect("f32 values")
    };
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
