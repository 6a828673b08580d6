//! The exact (erf) GELU as one autodiff operation, with branch-free erf and exp.

#[allow(unused_imports)]
use super::*;

/// `x·Φ(x)`, the exact (erf) GELU.
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match on_cpu(x) {
        Ok(x) => back(gelu_cpu(x)),
        Err(x) => burn::tensor::activation::gelu(x),
    }
}

/// erf on f32 as `x·P(x²)/Q(x²)` on `|x| ≤ 4` (erf is 1 in f32 beyond):
/// a rational least-squares fit made for vramfit (max error 2e-8 in
/// exact arithmetic, 5e-7 evaluated in f32; tested against libm below).
/// Branch-free, so loops over it vectorise.
#[inline(always)]
// P[0] is fitted (1.1283790), not 2/√π (1.1283792) spelt approximately.
#[allow(clippy::approx_constant)]
pub(super) fn erf_fast(x: f32) -> f32 {
    const P: [f32; 6] = [
        1.128_379,
        0.196_220_82,
        0.053_462_9,
        0.004_002_139,
        0.000_287_957_3,
        1.974_44e-6,
    ];
    const Q: [f32; 6] = [
        1.0,
        0.507_227_36,
        0.116_463_98,
        0.015_441_535,
        0.001_215_894_9,
        3.747_228_7e-5,
    ];
    let x = x.clamp(-4.0, 4.0);
    let z = x * x;
    let p = P.iter().rev().fold(0.0f32, |acc, c| acc * z + c);
    let q = Q.iter().rev().fold(0.0f32, |acc, c| acc * z + c);
    x * p / q
}

/// `e^y` for `y ≤ 0` (`y` below −87 gives about 1e-38): `2^k · e^r` with
/// `|r| ≤ ln2/2` and a degree-6 Taylor polynomial (relative error 2e-7).
/// Branch-free, so loops over it vectorise.
#[inline(always)]
pub(super) fn exp_nonpositive(y: f32) -> f32 {
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let y = y.max(-87.0);
    let k = (y * std::f32::consts::LOG2_E + ROUND) - ROUND;
    // ln 2 in two parts (the first exact in few bits), so that k·ln2 is exact.
    let r = (y - k * 0.693_359_4) + k * 2.121_944_4e-4;
    let e = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    e * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

pub(super) fn gelu_forward(x: &FlexTensor) -> FlexTensor {
    let shape = x.layout().shape().clone();
    let x = values(x);
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(1 << 14)
        .zip(x.par_chunks(1 << 14))
        .for_each(|(yc, xc)| {
            for (o, v) in yc.iter_mut().zip(xc) {
                *o = 0.5 * v * (1.0 + erf_fast(v * std::f32::consts::FRAC_1_SQRT_2));
            }
        });
    flex(y, shape)
}

/// `dx = dy · (Φ(x) + x·φ(x))`.
pub(super) fn gelu_backward(x: &FlexTensor, dy: &FlexTensor) -> FlexTensor {
    let shape = x.layout().shape().clone();
    let (x, dy) = (values(x), values(dy));
    let inv_sqrt_2pi = 0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(1 << 14)
        .zip(x.par_chunks(1 << 14).zip(dy.par_chunks(1 << 14)))
        .for_each(|(dc, (xc, gc))| {
            for ((o, v), g) in dc.iter_mut().zip(xc).zip(gc) {
                let cdf = 0.5 * (1.0 + erf_fast(v * std::f32::consts::FRAC_1_SQRT_2));
                let pdf = inv_sqrt_2pi * exp_nonpositive(-0.5 * v * v);
                *o = g * (cdf + v * pdf);
            }
        });
    flex(dx, shape)
}

pub(super) fn gelu_cpu<const D: usize>(x: Tensor<Cpu, D>) -> Tensor<Cpu, D> {
    #[derive(Debug)]
    struct Gelu;

    impl Backward<Flex, 1> for Gelu {
        type State = FlexTensor;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let dy = grads.consume::<Flex>(&ops.node);
            if let Some(node) = &ops.parents[0] {
                grads.register::<Flex>(node.id, gelu_backward(&ops.state, &dy));
            }
        }
    }

    let x = x.into_primitive().tensor();
    let out = match Gelu
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = gelu_forward(&x.primitive);
            prep.finish(x.primitive, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(gelu_forward(&x.primitive)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
