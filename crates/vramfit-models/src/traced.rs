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
/// little as it must: the largest value at which the card's leanest plan
/// fits is found by bisection (a trace of that plan each), and the search
/// is run again there; the row says what was given up.
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
    // Each card none fits: the largest lower value its leanest plan fits at.
    let mut lowered: Vec<(usize, vramfit::plan::quality::GivenUp)> = Vec::new();
    for (c, row) in out.rows.iter().enumerate() {
        let (Some(false), Some(leanest)) = (row.fits, &row.leanest) else {
            continue;
        };
        let card = &cards[c];
        let space = crate::plan::space_of::<Autodiff<Shapes>, F, D>(&config, &ShapeDevice)?;
        let given = knob.largest(|value| -> Result<bool, TrainError> {
            let Some(task) = F::with_quality(&config.task, value) else {
                return Ok(false);
            };
            let at = FamilyConfig { task, ..config.clone() };
            let settings = crate::plan::apply(&at, leanest, at.batch_size, &space);
            let Ok(traced) = trace_settings(settings, TRACED_STEPS) else {
                return Ok(false);
            };
            out.plans_traced += 1;
            out.operations += traced.operations;
            Ok(vramfit::pools::replay(&traced.trace, &card.allocator).is_ok_and(|r| {
                r.reserved_peak as f64 * (1.0 + vramfit::plan::traced::TRACE_MARGIN) <= card.memory_bytes as f64
            }))
        })?;
        if let Some(given) = given {
            lowered.push((c, given));
        }
    }
    // The search again at each value found, for the cards it was found for.
    let mut values: Vec<usize> = lowered.iter().map(|(_, g)| g.planned).collect();
    values.sort_unstable();
    values.dedup();
    for value in values {
        let which: Vec<usize> = lowered.iter().filter(|(_, g)| g.planned == value).map(|(c, _)| *c).collect();
        let task = F::with_quality(&config.task, value).expect("found above");
        let at = FamilyConfig { task, ..config.clone() };
        let subset: Vec<Card> = which.iter().map(|&c| cards[c].clone()).collect();
        let again = traced_at(&at, &subset)?;
        out.plans_traced += again.plans_traced;
        out.operations += again.operations;
        for (mut row, &c) in again.rows.into_iter().zip(&which) {
            row.quality = lowered.iter().find(|(i, _)| *i == c).map(|(_, g)| g.clone());
            out.rows[c] = row;
        }
    }
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

/// [`traced_cards`] at the quality `config` asks for.
fn traced_at<F: Family<D>, const D: usize>(config: &FamilyConfig<F>, cards: &[Card]) -> Result<TracedCards, TrainError> {
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
    let trace = |knobs: &Knobs| -> Result<ShapesTraced, String> {
        let settings = crate::plan::apply(&config, knobs, config.batch_size, &space);
        let traced = trace_settings(settings, TRACED_STEPS).map_err(|e| e.to_string())?;
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
