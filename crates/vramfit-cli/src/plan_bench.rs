//! `vramfit bench plan` (the models' knob model), `bench plan-splat` (the
//! splat fit's band-height ladder) and `bench plan-scene` (the scene's
//! capacity): the planner against measurement, run by the library
//! ([`vramfit::plan::benchmark`]: what each strategy sweeps, its budgets,
//! the comparison); here its arguments, and its table and record printed
//! and written.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::json;
use vramfit::plan::Runnable;
use vramfit::plan::benchmark::{Benched, benchmark};

#[derive(clap::Args)]
pub struct Args<S: clap::Args> {
    #[command(flatten)]
    settings: S,
    /// Budgets as fractions of the peak of the plan that turns no knob (the
    /// knob model's plain step, the ladder's top rung), besides an
    /// infeasible one and, for a ladder, each rung's level.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.65,0.8,1.0,1.5", allow_negative_numbers = true,
        value_parser = crate::budget::parse_fraction)]
    budgets: Vec<f64>,
    /// Leave out the exhaustive sweep (memory only: on a software device
    /// step times say nothing about a GPU's).
    #[arg(long)]
    no_sweep: bool,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// JSON output, a .md table written beside it (default:
    /// bench-results/plan-WORKLOAD.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What the benchmark was asked for.
#[derive(Clone)]
pub struct Request {
    fractions: Vec<f64>,
    sweep: bool,
    out: Option<PathBuf>,
    /// The resolved settings, for the record.
    config: serde_json::Value,
    /// The workload's name, for the file names.
    workload: String,
}

impl Request {
    /// Where the JSON goes (`--out`, or bench-results/plan-WORKLOAD.json).
    pub fn out_path(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("bench-results/plan-{}.json", self.workload)))
    }
}

impl<S: clap::Args> Args<S> {
    /// The request for settings `config` (resolved from `self.settings`)
    /// of workload `workload`, and the device.
    pub fn request(&self, config: serde_json::Value, workload: &str) -> (Request, &str) {
        let request = Request {
            fractions: self.budgets.clone(),
            sweep: !self.no_sweep,
            out: self.out.clone(),
            config,
            workload: workload.into(),
        };
        (request, &self.device.name)
    }

    /// The settings flags.
    pub fn settings(&self) -> &S {
        &self.settings
    }
}

/// The benchmark on a built target (`crate::plan::Action::Bench`): the
/// library's [`benchmark`], printed and written.
pub fn bench<T: Runnable<Strategy: Benched>>(target: &mut T, request: Request, name: &str) -> Result<()> {
    let done = benchmark::<T::Strategy>(target.target(), &request.fractions, request.sweep, &mut |line| {
        eprintln!("{line}")
    })?;
    let (summary, table) = (done.summary(name), done.table());
    println!("{summary}\n{table}");
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut record = json!({
        "bench": format!("plan-{}", request.workload), "command": command, "device": name, "config": request.config,
    });
    if let (Some(record), serde_json::Value::Object(rest)) = (record.as_object_mut(), done.record()) {
        record.extend(rest);
    }
    let out = request.out_path();
    write_results(&out, &record, &format!("Command: `{command}`\n\n{summary}\n{table}"))
}

/// Writes a benchmark's JSON record at `out` and its Markdown beside it.
/// A record whose indented form passes 1 MiB (one holding allocation
/// traces) is written without indentation: a fifth of the bytes.
pub(crate) fn write_results(out: &std::path::Path, record: &serde_json::Value, markdown: &str) -> Result<()> {
    if let Some(dir) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(record)?;
    if text.len() > 1 << 20 {
        text = serde_json::to_string(record)?;
    }
    vramfit::run::atomic_write(out, text.as_bytes()).with_context(|| format!("writing {}", out.display()))?;
    let md = out.with_extension("md");
    vramfit::run::atomic_write(&md, markdown.as_bytes()).with_context(|| format!("writing {}", md.display()))?;
    println!("wrote {} and {}", out.display(), md.display());
    Ok(())
}
