//! A family's run on data-parallel ranks, readied before any rank starts:
//! a whole batch split over the ranks, the split checked, and a resume
//! readied (every rank's folder held, the state regathered for another
//! rank count, the ranks' checkpoints aligned to the newest step all of
//! them wrote). Starting the ranks (`mpirun`) is the front end's.

use std::path::{Path, PathBuf};

use vramfit::files::read::{Links, read_text};
use vramfit::ranks::UnevenSplit;
use vramfit::run::{RankFoldersError, RunDir, RunDirError, align_checkpoints, rank_dirs, regather};

use crate::config::FamilyConfig;
use crate::family::Family;

/// Why ranks cannot start; nothing in a run was changed unless the error
/// says what was.
#[derive(Debug, thiserror::Error)]
pub enum RanksError {
    /// No rank.
    #[error("{what}: must be at least 1")]
    NoRank {
        /// Where the count came from ("--ranks 0", "setting `ranks`").
        what: String,
    },
    /// The micro-batches do not share evenly.
    #[error("{what}: {split}")]
    Uneven {
        /// Where the count came from.
        what: String,
        /// The split, and one that works.
        split: UnevenSplit,
    },
    /// The run to resume finished.
    #[error("cannot resume {0}: the run already finished (summary.json exists)")]
    Finished(PathBuf),
    /// The run to resume is another workload's.
    #[error("cannot resume {root}: it is not a run of {workload}")]
    OtherWorkload {
        /// The run.
        root: PathBuf,
        /// The workload asked for.
        workload: String,
    },
    /// Another rank count needs the run's settings, which do not read.
    #[error("cannot resume {root} on {ranks} ranks: its config.toml does not read")]
    NoSettings {
        /// The run.
        root: PathBuf,
        /// The ranks asked for.
        ranks: usize,
    },
    /// The front end cannot start the ranks (its launcher is missing).
    #[error("{0}")]
    Launcher(Box<dyn std::error::Error + Send + Sync>),
    /// A rank's folder cannot be held (in use, or not a run).
    #[error(transparent)]
    Dir(#[from] RunDirError),
    /// The rank folders cannot be regathered or aligned.
    #[error(transparent)]
    Folders(#[from] RankFoldersError),
}

/// A new run's settings readied for its ranks (`config.ranks`): a batch
/// given whole split over them ([`split_over_ranks`]), and the split
/// checked. Returns the note that says it split, where it did.
pub fn ready_new<F: Family<D>, const D: usize>(config: &mut FamilyConfig<F>) -> Result<Option<String>, RanksError> {
    let note = split_over_ranks(config);
    check_ranks(config, config.ranks, "setting `ranks`")?;
    Ok(note)
}

/// As data-parallel tools do, a batch given whole (no micro-batches) on N
/// ranks is split over them: N micro-batches of batch/N, one a rank (the
/// same batch, the same gradient up to the order of the sums). Returns
/// the note that says so, where it split.
fn split_over_ranks<F: Family<D>, const D: usize>(config: &mut FamilyConfig<F>) -> Option<String> {
    let (ranks, batch) = (config.ranks, config.batch_size);
    let whole = config.accumulate == 1 && (config.micro_batch == 0 || config.micro_batch == batch);
    if ranks <= 1 || !whole || !batch.is_multiple_of(ranks) {
        return None;
    }
    config.micro_batch = batch / ranks;
    config.accumulate = ranks;
    Some(format!(
        "note: the batch of {batch} is split over the {ranks} ranks: {ranks} micro-batches of {}, one a rank \
         (--micro-batch {} --accumulate {ranks})",
        batch / ranks,
        batch / ranks
    ))
}

/// At least one rank, and the micro-batches shared evenly among `ranks`;
/// `what` says where the count came from.
fn check_ranks<F: Family<D>, const D: usize>(
    config: &FamilyConfig<F>,
    ranks: usize,
    what: &str,
) -> Result<(), RanksError> {
    if ranks == 0 {
        return Err(RanksError::NoRank { what: what.into() });
    }
    let micro = if config.micro_batch == 0 {
        config.batch_size
    } else {
        config.micro_batch
    };
    vramfit::ranks::check_split(micro, config.accumulate, ranks).map_err(|split| RanksError::Uneven {
        what: what.into(),
        split,
    })
}

/// What readying a resume did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyResume {
    /// The ranks the run resumes on.
    pub ranks: usize,
    /// Where the run ran on another count: that count and the step whose
    /// state was gathered for the new one.
    pub regathered: Option<(usize, u64)>,
    /// Where the ranks' newest checkpoints differed: the step all of them
    /// resume from (the newer ones removed).
    pub aligned: Option<u64>,
}

/// Readies the run at `dir` to resume as `workload` on `ranks` (or on the
/// ranks it ran on), from the launching process (`launcher`: not itself a
/// rank). Before anything changes, a finished run or another workload's is
/// refused, `launcher_ready` is asked whether the ranks can start, and
/// every rank's folder is held (a run still going, or another resume of
/// it, is refused); then the state is regathered for another count and
/// the ranks' checkpoints aligned. A rank does none of this.
pub fn ready_resume<F: Family<D>, const D: usize>(
    dir: &Path,
    workload: &str,
    ranks: Option<usize>,
    launcher: bool,
    launcher_ready: impl FnOnce(usize) -> Result<(), Box<dyn std::error::Error + Send + Sync>>,
) -> Result<ReadyResume, RanksError> {
    // The run's ranks are its config's (none readable: not a run, and
    // the resume says why), or another count: the state is regathered.
    let path = dir.join("config.toml");
    let config = read_text(&path, Links::Refuse)
        .ok()
        .and_then(|text| FamilyConfig::<F>::from_toml(&text, &path).ok());
    let ranks = ranks.or(config.as_ref().map(|c| c.ranks)).unwrap_or(1);
    let wrote = rank_dirs(dir).len();
    let mut ready = ReadyResume {
        ranks,
        regathered: None,
        aligned: None,
    };
    if !launcher || (ranks == wrote && ranks == 1) {
        return Ok(ready);
    }
    let _held = hold_for_resume(dir, workload, ranks, launcher_ready)?;
    if ranks != wrote {
        let Some(mut config) = config else {
            return Err(RanksError::NoSettings {
                root: dir.into(),
                ranks,
            });
        };
        check_ranks(&config, ranks, &format!("--ranks {ranks}"))?;
        config.ranks = ranks;
        config.shard_moments &= ranks > 1;
        ready.regathered = Some((wrote, regather(dir, ranks, &config.to_toml())?));
    }
    if ranks > 1 {
        ready.aligned = align_checkpoints(dir)?;
    }
    Ok(ready)
}

/// Checks that the run at `root` can be resumed as `workload` on `ranks`
/// (not finished, that workload's, the launcher ready) and holds every
/// rank's folder until the returned folders are dropped.
fn hold_for_resume(
    root: &Path,
    workload: &str,
    ranks: usize,
    launcher_ready: impl FnOnce(usize) -> Result<(), Box<dyn std::error::Error + Send + Sync>>,
) -> Result<Vec<RunDir>, RanksError> {
    if root.join("summary.json").exists() {
        return Err(RanksError::Finished(root.into()));
    }
    if let Ok(started) = read_text(&root.join("workload"), Links::Refuse)
        && started.trim() != workload
    {
        return Err(RanksError::OtherWorkload {
            root: root.into(),
            workload: workload.into(),
        });
    }
    launcher_ready(ranks).map_err(RanksError::Launcher)?;
    Ok(rank_dirs(root)
        .iter()
        .map(|(_, d)| RunDir::open(d))
        .collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::GptConfig;

    fn config(batch_size: usize, micro_batch: usize, accumulate: usize, ranks: usize) -> FamilyConfig<GptConfig> {
        FamilyConfig {
            batch_size,
            micro_batch,
            accumulate,
            ranks,
            ..Default::default()
        }
    }

    /// A batch given whole is split one micro-batch a rank, and said so;
    /// one already split, on one rank, or that does not divide is left as
    /// it is. The split is checked: no rank, or micro-batches the ranks
    /// do not share evenly, refused by kind.
    #[test]
    fn a_whole_batch_is_split_one_micro_batch_a_rank() {
        let mut c = config(8, 0, 1, 4);
        let note = split_over_ranks(&mut c).unwrap();
        assert_eq!((c.micro_batch, c.accumulate), (2, 4));
        assert!(note.contains("--micro-batch 2 --accumulate 4"), "{note}");
        check_ranks(&c, 4, "--ranks 4").unwrap();
        for (batch, micro, accumulate, ranks) in [(8, 2, 4, 2), (8, 0, 1, 1), (9, 0, 1, 2)] {
            let mut c = config(batch, micro, accumulate, ranks);
            assert!(split_over_ranks(&mut c).is_none());
            assert_eq!(c, config(batch, micro, accumulate, ranks));
        }
        assert!(matches!(
            check_ranks(&c, 0, "--ranks 0"),
            Err(RanksError::NoRank { .. })
        ));
        let e = check_ranks(&config(8, 2, 4, 3), 3, "--ranks 3").unwrap_err();
        assert!(matches!(e, RanksError::Uneven { .. }), "{e}");
        assert!(e.to_string().starts_with("--ranks 3: "), "{e}");
        let mut whole = config(8, 0, 1, 4);
        assert!(ready_new(&mut whole).unwrap().is_some());
        assert_eq!(whole, c);
        let e = ready_new(&mut config(8, 2, 4, 3)).unwrap_err();
        assert!(e.to_string().starts_with("setting `ranks`: "), "{e}");
    }

    /// What the run's folder holds, names and sizes.
    fn listing(dir: &Path) -> Vec<(PathBuf, u64)> {
        let mut out: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| (e.path(), e.metadata().unwrap().len()))
            .collect();
        out.sort();
        out
    }

    /// A rank readies nothing; the launcher refuses a finished run, another
    /// workload's and a launcher that cannot start, each before anything in
    /// the run changes (the launcher not even asked for the first two).
    #[test]
    fn a_resume_is_refused_before_anything_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        std::fs::create_dir_all(run.join("ranks/rank-1")).unwrap();
        std::fs::write(run.join("workload"), "vramfit train transformer\n").unwrap();
        let ready = |workload: &str, ranks, launcher, asked: &mut bool| {
            ready_resume::<GptConfig, 3>(&run, workload, ranks, launcher, |_| {
                *asked = true;
                Err("mpirun is not installed".into())
            })
        };
        let mut asked = false;
        let r = ready("vramfit train transformer", Some(2), false, &mut asked).unwrap();
        assert_eq!(
            r,
            ReadyResume {
                ranks: 2,
                regathered: None,
                aligned: None
            }
        );
        assert!(!asked);
        let before = listing(&run);
        let e = ready("vramfit train unet", Some(2), true, &mut asked).unwrap_err();
        assert!(matches!(e, RanksError::OtherWorkload { .. }) && !asked, "{e}");
        let e = ready("vramfit train transformer", Some(2), true, &mut asked).unwrap_err();
        assert!(matches!(e, RanksError::Launcher(_)) && asked, "{e}");
        assert!(e.to_string().contains("mpirun is not installed"), "{e}");
        std::fs::write(run.join("summary.json"), "{}").unwrap();
        asked = false;
        let e = ready("vramfit train transformer", Some(3), true, &mut asked).unwrap_err();
        assert!(matches!(e, RanksError::Finished(_)) && !asked, "{e}");
        std::fs::remove_file(run.join("summary.json")).unwrap();
        assert_eq!(listing(&run), before);
    }
}
