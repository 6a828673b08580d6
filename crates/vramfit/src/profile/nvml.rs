//! The driver's view of this process's device memory (NVML), read beside
//! the allocator's figures as an independent cross-check.
//!
//! The driver counts everything the process holds on the device: the
//! allocator's reserved pool plus the CUDA context, loaded kernels and
//! library workspaces. So it reads above the allocator's `reserved`; the
//! report keeps both and never substitutes one for the other.

/// A device memory figure for this process from outside the allocator.
pub trait DriverReading: Send + Sync {
    /// Names the source, e.g. `"NVML per-process used memory (GPU 0)"`.
    fn name(&self) -> String;
    /// Bytes the driver attributes to this process now, or `None` when the
    /// process is not (yet) listed.
    fn read(&self) -> Option<u64>;
}

/// Why there is no driver reading beside the allocator's figures.
#[derive(Debug, thiserror::Error)]
pub enum NoDriverReading {
    /// The backend's driver has no per-process figure vramfit reads (wgpu).
    #[error("no driver reading on {0}")]
    NotOn(&'static str),
    /// This build leaves NVML out.
    #[error("built without the nvml feature")]
    NotBuilt,
    /// NVML does not load or answer (no driver library, no permission).
    #[error("NVML unavailable: {0}")]
    Unavailable(String),
    /// NVML has no such GPU.
    #[error("NVML has no GPU {index}: {why}")]
    NoGpu {
        /// The GPU asked for.
        index: u32,
        /// NVML's words.
        why: String,
    },
}

/// Picks this process's figure from `(pid, bytes)` pairs. In a container
/// the driver may list host PIDs; then nothing matches and `None` says so
/// (a device-wide figure would count other processes, so it is not used).
pub fn process_figure(processes: impl IntoIterator<Item = (u32, Option<u64>)>, pid: u32) -> Option<u64> {
    processes
        .into_iter()
        .find(|(p, _)| *p == pid)
        .and_then(|(_, bytes)| bytes)
}

/// NVML, loaded at run time (`libnvidia-ml.so.1`, part of the driver).
#[cfg(feature = "nvml")]
pub struct Nvml {
    nvml: nvml_wrapper::Nvml,
    index: u32,
    pid: u32,
}

#[cfg(feature = "nvml")]
impl Nvml {
    /// Opens NVML for GPU `index`; the error says why it is unavailable
    /// (no driver library, no permission, no such device).
    pub fn open(index: u32) -> Result<Self, NoDriverReading> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| NoDriverReading::Unavailable(e.to_string()))?;
        nvml.device_by_index(index).map_err(|e| NoDriverReading::NoGpu {
            index,
            why: e.to_string(),
        })?;
        Ok(Self {
            nvml,
            index,
            pid: std::process::id(),
        })
    }
}

/// The GPUs CUDA numbers in this process, counted without opening a CUDA
/// context (a rank asking CUDA would leave one on GPU 0, hundreds of MiB):
/// `CUDA_VISIBLE_DEVICES`' entries where it is set, else NVML's count;
/// `None` when neither can say.
#[cfg(feature = "nvml")]
pub fn cuda_gpu_count() -> Option<usize> {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) => Some(visible_gpus(&list)),
        Err(_) => nvml_wrapper::Nvml::init().ok()?.device_count().ok().map(|n| n as usize),
    }
}

/// The GPUs a `CUDA_VISIBLE_DEVICES` list shows: its entries up to the
/// first that names no GPU (CUDA ignores the rest), each an index or a
/// `GPU-`/`MIG-` UUID.
pub fn visible_gpus(list: &str) -> usize {
    list.split(',')
        .map(str::trim)
        .take_while(|e| e.parse::<u32>().is_ok() || e.starts_with("GPU-") || e.starts_with("MIG-"))
        .count()
}

#[cfg(feature = "nvml")]
impl DriverReading for Nvml {
    fn name(&self) -> String {
        format!("NVML per-process used memory (GPU {}, pid {})", self.index, self.pid)
    }

    fn read(&self) -> Option<u64> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let device = self.nvml.device_by_index(self.index).ok()?;
        let processes = device.running_compute_processes().ok()?;
        process_figure(
            processes.into_iter().map(|p| {
                let bytes = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                (p.pid, bytes)
            }),
            self.pid,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_gpus_stop_at_the_first_entry_naming_none() {
        assert_eq!(visible_gpus("0,1"), 2);
        assert_eq!(visible_gpus(" 2 , 3 ,GPU-8f2e"), 3);
        assert_eq!(visible_gpus(""), 0);
        assert_eq!(visible_gpus("-1"), 0);
        assert_eq!(visible_gpus("0,-1,1"), 1);
    }

    #[test]
    fn picks_this_process_and_nothing_else() {
        let listed = [(10, Some(5 << 20)), (42, Some(7 << 20)), (43, None)];
        assert_eq!(process_figure(listed, 42), Some(7 << 20));
        // Listed without a figure (WDDM), and not listed (PID namespace): no figure.
        assert_eq!(process_figure(listed, 43), None);
        assert_eq!(process_figure(listed, 99), None);
    }

    /// Without an NVIDIA driver (this CI machine) opening fails with a
    /// reason instead of panicking, so a CUDA build still runs and says why
    /// the cross-check is missing.
    #[cfg(feature = "nvml")]
    #[test]
    fn missing_driver_is_a_reason_not_a_panic() {
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            return; // a machine with the driver: the GPU run checks this path
        }
        let err = Nvml::open(0).err().expect("no NVIDIA driver here, so NVML cannot open");
        assert!(matches!(err, NoDriverReading::Unavailable(_)), "{err}");
    }
}
