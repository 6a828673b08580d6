//! One Adam(W) update of flat f32 values, in f32 whatever the stored
//! types: on the CPU backend one pass over the four vectors, elsewhere
//! Burn's operations, on the host's cores for moments kept there; all
//! three round the same operations in the same order.

use burn::prelude::*;

use super::flex_pass::{Vectors, flex_pass};

/// One step's scalars of the update, in the order it applies them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Coefficients {
    pub(super) beta1: f64,
    pub(super) beta2: f64,
    pub(super) epsilon: f64,
    /// `1 − β2ᵗ`.
    pub(super) bias2: f64,
    /// `1 − lr·weight_decay` when there is weight decay.
    pub(super) decay: Option<f64>,
    /// `lr / (1 − β1ᵗ)`.
    pub(super) step_size: f64,
}

/// `(p, m, v)` after one Adam(W) update of flat f32 tensors:
/// `m ← β1·m + (1−β1)·g`, `v ← β2·v + (1−β2)·g²`,
/// `p ← p·decay − step_size · m / (√(v / bias2) + ε)`.
/// On the CPU backend (Flex) it is one pass over the four vectors, in
/// place where they are not shared; elsewhere Burn's operations
/// ([`update_reference`]). Both round the same f32 operations in the same
/// order, so they agree bit for bit.
pub(super) fn update<B: Backend>(
    p: Tensor<B, 1>,
    g: Tensor<B, 1>,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    k: &Coefficients,
) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    match update_flex((p, g, m, v), k) {
        Ok(updated) => updated,
        Err((p, g, m, v)) => update_reference(p, g, m, v, k),
    }
}

/// The update as Burn operations (a pass over the whole tensor each).
fn update_reference<B: Backend>(
    p: Tensor<B, 1>,
    g: Tensor<B, 1>,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    k: &Coefficients,
) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    let m = m.mul_scalar(k.beta1) + g.clone().mul_scalar(1.0 - k.beta1);
    let v = v.mul_scalar(k.beta2) + g.clone().mul(g).mul_scalar(1.0 - k.beta2);
    let denom = v.clone().div_scalar(k.bias2).sqrt().add_scalar(k.epsilon);
    let p = match k.decay {
        Some(decay) => p.mul_scalar(decay),
        None => p,
    };
    let p = p - m.clone().div(denom).mul_scalar(k.step_size);
    (p, m, v)
}

/// The f32 update of one element: what the CPU pass runs, on Flex
/// ([`update_flex`]) and on the host ([`adam_f32`]). Scalars are rounded
/// to f32 as Flex's scalar operations round them.
fn element_step(k: &Coefficients) -> impl Fn(f32, f32, f32, f32) -> (f32, f32, f32) + Sync + use<> {
    let f = |x: f64| x as f32;
    let (b1, c1, b2, c2) = (f(k.beta1), f(1.0 - k.beta1), f(k.beta2), f(1.0 - k.beta2));
    let (bias2, eps, decay, step) = (f(k.bias2), f(k.epsilon), k.decay.map(f), f(k.step_size));
    move |p, g, m, v| {
        let m = m * b1 + g * c1;
        let v = v * b2 + (g * g) * c2;
        let denom = (v / bias2).sqrt() + eps;
        let p = match decay {
            Some(d) => p * d,
            None => p,
        };
        (p - (m / denom) * step, m, v)
    }
}

/// The update on host vectors, threaded.
pub(super) fn adam_f32(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], k: &Coefficients) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 14;
    assert!(
        g.len() == p.len() && m.len() == p.len() && v.len() == p.len(),
        "Adam: parameter, gradient and moments of different lengths"
    );
    let step = element_step(k);
    p.par_chunks_mut(CHUNK)
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK))
        .for_each(|(((p, m), v), g)| {
            for i in 0..g.len() {
                (p[i], m[i], v[i]) = step(p[i], g[i], m[i], v[i]);
            }
        });
}

/// The update on Flex: f32 vectors in one pass (the 14 passes of the
/// reference each read and write the whole parameter set, 13 MB per pass
/// for the transformer at PyTorch's shape). Scalars are rounded to f32 as
/// Flex's scalar operations round them.
#[allow(clippy::type_complexity)]
fn update_flex<B: Backend>(
    vectors: Vectors<B>,
    k: &Coefficients,
) -> Result<(Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>), Vectors<B>> {
    flex_pass(vectors, element_step(k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::Distribution;

    fn bits(t: &Tensor<Flex, 1>) -> Vec<u32> {
        t.to_data()
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    }

    /// The one-pass CPU update and Burn's operations agree bit for bit,
    /// step after step, with and without weight decay, on a buffer shared
    /// with another tensor (copied, not written through) and on a view.
    #[test]
    fn cpu_update_equals_burns_operations_bit_for_bit() {
        let device = Default::default();
        let n = 70_001; // several rayon chunks and a ragged last one
        let p0 = Tensor::<Flex, 1>::random([n], Distribution::Normal(0.0, 1.0), &device);
        let zeros = Tensor::<Flex, 1>::zeros([n], &device);
        for decay in [None, Some(1.0 - 1e-3 * 0.1)] {
            let (mut fast, mut slow) = (
                (p0.clone(), zeros.clone(), zeros.clone()),
                (p0.clone(), zeros.clone(), zeros.clone()),
            );
            for t in 1..=4 {
                let g = Tensor::<Flex, 1>::random([n], Distribution::Normal(0.0, 0.5), &device);
                let k = Coefficients {
                    beta1: 0.9,
                    beta2: 0.999,
                    epsilon: 1e-8,
                    bias2: 1.0 - 0.999f64.powi(t),
                    decay,
                    step_size: 1e-3 / (1.0 - 0.9f64.powi(t)),
                };
                let kept = fast.0.clone(); // shares the parameter's buffer
                let before = bits(&kept);
                fast = update_flex((fast.0, g.clone(), fast.1, fast.2), &k).expect("f32 on Flex");
                slow = update_reference(slow.0, g, slow.1, slow.2, &k);
                assert_eq!(bits(&fast.0), bits(&slow.0), "parameters, step {t}, decay {decay:?}");
                assert_eq!(bits(&fast.1), bits(&slow.1), "first moments, step {t}");
                assert_eq!(bits(&fast.2), bits(&slow.2), "second moments, step {t}");
                assert_ne!(before, bits(&fast.0), "the update changed the parameters");
                assert_eq!(before, bits(&kept), "a shared buffer is not written through");
            }
        }
        // Views (an offset into a buffer, a buffer longer than the tensor)
        // are copied out first; the gradient may be a view too.
        let k = Coefficients {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            bias2: 1e-3,
            decay: Some(0.99),
            step_size: 1e-2,
        };
        let long = Tensor::<Flex, 1>::random([n + 3], Distribution::Normal(0.0, 1.0), &device);
        for (start, what) in [(2, "an offset view"), (0, "a view of a longer buffer")] {
            let view = || long.clone().narrow(0, start, n);
            let is_view = view().into_primitive().tensor().bytes().len() != 4 * n;
            assert!(is_view, "{what}: the case is a view");
            let before = bits(&long);
            let fast = update_flex((view(), view(), view(), view().abs()), &k).expect("f32 on Flex");
            let slow = update_reference(view(), view(), view(), view().abs(), &k);
            for (a, b, part) in [
                (&fast.0, &slow.0, "p"),
                (&fast.1, &slow.1, "m"),
                (&fast.2, &slow.2, "v"),
            ] {
                assert_eq!(bits(a), bits(b), "{what}: {part}");
            }
            assert_eq!(before, bits(&long), "{what}: the viewed buffer is not written through");
        }
    }
}
