//! `vramfit plan transformer|unet|splat`: probes, the fitted model, the
//! ranked plans, the winner verified by one more probe, and the preset
//! table per card size. (`train --budget` runs a plan: `train.rs`.)

use std::path::PathBuf;

use anyhow::{Context, Result};
use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{Verified, presets, verify};
use vramfit::profile::{DeviceMemory, human_bytes};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::{Family, ModelSettings};
use vramfit_models::gpt::GptConfig;
use vramfit_models::plan::{FamilyTarget, apply};
use vramfit_models::unet::UnetConfig;

use crate::budget::{Budget, budget_and_cards, check_json_folder};
use crate::device::{OnBackend, on_device};
use crate::show_plan::{print_choice, print_verified, probe, train_command};

#[derive(clap::Subcommand)]
pub enum Which {
    /// Plan the transformer (same settings flags as `vramfit train transformer`).
    Transformer(PlanArgs),
    /// Plan the U-Net (same settings flags as `vramfit train unet`).
    Unet(PlanArgs),
    /// Plan a splat fit's band height (same settings flags as `vramfit fit`).
    Splat(crate::plan_splat::SplatPlanArgs),
}

#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    settings: crate::train::Settings,
    /// Memory budget: 6GiB, 512MiB, 1.5GB, a number of bytes, or auto (free memory).
    #[arg(long)]
    budget: Option<String>,
    /// Card sizes in GiB for a preset table, e.g. 8,16,24,48,80.
    #[arg(long, value_delimiter = ',')]
    gpus: Vec<f64>,
    /// Probe at this effective batch and extrapolate to the run's.
    #[arg(long)]
    probe_batch: Option<usize>,
    /// Write the probes, the model and the plans as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
}

pub fn run(which: Which) -> Result<()> {
    match which {
        Which::Transformer(args) => plan_family::<GptConfig, 3>(args),
        Which::Unet(args) => plan_family::<UnetConfig, 4>(args),
        Which::Splat(args) => crate::plan_splat::run(args),
    }
}

fn plan_family<F: Family<D>, const D: usize>(args: PlanArgs) -> Result<()> {
    let config = crate::train::resolve::<F>(&args.settings)?;
    let (budget, gpus) = budget_and_cards(args.budget.as_deref(), &args.gpus, &args.device.name)?;
    on_device(
        &args.device.name,
        PlanJob::<F, D> {
            config,
            budget,
            gpus,
            probe_batch: args.probe_batch,
            json: args.json,
            device: args.device.name.clone(),
        },
    )
}

struct PlanJob<F: ModelSettings, const D: usize> {
    config: FamilyConfig<F>,
    budget: Option<Budget>,
    gpus: Vec<u64>,
    probe_batch: Option<usize>,
    json: Option<PathBuf>,
    device: String,
}

impl<F: Family<D>, const D: usize> OnBackend for PlanJob<F, D> {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend,
        B::InnerBackend: DeviceMemory,
    {
        check_json_folder(self.json.as_deref())?;
        let mut target = FamilyTarget::<B, F, D>::new(self.config.clone(), device)?.with_device_name(&name);
        let cal = probe(&mut target, self.probe_batch, &name)?;
        let mut out = serde_json::json!({ "device": name, "calibration": cal });
        if let Some(budget) = self.budget {
            let Verified {
                choice,
                measured: verified,
            } = verify(&cal, &mut target, budget.bytes)?;
            print_choice(&cal, &choice, budget);
            print_verified(&choice, &verified);
            let winner = apply(
                &self.config,
                &choice.plans[0].knobs,
                self.config.batch_size,
                &cal.space.storage_groups,
            );
            println!("to run it: {}", train_command(&winner, &self.device));
            out["choice"] = serde_json::json!(choice);
            out["verified"] = serde_json::json!(verified);
        }
        if !self.gpus.is_empty() {
            let table = presets(&cal, &self.gpus);
            println!(
                "\npreset table for this shape (calibrated on {name}; peaks in its OOM-deciding figure; \
                 model error on unseen combinations ±{:.1} %):",
                cal.peak_error * 100.0
            );
            println!("  {:>8}  {:>10}  {:>9}  plan", "card", "peak", "step ms");
            for p in &table {
                match &p.plan {
                    Some(plan) => println!(
                        "  {:>8}  {:>10}  {:>9.1}  {}{}",
                        human_bytes(p.budget),
                        human_bytes(plan.peak_bytes),
                        plan.step_ms,
                        plan.knobs.describe(cal.space.batch),
                        if plan.exact() { "" } else { " (changes numerics)" }
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
