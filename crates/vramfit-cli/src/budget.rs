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

/// The largest card `--gpus` takes, GiB (1 PiB: far beyond any card, and
/// well inside the byte counts' range).
const MAX_CARD_GIB: f64 = 1_048_576.0;

/// The smallest (1 MiB): below it a card's row would read "0 B".
const MIN_CARD_GIB: f64 = 1.0 / 1024.0;

/// A card size for `--gpus`: a number of GiB (`24`, `0.5`) or a size with
/// its unit (`24GiB`, `512MiB`), in GiB.
pub(crate) fn parse_card_gib(s: &str) -> Result<f64, String> {
    let t = &s.trim().replace('_', "");
    let gib = match t.parse::<f64>() {
        Ok(g) => g,
        Err(_) => match vramfit::plan::parse_bytes(t) {
            Ok(bytes) => bytes as f64 / (1u64 << 30) as f64,
            Err(_) => {
                return Err(format!(
                    "'{s}' is not a card size: give GiB as numbers (8,16,24) or sizes (24GiB)"
                ));
            }
        },
    };
    if (MIN_CARD_GIB..=MAX_CARD_GIB).contains(&gib) {
        Ok(gib)
    } else {
        Err(format!(
            "'{s}': card sizes are numbers of GiB from 1 MiB ({MIN_CARD_GIB}) up to {MAX_CARD_GIB} (1 PiB), e.g. \
             8,16,24"
        ))
    }
}

/// A card for `--gpus`/`--cards`: a known CUDA card's name (`h100-80`,
/// `rtx4090`) or a size as [`parse_card_gib`] reads it (a CUDA card of that
/// memory where a card's allocator is modelled).
pub(crate) fn parse_card(s: &str) -> Result<vramfit::pools::Card, String> {
    use vramfit::pools::Card;
    if let Ok(card) = Card::named(s) {
        return Ok(card);
    }
    let looks_like_a_name = s.trim().starts_with(|c: char| c.is_ascii_alphabetic());
    match parse_card_gib(s) {
        Ok(gib) => {
            // Named as given: `24` → "24 GiB", `512MiB` as is.
            let text = s.trim();
            let name = if text.parse::<f64>().is_ok() {
                format!("{text} GiB")
            } else {
                text.to_string()
            };
            Ok(Card::cuda(name, (gib * (1u64 << 30) as f64) as u64))
        }
        Err(_) if looks_like_a_name => Err(Card::named(s).unwrap_err().to_string()),
        Err(e) => Err(e),
    }
}

/// A budget for `bench … --budgets`: a fraction of the plain plan's peak,
/// above 0 and at most 100.
pub(crate) fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 100.0 => Ok(f),
        _ => Err(format!(
            "'{s}' is not a fraction of the plain plan's peak: give numbers above 0, e.g. 0.5,0.8,1.5"
        )),
    }
}

/// `--budget` and `--gpus` read, at least one given; cards by memory, each once.
pub(crate) fn budget_and_cards(
    budget: Option<&str>,
    gpus: &[vramfit::pools::Card],
    device: &str,
) -> Result<(Option<Budget>, Vec<vramfit::pools::Card>)> {
    let budget = budget.map(|b| Budget::parse(b, device)).transpose()?;
    if budget.is_none() && gpus.is_empty() {
        bail!("give --budget (e.g. --budget 6GiB) or --gpus (e.g. --gpus 8,16,24,48,80 or h100-80,rtx4090), or both");
    }
    let mut cards = gpus.to_vec();
    cards.sort_by_key(|c| c.memory_bytes);
    cards.dedup_by_key(|c| c.memory_bytes);
    Ok((budget, cards))
}

/// Refuses a `--json` path that cannot be written, before any probe: its
/// folder missing or not writable, or the path a directory.
pub(crate) fn check_json_folder(json: Option<&std::path::Path>) -> Result<()> {
    let Some(json) = json else { return Ok(()) };
    check_writable("--json", json)
}

/// Checks a benchmark's `--out` before it measures anything: a `.json`
/// name (its table goes beside it as `.md`, so another name would lose
/// one or the other), its folder created and writable.
pub(crate) fn check_bench_out(out: &std::path::Path) -> Result<()> {
    if out.is_dir() {
        return check_writable("--out", out);
    }
    if !out.extension().is_some_and(|e| e.eq_ignore_ascii_case("json")) {
        bail!(
            "--out {}: give a name ending in .json (the table is written beside it as .md; nothing was run)",
            out.display()
        );
    }
    if let Some(dir) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("--out: cannot create {} ({e})", dir.display()))?;
    }
    check_writable("--out", out)?;
    // The table beside it, too: a name vramfit makes, so a link there was planted.
    let table = out.with_extension("md");
    if std::fs::symlink_metadata(&table).is_ok_and(|m| m.file_type().is_symlink()) {
        bail!(
            "{} is a symbolic link, and vramfit writes the table beside --out under that name: remove the link or \
             give --out another name (nothing was run)",
            table.display()
        );
    }
    check_writable("--out (its table)", &table)
}

/// Refuses an output file path that cannot be written, before the work
/// that produces it: a directory, a folder that does not exist or cannot
/// be written (tried with a probe file, which is removed).
pub(crate) fn check_writable(flag: &str, path: &std::path::Path) -> Result<()> {
    if path.is_dir() {
        bail!(
            "{flag} {}: is a directory; give a file name (nothing was run)",
            path.display()
        );
    }
    // The same refusals as the write itself makes, made before the work.
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => bail!(
            "{flag} {}: is not a regular file (a device, pipe or socket), which writing would replace; \
             give a file path (nothing was run)",
            path.display()
        ),
        Err(_) if std::fs::symlink_metadata(path).is_ok() => bail!(
            "{flag} {}: is a symbolic link to nothing; remove it or give another path (nothing was run)",
            path.display()
        ),
        _ => {}
    }
    vramfit::files::outputs::read_only(path).map_err(|e| anyhow::anyhow!("{flag}: {e} (nothing was run)"))?;
    match vramfit::files::outputs::output_folder_problem(path, "nothing was run") {
        None => Ok(()),
        Some(why) => bail!("{flag}: {why}"),
    }
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
