//! Why a scene fit stops: each error names the problem and what to do.

use vramfit::run::RunError;

use crate::dataset::DatasetError;

/// Why a scene fit stopped.
#[derive(Debug, thiserror::Error)]
pub enum SceneError {
    /// A setting.
    #[error("{0}")]
    Setting(String),
    /// The dataset.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// The run driver.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A checkpoint that does not fit this fit.
    #[error("checkpoint does not match the scene: {0}")]
    Checkpoint(String),
    /// The device running the fit failed (out of memory, lost device).
    #[error("device: {0}")]
    Device(#[from] crate::fit::FitError),
    /// A run's files cannot be drawn (`render-scene`).
    #[error("{0}")]
    Drawing(String),
    /// The loss stopped being a number: the fit diverged.
    #[error(
        "the loss became {value} at step {step}: the fit diverged and its Gaussians are no longer numbers. The run \
         stops here, and its checkpoints (from before) are kept. Check the dataset's poses and points and any \
         setting changed from its default, then start again"
    )]
    NonFinite {
        /// The step.
        step: u64,
        /// The loss seen.
        value: f32,
    },
    /// The device failed during a step's phase.
    #[error("device, at step {step} ({phase}): {message}")]
    DeviceStep {
        /// The step.
        step: u64,
        /// The phase (`forward_backward`, `optimizer`).
        phase: &'static str,
        /// The device's words.
        message: String,
    },
}
