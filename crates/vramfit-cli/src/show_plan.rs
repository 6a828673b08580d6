//! What the planner found, printed: the probes and the model's measured
//! error, the ranked plans and the winner, its verification, and the flags
//! that run a plan.

use anyhow::Result;
use vramfit::plan::{Calibration, Choice, Plan, Plannable, calibrate};
use vramfit::profile::human_bytes;
use vramfit::settings::{sets_between, shell_words};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::ModelSettings;

use crate::budget::Budget;

/// Calibrates and prints the probes and the model's measured error.
pub fn probe(target: &mut dyn Plannable, probe_batch: Option<usize>, device: &str) -> Result<Calibration> {
    eprintln!("probing on {device} (one short run per knob)…");
    let cal = calibrate(target, probe_batch)?;
    println!(
        "{} probes of {} steps in {:.1} s at batch {} (peaks: the figure that decides an out-of-memory here)",
        cal.probes.len() + cal.checks.len(),
        vramfit::plan::PROBE_STEPS,
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

pub fn print_choice(cal: &Calibration, choice: &Choice, budget: Budget) {
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

pub fn print_verified(choice: &Choice, v: &vramfit::plan::Measured) {
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

/// Settings the technique flags ([`flags`]) give; the rest go as `--set`.
const TECHNIQUE_KEYS: [&str; 8] = [
    "precision",
    "checkpoint",
    "micro_batch",
    "accumulate",
    "batch_size",
    "storage",
    "moments",
    "allocator_cleanup",
];

/// The `vramfit train` command that runs `c` on `device`, from the resolved
/// settings (whatever mix of file, flags and `--set` they came from): every
/// setting that differs from the defaults as `--set`, then the techniques.
pub fn train_command<M: ModelSettings>(c: &FamilyConfig<M>, device: &str) -> String {
    let mut args = vec!["--device".to_string(), device.to_string()];
    for set in sets_between(&FamilyConfig::<M>::default().to_toml(), &c.to_toml(), &TECHNIQUE_KEYS) {
        args.extend(["--set".to_string(), set]);
    }
    format!("vramfit train {} {} {}", M::NAME, shell_words(&args), flags(c))
}

/// The `train` flags that give `c`'s techniques.
fn flags<M: ModelSettings>(c: &FamilyConfig<M>) -> String {
    let mut f = format!(
        "--batch-size {} --micro-batch {} --accumulate {} --precision {} --checkpoint {} --moments {} --allocator-cleanup {}",
        c.batch_size, c.micro_batch, c.accumulate, c.precision, c.checkpoint, c.moments, c.allocator_cleanup
    );
    for s in &c.storage {
        f.push_str(&format!(" --storage {}", shell_words(std::slice::from_ref(s))));
    }
    f
}
