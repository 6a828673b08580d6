//! Your own Burn model, planned into a memory budget and run there.
//!
//! A residual MLP, not one of vramfit's models, says how it is laid out
//! (`prelude → blocks → head`); one call ([`run_within`]) probes it, picks
//! the fastest plan that fits the budget, verifies it at the run's batch,
//! and runs it held to the budget, falling back to the next plan from the
//! last checkpoint on an out-of-memory (simulated here). Then a deeper one
//! planned from a 2-block slice, and one whose blocks differ planned for
//! cards it is not on, traced on shapes without computing.
//! `cargo run --release -p vramfit --example plan_my_model`

use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramfit::activation_checkpointing::Block;
use vramfit::plan::{BudgetError, Knobs, Options, PlanError, Plannable, run_within};
use vramfit::pools::Card;
use vramfit::precision::Autocast;
use vramfit::profile::human_bytes;
use vramfit::run::RunPath;
use vramfit::shapes::{ShapeDevice, Shapes};
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
    // The model `depth` blocks deep (what planning from a slice needs; a
    // fixed depth is enough for the rest).
    let make_at = |depth: usize, d: &burn::tensor::Device<B>| Mlp::<B> {
        embed: LinearConfig::new(64, 128).init(d),
        blocks: (0..depth)
            .map(|_| Residual {
                up: LinearConfig::new(128, 512).init(d),
                down: LinearConfig::new(512, 128).init(d),
            })
            .collect(),
        head: LinearConfig::new(128, 10).init(d),
    };
    let make = move |d: &burn::tensor::Device<B>| make_at(6, d);
    let schedule = Schedule {
        steps: 12,
        batch_size: 256,
        lr: 1e-3,
        checkpoint_every: 2,
        profile_every: 4,
    };
    let mut target = TrainerTarget::new(make, Arc::new(batch::<B>), schedule.clone(), &device);
    // A card a tenth smaller than the plain step needs.
    let plain = target
        .measure(&Knobs::base(6, 256), 256)
        .expect("a probe runs")
        .peak_bytes;
    let budget = plain * 9 / 10;

    // ---- the planner: one call ----
    let dir = std::env::temp_dir().join(format!("vramfit-example-{}", std::process::id()));
    let options = Options {
        // The test seam: the first plan fails with an out-of-memory at step
        // 3, to show the run falling back to the next plan from its checkpoint.
        simulate_oom_at: Some(3),
        ..Options::new(RunPath::At(dir.clone()))
    };
    let within = run_within(&mut target, budget, "cpu", &options, |_| ControlFlow::Continue(()))
        .expect("a run within the budget");
    let (choice, planned) = (&within.verified.choice, &within.planned);
    println!("plain step: {}; budget {}", human_bytes(plain), human_bytes(budget));
    println!("plan: {} ({})", choice.plans[0].setting.describe(256), choice.why);
    println!(
        "verified at the run's batch: {}",
        human_bytes(within.verified.measured.peak_bytes)
    );
    for f in &planned.fallbacks {
        println!(
            "fell back to plan {}: {}",
            f.to + 1,
            choice.plans[f.to].setting.describe(256)
        );
    }
    let summary = planned.summary.as_ref().expect("the run finished");
    let peak = summary.peak_memory_bytes.expect("the heap is counted");
    println!(
        "ran {} steps: loss {:.3}, peak {}, within the budget: {}",
        summary.steps,
        summary.workload.final_loss,
        human_bytes(peak),
        peak <= budget
    );
    assert_eq!(planned.fallbacks.len(), 1, "the simulated out-of-memory fell back once");
    assert_eq!(summary.steps, 12);
    assert!(peak <= budget, "the plan stayed within its budget");
    std::fs::remove_dir_all(&dir).ok();

    // A budget nothing fits is an error that names one that works.
    let tiny = Options::new(RunPath::At(dir.join("never")));
    match run_within(&mut target, plain / 10, "cpu", &tiny, |_| ControlFlow::Continue(())) {
        Err(BudgetError::Plan(e @ PlanError::Infeasible { .. })) => println!("{} bytes: {e}", plain / 10),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a tenth of the plain step cannot fit"),
    }
    assert!(!dir.exists(), "nothing was created for the infeasible budget");

    // ---- a model deeper than you would probe: planned from two blocks ----
    // Only the 2-block slice (and one step a block deeper) is probed; every
    // figure is extrapolated to the 24 blocks, and says so.
    let mut deep = TrainerTarget::sliced(make_at, 24, 2, Arc::new(batch::<B>), schedule, &device);
    let cal = vramfit::plan::calibrate(&mut deep, None).expect("the slice's probes run");
    let plain = Knobs::base(24, 256);
    let predicted = cal.predict(&plain).0;
    let measured = deep.measure(&plain, 256).expect("the whole model runs here").peak_bytes;
    println!(
        "24 blocks, planned from a 2-block slice: plain step predicted {}, measured {} ({:+.1} %)",
        human_bytes(predicted as u64),
        human_bytes(measured),
        (predicted / measured as f64 - 1.0) * 100.0
    );
    assert!(cal.slice.is_some(), "extrapolated, and recorded as such");
    assert!(
        (predicted / measured as f64 - 1.0).abs() < 0.10,
        "the slice predicts the whole"
    );

    // ---- blocks that do not repeat, for cards you do not have: traced ----
    // Each block wider than the last, so no slice stands for the others;
    // the same model built on the shape backend, which computes nothing,
    // and every plan of the search traced whole and replayed through each
    // card's own CubeCL pools.
    type S = Autodiff<Shapes>;
    let widths = [256, 512, 1024, 2048];
    let make_widening = move |d: &ShapeDevice| Mlp::<S> {
        embed: LinearConfig::new(64, 128).init(d),
        blocks: widths
            .iter()
            .map(|&w| Residual {
                up: LinearConfig::new(128, w).init(d),
                down: LinearConfig::new(w, 128).init(d),
            })
            .collect(),
        head: LinearConfig::new(128, 10).init(d),
    };
    let traced = TrainerTarget::new(make_widening, Arc::new(batch::<S>), schedule_traced(), &ShapeDevice);
    let cards = [Card::named("t4").expect("a known card"), Card::cuda("8 MiB", 8 << 20)];
    let rows = vramfit::plan::traced::rows_of(&traced, &traced.space(), &cards, 512);
    for r in &rows {
        println!(
            "{}: {} ({})",
            r.card,
            r.plan.as_deref().unwrap_or("none fits"),
            r.peak_bytes.map(human_bytes).unwrap_or_default()
        );
    }
    let t4 = &rows[0];
    assert_eq!(t4.fits, Some(true), "{t4:?}");
    assert!(t4.peak_bytes.unwrap() as f64 * 1.05 <= t4.card_bytes as f64);
    assert!(t4.step_ms_estimate.is_some(), "a named card has a time");
    // 8 MiB holds less than this model's parameters and their moments.
    assert_eq!(rows[1].fits, Some(false), "{:?}", rows[1]);
}

/// The traced model's schedule: as many steps as a trace runs, no checkpoint.
fn schedule_traced() -> Schedule {
    Schedule {
        steps: vramfit::plan::traced::TRACED_STEPS,
        batch_size: 256,
        lr: 1e-3,
        checkpoint_every: 0,
        profile_every: 0,
    }
}

#[cfg(test)]
mod tests {
    /// CI runs the example as a test.
    #[test]
    fn the_example_runs_and_stays_within_its_budget() {
        super::main();
    }
}
