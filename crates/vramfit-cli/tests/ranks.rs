//! `vramfit train … --ranks N` (issue 30): data-parallel ranks through
//! MPI. With the `mpi` feature (CI installs Open MPI): two ranks train the
//! transformer to the one-process run's parameters (summation order aside)
//! and hold equal parameters on every rank; an uneven split is refused
//! before anything starts; with the moments sharded (and the gradients
//! summed onto their owners: ZeRO stage 2) they train to the unsharded
//! ranks' parameters, each rank holding part of the optimizer state;
//! strangers cannot reach the ranks' sockets. Without it: `--ranks`
//! says how to build it.

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

/// The largest relative difference between two runs' arrays, by name (the
/// same names and shapes checked).
#[cfg(feature = "mpi")]
fn worst_difference(
    a: &std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    b: &std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)>,
) -> f32 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let mut worst = 0.0f32;
    for (name, (shape, x)) in a {
        let (shape_b, y) = &b[name];
        assert_eq!(shape, shape_b, "{name}");
        for (x, y) in x.iter().zip(y) {
            worst = worst.max((x - y).abs() / (1.0 + x.abs()));
        }
    }
    worst
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
    let worst = worst_difference(&a, &b);
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
    // stored: every rank ends with the same parameters (weights.bin also
    // holds each rank's moments: left out here). With two micro-batches a
    // rank, the gradients summed onto their owner after each micro-batch
    // add in another order, (g0 + g2) + (g1 + g3) against (g0 + g1) +
    // (g2 + g3): rounding apart.
    let params = |d: &Path| {
        let mut w = weights(d);
        w.retain(|k, _| !k.starts_with("adam"));
        assert!(w.len() > 4, "{}: {:?}", d.display(), w.keys());
        w
    };
    assert_eq!(params(&sharded), params(&rank1(&sharded)));
    let worst = worst_difference(&params(&plain), &params(&sharded));
    assert!(worst < 1e-5, "largest relative parameter difference {worst:e}");
    // With one micro-batch a rank the sums are the same additions: the
    // unsharded parameters, bit for bit.
    let mut one_each = SMALL;
    assert_eq!((one_each[6], one_each[8]), ("--micro-batch", "--accumulate"));
    (one_each[7], one_each[9]) = ("4", "2");
    let runs = ["plain-1", "sharded-1"].map(|n| tmp.path().join(n));
    for (out, shard) in runs.iter().zip([&[][..], &["--shard-moments"][..]]) {
        let o = vramfit(&[&one_each[..], shard, &["--ranks", "2", "--out", out.to_str().unwrap()]].concat());
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(params(&runs[0]), params(&runs[1]));
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
    // What a step hands the collectives, exactly: unsharded, every
    // gradient's f32 values all-reduced once a step, beside the check of
    // the ranks (6 f64), the loss and the inf flag (one f64 each); sharded,
    // every gradient reduced onto its owner after each of the rank's two
    // micro-batches, the check each time, and every parameter broadcast
    // once (f32), sent or received.
    let handed = |d: &Path| {
        let s: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("summary.json")).unwrap()).unwrap();
        let h = &s["collective_bytes_per_step"];
        ["summed", "reduced", "broadcast"].map(|k| h[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}")))
    };
    let [summed, reduced, broadcast] = handed(&plain);
    let gradients = summed - 8 * (6 + 2);
    assert!(reduced == 0 && broadcast == 0, "{:?}", handed(&plain));
    let values: usize = params(&plain)
        .values()
        .map(|(shape, _)| shape.iter().product::<usize>())
        .sum();
    assert_eq!(
        gradients,
        4 * values as u64,
        "every parameter's gradient once a step, as f32"
    );
    assert_eq!(
        handed(&sharded),
        [8 * (2 * 6 + 2), 2 * gradients, gradients],
        "against {gradients} gradient bytes a step"
    );
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

/// A sharded two-rank run of a few seconds (400 steps, checkpoints every 20), into `out`.
#[cfg(feature = "mpi")]
fn long_sharded_run(out: &Path) -> Vec<String> {
    let mut args = SMALL;
    assert_eq!((args[2], args[17]), ("--steps", "checkpoint_every=3"));
    (args[3], args[17]) = ("400", "checkpoint_every=20");
    args.iter()
        .chain(&["--ranks", "2", "--shard-moments", "--out"])
        .map(|a| a.to_string())
        .chain([out.display().to_string()])
        .collect()
}

/// One rank of a sharded 2-rank run killed with SIGKILL after its first
/// checkpoint: the run stops with an error naming the ranks, and `--resume`
/// ends it with the uninterrupted run's files, byte for byte, on both ranks.
#[cfg(feature = "mpi")]
#[test]
fn a_killed_rank_stops_the_run_and_resume_ends_identical() {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let args = long_sharded_run;
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

/// The TCP ports process `pid` listens on, with whether each is IPv6: the
/// sockets among its open files, in the kernel's tables of its own
/// network namespace.
#[cfg(feature = "mpi")]
fn listening_ports(pid: u32) -> Vec<(u16, bool)> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let link = std::fs::read_link(e.path()).ok()?.display().to_string();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut ports = Vec::new();
    for (table, v6) in [("tcp", false), ("tcp6", true)] {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local address, state 0A (listening), inode
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let port = f[1].rsplit(':').next().unwrap();
                ports.push((u16::from_str_radix(port, 16).unwrap(), v6));
            }
        }
    }
    ports
}

/// The children of process `pid` named `name`.
#[cfg(feature = "mpi")]
fn children_named(pid: u32, name: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let child: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid …: the name may hold spaces, the fields after ')' do not.
            let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid && comm == name).then_some(child)
        })
        .collect()
}

/// Who may join: the launcher and its ranks run in a network namespace of
/// their own, so a stranger on this machine finds every port they listen
/// on closed, and the run ends as an undisturbed one. (Open MPI's
/// launcher, reachable, waited at the end of the run for as long as a
/// silent stranger held a connection to it: docs/design/ranks.md.) Where the
/// system gives no namespace the launcher says so.
#[cfg(feature = "mpi")]
#[test]
fn strangers_cannot_reach_the_ranks_and_the_run_ends_unchanged() {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let (quiet, troubled) = (tmp.path().join("quiet"), tmp.path().join("troubled"));
    let o = Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(long_sharded_run(&quiet))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut run = Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(long_sharded_run(&troubled))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Every rank has started once both hold their run directory's lock.
    let started = Instant::now();
    let locks = [troubled.join(".lock"), troubled.join("ranks/rank-1/.lock")];
    while !locks.iter().all(|l| l.is_file()) {
        assert!(started.elapsed() < Duration::from_secs(120), "the ranks did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut pids: Vec<u32> = children_named(run.id(), "mpirun");
    assert_eq!(pids.len(), 1, "the launcher's mpirun");
    for lock in &locks {
        pids.push(std::fs::read_to_string(lock).unwrap().trim().parse().unwrap());
    }
    let ports: Vec<(u16, bool)> = pids.iter().flat_map(|&p| listening_ports(p)).collect();
    assert!(!ports.is_empty(), "nothing listens: the test would prove nothing");
    let network = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    if network("self") == network(&pids[0].to_string()) {
        // No namespace here: the launcher said so; a silent stranger
        // would hold up the end of the run (docs/design/ranks.md).
        let o = run.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("no network namespace of their own"),
            "{}",
            stderr(&o)
        );
        eprintln!("this system gives no network namespace: only the launcher's note was checked");
        return;
    }
    // What the run says, read as it comes: a full pipe would stall it.
    let said = {
        let mut err = run.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut err, &mut text).unwrap();
            text
        })
    };
    // From outside the launcher's network, every port it listens on is
    // closed: a stranger cannot connect, let alone hold the run up.
    for &(port, v6) in &ports {
        let at = if v6 {
            SocketAddr::from((Ipv6Addr::LOCALHOST, port))
        } else {
            SocketAddr::from((Ipv4Addr::LOCALHOST, port))
        };
        let reached = TcpStream::connect_timeout(&at, Duration::from_secs(2));
        assert!(
            reached.is_err(),
            "a stranger reached port {port} of the ranks' network: {ports:?}"
        );
    }
    assert!(
        !troubled.join("summary.json").exists(),
        "the run finished before the strangers came: the test proved nothing"
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("the run stalled after strangers tried {ports:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = said.join().unwrap();
    assert!(status.success(), "{err}");
    for rank in ["", "ranks/rank-1"] {
        let (a, b) = (
            quiet.join(rank).join("weights.bin"),
            troubled.join(rank).join("weights.bin"),
        );
        assert!(
            std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
            "rank {rank:?}: weights.bin differs"
        );
    }
}

/// A transformer whose state matters (8 blocks of width 128): a budget a
/// MiB under what its leanest plan needs on one rank fits it on two with
/// the moments sharded.
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

/// `train … --ranks 2 --budget B` where no plan fits B on one rank: the
/// plan per rank, verified by a probe on the two ranks, runs with every
/// rank's peak within B (each rank's own summary), and `plan.json` says so.
/// The winner runs out of memory on the ranks at step 3 (the test seam):
/// the ranks fall back to the next plan from their checkpoint of step 2
/// and finish, every step logged once.
#[cfg(feature = "mpi")]
#[test]
fn a_budget_one_rank_cannot_hold_is_planned_verified_and_run_on_two() {
    let tmp = tempfile::tempdir().unwrap();
    // One rank's leanest plan, as this machine measures it: a MiB under
    // the budget `plan` says works on one rank fits no plan there.
    let probe = vramfit(&[&["plan"][..], &STATEFUL, &["1MiB"]].concat());
    let why = stderr(&probe);
    let works: u64 = why
        .split_once("a budget that works is ")
        .and_then(|(_, rest)| rest.split_once("(--budget ")?.1.split_once(')')?.0.parse().ok())
        .unwrap_or_else(|| panic!("no working budget named: {why}"));
    let limit = works - (1 << 20);
    let budget = limit.to_string();
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
                "--set",
                "checkpoint_every=2",
                "--set",
                "log_every=1",
                "--ranks",
                "2",
                "--out",
                out.to_str().unwrap(),
                "--simulate-oom-at",
                "3",
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
    assert!(said.contains("fell back from plan 1 to plan 2"), "{said}");
    for dir in [out.clone(), out.join("ranks/rank-1")] {
        let steps = vramfit::run::logged_steps(&dir).unwrap();
        assert_eq!(steps, (1..=6).collect::<Vec<_>>(), "{}", dir.display());
        assert!(dir.join("oom.json").exists(), "{}", dir.display());
    }
    for dir in [out.clone(), out.join("ranks/rank-1")] {
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
        let peak = summary["peak_memory_bytes"].as_u64().unwrap();
        assert!(peak <= limit, "{}: {peak} bytes", dir.display());
    }
    let plan: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["ranks"], 2);
    assert_eq!(plan["running"], 1, "{plan}");
    assert_eq!(plan["fallbacks"][0]["to"], 1, "{plan}");
    for key in ["verified_ranks", "run_ranks"] {
        let ranks = plan[key].as_array().unwrap();
        assert_eq!(ranks.len(), 2, "{key}");
        assert!(
            ranks.iter().all(|m| m["peak_bytes"].as_u64().unwrap() <= limit),
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
    // A whole batch (no micro-batches given) is split over the ranks, so
    // the missing MPI is what is said (issue 47: it first asked to split).
    let o = vramfit(&[
        "train",
        "transformer",
        "--batch-size",
        "8",
        "--ranks",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("built without MPI") && !stderr(&o).contains("--accumulate"),
        "{}",
        stderr(&o)
    );
}
