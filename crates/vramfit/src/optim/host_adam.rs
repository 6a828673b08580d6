//! Adam on the host, for optimizer state kept out of device memory
//! (`--moments host`): a parameter group's gradient comes down, the update
//! runs here on the host's cores, the parameters go back. The arithmetic
//! is written in the same order as the device kernels' so the two agree to
//! the last bit where the device rounds each operation (tested against the
//! scene's CubeCL Adam).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Where Adam's moments live between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Moments {
    /// In device memory, updated by the device.
    #[default]
    Device,
    /// In host memory, updated by [`HostAdam`]; the gradients come down and
    /// the parameters go back each step.
    Host,
}

impl std::str::FromStr for Moments {
    type Err = crate::settings::UnknownValue;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "device" => Ok(Self::Device),
            "host" => Ok(Self::Host),
            other => Err(crate::settings::UnknownValue {
                setting: "moments",
                given: other.into(),
                choices: "device (Adam's state in device memory) or host (in host memory, updated by the CPU)",
            }),
        }
    }
}

impl std::fmt::Display for Moments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Device => "device",
            Self::Host => "host",
        })
    }
}

/// Values per thread task: large enough that scheduling costs nothing,
/// small enough to spread a group of a million values over every core.
const CHUNK: usize = 1 << 15;

/// Adam's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostAdam {
    /// First moment's decay.
    pub beta1: f32,
    /// Second moment's decay.
    pub beta2: f32,
    /// Added to the root of the second moment.
    pub eps: f32,
}

impl HostAdam {
    /// One step on `p` with gradient `g` and moments `m`, `v` (all the same
    /// length), learning rate `lr`, bias corrections `c1 = 1 − β₁ᵗ`,
    /// `c2 = 1 − β₂ᵗ`:
    /// `m ← β₁m + (1 − β₁)g`, `v ← β₂v + (1 − β₂)g²`,
    /// `p ← p − lr (m / c1) / (√(v / c2) + ε)`.
    #[allow(clippy::too_many_arguments)]
    pub fn step(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], lr: f32, c1: f32, c2: f32) {
        assert!(
            g.len() == p.len() && m.len() == p.len() && v.len() == p.len(),
            "Adam's parameter, gradient and moments differ in length"
        );
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        p.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .for_each(|(((p, g), m), v)| {
                for i in 0..p.len() {
                    let mm = b1 * m[i] + (1.0 - b1) * g[i];
                    let vv = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                    m[i] = mm;
                    v[i] = vv;
                    p[i] -= lr * (mm / c1) / ((vv / c2).sqrt() + eps);
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The threaded update equals a plain serial loop bit for bit (the
    /// split into tasks changes no arithmetic), over several chunks.
    #[test]
    fn threaded_update_equals_the_serial_one() {
        let n = 3 * CHUNK + 17;
        let adam = HostAdam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        let g: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let mut p: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.11).cos()).collect();
        let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
        let (mut p2, mut m2, mut v2) = (p.clone(), m.clone(), v.clone());
        for t in 1..=3 {
            let (c1, c2) = (1.0 - 0.9f32.powi(t), 1.0 - 0.999f32.powi(t));
            adam.step(&mut p, &g, &mut m, &mut v, 1e-2, c1, c2);
            for i in 0..n {
                m2[i] = 0.9 * m2[i] + (1.0 - 0.9) * g[i];
                v2[i] = 0.999 * v2[i] + (1.0 - 0.999) * g[i] * g[i];
                p2[i] -= 1e-2 * (m2[i] / c1) / ((v2[i] / c2).sqrt() + 1e-8);
            }
        }
        assert!(p.iter().zip(&p2).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(m.iter().zip(&m2).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(v.iter().zip(&v2).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(p.iter().zip(&p2).any(|(a, _)| *a != 0.0));
    }
}
