//! Allocator policy: how often the backend's memory pools are told to give
//! back what they hold but do not use (`Backend::memory_cleanup`).
//!
//! Cleaning lowers reserved bytes (fragmentation) at the cost of
//! reallocating on the next step; [`Cleanup`] does it on schedule and times
//! each call so that the cost is reported beside the bytes it saved.

use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;

/// When to clean up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CleanupPolicy {
    /// Never (the allocator keeps its pools).
    #[default]
    Never,
    /// After every `n`-th optimiser step.
    Every(u64),
}

/// An allocator setting that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allocator cleanup `{0}` is not one of never, step, every:N (N ≥ 1)")]
pub struct CleanupParseError(pub String);

impl CleanupPolicy {
    /// Parses `never`, `step` (= `every:1`) or `every:N`.
    pub fn parse(text: &str) -> Result<Self, CleanupParseError> {
        match text {
            "never" => Ok(Self::Never),
            "step" => Ok(Self::Every(1)),
            _ => match text.strip_prefix("every:").and_then(|n| n.parse().ok()) {
                Some(n) if n >= 1 => Ok(Self::Every(n)),
                _ => Err(CleanupParseError(text.to_string())),
            },
        }
    }

    /// The text `parse` reads back.
    pub fn name(&self) -> String {
        match self {
            Self::Never => "never".into(),
            Self::Every(1) => "step".into(),
            Self::Every(n) => format!("every:{n}"),
        }
    }

    /// Whether to clean after optimiser step `step` (1-based).
    pub fn due(&self, step: u64) -> bool {
        matches!(self, Self::Every(n) if step.is_multiple_of(*n))
    }
}

/// Runs the policy and accounts its cost.
#[derive(Debug, Default, Clone)]
pub struct Cleanup {
    policy: CleanupPolicy,
    calls: u64,
    spent: Duration,
}

impl Cleanup {
    /// A cleaner following `policy`.
    pub fn new(policy: CleanupPolicy) -> Self {
        Self {
            policy,
            ..Default::default()
        }
    }

    /// After optimiser step `step`: cleans if due (after a device sync, so
    /// the time is the cleanup's) and returns the time it took.
    pub fn after_step<B: Backend>(&mut self, step: u64, device: &B::Device) -> Option<Duration> {
        let cleaned = self.run_if_due(step, || -> Result<_, std::convert::Infallible> {
            let _ = B::sync(device);
            let start = Instant::now();
            B::memory_cleanup(device);
            // A heap trace of a CPU run standing for a device's marks it.
            crate::heap::cleanup_mark();
            // The shape backend's router does not pass the cleanup on.
            crate::shapes::cleanup_mark::<B>();
            let _ = B::sync(device);
            Ok(Some(start.elapsed()))
        });
        cleaned.unwrap_or_else(|never| match never {})
    }

    /// After optimiser step `step`: runs `clean` if due, which cleans and
    /// says how long the cleanup took (`None`: there was nothing to clean),
    /// and accounts it. For allocators outside Burn's backends (the scene's
    /// CubeCL renderer).
    pub fn run_if_due<E>(
        &mut self,
        step: u64,
        clean: impl FnOnce() -> Result<Option<Duration>, E>,
    ) -> Result<Option<Duration>, E> {
        if !self.policy.due(step) {
            return Ok(None);
        }
        let took = clean()?;
        if let Some(took) = took {
            self.calls += 1;
            self.spent += took;
        }
        Ok(took)
    }

    /// Cleanups done.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Time spent in them.
    pub fn spent(&self) -> Duration {
        self.spent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule() {
        assert_eq!(CleanupPolicy::parse("step").unwrap(), CleanupPolicy::Every(1));
        let p = CleanupPolicy::parse("every:3").unwrap();
        assert_eq!((1..=9).filter(|&s| p.due(s)).collect::<Vec<_>>(), [3, 6, 9]);
        assert!(!(1..100).any(|s| CleanupPolicy::Never.due(s)));
        assert!(CleanupPolicy::parse("every:0").is_err());
        assert!(
            CleanupPolicy::parse("sometimes")
                .unwrap_err()
                .to_string()
                .contains("every:N")
        );
        for t in ["never", "step", "every:4"] {
            assert_eq!(CleanupPolicy::parse(t).unwrap().name(), t);
        }
    }

    #[test]
    fn counts_cleanups_on_schedule() {
        let mut c = Cleanup::new(CleanupPolicy::Every(2));
        let device = Default::default();
        let done: Vec<bool> = (1..=4)
            .map(|s| c.after_step::<burn::backend::Flex>(s, &device).is_some())
            .collect();
        assert_eq!(done, [false, true, false, true]);
        assert_eq!(c.calls(), 2);
    }
}
