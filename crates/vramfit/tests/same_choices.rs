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

/// Quality given up last, on recorded calibrations: a video llm of 8
/// frames (64 px, 4×4 tokens each, width 128, batch 4) calibrated on the
/// CPU at every frame count from 1 to 8 (`bench-results/multimodal/
/// quality-calibrations/`, `vramfit plan llm … --keep-quality --budget
/// 1GiB --json`). At every budget from 8 to 24 MiB: where a plan fits at 8
/// frames nothing is lowered (the planner asks for no lower value); where
/// none does, the bisection gives the most frames at which the recorded
/// calibration has a plan within the budget, the same as trying every
/// count (the predictions fall with the frames, as it assumes), or none
/// where not even one frame fits.
#[test]
fn quality_is_given_up_last_on_recorded_calibrations() {
    use vramfit::plan::quality::QualityKnob;
    let cals: Vec<Calibration> = (1..=8)
        .map(|f| {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
                "../../bench-results/multimodal/quality-calibrations/frames-{f}.json"
            ));
            let record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            serde_json::from_value(record["calibration"].clone()).expect("a calibration")
        })
        .collect();
    let fits = |frames: usize, budget: u64| cals[frames - 1].choose(budget).is_ok();
    let knob = QualityKnob {
        name: "frames".into(),
        key: "task.frames".into(),
        asked: 8,
        lower: (1..8).collect(),
    };
    let (mut kept, mut lowered, mut none) = (0, 0, 0);
    for budget in (8u64 << 20..=24 << 20).step_by(256 << 10) {
        if fits(8, budget) {
            kept += 1;
            continue;
        }
        let given = knob.largest::<()>(|v| Ok(fits(v, budget))).unwrap().map(|g| g.planned);
        let every = (1..8).rev().find(|&v| fits(v, budget));
        assert_eq!(given, every, "at {budget} bytes");
        match given {
            Some(_) => lowered += 1,
            None => none += 1,
        }
    }
    eprintln!("budgets: {kept} kept 8 frames, {lowered} gave some up, {none} fit no frame count");
    assert!(kept > 0 && lowered > 0, "the budgets span the lowering");
}
