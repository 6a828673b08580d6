//! f32 ↔ bf16 casts on the CPU as one pass of bit operations.
//!
//! Flex casts between float types through f64 (each value widened to f64,
//! collected, then narrowed): under `--precision bf16` every block casts
//! its input to bf16 and its norms and residual back to f32, forward and
//! again backward, and those casts were 8 % of TinyLlama's LoRA step
//! (perf, 2026-11-29). Here bf16 → f32 is a 16-bit shift and f32 → bf16
//! rounds to nearest, ties to even, as `half` does (NaN stays NaN,
//! overflow goes to infinity); loops over both vectorise.

#[allow(unused_imports)]
use super::*;
use burn::tensor::{FloatDType, bf16};

/// `x` cast to `dtype`. On the CPU backend (with autodiff or without)
/// between f32 and bf16, one pass here (its backward casts the gradient
/// back the same way); any other pair of types, and other backends,
/// Burn's cast.
pub fn cast<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: FloatDType) -> Tensor<B, D> {
    let pair = matches!(
        (x.dtype(), dtype),
        (DType::F32, FloatDType::BF16) | (DType::BF16, FloatDType::F32)
    );
    if !pair || is_as_on_a_device() {
        return x.cast(dtype);
    }
    let x = match downcast::<Tensor<B, D>, Tensor<Cpu, D>>(x) {
        Ok(x) => return back(cast_cpu(x, dtype)),
        Err(x) => x,
    };
    match downcast::<Tensor<B, D>, Tensor<Flex, D>>(x) {
        Ok(x) => back(Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(converted(
            &x.into_primitive().tensor(),
        )))),
        Err(x) => x.cast(dtype),
    }
}

/// An f32 tensor as bf16, a bf16 one as f32, row major.
fn converted(x: &FlexTensor) -> FlexTensor {
    let shape = x.layout().shape().clone();
    match x.dtype() {
        DType::F32 => flex(narrowed(&f32::row_major(x)), shape),
        DType::BF16 => flex(widened(&bf16::row_major(x)), shape),
        other => unreachable!("cast between f32 and bf16, not {other:?}"),
    }
}

/// Values a task converts: enough to amortise it.
const CHUNK: usize = 1 << 15;

fn widened(x: &[bf16]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(o, i)| {
        for (o, i) in o.iter_mut().zip(i) {
            *o = f32::from_bits((i.to_bits() as u32) << 16);
        }
    });
    out
}

fn narrowed(x: &[f32]) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; x.len()];
    out.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(o, i)| {
        for (o, &i) in o.iter_mut().zip(i) {
            *o = to_bf16(i);
        }
    });
    out
}

/// `x` rounded to bf16 (to nearest, ties to even), branch free: adding
/// `0x7fff` plus the kept part's lowest bit carries into it exactly when
/// the dropped half is above a half unit, or equal with the kept part odd.
#[inline(always)]
fn to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    // A NaN keeps its sign and top payload bits, made quiet.
    let nan = ((b >> 16) as u16) | 0x40;
    bf16::from_bits(if x.is_nan() { nan } else { rounded })
}

fn cast_cpu<const D: usize>(x: Tensor<Cpu, D>, _dtype: FloatDType) -> Tensor<Cpu, D> {
    #[derive(Debug)]
    struct Cast;

    impl Backward<Flex, 1> for Cast {
        type State = ();

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let g = grads.consume::<Flex>(&ops.node);
            if let Some(node) = &ops.parents[0] {
                // The output's gradient, in the output's type, back in the input's.
                grads.register::<Flex>(node.id, converted(&g));
            }
        }
    }

    let x = x.into_primitive().tensor();
    let y = converted(&x.primitive);
    let out = match Cast
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rounding is `half`'s on every class of value: ties either way,
    /// just above and below a tie, subnormals, the largest finite values
    /// (rounding to infinity), infinities and NaNs of both signs.
    #[test]
    fn rounding_is_halfs() {
        let mut values = vec![
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            -1e-42,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fc0_1234),
        ];
        for base in [0x3f80_0000u32, 0x3f81_0000, 0x4780_0000, 0x0080_0000, 0x7f7f_0000] {
            for low in [0x7fffu32, 0x8000, 0x8001, 0x0001, 0xffff] {
                values.push(f32::from_bits(base | low));
                values.push(-f32::from_bits(base | low));
            }
        }
        let mut state = 0x1234_5678u32;
        for _ in 0..100_000 {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            values.push(f32::from_bits(state));
        }
        for x in values {
            let (ours, halfs) = (to_bf16(x), bf16::from_f32(x));
            assert_eq!(ours.to_bits(), halfs.to_bits(), "{x:e} ({:#x})", x.to_bits());
            assert_eq!(
                f32::from_bits((ours.to_bits() as u32) << 16).to_bits(),
                ours.to_f32().to_bits()
            );
        }
    }

    /// Value and gradient through the autodiff cast, both ways, on a
    /// transposed view: each value `half`'s rounding of the input's, each
    /// gradient `half`'s rounding of the output's gradient (the bf16
    /// tensor's gradient is bf16).
    #[test]
    fn the_cast_and_its_gradient_round_as_half_does() {
        let _graph = crate::grads::graph_lock(); // other tests differentiate in parallel
        let d = Default::default();
        let x = Tensor::<Cpu, 2>::random([70, 33], burn::tensor::Distribution::Normal(0.0, 3.0), &d).require_grad();
        let up = Tensor::<Cpu, 2>::random([33, 70], burn::tensor::Distribution::Normal(0.0, 1.0), &d);
        let f32s = |t: Tensor<Cpu, 2>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
        let rounded = |v: Vec<f32>| v.into_iter().map(|v| bf16::from_f32(v).to_f32()).collect::<Vec<_>>();
        let down = cast(x.clone().transpose(), FloatDType::BF16);
        assert_eq!(down.dtype(), DType::BF16);
        let ours = cast(down, FloatDType::F32);
        assert_eq!(ours.dtype(), DType::F32);
        same(f32s(ours.clone()), rounded(f32s(x.clone().transpose())), "values");
        let g = (ours * up.clone()).sum().backward();
        let grad = f32s(Tensor::from_inner(x.grad(&g).unwrap()));
        same(grad, rounded(f32s(up.transpose())), "gradients");
    }

    /// Bit for bit, naming the first difference.
    fn same(ours: Vec<f32>, burns: Vec<f32>, what: &str) {
        assert_eq!(ours.len(), burns.len(), "{what}: lengths");
        if let Some(i) = (0..ours.len()).find(|&i| ours[i].to_bits() != burns[i].to_bits()) {
            panic!(
                "{what}: value {i} of {}: {} against Burn's {}",
                ours.len(),
                ours[i],
                burns[i]
            );
        }
    }
}
