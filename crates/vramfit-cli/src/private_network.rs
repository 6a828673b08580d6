//! The ranks' launcher in a network of its own (Linux): `mpirun` and the
//! ranks it starts run in a new network namespace whose only interface is
//! loopback, so no process outside can reach the sockets they listen on.
//!
//! Why: Open MPI 4.1's launcher binds its control channel (oob/tcp) to the
//! wildcard address whatever interfaces it is told to use, and a stranger
//! that connects there and stays silent makes `mpirun` wait for it at the
//! end of the run, forever (measured; docs/design/ranks.md). Open MPI offers no
//! setting for the address it binds and no per-run secret. A namespace
//! costs nothing the ranks need: they exchange data through shared memory,
//! which a network namespace does not separate.
//!
//! Root gets a network namespace directly; another user first a user
//! namespace that maps its own IDs (where the kernel allows unprivileged
//! ones). Where neither is allowed (some containers), the launcher runs as
//! before, reachable, and says so; `VRAMFIT_RANKS_NETWORK=shared` asks for
//! that.

use std::process::Command;

/// The environment variable that, set to `shared`, keeps the launcher in
/// the machine's own network (where a namespace breaks something: a
/// device's driver, a site's rules).
pub const OPT_OUT: &str = "VRAMFIT_RANKS_NETWORK";

/// Makes `command` start in a private network with loopback up: its spawn
/// fails with the system's error where this system allows none (the
/// caller then starts it without).
#[cfg(target_os = "linux")]
pub fn isolate(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let enter = enter_private_network();
    // SAFETY: the closure makes only system calls (no allocation, no
    // locks) between fork and exec.
    unsafe { command.pre_exec(enter) };
}

/// Not Linux: no namespaces; the launcher runs as it is.
#[cfg(not(target_os = "linux"))]
pub fn isolate(_command: &mut Command) {}

/// What the child runs between fork and exec: a new network namespace
/// (inside a new user namespace when it may not make one directly), then
/// loopback up. Everything that allocates is made here, before the fork.
#[cfg(target_os = "linux")]
fn enter_private_network() -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
    // SAFETY: getters with no failure modes.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let uid_map = format!("{uid} {uid} 1");
    let gid_map = format!("{gid} {gid} 1");
    move || {
        // SAFETY: system calls on memory this closure owns.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                write_file(c"/proc/self/setgroups", b"deny")?;
                write_file(c"/proc/self/uid_map", uid_map.as_bytes())?;
                write_file(c"/proc/self/gid_map", gid_map.as_bytes())?;
                if libc::unshare(libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            loopback_up()
        }
    }
}

/// Writes `bytes` to the file at `path` with system calls only.
#[cfg(target_os = "linux")]
unsafe fn write_file(path: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: a valid C string and buffer; the descriptor is closed.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
        if fd < 0 {
            let error = std::io::Error::last_os_error();
            // A kernel without the file has no such namespaces: not a
            // missing `mpirun`, which the caller reads `NotFound` as.
            return Err(if error.raw_os_error() == Some(libc::ENOENT) {
                std::io::ErrorKind::Unsupported.into()
            } else {
                error
            });
        }
        let wrote = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if wrote < 0 {
            return Err(error);
        }
        if wrote as usize != bytes.len() {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// Brings the namespace's loopback interface up (a new one starts down).
#[cfg(target_os = "linux")]
unsafe fn loopback_up() -> std::io::Result<()> {
    // SAFETY: a zeroed `ifreq` naming "lo", passed to the interface ioctls
    // on a socket closed before returning.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (to, from) in request.ifr_name.iter_mut().zip(b"lo") {
            *to = *from as libc::c_char;
        }
        let ok = libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut request) == 0 && {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &request) == 0
        };
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if ok { Ok(()) } else { Err(error) }
    }
}
