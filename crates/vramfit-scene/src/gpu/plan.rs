//! Planning a scene fit into a device's memory ([`vramfit::plan::capacity`];
//! the variants in [`crate::plan`]): each variant is probed by whole
//! training steps of a random scene at the run's image size
//! ([`measure_step`]).

use cubecl::prelude::*;
use vramfit::plan::{Capacity, CapacityCalibration, Counted, Measured, Runnable, SIMULATED_OOM, Variant};
use vramfit::run::{Run, Start};

use super::engine::Renderer;
use super::memory::{MemoryCase, measure_step};
use crate::config::SceneConfig;
use crate::error::SceneError;
use crate::job::{Placement, SceneJob, launch};
use crate::plan::{Storage, variants};
use vramfit::plan::ProbeError;

/// A scene fit as the planner probes it.
pub struct ScenePlan<R: Runtime> {
    device: R::Device,
    width: usize,
    height: usize,
    degree: usize,
    wanted: usize,
    least: usize,
    allow_loss_db: Option<f64>,
    counts: Vec<usize>,
    variants: Vec<(Variant, Storage)>,
}

impl<R: Runtime> ScenePlan<R> {
    /// A fit of views `width` × `height` at SH degree `degree` wanting
    /// `wanted` Gaussians (seeded with `least`), probed at `counts` (none:
    /// a quarter, a half and all of `wanted`, within the device's largest
    /// buffer); lower degrees offered where their measured cost is within
    /// `allow_loss_db`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: &R::Device,
        width: usize,
        height: usize,
        degree: usize,
        wanted: usize,
        least: usize,
        allow_loss_db: Option<f64>,
        mut counts: Vec<usize>,
    ) -> Self {
        let largest = Renderer::<R>::new(device).largest_buffer();
        let variants = variants(degree, allow_loss_db, largest);
        if counts.is_empty() {
            // A quarter, a half and all of what the run may hold: the line
            // is measured where the plan is made, not extrapolated to it.
            let top = variants
                .iter()
                .map(|(v, _)| v.limit)
                .min()
                .unwrap_or(usize::MAX)
                .min(wanted)
                .max(1);
            counts = vec![top / 4, top / 2, top];
            counts.retain(|&c| c > 0);
            counts.dedup();
        }
        Self {
            device: device.clone(),
            width,
            height,
            degree,
            wanted,
            least,
            allow_loss_db,
            counts,
            variants,
        }
    }

    /// The SH degree the plan was asked for.
    pub fn degree(&self) -> usize {
        self.degree
    }

    /// The quality cost the user allows (dB), if any.
    pub fn allow_loss_db(&self) -> Option<f64> {
        self.allow_loss_db
    }

    /// Where a variant keeps the moments, how it stores the SH and which
    /// SH degree it fits.
    pub fn storage(&self, variant: &str) -> Option<Storage> {
        self.variants.iter().find(|(v, _)| v.name == variant).map(|(_, s)| *s)
    }
}

impl<R: Runtime> Capacity for ScenePlan<R> {
    fn knob(&self) -> String {
        "max_gaussians".into()
    }
    fn wanted(&self) -> usize {
        self.wanted
    }
    fn least(&self) -> usize {
        self.least
    }
    fn variants(&self) -> Vec<Variant> {
        self.variants.iter().map(|(v, _)| v.clone()).collect()
    }
    fn probe_counts(&self) -> Vec<usize> {
        self.counts.clone()
    }
    fn measure(&mut self, variant: &str, count: usize) -> Result<Measured, ProbeError> {
        let Storage { moments, sh, degree } = self
            .storage(variant)
            .ok_or_else(|| ProbeError::workload(format!("no variant named `{variant}`")))?;
        let started = std::time::Instant::now();
        let case = MemoryCase {
            gaussians: count,
            degree,
            width: self.width,
            height: self.height,
        };
        let m =
            measure_step::<R>(&self.device, &case, moments, sh, Default::default(), 3).map_err(ProbeError::workload)?;
        Ok(Measured {
            peak_bytes: m.reserved,
            step_peak_bytes: m.reserved,
            rest_peak_bytes: m.reserved,
            step_ms: m.step_ms,
            seconds: started.elapsed().as_secs_f64(),
            ..Measured::default()
        })
    }
}

/// A scene fit the planning pipeline runs ([`vramfit::plan::run_within`]):
/// its probes, and runs of a plan's settings through the run driver.
pub struct SceneTarget<R: Runtime> {
    plan: ScenePlan<R>,
    config: SceneConfig,
    placement: Box<dyn Fn() -> Placement>,
}

impl<R: Runtime> SceneTarget<R> {
    /// Plans `config` (its SH degree and `max_gaussians` are what the user
    /// asked for) on `device`, probing at `counts` Gaussians; runs are
    /// placed by `placement` (the same device).
    pub fn new(
        config: SceneConfig,
        device: &R::Device,
        allow_loss_db: Option<f64>,
        counts: Vec<usize>,
        placement: impl Fn() -> Placement + 'static,
    ) -> Result<Self, SceneError> {
        config.check()?;
        let data = config.dataset()?;
        let view = &data.views[0].camera;
        let seeded = data.points.len().clamp(1, config.max_gaussians);
        Ok(Self {
            plan: ScenePlan::new(
                device,
                view.width,
                view.height,
                config.sh_degree,
                config.max_gaussians,
                seeded,
                allow_loss_db,
                counts,
            ),
            config,
            placement: Box::new(placement),
        })
    }

    /// The probes' target.
    pub fn plan(&self) -> &ScenePlan<R> {
        &self.plan
    }
}

impl<R: Runtime> Runnable for SceneTarget<R> {
    type Strategy = CapacityCalibration;
    type Settings = SceneConfig;
    type Workload = SceneJob;
    type Error = SceneError;

    fn target(&mut self) -> &mut (dyn Capacity + 'static) {
        &mut self.plan
    }
    fn settings(&self, setting: &Counted) -> SceneConfig {
        let storage = self.plan.storage(&setting.variant).unwrap_or(Storage {
            moments: self.config.moments,
            sh: self.config.sh_storage,
            degree: self.config.sh_degree,
        });
        SceneConfig {
            max_gaussians: setting.count,
            moments: storage.moments,
            sh_storage: storage.sh,
            sh_degree: storage.degree,
            ..self.config.clone()
        }
    }
    fn to_toml(settings: &SceneConfig) -> String {
        settings.to_toml()
    }
    fn launch(&self, start: Start<SceneConfig>) -> Result<(Run, SceneJob), SceneError> {
        // A fallback starts from pools that hold nothing of the failed attempt.
        R::client(&self.plan.device).memory_cleanup();
        launch(start, (self.placement)())
    }
    fn simulated_oom(step: u64) -> SceneError {
        SceneError::DeviceStep {
            step,
            phase: "forward_backward",
            message: SIMULATED_OOM.into(),
        }
    }
}
