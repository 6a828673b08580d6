//! Burn's tensors recorded on the CPU ([`vramfit::pools::trace_on_cpu`])
//! and replayed through wgpu's own pools, against the reserved peak the
//! wgpu allocator measures for the same run (lavapipe in CI): the
//! transformer with and without checkpointing, with the moments on the
//! host, with the allocator cleanup and with the fused attention (measured
//! equal to the byte on 2026-11-28; on 2026-11-29 three of the five one
//! 8 MiB page short, −2.78 … −3.45 %), and the U-Net (measured 7.14 % over:
//! the CPU's convolution makes an NHWC copy and im2col tiles that CubeCL's
//! does not). The same runs traced on shapes alone
//! ([`vramfit::pools::trace_shapes`]: nothing computed), and a Llama LoRA
//! run, are held to the same bounds (measured 2026-11-29: all seven equal
//! to the byte). Two of the transformer's five runs are CI's; the other
//! three are `scripts/lavapipe-long.sh`'s (CI's time). Alone in its test
//! binary: the heap recording is process-wide.
#![cfg(feature = "wgpu")]

use burn::backend::wgpu::WgpuRuntime;
use vramfit::pools::{Allocator, Trace, replay, trace_on_cpu, trace_shapes};
use vramfit::run::{RunPath, Start};
use vramfit::shapes::{ShapeDevice, Shapes};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::Family;
use vramfit_models::gpt::GptConfig;
use vramfit_models::llama::LlamaConfig;
use vramfit_models::unet::UnetConfig;

mod traced_runs;
use traced_runs::{llm, transformer, unet};

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

/// Steps of each run: the pools reach their high-water within two, but
/// the wgpu run's reserved peak moves by a page in the third. Tried at two
/// steps (2026-11-29, 129 s instead of about 187 in CI's lavapipe step):
/// three of the five transformer runs then replayed one 8 MiB page under
/// the measured peak (−2.86 %, −3.12 %, −3.57 %; equal to the byte at
/// three), inside the bound but short on the side that runs out of
/// memory; so three.
const STEPS: u64 = 3;

/// The most the transformer's replayed peak may fall short of or exceed
/// the measured one (measured: equal, all five).
const BOUND: f64 = 0.05;

/// The most the U-Net's replayed peak may exceed the measured one; it may
/// not fall short (the CPU's convolution only adds scratch). Measured:
/// one 8 MiB page, +7.14 %.
const CONV_OVER: f64 = 0.10;

/// The wgpu run's reserved high-water, the CPU trace of the same run and
/// its trace on shapes.
fn both<F: Family<D>, const D: usize>(config: FamilyConfig<F>, alignment: u64) -> (u64, Trace, Trace) {
    let tmp = tempfile::tempdir().unwrap();
    let shapes = trace_shapes(
        || {
            vramfit_models::job::start::<burn::backend::Autodiff<Shapes>, F, D>(
                Start::New(config.clone(), RunPath::At(tmp.path().join("shapes"))),
                &ShapeDevice,
                "shapes",
            )
        },
        STEPS,
        alignment,
    )
    .unwrap()
    .trace;
    let trace = trace_on_cpu(
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
    type W = vramfit::backends::Wgpu;
    let device = Default::default();
    <W as burn::tensor::backend::Backend>::memory_cleanup(&device);
    let (run, job) = vramfit_models::job::start::<W, F, D>(
        Start::New(config, RunPath::At(tmp.path().join("wgpu"))),
        &device,
        "wgpu",
    )
    .unwrap();
    let summary = run
        .drive(job, |_| std::ops::ControlFlow::Continue(()))
        .unwrap()
        .unwrap();
    assert_eq!(summary.peak_memory_source, "allocator reserved bytes");
    (summary.peak_memory_bytes.unwrap(), trace, shapes)
}

fn error(measured: u64, trace: &Trace, allocator: &Allocator, name: &str) -> f64 {
    let predicted = replay(trace, allocator).unwrap().reserved_peak;
    let error = predicted as f64 / measured as f64 - 1.0;
    eprintln!(
        "{name}: measured {measured} B, replayed {predicted} B ({:+.2} %), {} reservations",
        100.0 * error,
        trace.reserves()
    );
    error
}

/// The transformer's runs `ways` (checkpoint, attention, moments,
/// cleanup): both traces within [`BOUND`] of lavapipe's reserved peak.
fn transformer_ways(ways: &[(&str, &str, &str, &str)]) {
    let lavapipe = Allocator::of::<WgpuRuntime>(&Default::default());
    for &(checkpoint, attention, moments, cleanup) in ways {
        let config = transformer(STEPS, checkpoint, attention, moments, cleanup);
        let (measured, cpu, shapes) = both::<GptConfig, 3>(config, lavapipe.alignment);
        for (how, trace) in [("CPU", &cpu), ("shapes", &shapes)] {
            let name = format!(
                "transformer ({how}), checkpoint {checkpoint}, attention {attention}, moments {moments}, cleanup {cleanup}"
            );
            let e = error(measured, trace, &lavapipe, &name);
            assert!(e.abs() <= BOUND, "{name}: the replayed peak is {:+.1} % off", 100.0 * e);
        }
    }
}

/// Three more of the transformer's ways, each a case the others cover in
/// part (the plain step, which every other run holds; checkpointing
/// without the cleanup; the fused attention, which the llm's run has):
/// about 75 s on lavapipe, so in scripts/lavapipe-long.sh, not CI (its
/// 40-minute aim).
#[test]
#[ignore = "long: scripts/lavapipe-long.sh runs it"]
fn more_transformer_ways_replayed_through_wgpus_pools() {
    transformer_ways(&[
        ("none", "standard", "f32", "never"),
        ("list:0,1", "standard", "f32", "never"),
        ("none", "fused", "f32", "never"),
    ]);
}

#[test]
fn a_cpu_trace_replayed_through_wgpus_pools_gives_its_reserved_peak() {
    let lavapipe = Allocator::of::<WgpuRuntime>(&Default::default());
    transformer_ways(&[
        ("none", "standard", "host", "never"),
        ("list:0,1", "standard", "f32", "step"),
    ]);
    // The Llama family: the CPU trace's figure shown, the shapes' held.
    let (measured, cpu, shapes) =
        both::<LlamaConfig, 3>(llm(STEPS, "lora:8", "f32", "", "fused", "none"), lavapipe.alignment);
    error(measured, &cpu, &lavapipe, "llm LoRA (CPU)");
    let e = error(measured, &shapes, &lavapipe, "llm LoRA (shapes)");
    assert!(
        e.abs() <= BOUND,
        "the llm's replayed peak is {:+.1} % off (shapes)",
        100.0 * e
    );
    let (measured, cpu, shapes) = both::<UnetConfig, 4>(unet(STEPS), lavapipe.alignment);
    let e = error(measured, &cpu, &lavapipe, "U-Net (CPU)");
    assert!(
        (0.0..=CONV_OVER).contains(&e),
        "the U-Net's replayed peak is {:+.1} % off (CPU)",
        100.0 * e
    );
    // On shapes the convolution makes no scratch: it may fall short by the
    // scratch CubeCL's own kernels make, within the transformer's bound.
    let e = error(measured, &shapes, &lavapipe, "U-Net (shapes)");
    assert!(
        (-BOUND..=CONV_OVER).contains(&e),
        "the U-Net's replayed peak is {:+.1} % off (shapes)",
        100.0 * e
    );
}
