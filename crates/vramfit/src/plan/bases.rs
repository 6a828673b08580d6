//! The frozen base's storage as a knob: a LoRA run's frozen weights kept
//! in f32, in 16 bits or quantized to 4 ([`BaseStorage`]).
//!
//! The base is not a delta on the other knobs: it changes the parameters'
//! bytes, what each matrix product reads and rebuilds (a 16-bit base under
//! 16-bit compute is used as it is; under f32 compute it is cast per use;
//! an NF4 base is dequantized per use), and so the time and the scratch of
//! every other knob. So each base the space offers ([`Space::bases`]) is
//! calibrated on its own, with every probe, check, slice and token law the
//! workload asks for (N bases cost N calibrations), and the interactions
//! are measured, not added.
//!
//! Choosing: the base is a quality knob, lowered last. A budget takes the
//! first base, best quality first, at which any plan fits (with that
//! calibration's own margin), and that base's choice as the knob model
//! makes it; the plans of the lower bases that fit follow as fallbacks.
//! Nothing fits at any base: the lowest base's error, which names the
//! least budget that works.

use super::{Calibration, Choice, Knobs, PlanError, Plannable};
use crate::frozen::BaseStorage;

/// What storing the frozen base as `base` changes in the numerics, in
/// words (`None`: nothing).
pub(super) fn quality_cost(base: BaseStorage) -> Option<String> {
    match base {
        BaseStorage::F32 => None,
        BaseStorage::Bf16 | BaseStorage::F16 => Some(format!(
            "frozen base stored in {} (each weight rounded to {} bits of mantissa; none lost where the checkpoint \
             is {0})",
            base.name(),
            if base == BaseStorage::Bf16 { 8 } else { 11 }
        )),
        BaseStorage::Nf4 => Some(
            "frozen base quantized to NF4 (QLoRA's 4 bits a weight, an f32 scale a block of 64: a mean error of \
             0.07 σ a weight on normal weights)"
                .into(),
        ),
        BaseStorage::Int8 => Some(
            "frozen base quantized to int8 (8 bits a weight, an f32 scale a block of 64: a mean error of 0.005 σ a \
             weight on normal weights)"
                .into(),
        ),
    }
}

/// One calibration per base of `offered`, the first holding the others
/// ([`Calibration::lower_bases`]).
pub(super) fn calibrate_bases(
    target: &mut dyn Plannable,
    offered: &[BaseStorage],
    probe_batch: Option<usize>,
) -> Result<Calibration, PlanError> {
    let mut each = Vec::with_capacity(offered.len());
    for &base in offered {
        target.at_base(base);
        let mut cal = super::calibrate_at_base(target, probe_batch).map_err(|e| match e {
            PlanError::Probe { probe, why } => PlanError::Probe {
                probe: format!("{probe}, frozen base {}", base.name()),
                why,
            },
            other => other,
        })?;
        cal.base = Some(base);
        for r in cal.probes.iter_mut().chain(cal.checks.iter_mut()) {
            r.knobs.base = Some(base);
        }
        each.push(cal);
    }
    // Later probes without a base of their own (none today) at the best.
    target.at_base(offered[0]);
    let mut each = each.into_iter();
    let mut first = each
        .next()
        .ok_or_else(|| PlanError::Setting("no frozen base to calibrate".into()))?;
    first.lower_bases = each.collect();
    Ok(first)
}

impl Calibration {
    /// This calibration and those at its lower bases, best quality first.
    pub fn bases(&self) -> impl Iterator<Item = &Calibration> {
        std::iter::once(self).chain(&self.lower_bases)
    }

    /// The calibration whose probes ran with `base` (this one for `None`
    /// or a base not calibrated).
    pub fn at_base(&self, base: Option<BaseStorage>) -> &Calibration {
        base.and_then(|b| self.bases().find(|c| c.base == Some(b)))
            .unwrap_or(self)
    }

    /// [`Calibration::choose_on_ranks`] over the bases (module's description).
    pub(super) fn choose_over_bases(&self, budget: u64, ranks: usize) -> Result<Choice<Knobs>, PlanError> {
        let mut last = None;
        let mut higher: Vec<&str> = Vec::new();
        for (i, cal) in self.bases().enumerate() {
            match cal.choose_at_base(budget, ranks) {
                Ok(mut choice) => {
                    for lower in &self.lower_bases[i..] {
                        if let Ok(more) = lower.choose_at_base(budget, ranks) {
                            choice.plans.extend(more.plans);
                        }
                    }
                    if let (Some(base), false) = (cal.base, higher.is_empty()) {
                        choice.why = format!(
                            "nothing fits with the frozen base in {}: stored in {}; {}",
                            higher.join(" or "),
                            base.name(),
                            choice.why
                        );
                    }
                    return Ok(choice);
                }
                Err(e) => {
                    higher.extend(cal.base.map(BaseStorage::name));
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one base"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::chain::BlockCost;
    use crate::plan::{Measured, ProbeError, Space, Strategy, calibrate};
    use crate::precision::Precision;

    /// A LoRA-like workload whose frozen base costs 40,000 bytes in f32,
    /// half in bf16 and a seventh in NF4 (slower a sample as it is lower:
    /// the casts and the dequantization), with its activations beside it.
    struct Frozen {
        base: BaseStorage,
        probed: Vec<BaseStorage>,
    }

    impl Plannable for Frozen {
        fn space(&self) -> Space {
            Space {
                batch: 8,
                blocks: 4,
                block_input_bytes: 100,
                precisions: vec![Precision::F32],
                storage_groups: Vec::new(),
                low_moments: false,
                host_moments: false,
                batch_statistics: None,
                block_shapes: Vec::new(),
                fused_attention: Vec::new(),
                parameters: Vec::new(),
                bases: vec![BaseStorage::F32, BaseStorage::Bf16, BaseStorage::Nf4],
                work: None,
            }
        }

        fn measure(&mut self, k: &Knobs, batch: usize) -> Result<Measured, ProbeError> {
            // A plan's knobs name their base; a probe's come from the target.
            let base = k.base.unwrap_or(self.base);
            self.probed.push(base);
            let (frozen, slower) = match base {
                BaseStorage::F32 => (40_000.0, 1.0),
                BaseStorage::Nf4 => (40_000.0 / 7.0, 1.5),
                _ => (20_000.0, 1.2),
            };
            let blocks = vec![
                BlockCost {
                    activations: 2000.0,
                    input: 100.0,
                    recompute: 0.1,
                };
                4
            ];
            let m = k.micro_batch as f64;
            let step = 5_000.0
                + frozen
                + if batch > k.micro_batch { 1000.0 } else { 0.0 }
                + m * (500.0 + crate::plan::chain::chain_peak(&blocks, &k.checkpointed));
            let rest = 6_000.0 + frozen;
            let marked = k.checkpointed.iter().filter(|x| **x).count() as f64;
            let ms = 2.0 + (batch / k.micro_batch) as f64 * 0.5 + batch as f64 * slower * (1.0 + 0.1 * marked);
            Ok(Measured {
                peak_bytes: step.max(rest).round() as u64,
                step_peak_bytes: step.round() as u64,
                rest_peak_bytes: rest.round() as u64,
                files_peak_bytes: 0,
                between_peak_bytes: 0,
                step_ms: ms,
                seconds: 0.0,
            })
        }

        fn at_base(&mut self, base: BaseStorage) {
            self.base = base;
        }
    }

    #[test]
    fn the_base_is_lowered_only_where_nothing_fits_at_the_one_before() {
        let mut target = Frozen {
            base: BaseStorage::F32,
            probed: Vec::new(),
        };
        let cal = calibrate(&mut target, None).unwrap();
        // Each base calibrated on its own, each probe at its base.
        assert_eq!(
            cal.bases().map(|c| c.base).collect::<Vec<_>>(),
            [Some(BaseStorage::F32), Some(BaseStorage::Bf16), Some(BaseStorage::Nf4)]
        );
        for c in cal.bases() {
            assert!(c.probes.iter().all(|r| r.knobs.base == c.base), "{:?}", c.base);
            assert!(c.peak_error < 1e-6, "{:?}: {}", c.base, c.peak_error);
        }
        assert!(target.probed.contains(&BaseStorage::Nf4));
        // The leanest plan at each base: budgets between them pick the base.
        let lean: Vec<u64> = cal
            .bases()
            .map(|c| (c.leanest_at_base().peak_bytes as f64 * (1.0 + c.own_margin())).ceil() as u64 + 1)
            .collect();
        assert!(lean[0] > lean[1] && lean[1] > lean[2], "{lean:?}");
        for (i, budget) in [lean[0] * 2, lean[0], lean[1], lean[2]].into_iter().enumerate() {
            let choice = cal.choose(budget).unwrap();
            let want = [BaseStorage::F32, BaseStorage::F32, BaseStorage::Bf16, BaseStorage::Nf4][i];
            let winner = &choice.plans[0];
            assert_eq!(winner.setting.base, Some(want), "budget {budget}: {}", choice.why);
            // The prediction is the winning base's own, within its budget.
            assert_eq!(cal.predict(&winner.setting).0.ceil() as u64, winner.peak_bytes);
            assert!(winner.peak_bytes <= budget);
            assert_eq!(winner.exact(), want == BaseStorage::F32, "{:?}", winner.quality);
            if want != BaseStorage::F32 {
                assert!(
                    choice.why.starts_with("nothing fits with the frozen base in f32"),
                    "{}",
                    choice.why
                );
            }
            // Plans at the lower bases follow as fallbacks, never higher ones.
            let order: Vec<usize> = choice
                .plans
                .iter()
                .map(|p| cal.bases().position(|c| c.base == p.setting.base).unwrap())
                .collect();
            assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
        }
        // Below the lowest base's leanest plan: its error, naming what works.
        let e = cal.choose(lean[2] - 2).unwrap_err();
        assert!(
            matches!(e, PlanError::Infeasible { smallest_bytes, .. } if smallest_bytes >= lean[2] - 1),
            "{e}"
        );
        // A plan measured again is measured at its own base.
        target.probed.clear();
        let plan = cal.choose(lean[1]).unwrap().plans.remove(0);
        cal.measure(&mut target, &plan.setting).unwrap();
        assert_eq!(target.probed, [BaseStorage::Bf16]);
    }
}
