//! A probe is a short run of the real workload through the one run driver,
//! in a throw-away directory: the same step, profiler, checkpoint and final
//! files as a real run, so its peak is the peak a run would reach.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::Measured;
use crate::run::{Run, RunPath, Workload};

static PROBES: AtomicU64 = AtomicU64::new(0);

/// Drives `workload` (built for a few steps) to its end in a temporary run
/// directory and returns its OOM-deciding peak and median step time.
pub fn measure_run<W: Workload>(workload: W) -> Result<Measured, String> {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!(
        "vramfit-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let run = Run::create(&RunPath::At(dir.clone()), "", "probe").map_err(|e| e.to_string())?;
        let summary = run
            .drive(workload, |_| ControlFlow::Continue(()))
            .map_err(|e| e.to_string())?
            .ok_or("the probe stopped before its end")?;
        let peak = summary.peak_memory_bytes.ok_or_else(|| {
            format!(
                "this backend measures no figure that decides an out-of-memory ({}); on the CPU, install \
                 vramfit::heap::Counting as the global allocator",
                summary.peak_memory_source
            )
        })?;
        Ok(Measured {
            peak_bytes: peak,
            step_ms: summary.median_step_ms,
            seconds: started.elapsed().as_secs_f64(),
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
