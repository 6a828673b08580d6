//! `TrainJob`: run directory contents, exact resume after an interruption,
//! and bad settings rejected before anything is created.

use std::ops::ControlFlow;
use std::path::Path;

use burn::backend::{Autodiff, Flex};
use vramfit_models::config::TrainConfig;
use vramfit_models::job::{Event, TrainJob};

type B = Autodiff<Flex>;

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

fn job(config: TrainConfig, out: &Path, resume: bool) -> TrainJob {
    TrainJob {
        config,
        out: out.into(),
        resume,
        device_name: "cpu".into(),
    }
}

#[test]
fn interrupted_run_resumes_to_identical_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = tmp.path().join("straight");
    let summary = job(small(), &straight, false)
        .run::<B>(&Default::default(), |_| ControlFlow::Continue(()))
        .unwrap()
        .unwrap();
    assert_eq!(summary.steps, 12);
    assert!(summary.final_loss.is_finite());
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
    assert_eq!(summary.cleanup_calls, 2, "every:5 over 12 steps");

    // Stop right after the second checkpoint (step 8), as a kill would, then resume.
    let broken = tmp.path().join("broken");
    let mut seen = 0;
    let stopped = job(small(), &broken, false)
        .run::<B>(&Default::default(), |e| {
            if let Event::Checkpoint(_) = e {
                seen += 1;
                if seen == 2 {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert!(stopped.is_none());
    assert!(!broken.join("summary.json").exists());
    let mut first_step = None;
    let resumed = job(TrainConfig::default(), &broken, true)
        .run::<B>(&Default::default(), |e| {
            if let Event::Start { done, .. } = e {
                first_step = Some(done);
            }
            ControlFlow::Continue(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(first_step, Some(8), "resumes from the newest checkpoint");
    assert_eq!(resumed.final_loss, summary.final_loss);
    let a = vramfit::run::ArrayFile::read(&broken.join("weights.bin")).unwrap();
    let b = vramfit::run::ArrayFile::read(&straight.join("weights.bin")).unwrap();
    assert_eq!(a.arrays.len(), b.arrays.len());
    // Bit-identical parameters and Adam moments (wall time in the metadata differs).
    assert!(
        a.arrays == b.arrays,
        "the resumed run ends with identical weights and optimiser state"
    );
    assert_eq!(a.meta["scaler"], b.meta["scaler"]);
    let again = job(TrainConfig::default(), &broken, true).run::<B>(&Default::default(), |_| ControlFlow::Continue(()));
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
        let err = job(config, &out, false)
            .run::<B>(&Default::default(), |_| ControlFlow::Continue(()))
            .expect_err("must fail");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
        assert!(!out.exists(), "{needle}: no directory is created");
    }
}
