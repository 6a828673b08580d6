//! What a write may replace. A file vramfit writes never replaces:
//! - one of the run's inputs (a checkpoint, a dataset, a config): an
//!   output that is an input file, or lies inside an input folder, is
//!   refused before anything runs;
//! - a file its owner made read-only (the rename that makes a write atomic
//!   would replace it regardless of its mode);
//! - through a link inside a run directory: a run's files are written in
//!   place, and a link there was planted, not made by vramfit.
//!
//! And whether an output's folder can be written at all, asked before the
//! work that makes the output ([`output_folder_problem`]).

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// An input of a run, named for messages: `("--weights", path)`.
pub type Input<'a> = (&'a str, &'a Path);

/// Why `output` may not be written: it is, or lies inside, one of
/// `inputs`. Paths are compared resolved (links followed, `..` removed), so
/// `D/../D/x` and a link to an input are caught; an output that does not
/// exist yet is compared by its resolved folder.
pub fn onto_input(output: &Path, inputs: &[Input<'_>]) -> Option<String> {
    let out = resolved(output)?;
    for &(flag, input) in inputs {
        let Ok(inp) = std::fs::canonicalize(input) else {
            continue;
        };
        if out == inp {
            return Some(format!(
                "{} is {} ({flag}), an input of this run: vramfit never writes over its inputs; give another path",
                output.display(),
                input.display()
            ));
        }
        if inp.is_dir() && out.starts_with(&inp) {
            return Some(format!(
                "{} is {} {} ({flag}), an input of this run: vramfit {}; give a path outside it",
                output.display(),
                if out.exists() { "a file inside" } else { "inside" },
                input.display(),
                if out.exists() {
                    "never writes over its inputs"
                } else {
                    "does not write into its inputs"
                }
            ));
        }
    }
    None
}

/// `path` with links and `..` resolved, also where it does not exist yet:
/// its nearest existing ancestor resolved, the missing rest appended
/// (`..` in the missing rest taken lexically). `ckpt/runs/r1` with no
/// `ckpt/runs` yet is still inside `ckpt`.
fn resolved(path: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    let mut existing = absolute.as_path();
    let mut missing = Vec::new();
    let base = loop {
        if let Ok(p) = std::fs::canonicalize(existing) {
            break p;
        }
        missing.push(existing.file_name()?.to_owned());
        existing = existing.parent()?;
    };
    let mut out = base;
    for part in missing.iter().rev() {
        match Path::new(part).components().next() {
            Some(Component::ParentDir) => {
                out.pop();
            }
            Some(Component::CurDir) | None => {}
            _ => out.push(part),
        }
    }
    Some(out)
}

/// Refuses a file its owner made read-only (no write bit for anyone): the
/// error names the mode and what to do. A file that is not there, or is
/// writable, passes.
pub fn read_only(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o222 == 0 => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is read-only (mode {:04o}): vramfit does not replace a file its owner protected; make it \
                 writable (chmod u+w) or give another path",
                path.display(),
                m.permissions().mode() & 0o7777
            ),
        )),
        _ => Ok(()),
    }
}

/// Refuses a symbolic link at `path` or at any folder between `root` and
/// it (`root` itself may be a link: the user named it). A run directory's
/// files are written in place; a link inside it was not made by vramfit,
/// and writing through it would replace whatever it points at.
pub fn no_link_below(root: &Path, path: &Path) -> io::Result<()> {
    let Ok(rest) = path.strip_prefix(root) else {
        return Ok(());
    };
    let mut at = root.to_path_buf();
    for part in rest.components() {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symbolic link inside the run directory {}, which vramfit did not make: a run's files \
                     are written in place, never through a link; remove the link",
                    at.display(),
                    root.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The first symbolic link inside the run directory `root`, at any depth
/// (its root may be one: the user named it), or the first entry that is
/// neither a file nor a folder (a FIFO, a device, a socket). vramfit makes
/// none there, so one found was planted: a resume or a report refuses the
/// folder rather than read or write through it (a checkpoint folder
/// linked elsewhere would have its files read, and stale temporaries
/// removed, outside; a FIFO as `metrics.jsonl` would fail the run after
/// its steps).
pub fn planted_link(root: &Path) -> Option<PathBuf> {
    let mut folders = vec![root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > 1_000_000 {
                return None;
            }
            match entry.file_type() {
                Ok(t) if t.is_dir() => folders.push(entry.path()),
                Ok(t) if !t.is_file() => return Some(entry.path()),
                _ => {}
            }
        }
    }
    None
}

/// [`planted_link`] as an error naming the link and what to do.
pub fn no_planted_link(root: &Path) -> io::Result<()> {
    match planted_link(root) {
        None => Ok(()),
        Some(link) if std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) => {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symbolic link inside the run directory {} (to {}), which vramfit did not make: a run's \
                     files are read and written in place, never through a link; remove it (or put a copy of what \
                     it points at in its place)",
                    link.display(),
                    root.display(),
                    std::fs::read_link(&link).map_or("?".into(), |t| t.display().to_string())
                ),
            ))
        }
        Some(odd) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} inside the run directory {} is {}, which vramfit did not make: a run holds files and folders \
                 only; remove it",
                odd.display(),
                root.display(),
                crate::files::confine::not_regular(&odd).unwrap_or("not a regular file")
            ),
        )),
    }
}

/// Why an output file cannot be written in `path`'s folder, if it
/// cannot: the folder missing, or a probe file not creatable there (the
/// probe is removed); `untouched` says in brackets what was left undone
/// ("nothing was run"). For commands to call before the work that makes
/// the file.
pub fn output_folder_problem(path: &Path, untouched: &str) -> Option<String> {
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !folder.is_dir() {
        return Some(format!("the folder {} does not exist ({untouched})", folder.display()));
    }
    let probe = folder.join(format!(".vramfit-write-probe-{}", std::process::id()));
    // Made new (a link planted under the probe's name is removed, never
    // followed: its target would be truncated).
    if fs::symlink_metadata(&probe).is_ok() {
        let _ = fs::remove_file(&probe);
    }
    match OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            None
        }
        Err(e) => Some(format!("cannot write in {} ({e}; {untouched})", folder.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writability probe a command makes before its work is made new:
    /// a link planted under its name is removed, its target not truncated.
    #[test]
    fn the_write_probe_does_not_follow_a_planted_link() {
        let tmp = std::env::temp_dir().join(format!("vramfit-dir-probe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        let victim = tmp.join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let planted = tmp.join(format!(".vramfit-write-probe-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert_eq!(output_folder_problem(&tmp.join("out.png"), "nothing was run"), None);
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        let _ = std::fs::remove_dir_all(&tmp);
    }

    fn scratch(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("vramfit-outputs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// An output that is an input, is inside an input folder (also by a
    /// `..` detour or a link), is refused; one beside them passes.
    #[test]
    fn an_output_is_never_an_input() {
        let p = scratch("inputs");
        let ckpt = p.join("ckpt");
        std::fs::create_dir_all(&ckpt).unwrap();
        std::fs::write(ckpt.join("model.safetensors"), b"x").unwrap();
        std::fs::write(p.join("config.toml"), b"x").unwrap();
        std::os::unix::fs::symlink(ckpt.join("model.safetensors"), p.join("link.json")).unwrap();
        let inputs: [Input; 2] = [("--weights", &ckpt), ("--config", &p.join("config.toml"))];
        let e = onto_input(&ckpt.join("model.safetensors"), &inputs).unwrap();
        assert!(e.contains("--weights") && e.contains("never writes over"), "{e}");
        assert!(onto_input(&ckpt.join("new.json"), &inputs).unwrap().contains("inside"));
        // Two levels that do not exist yet are still inside.
        assert!(onto_input(&ckpt.join("runs/r1"), &inputs).unwrap().contains("inside"));
        assert!(onto_input(&ckpt.join("../ckpt/x.json"), &inputs).is_some());
        assert!(onto_input(&p.join("link.json"), &inputs).is_some());
        assert!(
            onto_input(&p.join("config.toml"), &inputs)
                .unwrap()
                .contains("--config")
        );
        assert_eq!(onto_input(&p.join("plan.json"), &inputs), None);
        let _ = std::fs::remove_dir_all(&p);
    }

    /// A read-only file is refused, naming its mode; a writable one passes.
    #[test]
    fn a_read_only_file_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let p = scratch("readonly");
        let f = p.join("kept.json");
        std::fs::write(&f, b"mine").unwrap();
        read_only(&f).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).unwrap();
        let e = read_only(&f).unwrap_err().to_string();
        assert!(e.contains("read-only (mode 0444)"), "{e}");
        read_only(&p.join("absent.json")).unwrap();
        let _ = std::fs::remove_dir_all(&p);
    }

    /// A link at the file or at a folder inside the run is refused; the
    /// run's own root may be a link.
    #[test]
    fn no_write_through_a_link_inside_a_run() {
        let p = scratch("links");
        let run = p.join("run");
        std::fs::create_dir_all(run.join("checkpoints")).unwrap();
        std::fs::write(p.join("victim"), b"keep").unwrap();
        std::os::unix::fs::symlink(p.join("victim"), run.join("memory.html")).unwrap();
        std::os::unix::fs::symlink(&p, run.join("elsewhere")).unwrap();
        no_link_below(&run, &run.join("summary.json")).unwrap();
        no_link_below(&run, &run.join("checkpoints/step-1")).unwrap();
        let e = no_link_below(&run, &run.join("memory.html")).unwrap_err().to_string();
        assert!(e.contains("symbolic link") && e.contains("memory.html"), "{e}");
        assert!(no_link_below(&run, &run.join("elsewhere/x")).is_err());
        std::os::unix::fs::symlink(&run, p.join("run-link")).unwrap();
        no_link_below(&p.join("run-link"), &p.join("run-link/summary.json")).unwrap();
        // The scan finds a link at any depth; a run without one passes.
        assert!(planted_link(&run).is_some());
        let clean = p.join("clean");
        std::fs::create_dir_all(clean.join("checkpoints")).unwrap();
        std::fs::write(clean.join("checkpoints/step-2.ckpt"), b"x").unwrap();
        assert_eq!(planted_link(&clean), None);
        std::os::unix::fs::symlink(p.join("victim"), clean.join("checkpoints/.step-4.ckpt.tmp-99")).unwrap();
        let e = no_planted_link(&clean).unwrap_err().to_string();
        assert!(e.contains(".step-4.ckpt.tmp-99") && e.contains("victim"), "{e}");
        let _ = std::fs::remove_dir_all(&p);
    }
}
