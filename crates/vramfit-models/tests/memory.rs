//! The transformer's memory as the profiler measures it on the CPU (the
//! counting allocator, as in the binary): the activations kept for backward
//! fall with checkpointing and with micro-batching at a fixed batch. One
//! test function: the heap counters are process-wide.

use std::ops::ControlFlow;

use burn::backend::{Autodiff, Flex};
use vramfit::profile::{Category, MemoryReport};
use vramfit::run::{RunPath, Start};
use vramfit_models::gpt::TrainConfig;
use vramfit_models::job::launch;

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

fn config(checkpoint: &str, micro_batch: usize, accumulate: usize) -> TrainConfig {
    let mut c = TrainConfig {
        steps: 3,
        batch_size: 16,
        micro_batch,
        accumulate,
        checkpoint: checkpoint.into(),
        log_every: 1,
        checkpoint_every: 0,
        profile_every: 1,
        ..Default::default()
    };
    c.model.depth = 4;
    c.task.tokens = 32;
    c
}

/// The largest activations of any forward phase of the last step, and the headline.
fn measure(c: TrainConfig) -> (u64, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let (run, w) =
        launch::<Autodiff<Flex>>(Start::New(c, RunPath::At(out.clone())), &Default::default(), "cpu").unwrap();
    run.drive(w, |_| ControlFlow::Continue(())).unwrap().unwrap();
    let report: MemoryReport = serde_json::from_slice(&std::fs::read(out.join("memory.json")).unwrap()).unwrap();
    let last = report.records.last().unwrap().step;
    let acts = report
        .records
        .iter()
        .filter(|r| r.step == last && r.phase == "forward")
        .map(|r| r.categories[&Category::Activations])
        .max()
        .unwrap();
    let headline = report.headline.unwrap();
    assert!(headline.exact && headline.figure.contains("heap"), "{headline:?}");
    (acts, headline.bytes)
}

#[test]
fn activations_fall_with_checkpointing_and_with_micro_batches() {
    let (plain, plain_peak) = measure(config("none", 16, 1));
    let (all, all_peak) = measure(config("all", 16, 1));
    let (quarter, quarter_peak) = measure(config("none", 4, 4));
    eprintln!(
        "activations: none {plain}, checkpoint all {all}, 4×4 micro-batches {quarter}; \
         peaks {plain_peak}, {all_peak}, {quarter_peak}"
    );
    assert!(plain > 1 << 20, "a batch of 16 × 32 tokens keeps MiBs: {plain}");
    // Checkpointing every block keeps only the blocks' inputs: measured 1/10 of plain.
    assert!(all * 3 < plain, "checkpoint all: {all} vs {plain}");
    // A quarter of the batch per micro-batch keeps about a quarter (measured 0.26).
    assert!(quarter * 3 < plain, "4×4: {quarter} vs {plain}");
    assert!(all_peak < plain_peak && quarter_peak < plain_peak);
}
