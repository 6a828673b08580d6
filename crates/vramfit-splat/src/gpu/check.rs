//! The GPU kernels against their CPU twins on random cases: forward
//! maximum error, loss parts, gradients' relative error, no NaN/Inf. Run by
//! the wgpu test here and by `vramfit check-kernels` on the GPU machine.

use cubecl::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use vramfit_gauss::gpu::{DeviceError, max_relative_error};

use super::engine::Lean;
use crate::cpu::project::Frame;
use crate::cpu::render::Splats;
use crate::op::HostTarget;
use crate::params::{HostParams, Param};
use vramfit_gauss::picture::CHANNELS;

/// One random problem.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Case {
    /// Image width.
    pub width: usize,
    /// Image height.
    pub height: usize,
    /// Gaussians.
    pub gaussians: usize,
    /// Band rows (0: automatic).
    pub band_rows: usize,
    /// Top-K.
    pub top_k: usize,
    /// Seed of the parameters and target.
    pub seed: u64,
}

/// How the GPU path compared with the CPU twins on one case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// The case.
    pub case: Case,
    /// Band rows the engine used.
    pub band_rows_used: usize,
    /// Largest |GPU − CPU| of the render.
    pub forward_max_abs: f64,
    /// Render values differing by more than 1e-4.
    pub forward_values_over_1e4: usize,
    /// |GPU − CPU| / |CPU| of the loss.
    pub loss_rel: f64,
    /// |GPU − CPU| of the SSIM, L1 and MSE means.
    pub parts_abs: [f64; 3],
    /// max |GPU − CPU| / max |CPU| per gradient tensor (xy, inv_scale, theta, color).
    pub grad_rel: [f64; 4],
    /// Clamped-metrics PSNR, GPU and CPU.
    pub metrics_psnr: [f64; 2],
    /// True when any GPU output was NaN or infinite.
    pub non_finite: bool,
}

impl CaseReport {
    /// True when the GPU agrees with the CPU within the check's tolerances.
    pub fn passes(&self) -> bool {
        !self.non_finite
            && self.forward_max_abs < 1e-3
            && self.loss_rel < 1e-4
            && self.parts_abs.iter().all(|d| *d < 1e-4)
            && self.grad_rel.iter().all(|r| *r < 1e-3)
            && (self.metrics_psnr[0] - self.metrics_psnr[1]).abs() < 1e-3
    }
}

/// A case blending the top 10 Gaussians per pixel.
fn case(width: usize, height: usize, gaussians: usize, band_rows: usize, seed: u64) -> Case {
    Case {
        width,
        height,
        gaussians,
        band_rows,
        top_k: 10,
        seed,
    }
}

/// Image-sized cases (`check-kernels --large`): odd sizes, many bands, and
/// 2048² with 10,000 Gaussians in one band.
pub fn large_cases() -> Vec<Case> {
    vec![
        case(1000, 700, 3000, 64, 11),
        case(1921, 1081, 5000, 200, 13),
        case(2048, 2048, 10_000, 0, 12),
    ]
}

/// The cases the check runs: sizes that are and are not tile multiples,
/// one band and many (bands of 16 and 32 rows exercise the halo).
pub fn standard_cases() -> Vec<Case> {
    let c = case;
    vec![
        c(16, 16, 8, 0, 1),
        c(40, 24, 30, 0, 2),
        c(100, 75, 120, 16, 3),
        c(100, 75, 120, 0, 3),
        c(257, 130, 400, 32, 4),
        c(64, 200, 300, 48, 5),
        Case {
            top_k: 3,
            ..c(90, 61, 200, 16, 6)
        },
    ]
}

/// Random Gaussians (rotated, anisotropic, overlapping, some partly off
/// the image) and a random u8 target, from `seed`.
pub fn random_problem(case: &Case) -> (HostParams, Vec<u8>) {
    let mut rng = ChaCha8Rng::seed_from_u64(case.seed);
    let mut g = HostParams::default();
    for _ in 0..case.gaussians {
        g.xy.push(rng.random_range(-0.05..1.05f32));
        g.xy.push(rng.random_range(-0.05..1.05f32));
        g.inv_scale.push(rng.random_range(0.08..0.6f32));
        g.inv_scale.push(rng.random_range(0.08..0.6f32));
        g.theta.push(rng.random_range(-3.0..3.0f32));
        for _ in 0..CHANNELS {
            g.color.push(rng.random_range(0.0..1.0f32));
        }
    }
    let target = (0..case.width * case.height * CHANNELS)
        .map(|_| rng.random_range(0..=255u8))
        .collect();
    (g, target)
}

/// Runs one case on `client` and compares with the CPU twins.
pub fn run_case<R: Runtime>(client: &ComputeClient<R>, case: &Case) -> Result<CaseReport, DeviceError> {
    let (host_params, target) = random_problem(case);
    let (w, h) = (case.width, case.height);
    let lean = Lean::new(client.clone(), &target, w, h, CHANNELS, case.top_k, case.band_rows);
    let params = lean.upload(&host_params);
    let splats = Splats::new(&host_params, CHANNELS);
    let host_target = HostTarget::new(target.iter().map(|&b| b as f32 / 255.0).collect(), w, h, case.top_k);
    let frame = Frame::new(w, h);

    let gpu_render = lean.render_host(&params, &frame)?;
    let cpu_render = crate::cpu::render::render(&splats, &frame, case.top_k);
    let diffs: Vec<f64> = gpu_render
        .iter()
        .zip(&cpu_render)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .collect();

    let ssim_weight = 0.1;
    let (gpu_parts, g) = lean.loss_and_grads(&params, ssim_weight as f32)?;
    let (cpu_parts, cg) = host_target.loss_and_grads(&splats, ssim_weight);
    let gpu_grads = g.handles.try_map(|hd| lean.download(&hd))?;

    let gpu_metrics = lean.metrics(&params)?;
    let mut clamped = cpu_render.clone();
    clamped.iter_mut().for_each(|v| *v = v.clamp(0.0, 1.0));
    let cpu_metrics = host_target.parts(&clamped);

    let non_finite = gpu_render
        .iter()
        .chain(gpu_grads.as_ref().into_array().into_iter().flatten())
        .any(|v| !v.is_finite())
        || !gpu_parts.loss(ssim_weight).is_finite();
    Ok(CaseReport {
        case: *case,
        band_rows_used: lean.band_rows(),
        forward_max_abs: diffs.iter().copied().fold(0.0, f64::max),
        forward_values_over_1e4: diffs.iter().filter(|d| **d > 1e-4).count(),
        loss_rel: (gpu_parts.loss(ssim_weight) - cpu_parts.loss(ssim_weight)).abs()
            / cpu_parts.loss(ssim_weight).abs().max(1e-30),
        parts_abs: [
            (gpu_parts.ssim - cpu_parts.ssim).abs(),
            (gpu_parts.l1 - cpu_parts.l1).abs(),
            (gpu_parts.mse - cpu_parts.mse).abs(),
        ],
        grad_rel: Param::ALL.map(|q| max_relative_error(&gpu_grads[q], &cg[q])),
        metrics_psnr: [gpu_metrics.psnr_db(), cpu_metrics.psnr_db()],
        non_finite,
    })
}
