//! A model family for the planner ([`vramfit::plan`]): its knob space on
//! the device, probes that are short runs of the real workload through the
//! run driver, the settings a plan gives, and a planned run that falls
//! back to the next plan when the device still runs out of memory. The
//! transformer and the U-Net are planned by the same code.

use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;
use vramfit::frozen::BaseStorage;
use vramfit::plan::{Calibration, Deep, Knobs, Measured, Plannable, Runnable, SIMULATED_OOM, Space, run_probe};
use vramfit::precision::Precision;
use vramfit::profile::DeviceMemory;
use vramfit::run::{Run, Start};
use vramfit::step::StepError;
use vramfit::trainer::TrainerError;

use crate::config::{FamilyConfig, invalid};
use crate::family::{Family, ModelSettings};
use crate::gpt::GptConfig;
use crate::job::{Job, TrainError};
use crate::unet::UnetConfig;
use vramfit::plan::ProbeError;

/// The shortest probe the token law is fitted from: below it a step's
/// bytes are its fixed costs and rounding (issue 58: at 1 token the law
/// predicted 4.3 times the measured peak).
pub const LEAST_PROBE_TOKENS: usize = 4;

/// A run of family `F` with settings `base`, to be planned on `device`
/// (from a slice of its blocks where `probe_blocks` says so).
pub struct FamilyTarget<B: AutodiffBackend, F: Family<D>, const D: usize> {
    base: FamilyConfig<F>,
    space: Space,
    device: B::Device,
    device_name: String,
    probe_blocks: Option<usize>,
    probe_tokens: Option<usize>,
    /// The spaces of the slices counted so far, by depth, shared with the
    /// targets made from this one (counting builds the model: for a 7B's
    /// slice, some 30 s of drawing weights each time).
    slices: SliceSpaces,
}

type SliceSpaces = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<usize, Space>>>;

/// The transformer for the planner.
pub type TransformerTarget<B> = FamilyTarget<B, GptConfig, 3>;

/// The U-Net for the planner.
pub type UnetTarget<B> = FamilyTarget<B, UnetConfig, 4>;

impl<B, F: Family<D>, const D: usize> FamilyTarget<B, F, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    /// The settings the plans turn knobs of.
    pub fn base(&self) -> &FamilyConfig<F> {
        &self.base
    }

    /// Validates `base` on `device` and reads the knob space.
    pub fn new(base: FamilyConfig<F>, device: &B::Device) -> Result<Self, TrainError> {
        base.resolve::<B>(device)?;
        // A corpus the run cannot read is refused before minutes of probes.
        base.model.data(&base.task)?;
        let space = space_of::<B, F, D>(&base, device)?;
        Ok(Self {
            base,
            space,
            device: device.clone(),
            device_name: B::name(device),
            probe_blocks: None,
            probe_tokens: None,
            slices: SliceSpaces::default(),
        })
    }

    /// `base`, to be planned from a slice `probe_blocks` deep
    /// ([`vramfit::plan::slice`]): nothing of the whole model is built, so
    /// it need not fit this machine (`base` is validated but for that).
    /// The slice must be shallower than the model, whose blocks must repeat.
    pub fn sliced(base: FamilyConfig<F>, device: &B::Device, probe_blocks: usize) -> Result<Self, TrainError> {
        base.resolve_elsewhere::<B>(device)?;
        base.model.data(&base.task)?;
        let depth = base.model.blocks();
        let slice_error = |why: String| TrainError::Config(invalid("probe_blocks", why));
        if base.model.with_blocks(1).is_none() {
            return Err(slice_error(format!(
                "`{}` cannot be planned from a slice: its blocks differ (or a setting names single blocks); \
                 probe the whole model (--probe-blocks 0)",
                F::NAME
            )));
        }
        if depth < 2 {
            return Err(slice_error(format!(
                "a model {depth} block(s) deep has no shallower slice: probe the whole model (plan and train \
                 --budget: --probe-blocks 0)"
            )));
        }
        if probe_blocks == 0 || probe_blocks >= depth {
            return Err(slice_error(format!(
                "a slice of {probe_blocks} block(s) of a model {depth} blocks deep: a slice is 1 to {} blocks \
                 (to probe the whole model instead, plan and train --budget take --probe-blocks 0)",
                depth - 1
            )));
        }
        let slices = SliceSpaces::default();
        let at = |blocks: usize| -> Result<Space, TrainError> {
            let model = base.model.with_blocks(blocks).expect("the family slices");
            slice_space::<B, F, D>(&slices, &FamilyConfig { model, ..base.clone() }, device)
        };
        let space = vramfit::plan::slice::deepened(&at(probe_blocks)?, &at(probe_blocks + 1)?, depth);
        Ok(Self {
            base,
            space,
            device: device.clone(),
            device_name: B::name(device),
            probe_blocks: Some(probe_blocks),
            probe_tokens: None,
            slices,
        })
    }

    /// Probed at `tokens` a sample (at least [`LEAST_PROBE_TOKENS`]) and extrapolated to the run's
    /// ([`vramfit::plan::tokens`]); the family's samples must be sequences
    /// longer than that.
    pub fn with_probe_tokens(mut self, tokens: usize) -> Result<Self, TrainError> {
        let error = |why: String| TrainError::Config(invalid("probe_tokens", why));
        let Some(run) = F::sequence_tokens(&self.base.task) else {
            return Err(error(format!(
                "`{}` has no sequence to shorten: --probe-tokens is the llm's",
                F::NAME
            )));
        };
        if tokens < LEAST_PROBE_TOKENS || tokens >= run {
            return Err(error(format!(
                "probes at {tokens} tokens for a run of {run}: give --probe-tokens {LEAST_PROBE_TOKENS} to {} (or 0: \
                 probe at the run's tokens){}",
                run.saturating_sub(1),
                if tokens > 0 && tokens < LEAST_PROBE_TOKENS {
                    format!(
                        "; below {LEAST_PROBE_TOKENS} tokens a step's bytes are its fixed costs and the allocator's \
                         rounding, from which the token law cannot part the tokens' share (at 1 token it predicted \
                         4.3 times the measured peak)"
                    )
                } else {
                    String::new()
                }
            )));
        }
        self.probe_tokens = Some(tokens);
        Ok(self)
    }

    /// The device as a planned run's directory and `plan.json` name it.
    pub fn with_device_name(mut self, name: &str) -> Self {
        self.device_name = name.into();
        self
    }
}

/// The space of `base`, a slice (validated but for whether the whole fits
/// here), counted once per depth in `slices`: what depends on the task
/// (the blocks' inputs) is the task's own.
fn slice_space<B, F: Family<D>, const D: usize>(
    slices: &SliceSpaces,
    base: &FamilyConfig<F>,
    device: &B::Device,
) -> Result<Space, TrainError>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    base.resolve_elsewhere::<B>(device)?;
    let blocks = base.model.blocks();
    let counted = slices.lock().unwrap_or_else(|e| e.into_inner()).get(&blocks).cloned();
    let space = match counted {
        Some(space) => space,
        None => {
            let space = space_of::<B, F, D>(base, device)?;
            slices
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(blocks, space.clone());
            space
        }
    };
    Ok(Space {
        batch: base.batch_size,
        block_input_bytes: base.model.block_input_bytes(&base.task),
        block_shapes: base.model.block_shapes(&base.task),
        work: base.model.work(&base.task),
        ..space
    })
}

/// The knob space of `base` on `device`: its model is built once to count
/// its parameters and groups.
pub fn space_of<B, F: Family<D>, const D: usize>(
    base: &FamilyConfig<F>,
    device: &B::Device,
) -> Result<Space, TrainError>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    let supported = |d: DType| B::supports_dtype(device, d);
    let precisions: Vec<Precision> = [Precision::F32, Precision::Bf16, Precision::F16]
        .into_iter()
        .filter(|p| supported(DType::from(p.dtype())))
        .collect();
    let bf16 = supported(DType::BF16);
    // The frozen base's storages the device can hold: f32, the first
    // 16-bit type it has, the quantized ones (stored as integers, their
    // tables in bf16, or f16 where there is no bf16).
    let mut bases = base.model.bases_to_search();
    let sixteen = bases
        .iter()
        .copied()
        .find(|b| matches!(b, BaseStorage::Bf16 | BaseStorage::F16) && supported(DType::from(b.float())));
    bases.retain(|b| !matches!(b, BaseStorage::Bf16 | BaseStorage::F16) || Some(*b) == sixteen);
    // Counted at the best base: what trains does not depend on it.
    let counted = match bases.first() {
        Some(&first) => base.model.clone().with_base(first),
        None => base.model.clone(),
    };
    let model = counted.init::<B>(base.seed, device)?;
    let groups = vramfit::trainer::parameter_groups(&model);
    let parameters = vramfit::plan::trainable_sizes(&model);
    drop(model);
    // The fused attention takes every precision where it has a kernel
    // (the CubeCL kernels read 16-bit Q, K and V; the CPU's widens them).
    let fused_attention = if base.model.attention().is_some() && vramfit::fused::Attention::is_fused_on::<B>() {
        precisions.clone()
    } else {
        Vec::new()
    };
    Ok(Space {
        batch: base.batch_size,
        blocks: base.model.blocks(),
        block_input_bytes: base.model.block_input_bytes(&base.task),
        precisions,
        // Where the base's storage is searched, not the groups': under LoRA
        // they hold the frozen weights (the base's knob, measured as such)
        // and adapters too small to pay for bf16's lost updates.
        storage_groups: if bf16 && bases.is_empty() { groups } else { Vec::new() },
        low_moments: bf16,
        host_moments: !vramfit::backends::is_cpu::<B>(),
        batch_statistics: base.model.batch_statistics(),
        block_shapes: base.model.block_shapes(&base.task),
        fused_attention,
        parameters,
        bases,
        work: base.model.work(&base.task),
    })
}

/// The settings of `base` with `knobs` at effective batch `batch` in
/// `space` (its storage groups, largest first; whether it turns the
/// attention: where it does not, the base's attention stays).
pub fn apply<M: ModelSettings>(base: &FamilyConfig<M>, knobs: &Knobs, batch: usize, space: &Space) -> FamilyConfig<M> {
    let groups = &space.storage_groups;
    let mut model = if space.fused_attention.is_empty() {
        base.model.clone()
    } else {
        base.model.clone().with_attention(if knobs.fused_attention {
            vramfit::fused::Attention::Fused
        } else {
            vramfit::fused::Attention::Standard
        })
    };
    if let Some(storage) = knobs.base {
        model = model.with_base(storage);
    }
    FamilyConfig {
        model,
        batch_size: batch,
        micro_batch: knobs.micro_batch,
        accumulate: batch / knobs.micro_batch.max(1),
        precision: knobs.precision.name().into(),
        checkpoint: knobs.checkpoint_setting(),
        storage: groups[..knobs.low_storage.min(groups.len())]
            .iter()
            .map(|(g, _)| format!("{g}:bf16"))
            .collect(),
        moments: if knobs.host_moments {
            "host"
        } else if knobs.low_moments {
            "bf16"
        } else {
            "f32"
        }
        .into(),
        allocator_cleanup: if knobs.cleanup { "step" } else { "never" }.into(),
        // On ranks, the moments sharded (the planner's arithmetic on ranks assumes it).
        ranks: knobs.ranks.max(1),
        shard_moments: knobs.ranks > 1,
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

    /// The settings' base becomes `base` (the slices and shorter probes
    /// made from them follow); the space no longer offers the choice.
    fn at_base(&mut self, base: BaseStorage) {
        self.base.model = self.base.model.clone().with_base(base);
        self.space.bases.clear();
    }

    fn measure(&mut self, knobs: &Knobs, batch: usize) -> Result<Measured, ProbeError> {
        run_probe::<B, _, _>(&self.device, |steps| {
            let config = FamilyConfig {
                steps,
                log_every: 1,
                // Checkpoint writes count towards the peak (host copies): probed when the run makes them.
                checkpoint_every: if self.base.checkpoint_every > 0 { 2 } else { 0 },
                profile_every: 1,
                ..apply(&self.base, knobs, batch, &self.space)
            };
            crate::job::build::<B, F, D>(config, &self.device)
        })
    }

    fn deep(&self) -> Option<&dyn Deep> {
        self.probe_blocks.map(|_| self as &dyn Deep)
    }

    fn long(&self) -> Option<&dyn vramfit::plan::Long> {
        self.probe_tokens.map(|_| self as &dyn vramfit::plan::Long)
    }
}

/// The model `blocks` deep, for a planner that probes a slice of it.
impl<B, F: Family<D>, const D: usize> Deep for FamilyTarget<B, F, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    fn depth(&self) -> usize {
        self.base.model.blocks()
    }

    fn probe_blocks(&self) -> usize {
        self.probe_blocks.unwrap_or(self.depth())
    }

    fn sliced(&self, blocks: usize) -> Result<Box<dyn Plannable>, ProbeError> {
        let model = self.base.model.with_blocks(blocks).ok_or_else(|| {
            ProbeError::workload(format!(
                "`{}` cannot be planned from a slice: its blocks differ",
                F::NAME
            ))
        })?;
        let base = FamilyConfig {
            model,
            ..self.base.clone()
        };
        Ok(Box::new(Self {
            space: slice_space::<B, F, D>(&self.slices, &base, &self.device).map_err(ProbeError::workload)?,
            base,
            device: self.device.clone(),
            device_name: self.device_name.clone(),
            probe_blocks: None,
            probe_tokens: None,
            slices: self.slices.clone(),
        }))
    }
}

/// The run at fewer tokens a sample, for a planner that probes it shorter.
impl<B, F: Family<D>, const D: usize> vramfit::plan::Long for FamilyTarget<B, F, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    fn tokens(&self) -> usize {
        F::sequence_tokens(&self.base.task).unwrap_or(0)
    }

    fn probe_tokens(&self) -> usize {
        self.probe_tokens.unwrap_or(self.tokens())
    }

    /// The space does not change with the tokens but for the blocks'
    /// inputs: nothing is built.
    fn shortened(&self, tokens: usize) -> Result<Box<dyn Plannable>, ProbeError> {
        let task = F::with_sequence_tokens(&self.base.task, tokens)
            .ok_or_else(|| ProbeError::workload(format!("`{}` has no sequence to shorten", F::NAME)))?;
        let base = FamilyConfig {
            task,
            ..self.base.clone()
        };
        base.resolve_elsewhere::<B>(&self.device)
            .map_err(ProbeError::workload)?;
        let space = Space {
            block_input_bytes: base.model.block_input_bytes(&base.task),
            block_shapes: base.model.block_shapes(&base.task),
            work: base.model.work(&base.task),
            ..self.space.clone()
        };
        Ok(Box::new(Self {
            base,
            space,
            device: self.device.clone(),
            device_name: self.device_name.clone(),
            probe_blocks: self.probe_blocks,
            probe_tokens: None,
            slices: self.slices.clone(),
        }))
    }
}

/// A planned run of the family: a plan's settings are the base's with its
/// knobs; a fallback rewrites `config.toml` and resumes the run.
impl<B, F: Family<D>, const D: usize> Runnable for FamilyTarget<B, F, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    type Strategy = Calibration;
    type Settings = FamilyConfig<F>;
    type Workload = Job<B, F, D>;
    type Error = TrainError;

    fn target(&mut self) -> &mut (dyn Plannable + 'static) {
        self
    }
    fn settings(&self, knobs: &Knobs) -> FamilyConfig<F> {
        apply(&self.base, knobs, self.base.batch_size, &self.space)
    }
    fn to_toml(settings: &FamilyConfig<F>) -> String {
        settings.to_toml()
    }
    fn launch(&self, start: Start<FamilyConfig<F>>) -> Result<(Run, Job<B, F, D>), TrainError> {
        // A fallback starts from pools that hold nothing of the failed attempt.
        B::memory_cleanup(&self.device);
        crate::job::start::<B, F, D>(start, &self.device, &self.device_name)
    }
    fn simulated_oom(step: u64) -> TrainerError {
        TrainerError::Step(StepError::Device {
            step,
            reason: SIMULATED_OOM.into(),
        })
    }
}
