//! A recorded sequence of reservations and releases, replayed through
//! CubeCL's memory management for a card.

use std::collections::HashMap;
use std::sync::Arc;

use cubecl_ir::MemoryDeviceProperties;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, MemoryConfiguration, MemoryManagement, MemoryManagementOptions,
};
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use serde::{Deserialize, Serialize};

use super::Allocator;

/// One thing the allocator was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Event {
    /// A buffer of `bytes` (as asked for, before the runtime's alignment),
    /// in the persistent pool when `persistent` (exact-size allocations).
    Reserve {
        /// Bytes asked for.
        bytes: u64,
        /// Made in persistent mode.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        persistent: bool,
    },
    /// The last handle of the `reserve`-th reservation (0-based) went.
    Free {
        /// Which reservation.
        reserve: usize,
    },
    /// An explicit cleanup: pages holding nothing are given back.
    Cleanup,
}

/// A recorded step (or several): the events in the order the allocator saw
/// them. Reservations still held at the end are simply never freed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// In order.
    pub events: Vec<Event>,
}

impl Trace {
    /// Reservations in the trace.
    pub fn reserves(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Reserve { .. }))
            .count()
    }

    /// The largest number of bytes held at once, as asked for (no
    /// alignment, no pages): the floor under any allocator's figure.
    pub fn in_use_peak(&self) -> u64 {
        let mut sizes = Vec::new();
        let (mut now, mut peak) = (0u64, 0u64);
        for e in &self.events {
            match *e {
                Event::Reserve { bytes, .. } => {
                    sizes.push(bytes);
                    now += bytes;
                    peak = peak.max(now);
                }
                Event::Free { reserve } => now -= sizes.get(reserve).copied().unwrap_or(0),
                Event::Cleanup => {}
            }
        }
        peak
    }
}

/// What a replay gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replayed {
    /// The storage's high-water mark: the most bytes the card's pools held
    /// from the device at once. The figure that decides an out-of-memory.
    pub reserved_peak: u64,
    /// What the pools held at the end.
    pub reserved_end: u64,
    /// The most bytes in use at once, aligned as the card aligns them.
    pub in_use_peak: u64,
}

/// A trace the card's allocator cannot replay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// One buffer is larger than any page the card's pools make (CubeCL
    /// answers `BufferTooBig`: on the card the run fails).
    #[error("one buffer of {bytes} bytes is larger than the card's largest page ({largest} bytes)")]
    BufferTooBig {
        /// The buffer.
        bytes: u64,
        /// The largest page.
        largest: u64,
    },
    /// The trace frees what it never reserved or frees twice.
    #[error("event {event} frees reservation {reserve}, which is not held")]
    BadFree {
        /// Its position.
        event: usize,
        /// The reservation it names.
        reserve: usize,
    },
}

/// Storage that hands out ids and holds no memory, counting what a real
/// one would hold.
#[derive(Debug, Default)]
struct NullStorage {
    alignment: usize,
    sizes: HashMap<StorageId, u64>,
    now: u64,
    peak: u64,
}

impl ComputeStorage for NullStorage {
    type Resource = ();

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn get(&mut self, _handle: &StorageHandle) -> Self::Resource {}

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let id = StorageId::new();
        self.sizes.insert(id, size);
        self.now += size;
        self.peak = self.peak.max(self.now);
        Ok(StorageHandle::new(id, StorageUtilization { offset: 0, size }))
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.sizes.remove(&id) {
            self.now -= size;
        }
    }

    fn flush(&mut self) {}
}

/// Replays `trace` through the memory management a CubeCL client with
/// `allocator`'s properties makes (the default `SubSlices` pools), and
/// reads its storage's high-water mark.
pub fn replay(trace: &Trace, allocator: &Allocator) -> Result<Replayed, ReplayError> {
    let properties = MemoryDeviceProperties {
        max_page_size: allocator.max_page_size,
        alignment: allocator.alignment,
    };
    let storage = NullStorage {
        alignment: allocator.alignment as usize,
        ..Default::default()
    };
    let mut memory = MemoryManagement::from_configuration(
        storage,
        &properties,
        MemoryConfiguration::SubSlices,
        Arc::new(ServerLogger::default()),
        MemoryManagementOptions::new("vramfit replay").mode(MemoryAllocationMode::Auto),
    );
    let mut held: Vec<Option<(ManagedMemoryHandle, u64)>> = Vec::new();
    let (mut in_use, mut in_use_peak) = (0u64, 0u64);
    for (at, event) in trace.events.iter().enumerate() {
        match *event {
            Event::Reserve { bytes, persistent } => {
                let size = bytes.next_multiple_of(allocator.alignment.max(1));
                memory.mode(if persistent {
                    MemoryAllocationMode::Persistent
                } else {
                    MemoryAllocationMode::Auto
                });
                let handle = memory.reserve(size).map_err(|e| match e {
                    IoError::BufferTooBig { .. } => ReplayError::BufferTooBig {
                        bytes: size,
                        largest: allocator.max_page_size,
                    },
                    // The null storage never fails; any other error is a
                    // cubecl invariant broken by the trace itself.
                    other => panic!("replaying event {at}: {other}"),
                })?;
                held.push(Some((handle, size)));
                in_use += size;
                in_use_peak = in_use_peak.max(in_use);
            }
            Event::Free { reserve } => match held.get_mut(reserve).and_then(Option::take) {
                Some((handle, size)) => {
                    drop(handle);
                    in_use -= size;
                }
                None => return Err(ReplayError::BadFree { event: at, reserve }),
            },
            Event::Cleanup => memory.cleanup(true),
        }
    }
    let storage = memory.storage();
    Ok(Replayed {
        reserved_peak: storage.peak,
        reserved_end: storage.now,
        in_use_peak,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn reserve(bytes: u64) -> Event {
        Event::Reserve {
            bytes,
            persistent: false,
        }
    }

    /// A CUDA card of 16 GiB: pools of 16, 64, 256 MiB, 1 and 4 GiB pages
    /// (slices up to 1, 8, 64, 512 MiB and 4 GiB). What cubecl's own code
    /// does with a few buffers, checked against those rules by hand.
    #[test]
    fn a_card_reserves_whole_pages() {
        let card = Allocator::cuda(16 << 30);
        let one = |bytes| {
            replay(
                &Trace {
                    events: vec![reserve(bytes)],
                },
                &card,
            )
            .unwrap()
            .reserved_peak
        };
        assert_eq!(one(1000), 16 * MIB);
        assert_eq!(one(2 * MIB), 64 * MIB);
        assert_eq!(one(100 * MIB), 1024 * MIB);
        assert_eq!(one(600 * MIB), 4096 * MIB);
        // A buffer within 20 % of a page takes the page's pool.
        assert_eq!(one(15 * MIB), 16 * MIB);
        assert!(matches!(
            replay(
                &Trace {
                    events: vec![reserve(5 << 30)]
                },
                &card
            ),
            Err(ReplayError::BufferTooBig { .. })
        ));
    }

    #[test]
    fn freed_slices_are_reused_and_cleanup_returns_pages() {
        let card = Allocator::cuda(16 << 30);
        let events = vec![
            reserve(4 * MIB),
            Event::Free { reserve: 0 },
            reserve(4 * MIB),
            reserve(4 * MIB),
        ];
        let r = replay(&Trace { events: events.clone() }, &card).unwrap();
        assert_eq!((r.reserved_peak, r.in_use_peak), (64 * MIB, 8 * MIB));
        let mut more = events;
        more.extend([Event::Free { reserve: 1 }, Event::Free { reserve: 2 }, Event::Cleanup]);
        let r = replay(&Trace { events: more }, &card).unwrap();
        assert_eq!((r.reserved_peak, r.reserved_end), (64 * MIB, 0));
        let bad = Trace {
            events: vec![reserve(1), Event::Free { reserve: 0 }, Event::Free { reserve: 0 }],
        };
        assert_eq!(replay(&bad, &card), Err(ReplayError::BadFree { event: 2, reserve: 0 }));
    }

    #[test]
    fn persistent_reservations_are_exact_and_reused_by_size() {
        let card = Allocator::cuda(16 << 30);
        let p = |bytes| Event::Reserve {
            bytes,
            persistent: true,
        };
        let events = vec![p(3 * MIB + 1), Event::Free { reserve: 0 }, p(3 * MIB + 1), p(5 * MIB)];
        let r = replay(&Trace { events }, &card).unwrap();
        assert_eq!(r.reserved_peak, (3 * MIB + 512) + 5 * MIB);
    }

    #[test]
    fn traces_read_back_from_json() {
        let t = Trace {
            events: vec![
                reserve(8),
                Event::Reserve {
                    bytes: 4,
                    persistent: true,
                },
                Event::Free { reserve: 0 },
                Event::Cleanup,
            ],
        };
        let text = serde_json::to_string(&t).unwrap();
        assert!(text.contains(r#"{"op":"reserve","bytes":8}"#), "{text}");
        assert_eq!(serde_json::from_str::<Trace>(&text).unwrap(), t);
        assert_eq!(t.in_use_peak(), 12);
    }
}
