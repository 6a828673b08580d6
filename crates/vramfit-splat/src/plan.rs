//! The splat fit for the planner ([`vramfit::plan::ladder`]): its one
//! memory knob is the band height of the GPU's banded render, loss and
//! backward (`band_rows`); probes are short fits of the real image through
//! the run driver; a planned fit falls back to a lower band on an
//! out-of-memory and resumes from its last checkpoint.
//!
//! What is not a knob, and why: the Gaussians are all on the device at
//! once. Their parameters, gradients, Adam moments, projections and
//! gradient accumulator take about 200 bytes each, 6 MB for 30,000,
//! against 142 MiB of band scratch at 8K; the tile lists grow with the
//! band. The CPU path renders the whole image at once: it has one plan.

use std::ops::ControlFlow;

use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{Ladder, Measured, Planned, PlannedRun, measure_run};
use vramfit::run::{Event, RunError, RunPath};

use crate::SplatError;
use crate::config::FitConfig;
use crate::job::{Splat, Summary, launch, load_image};
use crate::op::{FusedLoss, SplatBackend};

/// Steps of one probe (the first compiles and warms up; the median is of the rest).
pub const PROBE_STEPS: u64 = 3;

/// The fit with settings `base`, to be planned on `device`.
pub struct SplatTarget<B: AutodiffBackend> {
    base: FitConfig,
    width: usize,
    height: usize,
    device: B::Device,
}

impl<B> SplatTarget<B>
where
    B: AutodiffBackend + SplatBackend,
    B::InnerBackend: FusedLoss,
{
    /// Reads the image and checks the settings.
    pub fn new(base: FitConfig, device: &B::Device) -> Result<Self, SplatError> {
        let picture = load_image(&base.image)?;
        base.validate(picture.width * picture.height)?;
        Ok(Self {
            base,
            width: picture.width,
            height: picture.height,
            device: device.clone(),
        })
    }
}

/// The settings of `base` with the band height `band_rows`.
pub fn apply(base: &FitConfig, band_rows: usize) -> FitConfig {
    FitConfig {
        band_rows,
        ..base.clone()
    }
}

impl<B> Ladder for SplatTarget<B>
where
    B: AutodiffBackend + SplatBackend,
    B::InnerBackend: FusedLoss,
{
    fn knob(&self) -> String {
        "band_rows".into()
    }

    fn rungs(&self) -> Vec<usize> {
        <B::InnerBackend as FusedLoss>::fused_band_rungs(self.width, self.height)
    }

    fn measure(&mut self, band_rows: usize) -> Result<Measured, String> {
        // Each probe starts from pools that hold nothing of the previous one.
        B::memory_cleanup(&self.device);
        let config = FitConfig {
            steps: PROBE_STEPS,
            // Every Gaussian from the first step: the run's most.
            progressive: false,
            log_every: 1,
            profile_every: 1,
            frame_every: 0,
            // Checkpoint writes count towards the peak: probed when the run makes them.
            checkpoint_every: if self.base.checkpoint_every > 0 { 2 } else { 0 },
            ..apply(&self.base, band_rows)
        };
        let workload = Splat::<B>::new(config, &self.device).map_err(|e| e.to_string())?;
        let measured = measure_run(workload);
        B::memory_cleanup(&self.device);
        measured
    }
}

/// Runs `plans[0]` into `out` with `plan` as `plan.json`, falling back to
/// the next plans on an out-of-memory ([`PlannedRun`]). `simulate_oom_at`
/// makes plan 0 fail at that step (a test seam).
pub fn run_planned<B>(
    plans: &[FitConfig],
    out: RunPath,
    plan: &serde_json::Value,
    device: &B::Device,
    device_name: &str,
    simulate_oom_at: Option<u64>,
    observe: impl FnMut(Event) -> ControlFlow<()>,
) -> Result<Planned<Summary>, SplatError>
where
    B: AutodiffBackend + SplatBackend,
    B::InnerBackend: FusedLoss,
{
    PlannedRun {
        plans,
        to_toml: FitConfig::to_toml,
        out,
        record: plan.clone(),
        simulate_oom_at,
        oom: |step| SplatError::Device {
            step,
            phase: "forward_backward",
            message: "simulated: out of memory (the planner's fallback test seam)".into(),
        },
    }
    .run(
        |start| launch::<B>(start, device, device_name),
        |e| matches!(e, SplatError::Run(RunError::OutOfMemory(_))),
        observe,
    )
}
