//! Run directories: one per run, never overwritten silently; files inside
//! are written atomically, metrics are streamed as JSON lines.

mod arrays;
mod dir;
mod tensorboard;

pub use arrays::{ArrayFile, ArrayFileError};
pub use dir::{
    LOCK_FILE, RunDir, RunDirError, atomic_write, checkpoint_name, checkpoints_newest_first, next_free_run_dir,
};
pub use tensorboard::{EventWriter, crc32c};
mod step;

pub use step::{StepError, StepOutcome, Stepper, Trainable};
