//! A step's time on a card estimated from its traced kernels: each kernel
//! takes the longer of its products at the card's peak rate and its bytes
//! at the card's memory bandwidth, plus a launch. An estimate, labelled so
//! wherever it is shown: real kernels reach a fraction of either peak.

use serde::{Deserialize, Serialize};

use crate::shapes::OpWork;

/// A card's published peak rates (dense, no sparsity).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// f32 arithmetic, TFLOP/s (not TF32 tensor cores: CubeCL's f32
    /// products do not use them).
    pub f32_tflops: f64,
    /// bf16 (f16 on the T4, which has no bf16) on tensor cores with f32
    /// accumulation, TFLOP/s.
    pub half_tflops: f64,
    /// Memory bandwidth, GB/s.
    pub bandwidth_gbs: f64,
}

/// Bytes a second between host and device (PCIe 4.0 ×16 as measured
/// transfers reach: about 25 GB/s of its 32).
pub const HOST_LINK_GBS: f64 = 25.0;

/// Seconds a kernel launch costs however small the kernel.
pub const LAUNCH_SECONDS: f64 = 5e-6;

/// Published rates by card name (NVIDIA's data sheets; dense figures).
/// The GeForce cards' bf16 rate with f32 accumulation is twice their f32
/// rate (the RTX 4090's published 165.2 against 82.6 TFLOP/s; the RTX
/// 3090's 71 against 35.6): the 4060, 4070 and 4060 Ti are given that.
const RATES: &[(&str, Rates)] = &[
    ("rtx4060", rates(15.11, 30.2, 272.0)),
    ("rtx4070", rates(29.15, 58.3, 504.2)),
    ("rtx4060ti-16", rates(22.06, 44.1, 288.0)),
    ("t4", rates(8.1, 65.0, 320.0)),
    ("a10", rates(31.2, 125.0, 600.0)),
    ("l4", rates(30.3, 121.0, 300.0)),
    ("rtx3090", rates(35.6, 71.0, 936.0)),
    ("rtx4090", rates(82.6, 165.2, 1008.0)),
    ("l40s", rates(91.6, 362.05, 864.0)),
    ("a6000", rates(38.7, 154.8, 768.0)),
    ("a100-40", rates(19.5, 312.0, 1555.0)),
    ("a100-80", rates(19.5, 312.0, 2039.0)),
    ("h100-80", rates(67.0, 989.4, 3350.0)),
    ("h200", rates(67.0, 989.4, 4800.0)),
];

const fn rates(f32_tflops: f64, half_tflops: f64, bandwidth_gbs: f64) -> Rates {
    Rates {
        f32_tflops,
        half_tflops,
        bandwidth_gbs,
    }
}

/// Known cards without bf16 (Turing): their 16-bit plans run in f16.
const NO_BF16: &[&str] = &["t4"];

impl Rates {
    /// Whether the card computes in bf16 (a card given by its size is
    /// taken to).
    pub fn has_bf16(card: &str) -> bool {
        !NO_BF16.contains(&card)
    }

    /// A known card's rates (`None` for a card given by its size).
    pub fn of(card: &str) -> Option<Rates> {
        RATES.iter().find(|(name, _)| *name == card).map(|(_, r)| *r)
    }

    /// The card the rows of cards given by size only are ranked by.
    pub const NOMINAL_CARD: &str = "a100-80";

    /// Estimated milliseconds for the kernels of `work` (one step's).
    pub fn step_ms(&self, work: &[OpWork]) -> f64 {
        let seconds: f64 = work
            .iter()
            .map(|w| {
                let rate = if w.half { self.half_tflops } else { self.f32_tflops };
                let compute = w.flops / (rate * 1e12);
                let memory = w.bytes / (self.bandwidth_gbs * 1e9);
                let host = w.host_bytes / (HOST_LINK_GBS * 1e9);
                let launch = if w.bytes > 0.0 { LAUNCH_SECONDS } else { 0.0 };
                compute.max(memory) + host + launch
            })
            .sum();
        seconds * 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_takes_the_longer_of_its_products_and_its_bytes() {
        let h100 = Rates::of("h100-80").unwrap();
        // 1 TFLOP of bf16 products over 1 MB: compute-bound, about 1.01 ms.
        let products = OpWork {
            flops: 1e12,
            half: true,
            bytes: 1e6,
            host_bytes: 0.0,
        };
        let ms = h100.step_ms(&[products]);
        assert!((ms - (1e3 / 989.4 + 5e-3)).abs() < 1e-9, "{ms}");
        // 3.35 GB moved, no products: a millisecond of bandwidth.
        let copy = OpWork {
            bytes: 3.35e9,
            ..Default::default()
        };
        assert!((h100.step_ms(&[copy]) - (1.0 + 5e-3)).abs() < 1e-9);
        // The same products in f32 take the f32 rate.
        let f32 = OpWork {
            half: false,
            ..products
        };
        assert!(h100.step_ms(&[f32]) > 14.0 * ms);
        assert!(Rates::of("24").is_none());
    }
}
