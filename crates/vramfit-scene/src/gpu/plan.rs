//! Planning a scene fit into a device's memory ([`vramfit::plan::capacity`];
//! the variants in [`crate::plan`]): each variant is probed by whole
//! training steps of a random scene at the run's image size
//! ([`measure_step`]).

use cubecl::prelude::*;
use vramfit::plan::{Capacity, CapacityCalibration, Counted, Measured, Runnable, SIMULATED_OOM, Variant};
use vramfit::run::{Run, Start};

use super::engine::Renderer;
use super::memory::{MemoryCase, trace_step};
use crate::config::SceneConfig;
use crate::error::SceneError;
use crate::job::{Placement, SceneJob, launch};
use crate::plan::{Storage, variants};
use vramfit::plan::ProbeError;
use vramfit::pools::{Card, Trace, TraceLaw, replay};
use vramfit::profile::human_bytes;

/// The most Gaussians a card row reports: the kernels index a group's
/// buffer with 32-bit words, so the widest group (the SH rest at degree 3,
/// 45 floats a Gaussian) bounds the count.
fn indexable(degree: usize) -> usize {
    let widest = crate::cpu::render::group_widths(degree)
        .into_iter()
        .max()
        .unwrap_or(1)
        .max(1);
    u32::MAX as usize / widest
}

/// A card row's figure from the card's own pools, replayed.
pub const REPLAYED: &str = "replayed for the card";
/// A card row's figure from the probing device's pools, scaled.
pub const SCALED: &str = "measured here, scaled";

/// One variant's largest count on one card.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CardRow {
    /// The card.
    pub card: String,
    /// Its memory.
    pub card_bytes: u64,
    /// The variant.
    pub variant: String,
    /// The largest count whose predicted reserved peak, with the margin,
    /// is within the card (`None`: not even the seeded count fits).
    pub max_gaussians: Option<usize>,
    /// That count's predicted reserved peak.
    pub predicted_reserved: Option<u64>,
    /// Where the figure comes from: [`REPLAYED`] or [`SCALED`].
    pub basis: &'static str,
    /// What it rests on, in words.
    pub rests_on: String,
    /// Why no count fits, where none does.
    pub why_not: Option<String>,
}

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
    /// Each probe's recorded allocations: (variant, count, trace).
    traces: Vec<(String, usize, Trace)>,
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
            traces: Vec::new(),
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

impl<R: Runtime> ScenePlan<R> {
    /// Each variant's largest count on each card, its reserved peak
    /// predicted with `margin` to spare: the probes' traces grown to the
    /// count and replayed through CubeCL's pools as the card's client makes
    /// them ([`vramfit::pools`]). A variant whose probes are not the same
    /// steps at two counts (with the moments on the host the backward's
    /// chunk count grows with the count) gets `scaled` instead: this
    /// device's line, labelled so. Call after the probes.
    pub fn card_rows(&self, cards: &[Card], margin: f64, scaled: impl Fn(&str, u64) -> usize) -> Vec<CardRow> {
        let mut rows = Vec::new();
        for (variant, storage) in &self.variants {
            let law = self.law(&variant.name, storage.moments);
            for card in cards {
                let fits = |law: &TraceLaw, n: usize| match replay(&law.at(n as u64), &card.allocator) {
                    Ok(r) => (r.reserved_peak as f64 * (1.0 + margin) <= card.memory_bytes as f64).then_some(r),
                    Err(_) => None,
                };
                let row = |max_gaussians, predicted_reserved, basis, rests_on, why_not| CardRow {
                    card: card.name.clone(),
                    card_bytes: card.memory_bytes,
                    variant: variant.name.clone(),
                    max_gaussians,
                    predicted_reserved,
                    basis,
                    rests_on,
                    why_not,
                };
                match &law {
                    Ok(law) => {
                        let rests_on = format!(
                            "CubeCL's pools as a CUDA client of {} makes them (pages up to {}), \
                             the step traced here at {} and {} Gaussians and grown; margin {:.0} %",
                            human_bytes(card.memory_bytes),
                            human_bytes(card.allocator.max_page_size),
                            law.low.0,
                            law.high.0,
                            100.0 * margin
                        );
                        let (mut lo, mut hi) = (self.least.max(1), indexable(storage.degree));
                        let Some(first) = fits(law, lo) else {
                            let need = replay(&law.at(lo as u64), &card.allocator);
                            let why = match need {
                                Ok(r) => format!(
                                    "does not fit: {lo} Gaussians (the seeded count) reserve {} predicted",
                                    human_bytes(r.reserved_peak)
                                ),
                                Err(e) => format!("does not fit: {e}"),
                            };
                            rows.push(row(None, None, REPLAYED, rests_on, Some(why)));
                            continue;
                        };
                        let mut best = (lo, first.reserved_peak);
                        if let Some(r) = fits(law, hi) {
                            best = (hi, r.reserved_peak);
                        } else {
                            while hi - lo > 1 {
                                let mid = lo + (hi - lo) / 2;
                                match fits(law, mid) {
                                    Some(r) => {
                                        lo = mid;
                                        best = (mid, r.reserved_peak);
                                    }
                                    None => hi = mid,
                                }
                            }
                        }
                        let rests_on = if best.0 == indexable(storage.degree) {
                            format!("{rests_on}; capped by the kernels' 32-bit indices, not by the card")
                        } else {
                            rests_on
                        };
                        rows.push(row(Some(best.0), Some(best.1), REPLAYED, rests_on, None));
                    }
                    Err(why) => {
                        let n = scaled(&variant.name, card.memory_bytes).min(indexable(storage.degree));
                        let rests_on = format!(
                            "measured on this device's pools and scaled by its line ({why}); the card's own pages are \
                             not modelled"
                        );
                        let (n, why_not) = if n >= self.least.max(1) {
                            (Some(n), None)
                        } else {
                            (
                                None,
                                Some("does not fit: the line leaves no count within the card".to_string()),
                            )
                        };
                        rows.push(row(n, None, SCALED, rests_on, why_not));
                    }
                }
            }
        }
        rows
    }

    /// The trace law of `variant` through the two largest probe counts
    /// whose steps are the same (the same events), or why there is none.
    /// With the moments on the host there is none: the backward's chunk
    /// count grows with the count, so a law through two probes would hold
    /// only up to the next chunk.
    fn law(&self, variant: &str, moments: vramfit::optim::Moments) -> Result<TraceLaw, NoLaw> {
        if moments == vramfit::optim::Moments::Host {
            return Err(NoLaw::HostMoments);
        }
        let mut probes: Vec<_> = self.traces.iter().filter(|(v, _, _)| v == variant).collect();
        probes.sort_by_key(|(_, c, _)| std::cmp::Reverse(*c));
        for (i, a) in probes.iter().enumerate() {
            for b in &probes[i + 1..] {
                if let Ok(law) = TraceLaw::fit((a.1 as u64, a.2.clone()), (b.1 as u64, b.2.clone())) {
                    return Ok(law);
                }
            }
        }
        Err(NoLaw::NoTwoAlike)
    }
}

/// Why a variant's probes give no trace law.
#[derive(Debug, thiserror::Error)]
enum NoLaw {
    /// The backward's chunk count grows with the count.
    #[error(
        "with the moments on the host the backward's chunk count grows with the count, so the probes' steps are not \
         the card's"
    )]
    HostMoments,
    /// No two probes recorded the same events.
    #[error("no two probes recorded the same steps")]
    NoTwoAlike,
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
        let (m, trace) = trace_step::<R>(&self.device, &case, moments, sh, Default::default(), 3, None)
            .map_err(ProbeError::workload)?;
        self.traces.retain(|(v, c, _)| !(v == variant && *c == count));
        self.traces.push((variant.to_string(), count, trace));
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

    /// Each card's row after the probes calibrated `cal`: the largest
    /// count whose trace, grown and replayed through the card's pools,
    /// fits with the calibration's margin ([`ScenePlan::card_rows`]); a
    /// variant with no trace law gets this device's line scaled to the
    /// card's memory (never below the count measured within it).
    pub fn rows_for_cards(&self, cal: &CapacityCalibration, cards: &[Card]) -> Vec<CardRow> {
        let margin = vramfit::plan::Strategy::margin(cal);
        let scaled = |variant: &str, bytes: u64| {
            cal.lines
                .iter()
                .find(|l| l.variant.name == variant)
                .map_or(0, |l| l.by_memory(bytes, margin).max(l.measured_within(bytes)))
        };
        self.plan.card_rows(cards, margin, scaled)
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
