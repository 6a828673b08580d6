//! A device's allocation sequence, traced on shapes alone: a workload's
//! steps run on [`crate::shapes::Shapes`], which computes no values, so a
//! step of any size is traced in the time its operations take to describe.

use std::ops::ControlFlow;

use super::{Event, Trace};
use crate::run::{Event as RunEvent, Run, RunError, Workload};
use crate::shapes::{Allocation, ShapeTrace, Untraceable};

/// Why a trace on shapes failed.
#[derive(Debug, thiserror::Error)]
pub enum ShapeTraceError {
    /// The workload could not be built.
    #[error("the workload to trace could not be built: {0}")]
    Build(Box<dyn std::error::Error + Send + Sync>),
    /// The run failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The run ended before the steps to trace.
    #[error("the traced run ended before step {0}: build it for at least that many steps")]
    TooShort(u64),
    /// An operation cannot be traced without its values.
    #[error("this job cannot be traced on shapes: {0}")]
    Untraceable(#[from] Untraceable),
}

/// A workload's steps traced on shapes.
#[derive(Debug, Clone)]
pub struct ShapesTraced {
    /// The allocator's events, for [`super::replay`].
    pub trace: Trace,
    /// Operations described.
    pub operations: u64,
    /// Values read (each given zeros: the loss, an overflow check).
    pub reads: u64,
    /// The last traced step's kernels (with two steps or more; else the
    /// build's and the step's), for a roofline ([`super::Rates`]).
    pub step_work: Vec<crate::shapes::OpWork>,
}

impl From<ShapeTrace> for ShapesTraced {
    fn from(t: ShapeTrace) -> Self {
        let events = t
            .events
            .iter()
            .map(|a| match *a {
                Allocation::Reserve { bytes } => Event::Reserve {
                    bytes,
                    persistent: false,
                },
                Allocation::Free { reserve } => Event::Free { reserve },
                Allocation::Cleanup => Event::Cleanup,
            })
            .collect();
        Self {
            trace: Trace { events },
            operations: t.operations,
            reads: t.reads,
            step_work: t.work,
        }
    }
}

/// Builds a workload on the shape backend with `make` and runs its first
/// `steps` steps, recording every buffer the build and the steps reserve
/// and release; the run is stopped after step `steps`. `alignment`: the
/// device allocator's (a slice is a view where its ends fall on it: 512
/// on CUDA). The trace starts empty: the workload's parameters and state
/// are its first reservations, as on a device.
pub fn trace_shapes<W: Workload, E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    make: impl FnOnce() -> Result<(Run, W), E>,
    steps: u64,
    alignment: u64,
) -> Result<ShapesTraced, ShapeTraceError> {
    let mut recording = Some(crate::shapes::record(alignment));
    let (run, workload) = make().map_err(|e| ShapeTraceError::Build(e.into()))?;
    let mut traced = None;
    run.drive(workload, |event| match event {
        RunEvent::Step(r) if r.step >= steps => {
            traced = recording.take().map(|r| r.finish());
            ControlFlow::Break(())
        }
        RunEvent::Step(r) if r.step + 1 == steps => {
            // The last step's work alone.
            if let Some(recording) = &recording {
                recording.mark();
            }
            ControlFlow::Continue(())
        }
        _ => ControlFlow::Continue(()),
    })?;
    match traced {
        Some(t) => Ok(t?.into()),
        None => Err(ShapeTraceError::TooShort(steps)),
    }
}
