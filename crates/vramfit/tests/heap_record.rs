//! The heap recording behind `pools::trace_on_cpu`: the blocks made and
//! released in order, the filters, host blocks left out, one recording at
//! a time. One test function, alone in its binary: the recording is
//! process-wide.

use vramfit::heap::{Blocks, HeapEvent, HeapRecordError, off_device, record};
use vramfit::pools::{Event, TENSOR_BLOCKS, Trace};

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

#[test]
fn a_recording_keeps_the_tensor_like_blocks_in_order() {
    assert!(vramfit::heap::installed(), "the harness has allocated");
    let recording = record(TENSOR_BLOCKS, 1 << 16).unwrap();
    assert_eq!(record(TENSOR_BLOCKS, 16).unwrap_err(), HeapRecordError::Busy);
    let a = vec![1.0f32; 4096]; // 16 KiB, 4-aligned: kept
    let b = vec![1u64; 4096]; // 8-aligned: bookkeeping, left out
    let host = off_device(|| vec![2.0f32; 1000]); // host memory: left out
    let a_ptr = a.as_ptr() as usize;
    drop(a);
    vramfit::heap::cleanup_mark();
    let c = vec![3.0f32; 2048];
    let c_ptr = c.as_ptr() as usize;
    vramfit::heap::to_device(host.as_ptr().cast(), 4000);
    let host_ptr = host.as_ptr() as usize;
    drop(host);
    let events = recording.finish().unwrap();
    drop((b, c));
    let ours: Vec<HeapEvent> = events
        .iter()
        .copied()
        .filter(|e| match e {
            HeapEvent::Alloc { ptr, .. } | HeapEvent::Free { ptr, .. } => [a_ptr, c_ptr, host_ptr].contains(ptr),
            HeapEvent::Cleanup => true,
        })
        .collect();
    assert_eq!(
        ours,
        vec![
            HeapEvent::Alloc {
                ptr: a_ptr,
                bytes: 16384
            },
            HeapEvent::Free {
                ptr: a_ptr,
                bytes: 16384
            },
            HeapEvent::Cleanup,
            HeapEvent::Alloc {
                ptr: c_ptr,
                bytes: 8192
            },
            // The host vector taken as a device buffer: its earlier block
            // (never recorded) released first, then made.
            HeapEvent::Free {
                ptr: host_ptr,
                bytes: 4000
            },
            HeapEvent::Alloc {
                ptr: host_ptr,
                bytes: 4000
            },
            HeapEvent::Free {
                ptr: host_ptr,
                bytes: 4000
            },
        ],
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, HeapEvent::Alloc { bytes: 32768, .. })),
        "the 8-aligned block was left out: {events:?}"
    );
    // As a trace: the release of a block never made is dropped.
    let trace = Trace::from_heap(&ours);
    assert_eq!(
        trace.events,
        vec![
            Event::Reserve {
                bytes: 16384,
                persistent: false
            },
            Event::Free { reserve: 0 },
            Event::Cleanup,
            Event::Reserve {
                bytes: 8192,
                persistent: false
            },
            Event::Reserve {
                bytes: 4000,
                persistent: false
            },
            Event::Free { reserve: 2 },
        ]
    );
    // A room too small is an error, not a truncated trace.
    let small = record(
        Blocks {
            min_bytes: 1,
            aligns: usize::MAX,
        },
        2,
    )
    .unwrap();
    let many: Vec<Vec<u8>> = (0..8).map(|i| vec![i; 64]).collect();
    drop(many);
    assert_eq!(small.finish().unwrap_err(), HeapRecordError::Full(2));
}
