//! A card's reserved bytes predicted without the card, against the card:
//! the scene fit's traces recorded on lavapipe (`vramfit bench scene-cards
//! --device wgpu`, committed in bench-results/scene-cards-wgpu.json),
//! grown to 1 M and 6 M Gaussians and replayed through CubeCL's pools as
//! an H200's CUDA client makes them, against what an H200 reported for the
//! same steps (bench-results/gpu-h200-2/second/scene-steps-cuda.json): all
//! twelve of its rows, the moments on the device and on the host.
//! The bound is the one docs/results/cards.md reports.

use std::path::Path;

use serde_json::Value;
use vramfit::pools::{Card, TraceLaw, replay};

/// Largest error allowed, percent of the recorded figure.
const BOUND_PERCENT: f64 = 5.0;

fn read(relative: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn an_h200s_recorded_scene_steps_are_predicted_from_lavapipe_traces() {
    let bench = read("bench-results/scene-cards-wgpu.json");
    let recorded = read("bench-results/gpu-h200-2/second/scene-steps-cuda.json");
    let h200 = Card::named("h200").unwrap();
    assert_eq!(
        (bench["width"].as_u64(), bench["height"].as_u64()),
        (Some(1280), Some(720))
    );
    let mut compared = Vec::new();
    for place in bench["places"].as_array().unwrap() {
        // Each law grows to the counts it was probed for (with the moments
        // on the host, each count's own scaled probes).
        for law in place["laws"].as_array().unwrap() {
            let trace_law: TraceLaw = serde_json::from_value(law["law"].clone()).unwrap();
            for n in law["for_gaussians"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
            {
                let predicted = replay(&trace_law.at(n), &h200.allocator).unwrap().reserved_peak;
                let measured = recorded["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|s| {
                        s["case"]["gaussians"].as_u64() == Some(n)
                            && s["case"]["degree"].as_u64() == bench["degree"].as_u64()
                            && s["case"]["width"] == bench["width"]
                            && s["case"]["height"] == bench["height"]
                            && s["moments"] == place["moments"]
                            && s["sh"] == place["sh"]
                            && s["state"] == place["state"]
                    })
                    .and_then(|s| s["reserved"].as_u64())
                    .unwrap_or_else(|| panic!("no H200 step at {n} for {place:?}"));
                let off = 100.0 * (predicted as f64 - measured as f64) / measured as f64;
                let what = format!(
                    "moments {}, SH {}, state {}, {n} Gaussians",
                    place["moments"], place["sh"], place["state"]
                );
                assert!(
                    off.abs() <= BOUND_PERCENT,
                    "{what}: predicted {predicted}, the H200 reserved {measured} ({off:+.2} %)"
                );
                // The committed table says what the code computes.
                let stored = law["predictions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["gaussians"].as_u64() == Some(n) && p["card"] == "h200")
                    .and_then(|p| p["predicted_reserved"].as_u64());
                assert_eq!(stored, Some(predicted), "{what}");
                compared.push(off);
            }
        }
    }
    // Six places (the moments on the device: the state exact or pooled;
    // on the host: f32 or f16 SH, exact or pooled) at 1 M and 6 M.
    assert_eq!(compared.len(), 12, "{compared:?}");
}

/// The transformer's steps an H200 measured (`bench plan` on CUDA:
/// bench-results/gpu-h200-2/second/plan-transformer-cuda.json), predicted
/// from this machine's CPU (`vramfit bench model-cards`, committed in
/// bench-results/model-cards-h200.json): every f32 probe and check, each
/// against the record's own figure. The bounds are docs/results/cards.md's.
#[test]
fn an_h200s_recorded_transformer_steps_are_predicted_from_cpu_traces() {
    let bench = read("bench-results/model-cards-h200.json");
    let recorded = read("bench-results/gpu-h200-2/second/plan-transformer-cuda.json");
    assert_eq!(bench["card"]["name"], "h200");
    let mut figures = std::collections::HashMap::new();
    for cal in ["calibration", "extrapolating_calibration"] {
        for list in ["probes", "checks"] {
            for p in recorded[cal][list].as_array().unwrap() {
                figures.insert(
                    (knobs(&p["knobs"]), p["batch"].as_u64().unwrap()),
                    p["measured"]["peak_bytes"].as_u64().unwrap(),
                );
            }
        }
    }
    let rows = bench["rows"].as_array().unwrap();
    // Every f32 step of the record (the 16-bit ones are not traced).
    assert_eq!(rows.len(), 26, "{rows:?}");
    let (mut under, mut over) = (0f64, 0f64);
    for r in rows {
        let key = (knobs(&r["knobs"]), r["batch"].as_u64().unwrap());
        let figure = figures[&key];
        assert_eq!(r["recorded_reserved"].as_u64(), Some(figure), "{r}");
        let off = 100.0 * (r["predicted_reserved"].as_u64().unwrap() as f64 / figure as f64 - 1.0);
        under = under.min(off);
        over = over.max(off);
    }
    eprintln!("{} steps: {under:+.2} … {over:+.2} %", rows.len());
    assert!(
        under >= -UNDER_PERCENT && over <= OVER_PERCENT,
        "{under:+.2} … {over:+.2} %"
    );
}

/// Knobs as one key, whichever fields the record wrote.
fn knobs(v: &Value) -> String {
    let k: vramfit::plan::Knobs = serde_json::from_value(v.clone()).unwrap();
    serde_json::to_string(&k).unwrap()
}

/// The most a CPU trace's prediction fell short of an H200's figure (measured −2.52 %).
const UNDER_PERCENT: f64 = 3.0;
/// The most it exceeded one (measured +5.72 %: conservative).
const OVER_PERCENT: f64 = 6.0;
