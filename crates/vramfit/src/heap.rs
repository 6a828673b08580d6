//! A counting global allocator: the exact heap bytes in use and their
//! high-water mark, for backends whose tensors live on the heap (the CPU).
//! There the heap is what runs out, so its peak is the figure that decides
//! an out-of-memory, as PyTorch's `memory_allocated` / `max_memory_allocated`
//! are on CUDA.
//!
//! A binary opts in by wrapping its allocator:
//!
//! ```
//! #[global_allocator]
//! static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);
//! # fn main() {
//! let before = vramfit::heap::current();
//! let v = vec![0u8; 1 << 20];
//! assert!(vramfit::heap::installed());
//! assert!(vramfit::heap::current() >= before + (1 << 20));
//! # drop(v);
//! # }
//! ```
//!
//! The counters are process-wide atomics (two relaxed read-modify-writes
//! per allocation). They count the bytes asked for, not what the inner
//! allocator rounds them up to or keeps cached: the process's resident set
//! is reported beside them for that. This module must not allocate.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static CURRENT: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Wraps a global allocator and counts the bytes it hands out.
#[derive(Debug, Default)]
pub struct Counting<A>(pub A);

#[inline]
fn grew(bytes: u64) {
    let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

#[inline]
fn shrank(bytes: u64) {
    CURRENT.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the inner allocator; the
// wrapper only updates counters and never touches the memory.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            grew(layout.size() as u64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size() as u64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.dealloc(ptr, layout) };
        shrank(layout.size() as u64);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // The live bytes change by the difference. (Where the inner
            // allocator moves the block, both copies exist for a moment; that
            // moment is not counted.)
            let old = layout.size() as u64;
            match (new_size as u64).checked_sub(old) {
                Some(more) => grew(more),
                None => shrank(old - new_size as u64),
            }
        }
        p
    }
}

/// True once a [`Counting`] allocator has served an allocation in this
/// process (a binary or test that did not install one reads false).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Heap bytes in use now.
pub fn current() -> u64 {
    CURRENT.load(Ordering::Relaxed)
}

/// The largest heap bytes in use since the process started or the last
/// [`take_peak`].
pub fn peak() -> u64 {
    PEAK.load(Ordering::Relaxed).max(current())
}

/// Returns the high-water mark since the last call (or the start) and
/// starts a new window at the bytes in use now.
pub fn take_peak() -> u64 {
    let now = current();
    PEAK.swap(now, Ordering::Relaxed).max(now)
}
