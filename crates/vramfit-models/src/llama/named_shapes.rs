//! The Llama family's named shapes (`--shape NAME`), each from its model's
//! published `config.json`.

use super::LlamaConfig;

/// A published shape: (name, what it is, its settings).
pub struct Shape {
    /// `--shape NAME`.
    pub name: &'static str,
    /// Whose it is.
    pub source: &'static str,
    /// The settings.
    pub config: LlamaConfig,
}

/// The named shapes, from each model's published `config.json`.
pub fn shapes() -> Vec<Shape> {
    let base = LlamaConfig::default();
    let qwen2 = LlamaConfig {
        vocab: 151_936,
        width: 1536,
        depth: 28,
        heads: 12,
        kv_heads: 2,
        ffn: 8960,
        context: 32_768,
        rope_theta: 1_000_000.0,
        norm_eps: 1e-6,
        qkv_bias: true,
        tie_head: true,
        ..base.clone()
    };
    vec![
        Shape {
            name: "tinyllama-1.1b",
            source: "TinyLlama-1.1B (Llama 2 architecture)",
            config: LlamaConfig {
                vocab: 32_000,
                width: 2048,
                depth: 22,
                heads: 32,
                kv_heads: 4,
                ffn: 5632,
                context: 2048,
                rope_theta: 10_000.0,
                norm_eps: 1e-5,
                ..base.clone()
            },
        },
        Shape {
            name: "qwen2-1.5b",
            source: "Qwen2-1.5B (q, k, v biases; head tied to the embedding)",
            config: qwen2.clone(),
        },
        Shape {
            name: super::VIDEO_SHAPE,
            source: "Qwen2-1.5B reading up to 100 frames a sample, each through ViT-Ti/16 (frozen) at 224 px and \
                     averaged to 7×7 tokens: a 2B video-language model's setting",
            config: LlamaConfig {
                max_frames: 100,
                frame_encoder: crate::vision::VisionConfig::named("vit-tiny16").expect("a known encoder"),
                frame_grid: 7,
                ..qwen2
            },
        },
        Shape {
            name: "mistral-7b",
            source: "Mistral-7B v0.1",
            config: LlamaConfig {
                vocab: 32_000,
                width: 4096,
                depth: 32,
                heads: 32,
                kv_heads: 8,
                ffn: 14_336,
                context: 32_768,
                rope_theta: 10_000.0,
                norm_eps: 1e-5,
                ..base
            },
        },
    ]
}
