//! An allocation the allocator cannot serve, while a run is driven, ends
//! the process with the run's `error.json` and status 1, not Rust's abort
//! (status 134, "memory allocation of N bytes failed", nothing written).
//! The test runs itself again as a child that arms the hook for a folder
//! and asks for 1 EiB (more than x86-64's 128 TiB of address space, so no
//! overcommit setting grants it); the parent reads what the child left.

use std::process::Command;

#[global_allocator]
static HEAP: vramfit::heap::Counting<std::alloc::System> = vramfit::heap::Counting(std::alloc::System);

const CHILD: &str = "VRAMFIT_TEST_ALLOCATION_FAILURE_DIR";

#[test]
fn a_failed_allocation_in_a_run_writes_error_json_and_exits_with_1() {
    if let Ok(dir) = std::env::var(CHILD) {
        let _armed = vramfit::run::allocation_failure::arm(dir.into());
        let v: Vec<u8> = Vec::with_capacity(1 << 60);
        std::hint::black_box(&v);
        unreachable!("1 EiB was allocated");
    }
    let dir = std::env::temp_dir().join(format!("vramfit-allocation-failure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_failed_allocation_in_a_run_writes_error_json_and_exits_with_1",
            "--nocapture",
        ])
        .env(CHILD, &dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("a memory allocation of 1048576.0 TiB failed"),
        "{stderr}"
    );
    let error: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("error.json")).unwrap()).unwrap();
    assert_eq!(error["kind"], "allocation_failed");
    assert_eq!(error["bytes"], 1u64 << 60);
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("more than this process could take")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
