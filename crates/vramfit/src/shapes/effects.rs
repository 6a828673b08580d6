//! Where each operation's output lives on a CubeCL device, from its
//! description alone: a new buffer, the buffer of an input the operation
//! may overwrite, or a view of an input's buffer. The rules are
//! burn-cubecl 0.21's: an elementwise kernel writes into an input it holds
//! the last handle of (`can_mut`, `can_mut_broadcast`: unary, binary,
//! scalar and mask operations and the assignments), reshape, permute,
//! swap and expand change only the strides (a reshape CubeCL cannot
//! express in strides copies), and a slice whose ends fall on the
//! allocator's alignment is a view of its input (`kernel/index/slice.rs`).

use burn_ir::{
    BaseOperationIr, BoolOperationIr, FloatOperationIr, IntOperationIr, NumericOperationIr, OperationIr, TensorIr,
};
use burn_std::{ReshapeAction, Strides, reshape_action};

use super::buffers::{Buffers, contiguous};

/// The name of the copy CubeCL makes of a strided input before a kernel
/// that reads rows (`into_contiguous`; `super::custom::contiguous`).
pub(super) const CONTIGUOUS: &str = "vramfit.contiguous";

/// Where an operation's output goes.
enum Place<'a> {
    /// A new buffer (each output).
    New,
    /// Into the first of these inputs CubeCL may overwrite, else a new
    /// buffer. `broadcast`: the input must be at least the other's size in
    /// every dimension (binary operations).
    Overwrite(&'a TensorIr, Option<&'a TensorIr>),
    /// A view of an input's buffer with the input's strides.
    Same(&'a TensorIr),
    /// A view of an input's buffer, its dimensions in this order.
    Permute(&'a TensorIr, Vec<usize>),
    /// A view of an input's buffer broadcast to the output's shape.
    Expand(&'a TensorIr),
    /// A view where the slice's ends fall on the allocator's alignment,
    /// else a copy.
    Slice(&'a TensorIr, &'a [burn_std::Slice]),
    /// A reshape: a view where the strides can say it, else a copy.
    Reshape(&'a TensorIr),
    /// The input itself where it is row-major, else a copy.
    Contiguous(&'a TensorIr),
}

/// Why an operation cannot be traced on shapes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {why}")]
pub struct Untraceable {
    /// The operation, as burn-ir names it.
    pub op: String,
    /// Why.
    pub why: &'static str,
}

/// Records `op` in `buffers`: its outputs placed, then the inputs it held
/// the last handle of released. `alignment`: the device allocator's (a
/// slice is a view only where its ends fall on it). Says whether a kernel
/// ran (a view runs none).
pub(super) fn apply(buffers: &mut Buffers, op: &OperationIr, alignment: u64) -> Result<bool, Untraceable> {
    match op {
        OperationIr::Drop(t) => {
            buffers.release(t.id);
            return Ok(false);
        }
        // The output's buffer was made with its data (`register_tensor_data`).
        OperationIr::Init(_) => return Ok(false),
        _ => {}
    }
    let mut ran = true;
    let place = place(op)?;
    let outputs: Vec<&TensorIr> = op.outputs().collect();
    match (place, outputs.as_slice()) {
        (Place::Same(input), [out]) => {
            let strides = buffers.view(input).strides.clone();
            buffers.alias(out, input, strides);
            ran = false;
        }
        (Place::Permute(input, axes), [out]) => {
            let strides = permuted(&buffers.view(input).strides, &axes);
            buffers.alias(out, input, strides);
            ran = false;
        }
        (Place::Expand(input), [out]) => {
            let view = buffers.view(input).clone();
            let strides = expanded(&view.shape, &view.strides, &out.shape);
            buffers.alias(out, input, strides);
            ran = false;
        }
        (Place::Slice(input, ranges), [out]) => {
            let view = buffers.view(input).clone();
            let unit_steps = ranges.iter().all(|r| r.step == 1);
            if unit_steps && slice_aligned(&view.shape, &view.strides, input.dtype.size(), ranges, alignment) {
                buffers.alias(out, input, view.strides);
                ran = false;
            } else {
                buffers.reserve(out);
            }
        }
        (Place::Reshape(input), [out]) => {
            let view = buffers.view(input).clone();
            let action = reshape_action(
                &burn_std::Shape::from(view.shape.clone()),
                &Strides::new(&view.strides),
                &out.shape,
            );
            ran = matches!(action, ReshapeAction::Recompute);
            match action {
                ReshapeAction::UpdateStrides { strides } => buffers.alias(out, input, strides.to_vec()),
                ReshapeAction::NoChange => buffers.alias(out, input, view.strides.clone()),
                ReshapeAction::Recompute => buffers.reserve(out),
            }
        }
        (Place::Contiguous(input), [out]) => {
            let view = buffers.view(input).clone();
            if view.strides == contiguous(&view.shape) {
                buffers.alias(out, input, view.strides);
                ran = false;
            } else {
                buffers.reserve(out);
            }
        }
        (Place::Overwrite(first, other), [out]) => {
            let fits = |t: &TensorIr, o: &TensorIr| t.shape.iter().zip(o.shape.iter()).all(|(a, b)| a >= b);
            let first_ok = first.dtype == out.dtype && other.is_none_or(|o| fits(first, o)) && buffers.can_mut(first);
            let second_ok =
                !first_ok && other.is_some_and(|o| o.dtype == out.dtype && fits(o, first) && buffers.can_mut(o));
            if first_ok {
                let strides = buffers.view(first).strides.clone();
                buffers.alias(out, first, strides);
            } else if let (true, Some(o)) = (second_ok, other) {
                let strides = buffers.view(o).strides.clone();
                buffers.alias(out, o, strides);
            } else {
                buffers.reserve(out);
            }
        }
        (_, outs) => {
            for out in outs {
                buffers.reserve(out);
            }
        }
    }
    // Inputs the op held the last handle of go now (no drop follows).
    let mut gone = Vec::new();
    for input in op.inputs() {
        if input.status == burn_ir::TensorStatus::ReadWrite && !gone.contains(&input.id) {
            gone.push(input.id);
        }
    }
    for id in gone {
        buffers.release(id);
    }
    Ok(ran)
}

/// The strides of `input` seen through a permutation `axes`.
fn permuted(strides: &[usize], axes: &[usize]) -> Vec<usize> {
    axes.iter().map(|&a| strides[a]).collect()
}

/// The strides of a tensor of `shape` and `strides` broadcast to `out`
/// (new leading dimensions and dimensions of 1 read one place).
fn expanded(shape: &[usize], strides: &[usize], out: &[usize]) -> Vec<usize> {
    let lead = out.len() - shape.len();
    (0..out.len())
        .map(|j| match j.checked_sub(lead) {
            Some(i) if !(shape[i] == 1 && out[j] != 1) => strides[i],
            _ => 0,
        })
        .collect()
}

fn place(op: &OperationIr) -> Result<Place<'_>, Untraceable> {
    let refuse = |why| {
        Err(Untraceable {
            op: format!("{:?}", std::mem::discriminant(op)).replace("Discriminant", "operation"),
            why,
        })
    };
    Ok(match op {
        OperationIr::BaseFloat(b) | OperationIr::BaseInt(b) | OperationIr::BaseBool(b) => base(b),
        OperationIr::NumericFloat(_, n) | OperationIr::NumericInt(_, n) => numeric(n),
        OperationIr::Float(_, f) => match f {
            FloatOperationIr::Exp(u)
            | FloatOperationIr::Log(u)
            | FloatOperationIr::Log1p(u)
            | FloatOperationIr::Erf(u)
            | FloatOperationIr::Sqrt(u)
            | FloatOperationIr::Cos(u)
            | FloatOperationIr::Cosh(u)
            | FloatOperationIr::Sin(u)
            | FloatOperationIr::Sinh(u)
            | FloatOperationIr::Tan(u)
            | FloatOperationIr::Tanh(u)
            | FloatOperationIr::ArcCos(u)
            | FloatOperationIr::ArcCosh(u)
            | FloatOperationIr::ArcSin(u)
            | FloatOperationIr::ArcSinh(u)
            | FloatOperationIr::ArcTan(u)
            | FloatOperationIr::ArcTanh(u)
            | FloatOperationIr::Round(u)
            | FloatOperationIr::Floor(u)
            | FloatOperationIr::Ceil(u)
            | FloatOperationIr::Trunc(u)
            | FloatOperationIr::Recip(u) => Place::Overwrite(&u.input, None),
            FloatOperationIr::PowfScalar(s) => Place::Overwrite(&s.lhs, None),
            FloatOperationIr::Powf(b) | FloatOperationIr::ArcTan2(b) => Place::Overwrite(&b.lhs, Some(&b.rhs)),
            FloatOperationIr::Quantize(_) | FloatOperationIr::Dequantize(_) => {
                return refuse("Burn's quantized tensors are not traced (vramfit's own 4-bit storage is)");
            }
            _ => Place::New,
        },
        OperationIr::Int(i) => match i {
            IntOperationIr::BitwiseAnd(b)
            | IntOperationIr::BitwiseOr(b)
            | IntOperationIr::BitwiseXor(b)
            | IntOperationIr::BitwiseLeftShift(b)
            | IntOperationIr::BitwiseRightShift(b) => Place::Overwrite(&b.lhs, Some(&b.rhs)),
            IntOperationIr::BitwiseAndScalar(s)
            | IntOperationIr::BitwiseOrScalar(s)
            | IntOperationIr::BitwiseXorScalar(s)
            | IntOperationIr::BitwiseLeftShiftScalar(s)
            | IntOperationIr::BitwiseRightShiftScalar(s) => Place::Overwrite(&s.lhs, None),
            IntOperationIr::BitwiseNot(u) => Place::Overwrite(&u.input, None),
            _ => Place::New,
        },
        OperationIr::Bool(b) => match b {
            BoolOperationIr::Not(u) => Place::Overwrite(&u.input, None),
            BoolOperationIr::And(b) | BoolOperationIr::Or(b) => Place::Overwrite(&b.lhs, Some(&b.rhs)),
            _ => Place::New,
        },
        OperationIr::Custom(c) if c.id == CONTIGUOUS => Place::Contiguous(&c.inputs[0]),
        OperationIr::Module(_) | OperationIr::Custom(_) => Place::New,
        OperationIr::Drop(_) | OperationIr::Init(_) => Place::New,
        #[allow(unreachable_patterns)]
        _ => return refuse("an operation the shape trace does not know (collective or new in Burn)"),
    })
}

fn base(op: &BaseOperationIr) -> Place<'_> {
    match op {
        BaseOperationIr::Reshape(s) => Place::Reshape(&s.input),
        BaseOperationIr::SwapDims(s) => {
            let mut axes: Vec<usize> = (0..s.input.shape.len()).collect();
            axes.swap(s.dim1, s.dim2);
            Place::Permute(&s.input, axes)
        }
        BaseOperationIr::Permute(p) => Place::Permute(&p.input, p.axes.clone()),
        BaseOperationIr::Expand(s) => Place::Expand(&s.input),
        BaseOperationIr::Slice(s) => Place::Slice(&s.tensor, &s.ranges),
        BaseOperationIr::SliceAssign(s) => Place::Overwrite(&s.tensor, None),
        BaseOperationIr::SelectAssign(s) => Place::Overwrite(&s.tensor, None),
        BaseOperationIr::Scatter(s) => Place::Overwrite(&s.tensor, None),
        BaseOperationIr::ScatterNd(s) => Place::Overwrite(&s.data, None),
        BaseOperationIr::MaskFill(m) => Place::Overwrite(&m.tensor, None),
        BaseOperationIr::MaskWhere(m) => Place::Overwrite(&m.tensor, Some(&m.value)),
        BaseOperationIr::Cast(c) if c.input.dtype == c.out.dtype => Place::Same(&c.input),
        _ => Place::New,
    }
}

fn numeric(op: &NumericOperationIr) -> Place<'_> {
    use NumericOperationIr as N;
    match op {
        N::Add(b) | N::Sub(b) | N::Div(b) | N::Rem(b) | N::Mul(b) | N::Powi(b) => {
            Place::Overwrite(&b.lhs, Some(&b.rhs))
        }
        // Comparisons: in place only where the output's type is the input's
        // (checked in `apply`), so not for a float input.
        N::Greater(b) | N::GreaterEqual(b) | N::Lower(b) | N::LowerEqual(b) => Place::Overwrite(&b.lhs, Some(&b.rhs)),
        N::AddScalar(s)
        | N::SubScalar(s)
        | N::DivScalar(s)
        | N::RemScalar(s)
        | N::MulScalar(s)
        | N::PowiScalar(s)
        | N::GreaterElem(s)
        | N::GreaterEqualElem(s)
        | N::LowerElem(s)
        | N::LowerEqualElem(s) => Place::Overwrite(&s.lhs, None),
        N::Abs(u) => Place::Overwrite(&u.input, None),
        N::Clamp(c) => Place::Overwrite(&c.tensor, None),
        _ => Place::New,
    }
}

/// Whether a slice's first and last elements fall on the allocator's
/// alignment (then CubeCL makes it a view of its input's buffer).
fn slice_aligned(shape: &[usize], strides: &[usize], size: usize, ranges: &[burn_std::Slice], alignment: u64) -> bool {
    let (mut start, mut end) = (0i64, 0i64);
    for (i, r) in ranges.iter().enumerate() {
        let dim = shape[i] as i64;
        let first = if r.start < 0 {
            dim + r.start as i64
        } else {
            r.start as i64
        };
        let last = match r.end {
            Some(e) if e < 0 => dim + e as i64,
            Some(e) => e as i64,
            None => dim,
        };
        start += strides[i] as i64 * first;
        end += strides[i] as i64 * (dim - last);
    }
    let (start, end) = (start as u64 * size as u64, end as u64 * size as u64);
    alignment == 0 || (start.is_multiple_of(alignment) && end.is_multiple_of(alignment))
}
