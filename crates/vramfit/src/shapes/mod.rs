//! A backend that computes no values: Burn's operations on shapes alone,
//! for tracing what a device's allocator is asked for by a whole step at
//! any size, on any machine, in seconds.
//!
//! [`Shapes`] is a `burn-router` backend whose one client ([`ShapeClient`])
//! receives each operation as `burn-ir` describes it (its inputs, whether
//! the op holds an input's last handle, its outputs' shapes and element
//! types, a `Drop` when a tensor's last handle goes) and places each
//! output as a CubeCL device would (`effects.rs`: a new buffer, an input
//! overwritten in place, or a view). Burn's autodiff and vramfit's
//! checkpointing run over it unchanged (`Autodiff<Shapes>`), so the trace
//! is the program's own: every tensor the forward keeps, every gradient,
//! every optimiser state, in the device's element types. A read of a value
//! (the loss, an overflow check) gives zeros and is counted; a read that
//! would decide a shape is refused ([`Untraceable`]).
//!
//! A recording ([`record`]) gives the allocator's events
//! ([`Allocation`]); `pools::trace_shapes` runs a workload's steps under
//! one and replays them for any card. This module uses nothing else of
//! the crate: the allocator cleanup, the fused attention and the pools
//! build on it.

mod buffers;
mod client;
mod custom;
mod effects;
mod work;

use std::sync::{Mutex, MutexGuard};

pub use buffers::Allocation;
pub use client::{NoBridge, ShapeChannel, ShapeClient, ShapeDevice};
pub use custom::{ShapeTensor, contiguous, kernel};
pub use effects::Untraceable;
pub use work::OpWork;

/// The backend: operations described, none computed.
pub type Shapes = burn_router::BackendRouter<ShapeChannel>;

/// One recording at a time: the client is the process's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn client() -> ShapeClient {
    burn_router::get_client::<ShapeChannel>(&ShapeDevice)
}

/// True when `B` is [`Shapes`], with or without autodiff.
pub fn is_shapes<B: 'static>() -> bool {
    let b = std::any::TypeId::of::<B>();
    b == std::any::TypeId::of::<Shapes>() || b == std::any::TypeId::of::<burn::backend::Autodiff<Shapes>>()
}

/// Records, where `B` is [`Shapes`], that the pools were told to give back
/// what they hold but do not use (`Backend::memory_cleanup`, which the
/// router does not pass on).
pub fn cleanup_mark<B: 'static>() {
    if is_shapes::<B>() {
        client().state().buffers.cleanup();
    }
}

/// A recording of what the shape backend's operations ask of a device's
/// allocator, from now until [`ShapeRecording::finish`].
#[derive(Debug)]
#[must_use = "a recording is read with finish"]
pub struct ShapeRecording {
    _one_at_a_time: MutexGuard<'static, ()>,
}

/// What a recording saw.
#[derive(Debug, Clone)]
pub struct ShapeTrace {
    /// The allocator's events, in order.
    pub events: Vec<Allocation>,
    /// Operations described.
    pub operations: u64,
    /// Values read (each given zeros).
    pub reads: u64,
    /// Each kernel's work (and each move between host and device) since
    /// the last [`ShapeRecording::mark`], or the start.
    pub work: Vec<OpWork>,
}

/// Starts a recording. `alignment`: the device allocator's (a slice whose
/// ends fall on it is a view; CUDA's pools align to 512 bytes). Waits for
/// any other recording to finish.
pub fn record(alignment: u64) -> ShapeRecording {
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let client = client();
    let mut state = client.state();
    state.buffers.restart();
    state.operations = 0;
    state.reads = 0;
    state.refused = None;
    state.alignment = alignment;
    state.work.clear();
    drop(state);
    ShapeRecording { _one_at_a_time: guard }
}

impl ShapeRecording {
    /// Starts counting the kernels' work afresh (at a step's start: the
    /// work of one step, not of the build before it).
    pub fn mark(&self) {
        client().state().work.clear();
    }

    /// The events since [`record`]; refused if an operation could not be
    /// traced on shapes.
    pub fn finish(self) -> Result<ShapeTrace, Untraceable> {
        let client = client();
        let mut state = client.state();
        if let Some(refused) = state.refused.take() {
            return Err(refused);
        }
        Ok(ShapeTrace {
            events: state.buffers.take_events(),
            operations: state.operations,
            reads: state.reads,
            work: std::mem::take(&mut state.work),
        })
    }
}

#[cfg(test)]
mod tests;
