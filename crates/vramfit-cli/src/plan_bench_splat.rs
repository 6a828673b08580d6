//! `vramfit bench plan-splat`: the band-height planner against
//! measurement on the splat fit. At budgets from infeasible to ample it
//! runs the chosen band and reports its planned and measured peak; an
//! exhaustive sweep of every band height (each a multiple of the 16-row
//! tile, not only the ladder's doublings) finds the fastest band that
//! measured within each budget, which is then measured again beside the
//! chosen one (the minimum of many noisy timings is biased low: the ratio
//! is of two measurements taken under the same conditions).

use std::path::PathBuf;

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;
use serde_json::json;
use vramfit::plan::{Ladder, Measured, PROBE_STEPS, PlanError, calibrate_ladder};
use vramfit::profile::{DeviceMemory, human_bytes};
use vramfit_splat::config::FitConfig;
use vramfit_splat::op::{FusedLoss, SplatBackend};

use vramfit_splat::plan::SplatTarget;

use crate::device::{OnSplatBackend, on_splat_device};
use crate::plan_bench::write_results;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    settings: crate::FitSettings,
    /// Leave out the sweep of every band height.
    #[arg(long)]
    no_sweep: bool,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// JSON output (a .md table is written beside it).
    #[arg(long, default_value = "bench-results/plan-splat.json")]
    out: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    let config = crate::resolve(&args.settings)?;
    on_splat_device(
        &args.device.name,
        Bench {
            config,
            sweep: !args.no_sweep,
            out: args.out,
        },
    )
}

struct Bench {
    config: FitConfig,
    sweep: bool,
    out: PathBuf,
}

/// The band heights of the sweep: every tile multiple up to the ladder's top.
fn every_band(rungs: &[usize]) -> Vec<usize> {
    match rungs {
        [0] => vec![0],
        _ => (16..=*rungs.last().unwrap_or(&16)).step_by(16).collect(),
    }
}

impl OnSplatBackend for Bench {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: FusedLoss + DeviceMemory,
    {
        let mut target = SplatTarget::<B>::new(self.config.clone(), device)?;
        eprintln!("calibrating…");
        let cal = calibrate_ladder(&mut target)?;
        let mut sweep: Vec<(usize, Measured)> = Vec::new();
        if self.sweep {
            for band in every_band(&target.rungs()) {
                eprintln!("sweep: band_rows {band}");
                sweep.push((band, target.measure(band).map_err(anyhow::Error::msg)?));
            }
        }
        let least = cal.rungs[0].peak_bytes;
        let mut budgets = vec![least * 4 / 5];
        let mut levels: Vec<u64> = cal.rungs.iter().map(|r| r.peak_bytes).collect();
        levels.dedup();
        budgets.extend(levels.iter().map(|l| (*l as f64 * (1.0 + cal.margin())).ceil() as u64));
        budgets.push(2 * levels.last().copied().unwrap_or(least));
        let mut rows = Vec::new();
        let mut table = String::from(
            "| budget | chosen band_rows | planned peak | measured peak | error | within | step ms | fastest swept band within budget | its step ms, measured again | chosen / fastest |\n\
             |---|---|---|---|---|---|---|---|---|---|\n",
        );
        for budget in budgets {
            let choice = match cal.choose(budget) {
                Ok(c) => c,
                Err(e) => {
                    let named = match &e {
                        PlanError::Infeasible { smallest, .. } => format!("names {smallest}"),
                        other => other.to_string(),
                    };
                    table.push_str(&format!(
                        "| {} | infeasible: {named} | | | | | | | | |\n",
                        human_bytes(budget)
                    ));
                    rows.push(json!({ "budget": budget, "error": e.to_string() }));
                    continue;
                }
            };
            let winner = &choice.plans[0];
            let measured = target.measure(winner.value).map_err(anyhow::Error::msg)?;
            let error = winner.peak_bytes as f64 / measured.peak_bytes as f64 - 1.0;
            let fastest = sweep
                .iter()
                .filter(|(_, m)| m.peak_bytes <= budget)
                .min_by(|a, b| a.1.step_ms.total_cmp(&b.1.step_ms))
                .map(|(band, _)| *band);
            let again = match fastest {
                Some(band) => Some(target.measure(band).map_err(anyhow::Error::msg)?),
                None => None,
            };
            table.push_str(&format!(
                "| {} | {} | {} | {} | {:+.1} % | {} | {:.1} | {} | {} | {} |\n",
                human_bytes(budget),
                winner.value,
                human_bytes(winner.peak_bytes),
                human_bytes(measured.peak_bytes),
                error * 100.0,
                if measured.peak_bytes <= budget { "yes" } else { "NO" },
                measured.step_ms,
                fastest.map_or("not swept".into(), |b| b.to_string()),
                again.map_or(String::new(), |m| format!("{:.1}", m.step_ms)),
                again.map_or(String::new(), |m| format!("{:.2}", measured.step_ms / m.step_ms)),
            ));
            rows.push(json!({
                "budget": budget, "chosen": winner, "why": choice.why, "measured": measured, "error": error,
                "fastest_swept": fastest, "fastest_swept_again": again,
            }));
        }
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let summary = format!(
            "Device: {name}. Peaks are the figure that decides an out-of-memory there (measured). Calibration: {} \
             rungs ({:?}) and a repeat of the largest, {PROBE_STEPS} steps each, in {:.1} s; repeat {:.2} % off, \
             margin {:.0} %; time fit a + b/rows within {:.1} % of the rungs. Sweep: {} band heights (every \
             multiple of 16 rows up to the top rung).\n",
            cal.rungs.len(),
            cal.rungs.iter().map(|r| r.value).collect::<Vec<_>>(),
            cal.seconds,
            cal.repeat_error * 100.0,
            cal.margin() * 100.0,
            cal.time_error * 100.0,
            sweep.len(),
        );
        println!("{summary}\n{table}");
        let record = json!({
            "bench": "plan-splat", "command": command, "device": name, "config": self.config,
            "calibration": cal, "sweep": sweep, "budgets": rows,
        });
        write_results(
            &self.out,
            &record,
            &format!("Command: `{command}`\n\n{summary}\n{table}"),
        )
    }
}
