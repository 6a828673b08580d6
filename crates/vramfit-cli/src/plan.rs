//! Every planning command, for every workload, through the library's one
//! pipeline (`vramfit::plan`): `vramfit plan transformer|unet|splat`
//! (probes, the winner verified, presets per card size), the planned runs
//! `train … --budget` and `fit --budget` (plan, verify, run with
//! fallbacks), and `bench plan…` (`plan_bench.rs`). The workloads differ
//! only in the target the library builds and in how a run is printed
//! ([`PlanTarget`]); the strategies only in how they are printed
//! ([`Show`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{FALLBACKS, Found, Options, Runnable, Strategy, Verified, run_within_showing, verify};
use vramfit::profile::DeviceMemory;
use vramfit::run::{RunPath, RunSummary, Workload};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::{Family, ModelSettings};
use vramfit_models::gpt::GptConfig;
use vramfit_models::llama::LlamaConfig;
use vramfit_models::plan::FamilyTarget;
use vramfit_models::segmenter::SegmenterConfig;
use vramfit_models::unet::UnetConfig;
use vramfit_splat::config::FitConfig;
use vramfit_splat::op::{FusedLoss, SplatBackend};
use vramfit_splat::plan::SplatTarget;

use crate::budget::{Budget, budget_and_cards, check_json_folder, check_new_out, check_within};
use crate::device::{OnBackend, OnSplatBackend, on_device, on_splat_device};
use crate::show_plan::{Show, fit_command, train_command};
use vramfit::plan::benchmark::Benched;

#[derive(clap::Subcommand)]
pub enum Which {
    /// Plan the transformer (same settings flags as `vramfit train transformer`).
    Transformer(PlanArgs<crate::flags::TrainSettings>),
    /// Plan the Llama-family decoder (same settings flags as `vramfit train llm`).
    Llm(PlanArgs<crate::flags::TrainSettings>),
    /// Plan the U-Net (same settings flags as `vramfit train unet`).
    Unet(PlanArgs<crate::flags::TrainSettings>),
    /// Plan the segmenter (same settings flags as `vramfit train segmenter`).
    Segmenter(PlanArgs<crate::flags::TrainSettings>),
    /// Plan a splat fit's band height (same settings flags as `vramfit fit`).
    Splat(PlanArgs<crate::flags::FitSettings>),
    /// Plan a 3D scene fit (--device wgpu|cuda): how many Gaussians fit, with
    /// Adam's moments on the device or the host (same settings flags as `vramfit scene`).
    Scene(PlanArgs<crate::flags::SceneSettings>),
}

#[derive(clap::Args)]
pub struct PlanArgs<S: clap::Args + crate::flags::Inputs> {
    #[command(flatten)]
    settings: S,
    /// Memory budget: 6GiB, 512MiB, 1.5GB, a number of bytes, or auto (free memory).
    #[arg(long, allow_hyphen_values = true)]
    budget: Option<String>,
    /// Cards for a preset table: sizes in GiB, e.g. 8,16,24,48,80 (or with
    /// units: 24GiB, 512MiB), or CUDA cards by name (h100-80, rtx4090, …).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true, value_parser = crate::budget::parse_card)]
    gpus: Vec<vramfit::pools::Card>,
    /// Probe at this effective batch and extrapolate to the run's (transformer, U-Net).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    probe_batch: Option<usize>,
    /// Probe a slice this many blocks deep and extrapolate to the model's
    /// depth (0: probe the whole model; default: 2 for llm, whole otherwise).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    probe_blocks: Option<usize>,
    /// Probe at this many tokens a sample (and twice it) and extrapolate to
    /// the run's (0: probe at the run's; default: 128 for an llm run of 512
    /// tokens or more).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flags::parse_count::<usize>)]
    probe_tokens: Option<usize>,
    /// Write the probes, the model and the plans as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
}

impl<S: clap::Args + crate::flags::Inputs> PlanArgs<S> {
    fn probes(&self) -> Probes {
        Probes {
            blocks: self.probe_blocks,
            tokens: self.probe_tokens,
        }
    }

    /// `--json` refused where it would write over or into an input, before
    /// anything is read or probed.
    fn check_output(&self) -> Result<()> {
        match &self.json {
            Some(json) => crate::flags::check_output(json, &self.settings.inputs()),
            None => Ok(()),
        }
    }

    fn action(&self) -> Result<Action> {
        let (budget, gpus) = budget_and_cards(self.budget.as_deref(), &self.gpus, &self.device.name)?;
        Ok(Action::Show(ShowArgs {
            budget,
            gpus,
            probe_batch: self.probe_batch,
            json: self.json.clone(),
            device: self.device.name.clone(),
            ranks: 1,
        }))
    }
}

pub fn run(which: Which) -> Result<()> {
    match &which {
        Which::Transformer(a) | Which::Llm(a) | Which::Unet(a) | Which::Segmenter(a) => a.check_output()?,
        Which::Splat(a) => a.check_output()?,
        Which::Scene(a) => a.check_output()?,
    }
    match which {
        Which::Transformer(args) => {
            let (config, action) = on_ranks(crate::flags::resolve_train(&args.settings)?, args.action()?)?;
            model::<GptConfig, 3>(config, &args.device.name, args.probes(), action)
        }
        Which::Llm(args) => {
            let (config, action) = on_ranks(crate::flags::resolve_train(&args.settings)?, args.action()?)?;
            model::<LlamaConfig, 3>(config, &args.device.name, args.probes(), action)
        }
        Which::Unet(args) => {
            let (config, action) = on_ranks(crate::flags::resolve_train(&args.settings)?, args.action()?)?;
            model::<UnetConfig, 4>(config, &args.device.name, args.probes(), action)
        }
        Which::Segmenter(args) => {
            let (config, action) = on_ranks(crate::flags::resolve_train(&args.settings)?, args.action()?)?;
            model::<SegmenterConfig, 3>(config, &args.device.name, args.probes(), action)
        }
        Which::Splat(args) => splat(
            crate::flags::resolve_fit(&args.settings)?,
            &args.device.name,
            args.action()?,
        ),
        Which::Scene(args) => scene(&args.settings, &args.device.name, args.action()?),
    }
}

/// `plan … --ranks N`: the probes run on one rank (this process), the
/// plans per rank are derived for up to N ranks.
fn on_ranks<F: ModelSettings>(mut config: FamilyConfig<F>, mut action: Action) -> Result<(FamilyConfig<F>, Action)> {
    if config.ranks > 1 {
        let Action::Show(show) = &mut action else {
            unreachable!("plan builds Show")
        };
        if show.budget.is_none() {
            anyhow::bail!(
                "plan --ranks {} needs --budget: the ranks table is of the plans within it",
                config.ranks
            );
        }
        show.ranks = config.ranks;
        config.ranks = 1;
        config.shard_moments = false;
    }
    Ok((config, action))
}

/// Runs `action` on a scene fit with `settings` on `device` (a CubeCL
/// device: the plan is of its allocator).
pub fn scene(settings: &crate::flags::SceneSettings, device: &str, action: Action) -> Result<()> {
    let config = crate::flags::resolve_scene(settings)?;
    let allow = settings.allow_quality_loss();
    let counts = settings.probe_gaussians().to_vec();
    if device == "cpu" {
        bail!(
            "planning a scene fits it into a GPU's memory: give --device wgpu or cuda (the CPU twin's state is on \
             the heap, which it does not plan)"
        );
    }
    action.check()?;
    let placement = crate::device::scene_placement(device)?;
    let name = placement.name.clone();
    let again = device.to_string();
    let place = move || crate::device::scene_placement(&again).expect("the device opened for the probes opens again");
    match device {
        #[cfg(feature = "wgpu")]
        "wgpu" => scene_on::<cubecl::wgpu::WgpuRuntime>(config, allow, counts, place, action, &name),
        #[cfg(feature = "cuda")]
        "cuda" => scene_on::<cubecl::cuda::CudaRuntime>(config, allow, counts, place, action, &name),
        other => {
            drop((config, allow, counts, place, name));
            Err(crate::device::unavailable(other))
        }
    }
}

/// [`scene`] on the CubeCL runtime `R`'s default device.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn scene_on<R: cubecl::Runtime>(
    config: vramfit_scene::config::SceneConfig,
    allow: Option<f64>,
    counts: Vec<usize>,
    place: impl Fn() -> vramfit_scene::job::Placement + 'static,
    action: Action,
    name: &str,
) -> Result<()> {
    let device = R::Device::default();
    let mut target = vramfit_scene::gpu::plan::SceneTarget::<R>::new(config, &device, allow, counts, place)?;
    action.on(&mut target, name)
}

/// What a planning command does once its target is built on the device.
#[derive(Clone)]
pub enum Action {
    /// `vramfit plan`: the probes, the winner verified, a preset table.
    Show(ShowArgs),
    /// `train … --budget`, `fit --budget`: plan, verify, run with fallbacks.
    Run {
        budget: Budget,
        probe_batch: Option<usize>,
        out: RunPath,
        simulate_oom_at: Option<u64>,
    },
    /// `bench plan`, `bench plan-splat`.
    Bench(crate::plan_bench::Request),
    /// `train … --ranks N --budget`: plan per rank, verify and run on the ranks.
    RunOnRanks {
        budget: Budget,
        ranks: usize,
        probe_batch: Option<usize>,
        out: PathBuf,
        /// The `--device` given, for the ranks' command.
        device: String,
        /// Test seam: the first plan fails at this step on every rank.
        simulate_oom_at: Option<u64>,
    },
}

/// What `vramfit plan` was asked for.
#[derive(Clone)]
pub struct ShowArgs {
    budget: Option<Budget>,
    gpus: Vec<vramfit::pools::Card>,
    probe_batch: Option<usize>,
    json: Option<PathBuf>,
    /// The `--device` given, for the command that runs the plan.
    device: String,
    /// `--ranks N` (transformer, U-Net): also the plans per rank on up to N
    /// data-parallel ranks, the moments sharded (1: none).
    ranks: usize,
}

/// How shallow and short the planner probes (`--probe-blocks`,
/// `--probe-tokens`): `Some(0)`, the whole; `None`, the family's default.
#[derive(Clone, Copy, Default)]
pub struct Probes {
    pub blocks: Option<usize>,
    pub tokens: Option<usize>,
}

/// Runs `action` on a model family with settings `config` on `device`,
/// probing as `probes` says.
pub fn model<F: Family<D>, const D: usize>(
    config: FamilyConfig<F>,
    device: &str,
    probes: Probes,
    action: Action,
) -> Result<()> {
    let probe_blocks = match probes.blocks {
        Some(0) => None,
        Some(k) => Some(k),
        None => config.model.default_probe_blocks(),
    };
    let probe_tokens = match probes.tokens {
        Some(0) => None,
        Some(t) => Some(t),
        None => config.model.default_probe_tokens(&config.task),
    };
    // Cards without a budget: every row from traces, nothing probed.
    if let Action::Show(args) = &action
        && args.budget.is_none()
        && !args.gpus.is_empty()
    {
        return show_traced(config, args);
    }
    on_device(
        device,
        OnModel::<F, D> {
            config,
            probe_blocks,
            probe_tokens,
            action,
        },
    )
}

/// `vramfit plan MODEL --gpus …` without a budget: each card's plan from
/// traces of the whole model on shapes alone (no probe, whatever
/// `--device`), printed and written as JSON.
fn show_traced<F: Family<D>, const D: usize>(config: FamilyConfig<F>, args: &ShowArgs) -> Result<()> {
    check_json_folder(args.json.as_deref())?;
    let traced = vramfit_models::traced::traced_cards(config, &args.gpus)?;
    crate::traced_cards::print(&traced);
    if let Some(path) = &args.json {
        let out = serde_json::json!({
            "device": "none: traced on shapes (nothing computed, nothing probed)",
            "cards": traced.rows,
            "traced": {
                "plans": traced.plans_traced,
                "operations": traced.operations,
                "seconds": traced.seconds,
            },
        });
        vramfit::run::atomic_write(path, &serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Runs `action` on a splat fit with settings `config` on `device`.
pub fn splat(config: FitConfig, device: &str, action: Action) -> Result<()> {
    on_splat_device(device, OnSplat { config, action })
}

struct OnModel<F: ModelSettings, const D: usize> {
    config: FamilyConfig<F>,
    probe_blocks: Option<usize>,
    probe_tokens: Option<usize>,
    action: Action,
}

impl<F: Family<D>, const D: usize> OnBackend for OnModel<F, D> {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend,
        B::InnerBackend: DeviceMemory,
    {
        self.action.check()?;
        let (probe_blocks, probe_tokens) = (self.probe_blocks, self.probe_tokens);
        let build = |config: FamilyConfig<F>| -> Result<FamilyTarget<B, F, D>, vramfit_models::job::TrainError> {
            let target = match probe_blocks {
                Some(k) => FamilyTarget::<B, F, D>::sliced(config, device, k)?,
                None => FamilyTarget::<B, F, D>::new(config, device)?,
            };
            let target = match probe_tokens {
                Some(t) => target.with_probe_tokens(t)?,
                None => target,
            };
            Ok(target.with_device_name(&name))
        };
        let config = self.config.clone();
        let mut target = build(self.config)?;
        if let Action::RunOnRanks {
            budget,
            ranks,
            probe_batch,
            out,
            device,
            simulate_oom_at,
        } = self.action
        {
            let on = vramfit::plan::OnRanks {
                ranks,
                budget: budget.bytes,
                out: &out,
                device: &device,
                simulate_oom_at,
            };
            return crate::ranks::run_within_budget_on_ranks(&mut target, budget, probe_batch, &on);
        }
        let budget = self.action.budget();
        let again = self.action.clone();
        match (self.action.on(&mut target, &name), budget) {
            // Nothing fits at the quality asked: the library lowers it as
            // little as it must (unless the run keeps it) and the same
            // action runs at the value found.
            (Err(e), Some(budget)) if nothing_fits(&e) => {
                match vramfit_models::quality::within_budget(&config, budget, build)? {
                    Some((lowered, given)) => {
                        println!(
                            "\nnothing fits {} at the quality asked ({e}); giving up quality: {given} ({} = {}; \
                             --keep-quality forbids it)",
                            vramfit::profile::human_bytes(budget),
                            given.key,
                            given.planned
                        );
                        let mut target = build(lowered)?;
                        again.on(&mut target, &name)
                    }
                    None => Err(e),
                }
            }
            (result, _) => result,
        }
    }
}

/// Whether `e` says no plan fits the budget (what a lower quality may cure).
fn nothing_fits(e: &anyhow::Error) -> bool {
    let infeasible = |p: &vramfit::plan::PlanError| matches!(p, vramfit::plan::PlanError::Infeasible { .. });
    e.downcast_ref::<vramfit::plan::PlanError>().is_some_and(infeasible)
        || e.downcast_ref::<vramfit::plan::BudgetError<vramfit_models::job::TrainError>>()
            .is_some_and(|b| matches!(b, vramfit::plan::BudgetError::Plan(p) if infeasible(p)))
}

struct OnSplat {
    config: FitConfig,
    action: Action,
}

impl OnSplatBackend for OnSplat {
    type Output = ();

    fn run<B>(self, device: &B::Device, name: String) -> Result<()>
    where
        B: AutodiffBackend + SplatBackend,
        B::InnerBackend: FusedLoss + DeviceMemory,
    {
        self.action.check()?;
        let mut target = SplatTarget::<B>::new(self.config, device)?.with_device_name(&name);
        self.action.on(&mut target, &name)
    }
}

/// A workload the planning commands serve: the command that runs a plan's
/// settings, and how a finished run is printed.
pub trait PlanTarget:
    Runnable<Strategy: Benched + Show, Settings: serde::Serialize, Error: std::error::Error + Send + Sync + 'static>
{
    /// The `vramfit` command that runs `settings` on `device`.
    fn command(settings: &Self::Settings, device: &str) -> String;
    /// Prints a finished planned run.
    fn print(summary: &RunSummary<<Self::Workload as Workload>::Summary>, dir: &Path);
    /// Each card's rows where the workload predicts a card's own allocator
    /// ([`vramfit::pools`]), printed and as JSON objects; `None` where it
    /// does not (the rows then scale what the probing device measured).
    fn card_rows(
        &self,
        _cal: &Self::Strategy,
        _cards: &[vramfit::pools::Card],
        _name: &str,
    ) -> Option<Vec<serde_json::Value>> {
        None
    }
}

impl<B, F: Family<D>, const D: usize> PlanTarget for FamilyTarget<B, F, D>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
{
    fn command(settings: &FamilyConfig<F>, device: &str) -> String {
        train_command(settings, device)
    }
    fn print(summary: &RunSummary<<Self::Workload as Workload>::Summary>, dir: &Path) {
        crate::runs::print_train(F::NAME, summary);
        crate::runs::print_common(summary, dir);
    }
    /// Each card's plan from traces of the whole model on shapes
    /// ([`vramfit_models::traced`]), on every device.
    fn card_rows(
        &self,
        _cal: &vramfit::plan::Calibration,
        cards: &[vramfit::pools::Card],
        _name: &str,
    ) -> Option<Vec<serde_json::Value>> {
        let traced = match vramfit_models::traced::traced_cards(self.base().clone(), cards) {
            Ok(t) => t,
            Err(e) => {
                println!("note: the cards could not be traced: {e}");
                return None;
            }
        };
        crate::traced_cards::print(&traced);
        Some(traced.rows.iter().map(|r| serde_json::json!(r)).collect())
    }
}

impl<B> PlanTarget for SplatTarget<B>
where
    B: AutodiffBackend + SplatBackend,
    B::InnerBackend: FusedLoss + DeviceMemory,
{
    fn command(settings: &FitConfig, device: &str) -> String {
        fit_command(settings, device)
    }
    fn print(summary: &RunSummary<<Self::Workload as Workload>::Summary>, dir: &Path) {
        crate::runs::print_fit(summary, false);
        crate::runs::print_common(summary, dir);
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<R: cubecl::Runtime> PlanTarget for vramfit_scene::gpu::plan::SceneTarget<R> {
    fn command(settings: &vramfit_scene::config::SceneConfig, device: &str) -> String {
        crate::show_plan::scene_command(settings, device)
    }
    fn print(summary: &RunSummary<<Self::Workload as Workload>::Summary>, dir: &Path) {
        crate::runs::print_scene(summary, dir);
    }
    fn card_rows(
        &self,
        cal: &vramfit::plan::CapacityCalibration,
        cards: &[vramfit::pools::Card],
        name: &str,
    ) -> Option<Vec<serde_json::Value>> {
        let rows = self.rows_for_cards(cal, cards);
        crate::show_plan::print_card_rows(&rows, name);
        Some(rows.iter().map(|r| serde_json::json!(r)).collect())
    }
}

impl Action {
    /// The budget it plans into (bytes), if any.
    fn budget(&self) -> Option<u64> {
        match self {
            Action::Show(show) => show.budget.map(|b| b.bytes),
            Action::Run { budget, .. } => Some(budget.bytes),
            Action::Bench(_) | Action::RunOnRanks { .. } => None,
        }
    }

    /// Refuses output paths before anything is probed.
    fn check(&self) -> Result<()> {
        match self {
            Action::Show(show) => check_json_folder(show.json.as_deref()),
            Action::Run { out, .. } => check_new_out(out),
            Action::Bench(request) => crate::budget::check_bench_out(&request.out_path()),
            Action::RunOnRanks { out, .. } => check_new_out(&RunPath::At(out.clone())),
        }
    }

    fn on<T: PlanTarget>(self, target: &mut T, name: &str) -> Result<()> {
        match self {
            Action::Show(args) => show(target, args, name),
            Action::Run {
                budget,
                probe_batch,
                out,
                simulate_oom_at,
            } => run_within_budget(target, budget, probe_batch, out, simulate_oom_at, name),
            Action::Bench(request) => crate::plan_bench::bench(target, request, name),
            Action::RunOnRanks { .. } => bail!("only `train` plans on ranks"),
        }
    }
}

/// `vramfit plan`: probes, the winner verified (with a budget), the preset
/// table (with card sizes), all as JSON too.
fn show<T: PlanTarget>(target: &mut T, args: ShowArgs, name: &str) -> Result<()> {
    let ShowArgs {
        budget,
        gpus,
        probe_batch,
        json,
        device,
        ranks,
    } = args;
    let (cards, json, device) = (&gpus[..], json.as_deref(), &device[..]);
    let gpus: Vec<u64> = cards.iter().map(|c| c.memory_bytes).collect();
    let gpus = &gpus[..];
    let cal = T::Strategy::probe(target.target(), probe_batch, name)?;
    let mut out = serde_json::json!({ "device": name, "calibration": cal });
    if let Some(b) = budget.filter(|_| ranks > 1)
        && let Some(table) = cal.print_ranks(b.bytes, ranks)
    {
        out["ranks"] = table;
    }
    let write = |out: &serde_json::Value| -> Result<()> {
        if let Some(path) = json {
            vramfit::run::atomic_write(path, &serde_json::to_vec_pretty(out)?)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        Ok(())
    };
    if let Some(budget) = budget {
        let Verified { choice, measured } = match verify(&cal, target.target(), budget.bytes) {
            Ok(v) => v,
            Err(e) => {
                // The probes took minutes: they are kept beside the error.
                out["error"] = serde_json::json!(e.to_string());
                write(&out)?;
                // Asked how many ranks it takes, and some count fits: that
                // is the answer, not a failure.
                if out["ranks"]["fewest"].as_u64().is_some_and(|n| n > 1) {
                    println!("\none rank: {e}");
                    return Ok(());
                }
                return Err(e.into());
            }
        };
        cal.print_choice(&choice, budget);
        cal.print_verified(&choice, &measured);
        println!(
            "to run it: {}",
            T::command(&target.settings(&choice.plans[0].setting), device)
        );
        out["choice"] = serde_json::json!(choice);
        out["verified"] = serde_json::json!(measured);
    }
    if !gpus.is_empty() {
        let for_cards = cal.for_cards();
        let (cal, left_out) = match &for_cards {
            Some((c, left_out)) => (c, Some(*left_out)),
            None => (&cal, None),
        };
        let table = cal.presets(gpus);
        cal.print_presets(&table, name);
        if let Some(left_out) = left_out {
            println!("note: the card rows are the bytes a card holds, {left_out}");
        }
        // The least card: what a budget of nothing is told it needs.
        if let Err(vramfit::plan::PlanError::Infeasible {
            smallest,
            smallest_bytes,
            ..
        }) = cal.choose(1)
        {
            println!("the least card it needs: {smallest} (the leanest plan's predicted peak with the margin)");
            out["least_card_bytes"] = serde_json::json!(smallest_bytes);
        }
        let basis = format!(
            "the figure that decides an out-of-memory on {name}{}, {}",
            left_out.map(|l| format!(" {l}")).unwrap_or_default(),
            cal.extrapolated()
                .unwrap_or_else(|| "predicted from probes of the whole workload".into())
        );
        out["cards"] = table
            .iter()
            .zip(cards)
            .map(|(p, card)| {
                let mut row = serde_json::json!({
                    "card": card.name,
                    "card_bytes": p.budget,
                    "fits": p.plan.is_some(),
                    "basis": "measured here, scaled",
                    "rests_on": basis,
                    "time_basis": cal.time_basis(),
                });
                match &p.plan {
                    Some(plan) => {
                        row["peak_bytes"] = serde_json::json!(plan.peak_bytes);
                        row["step_ms"] = serde_json::json!(plan.step_ms);
                        row["plan"] = serde_json::json!(cal.describe(&plan.setting));
                        row["setting"] = serde_json::json!(plan.setting);
                        row["numerics"] = serde_json::json!(plan.quality);
                        row["dominant"] = serde_json::json!(cal.dominant(&plan.setting));
                    }
                    None => row["why_not"] = serde_json::json!(p.error),
                }
                row
            })
            .collect();
        out["presets"] = serde_json::json!(table);
        let replayed = target.card_rows(cal, cards, name);
        if let Some(rows) = replayed {
            // One object per card and variant, each figure the card's own.
            out["cards"] = serde_json::json!(rows);
        } else if let Some(caveat) = vramfit::plan::preset_caveat(device) {
            println!("note: {caveat}");
            out["presets_caveat"] = serde_json::json!(caveat);
        }
        if let Some(extra) = cal.presets_json(gpus) {
            out["presets_largest"] = extra;
        }
    }
    write(&out)
}

/// A planned run through the library's one call
/// ([`vramfit::plan::run_within_showing`]): plan, verify, write `plan.json`
/// into the run directory, run the winner held to the budget, fall back to
/// the next plans from the last checkpoint on an out-of-memory; printed as
/// it goes, then the run's peak against the budget.
fn run_within_budget<T: PlanTarget>(
    target: &mut T,
    budget: Budget,
    probe_batch: Option<usize>,
    out: RunPath,
    simulate_oom_at: Option<u64>,
    name: &str,
) -> Result<()> {
    let mut options = Options {
        probe_batch,
        simulate_oom_at,
        ..Options::new(out)
    };
    options.record_extra.insert("budget_auto".into(), budget.auto.into());
    let mut kept = Vec::new();
    let show = |found: Found<'_, T::Strategy>| match found {
        Found::Probing => <T::Strategy as Show>::print_probing(name),
        Found::Calibrated(cal) => cal.print_probes(),
        Found::Verified(cal, v) => {
            cal.print_choice(&v.choice, budget);
            cal.print_verified(&v.choice, &v.measured);
            kept = v
                .choice
                .plans
                .iter()
                .take(1 + FALLBACKS)
                .map(|p| cal.describe(&p.setting))
                .collect();
        }
    };
    let within = run_within_showing(target, budget.bytes, name, &options, show, crate::runs::progress())?;
    let planned = within.planned;
    for f in &planned.fallbacks {
        println!(
            "fell back from plan {} to plan {} ({}), from the last checkpoint",
            f.from + 1,
            f.to + 1,
            kept[f.to]
        );
    }
    let Some(summary) = planned.summary else {
        bail!("the run stopped before its end")
    };
    T::print(&summary, &planned.dir);
    check_within(summary.peak_memory_bytes.unwrap_or(0), budget.bytes, &planned.dir)
}
