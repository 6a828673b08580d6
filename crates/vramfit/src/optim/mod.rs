//! Optimisers on plain tensors, for workloads whose parameters are a few
//! tensors with their own learning rates and whose parameter count changes
//! during training (state rows can be appended).

mod adam;

pub use adam::{Adam, AdamConfig, AdamMoments};
