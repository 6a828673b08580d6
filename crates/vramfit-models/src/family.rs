//! A model family: what the run driver needs to train a model of it
//! (`vramfit train <name>`) and the planner to plan it. The transformer
//! ([`crate::gpt`]) and the U-Net ([`crate::unet`]) are families; one
//! settings type ([`crate::config::FamilyConfig`]), one workload
//! ([`crate::job::Job`]) and one planning target
//! ([`crate::plan::FamilyTarget`]) serve them all.
//!
//! The `[model]` settings type is the family: its [`ModelSettings`] part is
//! plain data (settings, checks, the chain's length), its [`Family`] part
//! builds the network and its data on a backend.

use burn::tensor::backend::AutodiffBackend;
use vramfit::step::Trainable;

use crate::config::ConfigError;

// The plain-data part lives with the settings it describes.
pub use crate::config::ModelSettings;

/// Building a family's network and data on a backend; `D` is the rank of
/// the activations between its blocks.
pub trait Family<const D: usize>: ModelSettings {
    /// The network.
    type Net<B: AutodiffBackend>: Trainable<B, D>;
    /// The task's generator (tables, images), made once per run.
    type Data: Send + Sync;

    /// The network with weights drawn from `seed`, or read from the
    /// checkpoint its settings name (an unreadable one is an error).
    fn init<B: AutodiffBackend>(&self, seed: u64, device: &B::Device) -> Result<Self::Net<B>, ConfigError>;

    /// The task's generator, or the corpus the task names (an unreadable
    /// or unsuitable one is an error).
    fn data(&self, task: &Self::Task) -> Result<Self::Data, ConfigError>;

    /// A fingerprint of the file `data` is read from (`None`: drawn from the
    /// seed): kept in checkpoints, a resume over another file refused.
    fn data_fingerprint(_data: &Self::Data) -> Option<String> {
        None
    }

    /// Steps between evaluations of held-out data (0: none in the run).
    fn evaluate_every(_task: &Self::Task) -> u64 {
        0
    }

    /// Figures of `net` on `data`'s held-out part (none by default), run
    /// `micro_batch` samples at a time with `autocast`.
    fn evaluate<B: AutodiffBackend>(
        _data: &Self::Data,
        _net: &Self::Net<B>,
        _micro_batch: usize,
        _autocast: &vramfit::precision::Autocast,
        _device: &B::Device,
    ) -> Vec<(String, f64)> {
        Vec::new()
    }

    /// Batch `step` (1-based) of `size` samples: the same for a given
    /// step whatever the run's history, so a resumed run sees the batches
    /// it would have seen.
    fn batch<B: AutodiffBackend>(
        data: &Self::Data,
        step: u64,
        size: usize,
        device: &B::Device,
    ) -> <Self::Net<B> as Trainable<B, D>>::Batch;

    /// Files of its own written at the end of a run (name, bytes): none by
    /// default; an llm's LoRA adapters in PEFT's layout.
    fn files<B: AutodiffBackend>(&self, _net: &Self::Net<B>) -> Result<Vec<(String, Vec<u8>)>, String> {
        Ok(Vec::new())
    }

    /// Bytes of one sample's input to a block (what a checkpointed block
    /// keeps), for the planner's chain model.
    fn block_input_bytes(&self, task: &Self::Task) -> u64;

    /// The family's fields of `summary.json`: its floor, its throughput at
    /// `median_step_ms` for batches of `batch_size`, evaluations of `net`
    /// (run `micro_batch` samples at a time: what fitted in training).
    fn summary<B: AutodiffBackend>(
        &self,
        data: &Self::Data,
        net: &Self::Net<B>,
        batch_size: usize,
        micro_batch: usize,
        median_step_ms: f64,
        device: &B::Device,
    ) -> serde_json::Map<String, serde_json::Value>;
}
