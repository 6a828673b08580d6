//! Block-wise quantization of a frozen matrix on the host: 4-bit NormalFloat
//! (NF4, as QLoRA defines it) and 8-bit absmax (int8), both in blocks of
//! [`BLOCK`] consecutive values with one f32 absmax scale a block.
//!
//! NF4's sixteen levels are the quantiles of a standard normal scaled to
//! [−1, 1] with an exact zero (QLoRA, Dettmers et al. 2023, appendix E; the
//! values bitsandbytes ships); a value is stored as the index of the level
//! nearest to `value / absmax`. int8 stores `round(127 · value / absmax)`.
//! Codes are packed into 32-bit words (NF4: eight codes a word, the first in
//! the lowest four bits; int8: four offset bytes, `code + 128`), so a
//! quantized matrix is 4.5 (NF4) or 8.5 (int8) bits a value with its scales.
//! The scales are not quantized again (QLoRA's double quantization would
//! save a further 0.37 bits a value; not done here).

use rayon::prelude::*;

/// Values sharing one scale (QLoRA's block size).
pub const BLOCK: usize = 64;

/// NF4's levels, ascending (QLoRA; bitsandbytes' table).
pub const NF4_LEVELS: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// A quantized storage format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// 4-bit NormalFloat, blocks of 64, f32 absmax scales.
    Nf4,
    /// 8-bit absmax, blocks of 64, f32 absmax scales.
    Int8,
}

impl Format {
    /// Codes in one 32-bit word.
    pub fn per_word(self) -> usize {
        match self {
            Format::Nf4 => 8,
            Format::Int8 => 4,
        }
    }

    /// Bits of one code.
    pub fn bits(self) -> usize {
        32 / self.per_word()
    }

    /// Stored bytes of `values` values: the packed codes and the scales.
    pub fn bytes(self, values: usize) -> u64 {
        (values / self.per_word() * 4 + values / BLOCK * 4) as u64
    }

    /// The value of `code` in a block of absmax `scale`.
    #[inline]
    pub fn level(self, code: u32, scale: f32) -> f32 {
        match self {
            Format::Nf4 => NF4_LEVELS[(code & 15) as usize] * scale,
            Format::Int8 => ((code & 255) as f32 - 128.0) * (scale / 127.0),
        }
    }

    /// The code nearest to `x` in a block of absmax `scale` (> 0).
    #[inline]
    fn code(self, x: f32, scale: f32) -> u32 {
        let n = x / scale;
        match self {
            Format::Nf4 => {
                // The first level whose midpoint with the next is above n.
                let mut code = 0;
                while code < 15 && n > 0.5 * (NF4_LEVELS[code] + NF4_LEVELS[code + 1]) {
                    code += 1;
                }
                code as u32
            }
            Format::Int8 => ((n * 127.0).round().clamp(-127.0, 127.0) + 128.0) as u32,
        }
    }
}

/// Values that cannot be quantized.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// The count is not a whole number of blocks.
    #[error(
        "{count} values are not a whole number of blocks of {BLOCK}: a block-quantized matrix needs a multiple of {BLOCK} values (store this one in 16 bits)"
    )]
    Blocks {
        /// The count.
        count: usize,
    },
    /// A value is NaN or infinite.
    #[error("value {index} is {value}: only finite values can be quantized")]
    NotFinite {
        /// Where.
        index: usize,
        /// What.
        value: f32,
    },
}

/// `values` quantized: the packed codes (one `i32` word per
/// [`Format::per_word`] values) and one scale a block.
pub fn quantize(values: &[f32], format: Format) -> Result<(Vec<i32>, Vec<f32>), QuantError> {
    if !values.len().is_multiple_of(BLOCK) {
        return Err(QuantError::Blocks { count: values.len() });
    }
    if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(QuantError::NotFinite { index, value });
    }
    let blocks = values.len() / BLOCK;
    let words_per_block = BLOCK / format.per_word();
    let mut codes = vec![0i32; blocks * words_per_block];
    let mut scales = vec![0f32; blocks];
    codes
        .par_chunks_mut(words_per_block)
        .zip(scales.par_iter_mut())
        .zip(values.par_chunks(BLOCK))
        .for_each(|((words, scale), block)| {
            let absmax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            // An all-zero block: any scale gives zeros; 1 keeps the codes finite.
            *scale = if absmax > 0.0 { absmax } else { 1.0 };
            for (word, chunk) in words.iter_mut().zip(block.chunks(format.per_word())) {
                let mut w = 0u32;
                for (j, &x) in chunk.iter().enumerate() {
                    w |= format.code(x, *scale) << (format.bits() * j);
                }
                *word = w as i32;
            }
        });
    Ok((codes, scales))
}

/// The values `codes` and `scales` stand for (`codes.len() · per_word`
/// values).
pub fn dequantize(codes: &[i32], scales: &[f32], format: Format) -> Vec<f32> {
    let per_word = format.per_word();
    let words_per_block = BLOCK / per_word;
    let mut out = vec![0f32; codes.len() * per_word];
    out.par_chunks_mut(BLOCK)
        .zip(codes.par_chunks(words_per_block))
        .zip(scales.par_iter())
        .for_each(|((block, words), &scale)| {
            for (values, &word) in block.chunks_mut(per_word).zip(words) {
                for (j, v) in values.iter_mut().enumerate() {
                    *v = format.level((word as u32) >> (format.bits() * j), scale);
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` draws of N(0, 0.02²) (Box–Muller over splitmix64).
    fn normal(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        let mut uniform = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (u, v) = (uniform().max(1e-12), uniform());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32 * 0.02
            })
            .collect()
    }

    #[test]
    fn levels_round_trip_exactly_and_codes_pack_in_order() {
        // A block holding every NF4 level times its absmax comes back exactly.
        let scale = 0.5;
        let block: Vec<f32> = (0..BLOCK).map(|i| NF4_LEVELS[i % 16] * scale).collect();
        let (codes, scales) = quantize(&block, Format::Nf4).unwrap();
        assert_eq!(scales, vec![scale]);
        assert_eq!(codes.len(), BLOCK / 8);
        // The first word holds levels 0..8, the lowest four bits the first.
        assert_eq!(codes[0] as u32, 0x7654_3210);
        assert_eq!(dequantize(&codes, &scales, Format::Nf4), block);
        // int8: within half a step (absmax / 254) of every value, the
        // absmax itself exact.
        let values: Vec<f32> = (0..BLOCK).map(|i| (i as f32 - 32.0) / 50.0).collect();
        let (codes, scales) = quantize(&values, Format::Int8).unwrap();
        assert_eq!(scales, vec![0.64]);
        let back = dequantize(&codes, &scales, Format::Int8);
        assert_eq!(back[0], -0.64);
        for (a, b) in values.iter().zip(&back) {
            assert!((a - b).abs() <= 0.64 / 254.0 * 1.0001, "{a} {b}");
        }
    }

    /// NF4 on normal weights, against the bound bitsandbytes' own test
    /// holds its NF4 to at blocks of 64 (`test_4bit_quant` on standard
    /// normal values: mean |error| below 0.1 σ, mean relative error below
    /// 0.28), and against a uniform 4-bit absmax grid on the same blocks,
    /// which NF4 exists to beat on normal values. Measured here (2026-11-29,
    /// 262,144 values): NF4 0.0726 σ, the uniform grid 0.0912 σ, int8
    /// 0.0050 σ.
    #[test]
    fn nf4_error_on_normal_weights_is_within_bitsandbytes_bound_and_below_a_uniform_grid() {
        let values = normal(BLOCK * 4096, 7);
        let sigma = 0.02f64;
        let errors = |format: Format| {
            let (codes, scales) = quantize(&values, format).unwrap();
            let back = dequantize(&codes, &scales, format);
            let n = values.len() as f64;
            let mae = values.iter().zip(&back).map(|(a, b)| (a - b).abs() as f64).sum::<f64>() / n / sigma;
            let relative = values
                .iter()
                .zip(&back)
                .map(|(a, b)| ((a - b).abs() / (a.abs() + 1e-8 * sigma as f32)) as f64)
                .sum::<f64>()
                / n;
            (mae, relative)
        };
        // A uniform 4-bit absmax grid (15 levels over [-1, 1]) on the same blocks.
        let uniform = values
            .chunks(BLOCK)
            .flat_map(|b| {
                let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                b.iter()
                    .map(move |v| (v - (v / m * 7.0).round() / 7.0 * m).abs() as f64)
            })
            .sum::<f64>()
            / values.len() as f64
            / sigma;
        let ((nf4, nf4_relative), (int8, _)) = (errors(Format::Nf4), errors(Format::Int8));
        eprintln!(
            "mean |error| / σ: nf4 {nf4:.4} (relative {nf4_relative:.3}), uniform 4-bit {uniform:.4}, int8 {int8:.5}"
        );
        assert!(
            nf4 < 0.1 && nf4_relative < 0.28,
            "NF4: {nf4} σ, relative {nf4_relative}"
        );
        assert!(nf4 < uniform, "NF4 {nf4} against a uniform grid {uniform}");
        assert!(int8 < nf4 / 8.0, "int8 {int8} against NF4 {nf4}");
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let e = quantize(&[0.0; 65], Format::Nf4).unwrap_err();
        assert!(
            e.to_string()
                .contains("65 values are not a whole number of blocks of 64"),
            "{e}"
        );
        let mut v = vec![0.0; 64];
        v[3] = f32::NAN;
        let e = quantize(&v, Format::Int8).unwrap_err();
        assert!(e.to_string().contains("value 3 is NaN"), "{e}");
        // An all-zero block stays zero.
        let (codes, scales) = quantize(&[0.0; 64], Format::Nf4).unwrap();
        assert!(dequantize(&codes, &scales, Format::Nf4).iter().all(|v| *v == 0.0));
    }
}
