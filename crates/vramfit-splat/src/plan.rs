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

use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{Ladder, LadderCalibration, Measured, Runnable, SIMULATED_OOM, run_probe};
use vramfit::run::{Run, Start};

use crate::SplatError;
use crate::config::FitConfig;
use crate::job::{Splat, launch, load_image};
use crate::op::{FusedLoss, SplatBackend};
use vramfit::plan::ProbeError;

/// The fit with settings `base`, to be planned on `device`.
pub struct SplatTarget<B: AutodiffBackend> {
    base: FitConfig,
    width: usize,
    height: usize,
    device: B::Device,
    device_name: String,
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
            device_name: B::name(device),
        })
    }

    /// The device as a planned run's directory and `plan.json` name it.
    pub fn with_device_name(mut self, name: &str) -> Self {
        self.device_name = name.into();
        self
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

    fn describe(&self, band_rows: usize) -> String {
        match band_rows {
            // The only rung where the device has no banded render (the CPU).
            0 if self.rungs() == [0] => "band_rows 0 (the whole image at once)".into(),
            0 => "band_rows 0 (the default band)".into(),
            rows => format!("band_rows {rows}"),
        }
    }

    fn measure(&mut self, band_rows: usize) -> Result<Measured, ProbeError> {
        run_probe::<B, _, _>(&self.device, |steps| {
            let config = FitConfig {
                steps,
                // Every Gaussian from the first step: the run's most.
                progressive: false,
                log_every: 1,
                profile_every: 1,
                frame_every: 0,
                // Checkpoint writes count towards the peak: probed when the run makes them.
                checkpoint_every: if self.base.checkpoint_every > 0 { 2 } else { 0 },
                ..apply(&self.base, band_rows)
            };
            Splat::<B>::new(config, &self.device)
        })
    }
}

/// A planned fit: a rung's settings are the base's with that band height;
/// a fallback rewrites `config.toml` and resumes from the last checkpoint.
impl<B> Runnable for SplatTarget<B>
where
    B: AutodiffBackend + SplatBackend,
    B::InnerBackend: FusedLoss,
{
    type Strategy = LadderCalibration;
    type Settings = FitConfig;
    type Workload = Splat<B>;
    type Error = SplatError;

    fn target(&mut self) -> &mut (dyn Ladder + 'static) {
        self
    }
    fn settings(&self, band_rows: &usize) -> FitConfig {
        apply(&self.base, *band_rows)
    }
    fn to_toml(settings: &FitConfig) -> String {
        settings.to_toml()
    }
    fn launch(&self, start: Start<FitConfig>) -> Result<(Run, Splat<B>), SplatError> {
        // A fallback starts from pools that hold nothing of the failed attempt.
        B::memory_cleanup(&self.device);
        launch::<B>(start, &self.device, &self.device_name)
    }
    fn simulated_oom(step: u64) -> SplatError {
        SplatError::Device {
            step,
            phase: "forward_backward",
            message: SIMULATED_OOM.into(),
        }
    }
}
