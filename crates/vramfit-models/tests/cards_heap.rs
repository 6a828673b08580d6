//! Recorded transformer runs predicted from the CPU: an H200's run that
//! `scripts/gpu-all.sh` made on 2026-11-26 (`train transformer --budget
//! 1.3GiB`, the planner's winner: checkpoint list:0,1,2, 16 × 512 tokens)
//! and an H100's default f32 run (`scripts/transformer-variants.sh cuda`,
//! 2026-11-25), each traced here on the CPU
//! ([`vramfit::pools::trace_on_cpu`]) with the run's settings and replayed
//! through the pools cubecl-cuda makes for that card; and each traced on
//! shapes alone ([`vramfit::pools::trace_shapes`]), computing nothing. One
//! test function, alone in its binary: the heap recording is process-wide.

use burn::backend::{Autodiff, Flex};
use vramfit::pools::{Card, replay, trace_on_cpu, trace_shapes};
use vramfit::run::{RunPath, Start};
use vramfit::shapes::{ShapeDevice, Shapes};
use vramfit_models::gpt::TrainConfig;

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

/// The bound docs/results/cards.md reports (measured: H200 −1.15 %, H100 +0.59 %).
const BOUND: f64 = 0.05;

/// The card's reserved peak for `config`'s first three steps, traced on shapes.
fn predict_on_shapes(config: TrainConfig, card: &str) -> u64 {
    let tmp = tempfile::tempdir().unwrap();
    let card = Card::named(card).unwrap();
    let traced = trace_shapes(
        || {
            vramfit_models::job::launch::<Autodiff<Shapes>>(
                Start::New(config, RunPath::At(tmp.path().join("r"))),
                &ShapeDevice,
                "shapes",
            )
        },
        3,
        card.allocator.alignment,
    )
    .unwrap();
    replay(&traced.trace, &card.allocator).unwrap().reserved_peak
}

/// The card's reserved peak for `config`'s first three steps, traced here.
fn predict(config: TrainConfig, card: &str) -> u64 {
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
    replay(&trace, &Card::named(card).unwrap().allocator)
        .unwrap()
        .reserved_peak
}

fn json(relative: &str) -> serde_json::Value {
    let path = format!("{}/../../{relative}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))).unwrap()
}

#[test]
fn recorded_transformer_peaks_are_predicted_from_the_cpu_and_on_shapes() {
    let run = "bench-results/gpu-h200-3/budget/run";
    let summary = json(&format!("{run}/summary.json"));
    assert_eq!(summary["peak_memory_source"], "allocator reserved bytes");
    let h200 = summary["reserved_peak_bytes"].as_u64().unwrap();
    // Its peak was at step 2; three steps as there.
    let text = std::fs::read_to_string(format!("{}/../../{run}/config.toml", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mut config: TrainConfig = toml::from_str(&text).unwrap();
    config.steps = 3;
    let h100_run = json("bench-results/gpu-h100/transformer-cuda/1-f32.summary.json");
    assert_eq!(h100_run["peak_memory_source"], "allocator reserved bytes");
    let h100 = h100_run["reserved_peak_bytes"].as_u64().unwrap();
    let h100_config = TrainConfig {
        steps: 3,
        checkpoint_every: 0,
        ..Default::default()
    };
    for (card, recorded, config) in [("h200", h200, config), ("h100-80", h100, h100_config)] {
        let from_cpu = predict(config.clone(), card);
        let on_shapes = predict_on_shapes(config, card);
        for (how, predicted) in [("from the CPU", from_cpu), ("on shapes", on_shapes)] {
            let error = predicted as f64 / recorded as f64 - 1.0;
            eprintln!(
                "{card}: recorded {recorded} B, predicted {how} {predicted} B ({:+.2} %)",
                100.0 * error
            );
            assert!(
                error.abs() <= BOUND,
                "{card}: {:+.2} % off the recorded peak ({how})",
                100.0 * error
            );
        }
    }
}
