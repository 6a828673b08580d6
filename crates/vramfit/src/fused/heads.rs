//! The attention heads' layout changes (split and merge) as autodiff operations.

#[allow(unused_imports)]
use super::*;

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
pub(super) fn rows3(x: &FlexTensor) -> (std::borrow::Cow<'_, [f32]>, usize, [usize; 2]) {
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
pub(super) fn heads_from_rows(src: &[f32], offset: usize, [sb, st]: [usize; 2], [b, h, t, dh]: [usize; 4]) -> Vec<f32> {
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
pub(super) fn rows_from_heads(src: &[f32], [b, h, t, dh]: [usize; 4]) -> Vec<f32> {
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

pub(super) fn split_heads_forward(x: &FlexTensor, dims: [usize; 4]) -> FlexTensor {
    let (src, offset, strides) = rows3(x);
    flex(heads_from_rows(&src, offset, strides, dims), dims.into())
}

pub(super) fn merge_heads_forward(x: &FlexTensor, [b, h, t, dh]: [usize; 4]) -> FlexTensor {
    flex(rows_from_heads(&values(x), [b, h, t, dh]), [b, t, h * dh].into())
}

/// One of the two head permutations as an autodiff operation whose
/// backward is the other.
pub(super) fn heads_op<const I: usize, const O: usize>(
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

pub(super) fn split_heads_cpu(x: Tensor<Cpu, 3>, dims: [usize; 4]) -> Tensor<Cpu, 4> {
    heads_op(x, dims, split_heads_forward, merge_heads_forward)
}

pub(super) fn merge_heads_cpu(x: Tensor<Cpu, 4>) -> Tensor<Cpu, 3> {
    let dims = x.dims();
    heads_op(x, dims, merge_heads_forward, split_heads_forward)
}
