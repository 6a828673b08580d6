//! What went wrong on a device, for both workloads' device seams (the GPU
//! code, feature `gpu`, makes them; the CPU twins' seams share the type).

/// What went wrong on the device.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceError {
    /// The runtime failed a read, a sync or a memory query (an
    /// out-of-memory, a lost device), in its own words: the profiler's
    /// out-of-memory reader recognises them.
    #[error("{0}")]
    Runtime(String),
    /// One buffer larger than the largest this device allocates.
    #[error(
        "{what} needs one buffer of {:.1} MiB, more than this device's largest ({:.1} MiB): use fewer \
         Gaussians, a lower SH degree or a smaller image, or a device with larger buffers (CUDA)",
        *bytes as f64 / MIB, *largest as f64 / MIB
    )]
    BufferTooLarge {
        /// What the buffer holds, e.g. "12 million tile intersections".
        what: String,
        /// Its bytes.
        bytes: u64,
        /// The device's largest buffer.
        largest: u64,
    },
    /// Settings this device cannot run, with what to change.
    #[error("{0}")]
    Unsupported(String),
    /// A call out of its order (a caller's bug): what came first.
    #[error("{0} (the device's calls came out of order)")]
    OutOfOrder(&'static str),
}

const MIB: f64 = (1u64 << 20) as f64;

impl DeviceError {
    /// The runtime's error, in its words.
    pub fn runtime(error: impl std::fmt::Display) -> Self {
        Self::Runtime(error.to_string())
    }
}
