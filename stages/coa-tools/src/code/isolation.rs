//! What this kernel lets the sandbox do, probed once per process, and the per-run user ids.
//!
//! - **Namespaces** (`unshare` of PID, mount, network, IPC and UTS namespaces, a tmpfs on `/tmp`):
//!   a run then cannot see or signal other runs, has a private size-limited `/tmp` and
//!   `/dev/shm` and a read-only view of everything else, and all its processes die with it
//!   (the PID namespace's init is ours). Needs CAP_SYS_ADMIN (root here and in CI); a container
//!   without it, or a normal user, gets the fallback below. `COA_SANDBOX_NAMESPACES=0` forces
//!   the fallback (its tests use it).
//! - **A minimal root** (`root.rs`) in those namespaces: the interpreter and its libraries, no
//!   other host file. `COA_SANDBOX_MINIMAL_ROOT=0` keeps the host's tree, read-only.
//! - **A seccomp filter** (`seccomp.rs`), where the kernel takes one (a container's own filter
//!   may refuse the `seccomp` call). `COA_SANDBOX_SECCOMP=0` runs without it.
//! - **A user id per concurrent run** (root only): uid/gid `SLOT_BASE + k`, in a range no
//!   distribution assigns, claimed by binding the abstract socket `coa-sandbox-uid-<uid>` (the
//!   kernel releases it when the process dies, even by SIGKILL). With its own uid a run's
//!   `kill(-1, 9)` reaches only its own processes, its process limit is its own, and every
//!   process it started can be found and killed by uid, even one that left its process group
//!   and dropped its environment. Without root, every run is the invoking user.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

/// uid/gid of `nobody`/`nogroup`: the shared fallback user when per-run uids are unavailable.
pub(crate) const NOBODY: u32 = 65534;
/// First per-run uid: systemd documents 1879048192..2147352575 as unused by every allocator.
pub(crate) const SLOT_BASE: u32 = 1_879_048_192;
/// Concurrent runs per machine (all processes together) before a run waits for a free slot.
pub(crate) const SLOTS: u32 = 4096;

/// What the sandbox can use here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isolation {
    /// Each run in its own PID, mount, network, IPC and UTS namespaces with a private tmpfs.
    pub namespaces: bool,
    /// Each concurrent run under its own unprivileged uid (else `nobody` as root, or this user).
    pub uid_per_run: bool,
    /// Running as root (privileges are dropped for the code).
    pub root: bool,
    /// With namespaces: each run in a minimal root (`root.rs`: the interpreter and its libraries
    /// read-only, its own `/tmp`, no other host file), not the host's tree read-only.
    pub minimal_root: bool,
    /// Every run under the seccomp filter (`seccomp.rs`): no ptrace, process_vm_readv/writev,
    /// new namespaces, mounts, bpf, perf_event_open, keyctl and the like.
    pub seccomp: bool,
}

impl Isolation {
    /// One line for logs and the README: what holds on this machine.
    pub fn describe(&self) -> String {
        let ns = if self.namespaces && self.minimal_root {
            "PID/mount/network namespaces per run (a minimal root: the interpreter read-only, a private /tmp, no other host file; every process killed with the run)"
        } else if self.namespaces {
            "PID/mount/network namespaces per run (private /tmp, the host's files read-only, every process killed with the run)"
        } else {
            "no namespaces (runs share the host's /tmp and process table; process-group and uid kills)"
        };
        let uid = match (self.uid_per_run, self.root) {
            (true, _) => "a uid per concurrent run",
            (false, true) => "every run as user nobody",
            (false, false) => "every run as the invoking user",
        };
        let filter = if self.seccomp { "a seccomp filter (no ptrace, process_vm_readv, new namespaces, mounts, bpf, perf_event_open, keyctl)" } else { "no seccomp filter" };
        format!("{ns}; {uid}; {filter}")
    }

    /// The protections this machine cannot give (empty when all hold), for the stats and a
    /// warning on stderr.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if !self.namespaces {
            missing.push("namespaces");
        }
        if !self.minimal_root {
            missing.push("a minimal root");
        }
        // In its own user, pid and mount namespaces behind seccomp a run cannot reach another
        // process or its files whatever its uid; a uid per run matters only without them (a
        // user who is not root has none to give out, and still gets the full set).
        if !self.uid_per_run && !self.namespaces {
            missing.push("a uid per run");
        }
        if !self.seccomp {
            missing.push("seccomp");
        }
        missing
    }
}

/// The isolation available to this process (probed once).
pub fn isolation() -> Isolation {
    static PROBED: OnceLock<Isolation> = OnceLock::new();
    *PROBED.get_or_init(|| {
        let root = effective_uid() == 0;
        let off = |var: &str| std::env::var(var).is_ok_and(|v| v == "0");
        let namespaces = !off("COA_SANDBOX_NAMESPACES") && probe_namespaces();
        Isolation {
            namespaces,
            minimal_root: namespaces && !off("COA_SANDBOX_MINIMAL_ROOT"),
            uid_per_run: root && slots_are_mapped(),
            root,
            seccomp: !off("COA_SANDBOX_SECCOMP") && crate::code::seccomp::probe(),
        }
    })
}

pub(crate) fn effective_uid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::geteuid() }
}

pub(crate) fn real_uid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::getuid() }
}

/// Whether a forked child can enter fresh namespaces and mount a tmpfs and a procfs there.
fn probe_namespaces() -> bool {
    // SAFETY: the child makes raw syscalls only, then _exit.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return false;
        }
        if pid == 0 {
            let ok = libc::unshare(crate::code::child::NAMESPACE_FLAGS) == 0
                && libc::mount(c"none".as_ptr(), c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) == 0
                && libc::mount(c"tmpfs".as_ptr(), c"/tmp".as_ptr(), c"tmpfs".as_ptr(), libc::MS_NOSUID | libc::MS_NODEV, c"size=65536".as_ptr().cast()) == 0;
            if !ok {
                libc::_exit(1);
            }
            // The PID namespace takes effect for children: the first one is its init.
            let init = libc::fork();
            if init == 0 {
                libc::_exit(if libc::getpid() == 1 { 0 } else { 1 });
            }
            let mut status = 0;
            let ok = init > 0 && libc::waitpid(init, &mut status, 0) == init && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            libc::_exit(if ok { 0 } else { 1 });
        }
        exited_zero(pid)
    }
}

/// Waits for the child `pid` of a probe: whether it exited with status 0.
pub(crate) fn exited_zero(pid: libc::pid_t) -> bool {
    let mut status = 0;
    loop {
        // SAFETY: waits on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// Whether the per-run uid range exists in this user namespace (a container may map fewer ids).
fn slots_are_mapped() -> bool {
    let Ok(map) = std::fs::read_to_string("/proc/self/uid_map") else { return false };
    map.lines().any(|line| {
        let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        v.len() == 3 && v[0] <= SLOT_BASE as u64 && SLOT_BASE as u64 + SLOTS as u64 <= v[0] + v[2]
    })
}

/// A uid held by one run: its abstract socket keeps other runs (of any process) off it.
pub(crate) struct UidSlot {
    pub uid: u32,
    _claim: OwnedFd,
}

/// Claims a free per-run uid. Without namespaces, processes an earlier holder left under it
/// (it was killed with SIGKILL, so it could not clean up) are killed first; with namespaces a
/// run's processes cannot outlive it.
pub(crate) fn claim_uid(kill_leftovers: bool) -> io::Result<UidSlot> {
    for k in 0..SLOTS {
        let uid = SLOT_BASE + k;
        if let Some(claim) = bind_abstract(&format!("coa-sandbox-uid-{uid}"))? {
            if kill_leftovers {
                kill_uid(uid);
            }
            return Ok(UidSlot { uid, _claim: claim });
        }
    }
    Err(io::Error::new(io::ErrorKind::WouldBlock, format!("all {SLOTS} sandbox uids are in use")))
}

/// Binds a Unix socket to an abstract name: `Some` if it was free, `None` if taken.
fn bind_abstract(name: &str) -> io::Result<Option<OwnedFd>> {
    // SAFETY: socket/bind on a zeroed sockaddr_un whose path starts with NUL (abstract).
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = name.as_bytes();
        for (i, &b) in bytes.iter().enumerate().take(addr.sun_path.len() - 1) {
            addr.sun_path[i + 1] = b as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len()) as libc::socklen_t;
        if libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) == 0 {
            return Ok(Some(fd));
        }
        match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EADDRINUSE) => Ok(None),
            e => Err(e),
        }
    }
}

/// SIGKILL to every process of `uid` (root only): a helper becomes `uid` and sends
/// `kill(-1, SIGKILL)`, which reaches exactly the processes that uid may signal, i.e. its own,
/// in this PID namespace and those below it.
pub(crate) fn kill_uid(uid: u32) {
    // SAFETY: the child makes raw syscalls only, then _exit.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            if libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(uid) == 0 && libc::setuid(uid) == 0 {
                libc::kill(-1, libc::SIGKILL);
            }
            libc::_exit(0);
        }
        if pid > 0 {
            let mut status = 0;
            while libc::waitpid(pid, &mut status, 0) < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Isolation;

    #[test]
    fn a_uid_per_run_is_missing_only_without_namespaces() {
        let full = Isolation { namespaces: true, uid_per_run: true, root: true, minimal_root: true, seccomp: true };
        assert!(full.missing().is_empty());
        // A user who is not root: namespaces, a minimal root and seccomp, no uids to give out.
        let user = Isolation { uid_per_run: false, root: false, ..full };
        assert!(user.missing().is_empty(), "{:?}", user.missing());
        let bare = Isolation { namespaces: false, minimal_root: false, ..user };
        assert_eq!(bare.missing(), ["namespaces", "a minimal root", "a uid per run"]);
        let no_filter = Isolation { seccomp: false, ..full };
        assert_eq!(no_filter.missing(), ["seccomp"]);
    }
}
