//! One confinement rule for every path a file names: a dataset's image, a
//! checkpoint index's shard, anything later. The name is read as the file
//! gives it, relative to the folder it lives in; a name that climbs out
//! (`..`), is absolute, or resolves outside that folder through a symlink
//! is refused before anything is opened. Then what is opened must be a
//! regular file: a FIFO would block the read for ever, `/dev/zero` never
//! ends, a folder is not data.

use std::path::{Component, Path, PathBuf};

/// Why a name a file gives may not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outside {
    /// The name as given.
    pub name: String,
    /// How it gets out, in words (`climbs out of its folder (`..`)`).
    pub why: String,
}

/// The file `name` relative to `base` (a folder inside `root`, the folder
/// the naming file confines its names to). A name that climbs out (`..`),
/// is absolute, or resolves outside `root` through a symlink is refused;
/// `what` says what `root` is in the message (`the dataset`, `the
/// checkpoint`). A name that points at nothing is returned, for the caller
/// to call missing.
pub fn inside(root: &Path, base: &Path, name: &str, what: &str) -> Result<PathBuf, Outside> {
    let outside = |why: String| Outside { name: name.into(), why };
    if name.is_empty() {
        return Err(outside("is empty".into()));
    }
    let path = Path::new(name);
    for c in path.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err(outside("climbs out of its folder (`..`)".into())),
            Component::RootDir | Component::Prefix(_) => return Err(outside("is an absolute path".into())),
        }
    }
    let file = base.join(path);
    if let Ok(real) = std::fs::canonicalize(&file) {
        let home = std::fs::canonicalize(root).unwrap_or_else(|_| root.into());
        if !real.starts_with(&home) {
            return Err(outside(format!(
                "resolves through a symlink to {}, outside {what}",
                real.display()
            )));
        }
    }
    Ok(file)
}

/// What `path` is when it is not a regular file that can be read, in words
/// (`a folder`, `a named pipe (FIFO)`, `a device`); `None` for a regular
/// file, or a link to one. Checked before a file is opened: opening a FIFO
/// blocks until someone writes to it.
pub fn not_regular(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(_) if std::fs::symlink_metadata(path).is_ok() => {
            return Some("a symbolic link to nothing (its target is missing, or it loops)");
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Some("out of this user's reach (permission denied on its folder)");
        }
        Err(_) => return Some("not there"),
    };
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a folder, not a file")
    } else if t.is_fifo() {
        Some("a named pipe (FIFO), not a file")
    } else if t.is_block_device() || t.is_char_device() {
        Some("a device, not a file")
    } else if t.is_socket() {
        Some("a socket, not a file")
    } else {
        Some("not a regular file")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("vramfit-confine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.join("inner")).unwrap();
        p
    }

    /// Climbing, absolute names and links out are refused; names inside,
    /// and links that stay inside, are given back.
    #[test]
    fn a_name_stays_inside_its_folder() {
        let root = scratch("inside");
        let outer = std::env::temp_dir().join(format!("vramfit-confine-outer-{}", std::process::id()));
        std::fs::write(&outer, b"secret").unwrap();
        std::fs::write(root.join("inner/a.bin"), b"a").unwrap();
        std::os::unix::fs::symlink(&outer, root.join("out.bin")).unwrap();
        std::os::unix::fs::symlink(root.join("inner/a.bin"), root.join("in.bin")).unwrap();
        let at = |n: &str| inside(&root, &root, n, "the checkpoint");
        assert_eq!(at("inner/a.bin").unwrap(), root.join("inner/a.bin"));
        assert_eq!(at("in.bin").unwrap(), root.join("in.bin"));
        assert_eq!(at("missing.bin").unwrap(), root.join("missing.bin"));
        assert!(at("../x.bin").unwrap_err().why.contains("climbs out"));
        assert!(at("inner/../../x").unwrap_err().why.contains("climbs out"));
        assert!(at("/etc/passwd").unwrap_err().why.contains("absolute"));
        assert!(at("").unwrap_err().why.contains("empty"));
        let e = at("out.bin").unwrap_err();
        assert!(e.why.contains("outside the checkpoint"), "{e:?}");
        // From a sub-folder, a sibling of the base still inside the root is allowed.
        let sub = inside(&root, &root.join("inner"), "a.bin", "the dataset").unwrap();
        assert_eq!(sub, root.join("inner/a.bin"));
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_file(&outer);
    }

    /// Folders, FIFOs and devices are named for what they are.
    #[test]
    fn only_regular_files_are_read() {
        let root = scratch("regular");
        std::fs::write(root.join("f"), b"x").unwrap();
        assert_eq!(not_regular(&root.join("f")), None);
        assert_eq!(not_regular(&root.join("inner")), Some("a folder, not a file"));
        assert_eq!(not_regular(Path::new("/dev/zero")), Some("a device, not a file"));
        assert!(not_regular(&root.join("nothing")).unwrap().contains("not there"));
        let fifo = root.join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert_eq!(not_regular(&fifo), Some("a named pipe (FIFO), not a file"));
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
