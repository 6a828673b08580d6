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

use super::{Knobs, Space};
use crate::pools::{Card, Rates, ReplayError, ShapesTraced, replay};
use crate::profile::human_bytes;

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
/// besides), trainable groups in bf16, moments on the host, the allocator
/// cleanup, ranks.
pub fn candidates(space: &Space) -> Vec<Knobs> {
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
            let f16_twin = knobs.precision == crate::precision::Precision::F16
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
}

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
    mut trace: impl FnMut(&Knobs) -> Result<ShapesTraced, String>,
) -> Vec<TracedRow> {
    let traced: Vec<(Knobs, Result<ShapesTraced, String>)> = candidates.iter().map(|k| (k.clone(), trace(k))).collect();
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
            };
            let mut decided = 0;
            let mut failures = Vec::new();
            'bases: for base in &bases {
                let mut order: Vec<(usize, f64)> = traced
                    .iter()
                    .enumerate()
                    .filter(|(_, (k, _))| k.base == *base)
                    .filter_map(|(i, (_, t))| match t {
                        Ok(t) => Some((i, rates.step_ms(&t.step_work))),
                        Err(e) => {
                            failures.push(e.clone());
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
                    let leanest = replays
                        .iter()
                        .filter(|((card, _), _)| *card == c)
                        .filter_map(|(_, r)| r.as_ref().ok())
                        .map(|r| r.reserved_peak)
                        .min();
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
