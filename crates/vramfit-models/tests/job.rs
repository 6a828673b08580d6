//! The transformer through the run driver: run directory contents, exact
//! resume after an interruption, and bad settings rejected before anything
//! is created.

use std::ops::ControlFlow;
use std::path::Path;

use burn::backend::{Autodiff, Flex};
use vramfit::run::{Event, RunPath, RunSummary, Start};
use vramfit_models::gpt::TrainConfig;
use vramfit_models::job::{TrainError, TrainSummary, launch};
use vramfit_models::llama::{LlamaConfig, LlmConfig};

type B = Autodiff<Flex>;

// The heap counted, as in the binary: the CPU's figure that decides an
// out-of-memory. (Tests in this file run in parallel, so heap figures here
// are asserted only to exist, never to equal a size.)
#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

fn small() -> TrainConfig {
    let mut c = TrainConfig {
        steps: 12,
        batch_size: 4,
        micro_batch: 2,
        accumulate: 2,
        precision: "f16".into(), // exercises the scaler's state in checkpoints
        checkpoint: "every:2".into(),
        storage: vec!["token_embedding:bf16".into()],
        moments: "bf16".into(),
        allocator_cleanup: "every:5".into(),
        log_every: 2,
        checkpoint_every: 4,
        profile_every: 3,
        ..Default::default()
    };
    c.model.width = 16;
    c.model.heads = 2;
    c.model.depth = 3;
    c.model.vocab = 16;
    c.model.context = 16;
    c.model.frame_dim = 4;
    c.model.max_frames = 2;
    c.task.tokens = 8;
    c.task.frames = 3;
    c
}

/// A new run (`config`) or a resume (`None`) of `out`, driven to its end or until `observe` stops it.
fn run(
    config: Option<TrainConfig>,
    out: &Path,
    observe: impl FnMut(Event) -> ControlFlow<()>,
) -> Result<Option<RunSummary<TrainSummary>>, TrainError> {
    let start = match config {
        Some(c) => Start::New(c, RunPath::At(out.into())),
        None => Start::Resume(out.into()),
    };
    let (run, workload) = launch::<B>(start, &Default::default(), "cpu")?;
    Ok(run.drive(workload, observe)?)
}

#[test]
fn interrupted_run_resumes_to_identical_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = tmp.path().join("straight");
    let summary = run(Some(small()), &straight, |_| ControlFlow::Continue(()))
        .unwrap()
        .unwrap();
    assert_eq!(summary.steps, 12);
    assert!(summary.workload.final_loss.is_finite());
    for name in [
        "config.toml",
        "metrics.jsonl",
        "memory.json",
        "summary.json",
        "weights.bin",
    ] {
        assert!(straight.join(name).is_file(), "{name} missing");
    }
    let events = std::fs::read_dir(&straight)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("events.out.tfevents"));
    assert!(events, "TensorBoard event file");
    let lines = std::fs::read_to_string(straight.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 6, "a line every 2 steps");
    let memory: serde_json::Value =
        serde_json::from_slice(&std::fs::read(straight.join("memory.json")).unwrap()).unwrap();
    assert_eq!(memory["schema"], "vramfit.memory");
    assert!(memory["records"].as_array().is_some_and(|p| !p.is_empty()), "{memory}");
    assert_eq!(summary.workload.cleanup_calls, 2, "every:5 over 12 steps");

    // Stop right after the second checkpoint (step 8), as a kill would, then resume.
    let broken = tmp.path().join("broken");
    stop_after_second_checkpoint(&broken);
    assert!(!broken.join("summary.json").exists());
    let mut first_step = None;
    let resumed = run(None, &broken, |e| {
        if let Event::Start { done, .. } = e {
            first_step = Some(done);
        }
        ControlFlow::Continue(())
    })
    .unwrap()
    .unwrap();
    assert_eq!(first_step, Some(8), "resumes from the newest checkpoint");
    assert_eq!(resumed.workload.final_loss, summary.workload.final_loss);
    // Bit-identical parameters, Adam moments and scaler state, and so the
    // same file: weights.bin holds no wall time.
    let a = std::fs::read(broken.join("weights.bin")).unwrap();
    let b = std::fs::read(straight.join("weights.bin")).unwrap();
    assert!(
        a == b,
        "the resumed run ends with byte-identical weights.bin (parameters, optimiser and scaler state)"
    );
    let again = run(None, &broken, |_| ControlFlow::Continue(()));
    assert!(again.err().unwrap().to_string().contains("already finished"));
}

#[test]
fn bad_settings_leave_no_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(TrainConfig, &str)> = vec![
        (
            TrainConfig {
                precision: "f16".into(),
                loss_scale: "none".into(),
                ..small()
            },
            "loss_scale",
        ),
        (
            TrainConfig {
                micro_batch: 3,
                ..small()
            },
            "micro_batch",
        ),
        (
            TrainConfig {
                storage: vec!["embedding:bf16".into()],
                ..small()
            },
            "token_embedding",
        ),
        (
            TrainConfig {
                checkpoint: "list:9".into(),
                ..small()
            },
            "block 9",
        ),
        (
            TrainConfig {
                moments: "f8".into(),
                ..small()
            },
            "moments",
        ),
        (
            TrainConfig {
                allocator_cleanup: "often".into(),
                ..small()
            },
            "allocator_cleanup",
        ),
    ];
    for (i, (config, needle)) in cases.into_iter().enumerate() {
        let out = tmp.path().join(format!("run{i}"));
        let err = run(Some(config), &out, |_| ControlFlow::Continue(())).expect_err("must fail");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
        assert!(!out.exists(), "{needle}: no directory is created");
    }
}

/// cubecl's words for a failed allocation, as a device out-of-memory reaches the step.
const OOM: &str = "An io error happened during launch\nCaused by:\n  can't allocate buffer of size: 536870912";

#[test]
fn a_device_out_of_memory_writes_oom_json_keeps_the_checkpoints_and_resumes() {
    use vramfit::run::FailAt;
    use vramfit::step::StepError;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let config = TrainConfig {
        profile_every: 2,
        ..small()
    };
    let (run_dir, workload) =
        launch::<B>(Start::New(config, RunPath::At(out.clone())), &Default::default(), "cpu").unwrap();
    // Step 6 fails as a device allocation would (the seam, not the real step).
    let failing = FailAt {
        inner: workload,
        step: 6,
        fail: |step| {
            vramfit::trainer::TrainerError::Step(StepError::Device {
                step,
                reason: OOM.into(),
            })
        },
    };
    let err = run_dir
        .drive(failing, |_| ControlFlow::Continue(()))
        .expect_err("step 6 fails");
    let msg = err.to_string();
    assert!(
        msg.contains("out of device memory at step 6")
            && msg.contains("allocating 512.0 MiB")
            && msg.contains("oom.json"),
        "{msg}"
    );
    assert!(
        msg.contains("parameters") && msg.contains("tensors: ") && msg.contains("To use less: "),
        "names the categories, the tensors and what to turn: {msg}"
    );
    let oom: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("oom.json")).unwrap()).unwrap();
    assert_eq!(oom["step"], 6);
    assert_eq!(oom["requested_bytes"], 512 << 20);
    // The failing step's start was recorded (profile_every = 2) before it failed.
    assert_eq!(oom["last_recorded_phases"][0]["step"], 6);
    assert_eq!(oom["last_recorded_phases"][0]["phase"], "start");
    assert!(!oom["largest_tensors"].as_array().unwrap().is_empty());
    assert!(oom["headline"]["bytes"].as_u64().is_some_and(|b| b > 0), "{oom}");
    assert!(out.join("memory.json").is_file() && out.join("error.json").is_file());
    assert!(!out.join("summary.json").exists(), "not mistaken for a finished run");
    assert!(out.join("checkpoints/step-00000004.ckpt").is_file());
    // Nothing is lost: the run resumes from step 4 and ends as a straight run does.
    let resumed = run(None, &out, |_| ControlFlow::Continue(())).unwrap().unwrap();
    let straight = run(
        Some(TrainConfig {
            profile_every: 2,
            ..small()
        }),
        &tmp.path().join("straight"),
        |_| ControlFlow::Continue(()),
    )
    .unwrap()
    .unwrap();
    assert_eq!(resumed.steps, 12);
    assert_eq!(
        std::fs::read(out.join("weights.bin")).unwrap(),
        std::fs::read(tmp.path().join("straight/weights.bin")).unwrap()
    );
    assert_eq!(resumed.workload.final_loss, straight.workload.final_loss);
}

/// Runs `small()` into `out` and stops it, as a kill would, right after its
/// second checkpoint (steps 4 and 8 written).
fn stop_after_second_checkpoint(out: &Path) {
    let mut seen = 0;
    let stopped = run(Some(small()), out, |e| {
        if let Event::Checkpoint(_) = e {
            seen += 1;
            if seen == 2 {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert!(stopped.is_none(), "stopped before its end");
}

#[test]
fn corrupt_checkpoints_are_skipped_aloud_and_never_restart_silently() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    stop_after_second_checkpoint(&out);
    let newest = out.join("checkpoints/step-00000008.ckpt");
    let truncate = |p: &Path| {
        let bytes = std::fs::read(p).unwrap();
        std::fs::write(p, &bytes[..bytes.len() / 2]).unwrap();
    };
    // The newest is corrupt: the run says so and resumes from the older one.
    truncate(&newest);
    let mut notes = Vec::new();
    let mut first = None;
    let resumed = run(None, &out, |e| {
        match e {
            Event::Note(n) => notes.push(n.to_string()),
            Event::Start { done, .. } => first = Some(done),
            _ => {}
        }
        ControlFlow::Continue(())
    })
    .unwrap()
    .unwrap();
    assert_eq!(first, Some(4), "resumed from the older checkpoint");
    assert_eq!(resumed.steps, 12);
    assert!(
        notes.iter().any(|n| n.contains("step-00000008.ckpt")) && notes.iter().any(|n| n.contains("step 4")),
        "{notes:?}"
    );

    // A checkpoint that reads back (its checksum made to match) but whose
    // moments do not fit their parameter: refused with what is wrong, not
    // a panic in the first update.
    let out = tmp.path().join("forged");
    stop_after_second_checkpoint(&out);
    let newest = out.join("checkpoints/step-00000008.ckpt");
    let mut file = vramfit::run::ArrayFile::read(&newest).unwrap();
    let (name, (shape, values)) = file
        .arrays
        .iter_mut()
        .find(|(n, _)| n.starts_with("adam_m/"))
        .map(|(n, a)| (n.clone(), a))
        .unwrap();
    values.pop();
    shape[0] -= 1;
    vramfit::run::atomic_write(&newest, &file.to_bytes()).unwrap();
    let msg = run(None, &out, |_| ControlFlow::Continue(()))
        .expect_err("refused")
        .to_string();
    let path = name.trim_start_matches("adam_m/");
    assert!(msg.contains(&format!("the Adam moments of `{path}` hold")), "{msg}");

    // Both corrupt: refused, naming each file, and nothing is changed.
    let out = tmp.path().join("both");
    stop_after_second_checkpoint(&out);
    truncate(&out.join("checkpoints/step-00000008.ckpt"));
    truncate(&out.join("checkpoints/step-00000004.ckpt"));
    let metrics_before = std::fs::read(out.join("metrics.jsonl")).unwrap();
    let err = run(None, &out, |_| ControlFlow::Continue(())).expect_err("no silent restart");
    let msg = err.to_string();
    assert!(
        msg.contains("no checkpoint reads back")
            && msg.contains("step-00000004.ckpt")
            && msg.contains("step-00000008.ckpt"),
        "{msg}"
    );
    assert_eq!(std::fs::read(out.join("metrics.jsonl")).unwrap(), metrics_before);
    assert!(!out.join("summary.json").exists());
}

#[test]
fn a_diverging_run_ends_with_a_warning() {
    // The issue's case: `--set lr=1e6` on the default model grows the loss
    // to ~1e13 (finite, so no step fails) and used to exit without a word.
    let tmp = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        lr: 1e6,
        steps: 30,
        warmup_steps: 0,
        checkpoint_every: 0,
        ..TrainConfig::default()
    };
    let s = run(Some(config), &tmp.path().join("r"), |_| ControlFlow::Continue(()))
        .unwrap()
        .unwrap();
    assert!(s.workload.final_loss > 1e6, "diverged: {}", s.workload.final_loss);
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("diverged") && w.contains("Lower the learning rate")),
        "no warning: {:?}",
        s.warnings
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("r/summary.json")).unwrap()).unwrap();
    assert!(written["warnings"][0].as_str().unwrap().contains("diverged"));
}

/// A 2-block Llama of width 32 that trains `train`, 6 steps of 2 samples
/// of 8 tokens, a checkpoint every 2 and a metrics line every step.
fn small_llm(train: &str) -> LlmConfig {
    let mut c = LlmConfig {
        steps: 6,
        batch_size: 2,
        checkpoint_every: 2,
        log_every: 1,
        ..Default::default()
    };
    c.model = LlamaConfig {
        vocab: 32,
        width: 32,
        depth: 2,
        heads: 4,
        kv_heads: 2,
        ffn: 64,
        context: 16,
        train: train.into(),
        ..Default::default()
    };
    c.task.tokens = 8;
    c
}

/// A new llm run (`config`) or a resume (`None`) of `out`, driven to its
/// end or until `observe` stops it.
fn drive_llm(
    config: Option<LlmConfig>,
    out: &Path,
    mut observe: Box<dyn FnMut(Event) -> ControlFlow<()>>,
) -> Result<Option<RunSummary<TrainSummary>>, TrainError> {
    let start = match config {
        Some(c) => Start::New(c, RunPath::At(out.into())),
        None => Start::Resume(out.into()),
    };
    let (run, workload) = vramfit_models::job::start::<B, LlamaConfig, 3>(start, &Default::default(), "cpu")?;
    Ok(run.drive(workload, &mut observe)?)
}

/// Stops a run right after its second checkpoint, as a kill would.
fn after_second_checkpoint() -> Box<dyn FnMut(Event) -> ControlFlow<()>> {
    let mut seen = 0;
    Box::new(move |e| {
        if let Event::Checkpoint(_) = e {
            seen += 1;
            if seen == 2 {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })
}

/// A QLoRA run (the base in NF4, drawn from the seed) stopped after its
/// second checkpoint resumes to the straight run's byte-identical
/// `weights.bin`; its checkpoints and weights hold the adapters and their
/// moments only (the base is rebuilt from the settings, never copied to
/// the host for a file).
#[test]
fn a_qlora_run_writes_its_adapters_only_and_resumes_exactly() {
    let config = || small_llm("qlora:4");
    let go = |config: Option<LlmConfig>, out: &Path, observe: Box<dyn FnMut(Event) -> ControlFlow<()>>| {
        drive_llm(config, out, observe).unwrap()
    };
    let tmp = tempfile::tempdir().unwrap();
    let straight = tmp.path().join("straight");
    let summary = go(Some(config()), &straight, Box::new(|_| ControlFlow::Continue(()))).unwrap();
    assert_eq!(summary.steps, 6);
    let saved = vramfit::run::ArrayFile::read(&straight.join("weights.bin")).unwrap();
    assert!(!saved.arrays.is_empty());
    for name in saved.arrays.keys() {
        assert!(name.contains(".lora."), "{name}: only the adapters are written");
    }
    let checkpoint = std::fs::read_dir(straight.join("checkpoints"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let checkpoint = vramfit::run::ArrayFile::read(&checkpoint).unwrap();
    assert!(
        checkpoint.arrays.keys().all(|n| n.contains(".lora.")),
        "{:?}",
        checkpoint.arrays.keys()
    );

    let broken = tmp.path().join("broken");
    let stopped = go(Some(config()), &broken, after_second_checkpoint());
    assert!(stopped.is_none(), "stopped before its end");
    go(None, &broken, Box::new(|_| ControlFlow::Continue(()))).unwrap();
    let (a, b) = (
        std::fs::read(broken.join("weights.bin")).unwrap(),
        std::fs::read(straight.join("weights.bin")).unwrap(),
    );
    assert!(a == b, "the resumed QLoRA run ends with byte-identical weights.bin");
}

/// A LoRA run on a user's corpus (token ids, u16): the held-out windows
/// evaluated every 2 steps into `metrics.jsonl` and at the end into
/// `summary.json`; the adapters written in PEFT's layout beside
/// `weights.bin`; stopped after its second checkpoint and resumed, it ends
/// with the straight run's byte-identical files (batches follow the step,
/// not the run's history); a resume over a changed corpus is refused.
#[test]
fn a_corpus_run_evaluates_writes_peft_adapters_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus.bin");
    let ids: Vec<u8> = (0..600u32)
        .flat_map(|i| (((i * 13 + i / 7) % 32) as u16).to_le_bytes())
        .collect();
    std::fs::write(&corpus, &ids).unwrap();
    let config = || {
        let mut c = small_llm("lora:4");
        c.task.data = corpus.display().to_string();
        c.task.eval_every = 2;
        c.task.eval_sequences = 4;
        c
    };
    let go = drive_llm;
    let straight = tmp.path().join("straight");
    let summary = go(Some(config()), &straight, Box::new(|_| ControlFlow::Continue(())))
        .unwrap()
        .unwrap();
    let val = summary.workload.extra["val_loss"].as_f64().unwrap();
    let perplexity = summary.workload.extra["val_perplexity"].as_f64().unwrap();
    assert!(val.is_finite() && (perplexity - val.exp()).abs() < 1e-9 * perplexity);
    assert_eq!(
        summary.workload.extra["held_out_windows"], 4,
        "5 % of 74 windows, rounded"
    );
    let metrics = std::fs::read_to_string(straight.join("metrics.jsonl")).unwrap();
    let evaluated: Vec<u64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l.get("val_loss").is_some())
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evaluated, vec![2, 4, 6]);
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(
        last["val_loss"].as_f64().unwrap(),
        val,
        "the summary's is the last step's"
    );
    for name in ["adapter_model.safetensors", "adapter_config.json"] {
        assert!(straight.join(name).is_file(), "{name}");
    }

    let broken = tmp.path().join("broken");
    let stopped = go(Some(config()), &broken, after_second_checkpoint()).unwrap();
    assert!(stopped.is_none(), "stopped before its end");
    // The corpus changed under the run: refused, the run left as it was.
    let mut changed = ids.clone();
    changed[100] ^= 1;
    std::fs::write(&corpus, &changed).unwrap();
    let e = go(None, &broken, Box::new(|_| ControlFlow::Continue(())))
        .unwrap_err()
        .to_string();
    assert!(e.contains("data whose fingerprint"), "{e}");
    std::fs::write(&corpus, &ids).unwrap();
    go(None, &broken, Box::new(|_| ControlFlow::Continue(()))).unwrap();
    for name in ["weights.bin", "adapter_model.safetensors", "metrics.jsonl"] {
        let (a, b) = (
            std::fs::read(broken.join(name)).unwrap(),
            std::fs::read(straight.join(name)).unwrap(),
        );
        if name == "metrics.jsonl" {
            // Wall times differ; losses and evaluations do not.
            let strip = |t: Vec<u8>| -> Vec<serde_json::Value> {
                String::from_utf8(t)
                    .unwrap()
                    .lines()
                    .map(|l| {
                        let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                        v.as_object_mut().unwrap().remove("wall_seconds");
                        v
                    })
                    .collect()
            };
            assert_eq!(strip(a), strip(b), "the same losses and evaluations");
        } else {
            assert!(a == b, "the resumed corpus run ends with a byte-identical {name}");
        }
    }
}

/// A LoRA run on a Hugging Face checkpoint (the golden Llama) exported
/// (`llama::merge::export`): sharded with an index when asked, it loads as
/// a checkpoint (`--weights`) whose logits are the run's adapted model's
/// (the adapters merged: within f32 rounding); in bf16 its config.json says
/// so; a base whose config.json changed and a run not finished are
/// refused, leaving no folder.
#[test]
fn a_lora_run_exports_a_merged_checkpoint_that_loads_as_the_runs_model() {
    use burn::prelude::*;
    use vramfit::precision::{Autocast, Precision};
    use vramfit_models::llama::{hf_config, merge};
    use vramfit_models::safetensors::Dtype;
    let tmp = tempfile::tempdir().unwrap();
    // A copy of the golden Llama: its files are changed below.
    let golden = tmp.path().join("base");
    std::fs::create_dir(&golden).unwrap();
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        let from = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/llama")
            .join(name);
        std::fs::copy(from, golden.join(name)).unwrap();
    }
    let mut config = LlmConfig {
        steps: 3,
        batch_size: 2,
        lr: 3e-2,
        ..Default::default()
    };
    config.model = hf_config::config(&golden).unwrap();
    config.model.weights = golden.display().to_string();
    config.model.train = "lora:4".into();
    config.task.tokens = 8;
    let run_dir = tmp.path().join("run");
    let start = Start::New(config.clone(), RunPath::At(run_dir.clone()));
    let (run, workload) = vramfit_models::job::start::<B, LlamaConfig, 3>(start, &Default::default(), "cpu").unwrap();
    run.drive(workload, |_| ControlFlow::Continue(())).unwrap();
    let out = tmp.path().join("merged");
    let done = merge::export(&run_dir, &out, Some(Dtype::F32), 40_000).unwrap();
    assert_eq!(
        (done.tensors, done.merged),
        (21, 8),
        "every tensor; q, k, v, o in two blocks merged"
    );
    assert!(done.shards.len() > 1 && out.join("model.safetensors.index.json").is_file());
    assert!(out.join("tokenizer.json").is_file() && out.join("config.json").is_file());
    let device = Default::default();
    let exported = hf_config::config(&out)
        .unwrap()
        .load::<burn::backend::Flex>(0, &device)
        .unwrap();
    let adapted = LlamaConfig {
        adapter: run_dir.display().to_string(),
        ..config.model.clone()
    }
    .load::<burn::backend::Flex>(0, &device)
    .unwrap();
    let tokens = Tensor::<burn::backend::Flex, 2, Int>::from_data(
        TensorData::new((0..16i64).map(|i| i * 5 % 64).collect::<Vec<_>>(), [2, 8]),
        &device,
    );
    let ac = Autocast::new(Precision::F32);
    let a: Vec<f32> = exported.logits(tokens.clone(), &ac).into_data().to_vec().unwrap();
    let b: Vec<f32> = adapted.logits(tokens, &ac).into_data().to_vec().unwrap();
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0f32, f32::max);
    assert!(worst <= 1e-5, "the merged checkpoint's logits differ by {worst:e}");
    // In bf16: its config.json says so.
    let bf16 = tmp.path().join("bf16");
    merge::export(&run_dir, &bf16, Some(Dtype::Bf16), 1 << 30).unwrap();
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(bf16.join("config.json")).unwrap()).unwrap();
    assert_eq!(written["dtype"], "bfloat16");
    let file = vramfit_models::safetensors::HfWeights::open(&bf16).unwrap();
    assert_eq!(file.dtype("lm_head.weight"), Some(Dtype::Bf16));
    // Refused: a folder already there, a base whose config.json changed,
    // a run that has not finished.
    assert!(
        merge::export(&run_dir, &out, None, 1 << 30)
            .unwrap_err()
            .to_string()
            .contains("give a new folder")
    );
    let original = std::fs::read_to_string(golden.join("config.json")).unwrap();
    std::fs::write(golden.join("config.json"), original.replace("1e-06", "1e-05")).unwrap();
    let e = merge::export(&run_dir, &tmp.path().join("c"), None, 1 << 30)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rms_norm_eps") && !tmp.path().join("c").exists(), "{e}");
    std::fs::write(golden.join("config.json"), original).unwrap();
    std::fs::remove_file(run_dir.join("weights.bin")).unwrap();
    let e = merge::export(&run_dir, &tmp.path().join("b"), None, 1 << 30).unwrap_err();
    assert!(matches!(e, merge::ExportError::NotFinished { .. }), "{e}");
    let e = e.to_string();
    assert!(e.contains("has not finished") && !tmp.path().join("b").exists(), "{e}");
}
