//! The planner on the transformer and the U-Net, on every backend present (Flex with the
//! counting allocator; wgpu's allocator under the `wgpu` feature): at
//! budgets from infeasible to ample, a plan is verified within its budget
//! (the pipeline's [`vramfit::plan::verify`]: the ranked winner, else one
//! of the next two, measured at the run's shape) and is near its
//! prediction; the infeasible budget's error names a budget that works; a
//! run whose plan runs out of memory falls back to the next plan and
//! finishes with every step.
//!
//! The ranked winner alone is not asserted within the budget: on Flex the
//! heap peak of the same plan moves by several per cent from run to run
//! (threads' allocations overlap differently), more than the calibration's
//! margin at times: the winner measured 0.4-5.6 % over its budget in 3 of
//! 9 runs on a 2-core EPYC (2026-11-28; 1 of the 4 on the code of ed24dca).
//! That is what verification is for.

use std::ops::ControlFlow;
use std::sync::Mutex;

use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{PlanError, Plannable, Strategy, calibrate};
use vramfit::profile::{DeviceMemory, human_bytes};
use vramfit::run::RunPath;
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::Family;
use vramfit_models::gpt::TrainConfig;
use vramfit_models::plan::{FamilyTarget, apply};
use vramfit_models::unet::UnetTrainConfig;

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

/// The heap counters are process-wide: one backend at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Predicted peaks must be this close to the measured ones: 10 %, or two
/// allocator pages where pages are coarser. CubeCL's pools reserve whole
/// pages (8 MiB for small buffers, a third of a 24 MiB plan): the model is
/// fitted on page-rounded readings (up to a page off) and its prediction is
/// rounded up to a page (up to one more).
const PREDICTION_TOLERANCE: f64 = 0.10;

/// How far above its measured peak a transformer plan's prediction may be:
/// the largest excess measured, +13.1 % (the check that combines f16, every
/// block checkpointed, bf16 storage and moments and the fused attention, on
/// an AMD EPYC without AVX-512, whose matrix kernels keep other scratch:
/// the knobs' savings overlap there and the model adds them; within 2 % on
/// the machine bench-results/plan-transformer-cpu.md was measured on), with
/// room for noise. Over costs headroom, never an out-of-memory; under stays
/// at [`PREDICTION_TOLERANCE`].
const TRANSFORMER_OVER: f64 = 0.16;

/// How far below its measured peak a U-Net plan's prediction may be: the
/// largest shortfall measured, 11.2 % (2×4 checkpointed plans on threaded
/// Flex), with room for run-to-run noise.
const UNET_UNDER: f64 = 0.15;

/// Whether `predicted` is close enough to `measured`: at most `under` below
/// it (an under-prediction risks an out-of-memory) and at most `over` above
/// it (an over-prediction costs headroom, never a failure), or within two
/// allocator pages where pages are coarser. Both bounds are constants of the
/// caller, chosen from measured errors, not the calibration's own margin
/// (which is twice the largest shortfall over these same probes, so a bound
/// taken from it could not fail).
fn close(predicted: f64, measured: u64, page: u64, under: f64, over: f64) -> bool {
    let error = predicted / measured as f64 - 1.0;
    let pages = 2.0 * page as f64 / measured as f64;
    error >= -under.max(pages) && error <= over.max(pages)
}

/// `under` and `over`: how far below and above the measured peak a
/// prediction may be.
fn plans_fit_their_budgets<B, F: Family<D>, const D: usize>(base: FamilyConfig<F>, under: f64, over: f64)
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = B::Device::default();
    let mut target = FamilyTarget::<B, F, D>::new(base.clone(), &device).unwrap();
    let cal = calibrate(&mut target, None).unwrap();
    for r in cal.probes.iter().chain(&cal.checks) {
        eprintln!(
            "{:<32} {:<44} measured {:>10} predicted {:>10} ({:+.1} %) · {:.1} ms",
            r.name,
            r.knobs.describe(r.batch),
            human_bytes(r.measured.peak_bytes),
            human_bytes(r.predicted_peak as u64),
            (r.predicted_peak / r.measured.peak_bytes as f64 - 1.0) * 100.0,
            r.measured.step_ms
        );
    }
    let page = cal.model.page_bytes;
    for r in &cal.checks {
        assert!(
            close(r.predicted_peak, r.measured.peak_bytes, page, under, over),
            "{}: predicted {} for {} measured",
            r.name,
            r.predicted_peak,
            r.measured.peak_bytes
        );
    }

    // Infeasible: under the leanest plan. Its error names a budget that works.
    let lean = cal.leanest();
    let e = cal.choose(lean.peak_bytes * 4 / 5).unwrap_err();
    let PlanError::Infeasible { smallest_bytes, .. } = e else {
        panic!("{e}")
    };
    eprintln!("infeasible: {e}");
    let plain = cal
        .predict(&vramfit::plan::Knobs::base(cal.space.blocks, base.batch_size))
        .0 as u64;
    let budgets = [
        smallest_bytes,
        smallest_bytes + (plain - smallest_bytes.min(plain)) / 3,
        smallest_bytes + 2 * (plain - smallest_bytes.min(plain)) / 3,
        plain * 3 / 2,
    ];
    let mut chosen = Vec::new();
    for budget in budgets {
        // Err when neither the winner nor the next two measured within.
        let verified = vramfit::plan::verify(&cal, &mut target, budget).unwrap();
        let (winner, measured) = (&verified.choice.plans[0], verified.measured);
        let error = winner.peak_bytes as f64 / measured.peak_bytes as f64 - 1.0;
        eprintln!(
            "budget {:>10}: {} · predicted {} · measured {} ({:+.1} %)",
            human_bytes(budget),
            winner.setting.describe(base.batch_size),
            human_bytes(winner.peak_bytes),
            human_bytes(measured.peak_bytes),
            error * 100.0
        );
        assert!(
            close(winner.peak_bytes as f64, measured.peak_bytes, page, under, over),
            "prediction off by {:.1} %",
            error * 100.0
        );
        chosen.push(winner.setting.clone());
    }
    // With an ample budget nothing slower than the plain step is chosen
    // (times within the probes' resolution count as equal).
    let plain_ms = cal
        .predict(&vramfit::plan::Knobs::base(cal.space.blocks, base.batch_size))
        .1;
    assert!(cal.predict(&chosen[3]).1 <= plain_ms * 1.05, "{:?}", chosen[3]);

    // A plan that runs out of memory at step 3 falls back to the next one.
    let choice = cal.choose(budgets[1]).unwrap();
    let plans: Vec<FamilyConfig<F>> = choice.plans[..2]
        .iter()
        .map(|p| FamilyConfig {
            steps: 6,
            log_every: 1,
            checkpoint_every: 2,
            ..apply(&base, &p.setting, base.batch_size, &cal.space)
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("planned");
    let options = vramfit::plan::Options {
        simulate_oom_at: Some(3),
        ..vramfit::plan::Options::new(RunPath::At(out.clone()))
    };
    let planned = vramfit::plan::run_plans(
        &target,
        &plans,
        serde_json::json!({ "budget": budgets[1] }),
        None,
        &options,
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    assert_eq!(planned.fallbacks.len(), 1, "{:?}", planned.fallbacks);
    assert_eq!(planned.summary.as_ref().unwrap().steps, 6);
    let steps = vramfit::run::logged_steps(&out).unwrap();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>(), "every step once");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("plan.json")).unwrap()).unwrap();
    assert_eq!(record["running"], 1);
    assert!(out.join("oom.json").is_file());
    let settings = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert_eq!(settings, plans[1].to_toml(), "the run continued under the next plan");
}

/// The default shape: 18 MiB of heap at its plain step.
#[test]
fn flex() {
    // Measured on Flex: every check and plan within 2 % (bench-results/plan-transformer-cpu.md),
    // one check 13.1 % over on another CPU.
    plans_fit_their_budgets::<vramfit::backends::Flex, _, 3>(
        TrainConfig::default(),
        PREDICTION_TOLERANCE,
        TRANSFORMER_OVER,
    );
}

/// A U-Net with BatchNorm: every plan that splits the batch says that it
/// changes the numerics (each micro-batch normalised by its own statistics).
#[test]
fn unet_flex() {
    let mut c = UnetTrainConfig::default();
    (c.task.resolution, c.task.source, c.model.width, c.model.depth) = (32, 64, 8, 2);
    let device = Default::default();
    let target = FamilyTarget::<vramfit::backends::Flex, _, 4>::new(c.clone(), &device).unwrap();
    let space = target.space();
    assert_eq!(space.batch_statistics.as_deref(), Some("BatchNorm"));
    let split = vramfit::plan::Knobs {
        micro_batch: 2,
        ..vramfit::plan::Knobs::base(space.blocks, space.batch)
    };
    assert!(
        split.quality_costs(&space).iter().any(|q| q.contains("BatchNorm")),
        "{:?}",
        split.quality_costs(&space)
    );
    drop(target);
    // The model treats the stages as equal blocks and counts a checkpointed
    // stage's input in f32, where a U-Net's stages differ by level and keep
    // their inputs in the low type: combinations of precision and
    // checkpointing are over-predicted (measured +11.8 %), which costs
    // headroom, never an out-of-memory. Under: with Flex threaded, the 2×4
    // checkpointed plans measured up to 11.2 % over their prediction.
    plans_fit_their_budgets::<vramfit::backends::Flex, _, 4>(c, UNET_UNDER, 0.25);
}

/// wgpu's pools reserve whole pages of several MiB: a shape whose plain
/// step reserves about ten of them, so that a page is within the tolerance.
#[cfg(feature = "wgpu")]
#[test]
fn calibration_wgpu() {
    let mut c = TrainConfig::default();
    c.model.width = std::env::var("W").map(|v| v.parse().unwrap()).unwrap_or(128);
    c.task.tokens = std::env::var("T").map(|v| v.parse().unwrap()).unwrap_or(64);
    c.model.context = c.task.tokens;
    plans_fit_their_budgets::<vramfit::backends::Wgpu, _, 3>(c, PREDICTION_TOLERANCE, PREDICTION_TOLERANCE);
}

/// How far a whole-depth peak predicted from a 2-block slice may be from
/// the measured one: the heap's run-to-run noise on Flex (several per
/// cent, see the module's note) and the extrapolation's own error
/// (measured −0.4 % to +2.3 % on the shape below on a 2-core EPYC).
const SLICE_TOLERANCE: f64 = 0.08;

/// A Llama `depth` blocks deep and `width` wide, `tokens` a sample,
/// planned from a 2-block slice (at `probe_tokens` and twice that, where
/// given): the plain and the every-block-checkpointed plans' peaks at the
/// whole depth and length, predicted, against the whole model measured: at
/// most [`SLICE_TOLERANCE`] (or one allocator page) under, at most `over`
/// above.
fn a_slice_predicts_the_whole_depth<B>(
    width: usize,
    depth: usize,
    tokens: usize,
    probe_tokens: Option<usize>,
    over: f64,
) where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut base = FamilyConfig::<vramfit_models::llama::LlamaConfig>::default();
    (base.model.width, base.model.depth, base.model.ffn, base.model.vocab) = (width, depth, width * 11 / 4, 64);
    (base.task.tokens, base.batch_size) = (tokens, 4);
    let device = B::Device::default();
    let mut sliced = FamilyTarget::<B, _, 3>::sliced(base.clone(), &device, 2).unwrap();
    if let Some(t) = probe_tokens {
        sliced = sliced.with_probe_tokens(t).unwrap();
    }
    let cal = calibrate(&mut sliced, None).unwrap();
    if let Some(t) = probe_tokens {
        let law = cal.tokens.as_ref().expect("extrapolated in tokens");
        assert_eq!((law.probed, law.tokens), ([t, 2 * t], tokens));
        eprintln!("token law {:?}, its check {:?}", law.block, law.check_error);
        assert!(
            cal.probes.iter().all(|r| r.knobs.checkpointed.len() == 2),
            "the calibration ran at {t} tokens on the slice"
        );
    }
    let slice = cal.slice.as_ref().expect("planned from the slice");
    assert_eq!((slice.blocks, slice.depth, cal.space.blocks), (2, depth, depth));
    for r in cal.probes.iter().chain([&slice.deeper]) {
        eprintln!(
            "{:<24} {:<44} {}",
            r.name,
            r.knobs.describe(r.batch),
            human_bytes(r.measured.peak_bytes)
        );
    }
    eprintln!(
        "each block adds {} to the step, {} to the rest",
        human_bytes(slice.per_block_fixed_bytes as u64),
        human_bytes(slice.per_block_rest_bytes as u64)
    );
    assert!(
        cal.probes.iter().all(|r| r.knobs.checkpointed.len() == 2),
        "only the slice is probed"
    );
    let mut whole = FamilyTarget::<B, _, 3>::new(base.clone(), &device).unwrap();
    assert_eq!(
        whole.space(),
        cal.space,
        "the whole space, extrapolated, is the space counted"
    );
    let plain = vramfit::plan::Knobs::base(depth, 4);
    let checkpointed = vramfit::plan::Knobs {
        checkpointed: vec![true; depth],
        ..plain.clone()
    };
    for knobs in [plain, checkpointed] {
        let predicted = cal.predict(&knobs).0;
        let measured = whole.measure(&knobs, 4).unwrap().peak_bytes;
        let error = predicted / measured as f64 - 1.0;
        eprintln!(
            "{}: predicted {} from the slice, measured {} ({:+.1} %)",
            knobs.describe(4),
            human_bytes(predicted as u64),
            human_bytes(measured),
            error * 100.0
        );
        let page = cal.model.page_bytes as f64 / measured as f64;
        assert!(
            -SLICE_TOLERANCE.max(page) <= error && error <= over.max(page),
            "{}: off by {:.1} %",
            knobs.describe(4),
            error * 100.0
        );
    }
}

#[test]
fn slice_flex() {
    a_slice_predicts_the_whole_depth::<vramfit::backends::Flex>(64, 8, 32, None, SLICE_TOLERANCE);
}

/// Twice the tokens of the probes' longer length (32 and 64 to 128), the
/// attention's scores (`t²`) among a block's bytes. Measured on a 2-core
/// EPYC over three runs: plain +0.4 to +1.5 %, checkpointed +6.1 to +6.8 %
/// (over: a block's recomputation holds less than its stored activations
/// at 128 tokens than the law carries over from 64).
#[test]
fn tokens_flex() {
    a_slice_predicts_the_whole_depth::<vramfit::backends::Flex>(64, 8, 128, Some(32), 0.12);
}

#[cfg(feature = "wgpu")]
#[test]
fn slice_wgpu() {
    // Pools reserve pages of 8 MiB and more: blocks of 12 MiB, deep enough
    // that the deeper probe (eight pages past the slice) is not the whole.
    // The slice's activations are under a page, so checkpointing looks
    // free there: the checkpointed plan is over-predicted (measured +11.1 %,
    // the plain +2.6 %), which costs headroom, never an out-of-memory.
    a_slice_predicts_the_whole_depth::<vramfit::backends::Wgpu>(256, 24, 32, None, 0.15);
}

/// Every combination of the knobs the planner may choose, and so verify
/// and run (precision × storage × moments × attention × checkpointing, at
/// the whole batch, and on the CPU at micro-batches of one), on a tiny shape of each
/// workload: the transformer, the llm trained whole, under LoRA with its
/// base in f32, 16 bits and NF4, with frozen groups, and the U-Net. Each is
/// one probe (a short run through the driver); none may fail or panic.
/// (The crash this guards against: a LoRA projection gave V to the fused
/// attention in f32 where Q and K were bf16.)
fn every_knob_combination_runs<B>()
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut gpt = TrainConfig {
        batch_size: 2,
        ..Default::default()
    };
    (gpt.model.width, gpt.model.heads, gpt.model.depth, gpt.model.vocab) = (16, 2, 2, 16);
    (gpt.model.context, gpt.task.tokens) = (16, 8);
    ran += probe_every_combination::<B, _, 3>("transformer", gpt, &mut failures);
    // A 16-bit base in bf16 where the device has it (wgpu has not: f16).
    let sixteen = if B::supports_dtype(&Default::default(), burn::tensor::DType::BF16) {
        "bf16"
    } else {
        "f16"
    };
    for (train, base) in [
        ("all", ""),
        ("lora:4", ""),
        ("lora:4", sixteen),
        ("qlora:4", ""),
        ("frozen:embedding,blocks.0", ""),
    ] {
        let mut llm = vramfit_models::llama::LlmConfig {
            batch_size: 2,
            ..Default::default()
        };
        let m = &mut llm.model;
        (m.width, m.heads, m.kv_heads, m.ffn, m.depth, m.vocab, m.context) = (32, 4, 2, 64, 2, 32, 16);
        (m.train, m.base) = (train.into(), base.into());
        llm.task.tokens = 8;
        ran += probe_every_combination::<B, _, 3>(&format!("llm --train {train} --base {base}"), llm, &mut failures);
    }
    let mut unet = UnetTrainConfig {
        batch_size: 2,
        ..Default::default()
    };
    (
        unet.task.resolution,
        unet.task.source,
        unet.model.width,
        unet.model.depth,
    ) = (16, 32, 8, 2);
    ran += probe_every_combination::<B, _, 4>("unet", unet, &mut failures);
    eprintln!("{ran} probes, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {ran} probes failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn probe_every_combination<B, F: Family<D>, const D: usize>(
    name: &str,
    base: FamilyConfig<F>,
    failures: &mut Vec<String>,
) -> usize
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    let device = B::Device::default();
    let mut target =
        FamilyTarget::<B, F, D>::new(base, &device).unwrap_or_else(|e| panic!("{name}: the settings: {e}"));
    let space = target.space();
    let n = space.blocks;
    let mut count = 0;
    for knobs in space.combinations(1) {
        // Cleanup is the allocator's (no effect on the graph); storage all
        // or none; micro-batches whole or of one.
        // On a device, the whole batch only (lavapipe takes seconds a probe,
        // and micro-batches run the same graph on fewer samples).
        let storage = knobs.low_storage == 0 || knobs.low_storage == space.storage_groups.len();
        let one = knobs.micro_batch == 1 && vramfit::backends::is_cpu::<B>();
        if knobs.cleanup || !storage || !(knobs.micro_batch == space.batch || one) {
            continue;
        }
        for checkpointed in [vec![false; n], vec![true; n]] {
            let k = vramfit::plan::Knobs {
                checkpointed,
                ..knobs.clone()
            };
            let what = format!("{name}: {}", k.describe(space.batch));
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target.measure(&k, space.batch))) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failures.push(format!("{what}: {e}")),
                Err(panic) => failures.push(format!(
                    "{what}: panicked: {}",
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                )),
            }
            count += 1;
        }
    }
    assert!(count > 0, "{name}: no combination");
    count
}

#[test]
fn every_knob_combination_runs_flex() {
    every_knob_combination_runs::<vramfit::backends::Flex>();
}

#[cfg(feature = "wgpu")]
#[test]
fn every_knob_combination_runs_wgpu() {
    every_knob_combination_runs::<vramfit::backends::Wgpu>();
}

/// `model.base = search`: the planner calibrates the frozen base in f32,
/// in 16 bits and in NF4, and a budget gets the best base at which a plan
/// fits, verified by measurement within it. A run with no plan is refused.
fn the_frozen_base_is_searched<B>()
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    use vramfit::frozen::BaseStorage;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut llm = vramfit_models::llama::LlmConfig {
        batch_size: 2,
        ..Default::default()
    };
    let m = &mut llm.model;
    // Weights that outweigh a short sequence's activations, whole blocks of 64.
    (m.width, m.heads, m.kv_heads, m.ffn, m.depth, m.vocab, m.context) = (128, 4, 2, 256, 2, 128, 16);
    (m.train, m.base) = ("lora:4".into(), vramfit_models::llama::SEARCH_BASE.into());
    llm.task.tokens = 8;
    let device = B::Device::default();
    let e = vramfit_models::job::build::<B, _, 3>(llm.clone(), &device)
        .err()
        .expect("no plan: refused");
    assert!(e.to_string().contains("--budget"), "{e}");
    let mut target = FamilyTarget::<B, _, 3>::new(llm.clone(), &device).unwrap();
    let sixteen = if B::supports_dtype(&device, burn::tensor::DType::BF16) {
        BaseStorage::Bf16
    } else {
        BaseStorage::F16
    };
    assert_eq!(target.space().bases, [BaseStorage::F32, sixteen, BaseStorage::Nf4]);
    // Under LoRA with no base named, the planner searches it too, and a run
    // without a plan stores it in f32; a named base is not searched.
    let unnamed = FamilyConfig {
        model: vramfit_models::llama::LlamaConfig {
            base: String::new(),
            ..llm.model.clone()
        },
        ..llm.clone()
    };
    assert_eq!(
        FamilyTarget::<B, _, 3>::new(unnamed.clone(), &device)
            .unwrap()
            .space()
            .bases,
        target.space().bases
    );
    let job = vramfit_models::job::build::<B, _, 3>(unnamed.clone(), &device).unwrap();
    drop(job);
    let named = FamilyConfig {
        model: vramfit_models::llama::LlamaConfig {
            base: sixteen.name().into(),
            ..llm.model.clone()
        },
        ..llm.clone()
    };
    assert!(
        FamilyTarget::<B, _, 3>::new(named, &device)
            .unwrap()
            .space()
            .bases
            .is_empty()
    );
    let cal = calibrate(&mut target, None).unwrap();
    let bases: Vec<_> = cal.bases().map(|c| c.base.unwrap()).collect();
    assert_eq!(bases, [BaseStorage::F32, sixteen, BaseStorage::Nf4]);
    // Each base's least budget (its leanest plan with its margin), lower as the base is.
    let need: Vec<u64> = cal
        .bases()
        .map(|c| {
            let lean = c.leanest_at_base();
            eprintln!(
                "base {:?}: leanest {} predicted {}",
                c.base,
                lean.setting.describe(llm.batch_size),
                human_bytes(lean.peak_bytes)
            );
            (lean.peak_bytes as f64 * (1.0 + c.own_margin())).ceil() as u64 + (1 << 10)
        })
        .collect();
    assert!(need[0] > need[1] && need[1] > need[2], "{need:?}");
    for (budget, want) in [(need[0], 0), (need[1], 1), (need[2], 2)] {
        let verified = vramfit::plan::verify(&cal, &mut target, budget).unwrap();
        let (winner, measured) = (&verified.choice.plans[0], verified.measured);
        eprintln!(
            "budget {}: {} · predicted {} · measured {}",
            human_bytes(budget),
            winner.setting.describe(llm.batch_size),
            human_bytes(winner.peak_bytes),
            human_bytes(measured.peak_bytes)
        );
        // The best base that fits, or (verification having fallen back) a lower one.
        let at = bases.iter().position(|b| Some(*b) == winner.setting.base).unwrap();
        assert!(
            at >= want,
            "budget {budget}: {:?}, {}",
            winner.setting.base,
            verified.choice.why
        );
        let said = winner.quality.iter().any(|q| q.starts_with("frozen base"));
        assert_eq!(said, at > 0, "{:?}", winner.quality);
        assert!(measured.peak_bytes <= budget);
        // The settings a plan gives store the base as it says.
        let settings = apply(&llm, &winner.setting, llm.batch_size, &cal.space);
        assert_eq!(settings.model.base, bases[at].name());
    }
}

#[test]
fn the_frozen_base_is_searched_flex() {
    the_frozen_base_is_searched::<vramfit::backends::Flex>();
}

#[cfg(feature = "wgpu")]
#[test]
fn the_frozen_base_is_searched_wgpu() {
    the_frozen_base_is_searched::<vramfit::backends::Wgpu>();
}

/// A run on a corpus is planned as the synthetic task of its shape: the
/// same knobs offered, and every probe's batch the same tensors (shapes,
/// element types, bytes), so that nothing the planner measures differs but
/// the ids; a corpus it cannot read is refused before any probe.
#[test]
fn a_corpus_is_planned_as_the_synthetic_task_of_its_shape() {
    use vramfit::step::Trainable;
    use vramfit::trainer::Course;
    use vramfit_models::llama::{Llama, LlamaConfig, LlmConfig};
    type B = burn::backend::Autodiff<vramfit::backends::Flex>;
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus.bin");
    std::fs::write(
        &corpus,
        (0..400u16).flat_map(|i| (i % 32).to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    let mut synthetic = LlmConfig {
        batch_size: 4,
        ..Default::default()
    };
    synthetic.model = LlamaConfig {
        vocab: 32,
        width: 32,
        depth: 2,
        heads: 4,
        kv_heads: 2,
        ffn: 64,
        context: 16,
        train: "lora:4".into(),
        ..Default::default()
    };
    synthetic.task.tokens = 8;
    let mut on_corpus = synthetic.clone();
    on_corpus.task.data = corpus.display().to_string();
    let device = Default::default();
    let space = |c: &LlmConfig| FamilyTarget::<B, _, 3>::new(c.clone(), &device).unwrap().space();
    assert_eq!(space(&synthetic), space(&on_corpus));
    let batches = |c: &LlmConfig| {
        let job = vramfit_models::job::build::<B, LlamaConfig, 3>(c.clone(), &device).unwrap();
        (1..=3)
            .map(|step| {
                let b = job.course().batch(step, 4, &device);
                let described = (b.tokens.dims(), b.tokens.dtype(), b.targets.dims(), b.targets.dtype());
                (described, <Llama<B> as Trainable<B, 3>>::batch_bytes(&b))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(batches(&synthetic), batches(&on_corpus));
    let mut unreadable = on_corpus.clone();
    unreadable.task.data = tmp.path().join("absent.bin").display().to_string();
    let e = FamilyTarget::<B, _, 3>::new(unreadable, &device)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("absent.bin"), "{e}");
}
