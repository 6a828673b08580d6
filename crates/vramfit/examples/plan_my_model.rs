//! Your own Burn model, planned into a memory budget and run there.
//!
//! A residual MLP, not one of vramfit's models, says how it is laid out
//! (`prelude → blocks → head`); the planner probes it, picks the fastest
//! plan that fits, and the run driver runs it with the profiler on.
//! `cargo run --release -p vramfit --example plan_my_model`

use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramfit::checkpoint::Block;
use vramfit::plan::{Knobs, PlanError, calibrate};
use vramfit::precision::Autocast;
use vramfit::profile::human_bytes;
use vramfit::run::{Run, RunPath};
use vramfit::step::Trainable;
use vramfit::trainer::{Schedule, TrainerTarget};

// On the CPU the heap is the figure that decides an out-of-memory: count it.
#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

// ---- the user's model, as they would write it for Burn ----

#[derive(Module, Debug)]
struct Residual<B: Backend> {
    up: Linear<B>,
    down: Linear<B>,
}

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    embed: Linear<B>,
    blocks: Vec<Residual<B>>,
    head: Linear<B>,
}

struct Batch<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 1, Int>,
}

fn linear<B: Backend>(a: &Autocast, x: Tensor<B, 2>, l: &Linear<B>) -> Tensor<B, 2> {
    a.linear(x, l.weight.val(), l.bias.as_ref().map(|b| b.val()))
}

// ---- what vramfit needs to know: the chain, and how to split a batch ----

impl<B: Backend> Block<B, 2> for Residual<B> {
    fn forward(&self, x: Tensor<B, 2>, a: &Autocast) -> Tensor<B, 2> {
        let h = burn::tensor::activation::gelu(linear(a, x.clone(), &self.up));
        x + a.full(linear(a, h, &self.down))
    }
}

impl<B: AutodiffBackend> Trainable<B, 2> for Mlp<B> {
    type Batch = Batch<B>;
    type Block = Residual<B>;
    fn micro_batch(b: &Batch<B>, r: Range<usize>) -> Batch<B> {
        Batch {
            x: b.x.clone().slice([r.clone()]),
            y: b.y.clone().slice([r]),
        }
    }
    fn batch_bytes(b: &Batch<B>) -> u64 {
        (b.x.shape().num_elements() * 4 + b.y.shape().num_elements() * 8) as u64
    }
    fn prelude(&self, b: &Batch<B>, a: &Autocast) -> Tensor<B, 2> {
        a.full(linear(a, b.x.clone(), &self.embed))
    }
    fn blocks(&self) -> &[Residual<B>] {
        &self.blocks
    }
    fn head(&self, x: Tensor<B, 2>, b: &Batch<B>, a: &Autocast) -> Tensor<B, 1> {
        let logits = a.full(linear(a, x, &self.head));
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, b.y.clone())
    }
}

/// Deterministic data: the class is written, faintly, into the features.
fn batch<B: Backend>(step: u64, n: usize, device: &B::Device) -> Batch<B> {
    let (features, classes) = (64, 10);
    let y: Vec<i64> = (0..n).map(|i| ((step as usize * 7 + i * 3) % classes) as i64).collect();
    let x: Vec<f32> = (0..n * features)
        .map(|k| {
            let (i, j) = (k / features, k % features);
            let signal = if j % classes == y[i] as usize { 0.5 } else { 0.0 };
            signal + 0.3 * ((k as f32 * 0.7 + step as f32).sin())
        })
        .collect();
    Batch {
        x: Tensor::from_data(TensorData::new(x, [n, features]), device),
        y: Tensor::from_data(TensorData::new(y, [n]), device),
    }
}

fn main() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    let make = |d: &burn::tensor::Device<B>| Mlp::<B> {
        embed: LinearConfig::new(64, 128).init(d),
        blocks: (0..6)
            .map(|_| Residual {
                up: LinearConfig::new(128, 512).init(d),
                down: LinearConfig::new(512, 128).init(d),
            })
            .collect(),
        head: LinearConfig::new(128, 10).init(d),
    };
    let schedule = Schedule {
        steps: 12,
        batch_size: 256,
        lr: 1e-3,
        checkpoint_every: 0,
        profile_every: 4,
    };

    // ---- the planner: about ten lines ----
    let mut target = TrainerTarget::new(make, Arc::new(batch::<B>), schedule, &device);
    let cal = calibrate(&mut target, None).expect("the probes run");
    for r in &cal.checks {
        println!(
            "{}: measured {} predicted {}",
            r.name,
            human_bytes(r.measured.peak_bytes),
            human_bytes(r.predicted_peak as u64)
        );
    }
    let plain = cal.predict(&Knobs::base(6, 256)).0 as u64;
    // A card with two thirds of what the plain step needs. Where no plan
    // fits that (this model is mostly parameters and Adam state, and the
    // matrix library's per-thread buffers grow with the thread count), the
    // planner names the least budget that works, as it would for a user.
    let budget = match cal.choose(plain * 2 / 3) {
        Ok(_) => plain * 2 / 3,
        Err(PlanError::Infeasible { smallest_bytes, .. }) => {
            println!(
                "two thirds of the plain step is too little; the least that works: {}",
                human_bytes(smallest_bytes)
            );
            smallest_bytes
        }
        Err(e) => panic!("{e}"),
    };
    let choice = cal.choose(budget).expect("a plan fits the budget the planner named");
    let winner = &choice.plans[0];
    println!("plain step: {}; budget {}", human_bytes(plain), human_bytes(budget));
    println!("plan: {} ({})", winner.knobs.describe(256), choice.why);

    let dir = std::env::temp_dir().join(format!("vramfit-example-{}", std::process::id()));
    let run = Run::create(&RunPath::At(dir.clone()), "", "cpu").expect("a fresh directory");
    let trainer = target.trainer(&winner.knobs).expect("the plan's settings are valid");
    let summary = run
        .drive(trainer, |_| ControlFlow::Continue(()))
        .expect("the run finishes")
        .unwrap();
    let peak = summary.peak_memory_bytes.expect("the heap is counted");
    println!(
        "ran {} steps: loss {:.3}, peak {} (predicted {}), within the budget: {}",
        summary.steps,
        summary.workload.final_loss,
        human_bytes(peak),
        human_bytes(winner.peak_bytes),
        peak <= budget
    );
    assert!(peak <= budget, "the plan stayed within its budget");
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(test)]
mod tests {
    /// CI runs the example as a test.
    #[test]
    fn the_example_runs_and_stays_within_its_budget() {
        super::main();
    }
}
