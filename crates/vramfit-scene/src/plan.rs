//! What a scene fit may be planned with ([`variants`]): Adam's moments on
//! the device or the host (the same arithmetic), then the SH stored in f16
//! on the device (f32 masters on the host: the numerics change a little,
//! so it ranks after the exact variants), at the run's SH degree; at lower
//! degrees only when the user allows their quality cost, the largest
//! measured on the built-in scenes ([`MEASURED_QUALITY`]). The probes and
//! the pipeline are on the GPU path (`crate::gpu::plan`).

use vramfit::optim::Moments;
use vramfit::plan::Variant;

use crate::cpu::render::group_widths;
use crate::sh_storage::{ShStorage, group_bytes};

/// Held-out PSNR (dB) of a built-in scene fitted at SH degree 0, 1, 2, 3,
/// and how it was measured.
#[derive(Debug, Clone, Copy)]
pub struct DegreeQuality {
    /// The scene (`vramfit scene NAME`).
    pub scene: &'static str,
    /// The command, the machine and the date.
    pub measured: &'static str,
    /// Held-out PSNR at degree 0, 1, 2, 3.
    pub psnr_db: [f64; 4],
}

/// What a lower SH degree was measured to cost, on each built-in scene
/// (docs/results/scene.md). A cost is the largest any of them shows; measured on
/// these scenes only.
pub const MEASURED_QUALITY: [DegreeQuality; 2] = [
    DegreeQuality {
        scene: "builtin",
        measured: "vramfit scene --device cuda --steps 3000 --sh-degree D, one NVIDIA H200, 2026-11-26; degrees 0 and 3 \
                   the mean of two runs (bench-results/gpu-h200/scene-sheen/)",
        psnr_db: [23.255, 23.28, 23.53, 23.74],
    },
    DegreeQuality {
        scene: "builtin:glossy",
        measured: "vramfit scene builtin:glossy --steps 3000 --sh-degree D on the CPU twin (one run each: the CPU fit \
                   repeats to the bit), 2026-11-27 (bench-results/scene-quality.*)",
        psnr_db: [23.678, 24.000, 24.171, 24.399],
    },
];

/// The held-out PSNR lost by fitting at degree `to` instead of `from`: the
/// largest of the losses measured on the built-in scenes
/// ([`MEASURED_QUALITY`]; never below 0).
pub fn quality_cost_db(from: usize, to: usize) -> f64 {
    MEASURED_QUALITY
        .iter()
        .map(|m| m.psnr_db[from.min(3)] - m.psnr_db[to.min(3)])
        .fold(0.0, f64::max)
}

/// One variant's storage: where the moments are, how the SH is stored,
/// and the SH degree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Storage {
    /// Where Adam's moments live.
    pub moments: Moments,
    /// How the device stores the SH coefficients.
    pub sh: ShStorage,
    /// The SH degree fitted.
    pub degree: usize,
}

/// The variants for a fit at SH `degree`, on a device whose largest buffer
/// is `largest` bytes: moments on the device, then on the host, at
/// `degree`; then, where `allow_loss_db` allows the measured cost, at each
/// lower degree. Without `allow_loss_db` no variant changes the model.
pub fn variants(degree: usize, allow_loss_db: Option<f64>, largest: u64) -> Vec<(Variant, Storage)> {
    let mut out = Vec::new();
    for d in (0..=degree).rev() {
        let cost = quality_cost_db(degree, d);
        if d < degree && allow_loss_db.is_none_or(|allowed| cost > allowed) {
            continue;
        }
        for (moments, sh) in [
            (Moments::Device, ShStorage::F32),
            (Moments::Host, ShStorage::F32),
            (Moments::Host, ShStorage::F16),
        ] {
            // The largest buffer is the widest group's (or the render's 11
            // floats a Gaussian).
            let widest = group_bytes(group_widths(d), sh).into_iter().max().unwrap_or(4).max(44);
            let limit = (largest / widest as u64).min(usize::MAX as u64) as usize;
            let mut name = format!("moments {moments}");
            let mut quality = Vec::new();
            if sh != ShStorage::F32 {
                name.push_str(&format!(", SH {sh}"));
                quality.push(format!(
                    "SH stored in {sh} on the device (rounded copies of f32 masters kept on the host): the \
                     rendered colours change slightly; no loss measured on either built-in scene (f16's held-out \
                     PSNR at or above f32's on both, within two runs' spread)"
                ));
            }
            if d < degree {
                name.push_str(&format!(", SH degree {d}"));
                quality.push(format!(
                    "SH degree {d} instead of {degree}: {cost:.2} dB lower held-out PSNR, the larger of the losses \
                     measured on the two built-in scenes (not guaranteed elsewhere)"
                ));
            }
            out.push((Variant { name, quality, limit }, Storage { moments, sh, degree: d }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_variant_changes_the_model_without_leave() {
        let v = variants(3, None, u64::MAX);
        assert_eq!(v.len(), 3);
        assert!(v.iter().all(|(_, s)| s.degree == 3));
        assert!(
            v[..2]
                .iter()
                .all(|(v, s)| v.quality.is_empty() && s.sh == ShStorage::F32)
        );
        assert_eq!(v[1].1.moments, Moments::Host);
        // f16 SH is offered (it changes numerics, not the model) and says so.
        assert_eq!((v[2].1.moments, v[2].1.sh), (Moments::Host, ShStorage::F16));
        assert!(v[2].0.quality[0].contains("f16"), "{:?}", v[2].0);
    }

    #[test]
    fn a_lower_degree_only_within_the_quality_allowed() {
        // Degree 2 costs 0.23 dB (measured on builtin:glossy), degree 1
        // 0.46 (on builtin).
        let v = variants(3, Some(0.3), u64::MAX);
        let degrees: Vec<usize> = v.iter().map(|(_, s)| s.degree).collect();
        assert_eq!(degrees, vec![3, 3, 3, 2, 2, 2]);
        assert!(v[3].0.quality[0].contains("0.23 dB lower"), "{:?}", v[3].0);
        assert!(
            v.iter()
                .all(|(v, s)| v.quality.is_empty() == (s.degree == 3 && s.sh == ShStorage::F32))
        );
        let all = variants(3, Some(1.0), u64::MAX);
        assert_eq!(all.len(), 12);
        assert!(variants(3, Some(0.0), u64::MAX).iter().all(|(_, s)| s.degree == 3));
    }

    #[test]
    fn a_degree_costs_the_most_any_scene_measured() {
        let [spheres, glossy] = MEASURED_QUALITY.map(|m| m.psnr_db);
        // Degree 0: 0.72 dB on the glossy scene, 0.49 on the other.
        assert_eq!(quality_cost_db(3, 0), glossy[3] - glossy[0]);
        assert!(quality_cost_db(3, 0) > spheres[3] - spheres[0]);
        // Degree 1: the other way round.
        assert_eq!(quality_cost_db(3, 1), spheres[3] - spheres[1]);
        assert_eq!(quality_cost_db(0, 3), 0.0, "a higher degree costs nothing");
    }

    #[test]
    fn the_device_limit_is_the_widest_groups() {
        // wgpu's 128 MiB: sh_rest at degree 3 (45 floats) holds 745,654.
        let v = variants(3, None, 128 << 20);
        assert_eq!(v[0].0.limit, 745_654);
        // In f16 the SH rest takes 90 bytes a Gaussian.
        assert_eq!(v[2].0.limit, (128usize << 20) / 90);
        // At degree 0 the render's 11 floats a Gaussian are the widest.
        let v = variants(0, None, 128 << 20);
        assert_eq!(v[0].0.limit, (128usize << 20) / 44);
    }
}
