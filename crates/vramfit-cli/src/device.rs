//! Picks the backend for `--device` and runs work on it.

use anyhow::Result;
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::AutodiffBackend;
use vramfit::profile::DeviceMemory;
use vramfit_splat::op::{FusedLoss, SplatBackend};

/// `--device`, declared once for every command that runs work on one.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArg {
    /// Device: cpu; cuda or wgpu in a build with that feature (`--features cuda`, `--features wgpu`).
    #[arg(long = "device", value_name = "DEVICE", default_value = "cpu")]
    pub name: String,
}

/// The devices this build can run on, for messages.
const BUILT: &str = if cfg!(all(feature = "cuda", feature = "wgpu")) {
    "cpu, cuda or wgpu"
} else if cfg!(feature = "cuda") {
    "cpu or cuda"
} else if cfg!(feature = "wgpu") {
    "cpu or wgpu"
} else {
    "cpu"
};

/// The error for a device this build lacks or does not know.
pub(crate) fn unavailable(device: &str) -> anyhow::Error {
    match device {
        "cuda" | "wgpu" => anyhow::anyhow!(
            "this vramfit was built without {device}; rebuild with `cargo build --release -p vramfit-cli --features {device}` (this build runs on {BUILT})"
        ),
        other => anyhow::anyhow!("unknown --device '{other}'; this build runs on {BUILT}"),
    }
}

/// Work to run on a training backend chosen at run time (`--device`): the
/// transformer, the U-Net, their planners.
pub trait OnBackend {
    /// What it returns.
    type Output;
    /// Runs on backend `B`, device `device`, described as `name`.
    fn run<B>(self, device: &B::Device, name: String) -> Result<Self::Output>
    where
        B: AutodiffBackend,
        B::InnerBackend: DeviceMemory;
}

/// Work that also needs the splat fit's kernels on its backend: the fit,
/// its planner and its benchmark.
pub trait OnSplatBackend {
    /// What it returns.
    type Output;
    /// Runs on backend `B`, device `device`, described as `name`.
    fn run<B>(self, device: &B::Device, name: String) -> Result<Self::Output>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: FusedLoss + DeviceMemory;
}

/// The one place that maps `--device` to a backend; both kinds of work
/// are dispatched through it.
macro_rules! dispatch {
    ($device:expr, $work:expr) => {
        match $device {
            "cpu" => $work.run::<Autodiff<Flex>>(
                &Default::default(),
                format!("cpu (burn Flex, {} threads)", rayon_threads()),
            ),
            #[cfg(feature = "cuda")]
            "cuda" => {
                // On ranks, one GPU a rank: the rank's index on its
                // machine; more ranks than GPUs share them in turn (a
                // check of the ranks on a one-GPU machine, not a speed-up).
                let index = match vramfit::ranks::local_rank() {
                    0 => 0,
                    rank => rank % vramfit::profile::cuda_gpu_count().unwrap_or(rank + 1).max(1),
                };
                $work.run::<Autodiff<burn::backend::Cuda>>(
                    &burn::backend::cuda::CudaDevice::new(index),
                    format!("cuda:{index} (burn Cuda; CubeCL)"),
                )
            }
            #[cfg(feature = "wgpu")]
            "wgpu" => $work.run::<vramfit::backends::Wgpu>(
                &Default::default(),
                "wgpu, default adapter (burn CubeBackend<Wgpu>; CubeCL)".into(),
            ),
            other => Err(unavailable(other)),
        }
    };
}

/// Runs `work` on the named device.
pub fn on_device<W: OnBackend>(device: &str, work: W) -> Result<W::Output> {
    // Burn's operation fusion: the Burn workloads only (the splat fit and
    // the scene run their own kernels on their own buffers).
    #[cfg(feature = "fusion")]
    if device == "wgpu-fusion" {
        return work.run::<vramfit::backends::WgpuFusion>(
            &Default::default(),
            "wgpu, default adapter (burn Fusion<CubeBackend<Wgpu>>; CubeCL)".into(),
        );
    }
    dispatch!(device, work)
}

/// Runs `work`, which needs the splat kernels, on the named device.
pub fn on_splat_device<W: OnSplatBackend>(device: &str, work: W) -> Result<W::Output> {
    dispatch!(device, work)
}

/// Where a scene fit runs for `--device`: the scene's state lives in the
/// renderer's own CubeCL buffers, not in Burn tensors, so it has this
/// dispatch of its own (the same devices, the same allocator reading).
pub fn scene_placement(device: &str) -> Result<vramfit_scene::job::Placement> {
    match device {
        "cpu" => Ok(vramfit_scene::job::Placement::cpu()),
        #[cfg(feature = "cuda")]
        "cuda" => {
            let d = burn::backend::cuda::CudaDevice::default();
            let memory = d.clone();
            Ok(vramfit_scene::gpu::device_fit::placement::<cubecl::cuda::CudaRuntime>(
                &d,
                "cuda:0",
                move || <burn::backend::Cuda as DeviceMemory>::memory_source(&memory),
            ))
        }
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            let d = burn::backend::wgpu::WgpuDevice::default();
            let memory = d.clone();
            Ok(vramfit_scene::gpu::device_fit::placement::<cubecl::wgpu::WgpuRuntime>(
                &d,
                "wgpu, default adapter",
                move || <vramfit::backends::Wgpu as DeviceMemory>::memory_source(&memory),
            ))
        }
        other => Err(unavailable(other)),
    }
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
