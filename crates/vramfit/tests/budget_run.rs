//! A run held to a budget: when the figure that decides an out-of-memory
//! (the heap here, through the counting allocator) passes the budget, the
//! run ends as an out-of-memory would, with `oom.json`; a planned run then
//! falls back to its next plan from the last checkpoint and finishes within
//! the budget, every step once, without any simulated failure.

use std::ops::ControlFlow;
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use vramfit::plan::{Knobs, Options, Plannable, Runnable, run_plans};
use vramfit::run::{RunError, RunPath, Start};
use vramfit::trainer::{Schedule, TrainerTarget};

mod common;

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

type A = Autodiff<Flex>;

#[test]
fn a_run_past_its_budget_ends_as_an_out_of_memory_and_a_planned_run_falls_back() {
    assert!(vramfit::heap::installed());
    // Activations (the batch through six blocks) dominate: micro-batches lower the peak.
    let (k, batch, n) = (6, 4096, 128);
    let device = Default::default();
    let schedule = Schedule {
        steps: 6,
        batch_size: batch,
        lr: 1e-3,
        checkpoint_every: 2,
        profile_every: 1,
    };
    let data = move |step: u64, size: usize, d: &burn::tensor::Device<A>| {
        Tensor::<A, 2>::from_data(
            TensorData::new(
                (0..size * n)
                    .map(|i| ((i as u64 * 7 + step) % 13) as f32 / 13.0)
                    .collect(),
                [size, n],
            ),
            d,
        )
    };
    let mut target = TrainerTarget::new(move |d| common::chain::<A>(k, n, d), Arc::new(data), schedule, &device);
    let plain = Knobs::base(k, batch);
    let lean = Knobs {
        micro_batch: batch / 4,
        ..plain.clone()
    };
    let (p, l) = (
        target.measure(&plain, batch).unwrap(),
        target.measure(&lean, batch).unwrap(),
    );
    // Measured: 23.2 MiB plain, 11.6 MiB in micro-batches of a quarter.
    let (plain_peak, lean_peak) = (p.peak_bytes, l.peak_bytes);
    assert!(
        lean_peak < plain_peak * 9 / 10,
        "lean {lean_peak} not clearly below plain {plain_peak}"
    );
    let budget = (plain_peak + lean_peak) / 2;
    let tmp = std::env::temp_dir().join(format!("vramfit-budget-run-{}", std::process::id()));

    // The plain plan alone, held to the budget: an out-of-memory, with oom.json.
    let alone = tmp.join("alone");
    let (run, workload) = target
        .launch(Start::New(plain.clone(), RunPath::At(alone.clone())))
        .unwrap();
    let e = run
        .with_budget(budget)
        .drive(workload, |_| ControlFlow::Continue(()))
        .unwrap_err();
    assert!(matches!(e, RunError::OutOfMemory(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("over the run's budget of"), "{msg}");
    let oom: serde_json::Value = serde_json::from_slice(&std::fs::read(alone.join("oom.json")).unwrap()).unwrap();
    assert_eq!(oom["budget_bytes"], budget);
    assert!(
        !alone.join("summary.json").exists(),
        "a run over its budget does not finish"
    );

    // Planned: the plain plan first, the lean one after it.
    let out = tmp.join("planned");
    let planned = run_plans(
        &target,
        &[plain, lean],
        serde_json::json!({ "budget_bytes": budget }),
        Some(budget),
        &Options::new(RunPath::At(out.clone())),
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    assert_eq!(planned.fallbacks.len(), 1, "{:?}", planned.fallbacks);
    assert!(planned.fallbacks[0].error.contains("budget"), "{:?}", planned.fallbacks);
    let summary = planned.summary.unwrap();
    assert_eq!(summary.steps, 6);
    assert!(summary.peak_memory_bytes.unwrap() <= budget);
    let steps = vramfit::run::logged_steps(&out).unwrap();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>(), "every step once");
    let settings: Knobs = toml::from_str(&std::fs::read_to_string(out.join("config.toml")).unwrap()).unwrap();
    assert_eq!(settings.micro_batch, batch / 4, "the run continued under the lean plan");
    std::fs::remove_dir_all(&tmp).ok();
}
