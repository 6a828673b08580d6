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
