//! A language model's head and loss computed a chunk of positions at a
//! time: `mean_i −log softmax(x_i · H)[target_i]` without the `[n, vocab]`
//! logits ever existing whole.
//!
//! Under autodiff the plain head keeps its f32 logits (and the softmax's
//! output) for the backward: at 2,048 tokens and a vocabulary of 32,000,
//! 250 MiB a sample for each. Here the forward runs chunk by chunk and
//! computes each chunk's gradients with respect to `x` (and `H` where it
//! trains) while its logits exist, then drops them; what is kept for the
//! backward is those gradients (`x`'s size, and `H`'s where it trains),
//! scaled by the upstream gradient there. The loss and the gradients are
//! the plain head's up to summation order. (Liger-Kernel's fused linear
//! cross-entropy does the same on CUDA.)

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::{FloatDType, TensorPrimitive};

use crate::fused::downcast;
use crate::precision::Autocast;

/// Positions a chunk holds by default: 1,024 rows of 32,000 f32 logits are
/// 125 MiB, with their softmax 250 MiB at most at once.
pub const DEFAULT_CHUNK: usize = 1024;

/// Mean next-token cross-entropy of `x · head` (`x: [n, w]`, `head: [w,
/// vocab]`, `targets: [n]`), the product in `ac`'s low type and the
/// softmax in f32, `chunk` rows at a time. `head` may be frozen (then only
/// `x` gets a gradient) or train. On Flex and CubeCL with autodiff, the
/// chunked operation; elsewhere (and for one chunk) the plain head.
pub fn chunked_cross_entropy<B: Backend>(
    x: Tensor<B, 2>,
    head: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    chunk: usize,
    ac: &Autocast,
) -> Tensor<B, 1> {
    let n = x.dims()[0];
    let chunk = chunk.max(1);
    if n <= chunk {
        return plain(x, head, targets, ac);
    }
    let args = (x, head, targets);
    let args = match on::<B, burn::backend::Flex>(args, chunk, ac) {
        Ok(loss) => return loss,
        Err(args) => args,
    };
    let args = match on::<B, crate::shapes::Shapes>(args, chunk, ac) {
        Ok(loss) => return loss,
        Err(args) => args,
    };
    #[cfg(feature = "wgpu")]
    let args = match on::<B, burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8>>(args, chunk, ac) {
        Ok(loss) => return loss,
        Err(args) => args,
    };
    #[cfg(feature = "cuda")]
    let args = match on::<B, burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>(args, chunk, ac) {
        Ok(loss) => return loss,
        Err(args) => args,
    };
    let (x, head, targets) = args;
    // Elsewhere: the chunks' losses summed (without autodiff nothing is
    // kept; under another backend's autodiff each chunk's logits are).
    let mut total: Option<Tensor<B, 1>> = None;
    for start in (0..n).step_by(chunk) {
        let rows = chunk.min(n - start);
        let part = plain(
            x.clone().narrow(0, start, rows),
            head.clone(),
            targets.clone().narrow(0, start, rows),
            ac,
        ) * rows as f64;
        total = Some(match total {
            Some(t) => t + part,
            None => part,
        });
    }
    total.expect("at least one chunk") / n as f64
}

/// The plain head: the logits whole, Burn's log-softmax, the mean.
pub fn plain<B: Backend>(
    x: Tensor<B, 2>,
    head: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    ac: &Autocast,
) -> Tensor<B, 1> {
    let n = x.dims()[0];
    // A frozen head is used as stored (no compute-type copy kept).
    let product = if head.is_require_grad() {
        ac.matmul(x, head)
    } else {
        crate::frozen::frozen_matmul(ac.low(x), &crate::frozen::Matrix::Float(head))
    };
    let logits = ac.full(product);
    burn::tensor::activation::log_softmax(logits, 1)
        .gather(1, targets.reshape([n, 1]))
        .mean()
        .neg()
}

type Args<B> = (Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 1, Int>);

fn on<B: Backend, I: Backend>(args: Args<B>, chunk: usize, ac: &Autocast) -> Result<Tensor<B, 1>, Args<B>> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Autodiff<I>>() {
        return Err(args);
    }
    let (x, head, targets) = args;
    let x: Tensor<Autodiff<I>, 2> = downcast(x).unwrap_or_else(|_| unreachable!("B is Autodiff<I>"));
    let head: Tensor<Autodiff<I>, 2> = downcast(head).unwrap_or_else(|_| unreachable!("B is Autodiff<I>"));
    let targets: Tensor<Autodiff<I>, 1, Int> = downcast(targets).unwrap_or_else(|_| unreachable!("B is Autodiff<I>"));
    let loss = tracked::<I>(x, head, targets.inner(), chunk, ac);
    Ok(downcast(loss).unwrap_or_else(|_| unreachable!("B is Autodiff<I>")))
}

#[derive(Debug)]
struct ChunkedCrossEntropy;

/// The gradients of the mean loss for `x` and, where it trains, `head`.
#[derive(Debug, Clone)]
struct Kept<I: Backend> {
    dx: Option<Tensor<I, 2>>,
    dhead: Option<Tensor<I, 2>>,
}

impl<I: Backend> Backward<I, 2> for ChunkedCrossEntropy {
    type State = Kept<I>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        let g = crate::precision::cast_to(g, FloatDType::F32).reshape([1, 1]);
        let [px, ph] = &ops.parents;
        for (parent, kept) in [(px, ops.state.dx), (ph, ops.state.dhead)] {
            if let (Some(parent), Some(d)) = (parent, kept) {
                let dtype = d.dtype();
                let scaled = crate::precision::cast_to(d, FloatDType::F32) * g.clone();
                let scaled = match dtype {
                    burn::tensor::DType::BF16 => scaled.cast(FloatDType::BF16),
                    burn::tensor::DType::F16 => scaled.cast(FloatDType::F16),
                    _ => scaled,
                };
                grads.register::<I>(parent.id, scaled.into_primitive().tensor());
            }
        }
    }
}

/// The loss, and the gradients the backward will scale, chunk by chunk.
fn forward<I: Backend>(
    x: &Tensor<I, 2>,
    head: &Tensor<I, 2>,
    targets: &Tensor<I, 1, Int>,
    chunk: usize,
    ac: &Autocast,
    want: [bool; 2],
) -> (Tensor<I, 1>, Kept<I>) {
    let [n, _] = x.dims();
    let vocab = head.dims()[1];
    let device = x.device();
    let low_head = ac.low(head.clone());
    let mut loss = Tensor::<I, 1>::zeros([1], &device);
    let mut dx_parts = Vec::new();
    let mut dhead: Option<Tensor<I, 2>> = None;
    for start in (0..n).step_by(chunk) {
        let rows = chunk.min(n - start);
        let xc = ac.low(x.clone().narrow(0, start, rows));
        let tc = targets.clone().narrow(0, start, rows).reshape([rows, 1]);
        let logits = ac.full(crate::fused::matmul(xc.clone(), low_head.clone())); // [rows, vocab] f32
        let max = logits.clone().max_dim(1);
        let shifted = logits - max;
        let sum = shifted.clone().exp().sum_dim(1);
        let lse = sum.clone().log();
        let picked = shifted.clone().gather(1, tc.clone());
        loss = loss + (lse - picked).sum().reshape([1]);
        if want.iter().any(|w| *w) {
            // d(mean loss)/d logits = (softmax − onehot) / n.
            let onehot = Tensor::<I, 2>::zeros([rows, vocab], &device).scatter(
                1,
                tc,
                Tensor::ones([rows, 1], &device),
                burn::tensor::IndexingUpdateOp::Add,
            );
            let dlogits = (shifted.exp() / sum - onehot) / n as f64;
            if want[0] {
                let dlow = ac.low(dlogits.clone());
                let dxc = crate::fused::matmul(dlow, low_head.clone().transpose());
                dx_parts.push(crate::precision::cast_to(dxc, dtype_of(x)));
            }
            if want[1] {
                let part = ac.full(crate::fused::matmul(xc.transpose(), ac.low(dlogits)));
                dhead = Some(match dhead {
                    Some(d) => d + part,
                    None => part,
                });
            }
        }
    }
    let dx = want[0].then(|| Tensor::cat(dx_parts, 0));
    let dhead = dhead.map(|d| crate::precision::cast_to(d, dtype_of(head)));
    (loss / n as f64, Kept { dx, dhead })
}

fn dtype_of<B: Backend, const D: usize>(t: &Tensor<B, D>) -> FloatDType {
    match t.dtype() {
        burn::tensor::DType::BF16 => FloatDType::BF16,
        burn::tensor::DType::F16 => FloatDType::F16,
        _ => FloatDType::F32,
    }
}

fn tracked<I: Backend>(
    x: Tensor<Autodiff<I>, 2>,
    head: Tensor<Autodiff<I>, 2>,
    targets: Tensor<I, 1, Int>,
    chunk: usize,
    ac: &Autocast,
) -> Tensor<Autodiff<I>, 1> {
    let (x, head) = (x.into_primitive().tensor(), head.into_primitive().tensor());
    let inner = |t: I::FloatTensorPrimitive| Tensor::<I, 2>::from_primitive(TensorPrimitive::Float(t));
    let out = match ChunkedCrossEntropy
        .prepare::<NoCheckpointing>([x.node.clone(), head.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let want = [prep_wants(&x), prep_wants(&head)];
            let (loss, kept) = forward(&inner(x.primitive), &inner(head.primitive), &targets, chunk, ac, want);
            prep.finish(kept, loss.into_primitive().tensor())
        }
        OpsKind::UnTracked(prep) => {
            let (loss, _) = forward(
                &inner(x.primitive),
                &inner(head.primitive),
                &targets,
                chunk,
                ac,
                [false; 2],
            );
            prep.finish(loss.into_primitive().tensor())
        }
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Whether a parent needs its gradient (it is tracked: trains, or leads to
/// something that does).
fn prep_wants<I: Backend>(t: &burn::tensor::ops::FloatTensor<Autodiff<I>>) -> bool {
    !t.node.requirement.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Precision;
    use burn::backend::Flex;
    use burn::tensor::Distribution;

    type B = Autodiff<Flex>;

    /// Loss and both gradients equal the plain head's, chunk sizes that do
    /// and do not divide the positions, the head trained and frozen, f32
    /// and bf16 compute.
    #[test]
    fn chunks_give_the_plain_heads_loss_and_gradients() {
        let _graph = crate::grads::graph_lock();
        let device = Default::default();
        let (n, w, v) = (37, 16, 50);
        let x0 = Tensor::<B, 2>::random([n, w], Distribution::Normal(0.0, 1.0), &device);
        let h0 = Tensor::<B, 2>::random([w, v], Distribution::Normal(0.0, 0.3), &device);
        let targets = Tensor::<B, 1, Int>::from_data(
            TensorData::new((0..n as i64).map(|i| (i * 7) % v as i64).collect::<Vec<_>>(), [n]),
            &device,
        );
        for precision in [Precision::F32, Precision::Bf16] {
            let ac = Autocast::new(precision);
            for head_trains in [true, false] {
                let run = |chunk: Option<usize>| {
                    let x = x0.clone().require_grad();
                    let h = if head_trains {
                        h0.clone().require_grad()
                    } else {
                        h0.clone()
                    };
                    let loss = match chunk {
                        Some(c) => chunked_cross_entropy(x.clone(), h.clone(), targets.clone(), c, &ac),
                        None => plain(x.clone(), h.clone(), targets.clone(), &ac),
                    };
                    let value: f32 = loss.clone().into_scalar().elem();
                    let grads = (loss * 3.0).backward();
                    let dx = x.grad(&grads).unwrap().cast(FloatDType::F32);
                    let dh = h.grad(&grads).map(|d| d.cast(FloatDType::F32));
                    (value, dx, dh)
                };
                let (l0, dx0, dh0) = run(None);
                for chunk in [5, 8, 36] {
                    let (l, dx, dh) = run(Some(chunk));
                    let gap = |a: Tensor<Flex, 2>, b: Tensor<Flex, 2>| -> f32 {
                        let scale: f32 = b.clone().abs().max().into_scalar();
                        let d: f32 = (a - b).abs().max().into_scalar();
                        d / scale
                    };
                    // f32: summation order only. bf16: the plain head's backward
                    // rounds dlogits and the products' inputs the same way; its
                    // gradient arrives through the casts' own rounding (one unit
                    // in the last place, 2⁻⁸).
                    let bound = if precision == Precision::F32 { 1e-5 } else { 1e-2 };
                    assert!(
                        (l - l0).abs() <= 1e-5 * l0.abs(),
                        "{precision:?} chunk {chunk}: loss {l} vs {l0}"
                    );
                    let gx = gap(dx, dx0.clone());
                    assert!(gx <= bound, "{precision:?} chunk {chunk}: dx {gx:e}");
                    match (dh, &dh0) {
                        (Some(dh), Some(dh0)) => {
                            let gh = gap(dh, dh0.clone());
                            assert!(gh <= bound, "{precision:?} chunk {chunk}: dhead {gh:e}");
                        }
                        (None, None) => assert!(!head_trains),
                        _ => panic!("{precision:?} chunk {chunk}: the head's gradient where the plain one has none"),
                    }
                }
            }
        }
    }
}
