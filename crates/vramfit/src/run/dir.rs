use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Errors opening or writing a run directory.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// The directory exists and the run is not a resume.
    #[error("run directory '{0}' already exists; choose another --out, or pass --resume {0} to continue it")]
    Exists(PathBuf),
    /// The directory to resume is missing or incomplete.
    #[error("cannot resume '{path}': {why}")]
    NotResumable {
        /// The directory.
        path: PathBuf,
        /// What is missing.
        why: String,
    },
    /// Any I/O failure, with the path it concerned.
    #[error("cannot write '{path}': {cause}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        cause: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RunDirError + '_ {
    move |cause| RunDirError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory, flushed and synced, then renamed over the target. A crash
/// leaves either the old file or the new one, never a torn one.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    // Make the rename itself durable.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The first `base/prefix-NNN` that does not exist yet.
pub fn next_free_run_dir(base: &Path, prefix: &str) -> PathBuf {
    (1..)
        .map(|i| base.join(format!("{prefix}-{i:03}")))
        .find(|p| !p.exists())
        .expect("an unbounded range always yields a free name")
}

/// An open run directory.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// Creates a new run directory; refuses one that exists.
    pub fn create(root: &Path) -> Result<Self, RunDirError> {
        if root.exists() {
            return Err(RunDirError::Exists(root.to_path_buf()));
        }
        // Errors name the run directory, whichever ancestor failed.
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(io_err(root))?;
        }
        fs::create_dir(root).map_err(io_err(root))?;
        let dir = Self {
            root: root.to_path_buf(),
        };
        fs::create_dir(dir.checkpoints()).map_err(io_err(root))?;
        fs::create_dir(dir.path("frames")).map_err(io_err(root))?;
        Ok(dir)
    }

    /// Opens an existing run directory to resume it.
    pub fn open(root: &Path) -> Result<Self, RunDirError> {
        if !root.is_dir() {
            return Err(RunDirError::NotResumable {
                path: root.to_path_buf(),
                why: "no such directory".into(),
            });
        }
        Ok(Self {
            root: root.to_path_buf(),
        })
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

    /// Writes a file inside the directory atomically.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), RunDirError> {
        let p = self.path(name);
        atomic_write(&p, bytes).map_err(io_err(&p))
    }

    /// Opens `metrics.jsonl` for appending, first dropping every line whose
    /// `step` is above `keep_up_to` (the lines a resumed run will write again).
    pub fn metrics(&self, keep_up_to: Option<u64>) -> Result<JsonLines, RunDirError> {
        let p = self.path("metrics.jsonl");
        if let Some(limit) = keep_up_to {
            let kept: String = fs::read_to_string(&p)
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                        .is_some_and(|s| s <= limit)
                })
                .map(|l| format!("{l}\n"))
                .collect();
            atomic_write(&p, kept.as_bytes()).map_err(io_err(&p))?;
        }
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .map_err(io_err(&p))?;
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

/// The file name of the checkpoint taken after `step` (sorts by step).
pub fn checkpoint_name(step: u64) -> String {
    format!("step-{step:08}.ckpt")
}

/// Checkpoint files (`*.ckpt`) in `dir`, newest first; none if `dir` is unreadable.
pub fn checkpoints_newest_first(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .collect();
    found.sort();
    found.reverse();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

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
            err.to_string().contains("already exists") && err.to_string().contains("--resume"),
            "{err}"
        );
        fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn atomic_write_replaces_whole_and_leaves_no_temporary() {
        let p = scratch("atomic");
        fs::create_dir_all(&p).unwrap();
        let f = p.join("x.bin");
        atomic_write(&f, b"old").unwrap();
        atomic_write(&f, b"new contents").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"new contents");
        assert_eq!(fs::read_dir(&p).unwrap().count(), 1, "temporary file left behind");
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
