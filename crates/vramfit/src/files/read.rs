//! Reading a file that is not trusted: what is opened must be a regular
//! file, checked on the open file itself. It is opened without blocking,
//! so a FIFO is refused instead of waiting for a writer for ever; a device
//! (`/dev/zero` never ends) and a folder are refused; a file past a size
//! the caller gives is refused before it is read into memory. A run's own
//! files are opened without following a link ([`Links::Refuse`]).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Whether a link at the file's own name is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// A file the user named: a link is theirs to make.
    Follow,
    /// A run's own file: a link there was planted, not made by vramfit.
    Refuse,
}

/// Opens `path` for reading if it is a regular file.
pub fn open(path: &Path, links: Links) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            // ELOOP: the last component is a link and O_NOFOLLOW was given.
            if e.kind() == io::ErrorKind::PermissionDenied {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{}: permission denied: this user may not read it, or may not enter a folder above it; \
                         make them readable (chmod u+r, and u+x on the folders) or run as their owner",
                        path.display()
                    ),
                )
            } else if e.raw_os_error() == Some(libc::ELOOP) && links == Links::Refuse {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is a symbolic link, which vramfit did not make: a run's files are read and written in \
                         place; remove the link",
                        path.display()
                    ),
                )
            } else {
                e
            }
        })?;
    let t = file.metadata()?.file_type();
    let what = if t.is_file() {
        return Ok(file);
    } else if t.is_dir() {
        "a folder, not a file"
    } else if t.is_fifo() {
        "a named pipe (FIFO), not a file"
    } else if t.is_block_device() || t.is_char_device() {
        "a device, not a file"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is {what}: give a regular file", path.display()),
    ))
}

/// The bytes of `path` (a regular file; see [`open`]), refused past `most`.
pub fn read_at_most(path: &Path, links: Links, most: u64) -> io::Result<Vec<u8>> {
    let file = open(path, links)?;
    let length = file.metadata()?.len();
    if length > most {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is {length} bytes, more than such a file takes ({most} at most): not the file vramfit expects",
                path.display()
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(length as usize);
    file.take(most + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The bytes of `path`, a regular file of any size (see [`open`]).
pub fn read(path: &Path, links: Links) -> io::Result<Vec<u8>> {
    read_at_most(path, links, u64::MAX - 1)
}

/// The text of `path`, a regular file of at most 64 MiB (a config, a
/// record, a dataset's text; see [`open`]).
pub fn read_text(path: &Path, links: Links) -> io::Result<String> {
    let bytes = read_at_most(path, links, TEXT_MOST)?;
    String::from_utf8(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text", path.display()),
        )
    })
}

/// The most a text file vramfit reads may hold.
pub const TEXT_MOST: u64 = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO is refused at once (nothing blocks), a device and a folder
    /// are named, a link is followed or refused as asked, a size is held.
    #[test]
    fn only_regular_files_are_read_and_nothing_blocks() {
        let d = std::env::temp_dir().join(format!("vramfit-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f.toml"), b"steps = 4").unwrap();
        std::os::unix::fs::symlink(d.join("f.toml"), d.join("link.toml")).unwrap();
        assert_eq!(read_text(&d.join("f.toml"), Links::Refuse).unwrap(), "steps = 4");
        assert_eq!(read_text(&d.join("link.toml"), Links::Follow).unwrap(), "steps = 4");
        let e = read_text(&d.join("link.toml"), Links::Refuse).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(
            read(Path::new("/dev/zero"), Links::Follow)
                .unwrap_err()
                .to_string()
                .contains("a device")
        );
        assert!(read(&d, Links::Follow).unwrap_err().to_string().contains("a folder"));
        assert!(
            read_at_most(&d.join("f.toml"), Links::Follow, 3)
                .unwrap_err()
                .to_string()
                .contains("9 bytes")
        );
        let fifo = d.join("pipe");
        if std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success())
        {
            let e = read_text(&fifo, Links::Follow).unwrap_err().to_string();
            assert!(e.contains("named pipe"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
