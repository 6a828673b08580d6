//! Memory accounting over the phases of a training step. The headline is
//! the high-water mark of the figure that decides an out-of-memory on the
//! backend: the allocator's reserved bytes on CubeCL (CUDA, wgpu), the heap
//! bytes in use on the CPU (through the counting allocator of
//! [`crate::heap`]), each a true high-water mark. Beside it, where the bytes
//! go (`parameters`, `gradients`, `optimizer_state`, `activations`,
//! `inputs`, `workspace`, `other`, `cached`) at the end of each phase, a
//! timeline over steps with a leak check, and the `memory.json` report.
//!
//! What is measured and what is derived is kept apart and written into the
//! report: the workload walks its own tensors and declares its inputs and
//! workspace (exact bytes), a [`MemorySource`] gives in-use and reserved
//! bytes, and the rest follows by difference. Where neither an allocator
//! view nor a counting allocator exists, no device figure is invented.
//!
//! This module must not allocate on the device or synchronise it by itself.

mod html;
mod nvml;
mod oom;
mod phase;
mod reading;
mod record;
mod report;
mod sampler;
mod source;

pub use html::{CATEGORY_COLOURS, PEAK_COLOUR};
pub use nvml::{DriverReading, NoDriverReading, process_figure, visible_gpus};
#[cfg(feature = "nvml")]
pub use nvml::{Nvml, cuda_gpu_count};
pub use oom::{OomReport, OutOfMemory, oom_report, out_of_memory, panics};
pub use phase::{Accounted, Category, LeakWarning, PhaseRecord};
pub use reading::{MemoryReading, OomFigure, Peaks};
pub use record::Profiler;
pub use report::{Headline, MemoryReport, NamedTensor, REPORT_VERSION, ReportFileError, human_bytes};
pub use sampler::PeakSampler;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub use source::CubeAllocator;
pub use source::{DeviceMemory, HeapSource, MemorySource, NoAllocator};
