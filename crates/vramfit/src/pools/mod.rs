//! The device allocator, modelled: what a card's CubeCL pools would
//! reserve for a step, computed by CubeCL's own memory management rather
//! than by a copy of its rules.
//!
//! CubeCL sizes its pool pages from the device (cubecl-cuda 0.10: the
//! largest page a quarter of the card's memory, smaller pools below it;
//! wgpu: the largest storage binding), so the reserved figure that decides
//! an out-of-memory differs from card to card for the same tensors. Here a
//! probe's allocations are recorded ([`Recorder`]: each reservation's size
//! and when its last handle went), and the recording is replayed
//! ([`replay`]) through `cubecl_runtime`'s `MemoryManagement`, configured
//! as the target card's client configures it, over a storage that holds no
//! memory. The result is that card's reserved high-water mark for the same
//! sequence, to the byte where the sequence is the card's.
//!
//! Burn's tensors are recorded on the CPU instead ([`trace_on_cpu`]): a
//! step run there with the CPU's own kernels off makes the tensors a
//! device's step makes, each one heap block.
//!
//! Or on shapes alone ([`trace_shapes`]): the step run on a backend that
//! computes no values ([`crate::shapes`]), each output placed as CubeCL
//! places it, so any size is traced in seconds on any machine.
//!
//! A trace recorded at one size is grown to another by [`TraceLaw`] (each
//! reservation's bytes affine in the count, fitted from two probes of the
//! same structure), so that a probe on a small device predicts a card too
//! large for it to run. Cards by name or size: [`Card`].

mod cards;
mod law;
mod on_cpu;
mod on_shapes;
mod record;
mod replay;
mod roofline;

pub use cards::{Allocator, Card, CardError, KNOWN_CARDS};
pub use law::{LawError, TraceLaw};
pub use on_cpu::{CpuTraceError, TENSOR_BLOCKS, TRACE_ROOM, trace_on_cpu};
pub use on_shapes::{ShapeTraceError, ShapesTraced, trace_shapes};
pub use record::Recorder;
pub use replay::{Event, ReplayError, Replayed, Trace, replay};
pub use roofline::{HOST_LINK_GBS, LAUNCH_SECONDS, Rates};
