//! Memory readings of the host process. Host figures are never presented
//! as device figures.

/// Peak resident set size of this process in bytes (`VmHWM`), when the
/// platform reports it.
pub fn host_peak_bytes() -> Option<u64> {
    // The kernel folds the current RSS into VmHWM lazily, so VmHWM can
    // briefly read below VmRSS: the peak is the larger of the two.
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hwm = status_kib(&status, "VmHWM:")?;
    Some(hwm.max(status_kib(&status, "VmRSS:").unwrap_or(0)) * 1024)
}

/// Current resident set size of this process in bytes (`VmRSS`).
pub fn host_current_bytes() -> Option<u64> {
    read_status_kib("VmRSS:").map(|k| k * 1024)
}

/// Memory the kernel estimates can be allocated without swapping
/// (`MemAvailable` in `/proc/meminfo`), in bytes; `None` where the platform
/// does not report it.
pub fn available_bytes() -> Option<u64> {
    meminfo_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// The machine's memory (`MemTotal` in `/proc/meminfo`), in bytes.
pub fn total_bytes() -> Option<u64> {
    status_kib(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal:").map(|k| k.saturating_mul(1024))
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn meminfo_available(meminfo: &str) -> Option<u64> {
    status_kib(meminfo, "MemAvailable:").map(|k| k.saturating_mul(1024))
}

fn read_status_kib(key: &str) -> Option<u64> {
    status_kib(&std::fs::read_to_string("/proc/self/status").ok()?, key)
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn available_memory_reads_meminfo() {
        let text = "MemTotal:       16318412 kB\nMemFree:         1234567 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(super::meminfo_available(text), Some(8_000_000 * 1024));
        assert_eq!(super::meminfo_available("MemTotal: 5 kB\n"), None);
        let live = super::available_bytes().expect("Linux reports MemAvailable");
        assert!(live > 0);
    }

    #[test]
    fn peak_is_at_least_current() {
        let now = super::host_current_bytes().expect("Linux reports VmRSS");
        let peak = super::host_peak_bytes().expect("Linux reports VmHWM");
        // Allocate and touch 64 MiB: the peak must see it.
        let big = vec![1u8; 64 << 20];
        let peak_after = super::host_peak_bytes().unwrap();
        assert!(now > 0 && peak >= now, "peak {peak} < current {now}");
        assert!(
            peak_after >= now + (60 << 20),
            "peak {peak_after} missed a 64 MiB allocation (rss before {now})"
        );
        drop(big);
    }
}
