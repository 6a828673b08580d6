//! Dynamic loss scaling with PyTorch's `GradScaler` semantics.

/// Scaler settings; the defaults are PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalerConfig {
    /// Scale at the first step.
    pub initial_scale: f64,
    /// Multiplier after `growth_interval` clean steps in a row.
    pub growth_factor: f64,
    /// Multiplier after a step whose gradients held inf or NaN.
    pub backoff_factor: f64,
    /// Clean steps in a row before the scale grows.
    pub growth_interval: u64,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        Self {
            initial_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// What a scaler carries between steps (saved in checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScalerState {
    /// Current scale.
    pub scale: f64,
    /// Clean steps since the last growth or backoff.
    pub growth_tracker: u64,
    /// Optimiser steps skipped so far for inf/NaN gradients.
    pub skipped_steps: u64,
}

/// The dynamic loss scaler.
///
/// Use per optimiser step: multiply every micro-batch's loss by
/// [`scale`](Self::scale) before backward, accumulate, unscale the summed
/// gradients once by `1 / scale` and check them (see
/// [`crate::grads::scale_and_check`]), then call [`update`](Self::update)
/// with whether any gradient was inf/NaN. When `update` returns `false`
/// the optimiser step must be skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    config: ScalerConfig,
    state: ScalerState,
}

impl LossScaler {
    /// A scaler at `config.initial_scale`.
    pub fn new(config: ScalerConfig) -> Self {
        Self {
            config,
            state: ScalerState {
                scale: config.initial_scale,
                growth_tracker: 0,
                skipped_steps: 0,
            },
        }
    }

    /// A scaler continuing from saved state.
    pub fn resume(config: ScalerConfig, state: ScalerState) -> Self {
        Self { config, state }
    }

    /// The factor losses are multiplied by this step.
    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// The state to save.
    pub fn state(&self) -> ScalerState {
        self.state
    }

    /// Records the outcome of one optimiser step's gradient check and
    /// returns whether the optimiser may step. Inf/NaN: scale × backoff,
    /// tracker reset, step skipped. Clean: tracker + 1, and after
    /// `growth_interval` clean steps in a row the scale × growth.
    pub fn update(&mut self, found_inf: bool) -> bool {
        if found_inf {
            self.state.scale *= self.config.backoff_factor;
            self.state.growth_tracker = 0;
            self.state.skipped_steps += 1;
            false
        } else {
            self.state.growth_tracker += 1;
            if self.state.growth_tracker == self.config.growth_interval {
                self.state.scale *= self.config.growth_factor;
                self.state.growth_tracker = 0;
            }
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_after_interval_and_backs_off_on_inf() {
        let mut s = LossScaler::new(ScalerConfig {
            growth_interval: 3,
            ..Default::default()
        });
        assert_eq!(s.scale(), 65536.0);
        assert!(s.update(false));
        assert!(s.update(false));
        assert_eq!(s.scale(), 65536.0);
        assert!(s.update(false));
        assert_eq!(s.scale(), 131072.0, "x2 after 3 clean steps");
        assert!(s.update(false));
        assert!(!s.update(true), "an inf skips the step");
        assert_eq!(s.scale(), 65536.0);
        assert_eq!(s.state().growth_tracker, 0, "backoff resets the run of clean steps");
        assert_eq!(s.state().skipped_steps, 1);
        // The interrupted run does not count: three more clean steps are needed.
        s.update(false);
        s.update(false);
        assert_eq!(s.scale(), 65536.0);
        s.update(false);
        assert_eq!(s.scale(), 131072.0);
    }

    #[test]
    fn pytorch_defaults() {
        let c = ScalerConfig::default();
        assert_eq!(
            (c.initial_scale, c.growth_factor, c.backoff_factor, c.growth_interval),
            (65536.0, 2.0, 0.5, 2000)
        );
    }
}
