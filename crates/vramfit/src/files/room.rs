//! The memory this process may still take, and which limit says so. On the
//! CPU the host is the device: an allocation past this ends the process
//! with an abort ("memory allocation of N bytes failed"), no error file, no
//! message a user can act on. So a run compares what it will build with
//! this before it builds it.
//!
//! Three limits, the least wins: the memory the kernel can give without
//! swapping (`MemAvailable`), the process's address-space limit
//! (`ulimit -v`, less what is mapped already), and its cgroup's memory
//! limit (a container's, less what the cgroup uses).

/// The memory left to this process, and the limit that leaves the least.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Bytes.
    pub bytes: u64,
    /// Which limit, in words (`the machine's available memory`).
    pub limit: &'static str,
}

/// The least of the limits this platform reports; `None` where it reports
/// none (not Linux).
pub fn room() -> Option<Room> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mapped = kib(&status, "VmSize:").map(|k| k * 1024);
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let cgroup = cgroup_room();
    [
        crate::memory::available_bytes().map(|b| Room {
            bytes: b,
            limit: "the machine's available memory (MemAvailable)",
        }),
        address_space_left(&limits, mapped).map(|b| Room {
            bytes: b,
            limit: "this process's address-space limit (ulimit -v), less what it has mapped",
        }),
        cgroup.map(|b| Room {
            bytes: b,
            limit: "this container's memory limit (cgroup memory.max), less what it uses",
        }),
    ]
    .into_iter()
    .flatten()
    .min_by_key(|r| r.bytes)
}

/// `Max address space`'s soft limit in `/proc/self/limits`, less `mapped`.
fn address_space_left(limits: &str, mapped: Option<u64>) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    let soft = line["Max address space".len()..].split_whitespace().next()?;
    let soft: u64 = soft.parse().ok()?; // "unlimited" does not parse: no limit
    Some(soft.saturating_sub(mapped.unwrap_or(0)))
}

/// The cgroup (v2) memory limit less its use, where one is set.
fn cgroup_room() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let max: u64 = std::fs::read_to_string(dir.join("memory.max"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let used: u64 = std::fs::read_to_string(dir.join("memory.current"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    // The page cache it can reclaim is not used memory (kubelet's working
    // set): a checkpoint just read fills `memory.current` with it.
    let reclaimable: u64 = std::fs::read_to_string(dir.join("memory.stat"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("inactive_file ").and_then(|v| v.trim().parse().ok()))
        })
        .unwrap_or(0);
    Some(max.saturating_sub(used.saturating_sub(reclaimable)))
}

fn kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address-space limit is read from the kernel's table, less what
    /// is mapped; "unlimited" is no limit.
    #[test]
    fn the_address_space_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         3000000000           unlimited            bytes\n";
        assert_eq!(address_space_left(limits, Some(1_000_000_000)), Some(2_000_000_000));
        assert_eq!(address_space_left(limits, Some(4_000_000_000)), Some(0));
        let none = "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_left(none, Some(1)), None);
        // On this machine some limit is reported, and it is below the machine.
        let here = room().expect("Linux reports MemAvailable");
        assert!(here.bytes <= crate::memory::total_bytes().unwrap(), "{here:?}");
    }
}
