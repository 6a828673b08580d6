//! `x · w + bias` as one autodiff operation (gemm adds onto the bias rows).

#[allow(unused_imports)]
use super::*;

/// `x · w + bias` for `x: [rows, in]`, `w: [in, out]`, `bias: [out]`. On
/// the CPU backend one operation: gemm adds the products onto the bias rows,
/// and the backward sums the bias gradient over the rows of the output's
/// gradient, where Burn's broadcast add is a pass over the output forward
/// and a reduction backward. Other backends and types use Burn's matmul and
/// add.
pub fn linear<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>, bias: Tensor<B, 1>) -> Tensor<B, 2> {
    match (on_cpu(x), on_cpu(w), on_cpu(bias)) {
        (Ok(x), Ok(w), Ok(bias)) => back(linear_cpu(x, w, bias)),
        (x, w, bias) => {
            let x = x.map_or_else(|t| t, back);
            let w = w.map_or_else(|t| t, back);
            let bias = bias.map_or_else(|t| t, back);
            matmul(x, w) + bias.unsqueeze::<2>()
        }
    }
}

pub(super) fn linear_cpu(x: Tensor<Cpu, 2>, w: Tensor<Cpu, 2>, bias: Tensor<Cpu, 1>) -> Tensor<Cpu, 2> {
    #[derive(Debug)]
    struct Linear;

    impl Backward<Flex, 3> for Linear {
        type State = (FlexTensor, FlexTensor);

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let g = grads.consume::<Flex>(&ops.node);
            let (x, w) = ops.state;
            let g = values(&g);
            let [px, pw, pb] = ops.parents.map(|p| p.map(|node| node.id));
            product_backward(&x, &w, &g, [px, pw], grads);
            if let Some(id) = pb {
                let n = matrices(&w).2;
                let mut sums = vec![0.0f32; n];
                for row in g.chunks(n.max(1)) {
                    for (s, v) in sums.iter_mut().zip(row) {
                        *s += v;
                    }
                }
                grads.register::<Flex>(id, flex(sums, [n].into()));
            }
        }
    }

    let forward = |x: &FlexTensor, w: &FlexTensor, bias: &FlexTensor| {
        let (mx, mw, bias) = (Matrices::of(x), Matrices::of(w), values(bias));
        assert_eq!(
            mx.cols, mw.rows,
            "linear: {} inputs against a weight of {} rows",
            mx.cols, mw.rows
        );
        assert_eq!(
            bias.len(),
            mw.cols,
            "linear: a bias of {} values for {} outputs",
            bias.len(),
            mw.cols
        );
        let y = gemm_products_onto(1, mx.operand(), mw.operand(), Some(&bias));
        flex(y, [mx.rows, mw.cols].into())
    };
    let (x, w, bias) = (
        x.into_primitive().tensor(),
        w.into_primitive().tensor(),
        bias.into_primitive().tensor(),
    );
    let out = match Linear
        .prepare::<NoCheckpointing>([x.node.clone(), w.node.clone(), bias.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = forward(&x.primitive, &w.primitive, &bias.primitive);
            prep.finish((x.primitive, w.primitive), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(&x.primitive, &w.primitive, &bias.primitive)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
