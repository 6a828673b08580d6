//! Where a segmenter run's images come from: drawn from the seed
//! ([`super::data`]) or a user's folder ([`super::folder`]).

use burn::prelude::*;

use super::data::{SegBatch, Synthetic};
use super::folder::Pairs;

/// Where a run's images come from.
#[derive(Debug, Clone)]
pub enum SegData {
    /// Drawn from the seed.
    Synthetic(Synthetic),
    /// A user's folder of images and masks.
    Folder(Pairs),
}

impl SegData {
    /// Training batch `step` (1-based) of `size` samples.
    pub fn batch<B: Backend>(&self, step: u64, size: usize, device: &B::Device) -> SegBatch<B> {
        match self {
            Self::Synthetic(s) => s.batch(step, size, device),
            Self::Folder(f) => f.batch(step, size, false, device),
        }
    }

    /// Held-out batch `index` (0-based) of `size` samples.
    pub fn held_out<B: Backend>(&self, index: u64, size: usize, device: &B::Device) -> SegBatch<B> {
        match self {
            // Steps no run reaches.
            Self::Synthetic(s) => s.batch(u64::MAX / 2 + index, size, device),
            Self::Folder(f) => f.batch(index + 1, size, true, device),
        }
    }
}
