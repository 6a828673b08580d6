//! Budgets and output checks shared by every planning command (`plan`,
//! `train --budget`, `fit --budget`): the budget read from `--budget`, card
//! sizes from `--gpus`, output paths refused before any probe runs, the
//! run's peak against its budget.

use anyhow::{Context, Result, bail};
use vramfit::plan::parse_bytes;
use vramfit::run::RunPath;

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
