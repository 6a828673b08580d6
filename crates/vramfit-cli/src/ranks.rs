//! `train … --ranks N`: data-parallel ranks (issue 30). The command runs
//! itself again as N processes through `mpirun` (Open MPI); each rank
//! joins the MPI job at start-up ([`join_if_launched`]), runs its share of
//! every step's micro-batches, and sums the gradients with the others.
//! Rank 0 writes the run directory; rank r writes `RUN/ranks/rank-r` (its
//! own memory figures and checkpoints).

use std::path::Path;

use anyhow::{Result, bail};
use vramfit::run::{RunPath, Start};

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
    if !cfg!(feature = "mpi") {
        bail!(
            "--ranks {n}: this vramfit was built without MPI; rebuild with `cargo build --release -p vramfit-cli \
             --features mpi` (it needs an MPI library and libclang: on Debian `apt install libopenmpi-dev \
             openmpi-bin libclang-dev`)"
        );
    }
    let exe = std::env::current_exe()?;
    let status = std::process::Command::new("mpirun")
        // More ranks than cores is allowed (they then share the cores).
        .args(["-n", &n.to_string(), "--oversubscribe"])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        // Open MPI refuses root without these; its shared-memory transport
        // needs ptrace rights in containers unless single copies are off.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        // Ranks on one machine: the data through shared memory only, and
        // the launcher's own channel on loopback (`mpirun` 4.1 still opens
        // two more listening sockets on every interface: docs/design.md).
        .env("OMPI_MCA_btl", "self,vader")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .status()
        .map_err(|e| {
            anyhow::anyhow!(
                "--ranks {n} starts the ranks with `mpirun`, which could not be run ({e}): install Open MPI \
                 (Debian: `apt install openmpi-bin`)"
            )
        })?;
    if !status.success() {
        bail!("the {n} ranks ended with {status}: the failing rank's error is above");
    }
    Ok(())
}

/// The run directory of rank `rank` for a run at `root`.
pub fn rank_dir(root: &Path, rank: usize) -> std::path::PathBuf {
    root.join("ranks").join(format!("rank-{rank}"))
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
