//! The whole step traced on shapes alone (`vramfit::pools::trace_shapes`)
//! against the same step traced on the CPU with its heap recorded
//! (`trace_on_cpu`, itself checked against lavapipe and an H200): both
//! replayed through the same cards' pools. Alone in its test binary: the
//! heap recording is process-wide.

use burn::backend::Autodiff;
use vramfit::pools::{Card, Trace, replay, trace_on_cpu, trace_shapes};
use vramfit::run::{RunPath, Start};
use vramfit::shapes::{ShapeDevice, Shapes};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::Family;
use vramfit_models::gpt::{GptConfig, TrainConfig};

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

const STEPS: u64 = 3;

fn both<F: Family<D>, const D: usize>(config: FamilyConfig<F>) -> (Trace, Trace) {
    let tmp = tempfile::tempdir().unwrap();
    let cpu = trace_on_cpu(
        || {
            vramfit_models::job::start::<vramfit::backends::Flex, F, D>(
                Start::New(config.clone(), RunPath::At(tmp.path().join("cpu"))),
                &Default::default(),
                "cpu",
            )
        },
        STEPS,
    )
    .unwrap();
    let shapes = trace_shapes(
        || {
            vramfit_models::job::start::<Autodiff<Shapes>, F, D>(
                Start::New(config, RunPath::At(tmp.path().join("shapes"))),
                &ShapeDevice,
                "shapes",
            )
        },
        STEPS,
        512,
    )
    .unwrap();
    eprintln!("{} operations, {} reads", shapes.operations, shapes.reads);
    (cpu, shapes.trace)
}

fn transformer(checkpoint: &str, attention: &str, moments: &str, cleanup: &str) -> TrainConfig {
    let mut c = TrainConfig {
        steps: STEPS,
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

#[test]
fn a_trace_on_shapes_replays_as_the_cpu_trace() {
    for (checkpoint, attention, moments, cleanup) in [
        ("none", "standard", "f32", "never"),
        ("list:0,1", "standard", "f32", "never"),
        ("none", "standard", "host", "never"),
        ("list:0,1", "standard", "f32", "step"),
    ] {
        let (cpu, shapes) = both::<GptConfig, 3>(transformer(checkpoint, attention, moments, cleanup));
        for card in ["t4", "h100-80"] {
            let card = Card::named(card).unwrap();
            let a = replay(&cpu, &card.allocator).unwrap().reserved_peak;
            let b = replay(&shapes, &card.allocator).unwrap().reserved_peak;
            eprintln!(
                "{checkpoint} {attention} {moments} {cleanup} {}: cpu {a} shapes {b} ({:+.2} %); in use {} / {}; reserves {} / {}",
                card.name,
                100.0 * (b as f64 / a as f64 - 1.0),
                cpu.in_use_peak(),
                shapes.in_use_peak(),
                cpu.reserves(),
                shapes.reserves()
            );
        }
    }
}
