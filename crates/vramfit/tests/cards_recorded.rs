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
