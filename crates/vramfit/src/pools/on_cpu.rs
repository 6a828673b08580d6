//! A device's allocation sequence, recorded on the CPU.
//!
//! CubeCL 0.10 has no hook on its allocator, so Burn's tensors cannot be
//! recorded on a device without holding their handles, and holding one
//! changes what Burn computes in place (`can_mut`). On the CPU backend
//! every tensor buffer is one heap block, made and released where the
//! device's would be, so a step run there under a heap recording
//! ([`crate::heap::record`]) with the CPU's own kernels off
//! ([`crate::fused::as_on_a_device`]) gives the sequence a device's pools
//! see, up to the buffers the device's kernels add (launch metadata, which
//! the CPU does not make) and the small host blocks the CPU run makes
//! beside its tensors. How close that is was measured against lavapipe and
//! an H200 (docs/design/pools.md).

use std::ops::ControlFlow;

use super::Trace;
use crate::heap::{Blocks, HeapRecordError, HeapRecording};
use crate::run::{Event, Run, RunError, Workload};

/// Room for this many heap events (24 bytes each, taken up front):
/// measured 35,790 events for three steps of a 4-block transformer at a
/// batch of 16 × 512 tokens.
pub const TRACE_ROOM: usize = 1 << 21;

/// The heap blocks that stand for device buffers: every size, aligned to
/// 1, 2, 4 or 16 bytes. The CPU backend's tensor buffers are vectors of
/// their element (f32: 4; f16: 2; bool: 1) or byte buffers aligned to 16
/// (`cubecl_common::bytes`); Rust's own bookkeeping (autodiff nodes,
/// boxes, shape vectors) is 8-aligned, and left out. Measured: with the
/// 8-aligned blocks kept, the H100's default transformer run (16 MB in use)
/// was predicted 403 % over (thousands of small blocks each take a
/// 512-byte slot on a CUDA card); without them, +0.59 %. Integer tensors
/// are 8-aligned on the CPU (i64) and so left out: on a device they are
/// 32-bit, and the token ids they hold are small beside the activations.
pub const TENSOR_BLOCKS: Blocks = Blocks {
    min_bytes: 1,
    aligns: 1 | 2 | 4 | 16,
};

/// Why a CPU trace failed.
#[derive(Debug, thiserror::Error)]
pub enum CpuTraceError {
    /// The heap could not be recorded.
    #[error(transparent)]
    Heap(#[from] HeapRecordError),
    /// The workload could not be built.
    #[error("the workload to trace could not be built: {0}")]
    Build(Box<dyn std::error::Error + Send + Sync>),
    /// The run failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The run ended before the steps to trace.
    #[error("the traced run ended before step {0}: build it for at least that many steps")]
    TooShort(u64),
}

/// Builds a workload on the CPU backend with `make` and runs its first
/// `steps` steps, recording every heap block the build and the steps make
/// and release, with the CPU's own kernels off; the run is stopped after
/// step `steps` (its final files are host memory on a device, so they are
/// not traced). The trace starts empty: the workload's parameters and
/// state are its first reservations, as on a device.
pub fn trace_on_cpu<W: Workload, E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    make: impl FnOnce() -> Result<(Run, W), E>,
    steps: u64,
) -> Result<Trace, CpuTraceError> {
    let mut recording: Option<HeapRecording> = Some(crate::heap::record(TENSOR_BLOCKS, TRACE_ROOM)?);
    let _kernels_off = crate::fused::as_on_a_device();
    let (run, workload) = make().map_err(|e| CpuTraceError::Build(e.into()))?;
    let mut events = None;
    run.drive(workload, |event| match event {
        Event::Step(r) if r.step >= steps => {
            events = recording.take().map(HeapRecording::finish);
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(()),
    })?;
    match events {
        Some(events) => Ok(Trace::from_heap(&events?)),
        None => Err(CpuTraceError::TooShort(steps)),
    }
}
