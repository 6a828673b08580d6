//! Choosing a plan for a budget: every combination of the knobs other
//! than checkpointing, each with the checkpoint set of least
//! recomputation that fits what is left, ranked by predicted step time.

use super::chain::{least_peak, optimal};
use super::{Calibration, Choice, Knobs, Plan, PlanError, Space};
use crate::profile::human_bytes;

/// Predicted times this close are treated as equal (the probes' resolution).
const TIME_NOISE: f64 = super::cost_model::TIME_RESOLUTION;

impl Space {
    /// Each combination of the knobs other than checkpointing that the
    /// space allows, on `ranks` data-parallel ranks (their micro-batches
    /// shared evenly), nothing checkpointed.
    pub fn combinations(&self, ranks: usize) -> Vec<Knobs> {
        let s = self;
        let mut out = Vec::new();
        for &precision in &s.precisions {
            for micro_batch in s.micro_batches() {
                if !(s.batch / micro_batch).is_multiple_of(ranks.max(1)) {
                    continue;
                }
                for low_storage in 0..=s.storage_groups.len() {
                    // Moments: f32 on the device, bf16 on the device, f32 on the host.
                    let moments = [(false, false), (true, false), (false, true)]
                        .into_iter()
                        .filter(|&(low, host)| (!low || s.low_moments) && (!host || s.host_moments));
                    for (low_moments, host_moments) in moments {
                        for cleanup in [false, true] {
                            // Fused only where it has a kernel at this precision.
                            for fused_attention in [false, true] {
                                if fused_attention && !s.fused_attention.contains(&precision) {
                                    continue;
                                }
                                out.push(Knobs {
                                    precision,
                                    checkpointed: vec![false; s.blocks],
                                    micro_batch,
                                    low_storage,
                                    low_moments,
                                    host_moments,
                                    cleanup,
                                    fused_attention,
                                    ranks,
                                    base: None,
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

impl Calibration {
    fn plan(&self, knobs: Knobs) -> Plan<Knobs> {
        let (peak, ms) = self.predict(&knobs);
        Plan {
            quality: knobs.quality_costs(&self.space),
            setting: knobs,
            peak_bytes: peak.max(0.0).ceil() as u64,
            step_ms: ms,
        }
    }

    /// [`Strategy::choose`] for the knob model.
    pub(super) fn choose_knobs(&self, budget: u64) -> Result<Choice<Knobs>, PlanError> {
        self.choose_on_ranks(budget, 1)
    }

    /// The plans for `budget` on each of `ranks` data-parallel ranks, Adam's
    /// moments sharded over them: per rank, predicted from one rank's
    /// probes and the sharding's arithmetic (derived; a run on the ranks
    /// measures it). `ranks = 1` is [`Strategy::choose`].
    pub fn choose_on_ranks(&self, budget: u64, ranks: usize) -> Result<Choice<Knobs>, PlanError> {
        if self.lower_bases.is_empty() {
            self.choose_at_base(budget, ranks)
        } else {
            self.choose_over_bases(budget, ranks)
        }
    }

    /// [`Calibration::choose_on_ranks`] with the frozen base this
    /// calibration's probes ran with.
    pub(super) fn choose_at_base(&self, budget: u64, ranks: usize) -> Result<Choice<Knobs>, PlanError> {
        let margin = self.own_margin();
        let usable = self.model.pages_down(budget as f64 / (1.0 + margin));
        let mut plans = Vec::new();
        for mut knobs in self.space.combinations(ranks) {
            knobs.base = self.base;
            let chain = self.model.chain_for(&knobs);
            let (outside, scale, rest) = self.model.split(&knobs, self.space.batch);
            if outside > usable || rest > usable || scale <= 0.0 {
                continue;
            }
            if let Some(marks) = optimal(&chain, self.model.head_for(&knobs), (usable - outside) / scale) {
                knobs.checkpointed = marks;
                plans.push(self.plan(knobs));
            }
        }
        plans.sort_by(|a, b| (!a.exact()).cmp(&!b.exact()).then(a.step_ms.total_cmp(&b.step_ms)));
        let Some(first) = plans.first() else {
            return Err(self.infeasible(budget, ranks));
        };
        // Among plans of the winner's class within the timing noise of the
        // fastest, the one that turns the fewest knobs: a knob that does
        // not measurably pay is not worth its risk.
        let (class, limit) = (first.exact(), first.step_ms * (1.0 + TIME_NOISE));
        let pick = plans
            .iter()
            .enumerate()
            .take_while(|(_, p)| p.exact() == class && p.step_ms <= limit)
            .min_by_key(|(_, p)| p.setting.turned(self.space.batch))
            .map_or(0, |(i, _)| i);
        let winner = plans.remove(pick);
        plans.insert(0, winner);
        let best = &plans[0];
        let exact = plans.iter().filter(|p| p.exact()).count();
        let fastest = plans.iter().map(|p| p.step_ms).fold(f64::INFINITY, f64::min);
        let why = format!(
            "{}, of those that fit {} with a {:.0} % margin (predicted peak {}, {:.1} ms per step){}; {} plans fit, {} of them exact",
            match (best.exact(), pick) {
                (true, 0) => "the fastest numerically exact plan",
                (true, _) => "the numerically exact plan with the fewest knobs turned within 5 % of the fastest",
                (false, 0) => "no numerically exact plan fits: the fastest plan",
                (false, _) =>
                    "no numerically exact plan fits: the plan with the fewest knobs turned within 5 % of the fastest",
            },
            human_bytes(budget),
            margin * 100.0,
            human_bytes(best.peak_bytes),
            best.step_ms,
            if best.exact() && fastest < best.step_ms {
                format!(
                    "; a plan that changes the numerics is predicted {:.0} % faster",
                    (best.step_ms / fastest - 1.0) * 100.0
                )
            } else {
                String::new()
            },
            plans.len(),
            exact
        );
        Ok(Choice {
            budget,
            margin,
            plans,
            why,
        })
    }

    /// The plan with the least predicted peak.
    pub fn leanest(&self) -> Plan<Knobs> {
        self.leanest_on(1).expect("the space has at least one combination")
    }

    /// The plan with the least predicted peak per rank on `ranks` ranks
    /// (none where they cannot share the batch).
    pub fn leanest_on(&self, ranks: usize) -> Option<Plan<Knobs>> {
        self.bases()
            .filter_map(|c| c.leanest_at_base_on(ranks))
            .min_by(|a, b| a.peak_bytes.cmp(&b.peak_bytes).then(a.step_ms.total_cmp(&b.step_ms)))
    }

    /// The plan with the least predicted peak with the frozen base this
    /// calibration's probes ran with.
    pub fn leanest_at_base(&self) -> Plan<Knobs> {
        self.leanest_at_base_on(1)
            .expect("the space has at least one combination")
    }

    fn leanest_at_base_on(&self, ranks: usize) -> Option<Plan<Knobs>> {
        self.space
            .combinations(ranks)
            .into_iter()
            .map(|mut knobs| {
                knobs.base = self.base;
                let chain = self.model.chain_for(&knobs);
                let head = self.model.head_for(&knobs);
                let least = least_peak(&chain, head);
                knobs.checkpointed = optimal(&chain, head, least).unwrap_or_else(|| vec![true; chain.len()]);
                self.plan(knobs)
            })
            .min_by(|a, b| a.peak_bytes.cmp(&b.peak_bytes).then(a.step_ms.total_cmp(&b.step_ms)))
    }

    fn infeasible(&self, budget: u64, ranks: usize) -> PlanError {
        let Some(lean) = self.leanest_at_base_on(ranks) else {
            return PlanError::UnevenRanks {
                ranks,
                batch: self.space.batch,
            };
        };
        let margin = self.own_margin();
        // One byte over the threshold `choose` uses, rounded up to a MiB.
        let needed = (lean.peak_bytes as f64 * (1.0 + margin)).ceil() as u64 + 1;
        let smallest = needed.div_ceil(1 << 20) << 20;
        PlanError::Infeasible {
            budget: human_bytes(budget),
            least: human_bytes(lean.peak_bytes),
            knobs: lean.setting.describe(self.space.batch),
            margin: margin * 100.0,
            smallest: human_bytes(smallest),
            smallest_bytes: smallest,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::plan::chain::BlockCost;
    use crate::plan::{Calibration, Delta, Knobs, Model, Space, Strategy};
    use crate::precision::Precision;

    fn calibration() -> Calibration {
        Calibration {
            space: Space {
                batch: 16,
                blocks: 4,
                block_input_bytes: 100,
                precisions: vec![Precision::F32, Precision::Bf16],
                storage_groups: vec![("embed".into(), 1000)],
                low_moments: true,
                host_moments: false,
                batch_statistics: None,
                block_shapes: Vec::new(),
                fused_attention: Vec::new(),
                parameters: vec![300, 100, 100],
                bases: Vec::new(),
                work: None,
            },
            model: Model {
                fixed_bytes: 10_000.0,
                outside_bytes: 200.0,
                block: BlockCost {
                    activations: 1000.0,
                    input: 100.0,
                    recompute: 0.05,
                },
                head_bytes: 0.0,
                blocks: 4,
                block_shapes: Vec::new(),
                accumulator_bytes: 1000.0,
                precisions: vec![(Precision::Bf16, 0.6, 0.8, 0.0)],
                storage: Delta {
                    step: -500.0,
                    rest: -500.0,
                    between: -500.0,
                    ms: 0.1,
                },
                storage_share: vec![0.0, 1.0],
                moments: Delta {
                    step: -1000.0,
                    rest: -1000.0,
                    between: -1000.0,
                    ms: 0.1,
                },
                host_moments: Delta::default(),
                cleanup: Delta {
                    step: 0.0,
                    rest: 0.0,
                    between: 0.0,
                    ms: 1.0,
                },
                rest_bytes: 12_000.0,
                files_bytes: 0.0,
                between_bytes: 0.0,
                page_bytes: 1,
                least_probed_micro_batch: 0,
                below_probed_bytes: 0.0,
                floor_ms: 0.0,
                fixed_ms: 2.0,
                micro_batch_ms: 1.0,
                sample_ms: 0.5,
                fused_attention: None,
                parameters: vec![300, 100, 100],
            },
            probes: Vec::new(),
            checks: Vec::new(),
            peak_error: 0.01,
            shortfall: 0.01,
            time_error: 0.0,
            seconds: 0.0,
            probe_batch: 16,
            slice: None,
            tokens: None,
            base: None,
            lower_bases: Vec::new(),
        }
    }

    #[test]
    fn ample_budget_takes_the_plain_step_and_tight_ones_fit_with_the_margin() {
        let c = calibration();
        let plain = c.predict(&Knobs::base(4, 16)).0;
        let ample = c.choose(10 * plain as u64).unwrap();
        assert_eq!(ample.plans[0].setting, Knobs::base(4, 16));
        let mut budgets = Vec::new();
        for f in [0.9, 0.7, 0.5, 0.4] {
            let budget = (plain * f) as u64;
            match c.choose(budget) {
                Ok(choice) => {
                    for p in &choice.plans {
                        assert!(p.peak_bytes as f64 * (1.0 + choice.margin) <= budget as f64 + 1.0);
                    }
                    budgets.push((f, choice.plans[0].setting.describe(16)));
                }
                Err(e) => budgets.push((f, e.to_string())),
            }
        }
        assert!(budgets.iter().any(|(_, d)| d.contains("checkpoint")), "{budgets:?}");
    }

    #[test]
    fn a_budget_only_the_fused_attention_fits_gets_it() {
        let mut c = calibration();
        // Attention that dominates a block (the rest no longer decides).
        c.model.block.activations = 20_000.0;
        // Every knob but the attention: the leanest peak without it.
        let standard = c.leanest().peak_bytes;
        c.space.fused_attention = vec![Precision::F32];
        c.model.fused_attention = Some(crate::plan::FusedCosts {
            fixed_bytes: c.model.fixed_bytes + 500.0,
            outside_bytes: c.model.outside_bytes,
            block: BlockCost {
                activations: 1500.0,
                input: 100.0,
                recompute: 0.06,
            },
            fixed_ms: c.model.fixed_ms,
            sample_ms: 0.6,
            precisions: Vec::new(),
        });
        let lean = c.leanest();
        assert!(
            lean.setting.fused_attention && lean.peak_bytes < standard,
            "{standard} {lean:?}"
        );
        // Midway between the two leanest peaks.
        let budget = ((standard + lean.peak_bytes) as f64 / 2.0 * (1.0 + c.margin())) as u64;
        let choice = c.choose(budget).unwrap();
        assert!(
            choice.plans.iter().all(|p| p.setting.fused_attention),
            "{:?}",
            choice.plans[0]
        );
        // An exact plan: it outranks bf16 plans that fit without it.
        assert!(choice.plans[0].exact(), "{:?}", choice.plans[0]);
        // With room for every plan, the faster standard attention wins.
        let ample = c.choose(100 * standard).unwrap();
        assert!(!ample.plans[0].setting.fused_attention, "{:?}", ample.plans[0]);
    }

    #[test]
    fn infeasible_budget_names_a_budget_that_works() {
        let c = calibration();
        let e = c.choose(5_000).unwrap_err();
        let crate::plan::PlanError::Infeasible { smallest_bytes, .. } = e.clone() else {
            panic!("{e}")
        };
        // In the library's own words (no front end's flag), naming the bytes.
        assert!(
            e.to_string().contains(&format!("a budget of {smallest_bytes} bytes")),
            "{e}"
        );
        assert!(!e.to_string().contains("--"), "{e}");
        let choice = c.choose(smallest_bytes).unwrap();
        assert!(!choice.plans.is_empty());
        // Just under the leanest plan's peak plus the margin, nothing fits.
        let lean = c.leanest();
        assert!(
            c.choose((lean.peak_bytes as f64 * (1.0 + c.margin())) as u64 - 2)
                .is_err()
        );
    }

    /// Where the probes split the rest into the phases that write files
    /// (holding a copy of the state) and the others, a sharded rank's files
    /// phases lose the other ranks' moments twice and hold no exchange; the
    /// others lose them once beside the exchange; the rest is the larger.
    #[test]
    fn a_sharded_ranks_files_lose_the_moments_twice() {
        let mut c = calibration();
        let one = Knobs {
            micro_batch: 4,
            ..Knobs::base(4, 16)
        };
        let two = Knobs {
            ranks: 2,
            ..one.clone()
        };
        let unsplit = c.model.split(&two, 16).2;
        (c.model.files_bytes, c.model.between_bytes) = (12_000.0, 9_000.0);
        // Rank 0 keeps 300 of 500 values: 200 values' moments (8 bytes) saved.
        let (saved, exchange) = (8.0 * 200.0, 8.0 * 300.0);
        assert_eq!(c.model.split(&one, 16).2, 12_000.0, "one rank: the rest as probed");
        assert_eq!(
            unsplit,
            12_000.0 + exchange - saved,
            "no split: the exchange and one saving"
        );
        assert_eq!(
            c.model.split(&two, 16).2,
            (9_000.0 + exchange - saved).max(12_000.0 - 2.0 * saved)
        );
        c.model.between_bytes = 6_000.0;
        assert_eq!(
            c.model.split(&two, 16).2,
            12_000.0 - 2.0 * saved,
            "the files phase decides"
        );
    }

    /// On ranks the moments of the other ranks' parameters leave each
    /// rank's peak (8 bytes a value; 4 in bf16), and so does the other
    /// ranks' share of the accumulated gradients; the gradient exchange
    /// adds a copy of the largest parameter and a slice after each
    /// backward; each rank's compute is its share of the micro-batches.
    #[test]
    fn ranks_shard_the_moments_in_the_prediction() {
        let c = calibration();
        let base = Knobs {
            micro_batch: 4,
            ..Knobs::base(4, 16)
        };
        let on = |ranks: usize, low_moments: bool| Knobs {
            ranks,
            low_moments,
            ..base.clone()
        };
        // Parameters of 300, 100 and 100 values: rank 0 keeps 300, rank 1 200.
        assert_eq!(crate::optim::shard_loads(&[300, 100, 100], 2), vec![300, 200]);
        let (one, two) = (c.model.split(&on(1, false), 16), c.model.split(&on(2, false), 16));
        // Two micro-batches a rank: the accumulator keeps rank 0's 300 of 500 values.
        let accumulator = c.model.accumulator_bytes * (1.0 - 300.0 / 500.0);
        let exchange = 8.0 * 300.0;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(
            close(two.0 - one.0, exchange - 8.0 * 200.0 - accumulator),
            "step part: a copy of 300 values and a slice of them, less the other rank's 200 values' moments and \
             accumulated gradients: {}",
            two.0 - one.0
        );
        assert_eq!(
            two.2 - one.2,
            exchange - 8.0 * 200.0,
            "rest: a copy of 300 values and a slice of them, less the other rank's moments"
        );
        let low = (c.model.split(&on(1, true), 16).0, c.model.split(&on(2, true), 16).0);
        assert!(close(low.1 - low.0, exchange - 4.0 * 200.0 - accumulator));
        // Four micro-batches over two ranks: each rank's compute halves.
        let t1 = c.predict(&on(1, false)).1 - c.model.fixed_ms;
        let t2 = c.predict(&on(2, false)).1 - c.model.fixed_ms;
        assert!((t1 - 2.0 * t2).abs() < 1e-9, "{t1} {t2}");
        // Three ranks cannot share a batch of 16's micro-batches: no plan, said so.
        let e = c.choose_on_ranks(u64::MAX, 3).unwrap_err().to_string();
        assert!(e.contains("3 ranks cannot share a batch of 16 evenly"), "{e}");
        let plain = c.choose(u64::MAX).unwrap().plans[0].peak_bytes;
        let sharded = c.choose_on_ranks(u64::MAX, 2).unwrap();
        assert!(sharded.plans.iter().all(|p| p.setting.ranks == 2));
        assert!(sharded.plans.iter().map(|p| p.peak_bytes).min().unwrap() < plain);
    }
}
