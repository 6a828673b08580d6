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
    std::fs::remove_file(d.join("r/memory.html")).unwrap();
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
    // The checkpoint named inside a --config file is an input too.
    std::fs::write(d.join("w.toml"), b"[model]\nweights = \"ckpt\"\n").unwrap();
    let o = run(
        &[
            "plan",
            "llm",
            "--config",
            "w.toml",
            "--budget",
            "64MiB",
            "--json",
            "ckpt/p.json",
        ],
        d,
    );
    refused_saying(&o, "--config's model.weights");
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

/// A small llm run of 4 steps, checkpointed at 2, as if killed there (its
/// summary removed): what `--resume` continues.
fn unfinished_run(d: &Path, name: &str) {
    let args = small(&[
        "train",
        "llm",
        "--steps",
        "4",
        "--set",
        "checkpoint_every=2",
        "--out",
        name,
    ]);
    let o = run_owned(&args, d);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_file(d.join(name).join("summary.json")).unwrap();
}

/// The second sweep's cases (issue 58): links planted anywhere in a run
/// (a temporary's name, `weights.bin`, `.lock`, the checkpoints folder,
/// `config.toml`) refuse the resume before anything is read, written or
/// removed through them; the victims stay whole.
#[test]
fn a_run_with_a_planted_link_is_not_resumed() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("victim"), b"keep me").unwrap();
    std::fs::create_dir(d.join("elsewhere")).unwrap();
    std::fs::write(d.join("elsewhere/.a.tmp-1"), b"keep me too").unwrap();
    type Plant = fn(&Path, &Path);
    let plant: [(&str, Plant); 6] = [
        ("fifo", |_, r| {
            std::fs::remove_file(r.join("metrics.jsonl")).unwrap();
            assert!(
                Command::new("mkfifo")
                    .arg(r.join("metrics.jsonl"))
                    .status()
                    .unwrap()
                    .success()
            );
        }),
        ("temporary", |d, r| {
            std::os::unix::fs::symlink(d.join("victim"), r.join(".summary.json.tmp-1")).unwrap()
        }),
        ("weights", |d, r| {
            let _ = std::fs::remove_file(r.join("weights.bin"));
            std::os::unix::fs::symlink(d.join("victim"), r.join("weights.bin")).unwrap()
        }),
        ("lock", |d, r| {
            let _ = std::fs::remove_file(r.join(".lock"));
            std::os::unix::fs::symlink(d.join("victim"), r.join(".lock")).unwrap()
        }),
        ("checkpoints", |d, r| {
            for e in std::fs::read_dir(r.join("checkpoints")).unwrap().flatten() {
                std::fs::copy(e.path(), d.join("elsewhere").join(e.file_name())).unwrap();
            }
            std::fs::remove_dir_all(r.join("checkpoints")).unwrap();
            std::os::unix::fs::symlink(d.join("elsewhere"), r.join("checkpoints")).unwrap()
        }),
        ("config", |d, r| {
            std::fs::copy(r.join("config.toml"), d.join("elsewhere/config.toml")).unwrap();
            std::fs::remove_file(r.join("config.toml")).unwrap();
            std::os::unix::fs::symlink(d.join("elsewhere/config.toml"), r.join("config.toml")).unwrap()
        }),
    ];
    for (name, planted) in plant {
        unfinished_run(d, name);
        planted(d, &d.join(name));
        let o = run(&["train", "llm", "--resume", name], d);
        refused_saying(
            &o,
            if name == "fifo" {
                "is a named pipe (FIFO), not a file, which vramfit did not make"
            } else {
                "is a symbolic link inside the run directory"
            },
        );
        assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"keep me", "{name}");
        assert_eq!(
            std::fs::read(d.join("elsewhere/.a.tmp-1")).unwrap(),
            b"keep me too",
            "{name}"
        );
    }
}

/// A FIFO is refused at once, never waited on; a device is not read; an
/// output is never one of the inputs (through a link, or a run folder
/// inside the checkpoint's); an image size is held to `ulimit -v`; a bench
/// table is not written through a link.
#[test]
fn pipes_devices_and_outputs_onto_inputs_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let fifo = d.join("p.toml");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let started = std::time::Instant::now();
    let o = run(&["train", "llm", "--config", "p.toml"], d);
    refused_saying(&o, "named pipe (FIFO)");
    assert!(started.elapsed().as_secs() < 60, "it waited on the FIFO");
    refused_saying(&run(&["fit", "/dev/zero", "--steps", "1"], d), "a device");

    let o = run(&["sample", "--size", "64x48", "in.png"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(
        &["fit", "in.png", "--steps", "20", "--gaussians", "50", "--out", "f"],
        d,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::os::unix::fs::symlink(d.join("f/gaussians.vfg"), d.join("out.png")).unwrap();
    let before = std::fs::read(d.join("f/gaussians.vfg")).unwrap();
    refused_saying(
        &run(&["render", "f/gaussians.vfg", "out.png"], d),
        "never writes over its inputs",
    );
    assert_eq!(std::fs::read(d.join("f/gaussians.vfg")).unwrap(), before);

    std::fs::create_dir(d.join("w")).unwrap();
    let o = run(&["train", "llm", "--weights", "w", "--out", "w/run"], d);
    refused_saying(&o, "does not write into its inputs");
    assert!(!d.join("w/run").exists());

    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 3000000 && exec {} sample --size 40000x40000 big.png",
            env!("CARGO_BIN_EXE_vramfit")
        ))
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!d.join("big.png").exists());

    std::fs::write(d.join("victim"), b"keep me").unwrap();
    std::os::unix::fs::symlink(d.join("victim"), d.join("t.md")).unwrap();
    let o = run(&["bench", "host-adam", "--values", "1000", "--out", "t.json"], d);
    refused_saying(&o, "writes the table beside --out");
    assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"keep me");
    assert!(!d.join("t.json").exists(), "nothing was run");
}
