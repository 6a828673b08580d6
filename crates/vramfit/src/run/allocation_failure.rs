//! A run whose allocation fails ends with an error, not an abort: the
//! counting heap ([`crate::heap::on_failure`]) calls [`refused`] with the
//! size it could not get, which writes the run's `error.json` (with the
//! memory the process could take, and what to lower) and exits with
//! status 1. Without this Rust's handler prints "memory allocation of N
//! bytes failed" and aborts (status 134), and the run folder says nothing.
//! The configuration's checks refuse most such runs before they start
//! (`vramfit_models::config`); this is for what a rough count misses.

use std::path::PathBuf;
use std::sync::Mutex;

/// The run directory whose `error.json` a failed allocation writes.
static ARMED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// From now until the guard is dropped, a failed allocation writes
/// `dir/error.json` and exits (where the counting heap is the global
/// allocator).
pub fn arm(dir: PathBuf) -> Armed {
    if let Ok(mut armed) = ARMED.lock() {
        *armed = Some(dir);
    }
    crate::heap::on_failure(Some(refused));
    Armed(())
}

/// While it lives, a failed allocation ends the run with an error file.
#[derive(Debug)]
pub struct Armed(());

impl Drop for Armed {
    fn drop(&mut self) {
        crate::heap::on_failure(None);
        if let Ok(mut armed) = ARMED.lock() {
            *armed = None;
        }
    }
}

/// The message for a refused allocation of `bytes`.
pub fn message(bytes: usize) -> String {
    let room = crate::files::room::room().map_or(String::new(), |r| {
        format!(
            " (it could take {} more: {})",
            crate::profile::human_bytes(r.bytes),
            r.limit
        )
    });
    format!(
        "a memory allocation of {} failed: more than this process could take{room}; lower the sizes, the \
         (micro-)batch or task.tokens, or plan the run into the memory there is (--budget auto)",
        crate::profile::human_bytes(bytes as u64)
    )
}

fn refused(bytes: usize) {
    let why = message(bytes);
    let dir = ARMED.lock().ok().and_then(|d| d.clone());
    if let Some(dir) = &dir {
        let path = dir.join("error.json");
        let body = serde_json::json!({ "error": why, "kind": "allocation_failed", "bytes": bytes });
        let _ = crate::files::outputs::no_link_below(dir, &path)
            .and_then(|()| super::atomic_write(&path, body.to_string().as_bytes()));
    }
    // Not `eprintln!`: it panics when stderr is gone, and this runs inside
    // the allocator, where unwinding is undefined behaviour.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "error: {why}{}\n",
            dir.map_or(String::new(), |d| format!(
                " (written to {})",
                d.join("error.json").display()
            ))
        )
        .as_bytes(),
    );
    std::process::exit(1);
}
