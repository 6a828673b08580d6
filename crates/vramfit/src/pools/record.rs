//! Recording what a workload's own code asks CubeCL's allocator for.

use std::collections::HashMap;

use cubecl_runtime::server::Handle;

use super::{Event, Trace};
use crate::heap::HeapEvent;

/// Records the buffers a workload makes and when their last handle goes.
///
/// CubeCL 0.10 offers no hook on its allocator, so the workload calls
/// [`Recorder::made`] around each allocation it makes. The recorder keeps
/// one clone of each live handle and sees a buffer released when only its
/// clone and the pool's remain (`can_mut`); it looks before every new
/// allocation and cleanup ([`Recorder::before`]), so the pool, which checks
/// for free slices when it reserves, sees the same releases the trace
/// says. Buffers made by Burn's tensors are not seen: only a workload
/// whose every device buffer goes through its own code can be recorded.
#[derive(Debug, Default)]
pub struct Recorder {
    events: Vec<Event>,
    live: Vec<(usize, Handle)>,
    reserves: usize,
    persistent: bool,
}

impl Recorder {
    /// An empty recording.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the releases since the last look. Call it before asking the
    /// client for a buffer or a cleanup.
    pub fn before(&mut self) {
        let events = &mut self.events;
        self.live.retain(|(reserve, handle)| {
            // Ours and the pool's: the workload let it go.
            let released = handle.memory.can_mut();
            if released {
                events.push(Event::Free { reserve: *reserve });
            }
            !released
        });
    }

    /// Makes a buffer of `bytes` with `make` (the client call) and records it.
    pub fn made(&mut self, bytes: u64, make: impl FnOnce() -> Handle) -> Handle {
        self.before();
        let handle = make();
        self.events.push(Event::Reserve {
            bytes,
            persistent: self.persistent,
        });
        self.live.push((self.reserves, handle.clone()));
        self.reserves += 1;
        handle
    }

    /// Whether the allocations that follow are made in persistent mode
    /// (`ComputeClient::memory_persistent_allocation`).
    pub fn set_persistent(&mut self, persistent: bool) {
        self.persistent = persistent;
    }

    /// Records an explicit cleanup. Call it before the client's.
    pub fn cleanup(&mut self) {
        self.before();
        self.events.push(Event::Cleanup);
    }

    /// The recording so far (buffers still held stay held).
    pub fn trace(&mut self) -> Trace {
        self.before();
        Trace {
            events: self.events.clone(),
        }
    }
}

impl Trace {
    /// The trace of a heap recording ([`crate::heap::record`]) of a step
    /// run on the CPU, where each of Burn's tensor buffers is one heap
    /// block: each block made is a reservation of its size, each release
    /// of a block made while recording frees it. Releases of blocks made
    /// before the recording are not in the trace (the trace starts with
    /// what it made). A block `realloc` moves is a release and a new
    /// reservation.
    pub fn from_heap(events: &[HeapEvent]) -> Self {
        let mut out = Vec::with_capacity(events.len());
        let mut live: HashMap<usize, usize> = HashMap::new();
        let mut reserves = 0;
        for e in events {
            match *e {
                HeapEvent::Alloc { ptr, bytes } => {
                    out.push(Event::Reserve {
                        bytes,
                        persistent: false,
                    });
                    live.insert(ptr, reserves);
                    reserves += 1;
                }
                HeapEvent::Free { ptr, .. } => {
                    if let Some(reserve) = live.remove(&ptr) {
                        out.push(Event::Free { reserve });
                    }
                }
                HeapEvent::Cleanup => out.push(Event::Cleanup),
            }
        }
        Self { events: out }
    }
}
