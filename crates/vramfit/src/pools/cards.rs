//! Cards by name or size, and the memory properties their CubeCL client
//! is made with.

use serde::{Deserialize, Serialize};

/// The properties a CubeCL client sizes its pools from
/// (`cubecl_ir::MemoryDeviceProperties`), with the default pool
/// configuration (`MemoryConfiguration::SubSlices`) on every runtime here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocator {
    /// The largest page (and the largest single buffer).
    pub max_page_size: u64,
    /// Every reservation is rounded up to this (the runtime's layout
    /// policy and its pools use the same figure).
    pub alignment: u64,
}

impl Allocator {
    /// cubecl-cuda 0.10's client for a card of `memory_bytes`
    /// (`cuDeviceTotalMem`): pages up to a quarter of the memory, 512-byte
    /// alignment (`runtime.rs`).
    pub fn cuda(memory_bytes: u64) -> Self {
        Self {
            max_page_size: memory_bytes / 4,
            alignment: 512,
        }
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
impl Allocator {
    /// The pools of `device`'s own client.
    pub fn of<R: cubecl::Runtime>(device: &R::Device) -> Self {
        Self::from(&R::client(device).properties().memory)
    }
}

impl From<&cubecl_ir::MemoryDeviceProperties> for Allocator {
    /// The pools of a client made with `properties` (a live client's
    /// `properties().memory`: the probing device's own).
    fn from(properties: &cubecl_ir::MemoryDeviceProperties) -> Self {
        Self {
            max_page_size: properties.max_page_size,
            alignment: properties.alignment,
        }
    }
}

/// A card a plan is made for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Card {
    /// As the user named it (`h100-80`, `24`).
    pub name: String,
    /// Its memory, bytes.
    pub memory_bytes: u64,
    /// Its client's pools.
    pub allocator: Allocator,
}

/// CUDA cards by name: (name, what it is, memory in MiB as `nvidia-smi`
/// reports `memory.total`, which is `cuDeviceTotalMem`). The H100 and H200
/// figures were read on this project's lent machines
/// (`bench-results/gpu-h*/machine.txt`); the others are published
/// `nvidia-smi` readings of those cards.
/// The consumer cards (`rtx4060`, `rtx4070`, `rtx4060ti-16`, `rtx3090`)
/// and the A100 40 GB carry the `memory.total` their users commonly
/// report, not one read here.
pub const KNOWN_CARDS: &[(&str, &str, u64)] = &[
    ("rtx4060", "GeForce RTX 4060 8 GB", 8_188),
    ("rtx4070", "GeForce RTX 4070 12 GB", 12_282),
    ("rtx4060ti-16", "GeForce RTX 4060 Ti 16 GB", 16_380),
    ("t4", "NVIDIA T4 16 GB", 15_360),
    ("a10", "NVIDIA A10 24 GB", 23_028),
    ("l4", "NVIDIA L4 24 GB", 23_034),
    ("rtx3090", "GeForce RTX 3090 24 GB", 24_576),
    ("rtx4090", "GeForce RTX 4090 24 GB", 24_564),
    ("l40s", "NVIDIA L40S 48 GB", 46_068),
    ("a6000", "RTX A6000 48 GB", 49_140),
    ("a100-40", "A100 40 GB", 40_960),
    ("a100-80", "A100 80 GB", 81_920),
    ("h100-80", "H100 80 GB HBM3", 81_559),
    ("h200", "H200 141 GB", 143_771),
];

/// A card that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CardError {
    /// Neither a known name nor a size.
    #[error(
        "'{0}' is not a card size or a known card: give a size in GiB (e.g. 24) or one of {known}",
        known = known_names()
    )]
    Unknown(String),
}

fn known_names() -> String {
    KNOWN_CARDS
        .iter()
        .map(|(name, what, mib)| format!("{name} ({what}, {mib} MiB)"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Card {
    /// A CUDA card of `memory_bytes` called `name`.
    pub fn cuda(name: impl Into<String>, memory_bytes: u64) -> Self {
        Self {
            name: name.into(),
            memory_bytes,
            allocator: Allocator::cuda(memory_bytes),
        }
    }

    /// A known CUDA card by name (case and `_`/`-` ignored).
    pub fn named(name: &str) -> Result<Self, CardError> {
        let key = name.trim().to_ascii_lowercase().replace('_', "-");
        // The H100 by its family name is the 80 GB SXM card.
        let key = if key == "h100" { "h100-80".to_string() } else { key };
        KNOWN_CARDS
            .iter()
            .find(|(known, _, _)| *known == key)
            .map(|&(known, _, mib)| Self::cuda(known, mib << 20))
            .ok_or_else(|| CardError::Unknown(name.trim().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_by_name_and_their_pages() {
        let h200 = Card::named("H200").unwrap();
        assert_eq!(h200.memory_bytes, 143_771 << 20);
        assert_eq!(h200.allocator.max_page_size, (143_771u64 << 20) / 4);
        assert_eq!(h200.allocator.alignment, 512);
        assert_eq!(Card::named("h100_80").unwrap().name, "h100-80");
        assert_eq!(Card::named("H100").unwrap().name, "h100-80");
        for (name, _, _) in KNOWN_CARDS {
            assert!(super::super::Rates::of(name).is_some(), "{name} has no published rates");
        }
        let e = Card::named("rtx9090").unwrap_err().to_string();
        assert!(
            e.contains("rtx9090") && e.contains("h100-80") && e.contains("size in GiB"),
            "{e}"
        );
    }
}
