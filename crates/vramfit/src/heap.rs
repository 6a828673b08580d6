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
//! and, for [`record`], one relaxed load per allocation). They count the bytes asked for, not what the inner
//! allocator rounds them up to or keeps cached: the process's resident set
//! is reported beside them for that. The allocator path never allocates.
//!
//! [`record`] also keeps the order of allocations and releases (of blocks
//! at least a given size) for a while: on the CPU, Burn's tensor buffers
//! are such blocks, so a step run here gives the sequence a device's pools
//! would see ([`crate::pools::Trace::from_heap`]).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering};

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
            trace(ALLOC, p, layout.size(), layout.align());
        } else {
            failed(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size() as u64);
            trace(ALLOC, p, layout.size(), layout.align());
        } else {
            failed(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Recorded before the block goes, so that no other thread can be
        // handed the same address and record it first.
        trace(FREE, ptr, layout.size(), layout.align());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.dealloc(ptr, layout) };
        shrank(layout.size() as u64);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        trace(FREE, ptr, layout.size(), layout.align());
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if p.is_null() {
            // The old block stays: recorded again as made.
            trace(ALLOC, ptr, layout.size(), layout.align());
            failed(new_size);
        } else {
            trace(ALLOC, p, new_size, layout.align());
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

/// What runs when the inner allocator refuses a block ([`on_failure`]).
static ON_FAILURE: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Sets `hook` to run, once, with the size of the first allocation the
/// inner allocator refuses, before Rust's handler aborts the process
/// ("memory allocation of N bytes failed", no message a user can act on):
/// a run writes its `error.json` and exits with an error there
/// ([`crate::run::allocation_failure`]). The hook may allocate (a refused
/// large block leaves room for small ones); a hook that returns lets the
/// abort happen.
pub fn on_failure(hook: Option<fn(usize)>) {
    ON_FAILURE.store(hook.map_or(std::ptr::null_mut(), |h| h as *mut ()), Ordering::Release);
}

#[cold]
fn failed(bytes: usize) {
    let hook = ON_FAILURE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !hook.is_null() {
        // SAFETY: only `on_failure` stores here, and only `fn(usize)` pointers.
        let hook: fn(usize) = unsafe { std::mem::transmute::<*mut (), fn(usize)>(hook) };
        hook(bytes);
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

const ALLOC: u8 = 1;
const FREE: u8 = 2;
const CLEANUP: u8 = 3;

/// One slot of a recording; `kind` is written last (0: not yet written).
#[derive(Default)]
struct Slot {
    kind: AtomicU8,
    ptr: AtomicUsize,
    bytes: AtomicU64,
}

static RECORDING: AtomicBool = AtomicBool::new(false);
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static SLOTS: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
static CAPACITY: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
static MIN_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
static ALIGNS: AtomicUsize = AtomicUsize::new(0);
/// Open [`off_device`] scopes: blocks made inside are not recorded.
static OFF_DEVICE: AtomicUsize = AtomicUsize::new(0);

/// Records a block made or released, where the recording keeps it:
/// its size and alignment pass the recording's [`Blocks`], and a block made
/// is not inside an [`off_device`] scope.
#[inline]
fn trace(kind: u8, ptr: *mut u8, bytes: usize, align: usize) {
    // One relaxed load on every allocation while nothing records.
    if !RECORDING.load(Ordering::Relaxed)
        || bytes < MIN_BYTES.load(Ordering::Relaxed)
        || ALIGNS.load(Ordering::Relaxed) & align == 0
        || (kind == ALLOC && OFF_DEVICE.load(Ordering::Relaxed) > 0)
    {
        return;
    }
    push(kind, ptr, bytes);
}

/// Appends an event to the running recording, if there is one.
fn push(kind: u8, ptr: *mut u8, bytes: usize) {
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let slots = SLOTS.load(Ordering::SeqCst);
    if RECORDING.load(Ordering::SeqCst) && !slots.is_null() {
        let i = NEXT.fetch_add(1, Ordering::SeqCst);
        if i < CAPACITY.load(Ordering::SeqCst) {
            // SAFETY: `slots` points at `CAPACITY` slots that `HeapRecording`
            // frees only after `stop`, which waits until no writer is in
            // flight and no later one can see the pointer.
            let slot = unsafe { &*slots.add(i) };
            slot.ptr.store(ptr as usize, Ordering::Relaxed);
            slot.bytes.store(bytes as u64, Ordering::Relaxed);
            slot.kind.store(kind, Ordering::Release);
        }
    }
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
}

/// Runs `f` with the blocks it makes left out of a recording (their
/// releases, later, are then of blocks the recording never saw): for host
/// memory a device run would hold outside the device, such as Adam's
/// moments on the host and the gradients copied down to them. Releases
/// inside `f` are still recorded. Process-wide, as the recording is.
pub fn off_device<T>(f: impl FnOnce() -> T) -> T {
    struct Close;
    impl Drop for Close {
        fn drop(&mut self) {
            OFF_DEVICE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    OFF_DEVICE.fetch_add(1, Ordering::SeqCst);
    let _close = Close;
    f()
}

/// Records `bytes` at `ptr` as a block just made on the device, whatever
/// the block at that address was before (released first): for a host
/// vector that the CPU takes as a tensor without a copy where a device
/// would upload it into a new buffer.
pub fn to_device(ptr: *const u8, bytes: usize) {
    // Said on purpose: past the recording's filters and any host scope.
    push(FREE, ptr as *mut u8, bytes);
    push(ALLOC, ptr as *mut u8, bytes);
}

/// Records that the device's pools were told to give back what they do
/// not use (`Backend::memory_cleanup`), where a recording is running.
pub fn cleanup_mark() {
    push(CLEANUP, std::ptr::null_mut(), 0);
}

/// One block made or released while recording, in the order seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapEvent {
    /// A block of `bytes` at `ptr` was made.
    Alloc {
        /// Its address.
        ptr: usize,
        /// Its size.
        bytes: u64,
    },
    /// The block at `ptr` was released.
    Free {
        /// Its address.
        ptr: usize,
        /// Its size.
        bytes: u64,
    },
    /// The device's pools were cleaned ([`cleanup_mark`]).
    Cleanup,
}

/// Why a heap recording could not start or be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeapRecordError {
    /// No [`Counting`] allocator serves this process.
    #[error(
        "no counting allocator is installed: a heap recording needs vramfit::heap::Counting as the global allocator"
    )]
    NotInstalled,
    /// Another recording is running.
    #[error("a heap recording is already running in this process (one at a time)")]
    Busy,
    /// More events than the recording's room.
    #[error("the heap recording outgrew its room for {0} events: record fewer steps or raise the room")]
    Full(usize),
}

/// A running recording of the heap's blocks; process-wide (every
/// thread's blocks), one at a time.
pub struct HeapRecording {
    /// The slots (from `Box::into_raw`), shared with the allocator's
    /// writers through `SLOTS` until [`HeapRecording::stop`]; freed on drop.
    slots: std::ptr::NonNull<Slot>,
    room: usize,
    stopped: bool,
}

impl std::fmt::Debug for HeapRecording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapRecording").field("room", &self.room).finish()
    }
}

/// Which blocks a recording keeps, made and released (a release of a
/// block made before the recording or inside [`off_device`] is dropped
/// when read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocks {
    /// Blocks smaller than this are left out.
    pub min_bytes: usize,
    /// The alignments kept, one bit each (the bit of value `a` for
    /// alignment `a`, a power of two).
    pub aligns: usize,
}

/// Starts recording the `blocks` made and released (room for `room`
/// events, at least one, taken now, so that recording never allocates).
pub fn record(blocks: Blocks, room: usize) -> Result<HeapRecording, HeapRecordError> {
    if !installed() {
        return Err(HeapRecordError::NotInstalled);
    }
    let room = room.max(1);
    let slots: Box<[Slot]> = (0..room).map(|_| Slot::default()).collect();
    let raw = Box::into_raw(slots).cast::<Slot>();
    if SLOTS
        .compare_exchange(std::ptr::null_mut(), raw, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // SAFETY: `raw` came from `Box::into_raw` of `room` slots just above
        // and was never shared.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(raw, room)) });
        return Err(HeapRecordError::Busy);
    }
    CAPACITY.store(room, Ordering::SeqCst);
    NEXT.store(0, Ordering::SeqCst);
    MIN_BYTES.store(blocks.min_bytes.max(1), Ordering::SeqCst);
    ALIGNS.store(blocks.aligns, Ordering::SeqCst);
    RECORDING.store(true, Ordering::SeqCst);
    Ok(HeapRecording {
        slots: std::ptr::NonNull::new(raw).expect("Box::into_raw is never null"),
        room,
        stopped: false,
    })
}

impl HeapRecording {
    /// Stops and returns the events in the order they were recorded.
    pub fn finish(mut self) -> Result<Vec<HeapEvent>, HeapRecordError> {
        let used = self.stop();
        if used > self.room {
            return Err(HeapRecordError::Full(self.room));
        }
        // SAFETY: stopped: no writer is in a slot or can reach one, and the
        // slots live until `self` is dropped.
        let slots = unsafe { std::slice::from_raw_parts(self.slots.as_ptr(), used) };
        Ok(slots
            .iter()
            .filter_map(|s| {
                let kind = s.kind.load(Ordering::Acquire);
                let (ptr, bytes) = (s.ptr.load(Ordering::Relaxed), s.bytes.load(Ordering::Relaxed));
                match kind {
                    ALLOC => Some(HeapEvent::Alloc { ptr, bytes }),
                    FREE => Some(HeapEvent::Free { ptr, bytes }),
                    CLEANUP => Some(HeapEvent::Cleanup),
                    _ => None,
                }
            })
            .collect())
    }

    /// Stops recording (once) and waits out writers still in a slot;
    /// returns how many slots were claimed.
    fn stop(&mut self) -> usize {
        if self.stopped {
            return 0;
        }
        RECORDING.store(false, Ordering::SeqCst);
        while IN_FLIGHT.load(Ordering::SeqCst) > 0 {
            std::hint::spin_loop();
        }
        let used = NEXT.load(Ordering::SeqCst);
        MIN_BYTES.store(usize::MAX, Ordering::SeqCst);
        // This recording owns `SLOTS` (taken by compare-exchange in `record`).
        SLOTS.store(std::ptr::null_mut(), Ordering::SeqCst);
        self.stopped = true;
        used
    }
}

impl Drop for HeapRecording {
    fn drop(&mut self) {
        self.stop();
        // SAFETY: from `Box::into_raw` of `room` slots in `record`; after
        // `stop` no writer can reach them.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.slots.as_ptr(), self.room)) });
    }
}
