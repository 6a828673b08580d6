//! The planner's choices are a function of its calibration: fed the
//! calibrations recorded by earlier builds (`bench-results/
//! planner-same-choices/`, written by `vramfit bench plan` and `bench
//! plan-splat` before the planning pipeline moved into the library), both
//! strategies choose what those builds chose at every recorded budget,
//! infeasible ones included. A refactor of the planner that changes a
//! choice fails here, whatever the noise of a new calibration would do.

use std::path::PathBuf;

use serde_json::Value;
use vramfit::plan::{Calibration, Knobs, LadderCalibration, Plan, Strategy};

fn recorded(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench-results/planner-same-choices")
        .join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .expect("a benchmark record")
}

/// Each recorded budget with the choice recorded there (`None`: infeasible).
fn choices<S>(record: &Value, chosen: impl Fn(&Value) -> S) -> Vec<(u64, Option<S>)> {
    record["budgets"]
        .as_array()
        .expect("budgets")
        .iter()
        .map(|row| {
            (
                row["budget"].as_u64().expect("a budget"),
                row.get("chosen").map(&chosen),
            )
        })
        .collect()
}

#[test]
fn the_knob_model_chooses_what_earlier_builds_chose_from_their_calibrations() {
    for name in ["transformer-cpu-at-6c4f140", "transformer-cpu-at-dda3f9c"] {
        let record = recorded(name);
        let cal: Calibration = serde_json::from_value(record["calibration"].clone()).expect("a calibration");
        let rows = choices(&record, |c| {
            serde_json::from_value::<Knobs>(c["knobs"].clone()).expect("knobs")
        });
        assert!(
            rows.iter().filter(|(_, c)| c.is_some()).count() >= 3,
            "{name}: too few choices recorded"
        );
        for (budget, then) in rows {
            let now = cal.choose(budget).ok().map(|c| c.plans[0].setting.clone());
            assert_eq!(now, then, "{name} at {budget} bytes");
        }
    }
}

#[test]
fn the_ladder_chooses_what_an_earlier_build_chose_from_its_calibration() {
    let record = recorded("splat-wgpu-at-dda3f9c");
    let cal: LadderCalibration = serde_json::from_value(record["calibration"].clone()).expect("a calibration");
    // Read as today's plan type: the record's winner is a rung, its setting `value`.
    let rows = choices(&record, |c| {
        serde_json::from_value::<Plan<usize>>(c.clone())
            .expect("a plan")
            .setting
    });
    assert!(rows.iter().filter(|(_, c)| c.is_some()).count() >= 3);
    for (budget, then) in rows {
        let now = cal.choose(budget).ok().map(|c| c.plans[0].setting);
        assert_eq!(now, then, "at {budget} bytes");
    }
}
