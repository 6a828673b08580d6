//! Why a run stops with an error, in words that name the problem and what
//! to do.

use std::path::{Path, PathBuf};

use super::RunDirError;
use crate::remedy::Remedy;

/// A new run from the settings of the run in `dir`, in the front end's words.
fn new_run(dir: &Path) -> Remedy {
    Remedy::NewRun(dir.join("config.toml"))
}

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The run directory.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// The workload failed (its own words).
    #[error(transparent)]
    Workload(Box<dyn std::error::Error + Send + Sync>),
    /// A file could not be written.
    #[error("cannot write {path}: {why}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        why: String,
    },
    /// The device ran out of memory; `oom.json` holds the breakdown.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemoryError>),
    /// The run directory has no checkpoints folder: resuming would start
    /// over and then fail at the first checkpoint.
    #[error(
        "cannot resume {dir}: its checkpoints folder {dir}/checkpoints is missing (a run keeps its checkpoints \
         there). Nothing was changed. Restore the folder to resume, or {}",
        new_run(dir)
    )]
    CheckpointsMissing {
        /// The run directory.
        dir: PathBuf,
    },
    /// `config.toml` was edited since the checkpoint in a way that would not
    /// continue the same run.
    #[error(
        "cannot resume {dir}: config.toml was edited since {checkpoint}, and the run would not continue as it \
         was: {keys}. Nothing was changed. Put the values back to resume, or {} (the edited settings). A resume \
         may change {may_change}",
        new_run(dir)
    )]
    ConfigEdited {
        /// The run directory.
        dir: PathBuf,
        /// The checkpoint resumed from.
        checkpoint: String,
        /// Each edited key, `key: then → now`.
        keys: String,
        /// What the workload lets a resume change ([`super::Resumable::describe`]).
        may_change: String,
    },
    /// The checkpoints folder is empty though the run had written
    /// checkpoints (its log reaches past the first).
    #[error(
        "cannot resume {dir}: its checkpoints folder is empty, but the run had reached step {step} (metrics.jsonl) \
         with a checkpoint every {every} steps: they were removed. Nothing was changed. Restore them to resume, or \
         {}",
        new_run(dir)
    )]
    CheckpointsGone {
        /// The run directory.
        dir: PathBuf,
        /// The last step its log holds.
        step: u64,
        /// Its checkpoint cadence.
        every: u64,
    },
    /// Checkpoints exist but none reads back: the run will not silently start over.
    #[error(
        "cannot resume {dir}: no checkpoint reads back ({why}). Nothing was changed. To go on: {}, or move the \
         checkpoints away to restart this run from step 0",
        new_run(dir)
    )]
    NoReadableCheckpoint {
        /// The run directory.
        dir: PathBuf,
        /// Each checkpoint and why it was refused.
        why: String,
    },
}

/// A device out-of-memory, in words: where, what was asked, what held the
/// memory and what to turn.
#[derive(Debug, thiserror::Error)]
#[error(
    "out of device memory at step {step} ({phase}){requested}; largest: {largest}. The breakdown is in {report}.{advice}"
)]
pub struct OutOfMemoryError {
    /// Step that failed.
    pub step: u64,
    /// Phase in which it surfaced.
    pub phase: String,
    /// What the failed allocation asked for, in words (may be empty).
    pub requested: String,
    /// The largest categories and tensors, in words.
    pub largest: String,
    /// The `oom.json` written.
    pub report: PathBuf,
    /// What to turn, in words (may be empty).
    pub advice: String,
}

/// A run held to a budget ([`Run::with_budget`]) whose deciding figure went past it.
#[derive(Debug, thiserror::Error)]
#[error("{figure} reached {bytes} bytes at step {step} ({phase}), over the run's budget of {budget} bytes")]
pub(super) struct OverBudget {
    pub(super) step: u64,
    pub(super) phase: String,
    pub(super) figure: String,
    pub(super) bytes: u64,
    pub(super) budget: u64,
}

/// An out-of-memory that a backend's own thread panicked with during a
/// step ([`crate::profile::panics`]): the step itself returned as if nothing
/// had happened.
#[derive(Debug, thiserror::Error)]
#[error("the device ran out of memory during step {step} (reported by a panic on the backend's thread): {message}")]
pub(super) struct DevicePanic {
    pub(super) step: u64,
    pub(super) message: String,
}

/// A failed write of `path` in the run at `root`; a full disk says how the
/// run continues.
pub(super) fn write_err<'a>(root: &'a Path, path: &'a Path) -> impl Fn(std::io::Error) -> RunError + 'a {
    move |e| {
        let full = matches!(
            e.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        );
        RunError::Write {
            path: path.into(),
            why: if full {
                format!(
                    "{e}. Free space and {}: it continues from its last checkpoint as if it had not stopped",
                    Remedy::Resume(root.into())
                )
            } else {
                e.to_string()
            },
        }
    }
}
