//! Samples the allocator from a background thread, so that the peak inside
//! a phase is seen, not only the figures at phase boundaries.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::reading::{MemoryReading, Peaks};
use super::source::MemorySource;

/// The largest figures of the current window, and which window it is. A
/// reading is applied only to the window it was started in: a read begun
/// before a phase's record and finished after it belongs to that phase,
/// not to the next (a spike a sample caught just before a record was
/// otherwise counted in the next phase too: found by the sampler's unit
/// test under load).
#[derive(Default)]
struct Window {
    epoch: u64,
    allocated: u64,
    reserved: u64,
    /// 0 = no driver figure seen.
    driver: u64,
}

#[derive(Default)]
struct SharedPeaks(Mutex<Window>);

impl SharedPeaks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The window a read starting now belongs to.
    fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Takes `r` into the window `epoch`, if it is still the current one.
    fn see(&self, epoch: u64, r: &MemoryReading) {
        let mut w = self.lock();
        if w.epoch != epoch {
            return;
        }
        w.allocated = w.allocated.max(r.allocated);
        w.reserved = w.reserved.max(r.reserved);
        w.driver = w.driver.max(r.driver.unwrap_or(0));
    }

    fn reset_to(&self, r: &MemoryReading) -> Peaks {
        let mut w = self.lock();
        let driver = w.driver.max(r.driver.unwrap_or(0));
        let peaks = Peaks {
            allocated: w.allocated.max(r.allocated),
            reserved: w.reserved.max(r.reserved),
            driver: (driver > 0).then_some(driver),
        };
        *w = Window {
            epoch: w.epoch + 1,
            allocated: r.allocated,
            reserved: r.reserved,
            driver: r.driver.unwrap_or(0),
        };
        peaks
    }
}

/// A running sampler; stops when dropped.
pub struct PeakSampler {
    peak: Arc<SharedPeaks>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeakSampler {
    /// Starts sampling `source` every `interval`; `None` when the source
    /// has no readings (nothing to sample).
    pub fn start(source: Arc<dyn MemorySource>, interval: Duration) -> Option<Self> {
        let first = source.read()?;
        let peak = Arc::new(SharedPeaks::default());
        peak.see(0, &first);
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("vramfit-peak-sampler".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let epoch = p.epoch();
                    if let Some(r) = source.read() {
                        p.see(epoch, &r);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(allocated: u64) -> MemoryReading {
        MemoryReading {
            allocated,
            reserved: 2 * allocated,
            driver: None,
        }
    }

    /// A reading started in one window and finished after the record that
    /// closed it is not counted in the next window; one started in the
    /// current window is.
    #[test]
    fn a_reading_counts_only_in_the_window_it_was_started_in() {
        let peaks = SharedPeaks::default();
        peaks.see(peaks.epoch(), &reading(100));
        let started = peaks.epoch();
        let closed = peaks.reset_to(&reading(10));
        assert_eq!((closed.allocated, closed.reserved), (100, 200));
        peaks.see(started, &reading(5_000)); // read before the record, applied after
        peaks.see(peaks.epoch(), &reading(30));
        let next = peaks.reset_to(&reading(20));
        assert_eq!((next.allocated, next.reserved, next.driver), (30, 60, None));
    }
}
