//! Runs: the one run driver every workload goes through ([`Run`],
//! [`Workload`]), and the run directory it writes: one per run, never
//! overwritten silently; files inside are written atomically, metrics are
//! streamed as JSON lines.

pub mod allocation_failure;
mod arrays;
mod atomic;
mod checkpoint_files;
mod dir;
mod driver;
mod errors;
mod fail_at;
mod metrics_log;
mod rank_folders;
mod resume;
mod session;
mod tensorboard;
mod workload;

pub use arrays::{ArrayFile, ArrayFileError};
pub use atomic::{atomic_write, atomic_write_with};
pub use checkpoint_files::{checkpoint_name, checkpoints_newest_first};
pub use dir::{LOCK_FILE, RunDir, RunDirError, next_free_run_dir};
pub use metrics_log::{LogError, logged_steps};
pub use tensorboard::{EventWriter, crc32c};

// Built by a step (crate::step), reported by the driver.
pub use crate::step::DeviceFailure;
pub use driver::{Run, RunPath, Start, categories_at_peak};
pub use errors::{OutOfMemoryError, RunError};
pub use fail_at::FailAt;
pub use rank_folders::{RankFoldersError, align_checkpoints, rank_dir, rank_dirs, regather};
pub use resume::Resumable;
pub use session::KEEP_CHECKPOINTS;
pub use workload::{Cadence, Event, FileBody, Finished, RunStats, RunSummary, StepRecord, Workload};
