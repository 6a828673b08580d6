//! The capacity strategy's properties on fake targets whose memory and
//! time follow known laws.

use super::*;
use crate::plan::ProbeError;

/// An exact workload with Adam's moments on the device or the host,
/// probed at `counts`, each probe measured by `measure`.
struct TwoVariants<F> {
    wanted: usize,
    counts: Vec<usize>,
    measure: F,
}

impl<F: FnMut(&str, usize) -> Measured> Capacity for TwoVariants<F> {
    fn knob(&self) -> String {
        "max_gaussians".into()
    }
    fn wanted(&self) -> usize {
        self.wanted
    }
    fn variants(&self) -> Vec<Variant> {
        ["moments device", "moments host"]
            .map(|n| Variant {
                name: n.into(),
                quality: vec![],
                limit: usize::MAX,
            })
            .to_vec()
    }
    fn probe_counts(&self) -> Vec<usize> {
        self.counts.clone()
    }
    fn measure(&mut self, variant: &str, count: usize) -> Result<Measured, ProbeError> {
        Ok((self.measure)(variant, count))
    }
}

/// 50 MiB fixed and 1,000 bytes an element (device moments) or 500
/// (host moments, 30 % slower), in pages of 32 MiB.
struct Scene {
    allow_degree: bool,
}

fn law(per: u64, count: usize) -> u64 {
    let page = 32u64 << 20;
    ((50u64 << 20) + per * count as u64).div_ceil(page) * page
}

impl Capacity for Scene {
    fn knob(&self) -> String {
        "max_gaussians".into()
    }
    fn wanted(&self) -> usize {
        1_000_000
    }
    fn variants(&self) -> Vec<Variant> {
        let mut v = vec![
            Variant {
                name: "moments device".into(),
                quality: vec![],
                limit: usize::MAX,
            },
            Variant {
                name: "moments host".into(),
                quality: vec![],
                limit: usize::MAX,
            },
        ];
        if self.allow_degree {
            v.push(Variant {
                name: "degree 2".into(),
                quality: vec!["SH degree 2 instead of 3".into()],
                limit: usize::MAX,
            });
        }
        v
    }
    fn probe_counts(&self) -> Vec<usize> {
        vec![100_000, 200_000, 400_000]
    }
    fn measure(&mut self, variant: &str, count: usize) -> Result<Measured, ProbeError> {
        let (per, ms) = match variant {
            "moments device" => (1000, 1.0),
            "moments host" => (500, 1.3),
            _ => (300, 0.9),
        };
        let peak = law(per, count);
        Ok(Measured {
            peak_bytes: peak,
            step_peak_bytes: peak,
            step_ms: ms * count as f64 / 1e5,
            ..Measured::default()
        })
    }
}

/// A count a probe measured within the budget stays allowed where the
/// raised line and a wide margin would rule it out (measured on wgpu: a
/// variant at 100,000 Gaussians in 48 MiB, its line allowing 9,929 in
/// 64 MiB), and its plan expects the measured peak.
#[test]
fn a_count_measured_within_the_budget_is_not_ruled_out_by_the_line() {
    let probe = |count: usize, mib: u64| {
        let peak = mib << 20;
        (
            count,
            Measured {
                peak_bytes: peak,
                step_peak_bytes: peak,
                step_ms: 1.0,
                ..Measured::default()
            },
        )
    };
    let line = Line {
        variant: Variant {
            name: "v".into(),
            quality: vec![],
            limit: usize::MAX,
        },
        probes: vec![probe(2_000, 8), probe(25_000, 40), probe(100_000, 48)],
        bytes: (31.3 * (1u64 << 20) as f64, 365.0),
        error: 0.0,
        shortfall: 0.0,
        time: (0.0, 0.01),
    };
    assert!(line.by_memory(64 << 20, 0.84) < 20_000);
    assert_eq!(line.largest(64 << 20, 0.84), 100_000);
    assert_eq!(line.expected_peak(100_000), 48 << 20);
    // A count between probes expects no more than the probe above it measured.
    assert_eq!(line.expected_peak(60_000), 48 << 20);
    // Without 3 % to spare, the measurement does not count.
    assert!(line.largest(49 << 20, 0.84) < 100_000);
    // Capped by the variant's limit all the same.
    let capped = Line {
        variant: Variant {
            limit: 50_000,
            ..line.variant.clone()
        },
        ..line.clone()
    };
    assert_eq!(capped.largest(64 << 20, 0.84), 50_000);
}

/// Verified (settled by measurement), the count measures within the
/// budget and within 10 % of the largest count that does, at budgets
/// where the paged law's steps put the line's prediction off.
#[test]
fn the_verified_count_measures_within_and_near_the_largest() {
    let mut target = Scene { allow_degree: false };
    let cal = calibrate_capacity(&mut target).unwrap();
    for budget_mib in [200u64, 300, 450, 600, 1200] {
        let budget = budget_mib << 20;
        let v = crate::plan::verify(&cal, &mut target as &mut dyn Capacity, budget).unwrap();
        let plan = &v.choice.plans[0];
        let per = if plan.setting.variant == "moments device" {
            1000
        } else {
            500
        };
        let count = plan.setting.count;
        assert_eq!(law(per, count), v.measured.peak_bytes);
        assert!(v.measured.peak_bytes <= budget, "{budget_mib} MiB: {plan:?}");
        // The largest count of that variant measuring within the budget, by search.
        let best = (1..=1_000_000)
            .rev()
            .step_by(500)
            .find(|&c| law(per, c) <= budget)
            .unwrap();
        assert!(
            count as f64 >= 0.9 * best as f64,
            "{budget_mib} MiB: {} {count} against the largest within, {best}",
            plan.setting.variant
        );
    }
}

/// A plan that holds the count asked for is measured as it is, never
/// moved down: over the budget it goes back to the pipeline, which
/// tries the next plan (one that may hold the count too).
#[test]
fn a_plan_holding_the_count_asked_for_is_not_moved() {
    let mut target = Scene { allow_degree: false };
    let cal = calibrate_capacity(&mut target).unwrap();
    let line = cal.line("moments device").unwrap();
    let plan = cal.plan(line, 1_000_000);
    let (settled, measured) = cal.settle_count(&mut target, &plan, 500 << 20).unwrap();
    assert_eq!(settled.setting.count, 1_000_000);
    assert!(measured.peak_bytes > 500 << 20);
    let (settled, measured) = cal.settle_count(&mut target, &plan, 2 << 30).unwrap();
    assert_eq!(
        (settled.setting.count, measured.peak_bytes),
        (1_000_000, law(1000, 1_000_000))
    );
}

/// Two exact variants holding the count, the second 2 % faster (within
/// the probes' resolution): the first, the workload's preference, wins.
#[test]
fn times_within_resolution_keep_the_workloads_order() {
    let mut close = TwoVariants {
        wanted: 1000,
        counts: vec![250, 500, 1000],
        measure: |variant: &str, count: usize| Measured {
            peak_bytes: 1000 * count as u64,
            step_ms: if variant == "moments host" { 0.98 } else { 1.0 } * count as f64,
            ..Measured::default()
        },
    };
    let cal = calibrate_capacity(&mut close).unwrap();
    let c = cal.choose_count(1 << 30).unwrap();
    assert_eq!(c.plans[0].setting.variant, "moments device", "{:?}", c.plans);
    assert_eq!(c.plans[1].setting.variant, "moments host");
}

#[test]
fn the_count_asked_for_wins_then_the_largest() {
    let cal = calibrate_capacity(&mut Scene { allow_degree: false }).unwrap();
    // Ample: both hold a million; device moments are faster.
    let c = cal.choose_count(4 << 30).unwrap();
    assert_eq!(c.plans[0].setting.variant, "moments device");
    assert_eq!(c.plans[0].setting.count, 1_000_000);
    assert!(c.plans[0].exact());
    // 700 MiB: only host moments hold a million.
    let c = cal.choose_count(700 << 20).unwrap();
    assert_eq!(c.plans[0].setting.variant, "moments host");
    assert_eq!(c.plans[0].setting.count, 1_000_000);
    // 400 MiB: nothing holds a million; the most is on host moments,
    // and the plan says it lowers the count.
    let c = cal.choose_count(400 << 20).unwrap();
    assert_eq!(c.plans[0].setting.variant, "moments host");
    assert!(c.plans[0].setting.count < 1_000_000);
    assert!(c.plans[0].quality[0].contains("instead of 1000000"), "{:?}", c.plans[0]);
    // Too small: names a budget that works.
    match cal.choose_count(40 << 20) {
        Err(PlanError::Infeasible { smallest_bytes, .. }) => {
            assert!(cal.choose_count(smallest_bytes).is_ok())
        }
        other => panic!("{other:?}"),
    }
}

/// Below the count asked for, a faster variant that measures within
/// the budget at no more than 3 % fewer than the settled winner
/// replaces it; one holding far fewer does not.
#[test]
fn a_faster_variant_holding_nearly_as_many_wins_verification() {
    // Host moments `per` bytes an element against the device's 1,000
    // and five times slower, with `jump` bytes more above 1.2 M
    // elements, where no probe looked (as a page would): its line
    // promises more than it holds.
    let near = |per: u64, jump: u64| TwoVariants {
        wanted: 10_000_000,
        counts: vec![100_000, 400_000, 1_000_000],
        measure: move |variant: &str, count: usize| {
            let (per, jump, ms) = if variant == "moments host" {
                (per, if count > 1_200_000 { jump } else { 0 }, 5.0)
            } else {
                (1000, 0, 1.0)
            };
            let peak = (50u64 << 20) + per * count as u64 + jump;
            Measured {
                peak_bytes: peak,
                step_peak_bytes: peak,
                step_ms: ms * count as f64 / 1e5,
                ..Measured::default()
            }
        },
    };
    let budget = 1_600_000_000;
    let mut close = near(900, 136_000_000);
    let cal = calibrate_capacity(&mut close).unwrap();
    let ranked = cal.choose_count(budget).unwrap().plans[0].clone();
    assert_eq!(ranked.setting.variant, "moments host", "its line promises the most");
    let (host, _) = cal.settle_count(&mut close, &ranked, budget).unwrap();
    let v = crate::plan::verify(&cal, &mut close as &mut dyn Capacity, budget).unwrap();
    let plan = &v.choice.plans[0];
    assert_eq!(plan.setting.variant, "moments device", "{}", v.choice.why);
    assert!(v.measured.peak_bytes <= budget);
    assert!(
        plan.setting.count as f64 >= host.setting.count as f64 * (1.0 - COUNT_RESOLUTION),
        "{plan:?} against {host:?}"
    );
    // Host moments holding twice as many stay the winner.
    let mut far = near(500, 0);
    let cal = calibrate_capacity(&mut far).unwrap();
    let v = crate::plan::verify(&cal, &mut far as &mut dyn Capacity, budget).unwrap();
    assert_eq!(v.choice.plans[0].setting.variant, "moments host");
}

#[test]
fn a_model_change_is_ranked_after_exact_plans_at_the_same_count() {
    let cal = calibrate_capacity(&mut Scene { allow_degree: true }).unwrap();
    let c = cal.choose_count(4 << 30).unwrap();
    // The degree-2 variant is fastest but changes the model.
    assert_eq!(c.plans[0].setting.variant, "moments device");
    assert_eq!(c.plans.last().unwrap().setting.variant, "degree 2");
    // Where only it holds the count asked for, it wins, saying so.
    let c = cal.choose_count(500 << 20).unwrap();
    assert_eq!(c.plans[0].setting.variant, "degree 2");
    assert_eq!(c.plans[0].setting.count, 1_000_000);
    assert_eq!(c.plans[0].quality, vec!["SH degree 2 instead of 3".to_string()]);
}
