//! The run directory: one per run, claimed atomically and locked while a
//! run uses it, never overwritten silently; its files are written through
//! [`super::atomic_write`], its metrics streamed as JSON lines (read back
//! by `metrics_log.rs`; its checkpoints named by `checkpoint_files.rs`).

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, BufWriter, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::atomic::{atomic_write, is_temporary};
use crate::remedy::Remedy;

/// The lock file inside every run directory (see [`RunDir`]).
pub const LOCK_FILE: &str = ".lock";
/// Folders every run directory has.
const SUBFOLDERS: [&str; 2] = ["checkpoints", "frames"];

/// Errors opening or writing a run directory.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// The directory exists and the run is not a resume.
    #[error("run directory '{0}' already exists; {other}{hint}", other = Remedy::OtherRunDir, hint = resume_hint(.0))]
    Exists(PathBuf),
    /// The path is taken by something that is not a run directory (a
    /// file, or a folder with neither a run's `config.toml` nor its lock
    /// file): resuming it cannot work, so the error does not suggest it.
    #[error("'{path}' {what}; {}", Remedy::OtherRunDir)]
    Taken {
        /// The path.
        path: PathBuf,
        /// What is there, in words.
        what: &'static str,
    },
    /// The directory to resume is missing or incomplete.
    #[error("cannot resume '{path}': {why}")]
    NotResumable {
        /// The directory.
        path: PathBuf,
        /// What is missing.
        why: String,
    },
    /// Another process holds the directory's lock.
    #[error(
        "run directory '{path}' is in use by another vramfit process{}; wait for it to finish (or stop it), then try again",
        pid.map(|p| format!(" (PID {p})")).unwrap_or_default()
    )]
    Busy {
        /// The directory.
        path: PathBuf,
        /// The process that holds it, as its lock file says.
        pid: Option<u32>,
    },
    /// Creating a new run directory failed part way; what was created has
    /// been removed again.
    #[error(
        "cannot create run directory '{root}': writing '{path}' failed: {cause}; nothing was kept (the directory was removed), so the same command can run again once that is fixed"
    )]
    CreateFailed {
        /// The run directory.
        root: PathBuf,
        /// The file or folder whose creation failed.
        path: PathBuf,
        /// The OS error.
        cause: io::Error,
    },
    /// Any I/O failure, with the path it concerned.
    #[error("cannot write '{path}': {cause}{}", full_disk_hint(cause, path))]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        cause: io::Error,
    },
}

/// What a full disk means for a run, after the OS's words: the run
/// directory is the nearest folder above `path` holding a `config.toml`.
fn full_disk_hint(cause: &io::Error, path: &Path) -> String {
    if !matches!(cause.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded) {
        return String::new();
    }
    let run = path
        .ancestors()
        .skip(1)
        .find(|d| d.join("config.toml").is_file())
        // A rank's folder (`RUN/ranks/rank-R`) is resumed through its run.
        .map(
            |d| match d.parent().filter(|p| p.file_name().is_some_and(|n| n == "ranks")) {
                Some(ranks) => ranks.parent().unwrap_or(d),
                None => d,
            },
        )
        .map_or("RUN_DIR".into(), Path::to_path_buf);
    format!(
        ". Free space and {}: it continues from its last checkpoint as if it had not stopped",
        Remedy::Resume(run)
    )
}

/// After "already exists": what to do with the run there, if it is one.
fn resume_hint(root: &Path) -> String {
    if root.join("summary.json").is_file() {
        format!(" (the run there finished: {})", Remedy::Report(root.into()))
    } else if root.join("config.toml").is_file() || root.join(LOCK_FILE).is_file() {
        format!(", or {} to continue it", Remedy::Resume(root.into()))
    } else {
        String::new()
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RunDirError + '_ {
    move |cause| RunDirError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// The first `base/prefix-NNN` that does not exist yet. Another process may
/// take it before it is created: [`RunDir::create_next`] claims one atomically.
pub fn next_free_run_dir(base: &Path, prefix: &str) -> PathBuf {
    (1..)
        .map(|i| base.join(format!("{prefix}-{i:03}")))
        .find(|p| fs::symlink_metadata(p).is_err())
        .expect("an unbounded range always yields a free name")
}

/// An open run directory, locked for as long as this value lives: a second
/// [`RunDir`] of the same directory, in this process or another, is refused
/// with [`RunDirError::Busy`]. The lock (an advisory `flock` on
/// `RUN_DIR/.lock`, which records the holder's PID) is released when the
/// value is dropped or the process dies, however it dies.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
    /// Made by [`RunDir::create`] and nothing written in it yet: a failed
    /// first write removes the directory again.
    provisional: AtomicBool,
    _lock: File,
}

/// Locks `root` (creating its lock file) or says who holds it.
fn lock(root: &Path) -> Result<File, RunDirError> {
    let path = root.join(LOCK_FILE);
    // Never through a link: a planted one would have its target truncated.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io_err(&path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let pid = fs::read_to_string(&path).ok().and_then(|s| s.trim().parse().ok());
            return Err(RunDirError::Busy {
                path: root.to_path_buf(),
                pid,
            });
        }
        // A file system without locks: run unlocked rather than not at all.
        Err(TryLockError::Error(e)) if e.kind() == io::ErrorKind::Unsupported => {}
        Err(TryLockError::Error(e)) => return Err(io_err(&path)(e)),
    }
    // The holder's PID, for the message a second process shows (best effort:
    // the lock itself is what counts).
    let _ = file.set_len(0).and_then(|()| {
        let mut f = &file;
        f.rewind()?;
        write!(f, "{}", std::process::id())
    });
    Ok(file)
}

/// Creates the missing ancestors of `dir`; returns those it created,
/// deepest first.
fn create_ancestors(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let missing: Vec<PathBuf> = dir
        .ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .take_while(|p| !p.exists())
        .map(Path::to_path_buf)
        .collect();
    if !missing.is_empty() {
        fs::create_dir_all(dir)?;
    }
    Ok(missing)
}

impl RunDir {
    /// Creates a new run directory, with `checkpoints/` and `frames/`;
    /// refuses one that exists. Until its first successful [`RunDir::write`]
    /// the directory is provisional: if that write fails, the directory is
    /// removed again. [`RunDir::create_with`] writes the first files as part
    /// of the creation instead.
    pub fn create(root: &Path) -> Result<Self, RunDirError> {
        let dir = Self::create_with(root, &[])?;
        dir.provisional.store(true, Ordering::Relaxed);
        Ok(dir)
    }

    /// Creates a new run directory holding `files` (`(name, bytes)`, e.g.
    /// `config.toml`), all or nothing: if any folder or file cannot be
    /// written (a full disk), everything created is removed and the error
    /// says so. The name is claimed atomically: of two processes creating
    /// the same directory, exactly one succeeds; the other gets
    /// [`RunDirError::Exists`].
    pub fn create_with(root: &Path, files: &[(&str, &[u8])]) -> Result<Self, RunDirError> {
        if let Ok(meta) = fs::symlink_metadata(root) {
            let what = if meta.file_type().is_symlink() {
                "is a symbolic link, not a new folder (vramfit makes the run's folder itself)"
            } else if !meta.is_dir() {
                "exists and is not a folder"
            } else if !root.join("config.toml").is_file() && !root.join(LOCK_FILE).is_file() {
                "is an existing folder that is not a vramfit run (it has no config.toml)"
            } else {
                return Err(RunDirError::Exists(root.to_path_buf()));
            };
            return Err(RunDirError::Taken {
                path: root.to_path_buf(),
                what,
            });
        }
        let parent = root.parent().filter(|p| !p.as_os_str().is_empty());
        // Errors name the run directory, whichever ancestor failed.
        let made = match parent {
            Some(parent) => create_ancestors(parent).map_err(io_err(root))?,
            None => Vec::new(),
        };
        let undo_ancestors = || {
            for p in &made {
                let _ = fs::remove_dir(p);
            }
        };
        // `create_dir` on the final name is the atomic claim.
        match fs::create_dir(root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(RunDirError::Exists(root.to_path_buf()));
            }
            Err(e) => {
                undo_ancestors();
                return Err(io_err(root)(e));
            }
        }
        let lock = match lock(root) {
            Ok(lock) => lock,
            // Someone opened the brand-new directory: it is theirs now.
            Err(e @ RunDirError::Busy { .. }) => return Err(e),
            Err(RunDirError::Io { path, cause }) => {
                let _ = fs::remove_dir_all(root);
                undo_ancestors();
                return Err(RunDirError::CreateFailed {
                    root: root.to_path_buf(),
                    path,
                    cause,
                });
            }
            Err(other) => return Err(other),
        };
        let populate = || -> Result<(), (PathBuf, io::Error)> {
            for sub in SUBFOLDERS {
                let p = root.join(sub);
                fs::create_dir(&p).map_err(|e| (p, e))?;
            }
            for (name, bytes) in files {
                let p = root.join(name);
                atomic_write(&p, bytes).map_err(|e| (p, e))?;
            }
            Ok(())
        };
        if let Err((path, cause)) = populate() {
            let _ = fs::remove_dir_all(root);
            undo_ancestors();
            return Err(RunDirError::CreateFailed {
                root: root.to_path_buf(),
                path,
                cause,
            });
        }
        Ok(Self {
            root: root.to_path_buf(),
            provisional: AtomicBool::new(false),
            _lock: lock,
        })
    }

    /// Creates the first free `base/prefix-NNN` (see [`RunDir::create_with`]),
    /// safe against other processes doing the same at the same moment: a
    /// name taken between the look and the claim is skipped.
    pub fn create_next(base: &Path, prefix: &str, files: &[(&str, &[u8])]) -> Result<Self, RunDirError> {
        let mut last = None;
        for i in 1..=9_999_999u32 {
            let root = base.join(format!("{prefix}-{i:03}"));
            if fs::symlink_metadata(&root).is_ok() {
                continue;
            }
            match Self::create_with(&root, files) {
                // Claimed by another creator since the look above; one that
                // has made the folder but not yet its lock looks like a
                // folder that is not a run (`Taken`): the name is theirs.
                Err(RunDirError::Exists(p) | RunDirError::Taken { path: p, .. }) => last = Some(p),
                other => return other,
            }
        }
        Err(RunDirError::Exists(last.unwrap_or_else(|| base.join(prefix))))
    }

    /// Opens an existing run directory to resume it: takes its lock, then
    /// removes the temporary files that an interrupted write left behind
    /// (`.NAME.tmp-PID`, in the directory, `checkpoints/` and `frames/`).
    pub fn open(root: &Path) -> Result<Self, RunDirError> {
        if !root.is_dir() {
            return Err(RunDirError::NotResumable {
                path: root.to_path_buf(),
                why: "no such directory".into(),
            });
        }
        // Before the lock: a folder that is not a run is left as it was. (A
        // config.toml that is there but not a file is the reader's to name.)
        let config = root.join("config.toml");
        if !(config.exists() || config.is_symlink()) {
            return Err(RunDirError::NotResumable {
                path: root.to_path_buf(),
                why: format!(
                    "it is not a vramfit run (it has no config.toml); {}",
                    Remedy::RunDirWritten
                ),
            });
        }
        // Before anything is read, locked or removed: a link planted in the
        // run (a checkpoints folder elsewhere, `weights.bin` onto a file of
        // the user's, a temporary's name) is refused.
        crate::files::outputs::no_planted_link(root).map_err(|e| RunDirError::NotResumable {
            path: root.to_path_buf(),
            why: e.to_string(),
        })?;
        let lock = lock(root)?;
        let dir = Self {
            root: root.to_path_buf(),
            provisional: AtomicBool::new(false),
            _lock: lock,
        };
        dir.remove_temporaries();
        Ok(dir)
    }

    /// Removes stale temporary files; the lock guarantees no other run is
    /// writing them.
    fn remove_temporaries(&self) {
        let folders = std::iter::once(self.root.clone()).chain(SUBFOLDERS.map(|s| self.path(s)));
        for folder in folders {
            for entry in fs::read_dir(&folder).into_iter().flatten().flatten() {
                let stale = entry.file_name().to_str().is_some_and(is_temporary)
                    && entry.file_type().is_ok_and(|t| t.is_file());
                if stale {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
    }

    /// Removes a provisional directory that holds only what
    /// [`RunDir::create`] made; true when it is gone.
    fn remove_if_untouched(&self) -> bool {
        let only_ours = |dir: &Path, folders: bool| {
            fs::read_dir(dir).is_ok_and(|entries| {
                entries.flatten().all(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let file = e.file_type().is_ok_and(|t| t.is_file());
                    (file && (name == LOCK_FILE || is_temporary(&name)))
                        || (folders
                            && SUBFOLDERS.contains(&name.as_str())
                            && fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_none()))
                })
            })
        };
        only_ours(&self.root, true) && fs::remove_dir_all(&self.root).is_ok()
    }
    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A path inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// The checkpoints folder.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// Writes a file inside the directory atomically. The first write into
    /// a directory made by [`RunDir::create`] completes its creation: if it
    /// fails, the directory is removed again (and the error says so).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), RunDirError> {
        let p = self.path(name);
        match crate::files::outputs::no_link_below(&self.root, &p).and_then(|()| atomic_write(&p, bytes)) {
            Ok(()) => {
                self.provisional.store(false, Ordering::Relaxed);
                Ok(())
            }
            Err(cause) if self.provisional.swap(false, Ordering::Relaxed) && self.remove_if_untouched() => {
                Err(RunDirError::CreateFailed {
                    root: self.root.clone(),
                    path: p,
                    cause,
                })
            }
            Err(cause) => Err(io_err(&p)(cause)),
        }
    }

    /// Opens `metrics.jsonl` for appending, first dropping every line whose
    /// `step` is above `keep_up_to` (the lines a resumed run will write again).
    pub fn metrics(&self, keep_up_to: Option<u64>) -> Result<JsonLines, RunDirError> {
        let p = self.path("metrics.jsonl");
        crate::files::outputs::no_link_below(&self.root, &p).map_err(io_err(&p))?;
        if let Some(limit) = keep_up_to {
            let kept: String = crate::files::read::read(&p, crate::files::read::Links::Refuse)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
                .lines()
                .filter(|l| super::metrics_log::line_step(l).is_some_and(|s| s <= limit))
                .map(|l| format!("{l}\n"))
                .collect();
            atomic_write(&p, kept.as_bytes()).map_err(io_err(&p))?;
        }
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .map_err(io_err(&p))?;
        self.provisional.store(false, Ordering::Relaxed);
        Ok(JsonLines {
            path: p,
            out: BufWriter::new(f),
        })
    }
}

/// An append-only JSON-lines stream, flushed after every record so that a
/// crash loses at most the line being written.
#[derive(Debug)]
pub struct JsonLines {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JsonLines {
    /// Appends one record.
    pub fn append<T: serde::Serialize>(&mut self, record: &T) -> Result<(), RunDirError> {
        let line = serde_json::to_string(record).map_err(|e| RunDirError::Io {
            path: self.path.clone(),
            cause: e.into(),
        })?;
        writeln!(self.out, "{line}")
            .and_then(|_| self.out.flush())
            .map_err(io_err(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::atomic::tests::{names, with_disk_left};

    fn scratch(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("vramfit-rundir-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn refuses_to_reuse_a_directory() {
        let p = scratch("reuse");
        RunDir::create(&p).unwrap();
        let err = RunDir::create(&p).unwrap_err();
        assert!(
            err.to_string().contains("already exists") && err.to_string().contains("resume the run in"),
            "{err}"
        );
        fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn creation_is_all_or_nothing_when_the_first_file_cannot_be_written() {
        let base = scratch("create-full");
        let root = base.join("runs").join("fit-001");
        let config: &[u8] = b"steps = 10\nseed = 3\n";
        let err = with_disk_left(4, || RunDir::create_with(&root, &[("config.toml", config)])).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, RunDirError::CreateFailed { .. })
                && msg.contains("config.toml")
                && msg.contains("nothing was kept"),
            "{msg}"
        );
        assert!(!base.exists(), "the failed creation left {base:?} behind");
        // Once there is room, the same creation succeeds.
        let dir = RunDir::create_with(&root, &[("config.toml", config)]).unwrap();
        assert_eq!(fs::read(dir.path("config.toml")).unwrap(), config);
        assert_eq!(names(&root), [".lock", "checkpoints", "config.toml", "frames"]);
        drop(dir);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_failed_first_write_removes_a_created_directory_and_a_later_one_does_not() {
        let p = scratch("first-write");
        let dir = RunDir::create(&p).unwrap();
        let err = with_disk_left(0, || dir.write("config.toml", b"steps = 1\n")).unwrap_err();
        assert!(err.to_string().contains("nothing was kept"), "{err}");
        assert!(!p.exists(), "a run directory without its config was left behind");
        drop(dir);
        // Neither a new run nor anything else is blocked by leftovers.
        let dir = RunDir::create(&p).unwrap();
        dir.write("config.toml", b"steps = 1\n").unwrap();
        let err = with_disk_left(0, || dir.write("memory.json", b"{}")).unwrap_err();
        assert!(matches!(err, RunDirError::Io { .. }), "{err}");
        assert_eq!(names(&p), [".lock", "checkpoints", "config.toml", "frames"]);
        drop(dir);
        fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn resuming_removes_stale_temporary_files_and_keeps_the_rest() {
        let p = scratch("stale");
        let dir = RunDir::create_with(&p, &[("config.toml", b"steps = 1\n")]).unwrap();
        drop(dir);
        for stale in [
            ".memory.json.tmp-4242",
            ".weights.bin.tmp-17",
            "checkpoints/.step-00000020.ckpt.tmp-99",
            "frames/.step-00000010.png.tmp-5",
        ] {
            fs::write(p.join(stale), b"partial").unwrap();
        }
        for keep in ["checkpoints/step-00000010.ckpt", ".hidden", "notes.tmp-1", ".x.tmp-abc"] {
            fs::write(p.join(keep), b"keep").unwrap();
        }
        let dir = RunDir::open(&p).unwrap();
        assert_eq!(
            names(&p),
            [
                ".hidden",
                ".lock",
                ".x.tmp-abc",
                "checkpoints",
                "config.toml",
                "frames",
                "notes.tmp-1"
            ]
        );
        assert_eq!(names(&dir.checkpoints()), ["step-00000010.ckpt"]);
        assert!(names(&dir.path("frames")).is_empty());
        drop(dir);
        fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn racing_creators_each_claim_their_own_directory() {
        let base = scratch("race");
        let n = 8;
        let barrier = std::sync::Barrier::new(n);
        let dirs: Vec<RunDir> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        RunDir::create_next(&base, "fit", &[("config.toml", b"x = 1\n")])
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        let mut roots: Vec<PathBuf> = dirs.iter().map(|d| d.root().to_path_buf()).collect();
        roots.sort();
        let expected: Vec<PathBuf> = (1..=n).map(|i| base.join(format!("fit-{i:03}"))).collect();
        assert_eq!(roots, expected);
        drop(dirs);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_run_directory_is_used_by_one_run_at_a_time() {
        let p = scratch("lock");
        let created = RunDir::create_with(&p, &[("config.toml", b"x = 1\n")]).unwrap();
        let err = RunDir::open(&p).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("in use by another vramfit process") && msg.contains(&format!("PID {}", std::process::id())),
            "{msg}"
        );
        drop(created);
        let first = RunDir::open(&p).unwrap();
        assert!(matches!(RunDir::open(&p), Err(RunDirError::Busy { .. })));
        drop(first);
        RunDir::open(&p).unwrap();
        fs::remove_dir_all(&p).unwrap();
    }

    /// A folder that is not a run is refused as one, and left as it was
    /// (it used to gain a `.lock` file).
    #[test]
    fn resuming_a_folder_that_is_not_a_run_changes_nothing() {
        let p = scratch("notrun");
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("mine.txt"), b"x").unwrap();
        let msg = RunDir::open(&p).unwrap_err().to_string();
        assert!(
            msg.contains("not a vramfit run") && msg.contains("config.toml"),
            "{msg}"
        );
        assert_eq!(names(&p), ["mine.txt"]);
        fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn resuming_drops_metrics_past_the_checkpoint() {
        let p = scratch("metrics");
        let dir = RunDir::create(&p).unwrap();
        let mut m = dir.metrics(None).unwrap();
        for step in [10u64, 20, 30] {
            m.append(&serde_json::json!({ "step": step })).unwrap();
        }
        drop(m);
        dir.metrics(Some(20)).unwrap();
        let text = fs::read_to_string(dir.path("metrics.jsonl")).unwrap();
        assert_eq!(text, "{\"step\":10}\n{\"step\":20}\n");
        fs::remove_dir_all(&p).unwrap();
    }
}
