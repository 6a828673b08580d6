#[cfg(any(feature = "cuda", feature = "wgpu"))]
use super::nvml::{DriverReading, NoDriverReading};

use super::reading::{MemoryReading, OomFigure, Peaks};

/// Where allocator figures come from (one per backend).
pub trait MemorySource: Send + Sync {
    /// Names the source in reports, e.g. `"cubecl memory_usage"`.
    fn name(&self) -> String;
    /// The current figures, or `None` where the backend has no allocator view.
    fn read(&self) -> Option<MemoryReading>;
    /// The figure that decides an out-of-memory here, where the source measures it.
    fn oom_figure(&self) -> Option<OomFigure> {
        None
    }
    /// True when [`MemorySource::take_window_peak`] gives exact high-water marks.
    fn exact_window_peaks(&self) -> bool {
        false
    }
    /// The exact largest figures since the previous call, starting a new
    /// window; `None` where the source cannot track them (then the profiler
    /// samples).
    fn take_window_peak(&self) -> Option<Peaks> {
        None
    }
    /// Names the independent (driver) reading in `MemoryReading::driver`,
    /// or says why there is none.
    fn driver_name(&self) -> Option<String> {
        None
    }
    /// What the driver counted beyond the allocator's reserved bytes when
    /// the source was opened: the CUDA context and loaded modules. The
    /// driver's peak minus this is the figure comparable with `reserved`.
    fn driver_context(&self) -> Option<u64> {
        None
    }
}

/// A backend without allocator figures in a process without a counting
/// allocator: reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAllocator;

impl MemorySource for NoAllocator {
    fn name(&self) -> String {
        "none (CPU backend without a counting allocator: tensor bytes are accounted, not measured)".into()
    }

    fn read(&self) -> Option<MemoryReading> {
        None
    }
}

/// The process heap through [`crate::heap::Counting`]: on the CPU the
/// tensors live there, so heap bytes in use are what runs out. Nothing is
/// reserved beyond what is in use at this level (the inner allocator's
/// caching shows in the resident set, reported beside).
#[derive(Debug, Clone, Copy, Default)]
pub struct HeapSource;

impl HeapSource {
    /// The heap source where a counting allocator is installed, else [`NoAllocator`].
    pub fn if_installed() -> Box<dyn MemorySource> {
        if crate::heap::installed() {
            Box::new(HeapSource)
        } else {
            Box::new(NoAllocator)
        }
    }
}

impl MemorySource for HeapSource {
    fn name(&self) -> String {
        "counting global allocator (heap bytes in use)".into()
    }

    fn read(&self) -> Option<MemoryReading> {
        let now = crate::heap::current();
        Some(MemoryReading {
            allocated: now,
            reserved: now,
            driver: None,
        })
    }

    fn oom_figure(&self) -> Option<OomFigure> {
        Some(OomFigure {
            reserved: false,
            name: "heap bytes in use (counting allocator)",
            why: "on the CPU the tensors live on the process heap, so heap bytes are what runs out; every allocation is counted",
            exact: true,
        })
    }

    fn exact_window_peaks(&self) -> bool {
        true
    }

    fn take_window_peak(&self) -> Option<Peaks> {
        let peak = crate::heap::take_peak();
        Some(Peaks {
            allocated: peak,
            reserved: peak,
            driver: None,
        })
    }
}

/// Backends that can say where their device memory figures come from.
pub trait DeviceMemory: burn::tensor::backend::Backend {
    /// The allocator view of `device` (none by default).
    fn memory_source(_device: &Self::Device) -> Box<dyn MemorySource> {
        Box::new(NoAllocator)
    }
}

impl DeviceMemory for burn::backend::Flex {
    fn memory_source(_device: &Self::Device) -> Box<dyn MemorySource> {
        HeapSource::if_installed()
    }
}

/// The shape backend holds no memory: its figures are the trace's, read
/// after the run (`pools::trace_shapes`).
impl DeviceMemory for crate::shapes::Shapes {}

impl<B: DeviceMemory, C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy> DeviceMemory
    for burn::backend::Autodiff<B, C>
{
    fn memory_source(device: &Self::Device) -> Box<dyn MemorySource> {
        B::memory_source(device)
    }
}

/// A CubeCL runtime's allocator figures (`memory_usage()` of its client):
/// `allocated` = bytes in use, `reserved` = bytes reserved from the device;
/// on CUDA with NVML, the driver's per-process figure beside them.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub struct CubeAllocator<R: cubecl::Runtime> {
    client: cubecl::client::ComputeClient<R>,
    label: &'static str,
    driver: Result<Box<dyn DriverReading>, NoDriverReading>,
    context: Option<u64>,
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
impl<R: cubecl::Runtime> CubeAllocator<R> {
    /// The allocator of `device`, named `label` in reports, with `driver`
    /// (or the reason there is none) as the independent reading.
    /// Opening the client creates the device context, so the driver's
    /// figure minus `reserved` right after it is the context's share; the
    /// first source of the device in the process reads it ([`context_once`]).
    pub fn new(
        device: &R::Device,
        label: &'static str,
        driver: Result<Box<dyn DriverReading>, NoDriverReading>,
    ) -> Self {
        let client = R::client(device);
        let reserved = client.memory_usage().ok().map(|u| u.bytes_reserved);
        let context = context_once(format!("{label} {device:?}"), || match (&driver, reserved) {
            (Ok(d), Some(r)) => d.read().map(|bytes| bytes.saturating_sub(r)),
            _ => None,
        });
        Self {
            client,
            label,
            driver,
            context,
        }
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
impl<R: cubecl::Runtime> MemorySource for CubeAllocator<R> {
    fn name(&self) -> String {
        format!("cubecl memory_usage() ({} allocator)", self.label)
    }

    fn read(&self) -> Option<MemoryReading> {
        let u = self.client.memory_usage().ok()?;
        Some(MemoryReading {
            allocated: u.bytes_in_use,
            reserved: u.bytes_reserved,
            driver: self.driver.as_ref().ok().and_then(|d| d.read()),
        })
    }

    fn driver_name(&self) -> Option<String> {
        Some(match &self.driver {
            Ok(d) => d.name(),
            Err(why) => format!("none: {why}"),
        })
    }

    fn driver_context(&self) -> Option<u64> {
        self.context
    }

    fn oom_figure(&self) -> Option<OomFigure> {
        Some(OomFigure {
            reserved: true,
            name: "allocator reserved bytes",
            why: "a CubeCL allocation that cannot be served from the reserved pool reserves more from the device, and a failed reservation is the out-of-memory; the pool only grows between explicit cleanups, and the profiler reads it at the end of every phase of every step and before each cleanup, so its high-water is exact",
            exact: true,
        })
    }
}

#[cfg(feature = "cuda")]
impl DeviceMemory for burn::backend::Cuda {
    fn memory_source(device: &Self::Device) -> Box<dyn MemorySource> {
        #[cfg(feature = "nvml")]
        let driver = super::nvml::Nvml::open(device.index as u32).map(|n| Box::new(n) as Box<dyn DriverReading>);
        #[cfg(not(feature = "nvml"))]
        let driver = Err(NoDriverReading::NotBuilt);
        Box::new(CubeAllocator::<cubecl::cuda::CudaRuntime>::new(device, "CUDA", driver))
    }
}

/// Burn's operation fusion on wgpu: the same allocator, read after the
/// queued operations have run. Fusion defers operations (and so their
/// allocations) until a read or a sync, so each reading first syncs the
/// device: the readings at the end of every phase stay exact, and fusion
/// works within a phase, not across one.
#[cfg(feature = "fusion")]
impl DeviceMemory for burn_fusion::Fusion<burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8>> {
    fn memory_source(device: &Self::Device) -> Box<dyn MemorySource> {
        let driver = Err(NoDriverReading::NotOn("wgpu"));
        Box::new(Synced::<Self, _> {
            device: device.clone(),
            inner: CubeAllocator::<cubecl::wgpu::WgpuRuntime>::new(device, "wgpu, fused", driver),
        })
    }
}

/// `inner`, read after a sync of backend `B`'s device.
#[cfg(feature = "fusion")]
struct Synced<B: burn::tensor::backend::Backend, S> {
    device: B::Device,
    inner: S,
}

#[cfg(feature = "fusion")]
impl<B: burn::tensor::backend::Backend, S: MemorySource> MemorySource for Synced<B, S> {
    fn name(&self) -> String {
        format!("{}, read after a device sync", self.inner.name())
    }
    fn read(&self) -> Option<MemoryReading> {
        B::sync(&self.device).ok()?;
        self.inner.read()
    }
    fn oom_figure(&self) -> Option<OomFigure> {
        self.inner.oom_figure()
    }
    fn driver_name(&self) -> Option<String> {
        self.inner.driver_name()
    }
    fn driver_context(&self) -> Option<u64> {
        self.inner.driver_context()
    }
}

/// Burn on wgpu (Vulkan, Metal, DX12; Mesa's software Vulkan in CI): the
/// allocator's figures, no driver cross-check.
#[cfg(feature = "wgpu")]
impl DeviceMemory for burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8> {
    fn memory_source(device: &Self::Device) -> Box<dyn MemorySource> {
        let driver = Err(NoDriverReading::NotOn("wgpu"));
        Box::new(CubeAllocator::<cubecl::wgpu::WgpuRuntime>::new(device, "wgpu", driver))
    }
}

/// The CUDA context's share of the driver's figure for the device `key`:
/// `read` by the first source opened for it in this process, reused by
/// every later one. A later reading counts more than the context: after
/// the planner's probes the driver still held 1.0 GiB that CubeCL's
/// cleanup had given back (an H200, 23 probes: 1.61 GiB read as the
/// context against 0.54 GiB in a fresh process), and the run's allocator
/// reused it, so the cross-check read the run's 1.08 GiB reserved peak as
/// 2,440 % of the driver's figure.
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
fn context_once(key: String, read: impl FnOnce() -> Option<u64>) -> Option<u64> {
    static READ: std::sync::Mutex<Vec<(String, u64)>> = std::sync::Mutex::new(Vec::new());
    let mut seen = READ.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, bytes)) = seen.iter().find(|(k, _)| *k == key) {
        return Some(*bytes);
    }
    let bytes = read()?;
    seen.push((key, bytes));
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::context_once;

    #[test]
    fn the_context_is_read_once_per_device_in_a_process() {
        assert_eq!(context_once("test-a".into(), || None), None, "no reading, nothing kept");
        assert_eq!(context_once("test-a".into(), || Some(540)), Some(540));
        assert_eq!(
            context_once("test-a".into(), || Some(1_610)),
            Some(540),
            "a later source (after probes) keeps the first reading"
        );
        assert_eq!(
            context_once("test-b".into(), || Some(700)),
            Some(700),
            "another device reads its own"
        );
    }
}
