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
    let last = records.iter().rev().find(|r| r["phase"] == "backward").unwrap();
    assert_eq!(last["categories"]["parameters"], 160 * 8 * 4);
    assert_eq!(last["categories"]["optimizer_state"], 2 * 160 * 8 * 4);
    // The target on the device is u8: 80×56 pixels × 3 bytes, the largest tensor named.
    let largest = memory["largest_tensors"].as_array().unwrap();
    assert_eq!(largest[0], serde_json::json!(["target image", 80 * 56 * 3]));
    let peak = gpu["peak_memory_bytes"].as_u64().unwrap();
    assert!(
        gpu["peak_memory_source"]
            .as_str()
            .unwrap()
            .starts_with("device allocator")
    );
    assert!(peak >= last["device"]["allocated"].as_u64().unwrap());
    assert!(gpu["reserved_peak_bytes"].as_u64().unwrap() >= peak);
    assert!(gpu["driver_peak_bytes"].is_null());

    // The report reads the GPU run like any other.
    let text = ok(&run(&["report", "gpu"], d));
    assert!(text.contains("fragmentation"), "{text}");
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
    assert!(reports.as_array().unwrap().len() >= 7);
    let o = run(&["check-kernels", "--device", "cpu"], tmp.path());
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--device cuda or wgpu"));
}
