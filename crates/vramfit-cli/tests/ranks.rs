//! `vramfit train … --ranks N` (issue 30): data-parallel ranks through
//! MPI. With the `mpi` feature (CI installs Open MPI): two ranks train the
//! transformer to the one-process run's parameters (summation order aside)
//! and hold equal parameters on every rank; an uneven split is refused
//! before anything starts; with the moments sharded (ZeRO stage 1) they
//! train to the unsharded ranks' parameters bit for bit, each rank holding
//! part of the optimizer state. Without it: `--ranks` says how to build it.

#[cfg(feature = "mpi")]
use std::path::Path;
use std::process::{Command, Output};

fn vramfit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The transformer, small: 4 micro-batches of 2 a step, checkpoints every 3 steps.
const SMALL: [&str; 18] = [
    "train",
    "transformer",
    "--steps",
    "6",
    "--batch-size",
    "8",
    "--micro-batch",
    "2",
    "--accumulate",
    "4",
    "--set",
    "model.width=32",
    "--set",
    "model.depth=2",
    "--set",
    "model.heads=2",
    "--set",
    "checkpoint_every=3",
];

#[cfg(feature = "mpi")]
fn weights(dir: &Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let path = dir.join("weights.bin");
    let bytes = std::fs::read(&path).unwrap();
    vramfit::run::ArrayFile::from_bytes(&bytes, &path.display().to_string())
        .unwrap()
        .arrays
}

#[cfg(feature = "mpi")]
#[test]
fn two_ranks_train_to_the_one_process_parameters() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    let o = vramfit(&[&SMALL[..], &["--out", one.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = vramfit(&[&SMALL[..], &["--ranks", "2", "--out", two.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("ranks: 2 (each rank's deciding peak"), "{out}");
    let (a, b, rank1) = (weights(&one), weights(&two), weights(&two.join("ranks/rank-1")));
    assert_eq!(b, rank1, "every rank holds the same parameters");
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let mut worst = 0.0f32;
    for (name, (shape, x)) in &a {
        let (shape_b, y) = &b[name];
        assert_eq!(shape, shape_b, "{name}");
        for (x, y) in x.iter().zip(y) {
            worst = worst.max((x - y).abs() / (1.0 + x.abs()));
        }
    }
    // The two ranks add the four micro-batches' gradients as (g0 + g1) +
    // (g2 + g3), one process as ((g0 + g1) + g2) + g3: rounding apart.
    assert!(worst < 1e-5, "largest relative parameter difference {worst:e}");
    for dir in [&two, &two.join("ranks/rank-1")] {
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary["techniques"]["ranks"], 2, "{}", dir.display());
        assert!(summary["peak_memory_bytes"].as_u64().is_some_and(|b| b > 0));
    }

    // Ranks that cannot share the micro-batches evenly: refused, nothing made.
    let three = tmp.path().join("three");
    let o = vramfit(&[&SMALL[..], &["--ranks", "3", "--out", three.to_str().unwrap()]].concat());
    assert!(
        !o.status.success() && stderr(&o).contains("3 ranks cannot share 4 micro-batches evenly"),
        "{}",
        stderr(&o)
    );
    assert!(!three.exists());
}

/// The optimizer state a run's last memory record holds (bytes).
#[cfg(feature = "mpi")]
fn optimizer_state(dir: &Path) -> u64 {
    let memory: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("memory.json")).unwrap()).unwrap();
    let records = memory["records"].as_array().unwrap();
    let last = records.iter().rev().find(|r| r["phase"] == "optimizer").unwrap();
    last["categories"]["optimizer_state"].as_u64().unwrap()
}

#[cfg(feature = "mpi")]
#[test]
fn sharded_moments_give_the_unsharded_parameters_and_split_the_state() {
    let tmp = tempfile::tempdir().unwrap();
    let (plain, sharded) = (tmp.path().join("plain"), tmp.path().join("sharded"));
    let profile = ["--set", "profile_every=1"];
    let o = vramfit(
        &[
            &SMALL[..],
            &profile,
            &["--ranks", "2", "--out", plain.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = vramfit(
        &[
            &SMALL[..],
            &profile,
            &["--ranks", "2", "--shard-moments", "--out", sharded.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rank1 = |d: &Path| d.join("ranks/rank-1");
    // The same update on the rank that owns each parameter, broadcast as
    // stored: every rank ends with the unsharded parameters, bit for bit
    // (weights.bin also holds each rank's moments: left out here).
    let params = |d: &Path| {
        let mut w = weights(d);
        w.retain(|k, _| !k.starts_with("adam"));
        assert!(w.len() > 4, "{}: {:?}", d.display(), w.keys());
        w
    };
    assert_eq!(params(&plain), params(&sharded));
    assert_eq!(params(&sharded), params(&rank1(&sharded)));
    // Each rank holds the moments of its parameters only: together all of
    // them, each rank less than all.
    let whole = optimizer_state(&plain);
    assert_eq!(whole, optimizer_state(&rank1(&plain)));
    let (a, b) = (optimizer_state(&sharded), optimizer_state(&rank1(&sharded)));
    assert_eq!(a + b, whole, "rank 0 {a} + rank 1 {b} against {whole}");
    assert!(
        a < whole && b < whole && a.min(b) * 3 > whole / 2,
        "an even split: {a} and {b} of {whole}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sharded.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["techniques"]["shard_moments"], true);
    // `report` on the run lists every rank's deciding peak and the largest.
    let o = vramfit(&["report", sharded.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success()
            && out.contains("ranks: 2 (each rank's deciding peak: rank 0 ")
            && out.contains("the largest"),
        "{out}{}",
        stderr(&o)
    );

    // Sharding one process's moments is refused, naming the key.
    let one = tmp.path().join("one");
    let o = vramfit(&[&SMALL[..], &["--shard-moments", "--out", one.to_str().unwrap()]].concat());
    assert!(
        !o.status.success() && stderr(&o).contains("shard_moments") && stderr(&o).contains("ranks = 2 or more"),
        "{}",
        stderr(&o)
    );
}

/// A sharded 2-rank run cut after its step-3 checkpoint resumes on 4 ranks
/// and on 1 with `--resume RUN --ranks M`: the state is gathered from
/// every rank (each parameter's moments from the rank that kept them) and
/// both end at the uninterrupted run's parameters (summation order apart:
/// moments restarted from zero would be far off).
#[cfg(feature = "mpi")]
#[test]
fn a_sharded_run_resumes_on_another_rank_count() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, more: &[&str]| -> std::path::PathBuf {
        let dir = tmp.path().join(name);
        let o = vramfit(&[&SMALL[..], more, &["--out", dir.to_str().unwrap()]].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        dir
    };
    let whole = run("whole", &["--ranks", "2", "--shard-moments"]);
    // A finished run is refused before anything in it changes.
    let config = std::fs::read(whole.join("config.toml")).unwrap();
    let o = vramfit(&[
        "train",
        "transformer",
        "--resume",
        whole.to_str().unwrap(),
        "--ranks",
        "4",
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("already finished"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(whole.join("config.toml")).unwrap(), config);
    assert!(!whole.join("ranks/rank-2").exists());
    // A rank with no checkpoint beside one with: refused, nothing removed.
    let bare = run("bare", &["--ranks", "2", "--shard-moments"]);
    for dir in [bare.clone(), bare.join("ranks/rank-1")] {
        std::fs::remove_file(dir.join("summary.json")).unwrap();
    }
    std::fs::remove_file(bare.join("ranks/rank-1/checkpoints/step-00000003.ckpt")).unwrap();
    let o = vramfit(&["train", "transformer", "--resume", bare.to_str().unwrap()]);
    assert!(
        !o.status.success() && stderr(&o).contains("rank 1 has none"),
        "{}",
        stderr(&o)
    );
    assert!(bare.join("checkpoints/step-00000003.ckpt").exists());
    let params = |dir: &Path| {
        let mut w = weights(dir);
        w.retain(|k, _| k.starts_with("param/"));
        w
    };
    let reference = params(&whole);
    for to in ["4", "1"] {
        let cut = run(&format!("cut{to}"), &["--ranks", "2", "--shard-moments"]);
        // Cut after step 3, as a kill between the checkpoints would.
        for dir in [cut.clone(), cut.join("ranks/rank-1")] {
            for file in ["summary.json", "weights.bin"] {
                std::fs::remove_file(dir.join(file)).unwrap();
            }
            let checkpoints: Vec<_> = std::fs::read_dir(dir.join("checkpoints"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(checkpoints, ["step-00000003.ckpt"], "{}", dir.display());
        }
        let o = vramfit(&["train", "transformer", "--resume", cut.to_str().unwrap(), "--ranks", to]);
        let said = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{said}{}", stderr(&o));
        assert!(said.contains("the state of step 3 gathered from every rank"), "{said}");
        let resumed = params(&cut);
        assert_eq!(resumed.keys().collect::<Vec<_>>(), reference.keys().collect::<Vec<_>>());
        let mut worst = 0.0f32;
        for (name, (_, x)) in &reference {
            for (x, y) in x.iter().zip(&resumed[name].1) {
                worst = worst.max((x - y).abs() / (1.0 + x.abs()));
            }
        }
        assert!(
            worst < 1e-5,
            "on {to} rank(s): largest relative parameter difference {worst:e}"
        );
        let ranks = to.parse::<usize>().unwrap();
        assert_eq!(cut.join("ranks/rank-1").exists(), ranks > 1);
        assert_eq!(cut.join("ranks/rank-1.before-1-ranks-at-step-3").exists(), ranks == 1);
    }
}

/// One rank of a sharded 2-rank run killed with SIGKILL after its first
/// checkpoint: the run stops with an error naming the ranks, and `--resume`
/// ends it with the uninterrupted run's files, byte for byte, on both ranks.
#[cfg(feature = "mpi")]
#[test]
fn a_killed_rank_stops_the_run_and_resume_ends_identical() {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let args = |out: &Path| -> Vec<String> {
        [
            "train",
            "transformer",
            "--steps",
            "400",
            "--batch-size",
            "8",
            "--micro-batch",
            "2",
            "--accumulate",
            "4",
            "--set",
            "model.width=32",
            "--set",
            "model.depth=2",
            "--set",
            "model.heads=2",
            "--set",
            "checkpoint_every=20",
            "--ranks",
            "2",
            "--shard-moments",
            "--out",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([out.display().to_string()])
        .collect()
    };
    let (whole, killed) = (tmp.path().join("whole"), tmp.path().join("killed"));
    let o = Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(args(&whole))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let run = Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(args(&killed))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rank1 = killed.join("ranks/rank-1");
    let started = Instant::now();
    while std::fs::read_dir(rank1.join("checkpoints"))
        .map(|r| r.flatten().all(|e| e.path().extension().is_none_or(|x| x != "ckpt")))
        .unwrap_or(true)
    {
        assert!(started.elapsed() < Duration::from_secs(120), "no checkpoint appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = std::fs::read_to_string(rank1.join(".lock")).unwrap();
    assert!(
        Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .unwrap()
            .success()
    );
    let o = run.wait_with_output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("the 2 ranks ended with"), "{}", stderr(&o));
    assert!(
        !killed.join("summary.json").exists(),
        "the run finished before the kill: the test proved nothing"
    );
    let o = vramfit(&["train", "transformer", "--resume", killed.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for rank in ["", "ranks/rank-1"] {
        let (a, b) = (
            whole.join(rank).join("weights.bin"),
            killed.join(rank).join("weights.bin"),
        );
        assert!(
            std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
            "rank {rank:?}: weights.bin differs"
        );
    }
}

/// A transformer whose state matters (8 blocks of width 128): its leanest
/// plan needs more than [`RANKS_BUDGET`] on one rank, and fits it on two
/// with the moments sharded.
#[cfg(feature = "mpi")]
const STATEFUL: [&str; 16] = [
    "transformer",
    "--batch-size",
    "4",
    "--set",
    "model.width=128",
    "--set",
    "model.heads=4",
    "--set",
    "model.depth=8",
    "--set",
    "model.vocab=256",
    "--set",
    "model.context=8",
    "--set",
    "task.tokens=8",
    "--budget",
];

#[cfg(feature = "mpi")]
const RANKS_BUDGET: u64 = 35 << 20;

/// `train … --ranks 2 --budget B` where no plan fits B on one rank: the
/// plan per rank, verified by a probe on the two ranks, runs with every
/// rank's peak within B (each rank's own summary), and `plan.json` says so.
#[cfg(feature = "mpi")]
#[test]
fn a_budget_one_rank_cannot_hold_is_planned_verified_and_run_on_two() {
    let tmp = tempfile::tempdir().unwrap();
    let budget = RANKS_BUDGET.to_string();
    let one = vramfit(&[&["plan"][..], &STATEFUL, &[budget.as_str()]].concat());
    assert_eq!(one.status.code(), Some(1), "{}", stderr(&one));
    assert!(stderr(&one).contains("no plan fits"), "{}", stderr(&one));
    let out = tmp.path().join("r");
    let o = vramfit(
        &[
            &["train"][..],
            &STATEFUL,
            &[
                budget.as_str(),
                "--steps",
                "6",
                "--ranks",
                "2",
                "--out",
                out.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{said}{}", stderr(&o));
    assert!(
        said.contains("verified on 2 ranks") && said.contains("every rank within"),
        "{said}"
    );
    for dir in [out.clone(), out.join("ranks/rank-1")] {
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
        let peak = summary["peak_memory_bytes"].as_u64().unwrap();
        assert!(peak <= RANKS_BUDGET, "{}: {peak} bytes", dir.display());
    }
    let plan: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["ranks"], 2);
    for key in ["verified_ranks", "run_ranks"] {
        let ranks = plan[key].as_array().unwrap();
        assert_eq!(ranks.len(), 2, "{key}");
        assert!(
            ranks.iter().all(|m| m["peak_bytes"].as_u64().unwrap() <= RANKS_BUDGET),
            "{key}: {ranks:?}"
        );
    }
    // The probes' folder beside the run is gone.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["r"], "{left:?}");
}

#[cfg(not(feature = "mpi"))]
#[test]
fn ranks_without_mpi_say_how_to_build_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let o = vramfit(&[&SMALL[..], &["--ranks", "2", "--out", out.to_str().unwrap()]].concat());
    assert!(
        !o.status.success() && stderr(&o).contains("built without MPI") && stderr(&o).contains("--features mpi"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists(), "nothing is created");
}
