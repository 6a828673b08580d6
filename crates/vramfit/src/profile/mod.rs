//! Memory accounting over the phases of a training step: where the bytes
//! go (`parameters`, `gradients`, `optimizer_state`, `activations`,
//! `temporaries`, `fragmentation`), the peak, a timeline over steps with a
//! leak check, and the `memory.json` report.
//!
//! What is measured and what is derived is kept apart and written into the
//! report: the workload walks its own tensors (parameters, gradients,
//! optimiser state: exact bytes), a [`MemorySource`] gives the allocator's
//! `allocated` / `reserved` where the backend has one, and the rest follows
//! by difference. On a backend without allocator figures (the CPU) no
//! device figure is invented: only the walked categories are reported, with
//! the host process's resident memory beside them.
//!
//! This module must not allocate on the device or synchronise it by itself.

mod driver;
mod html;
mod oom;
mod record;
mod sampler;
mod source;

#[cfg(feature = "nvml")]
pub use driver::Nvml;
pub use driver::{DriverReading, process_figure};
pub use html::{CATEGORY_COLOURS, PEAK_COLOUR};
pub use oom::{OomReport, OutOfMemory, oom_report, out_of_memory, simulated_oom};
pub use record::{Accounted, Category, LeakWarning, MemoryReport, PhaseRecord, Profiler, REPORT_VERSION, human_bytes};
pub use sampler::{PeakSampler, Peaks};
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub use source::CubeAllocator;
pub use source::{DeviceMemory, MemoryReading, MemorySource, NoAllocator};
