//! The scene renderer's kernels against the CPU twin on random scenes:
//! the image, every parameter group's gradient and the screen means'
//! gradient, in f32 on both sides (with the SH stored in 16 bits, the CPU
//! twin renders the same rounded coefficients); and the kernels' 16-bit
//! decoder against the host's for every bit pattern; and the loss on the
//! device against the host's. Run by the wgpu test in CI and by `vramfit
//! check-kernels` on the GPU machine.

use cubecl::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use vramfit_gauss::gpu::{DeviceError, max_relative_error};

use super::engine::Renderer;
use crate::cpu::camera::Camera;
use crate::cpu::render::{Scene, render, render_backward};
use crate::cpu::sh::coefficients;
use crate::sh_storage::ShStorage;

/// One random problem.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Case {
    /// Image width.
    pub width: usize,
    /// Image height.
    pub height: usize,
    /// Gaussians.
    pub gaussians: usize,
    /// SH degree.
    pub degree: usize,
    /// Seed of the scene and of the image gradient.
    pub seed: u64,
    /// How the device stores the SH coefficients.
    pub sh: ShStorage,
}

/// How the GPU compared with the CPU twin on one case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// The case.
    pub case: Case,
    /// Tile intersections on the GPU and on the CPU.
    pub intersections: [usize; 2],
    /// Largest |GPU − CPU| of the image.
    pub forward_max_abs: f64,
    /// Image values differing by more than 1e-4.
    pub forward_values_over_1e4: usize,
    /// max |GPU − CPU| / max |CPU| per group (means, log_scales, rotations,
    /// opacity_logits, sh_dc, sh_rest), then the screen means.
    pub grad_rel: [f64; 7],
    /// True when any GPU output was NaN or infinite.
    pub non_finite: bool,
}

impl CaseReport {
    /// True when the GPU agrees with the CPU within the check's tolerances.
    ///
    /// Both sides compute in f32, but `exp` and the order of additions
    /// differ between devices by an ulp or so, which can flip one of the
    /// renderer's discrete decisions at a pixel (an α crossing 1/255, the
    /// transmittance crossing 10⁻⁴, a radius crossing a tile edge). Where no
    /// image value differs by more than 1e-4, no flip happened and every
    /// gradient must agree to 1e-4 of its group's largest; where some did,
    /// at most one value in 1,000 may, by at most 0.02 (one α of 1/255 on a
    /// colour of up to about 4), and the gradients to 1e-2.
    pub fn passes(&self) -> bool {
        let [gpu, cpu] = self.intersections;
        let values = 3 * self.case.width * self.case.height;
        let flips = self.forward_values_over_1e4;
        let grad_tolerance = if flips == 0 { 1e-4 } else { 1e-2 };
        !self.non_finite
            && gpu.abs_diff(cpu) <= cpu / 1000
            && flips <= 3 + values / 1000
            && self.forward_max_abs < 0.02
            && self.grad_rel.iter().all(|r| *r < grad_tolerance)
    }
}

/// The cases the check runs: every SH degree, sizes that are and are not
/// tile multiples, a few Gaussians to a few thousand (long tile lists, so
/// the depth sort runs many stages), and the SH stored in f16 and bf16.
pub fn standard_cases() -> Vec<Case> {
    let c = |width, height, gaussians, degree, seed, sh| Case {
        width,
        height,
        gaussians,
        degree,
        seed,
        sh,
    };
    vec![
        c(16, 16, 6, 0, 1, ShStorage::F32),
        c(40, 28, 30, 1, 2, ShStorage::F32),
        c(61, 47, 200, 2, 3, ShStorage::F32),
        c(64, 48, 400, 3, 4, ShStorage::F32),
        c(97, 80, 2000, 3, 5, ShStorage::F32),
        c(63, 45, 401, 3, 6, ShStorage::F16),
        c(40, 28, 31, 2, 7, ShStorage::Bf16),
    ]
}

/// Image-sized cases (`check-kernels --large`).
pub fn large_cases() -> Vec<Case> {
    vec![
        Case {
            width: 640,
            height: 480,
            gaussians: 20_000,
            degree: 3,
            seed: 11,
            sh: ShStorage::F32,
        },
        Case {
            width: 1297,
            height: 731,
            gaussians: 100_000,
            degree: 3,
            seed: 12,
            sh: ShStorage::F32,
        },
    ]
}

/// The camera of every case: looking at the origin from about 4 units.
pub fn case_camera(case: &Case) -> Camera {
    Camera::look_at(
        [0.3, -4.0, 1.0],
        [0.0; 3],
        [0.0, 0.0, 1.0],
        case.width,
        case.height,
        0.9,
    )
}

/// A random scene around the origin (overlapping, rotated, anisotropic;
/// some Gaussians behind the camera, some over the image's edges) as the
/// six groups in [`Scene`]'s order.
pub fn random_scene(case: &Case) -> [Vec<f32>; 6] {
    let mut rng = ChaCha8Rng::seed_from_u64(case.seed);
    let n = case.gaussians;
    let rest = 3 * (coefficients(case.degree) - 1);
    let mut means: Vec<f32> = (0..3 * n).map(|_| rng.random_range(-1.6..1.6)).collect();
    // Behind the camera (it sits at y = −4 looking along +y), every 50th.
    for i in (0..n).step_by(50) {
        means[3 * i + 1] = -6.0;
    }
    // Smaller Gaussians in larger scenes keep the tile lists in proportion.
    let shrink = (n as f32 / 30.0).max(1.0).log10() * 0.5;
    let log_scales = (0..3 * n).map(|_| rng.random_range(-2.6..-1.4) - shrink).collect();
    let rotations = (0..4 * n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let opacity = (0..n).map(|_| rng.random_range(-2.0..4.0)).collect();
    let dc = (0..3 * n).map(|_| rng.random_range(-1.0..1.5)).collect();
    let sh_rest = (0..rest * n).map(|_| rng.random_range(-0.4..0.4)).collect();
    [means, log_scales, rotations, opacity, dc, sh_rest]
}

/// The groups as a [`Scene`].
pub fn scene<'a>(p: &'a [Vec<f32>; 6], degree: usize) -> Scene<'a, f32> {
    Scene {
        means: &p[0],
        log_scales: &p[1],
        rotations: &p[2],
        opacity_logits: &p[3],
        sh_dc: &p[4],
        sh_rest: &p[5],
        degree,
    }
}

/// Runs one case on `device` and compares with the CPU twin.
pub fn run_case<R: Runtime>(device: &R::Device, case: &Case) -> Result<CaseReport, DeviceError> {
    let params = random_scene(case);
    let s = scene(&params, case.degree);
    // The CPU twin renders what the device stores.
    let mut stored = params.clone();
    for g in crate::sh_storage::SH_GROUPS {
        stored[g] = case.sh.round(&params[g]);
    }
    let s_stored = scene(&stored, case.degree);
    let camera = case_camera(case);
    let background = [0.2, 0.1, 0.3];
    let mut rng = ChaCha8Rng::seed_from_u64(case.seed ^ 0x5eed);
    let d_image: Vec<f32> = (0..3 * case.width * case.height)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();

    let cpu = render(&s_stored, &camera, background);
    let cpu_grads = render_backward(&s_stored, &camera, background, &cpu, &d_image);

    let renderer = Renderer::<R>::new(device);
    let buffers = renderer.upload_as(&s, case.sh);
    let drawn = renderer.render(&buffers, &camera, background)?;
    let intersections = drawn.intersections;
    drop(drawn);
    let (image, grads) = renderer.render_and_backward_as(&s, case.sh, &camera, background, &d_image)?;

    let cpu_groups = cpu_grads.groups();
    let gpu_groups = grads.groups();
    let mut grad_rel = [0.0; 7];
    for g in 0..6 {
        grad_rel[g] = max_relative_error(gpu_groups[g], cpu_groups[g]);
    }
    grad_rel[6] = max_relative_error(&grads.screen_means, &cpu_grads.screen_means);
    let diffs: Vec<f64> = image
        .iter()
        .zip(&cpu.image)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .collect();
    let non_finite = image
        .iter()
        .chain(gpu_groups.iter().flat_map(|g| g.iter()))
        .any(|v| !v.is_finite());
    Ok(CaseReport {
        case: *case,
        intersections: [intersections, cpu.bins.intersections()],
        forward_max_abs: diffs.iter().copied().fold(0.0, f64::max),
        forward_values_over_1e4: diffs.iter().filter(|d| **d > 1e-4).count(),
        grad_rel,
        non_finite,
    })
}

/// The loss on the device ([`Renderer::loss`], in bands of `band_rows`,
/// or of its own choosing when `None`)
/// against the host's ([`crate::fit::loss_and_gradient`]) for `case`'s
/// render: the loss's relative gap and the image gradient's largest gap
/// over its largest value. The target is 8-bit (as an image file's) when
/// `eight_bit`, else any f32 in `[0, 1]`.
pub fn loss_gaps<R: Runtime>(
    device: &R::Device,
    case: &Case,
    band_rows: Option<usize>,
    eight_bit: bool,
) -> Result<LossReport, DeviceError> {
    let params = random_scene(case);
    let s = scene(&params, case.degree);
    let camera = case_camera(case);
    let mut rng = ChaCha8Rng::seed_from_u64(case.seed ^ 0x1055);
    let target: Vec<f32> = (0..3 * case.width * case.height)
        .map(|_| {
            let v = rng.random_range(0.0f32..1.0);
            if eight_bit { (v * 255.0).round() / 255.0 } else { v }
        })
        .collect();
    let renderer = Renderer::<R>::new(device);
    let buffers = renderer.upload_as(&s, case.sh);
    let drawn = renderer.render(&buffers, &camera, [0.2, 0.1, 0.3])?;
    let image = renderer.download(&drawn.image, target.len())?;
    let on_device = match band_rows {
        Some(rows) => renderer.loss_in_bands(&drawn, &target, rows)?,
        None => renderer.loss(&drawn, &target)?,
    };
    let d_image = renderer.download(&on_device.d_image, target.len())?;
    let (loss, d_host) = crate::fit::loss_and_gradient(&image, &target, case.width, case.height);
    Ok(LossReport {
        width: case.width,
        height: case.height,
        band_rows: band_rows.unwrap_or_else(|| super::loss::band_rows(case.width, case.height)),
        eight_bit,
        loss_gap: ((on_device.loss - loss).abs() / loss.abs().max(1e-12)) as f64,
        gradient_gap: max_relative_error(&d_image, &d_host),
    })
}

/// The loss on the device against the host's ([`loss_gaps`]).
#[derive(Debug, Clone, Serialize)]
pub struct LossReport {
    /// Image width.
    pub width: usize,
    /// Image height.
    pub height: usize,
    /// Rows a band.
    pub band_rows: usize,
    /// The target held as bytes.
    pub eight_bit: bool,
    /// |device − host| / |host| of the loss.
    pub loss_gap: f64,
    /// max |device − host| / max |host| of the image gradient.
    pub gradient_gap: f64,
}

impl LossReport {
    /// Both sums run in f32 in different orders (the device's per cube,
    /// the host's per band of the CPU's SSIM): measured about 1e-6 on
    /// lavapipe, so 1e-5 for the loss and 1e-4 for the gradient.
    pub fn passes(&self) -> bool {
        self.loss_gap <= 1e-5 && self.gradient_gap <= 1e-4
    }
}

/// Bit patterns of 16-bit storage that the device widened differently from
/// the host (`half`'s conversion), for f16 and for bf16: every one of the
/// 65,536 patterns each (NaNs compared as NaN).
pub fn widening_mismatches<R: Runtime>(device: &R::Device) -> Result<[usize; 2], DeviceError> {
    let renderer = Renderer::<R>::new(device);
    let words: Vec<u32> = (0..1u32 << 15).map(|k| (2 * k) | ((2 * k + 1) << 16)).collect();
    let buffer = renderer.upload_words(&words);
    let mut out = [0; 2];
    for (slot, (storage, host)) in [
        (
            ShStorage::F16,
            (|b: u16| half::f16::from_bits(b).to_f32()) as fn(u16) -> f32,
        ),
        (ShStorage::Bf16, |b: u16| half::bf16::from_bits(b).to_f32()),
    ]
    .into_iter()
    .enumerate()
    {
        let device_values = renderer.widen(&buffer, 1 << 16, storage)?;
        out[slot] = device_values
            .iter()
            .enumerate()
            .filter(|&(bits, v)| {
                let h = host(bits as u16);
                !(v.to_bits() == h.to_bits() || v.is_nan() && h.is_nan())
            })
            .count();
    }
    Ok(out)
}

/// How the device's Adam kernel compared with the host's ([`crate::fit::ADAM`],
/// what `--moments host` runs) over a few steps from the same values.
#[derive(Debug, Clone, Serialize)]
pub struct AdamReport {
    /// Values updated.
    pub values: usize,
    /// Steps taken.
    pub steps: usize,
    /// Largest distance between the two results in units in the last
    /// place (parameters and both moments, after the last step).
    pub max_ulps: u32,
    /// Values whose parameter differs at all.
    pub differing: usize,
}

impl AdamReport {
    /// True when the two agree to the last ulp.
    pub fn passes(&self) -> bool {
        self.max_ulps <= 1
    }
}

/// Distance of two finite floats in units in the last place.
fn ulps(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let bits = x.to_bits() as i64;
        if bits & (1 << 31) != 0 {
            -(bits & 0x7fff_ffff)
        } else {
            bits
        }
    };
    (key(a) - key(b)).unsigned_abs().min(u32::MAX as u64) as u32
}

/// Runs `steps` Adam steps of `values` random parameters on the device and
/// on the host, a fresh random gradient each step (spanning 1e-8 to 10, and
/// exact zeros), and compares parameters and moments.
pub fn check_adam<R: Runtime>(device: &R::Device, values: usize, steps: usize) -> Result<AdamReport, DeviceError> {
    use super::kernels::train::adam;
    use crate::fit::ADAM;
    use vramfit_gauss::gpu::{dim, grid};

    let renderer = Renderer::<R>::new(device);
    let mut rng = ChaCha8Rng::seed_from_u64(27);
    let mut p: Vec<f32> = (0..values).map(|_| rng.random_range(-3.0..3.0)).collect();
    let (mut m, mut v) = (vec![0.0f32; values], vec![0.0f32; values]);
    let (dp, dm, dv) = (
        renderer.upload_f32(&p),
        renderer.upload_f32(&m),
        renderer.upload_f32(&v),
    );
    for t in 1..=steps as i32 {
        let g: Vec<f32> = (0..values)
            .map(|i| {
                if i % 97 == 0 {
                    0.0
                } else {
                    let scale = 10f32.powf(rng.random_range(-8.0..1.0));
                    scale * rng.random_range(-1.0..1.0)
                }
            })
            .collect();
        let lr = 1e-3 * t as f32;
        let (c1, c2) = (1.0 - ADAM.beta1.powi(t), 1.0 - ADAM.beta2.powi(t));
        let dg = renderer.upload_f32(&g);
        adam::launch::<R>(
            &renderer.client,
            grid(values),
            dim(),
            vramfit_gauss::gpu::array(&dp, values),
            vramfit_gauss::gpu::array(&dg, values),
            vramfit_gauss::gpu::array(&dm, values),
            vramfit_gauss::gpu::array(&dv, values),
            lr,
            c1,
            c2,
            values as u32,
            0,
            0,
        );
        ADAM.step(&mut p, &g, &mut m, &mut v, lr, c1, c2);
    }
    let (gp, gm, gv) = (
        renderer.download(&dp, values)?,
        renderer.download(&dm, values)?,
        renderer.download(&dv, values)?,
    );
    let max_ulps = [(&gp, &p), (&gm, &m), (&gv, &v)]
        .iter()
        .flat_map(|(a, b)| a.iter().zip(b.iter()).map(|(x, y)| ulps(*x, *y)))
        .max()
        .unwrap_or(0);
    Ok(AdamReport {
        values,
        steps,
        max_ulps,
        differing: gp.iter().zip(&p).filter(|(a, b)| a.to_bits() != b.to_bits()).count(),
    })
}
