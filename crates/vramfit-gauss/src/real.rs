//! The float type of the CPU twins (f32 in production, f64 for finite
//! differences), its fast `exp(−s)` for blending weights, and a way to run
//! a loop compiled for AVX2 with the same results.

use num_traits::Float;

/// Float type the CPU kernels run in (f32 in production, f64 in tests).
pub trait Real: Float + Send + Sync + Default + std::iter::Sum + std::fmt::Debug + 'static {
    /// Converts an f64 constant.
    fn c(v: f64) -> Self;

    /// `exp(−s)` of each of `s` (≥ 0; +∞, an empty slot's, gives 0): a
    /// selection's weights.
    fn exp_neg(s: &[Self; EXP_LANES]) -> [Self; EXP_LANES] {
        s.map(|v| (-v).exp())
    }
}

/// Runs `f` compiled for AVX2 where the CPU has it (eight f32 lanes; the
/// default x86-64 target has four), else as it is. The same operations in
/// the same order either way (no FMA): the same results, bit for bit.
/// `f` must be inlined into it (`#[inline(always)]` on the closure) to be
/// compiled for AVX2.
#[inline(always)]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { avx2(f) };
    }
    f()
}

/// Weights computed together by [`Real::exp_neg`].
pub const EXP_LANES: usize = 16;

impl Real for f32 {
    fn c(v: f64) -> Self {
        v as f32
    }

    /// Within 2 ulp of `exp` (tested on 320,000 points over the range and
    /// its ends; worst seen 1 ulp), in a fixed-width loop the compiler
    /// vectorises: libm's `expf`, called once per weight, was 7 % of a fit
    /// step.
    #[inline(always)]
    fn exp_neg(s: &[f32; EXP_LANES]) -> [f32; EXP_LANES] {
        // A plain loop: `array::map` was not vectorised.
        let mut out = [0.0; EXP_LANES];
        for (o, v) in out.iter_mut().zip(s) {
            *o = exp_neg_f32(*v);
        }
        out
    }
}

/// `exp(−s)` for `s ≥ 0` (+∞ included: 0), branch-free: −s = n·ln 2 + r with
/// |r| ≤ ln 2 / 2, e^r from Cephes' `expf` polynomial (its coefficients and
/// two-part ln 2), and 2^n applied as two exponent-bit halves so that
/// results below the normal range round as subnormals, once.
#[inline(always)]
fn exp_neg_f32(s: f32) -> f32 {
    debug_assert!(s >= 0.0, "exp_neg of a negative or NaN σ: {s}");
    // e^−104 is below half the smallest subnormal: the result rounds to 0.
    let x = (-s).max(-104.0);
    // Adding 1.5·2^23 rounds to an integer (|x·log2 e| < 2^22), which is
    // then in the low bits of `big`: no float-to-int conversion.
    const ROUND: f32 = 12_582_912.0;
    let big = x * std::f32::consts::LOG2_E + ROUND;
    let n = big - ROUND;
    let r = (x - n * 0.693_359_4) - n * -2.121_944_4e-4;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5)
        * (r * r)
        + r
        + 1.0;
    let n = big.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let half = n >> 1;
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    p * pow2(half) * pow2(n - half)
}

impl Real for f64 {
    fn c(v: f64) -> Self {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 weights are within 2 ulp of the correctly rounded exp(−s)
    /// over the whole range, subnormal results and 0 included.
    #[test]
    fn f32_weights_are_within_two_ulp_of_exp() {
        let mut s: Vec<f32> = (0..320_000).map(|i| i as f32 * 3.3e-4).collect();
        s.extend([
            0.0,
            f32::MIN_POSITIVE,
            1e-30,
            0.5,
            std::f32::consts::LN_2,
            1.0,
            80.0,
            87.3,
            87.4,
            95.0,
            103.0,
        ]);
        s.extend([103.9, 104.0, 200.0, 1e30, 3.4e38]);
        s.resize(s.len().next_multiple_of(EXP_LANES), 7.0);
        let mut worst = 0;
        for lanes in s.chunks_exact(EXP_LANES) {
            let got = f32::exp_neg(lanes.try_into().unwrap());
            for (v, g) in lanes.iter().zip(got) {
                let want = (-(*v as f64)).exp() as f32;
                let ulps = g.to_bits().abs_diff(want.to_bits());
                assert!(ulps <= 2, "exp(−{v}): {g} against {want}, {ulps} ulp");
                worst = worst.max(ulps);
            }
        }
        assert_eq!(f32::exp_neg(&[0.0; EXP_LANES]), [1.0; EXP_LANES]);
        assert_eq!(f32::exp_neg(&[104.0; EXP_LANES]), [0.0; EXP_LANES]);
        assert_eq!(f32::exp_neg(&[f32::INFINITY; EXP_LANES]), [0.0; EXP_LANES]);
        assert_eq!(f64::exp_neg(&[f64::INFINITY; EXP_LANES]), [0.0; EXP_LANES]);
        eprintln!("worst {worst} ulp");
    }
}
