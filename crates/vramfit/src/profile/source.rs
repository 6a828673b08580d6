/// The allocator's own figures at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryReading {
    /// Bytes in live tensors.
    pub allocated: u64,
    /// Bytes the allocator holds from the device.
    pub reserved: u64,
}

/// Where allocator figures come from (one per backend).
pub trait MemorySource: Send + Sync {
    /// Names the source in reports, e.g. `"cubecl memory_usage"`.
    fn name(&self) -> String;
    /// The current figures, or `None` where the backend has no allocator view.
    fn read(&self) -> Option<MemoryReading>;
}

/// A backend without allocator figures (the CPU backends): reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAllocator;

impl MemorySource for NoAllocator {
    fn name(&self) -> String {
        "none (CPU backend: tensor bytes are accounted, not measured)".into()
    }

    fn read(&self) -> Option<MemoryReading> {
        None
    }
}

/// Backends that can say where their device memory figures come from.
pub trait DeviceMemory: burn::tensor::backend::Backend {
    /// The allocator view of `device` (none by default).
    fn memory_source(_device: &Self::Device) -> Box<dyn MemorySource> {
        Box::new(NoAllocator)
    }
}

impl DeviceMemory for burn::backend::Flex {}

impl<B: DeviceMemory, C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy> DeviceMemory
    for burn::backend::Autodiff<B, C>
{
    fn memory_source(device: &Self::Device) -> Box<dyn MemorySource> {
        B::memory_source(device)
    }
}

/// The CUDA allocator's own figures (`memory_usage()` of cubecl's client):
/// `allocated` = bytes in use, `reserved` = bytes reserved from the device.
#[cfg(feature = "cuda")]
pub struct CudaAllocator(cubecl::client::ComputeClient<cubecl::cuda::CudaRuntime>);

#[cfg(feature = "cuda")]
impl MemorySource for CudaAllocator {
    fn name(&self) -> String {
        "cubecl memory_usage() (CUDA allocator)".into()
    }

    fn read(&self) -> Option<MemoryReading> {
        let u = self.0.memory_usage().ok()?;
        Some(MemoryReading {
            allocated: u.bytes_in_use,
            reserved: u.bytes_reserved,
        })
    }
}

#[cfg(feature = "cuda")]
impl DeviceMemory for burn::backend::Cuda {
    fn memory_source(device: &Self::Device) -> Box<dyn MemorySource> {
        use cubecl::Runtime;
        Box::new(CudaAllocator(cubecl::cuda::CudaRuntime::client(device)))
    }
}

/// The splat crate's wgpu twin check runs Burn on this backend; its memory
/// figures come from the host (the software device lives in host memory).
#[cfg(feature = "wgpu")]
impl DeviceMemory for burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u8> {}
