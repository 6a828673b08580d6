//! Samples the allocator from a background thread, so that the peak inside
//! a phase is seen, not only the figures at phase boundaries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::reading::{MemoryReading, Peaks};
use super::source::MemorySource;

#[derive(Default)]
struct AtomicPeaks {
    allocated: AtomicU64,
    reserved: AtomicU64,
    /// 0 = no driver figure seen.
    driver: AtomicU64,
}

impl AtomicPeaks {
    fn see(&self, r: &MemoryReading) {
        self.allocated.fetch_max(r.allocated, Ordering::Relaxed);
        self.reserved.fetch_max(r.reserved, Ordering::Relaxed);
        if let Some(d) = r.driver {
            self.driver.fetch_max(d, Ordering::Relaxed);
        }
    }

    fn reset_to(&self, r: &MemoryReading) -> Peaks {
        let driver = self
            .driver
            .swap(r.driver.unwrap_or(0), Ordering::Relaxed)
            .max(r.driver.unwrap_or(0));
        Peaks {
            allocated: self.allocated.swap(r.allocated, Ordering::Relaxed).max(r.allocated),
            reserved: self.reserved.swap(r.reserved, Ordering::Relaxed).max(r.reserved),
            driver: (driver > 0).then_some(driver),
        }
    }
}

/// A running sampler; stops when dropped.
pub struct PeakSampler {
    peak: Arc<AtomicPeaks>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeakSampler {
    /// Starts sampling `source` every `interval`; `None` when the source
    /// has no readings (nothing to sample).
    pub fn start(source: Arc<dyn MemorySource>, interval: Duration) -> Option<Self> {
        let first = source.read()?;
        let peak = Arc::new(AtomicPeaks::default());
        peak.see(&first);
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("vramfit-peak-sampler".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if let Some(r) = source.read() {
                        p.see(&r);
                    }
                    std::thread::sleep(interval);
                }
            })
            .ok()?;
        Some(Self {
            peak,
            stop,
            thread: Some(thread),
        })
    }

    /// The largest figures since the last call (`current` included), then
    /// starts a new window at `current`.
    pub fn take(&self, current: &MemoryReading) -> Peaks {
        self.peak.reset_to(current)
    }
}

impl Drop for PeakSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
