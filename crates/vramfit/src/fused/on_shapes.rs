//! The fused attention on the shape backend: what the CubeCL kernels
//! (`cube.rs`) allocate, described without computing. The forward keeps
//! Q, K, V (row-major copies where they were strided), the output and an
//! f32 log-sum-exp per query row; the backward makes dQ, dK, dV and an f32
//! row sum per query, in that order, as the kernels' launches do.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::{DType, TensorPrimitive};

use crate::shapes::{ShapeTensor, Shapes, contiguous, kernel};

/// The kernels' names (a causal attention does half the products).
fn names(causal: bool) -> (&'static str, &'static str) {
    if causal {
        ("vramfit.attention.causal", "vramfit.attention_backward.causal")
    } else {
        ("vramfit.attention", "vramfit.attention_backward")
    }
}

/// `[b, h, t, dv]` of the output and `[b, h, t]` of the log-sum-exps.
fn forward(q: &ShapeTensor, k: &ShapeTensor, v: &ShapeTensor, causal: bool) -> (ShapeTensor, ShapeTensor) {
    use burn::tensor::TensorMetadata;
    let ([b, h, t], dv) = ([q.shape()[0], q.shape()[1], q.shape()[2]], v.shape()[3]);
    let mut out = kernel(
        names(causal).0,
        &[q, k, v],
        &[([b, h, t, dv].into(), q.dtype()), ([b, h, t].into(), DType::F32)],
    );
    let lse = out.pop().expect("two outputs");
    (out.pop().expect("two outputs"), lse)
}

/// The fused attention without autodiff (a checkpointed block's first forward).
pub(super) fn forward_only(
    q: Tensor<Shapes, 4>,
    k: Tensor<Shapes, 4>,
    v: Tensor<Shapes, 4>,
    causal: bool,
) -> Tensor<Shapes, 4> {
    let [q, k, v] = [q, k, v].map(|t| contiguous(t.into_primitive().tensor()));
    Tensor::from_primitive(TensorPrimitive::Float(forward(&q, &k, &v, causal).0))
}

/// The fused attention as one autodiff operation on the shape backend.
pub(super) fn attention(
    q: Tensor<Autodiff<Shapes>, 4>,
    k: Tensor<Autodiff<Shapes>, 4>,
    v: Tensor<Autodiff<Shapes>, 4>,
    causal: bool,
) -> Tensor<Autodiff<Shapes>, 4> {
    #[derive(Debug)]
    struct Attention(bool);

    impl Backward<Shapes, 3> for Attention {
        /// Q, K, V, the output and the log-sum-exps.
        type State = ([ShapeTensor; 4], ShapeTensor);

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            use burn::tensor::TensorMetadata;
            let ([q, k, v, o], lse) = ops.state;
            let d_o = grads.consume::<Shapes>(&ops.node);
            let d_o = if d_o.dtype() == q.dtype() {
                d_o
            } else {
                use burn::tensor::ops::FloatTensorOps;
                let dtype = match q.dtype() {
                    DType::BF16 => burn::tensor::FloatDType::BF16,
                    DType::F16 => burn::tensor::FloatDType::F16,
                    _ => burn::tensor::FloatDType::F32,
                };
                <Shapes as FloatTensorOps<Shapes>>::float_cast(d_o, dtype)
            };
            let d_o = contiguous(d_o);
            let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
            let (b, h, t) = (qs[0], qs[1], qs[2]);
            let mut made = kernel(
                names(self.0).1,
                &[&q, &k, &v, &o, &lse, &d_o],
                &[
                    (qs.clone(), q.dtype()),
                    (ks.clone(), q.dtype()),
                    ([b, h, ks[2], vs[3]].into(), q.dtype()),
                    ([b * h * t].into(), DType::F32),
                ],
            );
            let _delta = made.pop();
            for (parent, grad) in ops.parents.iter().zip(made) {
                if let Some(node) = parent {
                    grads.register::<Shapes>(node.id, grad);
                }
            }
        }
    }

    let [q, k, v] = [q, k, v].map(|t| t.into_primitive().tensor());
    let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
    let [qp, kp, vp] = [q.primitive, k.primitive, v.primitive].map(contiguous);
    let out = match Attention(causal)
        .prepare::<NoCheckpointing>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (o, lse) = forward(&qp, &kp, &vp, causal);
            prep.finish(([qp, kp, vp, o.clone()], lse), o)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(&qp, &kp, &vp, causal).0),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
