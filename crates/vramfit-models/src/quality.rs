//! A budgeted run that nothing fits at the quality it asks for: the
//! family's quality knob ([`crate::family::ModelSettings::quality_knob`]:
//! frames, an image's size, tokens) lowered as little as it must, each
//! value tried by the planner's own probes on the device
//! ([`vramfit::plan::Strategy::calibrate`], then whether any plan fits the
//! budget). Only after every exact knob: a value is tried only where the
//! planner found no plan at the asked one, and the run then plans every
//! exact knob at the value found. `keep_quality` forbids it.

use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::quality::GivenUp;
use vramfit::plan::{Runnable, Strategy};
use vramfit::profile::DeviceMemory;

use crate::config::FamilyConfig;
use crate::family::Family;
use crate::job::TrainError;
use crate::plan::FamilyTarget;

/// The settings at the largest value of the quality knob at which a plan
/// fits `budget` bytes of the device's deciding figure, and what was given
/// up; `None` where the run keeps its quality, the family has no knob, or
/// not even its smallest value fits. `target` builds the planner's target
/// for settings (with the probes' slicing the run asked for).
pub fn within_budget<B, F, const D: usize>(
    config: &FamilyConfig<F>,
    budget: u64,
    mut target: impl FnMut(FamilyConfig<F>) -> Result<FamilyTarget<B, F, D>, TrainError>,
) -> Result<Option<(FamilyConfig<F>, GivenUp)>, TrainError>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    F: Family<D>,
{
    let knob = match config.model.quality_knob(&config.task) {
        Some(k) if !config.keep_quality && !k.lower.is_empty() => k,
        _ => return Ok(None),
    };
    let at = |value: usize| F::with_quality(&config.task, value).map(|task| FamilyConfig { task, ..config.clone() });
    let given = knob.largest(|value| -> Result<bool, TrainError> {
        let Some(settings) = at(value) else {
            return Ok(false);
        };
        let mut t = target(settings)?;
        // A probe that fails (out of memory at the probes' own sizes) is
        // a value that does not fit.
        Ok(
            <FamilyTarget<B, F, D> as Runnable>::Strategy::calibrate(t.target(), None)
                .is_ok_and(|cal| cal.choose(budget).is_ok()),
        )
    })?;
    Ok(given.map(|g| (at(g.planned).expect("tried above"), g)))
}
