//! `vramfit plan transformer|unet` and `vramfit train transformer|unet --budget`:
//! probes, the fitted model, the ranked plans, the winner verified by one
//! more probe, the preset table per card size, and the planned run.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{Calibration, Choice, Plan, Plannable, calibrate, parse_bytes, presets};
use vramfit::profile::{DeviceMemory, human_bytes};
use vramfit::run::RunPath;
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::{Family, ModelSettings};
use vramfit_models::gpt::GptConfig;
use vramfit_models::plan::{FamilyTarget, apply, run_planned};
use vramfit_models::unet::UnetConfig;
use vramfit_splat::op::{FusedLoss, SplatBackend};

use crate::device::{OnBackend, on_device};

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
    /// Device: cpu; cuda or wgpu in a build with that feature.
    #[arg(long, default_value = "cpu")]
    device: String,
}

/// A budget in the device's OOM-deciding figure.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Bytes.
    pub bytes: u64,
    /// Read from the free memory (`auto`).
    pub auto: bool,
}

impl Budget {
    /// Parses `--budget` for `device`.
    pub fn parse(text: &str, device: &str) -> Result<Self> {
        if !text.eq_ignore_ascii_case("auto") {
            let bytes = parse_bytes(text).map_err(|e| anyhow::anyhow!("--budget {e}"))?;
            return Ok(Self { bytes, auto: false });
        }
        if device != "cpu" {
            bail!(
                "--budget auto reads free memory, which vramfit reads only on the CPU; on {device} give the \
                 budget in bytes (e.g. --budget 6GiB)"
            );
        }
        // The budget is heap bytes in use: what the process holds now plus what the system can still give.
        let free = vramfit::memory::available_bytes().context("cannot read MemAvailable from /proc/meminfo")?;
        Ok(Self {
            bytes: vramfit::heap::current() + free,
            auto: true,
        })
    }
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
    let (budget, gpus) = budget_and_cards(args.budget.as_deref(), &args.gpus, &args.device)?;
    on_device(
        &args.device,
        PlanJob::<F, D> {
            config,
            budget,
            gpus,
            probe_batch: args.probe_batch,
            json: args.json,
        },
    )
}

/// `--budget` and `--gpus` (GiB) read, at least one given; cards in bytes, each once.
pub(crate) fn budget_and_cards(budget: Option<&str>, gpus: &[f64], device: &str) -> Result<(Option<Budget>, Vec<u64>)> {
    let budget = budget.map(|b| Budget::parse(b, device)).transpose()?;
    if budget.is_none() && gpus.is_empty() {
        bail!("give --budget (e.g. --budget 6GiB) or --gpus (e.g. --gpus 8,16,24,48,80), or both");
    }
    let mut cards: Vec<u64> = gpus
        .iter()
        .map(|g| {
            if g.is_finite() && *g > 0.0 {
                Ok((g * (1u64 << 30) as f64) as u64)
            } else {
                bail!("--gpus {g}: card sizes are positive numbers of GiB, e.g. 8,16,24")
            }
        })
        .collect::<Result<_>>()?;
    cards.sort_unstable();
    cards.dedup();
    Ok((budget, cards))
}

/// Refuses a `--json` path whose folder does not exist, before any probe.
pub(crate) fn check_json_folder(json: Option<&std::path::Path>) -> Result<()> {
    if let Some(dir) = json.and_then(|j| j.parent()).filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        bail!(
            "--json: the folder {} does not exist (nothing was probed)",
            dir.display()
        );
    }
    Ok(())
}

/// Refuses an existing `--out`, before any probe.
pub(crate) fn check_new_out(out: &RunPath) -> Result<()> {
    if let RunPath::At(dir) = out
        && dir.exists()
    {
        bail!(
            "{} already exists: give --out a new directory (nothing was probed)",
            dir.display()
        );
    }
    Ok(())
}

/// Prints the run's peak against the budget; an error when it went over.
pub(crate) fn check_within(peak: u64, budget: u64, dir: &std::path::Path) -> Result<()> {
    println!(
        "  budget {budget} bytes: peak {peak} bytes ({}); plan in {}",
        if peak <= budget { "within" } else { "OVER" },
        dir.join("plan.json").display()
    );
    if peak > budget {
        bail!(
            "the run's peak, {peak} bytes, went over the budget of {budget} bytes by {:.1} %: the run finished and \
             its directory is kept, but the plan did not hold; plan with a larger budget",
            (peak as f64 / budget as f64 - 1.0) * 100.0
        );
    }
    Ok(())
}

struct PlanJob<F: ModelSettings, const D: usize> {
    config: FamilyConfig<F>,
    budget: Option<Budget>,
    gpus: Vec<u64>,
    probe_batch: Option<usize>,
    json: Option<PathBuf>,
}

impl<F: Family<D>, const D: usize> OnBackend for PlanJob<F, D> {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: FusedLoss + DeviceMemory,
    {
        check_json_folder(self.json.as_deref())?;
        let mut target = FamilyTarget::<B, F, D>::new(self.config.clone(), device)?;
        let cal = probe(&mut target, self.probe_batch, &name)?;
        let mut out = serde_json::json!({ "device": name, "calibration": cal });
        if let Some(budget) = self.budget {
            let (choice, verified) = choose_verified(&cal, &mut target, budget)?;
            print_choice(&cal, &choice, budget);
            print_verified(&choice, &verified);
            println!(
                "to run it: vramfit train {} {}{}",
                F::NAME,
                own_flags(F::NAME),
                flags(&apply(
                    &self.config,
                    &choice.plans[0].knobs,
                    self.config.batch_size,
                    &cal.space.storage_groups
                ))
            );
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

/// Calibrates and prints the probes and the model's measured error.
fn probe(target: &mut dyn Plannable, probe_batch: Option<usize>, device: &str) -> Result<Calibration> {
    eprintln!("probing on {device} (one short run per knob)…");
    let cal = calibrate(target, probe_batch)?;
    println!(
        "{} probes of {} steps in {:.1} s at batch {} (peaks: the figure that decides an out-of-memory here)",
        cal.probes.len() + cal.checks.len(),
        vramfit_models::plan::PROBE_STEPS,
        cal.seconds,
        cal.probe_batch
    );
    println!(
        "  {:<30} {:<48} {:>10} {:>10} {:>9}",
        "probe", "knobs", "measured", "model", "step ms"
    );
    for r in cal.probes.iter().chain(&cal.checks) {
        println!(
            "  {:<30} {:<48} {:>10} {:>10} {:>9.1}",
            r.name,
            r.knobs.describe(r.batch),
            human_bytes(r.measured.peak_bytes),
            human_bytes(r.predicted_peak as u64),
            r.measured.step_ms
        );
    }
    println!(
        "model error on the combinations it was not fitted on: peak ±{:.1} % (at most {:.1} % under), time ±{:.1} %; \
         safety margin {:.0} %{}",
        cal.peak_error * 100.0,
        cal.shortfall * 100.0,
        cal.time_error * 100.0,
        cal.margin() * 100.0,
        if cal.model.page_bytes > 1 {
            format!(
                "; the allocator reserves whole pages of {}",
                human_bytes(cal.model.page_bytes)
            )
        } else {
            String::new()
        }
    );
    Ok(cal)
}

/// The choice for `budget`, its winner verified by a probe at the run's
/// batch: a winner that measures over the budget is dropped and the next
/// one tried (three at most).
fn choose_verified(
    cal: &Calibration,
    target: &mut dyn Plannable,
    budget: Budget,
) -> Result<(Choice, vramfit::plan::Measured)> {
    let mut choice = cal.choose(budget.bytes)?;
    let batch = cal.space.batch;
    let mut rejected = Vec::new();
    while rejected.len() < VERIFY_TRIES {
        let Some(winner) = choice.plans.first() else { break };
        let measured = target
            .measure(&winner.knobs, batch)
            .map_err(|e| anyhow::anyhow!("verifying the plan {}: {e}", winner.knobs.describe(batch)))?;
        if measured.peak_bytes <= budget.bytes {
            if !rejected.is_empty() {
                choice.why = format!(
                    "the {} plan(s) ranked above it measured over the budget ({}); this one measured {} bytes \
                     of {}",
                    rejected.len(),
                    rejected.join("; "),
                    measured.peak_bytes,
                    budget.bytes
                );
            }
            return Ok((choice, measured));
        }
        eprintln!(
            "the plan {} measured {} bytes, over the budget of {} (predicted {}): trying the next",
            winner.knobs.describe(batch),
            measured.peak_bytes,
            budget.bytes,
            winner.peak_bytes
        );
        rejected.push(format!(
            "{}: {} bytes",
            winner.knobs.describe(batch),
            measured.peak_bytes
        ));
        choice.plans.remove(0);
    }
    bail!(
        "no plan measured within {} bytes: {}. Raise the budget by a few per cent",
        budget.bytes,
        rejected.join("; ")
    )
}

/// Plans measured over the budget before the planner gives up.
const VERIFY_TRIES: usize = 3;

fn print_choice(cal: &Calibration, choice: &Choice, budget: Budget) {
    let batch = cal.space.batch;
    println!(
        "\nbudget {}{}: {} plans fit; the best {}:",
        human_bytes(budget.bytes),
        if budget.auto {
            " (auto: heap in use + free memory)"
        } else {
            ""
        },
        choice.plans.len(),
        choice.plans.len().min(8)
    );
    println!(
        "  {:>2}  {:>10}  {:>9}  {:<56}  numerics",
        "#", "peak", "step ms", "knobs"
    );
    for (i, p) in choice.plans.iter().take(8).enumerate() {
        println!(
            "  {:>2}  {:>10}  {:>9.1}  {:<56}  {}",
            i + 1,
            human_bytes(p.peak_bytes),
            p.step_ms,
            p.knobs.describe(batch),
            quality(p)
        );
    }
    println!("winner: {} — {}", choice.plans[0].knobs.describe(batch), choice.why);
}

fn print_verified(choice: &Choice, v: &vramfit::plan::Measured) {
    println!(
        "verified: a probe of the winner at the run's batch measured {} ({} bytes; predicted {}), {:.1} ms per step",
        human_bytes(v.peak_bytes),
        v.peak_bytes,
        human_bytes(choice.plans[0].peak_bytes),
        v.step_ms
    );
}

fn quality(p: &Plan) -> String {
    if p.exact() {
        "exact".into()
    } else {
        p.quality.join("; ")
    }
}

/// Flags `plan` takes that `train` does not, or that the plan replaces (with a value each).
const NOT_PASSED_ON: [&str; 14] = [
    "--budget",
    "--gpus",
    "--probe-batch",
    "--json",
    "--precision",
    "--checkpoint",
    "--micro-batch",
    "--accumulate",
    "--batch-size",
    "--storage",
    "--moments",
    "--allocator-cleanup",
    "--device",
    "--out",
];

/// The arguments this `plan WORKLOAD` was given that the run needs too
/// (image, shape, settings file, steps, seed, `--set`), each followed by a space.
pub(crate) fn own_flags(workload: &str) -> String {
    let args: Vec<String> = std::env::args().skip_while(|a| a != workload).skip(1).collect();
    let mut out = String::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let name = a.split('=').next().unwrap_or(a);
        let inline = a.contains('=');
        if NOT_PASSED_ON.contains(&name) {
            i += if inline { 1 } else { 2 };
            continue;
        }
        let quoted = |s: &str| {
            if s.contains([' ', '"', '\'', '*']) {
                format!("'{s}'")
            } else {
                s.to_string()
            }
        };
        out.push_str(&quoted(a));
        out.push(' ');
        i += 1;
    }
    out
}

/// The `train` flags that give `c`'s techniques.
fn flags<M: ModelSettings>(c: &FamilyConfig<M>) -> String {
    let mut f = format!(
        "--batch-size {} --micro-batch {} --accumulate {} --precision {} --checkpoint {} --moments {} --allocator-cleanup {}",
        c.batch_size, c.micro_batch, c.accumulate, c.precision, c.checkpoint, c.moments, c.allocator_cleanup
    );
    for s in &c.storage {
        f.push_str(&format!(" --storage '{s}'"));
    }
    f
}

/// `train transformer|unet --budget`: plan, write the plan into the run
/// directory, run the winner, fall back to the next plans on an out-of-memory.
pub fn train_planned<F: Family<D>, const D: usize>(
    config: FamilyConfig<F>,
    budget: Budget,
    probe_batch: Option<usize>,
    out: RunPath,
    device: &str,
    simulate_oom_at: Option<u64>,
) -> Result<()> {
    on_device(
        device,
        PlannedRun::<F, D> {
            config,
            budget,
            probe_batch,
            out,
            simulate_oom_at,
        },
    )
}

struct PlannedRun<F: ModelSettings, const D: usize> {
    config: FamilyConfig<F>,
    budget: Budget,
    probe_batch: Option<usize>,
    out: RunPath,
    simulate_oom_at: Option<u64>,
}

/// The technique flags given on the command line (which --budget replaces).
fn technique_flags() -> Vec<String> {
    std::env::args()
        .filter(|a| {
            [
                "--precision",
                "--checkpoint",
                "--micro-batch",
                "--accumulate",
                "--storage",
                "--moments",
                "--allocator-cleanup",
            ]
            .contains(&a.split('=').next().unwrap_or(a))
        })
        .collect()
}

/// Plans kept for fallback after the winner.
const FALLBACKS: usize = 3;

impl<F: Family<D>, const D: usize> OnBackend for PlannedRun<F, D> {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: FusedLoss + DeviceMemory,
    {
        check_new_out(&self.out)?;
        let overridden = technique_flags();
        if !overridden.is_empty() {
            eprintln!(
                "note: with --budget the planner sets the techniques; it replaces {}",
                overridden.join(", ")
            );
        }
        let mut target = FamilyTarget::<B, F, D>::new(self.config.clone(), device)?;
        let cal = probe(&mut target, self.probe_batch, &name)?;
        let (choice, verified) = choose_verified(&cal, &mut target, self.budget)?;
        drop(target);
        print_choice(&cal, &choice, self.budget);
        print_verified(&choice, &verified);
        let batch = self.config.batch_size;
        // On the CPU the budget is the whole heap: the planner's own tables
        // (hundreds of plans) must not ride along into the run.
        let Choice {
            mut plans, why, margin, ..
        } = choice;
        plans.truncate(1 + FALLBACKS);
        let kept: Vec<&Plan> = plans.iter().collect();
        let configs: Vec<FamilyConfig<F>> = kept
            .iter()
            .map(|p| apply(&self.config, &p.knobs, batch, &cal.space.storage_groups))
            .collect();
        let record = serde_json::json!({
            "budget_bytes": self.budget.bytes,
            "budget_auto": self.budget.auto,
            "device": name,
            "why": why,
            "margin": margin,
            "plans": kept,
            "verified": verified,
            "model": cal.model,
            "model_peak_error": cal.peak_error,
            "model_time_error": cal.time_error,
            "probes": cal.probes.len() + cal.checks.len(),
            "probe_seconds": cal.seconds,
        });
        drop(cal);
        let planned = run_planned::<B, F, D>(
            &configs,
            self.out,
            &record,
            device,
            &name,
            self.simulate_oom_at,
            crate::runs::progress(),
        )?;
        for f in &planned.fallbacks {
            println!(
                "fell back from plan {} to plan {} ({}), from the last checkpoint",
                f.from + 1,
                f.to + 1,
                kept[f.to].knobs.describe(batch)
            );
        }
        let Some(summary) = planned.summary else {
            bail!("the run stopped before its end")
        };
        crate::runs::print_train(F::NAME, &summary);
        crate::runs::print_common(&summary, &planned.dir);
        check_within(summary.peak_memory_bytes.unwrap_or(0), self.budget.bytes, &planned.dir)
    }
}
