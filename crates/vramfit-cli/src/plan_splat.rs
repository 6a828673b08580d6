//! `vramfit plan splat` and `vramfit fit --budget`: the band height of the
//! GPU's banded fit planned into a budget ([`vramfit::plan::ladder`]).

use std::path::PathBuf;

use anyhow::{Context, Result};
use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{FALLBACKS, LadderCalibration, LadderChoice, PROBE_STEPS, calibrate_ladder};
use vramfit::profile::{DeviceMemory, human_bytes};
use vramfit::run::RunPath;
use vramfit::settings::{sets_between, shell_words};
use vramfit_splat::config::FitConfig;
use vramfit_splat::op::{FusedLoss, SplatBackend};
use vramfit_splat::plan::{SplatTarget, apply};

use crate::budget::{Budget, budget_and_cards, check_json_folder, check_new_out, check_within, run_with_fallbacks};
use crate::device::{OnSplatBackend, on_splat_device};

#[derive(clap::Args)]
pub struct SplatPlanArgs {
    #[command(flatten)]
    settings: crate::FitSettings,
    /// Memory budget: 6GiB, 512MiB, 1.5GB, a number of bytes, or auto (free memory).
    #[arg(long)]
    budget: Option<String>,
    /// Card sizes in GiB for a preset table, e.g. 8,16,24,48,80.
    #[arg(long, value_delimiter = ',')]
    gpus: Vec<f64>,
    /// Write the probes and the plans as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
}

pub fn run(args: SplatPlanArgs) -> Result<()> {
    let config = crate::resolve(&args.settings)?;
    let (budget, gpus) = budget_and_cards(args.budget.as_deref(), &args.gpus, &args.device.name)?;
    on_splat_device(
        &args.device.name,
        PlanJob {
            config,
            budget,
            gpus,
            json: args.json,
            device: args.device.name.clone(),
        },
    )
}

struct PlanJob {
    config: FitConfig,
    budget: Option<Budget>,
    gpus: Vec<u64>,
    json: Option<PathBuf>,
    /// The `--device` given.
    device: String,
}

impl OnSplatBackend for PlanJob {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: FusedLoss + DeviceMemory,
    {
        check_json_folder(self.json.as_deref())?;
        let mut target = SplatTarget::<B>::new(self.config.clone(), device)?.with_device_name(&name);
        let cal = probe(&mut target, &name)?;
        let mut out = serde_json::json!({ "device": name, "calibration": cal });
        if let Some(budget) = self.budget {
            let choice = cal.choose(budget.bytes)?;
            print_choice(&cal, &choice, budget);
            let winner = apply(&self.config, choice.plans[0].value);
            let mut args = vec!["--device".to_string(), self.device.clone()];
            for set in sets_between(&FitConfig::default().to_toml(), &winner.to_toml(), &[]) {
                args.extend(["--set".to_string(), set]);
            }
            println!("to run it: vramfit fit {}", shell_words(&args));
            out["choice"] = serde_json::json!(choice);
        }
        if !self.gpus.is_empty() {
            let table = cal.presets(&self.gpus);
            println!(
                "\npreset table for this image and these settings (calibrated on {name}; peaks in its \
                 OOM-deciding figure, each rung measured; margin {:.0} %):",
                cal.margin() * 100.0
            );
            println!("  {:>8}  {:>10}  {:>9}  band_rows", "card", "peak", "step ms");
            for p in &table {
                match &p.plan {
                    Some(r) => println!(
                        "  {:>8}  {:>10}  {:>9.1}  {}",
                        human_bytes(p.budget),
                        human_bytes(r.peak_bytes),
                        r.step_ms,
                        r.value
                    ),
                    None => println!(
                        "  {:>8}  nothing fits: {}",
                        human_bytes(p.budget),
                        p.error.as_deref().unwrap_or("")
                    ),
                }
            }
            out["presets"] = serde_json::json!(table);
        }
        if let Some(path) = &self.json {
            vramfit::run::atomic_write(path, &serde_json::to_vec_pretty(&out)?)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        Ok(())
    }
}

/// Measures every rung and prints them.
fn probe<B>(target: &mut SplatTarget<B>, name: &str) -> Result<LadderCalibration>
where
    B: AutodiffBackend + SplatBackend,
    B::InnerBackend: FusedLoss + DeviceMemory,
{
    eprintln!("probing on {name} (one short fit per band height)…");
    let cal = calibrate_ladder(target)?;
    println!(
        "probes: {} of {PROBE_STEPS} steps in {:.1} s, every Gaussian on the device from the first step (peaks: the \
         figure that decides an out-of-memory here)",
        cal.rungs.len() + usize::from(cal.repeat.is_some()),
        cal.seconds
    );
    println!(
        "  {:>9}  {:>10}  {:>10}  {:>9}  {:>9}",
        "band_rows", "measured", "planned", "step ms", "fitted"
    );
    for r in &cal.rungs {
        println!(
            "  {:>9}  {:>10}  {:>10}  {:>9.1}  {:>9.1}",
            if r.value == 0 {
                "whole".to_string()
            } else {
                r.value.to_string()
            },
            human_bytes(r.measured.peak_bytes),
            human_bytes(r.peak_bytes),
            r.measured.step_ms,
            r.step_ms
        );
    }
    if let Some(again) = cal.repeat {
        println!(
            "the largest band measured again: {} ({:.2} % off); time fit a + b/rows within {:.1} % of the probes; \
             safety margin {:.0} %",
            human_bytes(again.peak_bytes),
            cal.repeat_error * 100.0,
            cal.time_error * 100.0,
            cal.margin() * 100.0
        );
    } else {
        println!(
            "this device renders the whole image at once: one plan; safety margin {:.0} %",
            cal.margin() * 100.0
        );
    }
    Ok(cal)
}

fn print_choice(cal: &LadderCalibration, choice: &LadderChoice, budget: Budget) {
    println!(
        "\nbudget {}{}: {} of {} band heights fit",
        human_bytes(budget.bytes),
        if budget.auto {
            " (auto: heap in use + free memory)"
        } else {
            ""
        },
        choice.plans.len(),
        cal.rungs.len()
    );
    println!(
        "winner: band_rows {} — {} (exact: the band height changes only the order of sums)",
        choice.plans[0].value, choice.why
    );
}

/// `fit --budget`: plan the band height, write the plan into the run
/// directory, run the winner, fall back to lower bands on an out-of-memory.
pub fn fit_planned(
    config: FitConfig,
    budget: Budget,
    out: RunPath,
    device: &str,
    simulate_oom_at: Option<u64>,
) -> Result<()> {
    on_splat_device(
        device,
        PlannedFit {
            config,
            budget,
            out,
            simulate_oom_at,
        },
    )
}

struct PlannedFit {
    config: FitConfig,
    budget: Budget,
    out: RunPath,
    simulate_oom_at: Option<u64>,
}

impl OnSplatBackend for PlannedFit {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: FusedLoss + DeviceMemory,
    {
        check_new_out(&self.out)?;
        if self.config.band_rows != 0 {
            eprintln!(
                "note: with --budget the planner sets the band height; it replaces band_rows = {}",
                self.config.band_rows
            );
        }
        let mut target = SplatTarget::<B>::new(self.config.clone(), device)?.with_device_name(&name);
        let cal = probe(&mut target, &name)?;
        let LadderChoice {
            mut plans, why, margin, ..
        } = cal.choose(self.budget.bytes)?;
        print_choice(
            &cal,
            &LadderChoice {
                budget: self.budget.bytes,
                margin,
                plans: plans.clone(),
                why: why.clone(),
            },
            self.budget,
        );
        plans.truncate(1 + FALLBACKS);
        let configs: Vec<FitConfig> = plans.iter().map(|r| apply(&self.config, r.value)).collect();
        let record = serde_json::json!({
            "budget_bytes": self.budget.bytes,
            "budget_auto": self.budget.auto,
            "device": name,
            "knob": cal.knob,
            "why": why,
            "margin": margin,
            "plans": plans,
            "probes": cal.rungs.len() + usize::from(cal.repeat.is_some()),
            "probe_seconds": cal.seconds,
        });
        drop(cal);
        let (summary, dir) = run_with_fallbacks(
            &target,
            &configs,
            record,
            self.budget,
            self.out,
            self.simulate_oom_at,
            |i| format!("band_rows {}", plans[i].value),
        )?;
        crate::runs::print_fit(&summary, false);
        crate::runs::print_common(&summary, &dir);
        check_within(summary.peak_memory_bytes.unwrap_or(0), self.budget.bytes, &dir)
    }
}
