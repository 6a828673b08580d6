//! The causal softmax (scale and mask included) as one autodiff operation.

#[allow(unused_imports)]
use super::*;

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
pub(super) fn causal_softmax_rows(x: &[f32], y: &mut [f32], t: usize, first_row: usize, scale: f32) {
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

pub(super) fn causal_softmax_forward(x: &FlexTensor, scale: f32) -> FlexTensor {
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
pub(super) fn softmax_backward(y: &FlexTensor, dy: &FlexTensor, scale: f32) -> FlexTensor {
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

pub(super) fn causal_softmax_cpu<const D: usize>(scores: Tensor<Cpu, D>, scale: f32) -> Tensor<Cpu, D> {
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
