//! The figures an allocator gives: one reading, the peaks of a window,
//! and which of them decides an out-of-memory.

/// The allocator's own figures at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryReading {
    /// Bytes in live tensors.
    pub allocated: u64,
    /// Bytes the allocator holds from the device.
    pub reserved: u64,
    /// The driver's figure for the whole process at the same moment
    /// (independent of the allocator; includes the CUDA context), where
    /// the source has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<u64>,
}

/// The figure whose high-water mark decides an out-of-memory on a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomFigure {
    /// The reserved figure (else the in-use one).
    pub reserved: bool,
    /// Its name in reports.
    pub name: &'static str,
    /// Why it decides an out-of-memory there.
    pub why: &'static str,
    /// True when the profiler's high-water of it is exact, not sampled.
    pub exact: bool,
}

impl OomFigure {
    /// This figure's value in `peaks`.
    pub fn of(&self, peaks: &Peaks) -> u64 {
        if self.reserved { peaks.reserved } else { peaks.allocated }
    }
}

/// The largest figures seen in a window, each on its own (they need not
/// come from the same reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Peaks {
    /// Largest allocated bytes.
    pub allocated: u64,
    /// Largest reserved bytes.
    pub reserved: u64,
    /// Largest driver figure, where the source has one.
    pub driver: Option<u64>,
}
