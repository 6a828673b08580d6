//! A run's `metrics.jsonl` read back: the step of a line, the steps a run
//! logged (what a resumed run checks it wrote once each).

use std::io;
use std::path::{Path, PathBuf};

/// The `step` of one `metrics.jsonl` line.
pub(super) fn line_step(line: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
}

/// The steps `run_dir/metrics.jsonl` logged, in file order; an error names
/// a line that is not a logged step.
pub fn logged_steps(run_dir: &Path) -> Result<Vec<u64>, LogError> {
    let path = run_dir.join("metrics.jsonl");
    let text = crate::files::read::read(&path, crate::files::read::Links::Refuse)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|cause| LogError::Read {
            path: path.clone(),
            cause,
        })?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            line_step(l).ok_or_else(|| LogError::NoStep {
                path: path.clone(),
                line: i + 1,
                text: l.into(),
            })
        })
        .collect()
}

/// A run's `metrics.jsonl` that does not read as logged steps.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The file does not read.
    #[error("{path}: {cause}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        cause: io::Error,
    },
    /// A line is not a logged step.
    #[error("{path} line {line}: no step: {text}")]
    NoStep {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// Its text.
        text: String,
    },
}
