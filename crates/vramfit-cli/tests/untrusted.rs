//! Every file vramfit reads or writes is untrusted (issue 58), end to end
//! on the binary: no write through a link planted in a run, over a
//! read-only file or over an input; a run larger than the memory there is
//! refused before it allocates; set-ups that cannot learn, probes too
//! short for the token law, a card record made on the CPU and a scene too
//! small to fit refused, each naming the problem. (The readers' own cases,
//! by the hundred, are the library's: `vramfit_models::safetensors` and
//! `vramfit::files`.)

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn vramfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramfit"))
}

fn run(args: &[&str], cwd: &Path) -> Output {
    vramfit().args(args).current_dir(cwd).output().expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn refused_saying(o: &Output, says: &str) {
    assert!(
        !o.status.success() && o.status.code() == Some(1) && stderr(o).contains(says),
        "status {:?}: {}",
        o.status,
        stderr(o)
    );
}

/// A small llm: 4 heads (2 for keys and values), 16 tokens.
const SMALL: [&str; 14] = [
    "--set",
    "model.width=32",
    "--set",
    "model.depth=2",
    "--set",
    "model.heads=4",
    "--set",
    "model.kv_heads=2",
    "--set",
    "model.ffn=48",
    "--set",
    "model.vocab=16",
    "--set",
    "task.tokens=16",
];

fn small(args: &[&str]) -> Vec<String> {
    args.iter().chain(SMALL.iter()).map(|s| s.to_string()).collect()
}

fn run_owned(args: &[String], cwd: &Path) -> Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&refs, cwd)
}

#[test]
fn no_write_through_a_link_planted_in_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let args = small(&[
        "train",
        "llm",
        "--steps",
        "4",
        "--set",
        "checkpoint_every=2",
        "--out",
        "r",
    ]);
    let o = run_owned(&args, d);
    assert!(o.status.success(), "{}", stderr(&o));
    // `report` writes memory.html beside memory.json: a link there is refused.
    std::fs::write(d.join("victim"), b"keep me").unwrap();
    std::os::unix::fs::symlink(d.join("victim"), d.join("r/memory.html")).unwrap();
    let o = run(&["report", "r"], d);
    refused_saying(&o, "symbolic link inside the run directory");
    assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"keep me");
    // A resumed run's memory.json through a link: refused, the target kept.
    std::fs::remove_file(d.join("r/summary.json")).unwrap();
    std::fs::remove_file(d.join("r/memory.json")).unwrap();
    std::os::unix::fs::symlink(d.join("victim"), d.join("r/memory.json")).unwrap();
    let o = run(&["train", "llm", "--resume", "r"], d);
    refused_saying(&o, "memory.json is a symbolic link");
    assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"keep me");
}

#[test]
fn no_output_over_an_input_or_a_read_only_file() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // The checkpoint need not even be valid: the output is refused first.
    std::fs::create_dir(d.join("ckpt")).unwrap();
    std::fs::write(d.join("ckpt/model.safetensors"), b"weights").unwrap();
    let o = run(
        &[
            "plan",
            "llm",
            "--weights",
            "ckpt",
            "--budget",
            "64MiB",
            "--json",
            "ckpt/model.safetensors",
        ],
        d,
    );
    refused_saying(&o, "never writes over its inputs");
    assert_eq!(std::fs::read(d.join("ckpt/model.safetensors")).unwrap(), b"weights");
    let o = run(
        &[
            "plan",
            "llm",
            "--weights",
            "ckpt",
            "--budget",
            "64MiB",
            "--json",
            "ckpt/plan.json",
        ],
        d,
    );
    refused_saying(&o, "does not write into its inputs");
    std::fs::write(d.join("c.toml"), b"steps = 4\n").unwrap();
    let o = run(
        &[
            "plan", "llm", "--config", "c.toml", "--budget", "64MiB", "--json", "c.toml",
        ],
        d,
    );
    refused_saying(&o, "--config");
    // A read-only output: refused after the plan, its bytes and mode kept.
    std::fs::write(d.join("ro.json"), b"mine").unwrap();
    std::fs::set_permissions(d.join("ro.json"), std::fs::Permissions::from_mode(0o444)).unwrap();
    let args = small(&["plan", "llm", "--budget", "64MiB", "--json", "ro.json"]);
    let o = run_owned(&args, d);
    refused_saying(&o, "read-only (mode 0444)");
    assert_eq!(std::fs::read(d.join("ro.json")).unwrap(), b"mine");
    let mode = std::fs::metadata(d.join("ro.json")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o444);
}

#[test]
fn a_run_past_the_memory_there_is_is_refused_not_aborted() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // 3 GB of address space; a block's scores at 4,096 tokens for 16
    // samples are 4 GiB: it aborted (status 134) with no error file.
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 3000000 && exec {} train llm --set task.tokens=4096 --set model.context=4096 --steps 2 --out r",
            env!("CARGO_BIN_EXE_vramfit")
        ))
        .current_dir(d)
        .output()
        .unwrap();
    refused_saying(&o, "more than this process may take");
    assert!(
        stderr(&o).contains("ulimit -v") && stderr(&o).contains("--attention fused"),
        "{}",
        stderr(&o)
    );
    assert!(!d.join("r").exists(), "a refused run leaves no folder");
}

#[test]
fn what_cannot_learn_or_plan_honestly_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "train",
                "llm",
                "--train",
                "frozen:blocks,embedding,head,final_norm",
                "--steps",
                "1",
            ],
            "nothing would train",
        ),
        (
            &["train", "llm", "--set", "model.vocab=1", "--steps", "1"],
            "fewer than 2 tokens",
        ),
        (
            &["train", "transformer", "--set", "model.vocab=1", "--steps", "1"],
            "one token every prediction",
        ),
        (
            &["plan", "llm", "--probe-tokens", "1", "--budget", "20MiB"],
            "give --probe-tokens 4 to",
        ),
        (&["sample", "scene", "s", "--size", "2x2"], "below 8x8"),
    ];
    for (args, says) in cases {
        let args: Vec<&str> = if args[1] == "llm" && args[0] == "plan" {
            args.iter().copied().chain(SMALL.iter().copied()).collect()
        } else {
            args.to_vec()
        };
        let o = run(&args, d);
        refused_saying(&o, says);
    }
    assert!(!d.join("s").exists() && !d.join("runs").exists(), "nothing left behind");
    // A card's record made on the CPU is not a card's.
    let cpu = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench-results/plan-transformer-cpu.json");
    let o = run(
        &[
            "bench",
            "model-cards",
            "--recorded",
            &format!("h200={}", cpu.display()),
            "--out",
            "cards.json",
        ],
        d,
    );
    refused_saying(&o, "not on a card");
    assert!(!d.join("cards.json").exists());
}
