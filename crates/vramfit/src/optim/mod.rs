//! Optimisers on plain tensors, for workloads whose parameters are a few
//! tensors with their own learning rates and whose parameter count changes
//! during training (state rows can be appended) ([`Adam`]), and Adam(W)
//! over a Burn module with f32 arithmetic on any stored types
//! ([`ModuleAdam`]).

mod adam;
mod adam_update;
mod flex_pass;
mod host_adam;
mod read_ahead;
mod shards;

pub use adam::{Adam, AdamConfig, AdamMoments};
pub use host_adam::{HostAdam, Moments};

mod module_adam;

pub use module_adam::{AdamSnapshot, ModuleAdam};
pub use shards::shard_loads;

/// The prefixes of Adam's first and second moments' keys in a checkpoint
/// (`trainer::save_state`); a rank of a sharded run holds its share of them.
pub const MOMENT_KEYS: [&str; 2] = ["adam_m/", "adam_v/"];
