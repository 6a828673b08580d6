//! The small runs the traces are checked on, shared by `shapes_trace`
//! (shapes against the CPU trace) and `pools_trace` (both against
//! lavapipe): each `steps` long, no checkpoint files.
#![allow(dead_code)] // each test binary uses its own subset

use vramfit_models::gpt::TrainConfig;
use vramfit_models::llama::{LlamaConfig, LlmConfig};
use vramfit_models::unet::UnetTrainConfig;

/// The transformer: width 256, 4 heads, batch 16 × 128 tokens.
pub fn transformer(steps: u64, checkpoint: &str, attention: &str, moments: &str, cleanup: &str) -> TrainConfig {
    let mut c = TrainConfig {
        steps,
        batch_size: 16,
        micro_batch: 16,
        checkpoint: checkpoint.into(),
        moments: moments.into(),
        allocator_cleanup: cleanup.into(),
        checkpoint_every: 0,
        ..Default::default()
    };
    c.model.width = 256;
    c.model.heads = 4;
    c.model.context = 128;
    c.task.tokens = 128;
    c.model.attention = attention.parse().unwrap();
    c
}

/// A 2-block Llama (grouped-query attention), batch 4 × 128 tokens.
pub fn llm(steps: u64, train: &str, precision: &str, base: &str, attention: &str, checkpoint: &str) -> LlmConfig {
    let mut c = LlmConfig {
        steps,
        batch_size: 4,
        micro_batch: 4,
        checkpoint_every: 0,
        precision: precision.into(),
        checkpoint: checkpoint.into(),
        ..Default::default()
    };
    c.model = LlamaConfig {
        vocab: 512,
        width: 256,
        depth: 2,
        heads: 4,
        kv_heads: 2,
        ffn: 512,
        context: 128,
        train: train.into(),
        base: base.into(),
        attention: attention.parse().unwrap(),
        ..Default::default()
    };
    c.task.tokens = 128;
    c
}

/// The U-Net at width 16, batch 8.
pub fn unet(steps: u64) -> UnetTrainConfig {
    let mut c = UnetTrainConfig {
        steps,
        batch_size: 8,
        micro_batch: 8,
        checkpoint_every: 0,
        ..Default::default()
    };
    c.model.width = 16;
    c
}

/// A small segmenter (the tiny encoder at 64 px, a 2-block LLM 128 wide
/// with LoRA, SAM's decoder 64 wide), batch 4.
pub fn segmenter(
    steps: u64,
    precision: &str,
    base: &str,
    checkpoint: &str,
) -> vramfit_models::segmenter::SegmenterTrainConfig {
    let mut c = vramfit_models::segmenter::SegmenterTrainConfig {
        steps,
        batch_size: 4,
        micro_batch: 4,
        checkpoint_every: 0,
        precision: precision.into(),
        checkpoint: checkpoint.into(),
        ..Default::default()
    };
    c.model.encoder.neck = 64;
    c.model.llm = LlamaConfig {
        vocab: 64,
        width: 128,
        depth: 2,
        heads: 4,
        kv_heads: 2,
        ffn: 256,
        context: 64,
        train: "lora:8".into(),
        base: base.into(),
        attention: "fused".parse().unwrap(),
        ..Default::default()
    };
    c.task.image = 64;
    c.task.prompt = 8;
    c
}
