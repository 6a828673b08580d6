//! Burn glue: the fused loss of [`crate::op::FusedLoss`] on a CubeCL
//! backend runs [`Lean`] directly on the tensors' device buffers.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::Runtime;

use super::engine::{Lean, ParamBuffers};
#[cfg(any(feature = "cuda", feature = "wgpu"))]
use crate::cpu::project::Frame;
use crate::op::LossParts;
#[cfg(feature = "wgpu")]
use crate::op::SplatBackend;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
use crate::op::{FusedLoss, SplatPrimitives};
use crate::params::Params;
use vramfit_gauss::DeviceError;
use vramfit_gauss::picture::{CHANNELS, Picture};

/// Device buffers of the parameter tensors (made contiguous if needed),
/// and one of the tensors to make new ones like.
fn buffers<R: CubeRuntime>(params: Params<CubeTensor<R>>) -> (ParamBuffers, CubeTensor<R>) {
    let params = params.map(|t| {
        if t.is_contiguous_buffer() {
            t
        } else {
            into_contiguous(t)
        }
    });
    let buffers = ParamBuffers {
        handles: params.as_ref().map(|t| t.handle.clone()),
        n: params.theta.meta.shape()[0],
    };
    (buffers, params.theta)
}

fn tensor<R: CubeRuntime>(
    like: &CubeTensor<R>,
    handle: cubecl::server::Handle,
    rows: usize,
    cols: usize,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        Shape::new([rows, cols]),
        handle,
        DType::F32,
    )
}

/// The fused loss on CubeCL tensors; the backends' impls delegate here
/// (one concrete impl per backend keeps Burn's associated types resolved).
pub struct CubeFused<R: CubeRuntime>(std::marker::PhantomData<R>);

impl<R: CubeRuntime> CubeFused<R> {
    /// See [`FusedLoss::fused_target`].
    pub fn target(picture: &Picture, top_k: usize, band_rows: usize, device: &<R as Runtime>::Device) -> Lean<R> {
        // Pictures come from 8-bit images, so this is exact.
        let bytes: Vec<u8> = picture.data.iter().map(|v| (v * 255.0).round() as u8).collect();
        Lean::new(
            R::client(device),
            &bytes,
            picture.width,
            picture.height,
            CHANNELS,
            top_k,
            band_rows,
        )
    }

    /// See [`FusedLoss::fused_loss_and_grads`].
    pub fn loss_and_grads(
        params: Params<CubeTensor<R>>,
        target: &Lean<R>,
        ssim_weight: f64,
    ) -> Result<(LossParts, Params<CubeTensor<R>>), DeviceError> {
        let (p, like) = buffers(params);
        let (parts, g) = target.loss_and_grads(&p, ssim_weight as f32)?;
        let n = p.n;
        Ok((
            parts,
            g.handles.map_param(|q, h| tensor(&like, h, n, q.width(CHANNELS))),
        ))
    }
}

/// Implements [`FusedLoss`] for a concrete CubeCL backend on runtime `$runtime`.
macro_rules! cube_fused_loss {
    ($backend:ty, $runtime:ty) => {
        impl FusedLoss for $backend {
            type Target = Lean<$runtime>;

            fn fused_target(picture: &Picture, top_k: usize, band_rows: usize, device: &Self::Device) -> Self::Target {
                CubeFused::target(picture, top_k, band_rows, device)
            }

            fn fused_target_bytes(target: &Self::Target) -> u64 {
                target.target_bytes()
            }

            fn fused_band_rungs(width: usize, height: usize) -> Vec<usize> {
                crate::gpu::engine::band_rungs(width, height, vramfit_gauss::picture::CHANNELS)
            }

            fn fused_workspace_bytes(target: &Self::Target) -> u64 {
                target.workspace_bytes()
            }

            fn fused_band_rows_used(target: &Self::Target) -> usize {
                target.band_rows()
            }

            fn fused_loss_and_grads(
                params: SplatPrimitives<Self>,
                target: &Self::Target,
                ssim_weight: f64,
            ) -> Result<(LossParts, SplatPrimitives<Self>), DeviceError> {
                CubeFused::loss_and_grads(params, target, ssim_weight)
            }

            fn fused_metrics(params: SplatPrimitives<Self>, target: &Self::Target) -> Result<LossParts, DeviceError> {
                target.metrics(&buffers(params).0)
            }

            fn fused_render_host(
                params: SplatPrimitives<Self>,
                target: &Self::Target,
                frame: &Frame,
            ) -> Result<Vec<f32>, DeviceError> {
                target.render_host(&buffers(params).0, frame)
            }
        }
    };
}

#[cfg(feature = "cuda")]
cube_fused_loss!(burn::backend::Cuda, cubecl::cuda::CudaRuntime);

/// The Burn backend the wgpu twin check fits on.
#[cfg(feature = "wgpu")]
pub type WgpuBackend = burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8>;

#[cfg(feature = "wgpu")]
impl SplatBackend for WgpuBackend {}

#[cfg(feature = "wgpu")]
cube_fused_loss!(WgpuBackend, cubecl::wgpu::WgpuRuntime);
