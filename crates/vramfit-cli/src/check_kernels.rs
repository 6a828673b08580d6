//! `vramfit check-kernels`: the GPU kernels of a build with cuda or wgpu
//! against their CPU twins.

use anyhow::{Result, bail};

/// `vramfit check-kernels`: the GPU kernels against their CPU twins on
/// random cases; prints a table, writes JSON to `out`, fails on any case
/// outside tolerance.
pub fn run(device: &str, large: bool, out: Option<std::path::PathBuf>) -> Result<()> {
    match device {
        #[cfg(feature = "cuda")]
        "cuda" => kernel_check::run::<cubecl::cuda::CudaRuntime, vramfit::backends::Cuda>(large, out),
        #[cfg(feature = "wgpu")]
        "wgpu" => kernel_check::run::<cubecl::wgpu::WgpuRuntime, vramfit::backends::Wgpu>(large, out),
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
    use burn::tensor::backend::AutodiffBackend;
    use cubecl::Runtime;
    use vramfit::attention_check as attention;
    use vramfit_scene::gpu::check as scene;
    use vramfit_splat::gpu::check as image;

    /// `R` runs the image fit's and the scene's kernels, `B` (Burn on the
    /// same runtime, with autodiff) the transformer's fused attention.
    pub fn run<R: Runtime, B: AutodiffBackend>(large: bool, out: Option<std::path::PathBuf>) -> Result<()> {
        let client = R::client(&Default::default());
        let mut cases = image::standard_cases();
        let mut scene_cases = scene::standard_cases();
        let mut attention_cases = attention::standard_cases();
        if large {
            cases.extend(image::large_cases());
            scene_cases.extend(scene::large_cases());
            attention_cases.extend(attention::large_cases());
        }
        println!("The image fit's kernels (2D Gaussians):\n");
        println!(
            "| size | Gaussians | band rows | forward max abs | loss rel | grad rel (xy, inv_scale, theta, color) | pass |"
        );
        println!("|---|---|---|---|---|---|---|");
        let mut reports = Vec::new();
        for c in &cases {
            let r = image::run_case(&client, c).map_err(|e| anyhow!("device failure: {e}"))?;
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
        println!("\nThe scene renderer's kernels (3D Gaussians, SH):\n");
        println!(
            "| size | Gaussians | SH degree | intersections (GPU, CPU) | forward max abs | values off by > 1e-4 | grad rel (means, log_scales, rotations, opacity, sh_dc, sh_rest, screen) | pass |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        let mut scene_reports = Vec::new();
        for c in &scene_cases {
            let r = scene::run_case::<R>(&Default::default(), c).map_err(|e| anyhow!("device failure: {e}"))?;
            let grads: Vec<String> = r.grad_rel.iter().map(|g| format!("{g:.1e}")).collect();
            println!(
                "| {}×{} | {} | {} | {}, {} | {:.1e} | {} | {} | {} |",
                c.width,
                c.height,
                c.gaussians,
                c.degree,
                r.intersections[0],
                r.intersections[1],
                r.forward_max_abs,
                r.forward_values_over_1e4,
                grads.join(", "),
                if r.passes() { "yes" } else { "NO" }
            );
            scene_reports.push(r);
        }
        println!("\nThe scene's loss on the device (L1 + SSIM and its image gradient, against the host's):\n");
        println!("| size | rows a band | target | loss gap | gradient gap | pass |");
        println!("|---|---|---|---|---|---|");
        let mut loss_reports = Vec::new();
        for c in &scene_cases {
            for (rows, eight_bit) in [(Some(16), true), (None, false)] {
                let r = scene::loss_gaps::<R>(&Default::default(), c, rows, eight_bit)
                    .map_err(|e| anyhow!("device failure: {e}"))?;
                println!(
                    "| {}×{} | {} | {} | {:.1e} | {:.1e} | {} |",
                    c.width,
                    c.height,
                    r.band_rows,
                    if eight_bit { "8-bit" } else { "f32" },
                    r.loss_gap,
                    r.gradient_gap,
                    if r.passes() { "yes" } else { "NO" }
                );
                loss_reports.push(r);
            }
        }
        println!(
            "\nThe fused attention's kernels (against the CPU's fused attention and the standard attention here):\n"
        );
        println!(
            "| batch × heads | queries × keys | head widths (q/k, v) | causal | inputs | to the CPU (out, dq, dk, dv) | to the standard (out, dq, dk, dv) | pass |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        let mut attention_reports = Vec::new();
        let (runs, lacks): (Vec<&attention::Case>, Vec<_>) = attention_cases.iter().partition(|c| c.runs_on::<B>());
        if !lacks.is_empty() {
            let mut types: Vec<&str> = lacks.iter().map(|c| c.inputs.name()).collect();
            types.sort();
            types.dedup();
            println!(
                "(not run: {} cases in {}, which this device lacks)",
                lacks.len(),
                types.join(", ")
            );
        }
        for c in runs {
            let r = attention::run_case::<B>(c);
            let gaps = |g: &[f32; 4]| g.iter().map(|x| format!("{x:.1e}")).collect::<Vec<_>>().join(", ");
            println!(
                "| {} × {} | {} × {} | {}, {} | {} | {} | {} | {} | {} |",
                c.batch,
                c.heads,
                c.queries,
                c.keys,
                c.head_width,
                c.value_width,
                if c.causal { "yes" } else { "no" },
                c.inputs.name(),
                gaps(&r.to_cpu),
                gaps(&r.to_standard),
                if r.passes() { "yes" } else { "NO" }
            );
            attention_reports.push(r);
        }
        if let Some(path) = out {
            let json = serde_json::json!({
                "image": reports,
                "scene": scene_reports,
                "scene_loss": loss_reports,
                "attention": attention_reports
            });
            vramfit::run::atomic_write(&path, serde_json::to_string_pretty(&json)?.as_bytes())?;
        }
        let total = reports.len() + scene_reports.len() + loss_reports.len() + attention_reports.len();
        let failed = reports.iter().filter(|r| !r.passes()).count()
            + scene_reports.iter().filter(|r| !r.passes()).count()
            + loss_reports.iter().filter(|r| !r.passes()).count()
            + attention_reports.iter().filter(|r| !r.passes()).count();
        if failed > 0 {
            bail!("{failed} of {total} cases outside tolerance");
        }
        println!("\nall {total} cases within tolerance");
        Ok(())
    }
}
