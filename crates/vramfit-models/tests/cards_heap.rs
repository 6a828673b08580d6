//! An H200's recorded transformer run predicted from the CPU: the run
//! `scripts/gpu-all.sh` made on 2026-11-26 (`train transformer --budget
//! 1.3GiB`, the planner's winner: checkpoint list:0,1,2, 16 × 512 tokens),
//! traced here on the CPU ([`vramfit::pools::trace_on_cpu`]) with the same
//! settings and replayed through the pools cubecl-cuda makes for an H200.
//! Alone in its test binary: the heap recording is process-wide.

use burn::backend::{Autodiff, Flex};
use vramfit::pools::{Card, replay, trace_on_cpu};
use vramfit::run::{RunPath, Start};
use vramfit_models::gpt::TrainConfig;

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

/// The bound docs/results/cards.md reports (measured: −1.15 %).
const BOUND: f64 = 0.05;

#[test]
fn the_h200s_recorded_transformer_peak_is_predicted_from_the_cpu() {
    let run = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench-results/gpu-h200-3/budget/run");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{run}/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["peak_memory_source"], "allocator reserved bytes");
    let recorded = summary["reserved_peak_bytes"].as_u64().unwrap();
    // Its peak was at step 2; three steps as there.
    let mut config: TrainConfig =
        toml::from_str(&std::fs::read_to_string(format!("{run}/config.toml")).unwrap()).unwrap();
    config.steps = 3;
    let tmp = tempfile::tempdir().unwrap();
    let trace = trace_on_cpu(
        || {
            vramfit_models::job::launch::<Autodiff<Flex>>(
                Start::New(config, RunPath::At(tmp.path().join("r"))),
                &Default::default(),
                "cpu",
            )
        },
        3,
    )
    .unwrap();
    let predicted = replay(&trace, &Card::named("h200").unwrap().allocator)
        .unwrap()
        .reserved_peak;
    let error = predicted as f64 / recorded as f64 - 1.0;
    eprintln!(
        "H200: recorded {recorded} B, predicted from the CPU {predicted} B ({:+.2} %)",
        100.0 * error
    );
    assert!(error.abs() <= BOUND, "{:+.2} % off the recorded peak", 100.0 * error);
}
