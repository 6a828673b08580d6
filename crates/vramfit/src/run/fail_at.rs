//! A test seam: a workload whose step number `step` fails as a device
//! would, so that the driver's failure paths are tested without one.

use super::ArrayFile;
use super::workload::{Cadence, Finished, RunStats, StepRecord, Workload};
use crate::profile::{Accounted, MemoryReport, MemorySource, NamedTensor};
use crate::step::{DeviceFailure, StepObserver};

/// A test seam: `inner` whose step number `step` fails with the error that
/// `fail` makes (for example a device error in cubecl's out-of-memory
/// words), so that the driver's failure paths can be tested without a
/// device that fails. Everything else is `inner`'s.
pub struct FailAt<W: Workload> {
    /// The workload.
    pub inner: W,
    /// The step that fails (1-based).
    pub step: u64,
    /// Makes the error for that step.
    pub fail: fn(u64) -> W::Error,
}

impl<W: Workload> Workload for FailAt<W> {
    type Summary = W::Summary;
    type Error = W::Error;

    fn checkpoint_kind(&self) -> &'static str {
        self.inner.checkpoint_kind()
    }
    fn resumable(&self) -> super::Resumable {
        self.inner.resumable()
    }
    fn cadence(&self) -> Cadence {
        self.inner.cadence()
    }
    fn memory_source(&self) -> Box<dyn MemorySource> {
        self.inner.memory_source()
    }
    fn steps_done(&self) -> u64 {
        self.inner.steps_done()
    }
    fn total_steps(&self) -> u64 {
        self.inner.total_steps()
    }
    fn finished(&self) -> bool {
        self.inner.finished()
    }
    fn accounted(&self) -> Accounted {
        self.inner.accounted()
    }
    fn step(&mut self, observer: &mut dyn StepObserver) -> Result<StepRecord, W::Error> {
        let next = self.inner.steps_done() + 1;
        if next == self.step {
            return Err((self.fail)(next));
        }
        self.inner.step(observer)
    }
    fn snapshot(&self) -> Result<ArrayFile, W::Error> {
        self.inner.snapshot()
    }
    fn restore(&mut self, file: &ArrayFile) -> Result<(), W::Error> {
        self.inner.restore(file)
    }
    fn tensors(&self) -> Vec<NamedTensor> {
        self.inner.tensors()
    }
    fn advice(&self, report: &MemoryReport) -> Vec<String> {
        self.inner.advice(report)
    }
    fn device_failure(error: &W::Error) -> Option<DeviceFailure> {
        W::device_failure(error)
    }
    fn finish(&mut self, stats: &RunStats) -> Result<Finished<W::Summary>, W::Error> {
        self.inner.finish(stats)
    }
}
