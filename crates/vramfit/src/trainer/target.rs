//! A user's model as a target of the planner: each probe is a short
//! [`Trainer`] run through the run driver.

use std::sync::Arc;

use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;

use crate::plan::{Calibration, Deep, Knobs, Measured, Plannable, Runnable, SIMULATED_OOM, Space, run_probe};
use crate::precision::{Autocast, Precision};
use crate::profile::DeviceMemory;
use crate::run::{Run, RunError, Start};
use crate::step::{StepError, Trainable};

use super::{Batches, Maker, Schedule, Trainer, TrainerError, WORKLOAD, parameter_groups};
use crate::plan::ProbeError;

/// A user's model for the planner: how to make it, its batches, and the
/// schedule; each probe is a short [`Trainer`] run through the run driver.
pub struct TrainerTarget<B: AutodiffBackend, M: Trainable<B, D>, const D: usize> {
    make: Maker<B, M>,
    batches: Batches<B, M::Batch>,
    schedule: Schedule,
    space: Space,
    device: B::Device,
    /// Planned from a slice: its depth in blocks and the maker of the
    /// model any number of blocks deep.
    slice: Option<(usize, DeepMaker<B, M>)>,
}

/// Makes the model `blocks` deep on a device.
type DeepMaker<B, M> = Arc<dyn Fn(usize, &burn::tensor::Device<B>) -> M + Send + Sync>;

impl<B, M, const D: usize> TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D>,
{
    /// The model `make` builds, trained on `batches` with `schedule` on `device`.
    pub fn new(
        make: impl Fn(&B::Device) -> M + Send + Sync + 'static,
        batches: Batches<B, M::Batch>,
        schedule: Schedule,
        device: &B::Device,
    ) -> Self {
        let space = space_of(&make(device), &batches, &schedule, device);
        Self {
            make: Arc::new(make),
            batches,
            schedule,
            space,
            device: device.clone(),
            slice: None,
        }
    }
}

impl<B, M, const D: usize> TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D> + 'static,
{
    /// The model `make_at(depth)` builds, to be planned from a slice
    /// `probe_blocks` deep ([`crate::plan::slice`]): `make_at(n, device)`
    /// makes it `n` blocks deep, everything else as it is. The whole model
    /// is built only when a probe or the run needs it (the verification,
    /// the run), never to plan it.
    pub fn sliced(
        make_at: impl Fn(usize, &B::Device) -> M + Send + Sync + 'static,
        depth: usize,
        probe_blocks: usize,
        batches: Batches<B, M::Batch>,
        schedule: Schedule,
        device: &B::Device,
    ) -> Self {
        let make_at: DeepMaker<B, M> = Arc::new(make_at);
        let at = |n: usize| space_of(&make_at(n, device), &batches, &schedule, device);
        let space = crate::plan::slice::deepened(&at(probe_blocks), &at(probe_blocks + 1), depth);
        let whole = make_at.clone();
        Self {
            make: Arc::new(move |d: &B::Device| whole(depth, d)),
            batches,
            schedule,
            space,
            device: device.clone(),
            slice: Some((probe_blocks, make_at)),
        }
    }
}

/// The knob space of `model`, trained on `batches` with `schedule`.
fn space_of<B, M, const D: usize>(
    model: &M,
    batches: &Batches<B, M::Batch>,
    schedule: &Schedule,
    device: &B::Device,
) -> Space
where
    B: AutodiffBackend,
    M: Trainable<B, D>,
{
    // What a checkpointed block keeps per sample: the chain's input.
    let one = batches(1, 1, device);
    let input = model.prelude_stack(&one, &Autocast::new(Precision::F32));
    let block_input_bytes = input.iter().map(|t| t.shape().num_elements() as u64 * 4).sum();
    let bf16 = B::supports_dtype(device, DType::BF16);
    Space {
        batch: schedule.batch_size,
        blocks: model.blocks().len(),
        block_input_bytes,
        precisions: [Precision::F32, Precision::Bf16, Precision::F16]
            .into_iter()
            .filter(|p| B::supports_dtype(device, DType::from(p.dtype())))
            .collect(),
        storage_groups: if bf16 { parameter_groups(model) } else { Vec::new() },
        low_moments: bf16,
        host_moments: !crate::backends::is_cpu::<B>(),
        batch_statistics: None,
        block_shapes: Vec::new(),
        fused_attention: Vec::new(),
        parameters: crate::plan::trainable_sizes(model),
        bases: Vec::new(),
        work: None,
    }
}

impl<B, M, const D: usize> TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D>,
{
    /// The trainer for a full run with `knobs`.
    pub fn trainer(&self, knobs: &Knobs) -> Result<Trainer<B, M, D>, TrainerError> {
        self.trainer_on(knobs, self.schedule.clone())
    }

    /// A fresh model trained with `knobs` on `schedule`.
    fn trainer_on(&self, knobs: &Knobs, schedule: Schedule) -> Result<Trainer<B, M, D>, TrainerError> {
        Trainer::new(
            (self.make)(&self.device),
            self.batches.clone(),
            schedule,
            knobs,
            &self.device,
        )
    }
}

impl<B, M, const D: usize> Plannable for TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D> + 'static,
{
    fn space(&self) -> Space {
        self.space.clone()
    }

    fn measure(&mut self, knobs: &Knobs, batch: usize) -> Result<Measured, ProbeError> {
        run_probe::<B, _, _>(&self.device, |steps| {
            let schedule = Schedule {
                steps,
                batch_size: batch,
                // Checkpoint writes count towards the peak (host copies): probed when the run makes them.
                checkpoint_every: if self.schedule.checkpoint_every > 0 { 2 } else { 0 },
                profile_every: 1,
                ..self.schedule.clone()
            };
            self.trainer_on(knobs, schedule)
        })
    }

    fn deep(&self) -> Option<&dyn Deep> {
        self.slice.as_ref().map(|_| self as &dyn Deep)
    }
}

/// The user's model any number of blocks deep, where it was made with
/// [`TrainerTarget::sliced`].
impl<B, M, const D: usize> Deep for TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D> + 'static,
{
    fn depth(&self) -> usize {
        self.space.blocks
    }

    fn probe_blocks(&self) -> usize {
        self.slice.as_ref().map_or(self.space.blocks, |(k, _)| *k)
    }

    fn sliced(&self, blocks: usize) -> Result<Box<dyn Plannable>, ProbeError> {
        let Some((_, make_at)) = &self.slice else {
            return Err(ProbeError::workload(
                "this model was not made to be sliced (TrainerTarget::sliced)",
            ));
        };
        let make_at = make_at.clone();
        Ok(Box::new(TrainerTarget::new(
            move |d: &B::Device| make_at(blocks, d),
            self.batches.clone(),
            self.schedule.clone(),
            &self.device,
        )))
    }
}

/// A planned run of the user's model: its settings are the plan's knobs
/// (`config.toml` holds them, so a fallback rewrites them and resumes).
impl<B, M, const D: usize> Runnable for TrainerTarget<B, M, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    M: Trainable<B, D> + 'static,
{
    type Strategy = Calibration;
    type Settings = Knobs;
    type Workload = Trainer<B, M, D>;
    type Error = RunError;

    fn target(&mut self) -> &mut (dyn Plannable + 'static) {
        self
    }
    fn settings(&self, knobs: &Knobs) -> Knobs {
        knobs.clone()
    }
    fn to_toml(knobs: &Knobs) -> String {
        toml::to_string(knobs).expect("knobs are plain data")
    }
    fn launch(&self, start: Start<Knobs>) -> Result<(Run, Self::Workload), RunError> {
        // A fallback starts from pools that hold nothing of the failed attempt:
        // on CubeCL reserved bytes only shrink on a cleanup, and they are the budget's figure.
        B::memory_cleanup(&self.device);
        let device = B::name(&self.device);
        let trainer = |knobs: &Knobs| self.trainer(knobs).map_err(|e| RunError::Workload(Box::new(e)));
        match start {
            Start::New(knobs, out) => {
                let workload = trainer(&knobs)?;
                Ok((Run::create(&out, &Self::to_toml(&knobs), &device, WORKLOAD)?, workload))
            }
            Start::Resume(dir) => {
                let (run, text) = Run::open(&dir, &device, WORKLOAD)?;
                let knobs: Knobs = toml::from_str(&text).map_err(|e| {
                    RunError::Workload(Box::new(TrainerError::Setting(format!(
                        "{}: not a plan's knobs: {e}",
                        dir.join("config.toml").display()
                    ))))
                })?;
                Ok((run, trainer(&knobs)?))
            }
        }
    }
    fn simulated_oom(step: u64) -> TrainerError {
        TrainerError::Step(StepError::Device {
            step,
            reason: SIMULATED_OOM.into(),
        })
    }
}
