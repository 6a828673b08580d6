//! `train … --ranks N`: data-parallel ranks (issue 30). The command runs
//! itself again as N processes through `mpirun` (Open MPI); each rank
//! joins the MPI job at start-up ([`join_if_launched`]), runs its share of
//! every step's micro-batches, and sums the gradients with the others.
//! Rank 0 writes the run directory; rank r writes `RUN/ranks/rank-r` (its
//! own memory figures and checkpoints).

use anyhow::{Result, bail};
use burn::tensor::backend::AutodiffBackend;
use vramfit::plan::{Calibration, Knobs, OnRanks, PROBE_STEPS, RanksJob, RanksLauncher, Runnable, Strategy};
use vramfit::profile::{DeviceMemory, human_bytes};
use vramfit::run::rank_dir;
use vramfit::run::{RunPath, Start};
use vramfit_models::config::FamilyConfig;
use vramfit_models::family::Family;
use vramfit_models::plan::FamilyTarget;

use crate::budget::Budget;
use crate::show_plan::{Show, train_command};

/// True when this process was started by an MPI launcher.
#[cfg(feature = "mpi")]
pub fn launched() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// Under an MPI launcher: initialises MPI and joins its world; the session
/// must live until the end of `main` (it finalises MPI).
#[cfg(feature = "mpi")]
pub fn join_if_launched() -> Option<vramfit::ranks::mpi::Session> {
    if !launched() {
        return None;
    }
    let (session, world) = vramfit::ranks::mpi::init()?;
    vramfit::ranks::join(std::sync::Arc::new(world));
    Some(session)
}

/// Runs this command again as `n` ranks through `mpirun`, and waits.
pub fn relaunch(n: usize) -> Result<()> {
    mpirun(n, std::env::args_os().skip(1), false)
}

/// Says why `--ranks n` cannot start ranks in this build, if it cannot.
pub fn check_mpi(n: usize) -> Result<()> {
    if !cfg!(feature = "mpi") {
        bail!(
            "--ranks {n}: this vramfit was built without MPI; rebuild with `cargo build --release -p vramfit-cli \
             --features mpi` (it needs an MPI library and libclang: on Debian `apt install libopenmpi-dev \
             openmpi-bin libclang-dev`)"
        );
    }
    Ok(())
}

/// Runs `vramfit ARGS` as `n` ranks through `mpirun`, and waits; `quiet`:
/// what the ranks print goes nowhere (their errors still show).
fn mpirun(n: usize, args: impl IntoIterator<Item = std::ffi::OsString>, quiet: bool) -> Result<()> {
    check_mpi(n)?;
    let exe = std::env::current_exe()?;
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let command = || {
        let mut command = std::process::Command::new("mpirun");
        if quiet {
            command.stdout(std::process::Stdio::null());
        }
        command
            // More ranks than cores is allowed (they then share the cores).
            .args(["-n", &n.to_string(), "--oversubscribe"])
            .arg(&exe)
            .args(&args)
            // Open MPI refuses root without these; its shared-memory transport
            // needs ptrace rights in containers unless single copies are off.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
            // Ranks on one machine: the data through shared memory only, and
            // the launcher's own channel on loopback, in a network of its own
            // (`private_network`: Open MPI 4.1's launcher binds every
            // interface whatever the interfaces it names).
            .env("OMPI_MCA_btl", "self,vader")
            .env("OMPI_MCA_oob_tcp_if_include", "lo");
        command
    };
    let missing = |e: std::io::Error| {
        anyhow::anyhow!(
            "--ranks {n} starts the ranks with `mpirun`, which could not be run ({e}): install Open MPI (Debian: \
             `apt install openmpi-bin`)"
        )
    };
    let shared = std::env::var_os(crate::private_network::OPT_OUT).is_some_and(|v| v == "shared");
    let isolated = (!shared).then(|| {
        let mut isolated = command();
        crate::private_network::isolate(&mut isolated);
        isolated.status()
    });
    let status = match isolated {
        Some(Ok(status)) => status,
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing(e)),
        refused => {
            if let Some(Err(e)) = refused {
                eprintln!(
                    "note: this system gives the ranks no network namespace of their own ({e}): while they run, \
                     mpirun's control socket listens on every interface, and a connection left open there holds up \
                     the end of the run (docs/design/ranks.md)"
                );
            }
            command().status().map_err(missing)?
        }
    };
    if !status.success() {
        bail!("the {n} ranks ended with {status}: the failing rank's error is above");
    }
    Ok(())
}

/// `train … --ranks N --budget B` through the library's pipeline on ranks
/// ([`vramfit::plan::run_within_on_ranks`]): the plans per rank predicted
/// from one-rank probes (in this process), the winner verified by a probe
/// on the N ranks, then the run on them, each rank held to the budget and
/// falling back to the next plan from the last common checkpoint when a
/// rank runs out of memory; printed as it goes, then each rank's peak.
pub fn run_within_budget_on_ranks<B, F, const D: usize>(
    target: &mut FamilyTarget<B, F, D>,
    budget: Budget,
    probe_batch: Option<usize>,
    on: &OnRanks<'_>,
) -> Result<()>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceMemory,
    F: Family<D>,
{
    let ranks = on.ranks;
    let cal = Calibration::probe(target, probe_batch, &format!("{}, one rank", on.device))?;
    let config = |knobs: &Knobs, probe: bool| {
        let settings = target.settings(knobs);
        if !probe {
            return settings.to_toml();
        }
        // As the one-rank probes: a run that checkpoints writes one in the
        // probe too (its host copies can be the peak).
        FamilyConfig {
            steps: PROBE_STEPS,
            log_every: 1,
            profile_every: 1,
            checkpoint_every: if settings.checkpoint_every > 0 { 2 } else { 0 },
            ..settings
        }
        .to_toml()
    };
    let mut kept = Vec::new();
    let show = |verified: &vramfit::plan::VerifiedOnRanks| {
        let choice = &verified.verified.choice;
        cal.print_choice(choice, budget);
        println!(
            "verified on {ranks} ranks: a probe of the winner at the run's shape measured {} (planned {} a rank)",
            each_rank(verified.ranks.iter().map(|m| m.peak_bytes)),
            human_bytes(choice.plans[0].peak_bytes)
        );
        let settings = target.settings(&choice.plans[0].setting);
        println!("the command that runs it: {}", train_command(&settings, on.device));
        kept = choice.plans.iter().map(|p| cal.describe(&p.setting)).collect();
    };
    let mut launcher = Mpirun {
        ranks,
        workload: F::NAME,
        device: on.device,
    };
    let within = vramfit::plan::run_within_on_ranks(&cal, on, config, &mut launcher, show)?;
    for f in &within.fallbacks {
        println!(
            "fell back from plan {} to plan {} ({}), from the ranks' last common checkpoint: {}",
            f.from + 1,
            f.to + 1,
            kept[f.to],
            f.error
        );
    }
    let peaks: Vec<u64> = within.run.iter().map(|m| m.peak_bytes).collect();
    let worst = peaks.iter().copied().max().unwrap_or(0);
    println!(
        "  budget {} bytes on each of {ranks} ranks: {} ({}); plan in {}",
        budget.bytes,
        each_rank(peaks.iter().copied()),
        if worst <= budget.bytes {
            "every rank within"
        } else {
            "OVER"
        },
        within.record.display()
    );
    if worst > budget.bytes {
        bail!(
            "a rank's peak ({worst} bytes) went over the budget of {} bytes: the run finished, but planned within it",
            budget.bytes
        );
    }
    Ok(())
}

/// The ranks of a planned run, started as `vramfit train WORKLOAD` under
/// `mpirun`.
struct Mpirun<'a> {
    ranks: usize,
    workload: &'static str,
    device: &'a str,
}

impl RanksLauncher for Mpirun<'_> {
    fn launch(&mut self, job: RanksJob<'_>) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut args: Vec<std::ffi::OsString> =
            ["train", self.workload, "--device", self.device].map(Into::into).into();
        let mut quiet = false;
        match job {
            RanksJob::Probe { config, dir } => {
                println!(
                    "verifying the winner on {} ranks (a short probe at the run's shape)",
                    self.ranks
                );
                quiet = true;
                args.extend(["--config".into(), config.into(), "--out".into(), dir.into()]);
            }
            RanksJob::Run {
                config,
                dir,
                budget,
                simulate_oom_at,
            } => {
                args.extend(["--config".into(), config.into(), "--out".into(), dir.into()]);
                args.extend(["--held-to".into(), budget.to_string().into()]);
                if let Some(step) = simulate_oom_at {
                    args.extend(["--simulate-oom-at".into(), step.to_string().into()]);
                }
            }
            RanksJob::Fallback { dir, budget } => {
                args.extend(["--resume".into(), dir.into(), "--fallback".into()]);
                args.extend(["--held-to".into(), budget.to_string().into()]);
            }
        }
        mpirun(self.ranks, args, quiet).map_err(|e| format!("{e:#}").into())
    }
}

/// "rank 0 X, rank 1 Y, …".
fn each_rank(peaks: impl Iterator<Item = u64>) -> String {
    peaks
        .enumerate()
        .map(|(r, p)| format!("rank {r} {}", human_bytes(p)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `ranks` ranks can be started here (an MPI build, `mpirun`
/// installed), asked before a resume changes anything in the run.
pub fn ready_to_launch(ranks: usize) -> Result<()> {
    if ranks <= 1 {
        return Ok(());
    }
    check_mpi(ranks)?;
    if std::process::Command::new("mpirun").arg("--version").output().is_err() {
        bail!(
            "--ranks {ranks} starts the ranks with `mpirun`, which is not installed: install Open MPI (Debian: \
             `apt install openmpi-bin`); nothing was changed"
        );
    }
    Ok(())
}

/// `start` for rank `rank` (rank 0's is the run's own).
pub fn for_rank<C>(start: Start<C>, rank: usize) -> Result<Start<C>> {
    Ok(match (start, rank) {
        (start, 0) => start,
        (Start::New(c, RunPath::At(root)), r) => Start::New(c, RunPath::At(rank_dir(&root, r))),
        (Start::New(..), _) => bail!("ranks need a run directory named with --out"),
        (Start::Resume(root), r) => Start::Resume(rank_dir(&root, r)),
    })
}
