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
            job.device_name = "cuda:0 (burn Cuda; splat kernels run on the host until the GPU kernels land)".into();
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
