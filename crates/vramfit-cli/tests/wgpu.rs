//! The GPU path of the binary end to end on wgpu: in CI a software Vulkan
//! device (Mesa's lavapipe) stands in for a GPU, so the CubeCL kernels, the
//! banded loss, the allocator-backed profiler and the CLI glue run on every
//! push. Needs a Vulkan driver (`.ci/run` installs lavapipe).
#![cfg(feature = "wgpu")]

use std::path::Path;
use std::process::{Command, Output};

fn run(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("the binary runs")
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_wgpu_fit_matches_the_cpu_fit_and_profiles_the_device_allocator() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ok(&run(&["sample", "--size", "80x56", "in.png"], d));
    // Additions included (the render for them comes back band by band), and
    // a band of 16 rows, so the 56-row image takes 4 bands with halos.
    let cfg = "image = \"in.png\"\ngaussians = 160\nsteps = 150\nadd_every = 30\ncheck_every = 50\n\
               log_every = 10\nframe_every = 75\nprofile_every = 25\nband_rows = 16\n";
    std::fs::write(d.join("small.toml"), cfg).unwrap();
    ok(&run(&["fit", "--config", "small.toml", "--out", "cpu"], d));
    let text = ok(&run(
        &["fit", "--config", "small.toml", "--out", "gpu", "--device", "wgpu"],
        d,
    ));
    assert!(text.contains("allocator reserved"), "{text}");

    let (cpu, gpu) = (json(&d.join("cpu/summary.json")), json(&d.join("gpu/summary.json")));
    let psnr = |s: &serde_json::Value| s["psnr_db"].as_f64().unwrap();
    assert!(gpu["device"].as_str().unwrap().starts_with("wgpu"), "{gpu}");
    assert_eq!(gpu["gaussians"], 160);
    // The quality criterion, here on the software device.
    assert!(
        (psnr(&cpu) - psnr(&gpu)).abs() < 0.3,
        "cpu {} dB, wgpu {} dB",
        psnr(&cpu),
        psnr(&gpu)
    );
    for f in [
        "render.png",
        "gaussians.vfg",
        "frames/step-00000075.png",
        "frames/step-00000150.png",
    ] {
        assert!(d.join("gpu").join(f).is_file(), "missing {f}");
    }

    // The profiler reads the wgpu allocator: device figures at every phase,
    // walked categories exact, derived ones present and consistent.
    let memory = json(&d.join("gpu/memory.json"));
    assert!(
        memory["source"].as_str().unwrap().contains("wgpu allocator"),
        "{}",
        memory["source"]
    );
    assert!(memory["driver_source"].as_str().unwrap().starts_with("none"));
    let records = memory["records"].as_array().unwrap();
    assert!(!records.is_empty());
    for r in records {
        let (allocated, reserved) = (
            r["device"]["allocated"].as_u64().expect("allocator figures on wgpu"),
            r["device"]["reserved"].as_u64().unwrap(),
        );
        assert!(reserved >= allocated && allocated > 0, "{r}");
        let sum: u64 = r["categories"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(sum, reserved, "categories add up to reserved: {r}");
    }
    let last = records.iter().rev().find(|r| r["phase"] == "forward_backward").unwrap();
    assert_eq!(last["categories"]["parameters"], 160 * 8 * 4);
    assert_eq!(last["categories"]["optimizer_state"], 2 * 160 * 8 * 4);
    // The target on the device is u8: 80×56 pixels × 3 bytes, an input.
    assert_eq!(last["categories"]["inputs"], 80 * 56 * 3);
    // The engine's band scratch is declared as workspace (held by the pool between phases).
    let workspace = gpu["workspace_bytes"].as_u64().unwrap();
    assert!(workspace > 16 * 80 * 3 * 4, "at least one band plane: {workspace}");
    assert_eq!(last["categories"]["workspace"], workspace);
    let largest = memory["largest_tensors"].as_array().unwrap();
    assert!(
        largest
            .iter()
            .any(|t| t["name"] == "target image" && t["bytes"] == 80 * 56 * 3 && t["category"] == "inputs"),
        "{largest:?}"
    );
    // The headline is the allocator's reserved high-water: what decides an
    // OOM on CubeCL; it holds the declared workspace and the rest at once.
    let headline = &memory["headline"];
    assert_eq!(headline["figure"], "allocator reserved bytes");
    assert_eq!(headline["exact"], true);
    let peak = gpu["peak_memory_bytes"].as_u64().unwrap();
    assert_eq!(headline["bytes"].as_u64().unwrap(), peak);
    assert_eq!(gpu["reserved_peak_bytes"].as_u64().unwrap(), peak);
    assert_eq!(memory["reserved_peak_bytes"].as_u64().unwrap(), peak);
    let most_recorded = records
        .iter()
        .map(|r| r["device"]["reserved"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(peak >= most_recorded);
    assert!(
        peak >= workspace + 80 * 56 * 3 + 3 * 160 * 8 * 4,
        "peak {peak}, workspace {workspace}"
    );
    assert!(gpu["driver_peak_bytes"].is_null());

    // The report reads the GPU run like any other.
    let text = ok(&run(&["report", "gpu"], d));
    assert!(
        text.contains("allocator reserved bytes") && text.contains("workspace"),
        "{text}"
    );
}

/// The transformer on wgpu: the step's phases are recorded with the
/// activations measured from the allocator, and checkpointing lowers them.
#[test]
fn a_wgpu_transformer_measures_activations_and_checkpointing_lowers_them() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let train = |checkpoint: &str, out: &str| {
        ok(&run(
            &[
                "train",
                "transformer",
                "--device",
                "wgpu",
                "--steps",
                "3",
                "--checkpoint",
                checkpoint,
                "--set",
                "profile_every=1",
                "--set",
                "task.tokens=32",
                "--out",
                out,
            ],
            d,
        ));
        let memory = json(&d.join(out).join("memory.json"));
        let records = memory["records"].as_array().unwrap().clone();
        let last = records.last().unwrap()["step"].clone();
        let of = |phase: &str| {
            records
                .iter()
                .find(|r| r["step"] == last && r["phase"] == phase)
                .unwrap_or_else(|| panic!("no {phase} record: {records:?}"))
                .clone()
        };
        let (fwd, bwd) = (of("forward"), of("backward"));
        assert!(bwd["categories"]["gradients"].as_u64().unwrap() > 0, "{bwd}");
        assert_eq!(memory["headline"]["figure"], "allocator reserved bytes");
        fwd["categories"]["activations"].as_u64().unwrap()
    };
    let plain = train("none", "plain");
    let all = train("all", "all");
    eprintln!("wgpu activations: none {plain}, checkpoint all {all}");
    assert!(plain > 0 && all < plain, "none {plain}, all {all}");
}

#[test]
fn check_kernels_passes_on_wgpu_and_cpu_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let text = ok(&run(
        &["check-kernels", "--device", "wgpu", "--out", "check.json"],
        tmp.path(),
    ));
    assert!(text.contains("cases within tolerance"), "{text}");
    let reports = json(&tmp.path().join("check.json"));
    assert!(reports["image"].as_array().unwrap().len() >= 7);
    assert!(
        reports["scene"].as_array().unwrap().len() >= 5,
        "the scene renderer's cases too"
    );
    assert!(
        reports["scene_loss"].as_array().unwrap().len() >= 10,
        "the scene's loss on the device, two ways a case"
    );
    assert!(
        reports["attention"].as_array().unwrap().len() >= 11,
        "the tiled attention's cases, f16 ones among them (lavapipe has f16)"
    );
    let o = run(&["check-kernels", "--device", "cpu"], tmp.path());
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--device cuda or wgpu"));
}

#[test]
fn a_planned_wgpu_fit_takes_a_band_that_fits_and_falls_back_on_out_of_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ok(&run(&["sample", "--size", "512x256", "in.png"], d));
    let text = ok(&run(
        &[
            "fit",
            "in.png",
            "--device",
            "wgpu",
            "--gaussians",
            "800",
            "--steps",
            "8",
            "--budget",
            "1GiB",
            "--set",
            "checkpoint_every=2",
            "--set",
            "frame_every=0",
            "--set",
            "log_every=1",
            "--out",
            "planned",
            "--simulate-oom-at",
            "4",
        ],
        d,
    ));
    assert!(text.contains("fell back from plan 1 to plan 2"), "{text}");
    let plan = json(&d.join("planned/plan.json"));
    assert_eq!(plan["running"], 1);
    let bands: Vec<u64> = plan["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["setting"].as_u64().unwrap())
        .collect();
    assert!(bands.len() >= 2 && bands.windows(2).all(|w| w[1] < w[0]), "{bands:?}");
    let config = std::fs::read_to_string(d.join("planned/config.toml")).unwrap();
    assert!(config.contains(&format!("band_rows = {}", bands[1])), "{config}");
    let steps = vramfit::run::logged_steps(&d.join("planned")).unwrap();
    assert_eq!(steps, (1..=8).collect::<Vec<_>>(), "every step once");
}

/// A scene fit with Adam's moments on the host times its copies between
/// host and device and the host's update, every step and as the median in
/// the summary, and says so.
#[test]
fn a_scene_with_host_moments_times_its_copies() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let text = ok(&run(
        &[
            "scene",
            "--device",
            "wgpu",
            "--moments",
            "host",
            "--steps",
            "12",
            "--set",
            "width=48",
            "--set",
            "height=36",
            "--set",
            "log_every=1",
            "--out",
            "s",
        ],
        d,
    ));
    assert!(text.contains("ms copying between host and device"), "{text}");
    let [copies, update] = json(&d.join("s/summary.json"))["host_step_ms"]
        .as_array()
        .map(|v| [v[0].as_f64().unwrap(), v[1].as_f64().unwrap()])
        .expect("host_step_ms in the summary");
    assert!(copies > 0.0 && update > 0.0, "{copies} {update}");
    let lines = std::fs::read_to_string(d.join("s/metrics.jsonl")).unwrap();
    assert!(
        lines
            .lines()
            .all(|l| l.contains("\"transfer_ms\"") && l.contains("\"host_adam_ms\"")),
        "{lines}"
    );
}

/// `plan scene --gpus` on wgpu: each card's rows from the card's own pools
/// (the probes' traces grown and replayed, `vramfit::pools`), one object per
/// card and variant; a card too small for the seeded scene is a row that
/// does not fit, not an error; cards by name.
#[test]
fn a_scene_plan_predicts_each_cards_own_allocator() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let json_path = d.join("cards.json");
    let text = ok(&run(
        &[
            "plan",
            "scene",
            "--device",
            "wgpu",
            "--max-gaussians",
            "6000000",
            "--probe-gaussians",
            "2000,4000,8000",
            "--gpus",
            "1MiB,16,80,h100-80",
            "--json",
            json_path.to_str().unwrap(),
        ],
        d,
    ));
    assert!(text.contains("each card's own allocator"), "{text}");
    let plan = json(&json_path);
    let rows = plan["cards"].as_array().expect("card rows");
    let row = |card: &str, variant: &str| {
        rows.iter()
            .find(|r| r["card"] == card && r["variant"] == variant)
            .unwrap_or_else(|| panic!("no row for {card}, {variant}: {rows:?}"))
    };
    let count = |card: &str| row(card, "moments device")["max_gaussians"].as_u64();
    for card in ["16 GiB", "80 GiB", "h100-80"] {
        assert_eq!(row(card, "moments device")["basis"], "replayed for the card", "{card}");
        let reserved = row(card, "moments device")["predicted_reserved"].as_u64().unwrap();
        assert!(reserved <= row(card, "moments device")["card_bytes"].as_u64().unwrap());
    }
    assert!(count("80 GiB").unwrap() > count("16 GiB").unwrap(), "{rows:?}");
    // 1 MiB holds less than the seeded scene's step: no count, and why.
    let tiny = row("1MiB", "moments device");
    assert!(tiny["max_gaussians"].is_null(), "{tiny}");
    assert!(tiny["why_not"].as_str().unwrap().contains("does not fit"), "{tiny}");
    // The moments on the host: this device's line, labelled so.
    assert_eq!(row("16 GiB", "moments host")["basis"], "measured here, scaled");
    assert_eq!(row("h100-80", "moments device")["card_bytes"], 81_559u64 << 20);
}

/// `plan transformer --budget … --gpus` on wgpu: the budget's plan probed
/// and verified here, each card's row the whole model traced on shapes and
/// replayed through that card's pools (`vramfit::plan::traced`), not this
/// device's figure scaled; a card that holds less gets a leaner plan
/// within it (a card nothing fits: `vramfit::plan::traced`'s tests).
#[test]
fn a_transformer_plan_replays_each_cards_own_allocator() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let json_path = d.join("cards.json");
    let mut args = vec![
        "plan",
        "transformer",
        "--device",
        "wgpu",
        "--budget",
        "64MiB",
        "--gpus",
        "1MiB,16,h200",
    ];
    for set in ["model.width=32", "model.depth=2", "model.context=16", "task.tokens=16"] {
        args.extend(["--set", set]);
    }
    args.extend(["--json", json_path.to_str().unwrap()]);
    let text = ok(&run(&args, d));
    assert!(text.contains("each card's plan, traced at full size"), "{text}");
    let plan = json(&json_path);
    assert!(plan["verified"]["peak_bytes"].as_u64().is_some(), "{plan}");
    let rows = plan["cards"].as_array().expect("card rows");
    let row = |card: &str| {
        rows.iter()
            .find(|r| r["card"] == card)
            .unwrap_or_else(|| panic!("no row for {card}: {rows:?}"))
    };
    for card in ["16 GiB", "h200"] {
        let r = row(card);
        assert_eq!(r["basis"], "traced", "{r}");
        assert_eq!(r["fits"], true, "{r}");
        let peak = r["peak_bytes"].as_u64().unwrap();
        assert!(peak > 0 && peak < r["card_bytes"].as_u64().unwrap(), "{r}");
    }
    assert!(row("h200")["step_ms_estimate"].as_f64().unwrap() > 0.0);
    assert!(row("16 GiB")["step_ms_estimate"].is_null());
    assert_eq!(row("h200")["card_bytes"], 143_771u64 << 20);
    // The 1 MiB card: a leaner plan than the 16 GiB card's, within it.
    let tiny = row("1MiB");
    assert_eq!(tiny["fits"], true, "{tiny}");
    assert!(
        tiny["peak_bytes"].as_u64().unwrap() as f64 * 1.05 <= (1u64 << 20) as f64,
        "{tiny}"
    );
    assert!(
        tiny["in_use_bytes"].as_u64() < row("16 GiB")["in_use_bytes"].as_u64(),
        "{tiny}"
    );
}
