//! Files written atomically: a temporary file beside the target, synced,
//! then renamed over it, so that a crash or a full disk leaves the old file
//! or the new one and never a torn one.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory, flushed and synced, then renamed over the target. A crash
/// leaves either the old file or the new one, never a torn one; a failure
/// (a full disk, a directory in the way) removes the temporary file again.
/// A target that exists and is not a regular file (a device such as
/// `/dev/null`, a pipe, a socket) is refused: the rename would replace it.
/// A symbolic link is written through: its target is replaced, the link
/// kept (a link to nothing is refused); inside a run directory,
/// [`crate::run::RunDir::write`] refuses links first. A file its owner made
/// read-only is refused, not replaced.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    atomic_write_with(path, |w| w.write_all(bytes))
}

/// [`atomic_write`] of the bytes `write` makes as it goes (buffered):
/// a large file need not be whole in memory first.
pub fn atomic_write_with(path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    let resolved;
    let path = if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        resolved = fs::canonicalize(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{} is a symbolic link to a file that cannot be reached ({e}): give a file path",
                    path.display()
                ),
            )
        })?;
        resolved.as_path()
    } else {
        path
    };
    crate::files::outputs::read_only(path)?;
    if let Ok(meta) = fs::metadata(path)
        && !meta.is_file()
    {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file (a device, pipe or socket)"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {what}; vramfit writes files by replacing them, which would replace it: give a file path",
                path.display()
            ),
        ));
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    // The temporary is made here, new: a stale one (or a link planted
    // under its name) is removed first, and `create_new` neither follows a
    // link nor opens a file someone made in between.
    if fs::symlink_metadata(&tmp).is_ok() {
        fs::remove_file(&tmp)?;
    }
    let created = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::PermissionDenied {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{}: permission denied: this user may not write in {}; make the folder writable or give a path \
                     elsewhere",
                        path.display(),
                        dir.display()
                    ),
                )
            } else {
                e
            }
        });
    let written = created.and_then(|f| {
        // std's 8 KiB buffer: the bytes are made in slices already, and a
        // larger buffer is memory a small run's peak would show.
        let mut sink = Sink(io::BufWriter::new(f));
        write(&mut sink)?;
        let f = sink.0.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // Make the rename itself durable.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// True for the name [`atomic_write`] gives its temporary files
/// (`.NAME.tmp-PID`).
pub(super) fn is_temporary(name: &str) -> bool {
    name.starts_with('.')
        && name
            .rsplit_once(".tmp-")
            .is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// What [`atomic_write_with`] writes through (in tests, a simulated full
/// disk can stop it).
struct Sink(io::BufWriter<File>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write_all(&mut self.0, buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(not(test))]
fn write_all(f: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    f.write_all(bytes)
}

// Test seam: a simulated full disk after `n` more bytes on this thread.
#[cfg(test)]
thread_local! {
    static DISK_LEFT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
fn write_all(f: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    let Some(left) = DISK_LEFT.get() else {
        return f.write_all(bytes);
    };
    let n = bytes.len().min(left);
    f.write_all(&bytes[..n])?;
    DISK_LEFT.set(Some(left - n));
    if n < bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            "No space left on device (simulated)",
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("vramfit-atomic-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    /// Runs `f` with a simulated full disk after `bytes` more bytes.
    pub(in crate::run) fn with_disk_left<T>(bytes: usize, f: impl FnOnce() -> T) -> T {
        DISK_LEFT.set(Some(bytes));
        let out = f();
        DISK_LEFT.set(None);
        out
    }

    /// The names in `dir`, sorted.
    pub(in crate::run) fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
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
    fn a_failed_atomic_write_leaves_no_temporary_and_the_old_file_whole() {
        let p = scratch("atomic-fail");
        fs::create_dir_all(&p).unwrap();
        let f = p.join("weights.bin");
        atomic_write(&f, b"old").unwrap();
        // The disk fills part way through the new contents.
        let err = with_disk_left(10, || atomic_write(&f, &[7u8; 4096])).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(fs::read(&f).unwrap(), b"old");
        assert_eq!(names(&p), ["weights.bin"], "a partial temporary file was left behind");
        // A directory in the way: the rename fails, the temporary goes too.
        fs::create_dir(p.join("img.png")).unwrap();
        atomic_write(&p.join("img.png"), b"png").unwrap_err();
        assert_eq!(names(&p), ["img.png", "weights.bin"]);
        fs::remove_dir_all(&p).unwrap();
    }

    /// A link planted under the temporary's own name (`.NAME.tmp-PID`) is
    /// removed, not written through: its target keeps its bytes.
    #[test]
    fn a_link_at_the_temporary_name_is_not_followed() {
        let tmp = scratch("planted");
        std::fs::create_dir_all(&tmp).unwrap();
        let victim = tmp.join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let planted = tmp.join(format!(".summary.json.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        atomic_write(&tmp.join("summary.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(std::fs::read(tmp.join("summary.json")).unwrap(), b"{}");
        assert!(std::fs::symlink_metadata(&planted).is_err(), "the link is gone");
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// A symbolic link is written through: the target holds the new bytes,
    /// the link stays a link; a dangling one is refused.
    #[test]
    fn atomic_write_goes_through_a_symbolic_link() {
        let tmp = scratch("symlink");
        std::fs::create_dir_all(&tmp).unwrap();
        let (target, link) = (tmp.join("target.json"), tmp.join("link.json"));
        std::fs::write(&target, b"old").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        atomic_write(&link, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        let dangling = tmp.join("dangling.json");
        std::os::unix::fs::symlink(tmp.join("nowhere/x.json"), &dangling).unwrap();
        let e = atomic_write(&dangling, b"x").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
