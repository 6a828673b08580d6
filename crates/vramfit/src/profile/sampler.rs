//! Samples the allocator from a background thread, so that the peak inside
//! a phase is seen, not only the figures at phase boundaries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::source::MemorySource;

/// A running sampler; stops when dropped.
pub struct PeakSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeakSampler {
    /// Starts sampling `source` every `interval`; `None` when the source
    /// has no readings (nothing to sample).
    pub fn start(source: Arc<dyn MemorySource>, interval: Duration) -> Option<Self> {
        let first = source.read()?;
        let peak = Arc::new(AtomicU64::new(first.allocated));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("vramfit-peak-sampler".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if let Some(r) = source.read() {
                        p.fetch_max(r.allocated, Ordering::Relaxed);
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

    /// The largest allocated figure since the last call, then starts a new
    /// window at `current`.
    pub fn take(&self, current: u64) -> u64 {
        self.peak.swap(current, Ordering::Relaxed).max(current)
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
