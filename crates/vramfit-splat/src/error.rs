//! Errors of the splat workload: each names the problem and what to do.

use std::path::PathBuf;

/// Everything that can go wrong fitting or rendering Gaussians.
#[derive(Debug, thiserror::Error)]
pub enum SplatError {
    /// Reading or writing a picture failed.
    #[error(transparent)]
    Picture(#[from] vramfit_gauss::picture::PictureError),
    /// A setting has a value that cannot work.
    #[error("invalid setting `{name}`: {why}")]
    InvalidSetting {
        /// The setting's name as in config files and flags.
        name: &'static str,
        /// Why, and what to use instead.
        why: String,
    },
    /// A config file could not be parsed (unknown key, wrong type).
    #[error("config file '{path}': {why}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the key.
        why: String,
    },
    /// Training diverged.
    #[error("the loss became {value} at step {step}; lower the learning rates (e.g. `lr_xy`) and run again")]
    NonFinite {
        /// Step at which it happened.
        step: u64,
        /// The value seen.
        value: f32,
    },
    /// An optimiser update made parameters NaN, infinite or so large that
    /// squaring them overflows f32.
    #[error(
        "step {step}: the `{group}` parameters became NaN, infinite or too large for f32 (beyond ±1.8e19) after the optimiser update \
         (learning rate `lr_{group}` = {lr:e}); \
         lower `lr_{group}` (e.g. tenfold) and fit again, or lower it in the run directory's config.toml and continue from its last checkpoint with --resume"
    )]
    NonFiniteParameters {
        /// Step at which it happened.
        step: u64,
        /// The parameter group (`xy`, `inv_scale`, `theta`, `color`).
        group: &'static str,
        /// The group's learning rate at that step.
        lr: f64,
    },
    /// An output size whose buffers would not fit in the host's memory.
    #[error(
        "{what} at {width}x{height} needs about {needed} of memory, but only {available} is available{}",
        match fits {
            Some((w, h)) => format!("; the largest size of the same aspect ratio that fits is {w}x{h} (--size {w}x{h})"),
            None => "; no smaller size of the same aspect ratio fits either".into(),
        }
    )]
    TooLarge {
        /// What would be made, e.g. "rendering".
        what: &'static str,
        /// Asked width.
        width: u32,
        /// Asked height.
        height: u32,
        /// Estimated bytes, in words.
        needed: String,
        /// Available bytes, in words.
        available: String,
        /// The largest `(width, height)` of the same aspect ratio that fits.
        fits: Option<(u32, u32)>,
    },
    /// The device failed while running a step (Burn's `ExecutionError`).
    #[error("device error at step {step} (surfaced after {phase}): {message}")]
    Device {
        /// Step that failed.
        step: u64,
        /// Phase after which the error surfaced (errors appear at the next sync).
        phase: &'static str,
        /// What the backend said.
        message: String,
    },
    /// A Gaussians or checkpoint file is unreadable.
    #[error(transparent)]
    File(#[from] vramfit::run::ArrayFileError),
    /// The run directory could not be used.
    #[error(transparent)]
    RunDir(#[from] vramfit::run::RunDirError),
    /// The run driver (directory, files, out-of-memory).
    #[error(transparent)]
    Run(#[from] vramfit::run::RunError),
    /// Writing an output failed.
    #[error("cannot write '{path}': {why}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}
