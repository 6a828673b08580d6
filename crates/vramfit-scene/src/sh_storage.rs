//! How the device stores the SH coefficients between steps: f32, or 16-bit
//! floats (f16 or bf16) packed two to a 32-bit word, element `2k` in the
//! low half. The kernels widen each coefficient to f32 as they read it;
//! gradients, Adam's moments and the master copy the update is applied to
//! stay f32.
//!
//! Why the masters stay f32 (and on the host, beside the moments): Adam
//! moves a coefficient by at most about its learning rate a step, 1.25e-4
//! for the SH rest, which is less than half an f16 ulp for any value of
//! 0.5 or more and about half an ulp from 0.25 (half a bf16 ulp from
//! 0.0625): rounded into 16 bits each step, most updates would be lost or
//! doubled. So a 16-bit store is the rounded copy of an
//! f32 master the renderer reads, written after each update.

use serde::{Deserialize, Serialize};

/// The SH coefficients' storage on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShStorage {
    /// 32-bit floats (the reference).
    #[default]
    F32,
    /// IEEE half precision: 10-bit mantissa, range ±65,504.
    F16,
    /// bfloat16: 7-bit mantissa, f32's range.
    Bf16,
}

impl ShStorage {
    /// Bytes a coefficient takes.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    /// The kernels' comptime code for the storage (0 f32, 1 f16, 2 bf16).
    pub fn code(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Bf16 => 2,
        }
    }

    /// 32-bit words holding `values` coefficients.
    pub fn words(self, values: usize) -> usize {
        match self {
            Self::F32 => values,
            Self::F16 | Self::Bf16 => values.div_ceil(2),
        }
    }

    /// `values` in the storage's words, each rounded to nearest (even),
    /// converted in place in the words (half's slice conversion): on x86
    /// with F16C its vector instructions, detected at run time, encode f16
    /// at 1.8-2.5 ns a value against 4.0-5.4 a value at a time (an AMD
    /// EPYC, 27 M values, four runs). With the moments on the host the
    /// SH's f32 masters are encoded every step (270 M values at 6 M
    /// Gaussians, degree 3), so blocks of [`ENCODE_BLOCK`] values are
    /// encoded on all the host's threads ([`ShStorage::encode_on_one_thread`]
    /// is the same on one).
    pub fn encode(self, values: &[f32]) -> Vec<u32> {
        use rayon::prelude::*;
        if self == Self::F32 {
            return values.iter().map(|x| x.to_bits()).collect();
        }
        let mut words = vec![0u32; self.words(values.len())];
        words
            .par_chunks_mut(ENCODE_BLOCK / 2)
            .zip(values.par_chunks(ENCODE_BLOCK))
            .for_each(|(w, v)| self.encode_into(v, w));
        words
    }

    /// [`ShStorage::encode`] on the calling thread alone.
    pub fn encode_on_one_thread(self, values: &[f32]) -> Vec<u32> {
        if self == Self::F32 {
            return values.iter().map(|x| x.to_bits()).collect();
        }
        let mut words = vec![0u32; values.len().div_ceil(2)];
        self.encode_into(values, &mut words);
        words
    }

    /// `values` (16-bit storage) into `words`, `values.len().div_ceil(2)` of them.
    fn encode_into(self, values: &[f32], words: &mut [u32]) {
        use half::slice::HalfFloatSliceExt;
        // Two halves a word, the first in the low bits: a little-endian
        // word's memory order.
        const {
            assert!(
                cfg!(target_endian = "little"),
                "16-bit SH packing assumes little-endian words"
            )
        };
        if self == Self::F16 {
            bytemuck::cast_slice_mut::<u32, half::f16>(words)[..values.len()].convert_from_f32_slice(values);
        } else {
            bytemuck::cast_slice_mut::<u32, half::bf16>(words)[..values.len()].convert_from_f32_slice(values);
        }
    }

    /// Each value as the storage would give it back: what the renderer
    /// reads (the CPU twin of the kernels' widening).
    pub fn round(self, values: &[f32]) -> Vec<f32> {
        match self {
            Self::F32 => values.to_vec(),
            Self::F16 => values.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
            Self::Bf16 => values.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect(),
        }
    }
}

/// Values a thread encodes at a time in [`ShStorage::encode`] (even, so a
/// block fills whole words): 256 KiB of f32, a few tens of microseconds.
pub const ENCODE_BLOCK: usize = 1 << 16;

/// The SH groups' indices among a scene's six parameter groups (means,
/// log-scales, rotations, opacity logits, SH DC, SH rest).
pub const SH_GROUPS: [usize; 2] = [4, 5];

/// Bytes a Gaussian takes in each parameter group of `widths` floats, the
/// SH groups stored as `sh` says.
pub fn group_bytes(widths: [usize; 6], sh: ShStorage) -> [usize; 6] {
    std::array::from_fn(|g| widths[g] * if SH_GROUPS.contains(&g) { sh.bytes() } else { 4 })
}

impl std::str::FromStr for ShStorage {
    type Err = vramfit::settings::UnknownValue;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "bf16" => Ok(Self::Bf16),
            other => Err(vramfit::settings::UnknownValue {
                setting: "sh_storage",
                given: other.into(),
                choices: "f32, f16 (half precision) or bf16 (bfloat16); 16-bit storage needs moments = \"host\" (the \
                          f32 masters live there)",
            }),
        }
    }
}

impl std::fmt::Display for ShStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_pack_two_to_a_word_low_first() {
        let words = ShStorage::F16.encode(&[1.0, -2.0, 0.5]);
        assert_eq!(words, vec![0x3c00 | (0xc000 << 16), 0x3800]);
        let words = ShStorage::Bf16.encode(&[1.0, -2.0]);
        assert_eq!(words, vec![0x3f80 | (0xc000 << 16)]);
        assert_eq!(ShStorage::F32.encode(&[1.5]), vec![1.5f32.to_bits()]);
        assert_eq!(ShStorage::F16.words(45 * 3), 68);
    }

    /// The slice conversion rounds as one value at a time does: ties to
    /// even, subnormals, overflow to infinity, NaN kept NaN.
    #[test]
    fn encoding_a_slice_rounds_each_value_alone() {
        let mut values: Vec<f32> = (0..20_001)
            .map(|i| ((i as f32) * 0.37).sin() * 70_000.0 / (1 + i % 97) as f32)
            .collect();
        values.extend([
            0.0,
            -0.0,
            6e-8,
            -3e-6,
            65_504.0,
            65_520.0,
            1e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        values.extend((0..64).map(|k| 1.0 + k as f32 * 2f32.powi(-11)));
        let alone = |bits: u16, x: f32, storage: ShStorage| {
            let want = match storage {
                ShStorage::F16 => half::f16::from_f32(x).to_bits(),
                _ => half::bf16::from_f32(x).to_bits(),
            };
            if x.is_nan() {
                let back = match storage {
                    ShStorage::F16 => half::f16::from_bits(bits).to_f32(),
                    _ => half::bf16::from_bits(bits).to_f32(),
                };
                assert!(back.is_nan(), "{storage}: NaN");
            } else {
                assert_eq!(bits, want, "{storage}: {x:e}");
            }
        };
        // Past several blocks, ending mid-word, so the threaded encode's
        // seams are checked too.
        values.extend((0..2 * ENCODE_BLOCK).map(|i| (i as f32 * 0.013).cos() * 3.0));
        assert_eq!(values.len() % 2, 1, "an odd count: the last word half filled");
        for storage in [ShStorage::F16, ShStorage::Bf16] {
            let words = storage.encode(&values);
            assert_eq!(
                words,
                storage.encode_on_one_thread(&values),
                "{storage}: threads and one"
            );
            assert_eq!(words.len(), values.len().div_ceil(2));
            for (i, &x) in values.iter().enumerate() {
                alone((words[i / 2] >> (16 * (i % 2))) as u16, x, storage);
            }
        }
    }

    #[test]
    fn an_adam_sized_step_is_lost_in_sixteen_bits() {
        // Why the masters stay f32: 0.3 + 1.25e-4 rounds back to 0.3.
        for storage in [ShStorage::F16, ShStorage::Bf16] {
            let [a, b] = storage.round(&[0.3, 0.3 + 1.25e-4])[..] else {
                unreachable!()
            };
            assert_eq!(a, b, "{storage}");
        }
        let [a, b] = ShStorage::F16.round(&[0.1, 0.1 + 1.25e-4])[..] else {
            unreachable!()
        };
        assert_ne!(a, b);
    }
}
