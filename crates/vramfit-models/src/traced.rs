//! A model family's plan for each card from traces on shapes alone
//! ([`vramfit::plan::traced`]): the model is built and its steps run on
//! [`vramfit::shapes::Shapes`], which computes nothing, so a 7B at 2,048
//! tokens is traced in a fraction of a second on any machine, whatever
//! its memory.

use std::time::Instant;

use burn::backend::Autodiff;
use vramfit::plan::Knobs;
use vramfit::plan::traced::{TRACED_STEPS, TracedRow, candidates, rows};
use vramfit::pools::{Card, ShapeTraceError, ShapesTraced, trace_shapes};
use vramfit::run::{RunPath, Start};
use vramfit::shapes::{ShapeDevice, Shapes};

use crate::config::FamilyConfig;
use crate::family::Family;
use crate::job::TrainError;

/// The rows and what it took.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TracedCards {
    /// One per card.
    pub rows: Vec<TracedRow>,
    /// Plans traced.
    pub plans_traced: usize,
    /// Operations described in all the traces.
    pub operations: u64,
    /// Seconds it took, traces and replays.
    pub seconds: f64,
}

/// Each card's plan for `config`: every plan of the traced search traced
/// once on shapes and replayed for each card. Where none fits a card at
/// the quality asked, and `keep_quality` is not set, the family's quality
/// knob ([`crate::family::ModelSettings::quality_knob`]) is lowered as
/// little as it must: a bisection over its values, each tried with the
/// card's [`vramfit::plan::traced::LEANEST_KEPT`] leanest plans at the asked value (a trace of
/// each), then the whole search one value up and at the value found (one
/// up fitting, the value rises again): a lowered row is the fastest plan
/// at the most the card holds, and no plan fits one value more.
pub fn traced_cards<F: Family<D>, const D: usize>(
    config: FamilyConfig<F>,
    cards: &[Card],
) -> Result<TracedCards, TrainError> {
    let start = Instant::now();
    let mut out = traced_at(&config, cards)?;
    let knob = match config.model.quality_knob(&config.task) {
        Some(k) if !config.keep_quality && !k.lower.is_empty() => k,
        _ => return Ok(out),
    };
    let space = crate::plan::space_of::<Autodiff<Shapes>, F, D>(&config, &ShapeDevice)?;
    let at = |value: usize| F::with_quality(&config.task, value).map(|task| FamilyConfig { task, ..config.clone() });
    for (c, card) in cards.iter().enumerate() {
        if out.rows[c].fits != Some(false) || out.rows[c].leanest.is_empty() {
            continue;
        }
        let leanest = out.rows[c].leanest.clone();
        let (mut traced, mut operations) = (0, 0);
        let given = knob.largest(|value| -> Result<bool, TrainError> {
            let Some(at) = at(value) else {
                return Ok(false);
            };
            for knobs in &leanest {
                let settings = crate::plan::apply(&at, knobs, at.batch_size, &space);
                let Ok(t) = trace_settings(settings, TRACED_STEPS) else {
                    continue;
                };
                traced += 1;
                operations += t.operations;
                let fits = vramfit::pools::replay(&t.trace, &card.allocator).is_ok_and(|r| {
                    r.reserved_peak as f64 * (1.0 + vramfit::plan::traced::TRACE_MARGIN) <= card.memory_bytes as f64
                });
                if fits {
                    return Ok(true);
                }
            }
            Ok(false)
        })?;
        out.plans_traced += traced;
        out.operations += operations;
        let Some(mut given) = given else {
            continue;
        };
        // The whole search one value up: another plan may fit there.
        let mut row = None;
        let values: Vec<usize> = knob.lower.iter().copied().filter(|&v| v > given.planned).collect();
        for &up in &values {
            let searched = traced_at(&at(up).expect("a lower value"), std::slice::from_ref(card))?;
            out.plans_traced += searched.plans_traced;
            out.operations += searched.operations;
            let found = searched.rows.into_iter().next().expect("one card");
            if found.fits != Some(true) {
                break;
            }
            given.planned = up;
            row = Some(found);
        }
        let mut row = match row {
            Some(r) => r,
            None => {
                let searched = traced_at(&at(given.planned).expect("found above"), std::slice::from_ref(card))?;
                out.plans_traced += searched.plans_traced;
                out.operations += searched.operations;
                searched.rows.into_iter().next().expect("one card")
            }
        };
        row.quality = Some(given);
        out.rows[c] = row;
    }
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

/// [`traced_cards`] at the quality `config` asks for.
fn traced_at<F: Family<D>, const D: usize>(
    config: &FamilyConfig<F>,
    cards: &[Card],
) -> Result<TracedCards, TrainError> {
    type S = Autodiff<Shapes>;
    let config = config.clone();
    let start = Instant::now();
    config.resolve::<S>(&ShapeDevice)?;
    config.model.data(&config.task)?;
    let space = crate::plan::space_of::<S, F, D>(&config, &ShapeDevice)?;
    // f16 plans only where a card has no bf16 (the same bytes as bf16's).
    let keep_f16 = cards.iter().any(|c| !vramfit::pools::Rates::has_bf16(&c.name));
    let plans = candidates(&space, keep_f16);
    let mut operations = 0;
    let trace = |knobs: &Knobs| -> Result<ShapesTraced, ShapeTraceError> {
        let settings = crate::plan::apply(&config, knobs, config.batch_size, &space);
        let traced = trace_settings(settings, TRACED_STEPS)?;
        operations += traced.operations;
        Ok(traced)
    };
    let rows = rows(&space, &plans, cards, |k| k.describe(space.batch), trace);
    Ok(TracedCards {
        rows,
        plans_traced: plans.len(),
        operations,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The first `steps` steps of a run of `config` traced on shapes, in a
/// throw-away run directory.
pub fn trace_settings<F: Family<D>, const D: usize>(
    mut config: FamilyConfig<F>,
    steps: u64,
) -> Result<ShapesTraced, ShapeTraceError> {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    config.steps = steps;
    config.checkpoint_every = 0;
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("vramfit-shapes-{}-{n}", std::process::id()));
    let traced = trace_shapes(
        || {
            crate::job::start::<Autodiff<Shapes>, F, D>(
                Start::New(config, RunPath::At(dir.clone())),
                &ShapeDevice,
                "shapes",
            )
        },
        steps,
        // CUDA's pools align to 512 bytes: a slice is a view where its ends fall on it.
        512,
    );
    let _ = std::fs::remove_dir_all(&dir);
    traced
}
