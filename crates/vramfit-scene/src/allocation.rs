//! How a scene fit's long-lived device state is allocated (the GPU path's
//! choice; named here so that the CLI parses it in every build).

/// How a fit's long-lived device state (parameters, moments, densification
/// statistics) is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateAllocation {
    /// At its exact size, outside the allocator's paged pools (CubeCL's
    /// persistent pool), and the previous state's allocations returned to
    /// the device when a new state is loaded.
    #[default]
    Exact,
    /// In the allocator's pools like every other buffer (a slice of a page
    /// whose size the device sets: on CUDA a fixed fraction of the card).
    Pooled,
}

impl std::str::FromStr for StateAllocation {
    type Err = vramfit::settings::UnknownValue;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "exact" => Ok(Self::Exact),
            "pooled" => Ok(Self::Pooled),
            other => Err(vramfit::settings::UnknownValue {
                setting: "state allocation",
                given: other.into(),
                choices: "exact or pooled",
            }),
        }
    }
}

impl std::fmt::Display for StateAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Exact => "exact",
            Self::Pooled => "pooled",
        })
    }
}
