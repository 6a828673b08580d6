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
    Device(String),
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
