//! The unsafe, Linux-specific part of the sandbox: what the child does between fork and exec,
//! and how the parent watches and kills the child's process group.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// uid/gid of `nobody`/`nogroup`, the user code runs as when we are root.
pub(crate) const NOBODY: u32 = 65534;

/// Everything the child applies to itself before exec. Plain numbers only: `apply` runs in
/// the forked child of a possibly multi-threaded parent, where only async-signal-safe calls
/// are allowed (no allocation, no locks), so everything is computed beforehand.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildSetup {
    pub cpu_secs: u64,
    pub mem_bytes: u64,
    pub file_bytes: u64,
    /// RLIMIT_NPROC: counts every task (process or thread) of the target uid, system-wide.
    pub nproc: u64,
    /// Switch to this uid/gid (only when we are root).
    pub drop_to: Option<u32>,
}

/// Sets soft and hard limit, clamped to the current hard limit (an unprivileged process may
/// lower its limits but not raise them; failing because CI already has a lower cap would be
/// absurd).
macro_rules! set_limit {
    ($resource:expr, $soft:expr, $hard:expr) => {{
        let mut cur = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit($resource, &mut cur) != 0 {
            return Err(io::Error::last_os_error());
        }
        let hard = (($hard) as libc::rlim_t).min(cur.rlim_max);
        let soft = (($soft) as libc::rlim_t).min(hard);
        let lim = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        if libc::setrlimit($resource, &lim) != 0 {
            return Err(io::Error::last_os_error());
        }
    }};
}

impl ChildSetup {
    /// Runs in the child after fork (std has already moved it into its own process group and
    /// into the sandbox dir). Any error aborts the spawn; the parent gets it from `spawn()`.
    ///
    /// # Safety
    /// Only to be called from `CommandExt::pre_exec`.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        // No network: a fresh network namespace has only a downed loopback. Needs
        // CAP_SYS_ADMIN (root here); elsewhere it fails and the code keeps the host network,
        // which is why this is best effort and must come before dropping privileges.
        libc::unshare(libc::CLONE_NEWNET);

        set_limit!(libc::RLIMIT_CORE, 0, 0);
        // SIGXCPU at the soft limit (Python dies of it), SIGKILL one second later regardless.
        set_limit!(
            libc::RLIMIT_CPU,
            self.cpu_secs,
            self.cpu_secs.saturating_add(1)
        );
        set_limit!(libc::RLIMIT_AS, self.mem_bytes, self.mem_bytes);
        set_limit!(libc::RLIMIT_FSIZE, self.file_bytes, self.file_bytes);
        set_limit!(libc::RLIMIT_NPROC, self.nproc, self.nproc);

        if let Some(id) = self.drop_to {
            // Linux does not apply RLIMIT_NPROC to root, and root can write everywhere, so
            // root must not run the code. Supplementary groups first (needs root), then gid,
            // then uid (after which none of this could be undone).
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(id) != 0
                || libc::setuid(id) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::getuid() != id || libc::geteuid() != id {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
        }
        // No setuid binary (su, sudo, ping) can give privileges back.
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // If our process dies, the child dies too (set after the uid change, which clears it).
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        Ok(())
    }
}

/// SIGKILL to every process in the group `pgid` (ignoring "no such group").
///
/// Callers do this before reaping the group leader: while the leader is an unreaped zombie
/// its pid, and so the group id, cannot be reused by an unrelated process.
pub(crate) fn kill_group(pgid: libc::pid_t) {
    // SAFETY: plain syscall; a wrong or dead group only yields ESRCH.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
}

/// Whether `pid` (our child) has terminated, without reaping it (WNOWAIT), so the group can
/// still be killed safely afterwards.
pub(crate) fn has_exited(pid: libc::pid_t) -> io::Result<bool> {
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is its documented initial state for WNOHANG.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            // SAFETY: filled by waitid (or still zero when the child is running).
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            // Already reaped: certainly not running.
            Some(libc::ECHILD) => return Ok(true),
            _ => return Err(err),
        }
    }
}

/// A pidfd for `pid` (Linux >= 5.3): becomes readable when the process exits, so the parent can
/// sleep in poll() on output and exit at once. `None` where unsupported (then we poll briefly).
pub(crate) fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: plain syscall; on success the fd is new and ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

pub(crate) fn set_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(crate) fn effective_uid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::geteuid() }
}

pub(crate) fn real_uid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::getuid() }
}

/// Tasks (processes + threads) that `uid` owns right now, as RLIMIT_NPROC counts them.
///
/// The limit is per user, not per process tree, so a child's process budget is "what the
/// user already runs + max_procs": otherwise a normal user with 300 processes could not start
/// Python at all, and concurrent sandboxes (all `nobody`) would share one budget, letting one
/// fork bomb stop the others from starting. Unreadable entries count as nothing.
pub(crate) fn count_tasks_of_uid(uid: u32) -> u64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    let mut tasks = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        match entry.metadata() {
            Ok(meta) if meta.uid() == uid => {}
            _ => continue,
        }
        // procfs gives a task dir nlink = threads + 2.
        tasks += match fs::metadata(entry.path().join("task")) {
            Ok(meta) => meta.nlink().saturating_sub(2).max(1),
            Err(_) => 1,
        };
    }
    tasks
}

/// Kills every process of `uid` whose initial environment contains `marker` (a `KEY=value`
/// unique to one run): the processes of that run that left its process group with `setsid()`
/// or `setpgid()`, which the group kill misses.
///
/// Best effort: a process that re-executes itself with a new environment loses the marker.
/// Race-free against pid reuse: the pidfd pins the process before its environment is read.
pub(crate) fn kill_marked_processes(uid: u32, marker: &[u8]) {
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        if !entry.metadata().is_ok_and(|m| m.uid() == uid) {
            continue;
        }
        let Some(pidfd) = pidfd_open(pid) else {
            continue;
        };
        let Ok(environ) = fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|&b| b == 0).any(|var| var == marker) {
            // SAFETY: plain syscall on a pidfd we own.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        }
    }
}
