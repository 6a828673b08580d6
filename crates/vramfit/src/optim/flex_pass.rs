//! One parallel pass over an Adam update's f32 vectors on the CPU backend
//! (Flex), shared by both optimisers: Burn's operations make a pass over
//! the whole parameter set per operation (about a dozen per update) and,
//! on small tensors, cost more in per-operation overhead than in work.

use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::{DType, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use crate::fused::{downcast, values};

/// Four flat tensors: parameter, gradient, first and second moments.
pub(super) type Vectors<B> = (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>);

/// `(p, m, v)` with `step(p, g, m, v) → (p, m, v)` applied to every
/// element, in place where a buffer is not shared (copied first where it
/// is, or where the tensor is a view). `Err` gives the tensors back when
/// they are not f32 on Flex: the caller then uses Burn's operations.
#[allow(clippy::type_complexity)]
pub(super) fn flex_pass<B: Backend>(
    (p, g, m, v): Vectors<B>,
    step: impl Fn(f32, f32, f32, f32) -> (f32, f32, f32) + Sync,
) -> Result<(Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>), Vectors<B>> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Flex>()
        || [&p, &g, &m, &v].iter().any(|t| t.dtype() != DType::F32)
    {
        return Err((p, g, m, v));
    }
    let flex = |t: Tensor<B, 1>| downcast::<_, Tensor<Flex, 1>>(t).unwrap_or_else(|_| unreachable!("B is Flex"));
    let back = |t: Tensor<Flex, 1>| downcast::<_, Tensor<B, 1>>(t).unwrap_or_else(|_| unreachable!("B is Flex"));
    // Contiguous, unshared buffers of exactly the tensor's length.
    let owned = |t: Tensor<B, 1>| {
        let t = flex(t).into_primitive().tensor();
        let n = t.layout().num_elements();
        let mut t = if t.layout().contiguous_offsets() == Some((0, n)) && t.bytes().len() == 4 * n {
            t
        } else {
            FlexTensor::from_data(TensorData::new(t.into_data().to_vec::<f32>().expect("f32"), [n]))
        };
        t.storage_mut::<f32>();
        t
    };
    let g = flex(g).into_primitive().tensor();
    let g = values(&g);
    let (mut p, mut m, mut v) = (owned(p), owned(m), owned(v));
    let n = g.len();
    assert!(
        [&p, &m, &v].iter().all(|t| t.layout().num_elements() == n),
        "Adam: parameter, gradient and moments of different lengths"
    );
    const CHUNK: usize = 1 << 14;
    p.storage_mut::<f32>()
        .par_chunks_mut(CHUNK)
        .zip(m.storage_mut::<f32>().par_chunks_mut(CHUNK))
        .zip(v.storage_mut::<f32>().par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK))
        .for_each(|(((p, m), v), g)| {
            for i in 0..g.len() {
                (p[i], m[i], v[i]) = step(p[i], g[i], m[i], v[i]);
            }
        });
    let tensor = |t: FlexTensor| back(Tensor::from_primitive(TensorPrimitive::Float(t)));
    Ok((tensor(p), tensor(m), tensor(v)))
}
