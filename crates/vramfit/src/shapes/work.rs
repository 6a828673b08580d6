//! What each traced kernel does, for a roofline: floating-point operations
//! of its products (in f32 or a 16-bit type) and bytes it reads and writes.
//! Counted from the shapes as burn-ir describes them; a view moves nothing.

use burn_backend::DType;
use burn_ir::{FloatOperationIr, IntOperationIr, ModuleOperationIr, OperationIr, TensorIr};

/// One kernel's work.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpWork {
    /// Floating-point operations of its products (2 per multiply-add).
    pub flops: f64,
    /// Whether the products run in a 16-bit type (tensor cores).
    pub half: bool,
    /// Bytes of its inputs and outputs.
    pub bytes: f64,
    /// Bytes moved between the host and the device (an upload, a read).
    pub host_bytes: f64,
}

fn bytes(t: &TensorIr) -> f64 {
    (t.shape.num_elements() * t.dtype.size()) as f64
}

fn is_half(t: &TensorIr) -> bool {
    matches!(t.dtype, DType::F16 | DType::BF16)
}

/// A product of `lhs` `[.., m, k]` into `out` `[.., m, n]`.
fn product(lhs: &TensorIr, out: &TensorIr) -> (f64, bool) {
    let k = lhs.shape.last().copied().unwrap_or(1);
    (2.0 * out.shape.num_elements() as f64 * k as f64, is_half(lhs))
}

/// The work of `op`, a kernel that ran (not a view).
pub(super) fn of(op: &OperationIr) -> OpWork {
    let moved: f64 = op.inputs().map(bytes).sum::<f64>() + op.outputs().map(bytes).sum::<f64>();
    let (flops, half) = match op {
        OperationIr::Float(_, FloatOperationIr::Matmul(m)) | OperationIr::Int(IntOperationIr::Matmul(m)) => {
            product(&m.lhs, &m.out)
        }
        OperationIr::Module(m) => module(m),
        OperationIr::Custom(c) => custom(&c.id, &c.inputs),
        _ => (0.0, false),
    };
    OpWork {
        flops,
        half,
        bytes: moved,
        host_bytes: 0.0,
    }
}

fn module(op: &ModuleOperationIr) -> (f64, bool) {
    match op {
        ModuleOperationIr::Linear(l) => product(&l.x, &l.out),
        ModuleOperationIr::LinearXBackward(l) => product(&l.output_grad, &l.out),
        ModuleOperationIr::LinearWeightBackward(l) => {
            // dW [in, out] sums over every row of x: rows × in × out.
            let rows = l.x.shape.num_elements() / l.x.shape.last().copied().unwrap_or(1).max(1);
            (2.0 * l.out.shape.num_elements() as f64 * rows as f64, is_half(&l.x))
        }
        ModuleOperationIr::Conv2d(c) => conv(&c.weight, &c.out, &c.out),
        ModuleOperationIr::Conv2dXBackward(c) => conv(&c.weight, &c.output_grad, &c.out),
        ModuleOperationIr::Conv2dWeightBackward(c) => conv(&c.weight, &c.output_grad, &c.weight),
        ModuleOperationIr::ConvTranspose2d(c) => conv(&c.weight, &c.x, &c.out),
        _ => (0.0, false),
    }
}

/// A 2-D convolution's products: each value of the larger side
/// (`[b, c_out, h, w]`) a dot product over `c_in/groups · kh · kw`.
fn conv(weight: &TensorIr, output: &TensorIr, out: &TensorIr) -> (f64, bool) {
    let w = &weight.shape;
    let per_output = w.iter().skip(1).product::<usize>() as f64;
    (2.0 * output.shape.num_elements() as f64 * per_output, is_half(out))
}

/// vramfit's own kernels (`super::custom`).
fn custom(id: &str, inputs: &[TensorIr]) -> (f64, bool) {
    let attention = |q: &TensorIr, k: &TensorIr, v: &TensorIr| {
        let (s, dh, dv) = (k.shape[2] as f64, q.shape[3] as f64, v.shape[3] as f64);
        let rows = (q.shape[0] * q.shape[1] * q.shape[2]) as f64;
        let causal = if id.ends_with(".causal") { 0.5 } else { 1.0 };
        // Q·Kᵀ and P·V.
        2.0 * rows * s * (dh + dv) * causal
    };
    match id.split('.').nth(1) {
        Some("attention") if inputs.len() >= 3 => (attention(&inputs[0], &inputs[1], &inputs[2]), is_half(&inputs[0])),
        // The scores again, dP, dQ, dK and dV: 2.5 times the forward's.
        Some("attention_backward") if inputs.len() >= 3 => {
            (2.5 * attention(&inputs[0], &inputs[1], &inputs[2]), is_half(&inputs[0]))
        }
        _ => (0.0, false),
    }
}
