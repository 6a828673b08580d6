//! vramfit: make GPU training jobs fit in the memory you have, and show
//! where the memory goes.
//!
//! This crate holds what every workload shares: the memory profiler
//! ([`profile`]), the run directory with its atomic checkpoints, metrics
//! stream and TensorBoard events ([`run`]), the optimiser on plain tensors
//! ([`optim`]) and host memory readings ([`memory`]), the training
//! techniques: mixed precision and loss scaling ([`precision`]), block
//! activation checkpointing ([`activation_checkpointing`]), micro-batching with gradient
//! accumulation ([`batch`]), reduced-precision storage ([`storage`]) and
//! the allocator policy ([`allocator`]) and the allocator of a card modelled
//! ([`pools`]), fused CPU softmax and layer norm
//! ([`fused`]), and the planner that picks the
//! fastest combination of them for a memory budget ([`plan`], with
//! [`trainer`] for a user's own model).
//!
//! A Burn user plans their own model into a memory budget: describe it as
//! `prelude → blocks → head` ([`step::Trainable`]), give it a function that
//! makes batches, and let the planner probe it ([`plan`]) and run the
//! fastest plan that fits through the run driver ([`run`]). The same in full,
//! with a budget check, is `examples/plan_my_model.rs`.
//!
//! ```no_run
//! # use std::{ops::{ControlFlow, Range}, sync::Arc};
//! use burn::{backend::{Autodiff, Flex}, nn::{Linear, LinearConfig}, prelude::*};
//! use burn::tensor::backend::AutodiffBackend;
//! use vramfit::{activation_checkpointing::Block, precision::Autocast, step::Trainable};
//! use vramfit::plan::{Options, run_within};
//! use vramfit::run::RunPath;
//! use vramfit::trainer::{Schedule, TrainerTarget};
//!
//! #[global_allocator] // on the CPU the heap decides an out-of-memory: count it
//! static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);
//!
//! #[derive(Module, Debug)]
//! struct Layer<B: Backend> { lin: Linear<B> }
//! #[derive(Module, Debug)]
//! struct Net<B: Backend> { input: Linear<B>, layers: Vec<Layer<B>>, out: Linear<B> }
//! struct Batch<B: Backend> { x: Tensor<B, 2>, y: Tensor<B, 2> }
//!
//! impl<B: Backend> Block<B, 2> for Layer<B> {
//!     fn forward(&self, x: Tensor<B, 2>, _: &Autocast) -> Tensor<B, 2> {
//!         x.clone() + burn::tensor::activation::relu(self.lin.forward(x))
//!     }
//! }
//! impl<B: AutodiffBackend> Trainable<B, 2> for Net<B> {
//!     type Batch = Batch<B>;
//!     type Block = Layer<B>;
//!     fn micro_batch(b: &Batch<B>, r: Range<usize>) -> Batch<B> {
//!         Batch { x: b.x.clone().slice([r.clone()]), y: b.y.clone().slice([r]) }
//!     }
//!     fn batch_bytes(b: &Batch<B>) -> u64 { 4 * (b.x.shape().num_elements() + b.y.shape().num_elements()) as u64 }
//!     fn prelude(&self, b: &Batch<B>, _: &Autocast) -> Tensor<B, 2> { self.input.forward(b.x.clone()) }
//!     fn blocks(&self) -> &[Layer<B>] { &self.layers }
//!     fn head(&self, x: Tensor<B, 2>, b: &Batch<B>, _: &Autocast) -> Tensor<B, 1> {
//!         (self.out.forward(x) - b.y.clone()).powi_scalar(2).mean()
//!     }
//! }
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let make = |d: &burn::tensor::Device<B>| Net::<B> {
//!     input: LinearConfig::new(32, 512).init(d),
//!     layers: (0..8).map(|_| Layer { lin: LinearConfig::new(512, 512).init(d) }).collect(),
//!     out: LinearConfig::new(512, 1).init(d),
//! };
//! let batches = Arc::new(|step: u64, n: usize, d: &burn::tensor::Device<B>| {
//!     let x = Tensor::<B, 2>::ones([n, 32], d) * (step as f32).sin();
//!     Batch { y: x.clone().sum_dim(1), x }
//! });
//! let schedule = Schedule { steps: 100, batch_size: 256, lr: 1e-3, checkpoint_every: 0, profile_every: 10 };
//!
//! let mut target = TrainerTarget::new(make, batches, schedule, &device);
//! // Probe (one short run per knob), choose the fastest plan that fits
//! // 48 MiB, verify it at the run's batch, run it held to the budget, and
//! // fall back to the next plan from the last checkpoint on an out-of-memory.
//! let options = Options::new(RunPath::At("runs/mine".into()));
//! let within = run_within(&mut target, 48 << 20, "cpu", &options, |_| ControlFlow::Continue(()))?;
//! let choice = &within.verified.choice;
//! println!("{} because {}", choice.plans[0].setting.describe(256), choice.why);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod activation_checkpointing;
pub mod allocator;
pub mod attention_check;
pub mod backends;
pub mod batch;
pub mod chunked_loss;
pub mod files;
pub mod frozen;
pub mod fused;
pub mod grads;
pub mod heap;
pub mod lora;
pub mod memory;
pub mod optim;
pub mod params;
pub mod plan;
pub mod pools;
pub mod precision;
pub mod profile;
pub mod ranks;
pub mod remedy;
pub mod run;
pub mod settings;
pub mod shapes;
pub mod step;
pub mod storage;
pub mod trainer;
