//! The unsafe, Linux-specific part of the sandbox: what happens between fork and exec, and how
//! the parent watches and kills a run.
//!
//! With namespaces a run is three processes (plus whatever the code starts):
//!
//! ```text
//! stage ── M (outside, waits) ── I (pid 1 of the run's namespaces, reaps) ── P (python, pid 2)
//! ```
//!
//! `M` is the process std's `Command` forked: it enters fresh namespaces (`unshare`), forks `I`,
//! closes every descriptor and waits. `unshare(CLONE_NEWPID)` puts only the *children* of the
//! caller into the new PID namespace, which is why `M` exists. `I` is that namespace's init:
//! it builds the run's minimal root and pivots into it (`root.rs`; or keeps the host's tree
//! read-only), mounts the private `/tmp`, `/dev/shm` and `/proc`, writes the program, forks `P`
//! and execs a fresh init (`init.py` under the run's interpreter, so that no copy of the stage's
//! memory, arguments or environment stays in the run), which reaps everything until `P` exits;
//! then it reports `P`'s wait status on the status pipe and exits, and the kernel kills every
//! process left in the namespace. `P` sets the limits,
//! drops to the run's uid, installs the seccomp filter and returns to std, which executes python.
//! `PR_SET_PDEATHSIG` chains the three to the stage: kill the stage (even with SIGKILL) and `M`
//! dies, so `I` dies, so the whole namespace dies.
//!
//! Without namespaces `P` is std's child itself (the same limits and uid, a process group).
//!
//! Everything between fork and exec runs in the child of a possibly multi-threaded parent, where
//! only async-signal-safe calls are allowed: raw syscalls on data prepared beforehand, no
//! allocation, no locks.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

/// The namespaces of a run: processes, mounts, network, System V IPC, hostname.
pub(crate) const NAMESPACE_FLAGS: libc::c_int = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;

/// A setup step, reported with its errno when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Step {
    Parent = 1,
    MountPrivate,
    MountTmp,
    WriteProgram,
    Chdir,
    Fork,
    Limits,
    DropPrivileges,
    NoNewPrivs,
    Payload,
    Seccomp,
    NewRoot,
}

impl Step {
    fn from_i32(v: i32) -> Option<Step> {
        use Step::*;
        [Parent, MountPrivate, MountTmp, WriteProgram, Chdir, Fork, Limits, DropPrivileges, NoNewPrivs, Payload, Seccomp, NewRoot].into_iter().find(|s| *s as i32 == v)
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Step::Parent => "the stage died while the sandbox started",
            Step::MountPrivate => "making the run's mounts private",
            Step::MountTmp => "mounting the run's tmpfs on /tmp",
            Step::WriteProgram => "writing the program into the run's /tmp",
            Step::Chdir => "entering /tmp",
            Step::Fork => "starting the program under the namespace's init",
            Step::Limits => "setting the resource limits",
            Step::DropPrivileges => "switching to the run's user",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::Payload => "passing the harness its token and channel",
            Step::Seccomp => "installing the seccomp filter",
            Step::NewRoot => "building the run's minimal root",
        }
    }
}

/// What the status pipe carries: 12-byte records written with one write(2) each.
const MSG_SETUP_FAILED: i32 = 1;
const MSG_EXITED: i32 = 2;

/// One report of a namespaced run, read by the parent once the run is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// `P`'s raw wait status.
    Exited(libc::c_int),
    SetupFailed(Step, i32),
}

/// Reads the reports a finished run left in its status pipe (non-blocking: every writer is gone).
pub(crate) fn read_reports(pipe: &OwnedFd) -> Vec<Report> {
    let _ = set_nonblocking(pipe);
    let mut bytes = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: read into a valid buffer.
        let n = unsafe { libc::read(pipe.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n as usize]);
    }
    bytes
        .chunks_exact(12)
        .filter_map(|m| {
            let word = |i: usize| i32::from_ne_bytes(m[i * 4..i * 4 + 4].try_into().unwrap());
            match word(0) {
                MSG_EXITED => Some(Report::Exited(word(1))),
                MSG_SETUP_FAILED => Some(Report::SetupFailed(Step::from_i32(word(1))?, word(2))),
                _ => None,
            }
        })
        .collect()
}

/// What the namespaced path needs beyond the common setup.
pub(crate) struct Namespaces {
    /// Write end of the status pipe (close-on-exec: `P`'s copy closes when python starts).
    pub status_fd: RawFd,
    /// tmpfs options of `/tmp` and `/dev/shm` (size, inodes, mode).
    pub tmp_options: CString,
    /// Files written into the run's `/tmp` before the program starts (path, contents).
    pub files: Vec<(CString, Vec<u8>)>,
    /// The run's minimal root; `None`: the host's tree, read-only.
    pub root: Option<crate::code::root::NewRoot>,
    /// [`stage_strings`], for the run's init to zero (when it cannot exec [`InitExec`]).
    pub stage_strings: Option<[(usize, usize); 2]>,
    /// The fresh init `I` execs once `P` runs.
    pub init: InitExec,
}

/// The command line of the run's exec'd init (`init.py` under the run's interpreter), made before
/// the fork: the child only adds `P`'s pid (formatted on its stack).
pub(crate) struct InitExec {
    /// The interpreter (the same path inside the run's root).
    pub path: CString,
    /// `python -I -S -c SOURCE`.
    pub head: [CString; 4],
    /// The status pipe's descriptor and the record kind it writes, in decimal.
    pub tail: [CString; 2],
}

impl InitExec {
    pub(crate) fn new(python: &std::path::Path, status_fd: RawFd) -> InitExec {
        let c = |s: &[u8]| CString::new(s).expect("no NUL in a path or a number");
        let path = c(python.as_os_str().as_encoded_bytes());
        InitExec {
            head: [path.clone(), c(b"-I"), c(b"-S"), c(b"-c")],
            path,
            tail: [c(status_fd.to_string().as_bytes()), c(MSG_EXITED.to_string().as_bytes())],
        }
    }
}

/// Where the stage's argument and environment strings lie in its memory, (start, end) each, from
/// `/proc/self/stat` (fields 48 to 51), read once; `None` when unreadable or implausible.
pub(crate) fn stage_strings() -> Option<[(usize, usize); 2]> {
    static READ: std::sync::OnceLock<Option<[(usize, usize); 2]>> = std::sync::OnceLock::new();
    *READ.get_or_init(|| {
        let stat = fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which may hold spaces and parentheses: field 3 first.
        let fields: Vec<usize> = stat.rsplit_once(')')?.1.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
        let range = |i: usize| -> Option<(usize, usize)> {
            let (start, end) = (*fields.get(i - 3)?, *fields.get(i - 2)?);
            (start > 0 && start < end && end - start < 1 << 20).then_some((start, end))
        };
        Some([range(48)?, range(50)?])
    })
}

/// Everything the child applies to itself before exec, computed beforehand.
pub(crate) struct ChildSetup {
    pub cpu_secs: u64,
    pub mem_bytes: u64,
    pub file_bytes: u64,
    /// RLIMIT_NPROC: counts every task (process or thread) of the target uid, system-wide.
    pub nproc: u64,
    /// Switch to this uid and gid (only when we are root).
    pub drop_to: Option<u32>,
    /// The harness's token (and tests): close-on-exec in the parent, inherited by python.
    pub payload_fd: RawFd,
    /// A driver's or checker's descriptors (close-on-exec in the parent), inherited by python.
    pub channel_fds: Vec<RawFd>,
    /// Installed last before exec, where the machine takes it.
    pub seccomp: Option<&'static crate::code::seccomp::Filters>,
    /// The stage's pid: a child whose parent changed before PR_SET_PDEATHSIG took hold is an
    /// orphan that must not run.
    pub stage_pid: libc::pid_t,
    pub namespaces: Option<Namespaces>,
}

/// Sets soft and hard limit, clamped to the current hard limit (an unprivileged process may
/// lower its limits but not raise them; failing because CI already has a lower cap would be
/// absurd).
///
/// # Safety
/// Raw getrlimit/setrlimit on local structs, allocating nothing, so it may run between fork
/// and exec; it changes the limits of the calling process, which must be the child.
unsafe fn set_limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> bool {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if libc::getrlimit(resource, &mut cur) != 0 {
        return false;
    }
    let hard = (hard as libc::rlim_t).min(cur.rlim_max);
    let lim = libc::rlimit { rlim_cur: (soft as libc::rlim_t).min(hard), rlim_max: hard };
    libc::setrlimit(resource, &lim) == 0
}

pub(crate) fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl ChildSetup {
    /// Runs in the child std forked (std has already set up its stdio, its own process group
    /// and its working directory). Returns to std, which executes python, in `P` only.
    ///
    /// # Safety
    /// Only to be called from `CommandExt::pre_exec`.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        coa_schemas::cleanup::reset_in_child();
        let Some(ns) = &self.namespaces else {
            // No network: a fresh network namespace has only a downed loopback. Best effort
            // (needs CAP_SYS_ADMIN) and before dropping privileges.
            libc::unshare(libc::CLONE_NEWNET);
            self.tie_to_parent(libc::getppid() == self.stage_pid).map_err(io::Error::from_raw_os_error)?;
            return self.restrict().map_err(|(_, e)| io::Error::from_raw_os_error(e));
        };
        // M.
        if libc::unshare(NAMESPACE_FLAGS) != 0 {
            return Err(io::Error::last_os_error());
        }
        self.tie_to_parent(libc::getppid() == self.stage_pid).map_err(io::Error::from_raw_os_error)?;
        let mut alive = [0 as libc::c_int; 2];
        if libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        let init = libc::fork();
        if init < 0 {
            return Err(io::Error::last_os_error());
        }
        if init > 0 {
            close_fds_except(&[alive[1]]);
            wait_for(init);
            libc::_exit(0);
        }
        // I: pid 1 of the new namespaces. It learns of M's death by the alive pipe closing.
        libc::close(alive[1]);
        let mut pfd = libc::pollfd { fd: alive[0], events: libc::POLLIN, revents: 0 };
        let m_alive = libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 && libc::poll(&mut pfd, 1, 0) == 0;
        libc::close(alive[0]);
        if !m_alive {
            report(ns.status_fd, MSG_SETUP_FAILED, Step::Parent as i32, 0);
            libc::_exit(127);
        }
        if let Err((step, e)) = self.prepare_namespace(ns) {
            report(ns.status_fd, MSG_SETUP_FAILED, step as i32, e);
            libc::_exit(127);
        }
        let program = libc::fork();
        if program < 0 {
            report(ns.status_fd, MSG_SETUP_FAILED, Step::Fork as i32, errno());
            libc::_exit(127);
        }
        if program > 0 {
            exec_init(&ns.init, program, ns.status_fd);
            // The exec failed: this fork of the stage stays the init.
            run_init(program, ns.status_fd, ns.stage_strings);
        }
        // P.
        if let Err((step, e)) = self.restrict() {
            report(ns.status_fd, MSG_SETUP_FAILED, step as i32, e);
            return Err(io::Error::from_raw_os_error(e));
        }
        Ok(())
    }

    /// PR_SET_PDEATHSIG, then a check that the parent did not die before it took hold.
    ///
    /// # Safety
    /// In the forked child, between fork and exec (it sets the death signal of the calling process).
    unsafe fn tie_to_parent(&self, parent_is_stage: bool) -> Result<(), i32> {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(errno());
        }
        if !parent_is_stage || libc::getppid() != self.stage_pid {
            return Err(libc::ESRCH);
        }
        Ok(())
    }

    /// In I: the run's own mounts and its program files.
    ///
    /// # Safety
    /// In I, between fork and exec, after `unshare(CLONE_NEWNS)`: the mounts it makes must land in
    /// the run's own mount namespace, never the host's.
    unsafe fn prepare_namespace(&self, ns: &Namespaces) -> Result<(), (Step, i32)> {
        let fail = |step| (step, errno());
        // Nothing mounted here propagates back to the host.
        if libc::mount(c"none".as_ptr(), c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
            return Err(fail(Step::MountPrivate));
        }
        if let Some(root) = &ns.root {
            root.enter(&ns.tmp_options)?;
        } else {
            make_read_only(c"/");
            let tmpfs = |target: &std::ffi::CStr| {
                libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), libc::MS_NOSUID | libc::MS_NODEV, ns.tmp_options.as_ptr().cast())
            };
            if tmpfs(c"/tmp") != 0 {
                return Err(fail(Step::MountTmp));
            }
            // Best effort: POSIX semaphores and shared memory live here (multiprocessing needs it).
            tmpfs(c"/dev/shm");
            // Best effort: a procfs of this PID namespace shows only the run's processes (a
            // container may refuse a fresh procfs; the host's then stays, read-only).
            libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, std::ptr::null());
        }
        for (path, contents) in &ns.files {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o644);
            if fd < 0 {
                return Err(fail(Step::WriteProgram));
            }
            let mut rest: &[u8] = contents;
            while !rest.is_empty() {
                let n = libc::write(fd, rest.as_ptr().cast(), rest.len());
                if n < 0 && errno() == libc::EINTR {
                    continue;
                }
                if n <= 0 {
                    return Err(fail(Step::WriteProgram));
                }
                rest = &rest[n as usize..];
            }
            if let Some(id) = self.drop_to {
                libc::fchown(fd, id, id);
            }
            libc::close(fd);
        }
        if libc::chdir(c"/tmp".as_ptr()) != 0 {
            return Err(fail(Step::Chdir));
        }
        Ok(())
    }

    /// In P (or the only child without namespaces): limits, user, no new privileges, the payload.
    ///
    /// # Safety
    /// In the child that becomes the program (P), between fork and exec: it lowers the calling
    /// process's limits and privileges for good, and `payload_fd` and `channel_fds` are open in it.
    unsafe fn restrict(&self) -> Result<(), (Step, i32)> {
        let limits = [
            (libc::RLIMIT_CORE, 0, 0),
            // SIGXCPU at the soft limit (Python dies of it), SIGKILL one second later regardless.
            (libc::RLIMIT_CPU, self.cpu_secs, self.cpu_secs.saturating_add(1)),
            (libc::RLIMIT_AS, self.mem_bytes, self.mem_bytes),
            (libc::RLIMIT_FSIZE, self.file_bytes, self.file_bytes),
            (libc::RLIMIT_NPROC, self.nproc, self.nproc),
        ];
        for (resource, soft, hard) in limits {
            if !set_limit(resource, soft, hard) {
                return Err((Step::Limits, errno()));
            }
        }
        if let Some(id) = self.drop_to {
            // Linux does not apply RLIMIT_NPROC to root, and root can write everywhere, so root
            // must not run the code. Supplementary groups first (needs root), then gid, then
            // uid (after which none of this could be undone).
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(id) != 0 || libc::setuid(id) != 0 {
                return Err((Step::DropPrivileges, errno()));
            }
            if libc::getuid() != id || libc::geteuid() != id {
                return Err((Step::DropPrivileges, libc::EPERM));
            }
        }
        // No setuid binary (su, sudo, ping) can give privileges back.
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err((Step::NoNewPrivs, errno()));
        }
        if let Some(filters) = self.seccomp {
            filters.apply().map_err(|e| (Step::Seccomp, e))?;
        }
        // Nothing the stage holds open reaches the code: every inherited descriptor above
        // stdio closes at exec (best effort: Linux >= 5.11), but the harness's payload, which it
        // reads its token from (then closes), and a driver's or checker's channel.
        libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC);
        for &fd in std::iter::once(&self.payload_fd).chain(&self.channel_fds) {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err((Step::Payload, errno()));
            }
        }
        Ok(())
    }
}

/// Replaces I with the fresh init of `init.py`, keeping only the status pipe open; returns only
/// if the exec fails.
///
/// # Safety
/// In I, between fork and exec: it closes every descriptor but `status_fd`, so no live Rust
/// object may own one; `program` is P's pid.
unsafe fn exec_init(init: &InitExec, program: libc::pid_t, status_fd: RawFd) {
    close_fds_except(&[status_fd]);
    if libc::fcntl(status_fd, libc::F_SETFD, 0) != 0 {
        return;
    }
    // P's pid in decimal, NUL-terminated, without allocating.
    let mut digits = [0u8; 24];
    let mut at = digits.len() - 1;
    let mut n = program.max(0) as u64;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let argv: [*const libc::c_char; 9] = [
        init.head[0].as_ptr(),
        init.head[1].as_ptr(),
        init.head[2].as_ptr(),
        init.head[3].as_ptr(),
        INIT_SOURCE.as_ptr(),
        digits[at..].as_ptr().cast(),
        init.tail[0].as_ptr(),
        init.tail[1].as_ptr(),
        std::ptr::null(),
    ];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    libc::execve(init.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
}

/// `init.py`, NUL-terminated for execve.
const INIT_SOURCE: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(concat!(include_str!("init.py"), "\0").as_bytes()) {
    Ok(s) => s,
    Err(_) => panic!("init.py holds a NUL"),
};

/// I's life once P runs when the fresh init could not be exec'd: reap every process of the
/// namespace until P exits, report P's status, exit (the kernel then kills whatever is left in
/// the namespace). I is then a fork of the stage, so
/// its `/proc/1/cmdline` (which every process of the run can read) would show the stage's
/// arguments, task file paths included: it zeroes its copy of the stage's argument and
/// environment strings first (nothing reads them in I any more).
///
/// # Safety
/// In I only, between fork and exec; each `stage_strings` range (start..end) is writable
/// memory of this process (the stage's argument and environment strings), which it zeroes.
unsafe fn run_init(program: libc::pid_t, status_fd: RawFd, stage_strings: Option<[(usize, usize); 2]>) -> ! {
    close_fds_except(&[status_fd]);
    for (start, end) in stage_strings.into_iter().flatten() {
        std::ptr::write_bytes(start as *mut u8, 0, end - start);
    }
    loop {
        let mut status = 0;
        let pid = libc::waitpid(-1, &mut status, 0);
        if pid == program {
            report(status_fd, MSG_EXITED, status, 0);
            libc::_exit(0);
        }
        if pid < 0 && errno() != libc::EINTR {
            libc::_exit(127);
        }
    }
}

/// Waits for one child, retrying on EINTR.
///
/// # Safety
/// `pid` is a child of the calling process; allocates nothing (safe between fork and exec).
unsafe fn wait_for(pid: libc::pid_t) {
    let mut status = 0;
    while libc::waitpid(pid, &mut status, 0) < 0 && errno() == libc::EINTR {}
}

/// # Safety
/// `fd` is the open status pipe that the stage reads; allocates nothing (safe between fork and
/// exec).
unsafe fn report(fd: RawFd, kind: i32, a: i32, b: i32) {
    let mut msg = [0u8; 12];
    msg[..4].copy_from_slice(&kind.to_ne_bytes());
    msg[4..8].copy_from_slice(&a.to_ne_bytes());
    msg[8..].copy_from_slice(&b.to_ne_bytes());
    libc::write(fd, msg.as_ptr().cast(), msg.len());
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
const AT_RECURSIVE: libc::c_int = 0x8000;

/// Makes every mount under `root` read-only in this mount namespace (Linux >= 5.12; on older
/// kernels only `root` itself). Best effort: what cannot be made read-only keeps its file
/// permissions, which the run's unprivileged user meets.
///
/// # Safety
/// In a private mount namespace of the run's own: in the host's it would make the host's
/// mounts read-only.
pub(crate) unsafe fn make_read_only(root: &std::ffi::CStr) {
    let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
    let rc = libc::syscall(libc::SYS_mount_setattr, libc::AT_FDCWD, root.as_ptr(), AT_RECURSIVE as libc::c_uint, &attr as *const MountAttr, std::mem::size_of::<MountAttr>());
    if rc != 0 {
        libc::mount(std::ptr::null(), root.as_ptr(), std::ptr::null(), libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY, std::ptr::null());
    }
}

/// Closes every descriptor but `keep` (close_range(2), or one by one on old kernels).
///
/// # Safety
/// Between fork and exec: no live Rust object may own a descriptor it closes. `keep` holds at
/// most 4 descriptors (any more are closed too).
unsafe fn close_fds_except(keep: &[RawFd]) {
    let mut sorted = [RawFd::MAX; 4];
    let n = keep.len().min(sorted.len());
    sorted[..n].copy_from_slice(&keep[..n]);
    sorted[..n].sort_unstable();
    let mut from: libc::c_uint = 0;
    for &k in &sorted[..n] {
        if k >= 0 && k as libc::c_uint >= from {
            if k as libc::c_uint > from {
                close_range(from, k as libc::c_uint - 1);
            }
            from = k as libc::c_uint + 1;
        }
    }
    close_range(from, libc::c_uint::MAX);
}

/// # Safety
/// Between fork and exec: no live Rust object may own a descriptor in `first..=last`.
unsafe fn close_range(first: libc::c_uint, last: libc::c_uint) {
    if libc::syscall(libc::SYS_close_range, first, last, 0) == 0 {
        return;
    }
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 { lim.rlim_cur.min(1 << 16) as libc::c_uint } else { 1024 };
    let mut fd = first;
    while fd <= last && fd < max {
        libc::close(fd as libc::c_int);
        fd += 1;
    }
}

/// SIGKILL to every process in the group `pgid` (ignoring "no such group").
///
/// Callers do this before reaping the group leader: while the leader is an unreaped zombie
/// its pid, and so the group id, cannot be reused by an unrelated process.
pub(crate) fn kill_group(pgid: libc::pid_t) {
    if pgid <= 0 {
        return;
    }
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
        let rc = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
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

/// What a run's process tree holds at one moment: the watchdog's reading (see [`tree_usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TreeUsage {
    /// Tasks (processes and their threads), as RLIMIT_NPROC counts them.
    pub tasks: u64,
    /// Private resident memory, summed over the processes: resident minus file-backed shared
    /// pages (statm). Copy-on-write pages a fork still shares count once per process.
    pub private_bytes: u64,
    /// CPU time of every process, and of the children each has reaped, in clock ticks.
    pub cpu_ticks: u64,
}

/// Most processes one reading walks (a fork bomb is stopped by RLIMIT_NPROC long before).
const TREE_WALK_LIMIT: usize = 4096;

/// The process tree under `root` (itself included), read from the host's /proc: each task's
/// `children`, each process's `statm` and `stat`. A process that exits during the walk is
/// skipped; with a PID namespace, processes that left their parent are the namespace init's
/// children, so still in the tree. Not async-signal-safe (allocates): parent side only.
pub(crate) fn tree_usage(root: libc::pid_t) -> TreeUsage {
    let mut usage = TreeUsage::default();
    let mut stack = vec![root];
    let mut walked = 0;
    let page = page_size();
    while let Some(pid) = stack.pop() {
        walked += 1;
        if walked > TREE_WALK_LIMIT {
            break;
        }
        let dir = format!("/proc/{pid}");
        let Ok(stat) = fs::read_to_string(format!("{dir}/stat")) else { continue };
        // The fields after the command name (which may hold spaces and parentheses).
        let Some(fields) = stat.rfind(')').map(|at| stat[at + 1..].split_ascii_whitespace().collect::<Vec<_>>()) else { continue };
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        // stat(5) fields 14-17 (utime, stime, cutime, cstime) and 20 (num_threads); `fields`
        // starts at field 3.
        usage.cpu_ticks += field(11) + field(12) + field(13) + field(14);
        usage.tasks += field(17).max(1);
        if let Ok(statm) = fs::read_to_string(format!("{dir}/statm")) {
            let pages: Vec<u64> = statm.split_ascii_whitespace().filter_map(|f| f.parse().ok()).collect();
            if let [_, resident, shared, ..] = pages[..] {
                usage.private_bytes += resident.saturating_sub(shared) * page;
            }
        }
        let Ok(tasks) = fs::read_dir(format!("{dir}/task")) else { continue };
        for task in tasks.flatten() {
            if let Ok(children) = fs::read_to_string(task.path().join("children")) {
                stack.extend(children.split_ascii_whitespace().filter_map(|c| c.parse::<libc::pid_t>().ok()));
            }
        }
    }
    usage
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as u64 } else { 4096 }
}

/// Clock ticks per second (the unit of /proc/PID/stat's CPU times).
pub(crate) fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if n > 0 { n as u64 } else { 100 }
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

/// A pipe whose both ends are close-on-exec: (read, write).
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the array on success; the fds are new and ours.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// An anonymous in-memory file (close-on-exec) holding `bytes`, positioned at its start.
pub(crate) fn memfd_with(bytes: &[u8]) -> io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    // SAFETY: memfd_create with a static name; the fd is new and ours.
    let fd = unsafe { libc::memfd_create(c"coa-sandbox-payload".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut file = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(bytes)?;
    file.rewind()?;
    Ok(OwnedFd::from(file))
}

/// `n` random bytes from the kernel.
pub(crate) fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: getrandom into the unfilled part of a valid buffer.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), N - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(buf)
}

/// Tasks (processes + threads) that `uid` owns right now, as RLIMIT_NPROC counts them.
///
/// For runs that share a uid (no per-run uid): the limit is per user, not per process tree, so
/// a child's process budget is "what the user already runs + max_procs": otherwise a normal
/// user with 300 processes could not start Python at all, and concurrent sandboxes would share
/// one budget, letting one fork bomb stop the others from starting. Unreadable entries count as
/// nothing.
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
/// or `setpgid()`, which the group kill misses. The last resort when runs share a uid and no
/// namespace holds them.
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
                libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<libc::siginfo_t>(), 0);
            }
        }
    }
}
