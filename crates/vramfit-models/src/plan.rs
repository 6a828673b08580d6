//! A model family for the planner ([`vramfit::plan`]): its knob space on
//! the device, probes that are short runs of the real workload through the
//! run driver, the settings a plan gives, and a planned run that falls
//! back to the next plan when the device still runs out of memory. The
//! transformer and the U-Net are planned by the same code.

use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;
use std::ops::ControlFlow;
use vramfit::plan::{Knobs, Measured, Plannable, Planned, PlannedRun, Space, measure_run};
use vramfit::precision::Precision;
use vramfit::profile::DeviceMemory;
use vramfit::run::{Event, RunError, RunPath};
use vramfit::step::StepError;

use crate::config::FamilyConfig;
use crate::family::{Family, ModelSettings};
use crate::gpt::GptConfig;
use crate::job::{Job, TrainError, TrainSummary};
use crate::unet::UnetConfig;

/// Steps of one probe (the first one warms up; the median is of the rest).
pub const PROBE_STEPS: u64 = 5;

/// A run of family `F` with settings `base`, to be planned on `device`.
pub struct FamilyTarget<B: AutodiffBackend, F: Family<D>, const D: usize> {
    base: FamilyConfig<F>,
    space: Space,
    device: B::Device,
}

/// The transformer for the planner.
pub type TransformerTarget<B> = FamilyTarget<B, GptConfig, 3>;

/// The U-Net for the planner.
pub type UnetTarget<B> = FamilyTarget<B, UnetConfig, 4>;

impl<B, F: Family<D>, const D: usize> FamilyTarget<B, F, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    /// Validates `base` on `device` and reads the knob space.
    pub fn new(base: FamilyConfig<F>, device: &B::Device) -> Result<Self, TrainError> {
        base.resolve::<B>(device)?;
        let supported = |d: DType| B::supports_dtype(device, d);
        let precisions = [Precision::F32, Precision::Bf16, Precision::F16]
            .into_iter()
            .filter(|p| supported(DType::from(p.dtype())))
            .collect();
        let bf16 = supported(DType::BF16);
        let groups = vramfit::trainer::parameter_groups(&base.model.init::<B>(base.seed, device));
        let space = Space {
            batch: base.batch_size,
            blocks: base.model.blocks(),
            block_input_bytes: base.model.block_input_bytes(&base.task),
            precisions,
            storage_groups: if bf16 { groups } else { Vec::new() },
            low_moments: bf16,
            batch_statistics: base.model.batch_statistics(),
            block_shapes: base.model.block_shapes(&base.task),
        };
        Ok(Self {
            base,
            space,
            device: device.clone(),
        })
    }
}

/// The settings of `base` with `knobs` at effective batch `batch`
/// (`groups`: the space's storage groups, largest first).
pub fn apply<M: ModelSettings>(
    base: &FamilyConfig<M>,
    knobs: &Knobs,
    batch: usize,
    groups: &[(String, u64)],
) -> FamilyConfig<M> {
    FamilyConfig {
        batch_size: batch,
        micro_batch: knobs.micro_batch,
        accumulate: batch / knobs.micro_batch.max(1),
        precision: knobs.precision.name().into(),
        checkpoint: knobs.checkpoint_setting(),
        storage: groups[..knobs.low_storage.min(groups.len())]
            .iter()
            .map(|(g, _)| format!("{g}:bf16"))
            .collect(),
        moments: if knobs.low_moments { "bf16" } else { "f32" }.into(),
        allocator_cleanup: if knobs.cleanup { "step" } else { "never" }.into(),
        ..base.clone()
    }
}

impl<B, F: Family<D>, const D: usize> Plannable for FamilyTarget<B, F, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    fn space(&self) -> Space {
        self.space.clone()
    }

    fn measure(&mut self, knobs: &Knobs, batch: usize) -> Result<Measured, String> {
        // Each probe starts from pools that hold nothing of the previous one.
        B::memory_cleanup(&self.device);
        let config = FamilyConfig {
            steps: PROBE_STEPS,
            log_every: 1,
            // Checkpoint writes count towards the peak (host copies): probed when the run makes them.
            checkpoint_every: if self.base.checkpoint_every > 0 { 2 } else { 0 },
            profile_every: 1,
            ..apply(&self.base, knobs, batch, &self.space.storage_groups)
        };
        let workload = Job::<B, F, D>::new(config, &self.device).map_err(|e| e.to_string())?;
        let measured = measure_run(workload);
        B::memory_cleanup(&self.device);
        measured
    }
}

/// Runs `plans[0]` into `out` (writing `plan` as `plan.json` beside the
/// settings) and falls back to the next plans on an out-of-memory
/// ([`PlannedRun`]). `simulate_oom_at` makes plan 0 fail at that step with
/// the backend's out-of-memory words (a test seam, as [`vramfit::run::FailAt`]).
pub fn run_planned<B, F: Family<D>, const D: usize>(
    plans: &[FamilyConfig<F>],
    out: RunPath,
    plan: &serde_json::Value,
    device: &B::Device,
    device_name: &str,
    simulate_oom_at: Option<u64>,
    observe: impl FnMut(Event) -> ControlFlow<()>,
) -> Result<Planned<TrainSummary>, TrainError>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    PlannedRun {
        plans,
        to_toml: FamilyConfig::<F>::to_toml,
        out,
        record: plan.clone(),
        simulate_oom_at,
        oom: |step| {
            TrainError::Step(StepError::Device {
                step,
                reason: "simulated: out of memory (the planner's fallback test seam)".into(),
            })
        },
    }
    .run(
        |start| Job::<B, F, D>::launch(start, device, device_name),
        |e| matches!(e, TrainError::Run(RunError::OutOfMemory(_))),
        observe,
    )
}
