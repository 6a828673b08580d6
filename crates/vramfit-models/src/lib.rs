//! Workloads that show vramfit's techniques, trained by the composed step
//! of [`vramfit::step::Stepper`]: a GPT-style decoder ([`gpt`]) on
//! deterministic synthetic sequences ([`data`]), a Llama-family decoder
//! with named published shapes ([`llama`]) on the same sequences or a
//! user's corpus ([`corpus`], chosen in [`tokens`]), and a
//! convolutional U-Net with BatchNorm ([`unet`]) denoising crops of the
//! procedural sample ([`denoise`]).
//!
//! Each is a model family ([`family`]): [`job::Job`] is the workload the
//! run driver runs into a run directory (`vramfit train transformer|llm|unet`),
//! with settings from [`config`]; [`plan`] makes it fit a memory budget
//! (`vramfit plan transformer|llm|unet`).
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use vramfit::precision::{Autocast, Precision};
//! use vramfit_models::{data::{SyntheticTask, TaskConfig}, gpt::GptConfig};
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let config = GptConfig { width: 16, depth: 1, heads: 2, vocab: 8, context: 8, ..Default::default() };
//! let model = config.init::<B>(1, &device);
//! let task = SyntheticTask::new(TaskConfig { tokens: 8, ..Default::default() }, 8, 0);
//! let loss = model.loss(&task.batch(0, 2, &device), &Autocast::new(Precision::Bf16));
//! let nats: f32 = loss.into_scalar();
//! assert!((nats - (8f32).ln()).abs() < 0.2, "an untrained model is near ln(vocab): {nats}");
//! ```

pub mod config;
pub mod corpus;
pub mod data;
pub mod denoise;
pub mod family;
pub mod gpt;
pub mod job;
pub mod llama;
pub mod on_ranks;
pub mod plan;
pub mod quality;
pub mod safetensors;
pub mod segmenter;
pub mod tokens;
pub mod traced;
pub mod unet;
pub mod vision;
