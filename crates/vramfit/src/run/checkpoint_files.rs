//! A run's checkpoint files (its state after a step, in `checkpoints/`):
//! their names, which sort by step, and the newest first.

use std::path::{Path, PathBuf};

/// The file name of the checkpoint taken after `step` (sorts by step).
pub fn checkpoint_name(step: u64) -> String {
    format!("step-{step:08}.ckpt")
}

/// Checkpoint files (`*.ckpt`) in `dir`, newest first; none if `dir` is unreadable.
pub fn checkpoints_newest_first(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .collect();
    found.sort();
    found.reverse();
    found
}
