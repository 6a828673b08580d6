//! `vramfit bench slice`: how far the planner's extrapolation from a depth
//! slice is from the whole model measured. The slice is calibrated
//! exactly as `plan llm --probe-blocks K` does; then every plan of a fixed
//! list (chosen before any figure is seen, never tuned on them) is
//! predicted at the whole depth and measured on the whole model. With
//! `--probe-tokens T` the slice is probed at `T` and `2T` tokens and the
//! predictions extrapolated to the run's length too. Each plan is also
//! traced whole on shapes (nothing computed, [`vramfit_models::traced`]):
//! the most tensor bytes it holds at once, against the measured peak (on
//! the CPU the heap holds the tensors and a little besides) and the slice's.

use std::path::PathBuf;

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;
use serde_json::json;
use vramfit::plan::{Knobs, Plannable, Runnable, calibrate};
use vramfit::profile::{DeviceMemory, human_bytes};
use vramfit_models::config::FamilyConfig;
use vramfit_models::llama::LlamaConfig;
use vramfit_models::plan::FamilyTarget;

use crate::device::{OnBackend, on_device};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    settings: crate::flags::TrainSettings,
    /// Blocks of the probed slice.
    #[arg(long, default_value_t = 2, value_parser = crate::flags::parse_count::<usize>)]
    probe_blocks: usize,
    /// Probe at this many tokens a sample (and twice it) and extrapolate to
    /// the run's (0: at the run's).
    #[arg(long, default_value_t = 0, value_parser = crate::flags::parse_count::<usize>)]
    probe_tokens: usize,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// JSON output (a .md table is written beside it).
    #[arg(long, default_value = "bench-results/slice.json")]
    out: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    crate::budget::check_bench_out(&args.out)?;
    let config = crate::flags::resolve_train::<LlamaConfig>(&args.settings)?;
    on_device(
        &args.device.name,
        Bench {
            config,
            probe_blocks: args.probe_blocks,
            probe_tokens: args.probe_tokens,
            out: args.out,
        },
    )
}

struct Bench {
    config: FamilyConfig<LlamaConfig>,
    probe_blocks: usize,
    probe_tokens: usize,
    out: PathBuf,
}

/// The plans measured: the plain step, every block checkpointed, the batch
/// in micro-batches of one, the attention fused, every group stored in
/// bf16, and bf16 moments, where the space offers each.
fn plans(space: &vramfit::plan::Space) -> Vec<(&'static str, Knobs)> {
    let (n, batch) = (space.blocks, space.batch);
    let base = Knobs::base(n, batch);
    let mut out = vec![
        ("plain", base.clone()),
        (
            "checkpoint all",
            Knobs {
                checkpointed: vec![true; n],
                ..base.clone()
            },
        ),
    ];
    if batch > 1 {
        out.push((
            "micro-batches of one",
            Knobs {
                micro_batch: 1,
                ..base.clone()
            },
        ));
    }
    if !space.fused_attention.is_empty() {
        out.push((
            "attention fused",
            Knobs {
                fused_attention: true,
                ..base.clone()
            },
        ));
    }
    if !space.storage_groups.is_empty() {
        out.push((
            "storage bf16 (every group)",
            Knobs {
                low_storage: space.storage_groups.len(),
                ..base.clone()
            },
        ));
    }
    if space.low_moments && space.parameters.iter().sum::<usize>() > 0 {
        out.push((
            "moments bf16",
            Knobs {
                low_moments: true,
                ..base.clone()
            },
        ));
    }
    out
}

impl OnBackend for Bench {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend,
        B::InnerBackend: DeviceMemory,
    {
        let depth = self.config.model.depth;
        eprintln!(
            "bench slice: calibrating a {}-block slice of the {depth}-block model on {name}…",
            self.probe_blocks
        );
        let mut sliced = FamilyTarget::<B, LlamaConfig, 3>::sliced(self.config.clone(), device, self.probe_blocks)?;
        if self.probe_tokens > 0 {
            sliced = sliced.with_probe_tokens(self.probe_tokens)?;
        }
        let cal = calibrate(&mut sliced, None)?;
        drop(sliced);
        eprintln!("measuring the whole model on each plan…");
        let mut whole = FamilyTarget::<B, LlamaConfig, 3>::new(self.config.clone(), device)?;
        let batch = cal.space.batch;
        let mut table = String::from(
            "| plan | peak predicted from the slice | peak measured, whole model | error | traced on shapes (tensor \
             bytes at once) | error | forward and backward: predicted | measured | error | step ms predicted | \
             step ms measured |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let mut rows = Vec::new();
        let mut times = Vec::new();
        let (mut worst, mut worst_step): (f64, f64) = (0.0, 0.0);
        for (label, knobs) in plans(&cal.space) {
            let (peak, ms) = cal.predict(&knobs);
            let (step, _) = cal.at_base(knobs.base).model.parts(&knobs, batch);
            let measured = whole.measure(&knobs, batch)?;
            let started = std::time::Instant::now();
            let traced = vramfit_models::traced::trace_settings(whole.settings(&knobs), vramfit::plan::PROBE_STEPS)?;
            let traced_seconds = started.elapsed().as_secs_f64();
            let traced_peak = traced.trace.in_use_peak();
            let traced_error = traced_peak as f64 / measured.peak_bytes as f64 - 1.0;
            times.push((ms, measured.step_ms));
            let error = peak / measured.peak_bytes as f64 - 1.0;
            let step_error = step / measured.step_peak_bytes as f64 - 1.0;
            worst = worst.max(error.abs());
            worst_step = worst_step.max(step_error.abs());
            table.push_str(&format!(
                "| {label} ({}) | {} | {} | {:+.2} % | {} | {:+.2} % | {} | {} | {:+.2} % | {ms:.0} | {:.0} |\n",
                knobs.describe(batch),
                human_bytes(peak as u64),
                human_bytes(measured.peak_bytes),
                error * 100.0,
                human_bytes(traced_peak),
                traced_error * 100.0,
                human_bytes(step as u64),
                human_bytes(measured.step_peak_bytes),
                step_error * 100.0,
                measured.step_ms
            ));
            rows.push(json!({
                "plan": label, "knobs": knobs, "predicted_peak_bytes": peak, "predicted_step_peak_bytes": step,
                "measured": measured, "peak_error": error, "step_peak_error": step_error, "predicted_step_ms": ms,
                "traced_in_use_bytes": traced_peak, "traced_error": traced_error, "traced_seconds": traced_seconds,
            }));
        }
        let slice = cal.slice.as_ref().expect("calibrated from a slice");
        let summary = format!(
            "{}-block slice of a {depth}-block model on {name}: calibration {:.0} s ({} probes and {} step(s) {} \
             blocks deep); worst error of the deciding peak {:.2} %, of the forward and backward's peak {:.2} % \
             (measured on the whole model; predictions extrapolated; step times this machine's)",
            slice.blocks,
            cal.seconds,
            cal.probes.len() + cal.checks.len(),
            slice.deeper_probes(),
            slice.deeper.knobs.checkpointed.len(),
            worst * 100.0,
            worst_step * 100.0
        );
        let summary = match &cal.tokens {
            Some(law) => format!(
                "{summary}; probed at {} and {} tokens, extrapolated to {} (the law's check at {}: {:+.2} %)",
                law.probed[0],
                law.probed[1],
                law.tokens,
                law.probed[1],
                law.check_error.unwrap_or(f64::NAN) * 100.0
            ),
            None => summary,
        };
        let (agree, pairs) = vramfit::plan::work::order_agreement(&times);
        let summary = format!(
            "{summary}; step times ({}): the predicted order agrees with the measured on {agree} of {pairs} pairs of \
             plans (pairs measured within {:.0} % of each other not counted)",
            cal.time_basis(),
            100.0 * vramfit::plan::TIME_RESOLUTION
        );
        println!("{summary}\n\n{table}");
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let record = json!({
            "bench": "slice", "command": command, "device": name, "config": self.config,
            "slice": slice, "tokens": cal.tokens, "calibration_seconds": cal.seconds, "worst_peak_error": worst,
            "worst_step_peak_error": worst_step, "rows": rows,
            "time_order": { "agreeing_pairs": agree, "pairs": pairs }, "time_basis": cal.time_basis(),
        });
        crate::plan_bench::write_results(
            &self.out,
            &record,
            &format!("Command: `{command}`\n\n{summary}\n\n{table}"),
        )
    }
}
