//! `vramfit bench model-cards`: a card's reserved figure for transformer
//! steps, predicted by tracing them on shapes alone
//! ([`vramfit_models::traced::trace_settings`]: nothing computed) and
//! replaying the trace through CubeCL's pools as the card's client makes
//! them, against what the card measured for the same steps: every probe
//! and check of a `bench plan` record made on that card (the settings, the
//! model and the batch are the record's own).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use vramfit::plan::{Knobs, PROBE_STEPS, Space};
use vramfit::pools::{Card, replay};
use vramfit_models::gpt::TrainConfig;

/// The benchmark's arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The card and its record, CARD=FILE: a `bench plan` JSON (the
    /// transformer) measured on that card.
    #[arg(long, value_parser = crate::bench_cards::parse_recorded)]
    recorded: (Card, PathBuf),
    /// JSON output (a .md table is written beside it).
    #[arg(long, default_value = "bench-results/model-cards.json")]
    out: PathBuf,
}

/// One measured step of the record: its name, batch, knobs and peak.
struct Recorded {
    name: String,
    batch: usize,
    knobs: Knobs,
    peak: u64,
}

/// Every probe and check of each calibration in the record.
fn recorded_steps(record: &Value) -> Result<(TrainConfig, Space, Vec<Recorded>)> {
    let config: TrainConfig = serde_json::from_value(record["config"].clone()).context("the record's `config`")?;
    let space: Space =
        serde_json::from_value(record["calibration"]["space"].clone()).context("the record's `calibration.space`")?;
    let mut steps = Vec::new();
    for cal in ["calibration", "extrapolating_calibration"] {
        for list in ["probes", "checks"] {
            for p in record[cal][list].as_array().into_iter().flatten() {
                steps.push(Recorded {
                    name: format!(
                        "{}{}",
                        p["name"].as_str().unwrap_or("?"),
                        if cal == "calibration" { "" } else { " (extrapolating)" }
                    ),
                    batch: p["batch"].as_u64().context("a probe without `batch`")? as usize,
                    knobs: serde_json::from_value(p["knobs"].clone()).context("a probe's `knobs`")?,
                    peak: p["measured"]["peak_bytes"]
                        .as_u64()
                        .context("a probe without `measured.peak_bytes`")?,
                });
            }
        }
    }
    if steps.is_empty() {
        bail!("the record has no probes: give a `vramfit bench plan` JSON");
    }
    Ok((config, space, steps))
}

pub fn run(args: Args) -> Result<()> {
    crate::budget::check_bench_out(&args.out)?;
    let (card, file) = &args.recorded;
    let text = vramfit::files::read::read_text(file, vramfit::files::read::Links::Follow)
        .with_context(|| format!("reading {}", file.display()))?;
    let record: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    if record["bench"] != "plan-transformer" {
        bail!(
            "{} is not a record of `vramfit bench plan` (the transformer's probes on a card): its `bench` is {}",
            file.display(),
            record["bench"]
        );
    }
    // A card's pools are replayed against what that card's allocator
    // reserved: a record made on the CPU (or wgpu on a software device) is
    // not one, and its "errors" would be the gap between two machines.
    let device = record["device"].as_str().unwrap_or("");
    if !device.starts_with("cuda") {
        bail!(
            "{} was recorded on `{}`, not on a card: give the JSON of `vramfit bench plan --device cuda` run on the \
             {} itself",
            file.display(),
            if device.is_empty() { "an unnamed device" } else { device },
            card.name
        );
    }
    let (config, space, steps) = recorded_steps(&record).with_context(|| file.display().to_string())?;
    let mut peaks: HashMap<String, u64> = HashMap::new();
    let mut rows = Vec::new();
    let mut table =
        String::from("| step | plan | batch | recorded | predicted | off |\n|---|---|---:|---:|---:|---:|\n");
    for s in &steps {
        let plan = s.knobs.describe(s.batch);
        let key = format!("{}|{}", serde_json::to_string(&s.knobs)?, s.batch);
        let predicted = match peaks.get(&key) {
            Some(p) => *p,
            None => {
                let c = vramfit_models::plan::apply(&config, &s.knobs, s.batch, &space);
                let started = std::time::Instant::now();
                let traced = vramfit_models::traced::trace_settings(c, PROBE_STEPS);
                let traced = traced.with_context(|| format!("tracing {}", s.name))?;
                let p = replay(&traced.trace, &card.allocator)?.reserved_peak;
                eprintln!(
                    "  traced {plan} at batch {} in {:.1} s",
                    s.batch,
                    started.elapsed().as_secs_f64()
                );
                peaks.insert(key, p);
                p
            }
        };
        let off = 100.0 * (predicted as f64 / s.peak as f64 - 1.0);
        println!(
            "{}: {plan}: recorded {} predicted {predicted} ({off:+.2} %)",
            s.name, s.peak
        );
        table += &format!(
            "| {} | {plan} | {} | {} | {predicted} | {off:+.2} % |\n",
            s.name, s.batch, s.peak
        );
        rows.push(json!({
            "name": s.name,
            "batch": s.batch,
            "knobs": s.knobs,
            "plan": plan,
            "recorded_reserved": s.peak,
            "predicted_reserved": predicted,
            "off_percent": off,
        }));
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let out = json!({
        "bench": "model-cards",
        "command": command,
        "card": card,
        "recorded_file": file,
        "measured": "recorded: the card's allocator reserved bytes over a probe's 4 steps (the record's own); \
                     predicted: the same 4 steps traced on shapes alone, nothing computed \
                     (vramfit_models::traced::trace_settings), and replayed through cubecl-runtime's pools as the \
                     card's client makes them",
        "rows": rows,
    });
    let md = format!(
        "The transformer's steps recorded on {} ({}), predicted by traces on shapes:\n\n{table}",
        card.name,
        file.display()
    );
    print!("{md}");
    crate::plan_bench::write_results(&args.out, &out, &md)
}
