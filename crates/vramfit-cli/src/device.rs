//! Picks the backend for `--device` and runs a job on it.

use std::ops::ControlFlow;

use anyhow::{Result, bail};
use burn::backend::{Autodiff, Flex};
use vramfit_splat::job::{Event, Job, Summary};

/// Runs `job` on the named device.
pub fn fit(device: &str, mut job: Job, observe: impl FnMut(Event) -> ControlFlow<()>) -> Result<Option<Summary>> {
    match device {
        "cpu" => {
            job.device_name = format!("cpu (burn Flex, {} threads)", rayon_threads());
            Ok(job.run::<Autodiff<Flex>>(&Default::default(), observe)?)
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            job.device_name = "cuda:0 (burn Cuda; CubeCL splat kernels, banded)".into();
            Ok(job.run::<Autodiff<burn::backend::Cuda>>(&Default::default(), observe)?)
        }
        #[cfg(not(feature = "cuda"))]
        "cuda" => bail!("this vramfit was built without CUDA; rebuild with `cargo build --release --features cuda`"),
        other => bail!("unknown --device '{other}'; use cpu or cuda"),
    }
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Runs a transformer training job on the named device.
pub fn train(
    device: &str,
    mut job: vramfit_models::job::TrainJob,
    observe: impl FnMut(vramfit_models::job::Event) -> ControlFlow<()>,
) -> Result<Option<vramfit_models::job::TrainSummary>> {
    match device {
        "cpu" => {
            job.device_name = format!("cpu (burn Flex, {} threads)", rayon_threads());
            Ok(job.run::<Autodiff<Flex>>(&Default::default(), observe)?)
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            job.device_name = "cuda:0 (burn Cuda)".into();
            Ok(job.run::<Autodiff<burn::backend::Cuda>>(&Default::default(), observe)?)
        }
        #[cfg(not(feature = "cuda"))]
        "cuda" => bail!("this vramfit was built without CUDA; rebuild with `cargo build --release --features cuda`"),
        other => bail!("unknown --device '{other}'; use cpu or cuda"),
    }
}

/// `vramfit check-kernels`: the GPU kernels against their CPU twins on
/// random cases; prints a table, writes JSON to `out`, fails on any case
/// outside tolerance.
pub fn check_kernels(device: &str, large: bool, out: Option<std::path::PathBuf>) -> Result<()> {
    match device {
        #[cfg(feature = "cuda")]
        "cuda" => cuda_check::run(large, out),
        #[cfg(not(feature = "cuda"))]
        "cuda" => {
            let _ = (large, out);
            bail!("this vramfit was built without CUDA; rebuild with `cargo build --release --features cuda`")
        }
        other => bail!(
            "check-kernels runs on cuda (got --device '{other}'); without a GPU, `cargo test -p vramfit-splat --features wgpu --test gpu_twin` runs the same check on a software Vulkan device"
        ),
    }
}

#[cfg(feature = "cuda")]
mod cuda_check {
    use anyhow::{Result, anyhow, bail};
    use cubecl::Runtime;
    use vramfit_splat::gpu::check::{Case, run_case, standard_cases};

    pub fn run(large: bool, out: Option<std::path::PathBuf>) -> Result<()> {
        let client = cubecl::cuda::CudaRuntime::client(&Default::default());
        let mut cases = standard_cases();
        if large {
            let case = |width, height, gaussians, band_rows, seed| Case {
                width,
                height,
                gaussians,
                band_rows,
                top_k: 10,
                seed,
            };
            cases.extend([
                case(1000, 700, 3000, 64, 11),
                case(1921, 1081, 5000, 200, 13),
                case(2048, 2048, 10_000, 0, 12),
            ]);
        }
        println!(
            "| size | Gaussians | band rows | forward max abs | loss rel | grad rel (xy, inv_scale, theta, color) | pass |"
        );
        println!("|---|---|---|---|---|---|---|");
        let mut reports = Vec::new();
        for c in &cases {
            let r = run_case(&client, c).map_err(|e| anyhow!("device failure: {e}"))?;
            println!(
                "| {}×{} | {} | {} | {:.1e} | {:.1e} | {:.1e}, {:.1e}, {:.1e}, {:.1e} | {} |",
                c.width,
                c.height,
                c.gaussians,
                r.band_rows_used,
                r.forward_max_abs,
                r.loss_rel,
                r.grad_rel[0],
                r.grad_rel[1],
                r.grad_rel[2],
                r.grad_rel[3],
                if r.passes() { "yes" } else { "NO" }
            );
            reports.push(r);
        }
        if let Some(path) = out {
            vramfit::run::atomic_write(&path, serde_json::to_string_pretty(&reports)?.as_bytes())?;
        }
        let failed = reports.iter().filter(|r| !r.passes()).count();
        if failed > 0 {
            bail!("{failed} of {} cases outside tolerance", reports.len());
        }
        println!("all {} cases within tolerance", reports.len());
        Ok(())
    }
}
