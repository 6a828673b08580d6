//! A run's rank folders: rank 0's run directory is the run's own, rank r's
//! is `ranks/rank-r` inside it. Before ranks resume, their checkpoints are
//! aligned to the newest step every rank wrote; a run resumed on another
//! number of ranks has its checkpoint gathered (rank 0's parameters and
//! state, every rank's share of Adam's moments) and written for each rank.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::optim::MOMENT_KEYS;
use crate::run::{ArrayFile, ArrayFileError, atomic_write, atomic_write_with, checkpoints_newest_first};

/// Why a run's rank folders cannot be readied for a resume; nothing was
/// changed unless the error says what was.
#[derive(Debug, thiserror::Error)]
pub enum RankFoldersError {
    /// A rank stopped before its first checkpoint while others wrote one.
    #[error(
        "cannot resume {root}: no step has a checkpoint from every rank (rank {rank} has none: it stopped before \
         its first). Nothing was changed; start the run again in a new run directory"
    )]
    RankWithout {
        /// The run.
        root: PathBuf,
        /// The first rank with no checkpoint.
        rank: usize,
    },
    /// No step was checkpointed by every rank.
    #[error("cannot resume {root} on {to} ranks: no step has a checkpoint from each of its {ranks} ranks")]
    NoCommonStep {
        /// The run.
        root: PathBuf,
        /// The ranks asked for.
        to: usize,
        /// The ranks that wrote checkpoints.
        ranks: usize,
    },
    /// A retired rank's folder cannot be set aside under its new name.
    #[error("cannot set rank folders aside: {0} exists (nothing was changed)")]
    AsideTaken(PathBuf),
    /// A file or folder could not be changed.
    #[error("{doing} {path}: {cause}")]
    Io {
        /// What was being done ("removing", "creating", …).
        doing: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// A checkpoint does not read back.
    #[error(transparent)]
    Checkpoint(#[from] ArrayFileError),
}

fn io<'a>(doing: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RankFoldersError + 'a {
    move |cause| RankFoldersError::Io {
        doing,
        path: path.to_path_buf(),
        cause,
    }
}

/// The run directory of rank `rank` for a run at `root`.
pub fn rank_dir(root: &Path, rank: usize) -> PathBuf {
    root.join("ranks").join(format!("rank-{rank}"))
}

/// Every rank's run directory of the run at `root` (rank 0's is `root`),
/// by rank; only rank 0 when it ran alone.
pub fn rank_dirs(root: &Path) -> Vec<(usize, PathBuf)> {
    let mut ranks: Vec<(usize, PathBuf)> = std::fs::read_dir(root.join("ranks"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            Some((name.strip_prefix("rank-")?.parse().ok()?, e.path()))
        })
        .collect();
    ranks.push((0, root.to_path_buf()));
    ranks.sort();
    ranks
}

/// Each rank's checkpoints by step.
fn checkpoint_steps(ranks: &[(usize, PathBuf)]) -> Vec<BTreeMap<u64, PathBuf>> {
    ranks
        .iter()
        .map(|(_, d)| {
            checkpoints_newest_first(&d.join("checkpoints"))
                .into_iter()
                .filter_map(|p| Some((step_of(&p)?, p)))
                .collect()
        })
        .collect()
}

/// A checkpoint's step, from its name.
fn step_of(p: &Path) -> Option<u64> {
    p.file_stem()?.to_str()?.strip_prefix("step-")?.parse().ok()
}

/// The newest step every rank has a checkpoint of.
fn newest_common(steps: &[BTreeMap<u64, PathBuf>]) -> Option<u64> {
    steps
        .first()?
        .keys()
        .rev()
        .copied()
        .find(|s| steps.iter().all(|m| m.contains_key(s)))
}

/// Before the ranks of the run at `root` resume: where a rank died after
/// the others' last checkpoint (or they after its), the checkpoints newer
/// than the newest step every rank wrote are removed, so that every rank
/// resumes from that step. Returns it when anything was removed.
pub fn align_checkpoints(root: &Path) -> Result<Option<u64>, RankFoldersError> {
    let ranks = rank_dirs(root);
    let steps = checkpoint_steps(&ranks);
    if steps.iter().all(|m| m.is_empty()) {
        return Ok(None);
    }
    // One rank with none (it stopped before its first) would start over
    // beside ranks at a later step: their sums would mix steps.
    let Some(step) = newest_common(&steps) else {
        let bare = ranks
            .iter()
            .zip(&steps)
            .find(|(_, m)| m.is_empty())
            .map_or(0, |((r, _), _)| *r);
        return Err(RankFoldersError::RankWithout {
            root: root.into(),
            rank: bare,
        });
    };
    let mut removed = false;
    for path in steps.iter().flat_map(|m| m.range(step + 1..).map(|(_, p)| p)) {
        std::fs::remove_file(path).map_err(io("removing", path))?;
        removed = true;
    }
    Ok(removed.then_some(step))
}

/// Readies the run at `root`, whose checkpoints `rank_dirs(root)` ranks
/// wrote, to resume on `to` ranks with settings `config` (its
/// `config.toml`, `ranks = to`): the newest step every rank checkpointed is
/// gathered into one checkpoint (rank 0's parameters and state, every
/// rank's share of Adam's moments) written for each of the `to` ranks;
/// newer checkpoints, which not every rank wrote, are removed; the ranks no
/// longer run keep their folders, renamed aside. Nothing is changed when a
/// check fails. Returns the step it resumes from.
pub fn regather(root: &Path, to: usize, config: &str) -> Result<u64, RankFoldersError> {
    let from = rank_dirs(root);
    let steps = checkpoint_steps(&from);
    let Some(step) = newest_common(&steps) else {
        return Err(RankFoldersError::NoCommonStep {
            root: root.into(),
            to,
            ranks: from.len(),
        });
    };
    let name = steps[0][&step].file_name().map(|n| n.to_owned()).unwrap_or_default();
    let mut gathered = ArrayFile::read(&steps[0][&step])?;
    for files in &steps[1..] {
        for (key, array) in ArrayFile::read(&files[&step])?.arrays {
            if MOMENT_KEYS.iter().any(|prefix| key.starts_with(prefix)) {
                gathered.arrays.entry(key).or_insert(array);
            }
        }
    }
    if gathered.meta.get("config_toml").is_some() {
        gathered.meta["config_toml"] = config.into();
    }
    // The retired ranks' folders go aside under names not yet taken.
    let aside: Vec<(PathBuf, PathBuf)> = from
        .iter()
        .filter(|(r, _)| *r >= to)
        .map(|(r, d)| {
            (
                d.clone(),
                d.with_file_name(format!("rank-{r}.before-{to}-ranks-at-step-{step}")),
            )
        })
        .collect();
    if let Some((_, taken)) = aside.iter().find(|(_, a)| a.exists()) {
        return Err(RankFoldersError::AsideTaken(taken.clone()));
    }
    for (dir, to) in &aside {
        std::fs::rename(dir, to).map_err(io("moving aside", dir))?;
    }
    // Each rank's folder, its checkpoint the gathered one; rank 0's last,
    // whose config.toml says how many ranks the run has.
    let root_files = ["workload", "metrics.jsonl"].map(|f| {
        (
            f,
            crate::files::read::read(&root.join(f), crate::files::read::Links::Refuse).ok(),
        )
    });
    for rank in (0..to).rev() {
        let dir = if rank == 0 {
            root.to_path_buf()
        } else {
            rank_dir(root, rank)
        };
        let checkpoints = dir.join("checkpoints");
        std::fs::create_dir_all(&checkpoints).map_err(io("creating", &checkpoints))?;
        for newer in checkpoints_newest_first(&checkpoints) {
            if step_of(&newer).is_some_and(|s| s > step) {
                std::fs::remove_file(&newer).map_err(io("removing", &newer))?;
            }
        }
        for (file, bytes) in &root_files {
            let path = dir.join(file);
            if let Some(bytes) = bytes.as_ref().filter(|_| !path.exists()) {
                atomic_write(&path, bytes).map_err(io("writing", &path))?;
            }
        }
        let path = dir.join("config.toml");
        atomic_write(&path, config.as_bytes()).map_err(io("writing", &path))?;
        let path = checkpoints.join(&name);
        atomic_write_with(&path, |w| gathered.write_to(w)).map_err(io("writing", &path))?;
    }
    Ok(step)
}
