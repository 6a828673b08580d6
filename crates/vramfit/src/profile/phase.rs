//! What the profiler records of one phase: the categories memory goes
//! to, their bytes, and a category that grew step after step.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::reading::MemoryReading;

/// Where memory goes, in the words PyTorch users know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Trainable parameter tensors (walked).
    Parameters,
    /// Frozen parameter tensors: no gradient, no optimiser state (walked).
    FrozenParameters,
    /// Gradient tensors alive at the phase (walked).
    Gradients,
    /// Optimiser moments and buffers (walked).
    OptimizerState,
    /// Tensors kept for backward: what the step holds after forward beyond
    /// what it held at its start (measured by difference).
    Activations,
    /// The workload's data on the device: a target image, a batch (declared
    /// by the workload).
    Inputs,
    /// Scratch the workload allocates and reuses every step, declared by the
    /// workload with its size (the splat band planes and pair lists).
    Workspace,
    /// In use but none of the above: transient buffers, runtime state
    /// (derived: in use − the categories above).
    #[serde(alias = "temporaries")]
    Other,
    /// Reserved by the allocator and not in use, beyond the workload's
    /// workspace it keeps for reuse (derived: reserved − in use − held workspace).
    #[serde(alias = "fragmentation")]
    Cached,
}

impl Category {
    /// Every category, in the order reports stack them.
    pub const ALL: [Category; 9] = [
        Category::Parameters,
        Category::FrozenParameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::Activations,
        Category::Inputs,
        Category::Workspace,
        Category::Other,
        Category::Cached,
    ];

    /// The name in `memory.json`, TensorBoard tags and messages.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::FrozenParameters => "frozen_parameters",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer_state",
            Category::Activations => "activations",
            Category::Inputs => "inputs",
            Category::Workspace => "workspace",
            Category::Other => "other",
            Category::Cached => "cached",
        }
    }
}

/// Bytes a workload knows it holds at a phase: walked from its tensors or
/// declared (inputs, workspace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accounted {
    /// Trainable parameter bytes.
    pub parameters: u64,
    /// Frozen parameter bytes (no gradient, no moments).
    pub frozen_parameters: u64,
    /// Gradient bytes alive now.
    pub gradients: u64,
    /// Optimiser state bytes.
    pub optimizer_state: u64,
    /// Input bytes on the device (target image, batch).
    pub inputs: u64,
    /// Scratch the phase used (in use now, or held by the allocator for reuse).
    pub workspace: u64,
    /// Bytes saved for backward, when the workload can name them; else the
    /// profiler measures them at `forward` by difference.
    pub activations: Option<u64>,
}

impl Accounted {
    pub(super) fn named(&self) -> u64 {
        self.parameters + self.frozen_parameters + self.gradients + self.optimizer_state + self.inputs
    }
}

/// Memory at the end of one phase of one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseRecord {
    /// Step number.
    pub step: u64,
    /// Phase name (`start`, `forward`, `backward`, `optimizer`, or a workload's own).
    pub phase: String,
    /// Micro-batch index within the step, for per-micro-batch phases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    /// Allocator figures at the end of the phase (measured), absent on
    /// backends without them.
    pub device: Option<MemoryReading>,
    /// Bytes per category; a category is absent when it cannot be known here.
    pub categories: BTreeMap<Category, u64>,
    /// Host process resident set (measured), beside, never instead of, device figures.
    pub host_rss: Option<u64>,
    /// Largest in-use bytes inside the phase (since the previous
    /// observation): exact with a counting allocator, sampled otherwise.
    #[serde(default, alias = "sampled_peak")]
    pub peak_in_use: Option<u64>,
    /// Largest reserved bytes inside the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved: Option<u64>,
    /// Largest driver figure (NVML) the sampler saw in the same window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_driver_peak: Option<u64>,
}

impl PhaseRecord {
    /// In-use bytes at the end of the phase: the allocator's figure, else
    /// the sum of the accounted categories.
    pub fn allocated(&self) -> u64 {
        match self.device {
            Some(d) => d.allocated,
            None => self.categories.values().sum(),
        }
    }

    /// The label of the phase in tables and charts: `backward` or `backward[2]`.
    pub fn label(&self) -> String {
        match self.micro_batch {
            Some(m) => format!("{}[{m}]", self.phase),
            None => self.phase.clone(),
        }
    }
}

/// A category that grew step after step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakWarning {
    /// Phase whose allocated bytes grew at every step of the window.
    pub phase: String,
    /// Steps in the window.
    pub steps: u64,
    /// Growth of allocated bytes over the window.
    pub growth_bytes: u64,
    /// The category that grew most over the window.
    pub category: Category,
}
