//! Each card's plan chosen from traces on shapes alone
//! ([`crate::pools::trace_shapes`]): every plan of the search traced at the
//! job's full size, nothing computed and nothing probed, replayed through
//! each card's own pools ([`crate::pools::replay`]) for the figure that
//! decides its out-of-memory, and timed by the card's roofline
//! ([`crate::pools::Rates`], an estimate). For a card, the fastest plan
//! by that estimate whose replayed peak with [`TRACE_MARGIN`] fits, at
//! the best frozen-base storage where any fits (quality is given up only
//! where nothing fits at the better one). Jobs and cards that are not on
//! this machine, at any size, in the time the operations take to describe.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{Knobs, Runnable, Space, Strategy};
use crate::pools::{Card, Rates, ReplayError, ShapeTraceError, ShapesTraced, replay, trace_shapes};
use crate::profile::human_bytes;
use crate::run::{RunPath, Start};

/// The margin a replayed peak must leave on the card: above the largest
/// error measured against a card's recorded peak (an H100's run, +0.59 %;
/// an H200's, +0.43 %; lavapipe's seven, 0) and room for what a trace does
/// not see (below).
pub const TRACE_MARGIN: f64 = 0.05;

/// What the trace cannot see, said in every row.
pub const NOT_SEEN: &str = "the CUDA context and the driver's own memory (outside the allocator's pools: a few hundred \
                            MB a process), kernels' private workspaces, and other processes on the card";

/// The plans the traced search looks at: every precision, micro-batch,
/// attention and frozen-base storage the space offers, moments in f32 or
/// bf16 (where offered), with no block, every other block or every block
/// checkpointed. Left out (a whole-model trace each, for little more
/// memory): f16 where bf16 is offered (the same bytes, and loss scaling
/// besides) unless `keep_f16` (a card without bf16 is asked for),
/// trainable groups in bf16, moments on the host, the allocator cleanup,
/// ranks.
pub fn candidates(space: &Space, keep_f16: bool) -> Vec<Knobs> {
    let bases: Vec<Option<crate::frozen::BaseStorage>> = if space.bases.is_empty() {
        vec![None]
    } else {
        space.bases.iter().copied().map(Some).collect()
    };
    let mut checkpoints = vec![vec![false; space.blocks]];
    if space.blocks > 1 {
        checkpoints.push((0..space.blocks).map(|i| i % 2 == 0).collect());
    }
    if space.blocks > 0 {
        checkpoints.push(vec![true; space.blocks]);
    }
    let mut out = Vec::new();
    for base in &bases {
        for knobs in space.combinations(1) {
            let f16_twin = !keep_f16
                && knobs.precision == crate::precision::Precision::F16
                && space.precisions.contains(&crate::precision::Precision::Bf16);
            if knobs.low_storage > 0 || knobs.host_moments || knobs.cleanup || f16_twin {
                continue;
            }
            for checkpointed in &checkpoints {
                out.push(Knobs {
                    checkpointed: checkpointed.clone(),
                    base: *base,
                    ..knobs.clone()
                });
            }
        }
    }
    out
}

/// One card's row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TracedRow {
    /// As named (`h100-80`, `24`).
    pub card: String,
    /// Its memory.
    pub card_bytes: u64,
    /// Whether a plan fits; `None` where no plan could be traced.
    pub fits: Option<bool>,
    /// The plan, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Its knobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setting: Option<Knobs>,
    /// Its replayed reserved peak on this card: what decides the card's
    /// out-of-memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    /// The most bytes its tensors held at once (no pages).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_use_bytes: Option<u64>,
    /// Estimated milliseconds a step on this card by its roofline (none
    /// for a card given by its size).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ms_estimate: Option<f64>,
    /// The margin held.
    pub margin: f64,
    /// `traced`.
    pub basis: String,
    /// What the figures rest on.
    pub rests_on: String,
    /// How the time was estimated and plans ranked.
    pub time_basis: String,
    /// What the trace cannot see.
    pub not_seen: String,
    /// Plans considered before the one chosen, each with why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passed_over: Vec<String>,
    /// Why none fits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    /// The quality the plan gives up, where nothing fits at the asked
    /// quality and the run allows it ([`super::quality`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<super::quality::GivenUp>,
    /// Where none fits: the plans whose replayed peaks on this card are
    /// the least ([`LEANEST_KEPT`] of them, the leanest first): what a
    /// lower quality is tried with first.
    #[serde(skip)]
    pub leanest: Vec<Knobs>,
}

/// Plans a row none fits keeps as its leanest.
pub const LEANEST_KEPT: usize = 8;

/// Plans named in a row's `passed_over` at most.
const PASSED_OVER_SHOWN: usize = 8;

/// Steps each plan is traced for: the pools reach their high-water within
/// three (a third step moved lavapipe's peak by a page; `pools_trace`).
pub const TRACED_STEPS: u64 = 3;

/// The traced rows for `cards`: each plan of `candidates` traced once by
/// `trace` (its first [`TRACED_STEPS`] steps), named by `describe`.
pub fn rows(
    space: &Space,
    candidates: &[Knobs],
    cards: &[Card],
    describe: impl Fn(&Knobs) -> String,
    mut trace: impl FnMut(&Knobs) -> Result<ShapesTraced, ShapeTraceError>,
) -> Vec<TracedRow> {
    let traced: Vec<(Knobs, Result<ShapesTraced, ShapeTraceError>)> =
        candidates.iter().map(|k| (k.clone(), trace(k))).collect();
    let bases: Vec<Option<crate::frozen::BaseStorage>> = if space.bases.is_empty() {
        vec![None]
    } else {
        space.bases.iter().copied().map(Some).collect()
    };
    let mut replays: HashMap<(usize, usize), Result<crate::pools::Replayed, ReplayError>> = HashMap::new();
    cards
        .iter()
        .enumerate()
        .map(|(c, card)| {
            let named = Rates::of(&card.name);
            let rates = named.unwrap_or_else(|| Rates::of(Rates::NOMINAL_CARD).expect("the nominal card's rates"));
            let time_basis = match named {
                Some(_) => format!(
                    "estimated: each traced kernel at the {}'s published peak rate or memory bandwidth, whichever is \
                     slower, plus 5 µs a launch (real kernels reach a fraction of either)",
                    card.name
                ),
                None => format!(
                    "plans ranked by a roofline at the {}'s published rates (a card given by its size has none of \
                     its own); no time shown",
                    Rates::NOMINAL_CARD
                ),
            };
            let mut row = TracedRow {
                card: card.name.clone(),
                card_bytes: card.memory_bytes,
                fits: None,
                plan: None,
                setting: None,
                peak_bytes: None,
                in_use_bytes: None,
                step_ms_estimate: None,
                margin: TRACE_MARGIN,
                basis: "traced".into(),
                rests_on: format!(
                    "each plan's first {TRACED_STEPS} steps traced at full size on shapes alone (nothing computed), \
                     replayed through the CubeCL pools the {} client makes",
                    card.name
                ),
                time_basis,
                not_seen: NOT_SEEN.into(),
                passed_over: Vec::new(),
                why_not: None,
                quality: None,
                leanest: Vec::new(),
            };
            let mut decided = 0;
            let mut failures = Vec::new();
            'bases: for base in &bases {
                let bf16 = Rates::has_bf16(&card.name);
                let mut order: Vec<(usize, f64)> = traced
                    .iter()
                    .enumerate()
                    .filter(|(_, (k, _))| k.base == *base)
                    // A card without bf16 runs none of its plans.
                    .filter(|(_, (k, _))| {
                        bf16 || (k.precision != crate::precision::Precision::Bf16
                            && k.base != Some(crate::frozen::BaseStorage::Bf16))
                    })
                    .filter_map(|(i, (_, t))| match t {
                        Ok(t) => Some((i, rates.step_ms(&t.step_work))),
                        Err(e) => {
                            failures.push(e.to_string());
                            None
                        }
                    })
                    .collect();
                order.sort_by(|a, b| a.1.total_cmp(&b.1));
                for (i, ms) in order {
                    let (knobs, t) = &traced[i];
                    let t = t.as_ref().expect("kept above");
                    let replayed = replays
                        .entry((c, i))
                        .or_insert_with(|| replay(&t.trace, &card.allocator))
                        .clone();
                    let name = describe(knobs);
                    match replayed {
                        Ok(r) if r.reserved_peak as f64 * (1.0 + TRACE_MARGIN) <= card.memory_bytes as f64 => {
                            decided += 1;
                            row.fits = Some(true);
                            row.plan = Some(name);
                            row.setting = Some(knobs.clone());
                            row.peak_bytes = Some(r.reserved_peak);
                            row.in_use_bytes = Some(r.in_use_peak);
                            row.step_ms_estimate = named.map(|_| ms);
                            break 'bases;
                        }
                        Ok(r) => {
                            decided += 1;
                            if row.passed_over.len() < PASSED_OVER_SHOWN {
                                row.passed_over.push(format!(
                                    "{name}: replayed {} with the {:.0} % margin, over the card",
                                    human_bytes(r.reserved_peak),
                                    100.0 * TRACE_MARGIN
                                ));
                            }
                        }
                        Err(e) => {
                            decided += 1;
                            if row.passed_over.len() < PASSED_OVER_SHOWN {
                                row.passed_over.push(format!("{name}: on this card {e}"));
                            }
                        }
                    }
                }
            }
            if row.fits.is_none() {
                if decided == 0 {
                    row.why_not = Some(format!(
                        "no plan could be traced: {}",
                        failures.first().map(String::as_str).unwrap_or("no plans")
                    ));
                } else {
                    // Every traced plan was replayed for this card on the way.
                    let mut lean: Vec<(u64, usize)> = replays
                        .iter()
                        .filter(|((card, _), _)| *card == c)
                        .filter_map(|((_, i), r)| r.as_ref().ok().map(|r| (r.reserved_peak, *i)))
                        .collect();
                    lean.sort_unstable();
                    row.leanest = lean.iter().take(LEANEST_KEPT).map(|&(_, i)| traced[i].0.clone()).collect();
                    let leanest = lean.first().map(|&(p, _)| p);
                    row.fits = Some(false);
                    row.why_not = Some(match leanest {
                        Some(p) => format!(
                            "none of the {decided} plans traced fits: the leanest reserves {} on this card, {} with \
                             the {:.0} % margin",
                            human_bytes(p),
                            human_bytes((p as f64 * (1.0 + TRACE_MARGIN)) as u64),
                            100.0 * TRACE_MARGIN
                        ),
                        None => format!("none of the {decided} plans traced fits: every one has a buffer larger than the card's largest page"),
                    });
                }
            }
            row
        })
        .collect()
}

/// Each card's plan for `target`, a workload whose runs are on the shape
/// backend (a user's model: `TrainerTarget<Autodiff<Shapes>, …>` built on
/// `ShapeDevice`), `space` its knobs: each candidate launched in a
/// throw-away folder and its first [`TRACED_STEPS`] steps traced.
/// `alignment`: the cards' allocator's (512 on CUDA). No block need repeat:
/// the whole model is traced.
pub fn rows_of<T>(target: &T, space: &Space, cards: &[Card], alignment: u64) -> Vec<TracedRow>
where
    T: Runnable,
    T::Strategy: Strategy<Setting = Knobs>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let plans = candidates(space, cards.iter().any(|c| !Rates::has_bf16(&c.name)));
    let trace = |knobs: &Knobs| -> Result<ShapesTraced, ShapeTraceError> {
        let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("vramfit-traced-{}-{n}", std::process::id()));
        let settings = target.settings(knobs);
        let traced = trace_shapes(
            || target.launch(Start::New(settings, RunPath::At(dir.clone()))),
            TRACED_STEPS,
            alignment,
        );
        let _ = std::fs::remove_dir_all(&dir);
        traced
    };
    rows(space, &plans, cards, |k| k.describe(space.batch), trace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frozen::BaseStorage;
    use crate::pools::{Event, Trace};
    use crate::precision::Precision;
    use crate::shapes::OpWork;

    const MIB: u64 = 1 << 20;

    fn space(bases: Vec<BaseStorage>) -> Space {
        Space {
            batch: 2,
            blocks: 2,
            block_input_bytes: 0,
            precisions: vec![Precision::F32],
            storage_groups: Vec::new(),
            low_moments: false,
            host_moments: false,
            batch_statistics: None,
            block_shapes: Vec::new(),
            fused_attention: Vec::new(),
            parameters: Vec::new(),
            bases,
            work: None,
        }
    }

    /// A trace that holds `mib` MiB at once in buffers of 10 MiB, its step
    /// `flops` of f32 products.
    fn traced(mib: u64, flops: f64) -> ShapesTraced {
        ShapesTraced {
            trace: Trace {
                events: (0..mib / 10)
                    .map(|_| Event::Reserve {
                        bytes: 10 * MIB,
                        persistent: false,
                    })
                    .collect(),
            },
            operations: 1,
            reads: 0,
            step_work: vec![OpWork {
                flops,
                half: false,
                bytes: 1.0,
                host_bytes: 0.0,
            }],
        }
    }

    /// A plan's size and time by its knobs: checkpointing halves the bytes
    /// and adds a third of the time; NF4 quarters the bytes.
    fn by_knobs(k: &Knobs) -> ShapesTraced {
        let mut mib = 3000.0;
        let mut flops = 3e12;
        if k.checkpointed.iter().all(|c| *c) {
            mib /= 2.0;
            flops *= 4.0 / 3.0;
        }
        if k.base == Some(BaseStorage::Nf4) {
            mib /= 4.0;
        }
        if k.micro_batch == 1 {
            mib *= 0.9;
            flops *= 1.1;
        }
        traced(mib as u64, flops)
    }

    #[test]
    fn each_card_gets_the_fastest_plan_that_fits_at_the_best_base_that_does() {
        let space = space(vec![BaseStorage::F32, BaseStorage::Nf4]);
        let plans = candidates(&space, false);
        // 2 bases × 2 micro-batches × 3 checkpoint sets.
        assert_eq!(plans.len(), 12);
        let cards = [
            Card::named("h100-80").unwrap(),
            Card::cuda("2 GiB", 2 << 30),
            Card::cuda("1 GiB", 1 << 30),
            Card::cuda("1 MiB", MIB),
        ];
        let rows = rows(&space, &plans, &cards, |k| k.describe(2), |k| Ok(by_knobs(k)));
        let setting = |r: &TracedRow| r.setting.clone().unwrap();
        // Room for all: nothing checkpointed, the whole batch at once, f32.
        let big = setting(&rows[0]);
        assert!(big.checkpointed.iter().all(|c| !c) && big.micro_batch == 2 && big.base == Some(BaseStorage::F32));
        assert!(rows[0].step_ms_estimate.unwrap() > 0.0);
        // 2 GiB: 3000 MiB does not fit, 1500 does: checkpointed, the base kept in f32.
        let two = setting(&rows[1]);
        assert_eq!((two.checkpointed[0], two.base), (true, Some(BaseStorage::F32)));
        assert!(rows[1].step_ms_estimate.is_none(), "a card by size has no time");
        // 1 GiB: nothing fits in f32, so the base goes to NF4, at its fastest
        // plan there (750 MiB + 5 % fits: nothing checkpointed).
        let one = setting(&rows[2]);
        assert_eq!(one.base, Some(BaseStorage::Nf4));
        assert!(one.checkpointed.iter().all(|c| !c) && one.micro_batch == 2);
        for r in &rows[..3] {
            assert!(
                r.peak_bytes.unwrap() as f64 * (1.0 + TRACE_MARGIN) <= r.card_bytes as f64,
                "{r:?}"
            );
        }
        // 1 MiB: nothing fits, and why.
        assert_eq!(rows[3].fits, Some(false));
        assert!(
            rows[3].why_not.as_deref().unwrap().contains("none of the"),
            "{:?}",
            rows[3]
        );
        assert!(!rows[3].passed_over.is_empty());
    }

    #[test]
    fn a_card_without_bf16_gets_no_bf16_plan() {
        let mut space = space(vec![BaseStorage::Bf16, BaseStorage::Nf4]);
        space.precisions = vec![Precision::F32, Precision::Bf16, Precision::F16];
        assert!(!candidates(&space, false).iter().any(|k| k.precision == Precision::F16));
        let plans = candidates(&space, true);
        assert!(plans.iter().any(|k| k.precision == Precision::F16));
        // 16-bit products are faster: a card with bf16 takes them.
        let fast_half = |k: &Knobs| {
            let mut t = by_knobs(k);
            if k.precision != Precision::F32 {
                t.step_work[0].half = true;
            }
            Ok(t)
        };
        let cards = [Card::named("t4").unwrap(), Card::named("l4").unwrap()];
        let rows = rows(&space, &plans, &cards, |k| k.describe(2), fast_half);
        let t4 = rows[0].setting.clone().unwrap();
        assert!(
            t4.precision != Precision::Bf16 && t4.base != Some(BaseStorage::Bf16),
            "{t4:?}"
        );
        assert_eq!(t4.precision, Precision::F16);
        assert_eq!(rows[1].setting.clone().unwrap().base, Some(BaseStorage::Bf16));
    }

    #[test]
    fn a_plan_that_cannot_be_traced_is_said() {
        let space = space(Vec::new());
        let plans = candidates(&space, false);
        let cards = [Card::cuda("24", 24 << 30)];
        let rows = rows(
            &space,
            &plans,
            &cards,
            |k| k.describe(2),
            |_| Err(ShapeTraceError::Build("an op refused".into())),
        );
        assert_eq!(rows[0].fits, None);
        assert!(rows[0].why_not.as_deref().unwrap().contains("an op refused"));
    }
}
