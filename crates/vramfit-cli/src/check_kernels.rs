//! `vramfit check-kernels`: the GPU kernels of a build with cuda or wgpu
//! against their CPU twins.

use anyhow::{Result, bail};

/// `vramfit check-kernels`: the GPU kernels against their CPU twins on
/// random cases; prints a table, writes JSON to `out`, fails on any case
/// outside tolerance.
pub fn run(device: &str, large: bool, out: Option<std::path::PathBuf>) -> Result<()> {
    match device {
        #[cfg(feature = "cuda")]
        "cuda" => kernel_check::run::<cubecl::cuda::CudaRuntime>(large, out),
        #[cfg(feature = "wgpu")]
        "wgpu" => kernel_check::run::<cubecl::wgpu::WgpuRuntime>(large, out),
        "cpu" => bail!("check-kernels compares GPU kernels with their CPU twins; give --device cuda or wgpu"),
        other => {
            let _ = (large, out);
            Err(crate::device::unavailable(other))
        }
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod kernel_check {
    use anyhow::{Result, anyhow, bail};
    use cubecl::Runtime;
    use vramfit_splat::gpu::check::{large_cases, run_case, standard_cases};

    pub fn run<R: Runtime>(large: bool, out: Option<std::path::PathBuf>) -> Result<()> {
        let client = R::client(&Default::default());
        let mut cases = standard_cases();
        if large {
            cases.extend(large_cases());
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
