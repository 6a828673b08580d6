//! Each card's own reserved peak for a model's plans: a plan's steps run
//! on the CPU with its heap recorded ([`vramfit::pools::trace_on_cpu`])
//! and replayed through the CubeCL pools the card's client makes. The
//! planner's model, fitted on the probing device, ranks the plans; the
//! replay decides, per card, whether a plan fits.

use std::collections::HashMap;

use serde_json::{Value, json};
use vramfit::plan::{Calibration, Knobs, Strategy};
use vramfit::pools::{Card, ReplayError, Trace, replay, trace_on_cpu};
use vramfit::profile::human_bytes;
use vramfit::run::{RunPath, Start};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::Family;

/// Plans traced per card at most, in the planner's order: each trace is a
/// CPU run of a few steps at the run's shape.
const TRIES: usize = 4;

/// Plans looked at per card at most (traced or passed over).
const CONSIDERED: usize = 32;

/// Steps traced: the pools reach their high-water within two.
const TRACED_STEPS: u64 = 3;

/// The margin on a replayed peak: above the largest shortfall measured
/// against a card (an H200's recorded steps: -2.52 % at worst).
const REPLAY_MARGIN: f64 = 0.05;

/// What the rows rest on.
const RESTS_ON: &str = "the plan's first steps run on this machine's CPU with Burn's tensors recorded as heap \
                        blocks (the CPU's own kernels off), replayed through the CubeCL pools the card's client makes";

/// Why a plan cannot be traced on the CPU as the card would run it, if so.
/// (Checked against lavapipe's allocator, `vramfit-models/tests/pools_trace.rs`:
/// f32 with checkpointing, moments on the host, the allocator cleanup and
/// the fused attention replay equal to the byte; against an H200's 26
/// recorded f32 steps, -2.52 … +5.72 %, docs/results/cards.md.)
pub(crate) fn untraceable(k: &Knobs) -> Option<&'static str> {
    let small_base = k.base.is_some_and(|b| b != vramfit::frozen::BaseStorage::F32);
    if k.precision.name() != "f32" || k.low_storage > 0 || k.low_moments || small_base {
        Some("16-bit or quantized tensors (the trace is checked against a device in f32 only)")
    } else if k.ranks > 1 {
        Some("several ranks")
    } else {
        None
    }
}

/// The first `steps` steps of a run of `config`, traced on the CPU
/// ([`trace_on_cpu`]) in a throw-away run directory, as a probe's.
pub(crate) fn trace_config<F: Family<D>, const D: usize>(
    mut config: FamilyConfig<F>,
    steps: u64,
) -> Result<Trace, vramfit::pools::CpuTraceError> {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    config.steps = steps;
    config.checkpoint_every = 0;
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("vramfit-trace-{}-{n}", std::process::id()));
    let traced = trace_on_cpu(
        || {
            vramfit_models::job::start::<vramfit::backends::Flex, F, D>(
                Start::New(config, RunPath::At(dir.clone())),
                &Default::default(),
                "cpu",
            )
        },
        steps,
    );
    let _ = std::fs::remove_dir_all(&dir);
    traced
}

/// One row per card: the fastest plan (in the planner's order) whose
/// replayed peak, with [`REPLAY_MARGIN`], fits the card.
pub fn rows<F: Family<D>, const D: usize>(
    settings: impl Fn(&Knobs) -> FamilyConfig<F>,
    cal: &Calibration,
    cards: &[Card],
) -> Vec<Value> {
    let mut traces: HashMap<String, Trace> = HashMap::new();
    let mut trace = |knobs: &Knobs| -> Result<Trace, String> {
        let key = serde_json::to_string(knobs).expect("knobs serialise");
        if let Some(t) = traces.get(&key) {
            return Ok(t.clone());
        }
        let traced = trace_config(settings(knobs), TRACED_STEPS);
        // Failures are not kept: a later card tries again.
        let traced = traced.map_err(|e| format!("the CPU trace failed: {e}"))?;
        traces.insert(key, traced.clone());
        Ok(traced)
    };
    cards
        .iter()
        .map(|card| {
            let mut row = json!({
                "card": card.name,
                "card_bytes": card.memory_bytes,
                "basis": "replayed for the card",
                "rests_on": RESTS_ON,
                "fits": false,
            });
            // The planner's plans for the card by this device's model;
            // where that model fits none (its pages are not the card's),
            // the leanest plans, for the replay to decide.
            let (plans, refused) = match cal.choose(card.memory_bytes) {
                Ok(choice) => (choice.plans, None),
                Err(e) => {
                    let mut all = cal.choose(u64::MAX).map(|c| c.plans).unwrap_or_default();
                    all.sort_by_key(|p| p.peak_bytes);
                    (all, Some(e.to_string()))
                }
            };
            // Traced plans, and of those the ones the replay decided on.
            let (mut passed, mut tried, mut decided) = (Vec::new(), 0, 0);
            for plan in plans.iter().take(CONSIDERED) {
                if tried == TRIES {
                    break;
                }
                let name = cal.describe(&plan.setting);
                if let Some(why) = untraceable(&plan.setting) {
                    passed.push(format!("{name}: not traced, {why}"));
                    continue;
                }
                // The trace runs the plan here: not one this machine's
                // memory cannot hold twice over (by its predicted peak).
                let free = vramfit::memory::available_bytes().unwrap_or(u64::MAX);
                if plan.peak_bytes.saturating_mul(2) > free {
                    passed.push(format!(
                        "{name}: not traced, predicted at {} where this machine has {} free",
                        human_bytes(plan.peak_bytes),
                        human_bytes(free)
                    ));
                    continue;
                }
                tried += 1;
                let peak = trace(&plan.setting).and_then(|t| {
                    replay(&t, &card.allocator).map_err(|e| match e {
                        ReplayError::BufferTooBig { .. } => format!("on this card {e}"),
                        other => other.to_string(),
                    })
                });
                let too_big = matches!(&peak, Err(e) if e.starts_with("on this card"));
                if peak.is_ok() || too_big {
                    decided += 1;
                }
                match peak {
                    Ok(r) if r.reserved_peak as f64 * (1.0 + REPLAY_MARGIN) <= card.memory_bytes as f64 => {
                        row["fits"] = json!(true);
                        row["peak_bytes"] = json!(r.reserved_peak);
                        row["margin"] = json!(REPLAY_MARGIN);
                        row["plan"] = json!(name);
                        row["setting"] = json!(plan.setting);
                        break;
                    }
                    Ok(r) => passed.push(format!(
                        "{name}: replayed {} with the {:.0} % margin, over the card",
                        human_bytes(r.reserved_peak),
                        100.0 * REPLAY_MARGIN
                    )),
                    Err(e) => passed.push(format!("{name}: {e}")),
                }
            }
            if !passed.is_empty() {
                row["passed_over"] = json!(passed);
            }
            let refused = refused
                .map(|e| format!(" (on this device's model: {e})"))
                .unwrap_or_default();
            let fits = row["fits"] == json!(true);
            if !fits && decided == 0 {
                // Nothing was replayed: not a verdict on the card.
                row["fits"] = Value::Null;
                row["basis"] = json!("not replayed");
                row["why_not"] = json!(format!(
                    "no plan could be traced and replayed for this card (why: passed_over){refused}"
                ));
            } else if !fits {
                let which = if refused.is_empty() { "fastest" } else { "leanest" };
                row["why_not"] = json!(format!(
                    "none of the {decided} {which} plans replayed fits the card's pools with the {:.0} % margin{refused}",
                    100.0 * REPLAY_MARGIN,
                ));
            }
            row
        })
        .collect()
}

/// Prints the rows.
pub fn print(rows: &[Value], device: &str) {
    println!(
        "\neach card's own allocator (ranked on {device}; \"replayed for the card\": the plan's steps traced on this \
         machine's CPU and replayed through CubeCL's pools as that card's client makes them, with a {:.0} % margin):",
        100.0 * REPLAY_MARGIN
    );
    println!("  {:<22} {:>14}  plan", "card", "reserved");
    for r in rows {
        let card = format!(
            "{} ({})",
            r["card"].as_str().unwrap_or(""),
            human_bytes(r["card_bytes"].as_u64().unwrap_or(0))
        );
        let peak = r["peak_bytes"].as_u64().map_or_else(|| "—".to_string(), human_bytes);
        let plan = match r["fits"].as_bool() {
            Some(true) => r["plan"].as_str().unwrap_or(""),
            Some(false) => "none fits",
            None => "not replayed",
        };
        println!("  {card:<22} {peak:>14}  {plan}");
        let passed = r["passed_over"].as_array().map_or(0, Vec::len);
        if passed > 0 {
            println!("      {passed} plans passed over (why: \"passed_over\" in --json)");
        }
        if let Some(why) = r["why_not"].as_str() {
            println!("      {why}");
        }
    }
}
