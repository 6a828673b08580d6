//! `vramfit bench scene-cards`: a card's reserved figure for a scene fit,
//! predicted from probes on this device ([`vramfit::pools`]): each place of
//! the state is traced at a few small counts (its allocations and releases
//! over whole training steps), the trace is grown to the counts asked for,
//! and replayed through CubeCL's pools as each card's client makes them.
//! Checked three ways: the replay of each probe on this device's own pools
//! against the reserved bytes the device reported (equal to the byte when
//! the trace is the whole of the allocator's use), the trace grown from
//! the first two probes against the third measured, and, where a card's
//! figures were recorded (`--recorded h200=FILE`), against those.

use std::path::PathBuf;

use anyhow::{Result, bail};
use vramfit::optim::Moments;
use vramfit::pools::Card;
use vramfit_scene::allocation::StateAllocation;
use vramfit_scene::sh_storage::ShStorage;

/// The benchmark's arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Gaussian counts to probe at on this device with the moments on the
    /// device, comma-separated: the trace grows through the first two and
    /// is checked at the others. (With the moments on the host each count
    /// is probed by scaled copies of its own step: smaller chunks, the
    /// same chunk count.)
    #[arg(long, value_delimiter = ',', default_values_t = [100_000usize, 200_000, 300_000])]
    probe_gaussians: Vec<usize>,
    /// Gaussian counts to predict each card's reserved bytes at.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000_000usize, 6_000_000])]
    gaussians: Vec<usize>,
    /// SH degree (0 to 3).
    #[arg(long, default_value_t = 3)]
    sh_degree: usize,
    /// The rendered view's size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1280x720", value_parser = crate::flags::parse_size)]
    size: (u32, u32),
    /// Where Adam's moments are (device, host; comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [Moments::Device, Moments::Host])]
    moments: Vec<Moments>,
    /// SH storages (f32, f16, bf16; 16-bit with the moments on the host only).
    #[arg(long, value_delimiter = ',', default_values_t = [ShStorage::F32])]
    sh_storage: Vec<ShStorage>,
    /// How the long-lived state is allocated (exact, pooled).
    #[arg(long, value_delimiter = ',', default_values_t = [StateAllocation::Exact, StateAllocation::Pooled])]
    state_allocation: Vec<StateAllocation>,
    /// The cards to predict for: names (h200, h100-80, rtx4090, …) or
    /// sizes in GiB (a CUDA card of that memory).
    #[arg(long, value_delimiter = ',', value_parser = crate::budget::parse_card, default_value = "h200,h100-80,24")]
    cards: Vec<Card>,
    /// Figures recorded on a card, CARD=FILE: a `bench scene-memory
    /// --steps-only` JSON measured there (repeatable).
    #[arg(long, value_parser = parse_recorded)]
    recorded: Vec<(Card, PathBuf)>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// JSON output (a .md table is written beside it).
    #[arg(long, default_value = "bench-results/scene-cards.json")]
    out: PathBuf,
}

pub(crate) fn parse_recorded(s: &str) -> Result<(Card, PathBuf), String> {
    let (card, file) = s.split_once('=').ok_or_else(|| {
        format!("'{s}': give CARD=FILE, e.g. h200=bench-results/gpu-h200-3/scene/scene-steps-cuda.json")
    })?;
    let card = crate::budget::parse_card(card)?;
    let file = PathBuf::from(file);
    if !file.is_file() {
        return Err(format!("'{}': no such file", file.display()));
    }
    Ok((card, file))
}

pub fn run(args: Args) -> Result<()> {
    if args.sh_degree > 3 {
        bail!("--sh-degree {}: the highest SH degree is 3", args.sh_degree);
    }
    if args.probe_gaussians.len() < 2 || args.probe_gaussians.contains(&0) {
        bail!("--probe-gaussians: give two positive counts at least (the trace grows through the first two)");
    }
    if args.probe_gaussians[0] == args.probe_gaussians[1] {
        bail!("--probe-gaussians: the first two counts must differ");
    }
    if args.gaussians.contains(&0) {
        bail!("--gaussians: a count must be positive");
    }
    if args.device.name == "cpu" {
        bail!("bench scene-cards traces a device's allocator; give --device wgpu or cuda");
    }
    crate::budget::check_bench_out(&args.out)?;
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    return device::run(args);
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    Err(crate::device::unavailable(&args.device.name))
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod device {
    use super::*;
    use anyhow::Context;
    use serde_json::json;
    use vramfit::pools::{Allocator, Trace, TraceLaw, replay};
    use vramfit::profile::human_bytes;
    use vramfit_scene::gpu::memory::{MemoryCase, StepMemory, probe_plan, trace_step};

    /// A recorded step's reserved bytes for one case and place, from a
    /// `bench scene-memory` JSON.
    fn recorded_reserved(
        record: &serde_json::Value,
        gaussians: usize,
        degree: usize,
        size: (usize, usize),
        place: (Moments, ShStorage, StateAllocation),
    ) -> Option<u64> {
        let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
        record["steps"].as_array()?.iter().find_map(|s| {
            let c = &s["case"];
            let same = c["gaussians"].as_u64() == Some(gaussians as u64)
                && c["degree"].as_u64() == Some(degree as u64)
                && c["width"].as_u64() == Some(size.0 as u64)
                && c["height"].as_u64() == Some(size.1 as u64)
                && text(&s["moments"]) == Some(place.0.to_string())
                && text(&s["sh"]) == Some(place.1.to_string())
                && text(&s["state"]) == Some(place.2.to_string());
            same.then(|| s["reserved"].as_u64()).flatten()
        })
    }

    type Traced = (StepMemory, Trace, Allocator);
    type Place = (Moments, ShStorage, StateAllocation);

    fn traced(device: &str, case: &MemoryCase, place: Place, chunk: Option<usize>) -> Result<Traced> {
        fn on<R: cubecl::Runtime>(case: &MemoryCase, place: Place, chunk: Option<usize>) -> Result<Traced> {
            let device = R::Device::default();
            let (m, trace) = trace_step::<R>(&device, case, place.0, place.1, place.2, 3, chunk)
                .map_err(|e| anyhow::anyhow!("device failure: {e}"))?;
            let here = Allocator::from(&R::client(&device).properties().memory);
            Ok((m, trace, here))
        }
        match device {
            #[cfg(feature = "wgpu")]
            "wgpu" => on::<cubecl::wgpu::WgpuRuntime>(case, place, chunk),
            #[cfg(feature = "cuda")]
            "cuda" => on::<cubecl::cuda::CudaRuntime>(case, place, chunk),
            other => Err(crate::device::unavailable(other)),
        }
    }

    fn pct(predicted: u64, measured: u64) -> f64 {
        100.0 * (predicted as f64 - measured as f64) / measured as f64
    }

    pub(super) fn run(args: Args) -> Result<()> {
        let (w, h) = (args.size.0 as usize, args.size.1 as usize);
        let case = |gaussians| MemoryCase {
            gaussians,
            degree: args.sh_degree,
            width: w,
            height: h,
        };
        let recorded: Vec<(Card, serde_json::Value)> = args
            .recorded
            .iter()
            .map(|(card, file)| -> Result<_> {
                let text = vramfit::files::read::read_text(file, vramfit::files::read::Links::Follow)
                    .with_context(|| format!("reading {}", file.display()))?;
                let v: serde_json::Value =
                    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
                if v["steps"].as_array().is_none_or(|s| s.is_empty()) {
                    bail!(
                        "{} holds no training steps: give the JSON of a `vramfit bench scene-memory --moments … \
                         --steps-only` run on that card",
                        file.display()
                    );
                }
                Ok((card.clone(), v))
            })
            .collect::<Result<_>>()?;
        let mut places = Vec::new();
        for &m in &args.moments {
            for &sh in &args.sh_storage {
                if m == Moments::Device && sh != ShStorage::F32 {
                    continue;
                }
                for &state in &args.state_allocation {
                    places.push((m, sh, state));
                }
            }
        }
        let mut table = String::from(
            "| moments | SH | state | Gaussians | card | predicted reserved | recorded | off |\n|---|---|---|---|---|---|---|---|\n",
        );
        let mut checks = String::from(
            "| moments | SH | state | probe Gaussians | measured here | replayed here | grown from the first two |\n|---|---|---|---|---|---|---|\n",
        );
        let mut out_places = Vec::new();
        for place in places {
            let (m, sh, state) = place;
            let mut laws = Vec::new();
            for (targets, probe_counts) in probe_plan(m, &args.probe_gaussians, &args.gaussians) {
                eprintln!("tracing moments {m}, SH {sh}, state {state} at {probe_counts:?} (Gaussians, chunk)…");
                let mut probes = Vec::new();
                for &(n, chunk) in &probe_counts {
                    let (measured, trace, here) = traced(&args.device.name, &case(n), place, chunk)?;
                    let replayed = replay(&trace, &here)?;
                    probes.push((n, chunk, measured, trace, here, replayed));
                }
                let law = TraceLaw::fit(
                    (probes[0].0 as u64, probes[0].3.clone()),
                    (probes[1].0 as u64, probes[1].3.clone()),
                )?;
                let mut probe_rows = Vec::new();
                for (n, chunk, measured, trace, here, replayed) in &probes {
                    let grown = replay(&law.at(*n as u64), here)?.reserved_peak;
                    let chunked = chunk.map(|c| format!(" (chunks of {c})")).unwrap_or_default();
                    checks += &format!(
                        "| {m} | {sh} | {state} | {n}{chunked} | {} | {} ({:+.2} %) | {} ({:+.2} %) |\n",
                        measured.reserved,
                        replayed.reserved_peak,
                        pct(replayed.reserved_peak, measured.reserved),
                        grown,
                        pct(grown, measured.reserved)
                    );
                    probe_rows.push(json!({
                        "gaussians": n,
                        "chunk": chunk,
                        "measured_reserved": measured.reserved,
                        "replayed_reserved": replayed.reserved_peak,
                        "grown_reserved": grown,
                        "reservations": trace.reserves(),
                        "allocator": here,
                    }));
                }
                let mut predictions = Vec::new();
                for &n in &targets {
                    for card in &args.cards {
                        let recorded = recorded
                            .iter()
                            .filter(|(c, _)| c.memory_bytes == card.memory_bytes)
                            .find_map(|(_, v)| recorded_reserved(v, n, args.sh_degree, (w, h), place));
                        let predicted = replay(&law.at(n as u64), &card.allocator).map_err(|e| e.to_string());
                        let (shown, off) = match (&predicted, recorded) {
                            (Ok(r), Some(rec)) => (
                                human_bytes(r.reserved_peak),
                                format!("{:+.2} %", pct(r.reserved_peak, rec)),
                            ),
                            (Ok(r), None) => (human_bytes(r.reserved_peak), "—".into()),
                            (Err(e), _) => (e.clone(), "—".into()),
                        };
                        table += &format!(
                            "| {m} | {sh} | {state} | {n} | {} ({}) | {shown} | {} | {off} |\n",
                            card.name,
                            human_bytes(card.memory_bytes),
                            recorded.map(human_bytes).unwrap_or_else(|| "—".into()),
                        );
                        predictions.push(json!({
                            "gaussians": n,
                            "card": card.name,
                            "card_bytes": card.memory_bytes,
                            "allocator": card.allocator,
                            "predicted_reserved": predicted.as_ref().ok().map(|r| r.reserved_peak),
                            "not_predicted": predicted.as_ref().err(),
                            "recorded_reserved": recorded,
                            "off_percent": match (&predicted, recorded) {
                                (Ok(r), Some(rec)) => Some(pct(r.reserved_peak, rec)),
                                _ => None,
                            },
                        }));
                    }
                }
                laws.push(json!({
                    "for_gaussians": targets,
                    "probes": probe_rows,
                    "law": law,
                    "predictions": predictions,
                }));
            }
            out_places.push(json!({
                "moments": m.to_string(),
                "sh": sh.to_string(),
                "state": state.to_string(),
                "laws": laws,
            }));
        }
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let record = json!({
            "bench": "scene-cards",
            "command": command,
            "device": args.device.name,
            "degree": args.sh_degree,
            "width": w,
            "height": h,
            "measured": "reserved bytes the device's client reported after 3 training steps (the probes); \
                         predicted: the traces grown to the count and replayed through cubecl-runtime's pools \
                         as each card's client makes them; recorded: a card's own measurement",
            "places": out_places,
        });
        let md = format!(
            "Whole training steps (3) of a random scene at {w}×{h}, SH degree {}.\n\n\
             The probes on this device: the trace replayed through its own pools, and grown from the first two \
             probes:\n\n{checks}\nEach card's reserved bytes predicted from them:\n\n{table}",
            args.sh_degree
        );
        print!("{md}");
        crate::bench_scene::write_record(&args.out, &record, &command, &md)
    }
}
