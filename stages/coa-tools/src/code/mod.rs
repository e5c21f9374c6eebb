//! `code` offline backend: run Python 3 code in a sandbox and render the observation.
//!
//! Model-written code is hostile by accident (infinite loops, fork bombs, memory hogs, floods
//! of output) and occasionally on purpose, and the pipeline runs it ~10^4-10^5 times, so a run
//! must always end, within its limits, leaving nothing behind. Layers, strongest first:
//!
//! 1. **An unprivileged user.** When we are root (CI, the GPU machine), the child drops to
//!    `nobody` (uid/gid 65534, no supplementary groups) before exec. Linux does not enforce
//!    RLIMIT_NPROC for root, and root may write anywhere; as `nobody` the process limit bites
//!    and most of the filesystem is read-only. As a normal user the uid is kept.
//! 2. **rlimits** set in the child before exec: CPU seconds (SIGXCPU, then SIGKILL one second
//!    later), address space (allocations fail: Python raises `MemoryError`), file size, number
//!    of tasks, no core dumps. `PR_SET_NO_NEW_PRIVS` keeps setuid binaries from undoing them.
//! 3. **A process group** per run: on the wall-clock deadline, and after every normal exit,
//!    the whole group gets SIGKILL before the leader is reaped, so no stray child survives.
//!    A process that leaves the group (`setsid`) escapes that kill, so the run also kills the
//!    processes of its uid whose environment carries the run's unique marker
//!    (`COA_SANDBOX_RUN`); one that also re-execs with a clean environment escapes both but
//!    keeps its rlimits. cgroups would be the real fix and are not assumed available.
//! 4. **No network** where the kernel lets us: `unshare(CLONE_NEWNET)` (root only in practice;
//!    ignored on failure).
//! 5. **A fresh temp dir** per run as cwd, HOME and TMPDIR, removed afterwards.
//! 6. **An audit-hook prelude** (`prelude.py`) that refuses writes outside that dir. Defence
//!    in depth only: `/tmp` is world-writable even for `nobody`, and the hook catches ordinary
//!    `open()`/`os.*` calls there, but ctypes or a subprocess get past it.
//!
//! Output is captured without threads: one poll() loop reads stdout and stderr (and feeds
//! stdin) as data arrives, so neither pipe can fill up and deadlock the child, and the loop
//! can stop waiting on a pipe still held open by an escaped grandchild. Each stream keeps its
//! first and last bytes only (see `output::HeadTail`), so memory stays bounded.
//!
//! Linux only (prctl, pidfd, /proc).

mod child;
mod output;

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use child::{ChildSetup, NOBODY};
use output::HeadTail;

/// The Python that installs the sandbox's audit hook and then runs `main.py` as `__main__`.
const PRELUDE: &str = include_str!("prelude.py");
/// The user's code, written into the sandbox dir; tracebacks show this relative name, which
/// keeps them identical from run to run (the temp dir's name is random).
const SCRIPT_NAME: &str = "main.py";
/// Once the child has exited and its group is killed, how long to keep reading pipes that a
/// process outside the group may still hold open.
const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Poll tick when pidfd is unavailable (pre-5.3 kernels): the latency of noticing an exit.
const FALLBACK_TICK: Duration = Duration::from_millis(5);
/// Reads per stream per wake-up, so a flood on one pipe cannot starve the deadline check.
const MAX_READS_PER_WAKE: usize = 16;

/// Resource limits of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Wall-clock limit; then the whole process group is killed.
    pub wall: Duration,
    /// CPU seconds (RLIMIT_CPU), summed over the process's threads; each forked process gets
    /// its own. At least 1.
    pub cpu_secs: u64,
    /// Address space per process (RLIMIT_AS), in bytes.
    pub mem_bytes: u64,
    /// Largest file the code may write (RLIMIT_FSIZE), in bytes.
    pub file_bytes: u64,
    /// Processes + threads the code may add (RLIMIT_NPROC on top of what the user runs).
    pub max_procs: u64,
    /// Output kept per stream (head + tail); the rest is counted and replaced by a marker.
    pub max_output_bytes: usize,
}

impl Default for SandboxLimits {
    /// 10 s wall, 10 CPU s, 1 GiB address space, 16 MiB files, 64 tasks, 8 KiB of output.
    fn default() -> Self {
        Self {
            wall: Duration::from_secs(10),
            cpu_secs: 10,
            mem_bytes: 1 << 30,
            file_bytes: 16 << 20,
            max_procs: 64,
            max_output_bytes: 8 << 10,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Exited on its own with this status.
    Exit(i32),
    /// Killed by this signal (not by us): SIGXCPU/SIGKILL from the CPU limit, SIGSEGV, ...
    Signal(i32),
    /// Still running at the wall-clock limit (this long), so its group was killed.
    Timeout(Duration),
}

/// The outcome of one sandboxed run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeRun {
    pub status: RunStatus,
    /// Captured stdout: whole, or head + `... [N bytes truncated] ...` + tail.
    pub stdout: String,
    pub stderr: String,
    /// Bytes the code wrote to each stream (kept or not).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Whether either stream was cut.
    pub truncated: bool,
    /// From spawn to reap.
    pub wall: Duration,
}

impl CodeRun {
    /// Exited with status 0.
    pub fn success(&self) -> bool {
        self.status == RunStatus::Exit(0)
    }

    /// The observation text, in the reference tool's format:
    ///
    /// - success: `[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n…\n[STDOUT:END]`
    ///   (or `... status 0 (no output).`);
    /// - failure: `[FAILED] Code exited with status N.` then a `[STDERR:BEGIN]…[STDERR:END]`
    ///   block, a stdout block, both (`... with mixed output:`), or `(no output).`;
    /// - `[FAILED] Code timed out after N s` / `[FAILED] Code was killed by signal N (…)` with
    ///   the same output blocks, so an agent sees what a looping program printed.
    ///
    /// Output is trimmed, as the reference does.
    pub fn render(&self) -> String {
        let out = self.stdout.trim();
        let err = self.stderr.trim();
        let head = match self.status {
            RunStatus::Exit(0) => {
                return if out.is_empty() {
                    "[EXECUTED] Code exited with status 0 (no output).".to_owned()
                } else {
                    format!("[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n{out}\n[STDOUT:END]")
                };
            }
            RunStatus::Exit(code) => format!("[FAILED] Code exited with status {code}"),
            RunStatus::Signal(sig) => {
                format!(
                    "[FAILED] Code was killed by signal {sig} ({})",
                    describe_signal(sig)
                )
            }
            RunStatus::Timeout(after) => {
                format!("[FAILED] Code timed out after {} s", format_secs(after))
            }
        };
        match (out.is_empty(), err.is_empty()) {
            (true, true) => format!("{head} (no output)."),
            (true, false) => format!("{head}.\n[STDERR:BEGIN]\n{err}\n[STDERR:END]"),
            (false, true) => format!("{head}.\n[STDOUT:BEGIN]\n{out}\n[STDOUT:END]"),
            (false, false) => format!(
                "{head} with mixed output:\n[STDOUT:BEGIN]\n{out}\n[STDOUT:END]\n\
                 [STDERR:BEGIN]\n{err}\n[STDERR:END]"
            ),
        }
    }
}

/// "2" for whole seconds, "1.5" otherwise.
fn format_secs(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        format!("{:.1}", d.as_secs_f64())
    }
}

/// Name and likely cause of a signal that ended the code, in words an agent can act on.
fn describe_signal(sig: i32) -> String {
    match sig {
        libc::SIGKILL => "SIGKILL: killed, e.g. for exceeding the CPU time limit".into(),
        libc::SIGXCPU => "SIGXCPU: CPU time limit exceeded".into(),
        libc::SIGXFSZ => "SIGXFSZ: file size limit exceeded".into(),
        libc::SIGSEGV => "SIGSEGV: segmentation fault, possibly from the memory limit".into(),
        libc::SIGABRT => "SIGABRT: aborted, possibly out of memory".into(),
        libc::SIGBUS => "SIGBUS: bus error".into(),
        libc::SIGFPE => "SIGFPE: arithmetic error".into(),
        libc::SIGILL => "SIGILL: illegal instruction".into(),
        libc::SIGPIPE => "SIGPIPE: broken pipe".into(),
        libc::SIGTERM => "SIGTERM: terminated".into(),
        libc::SIGINT => "SIGINT: interrupted".into(),
        libc::SIGHUP => "SIGHUP: hang-up".into(),
        _ => format!("signal {sig}"),
    }
}

/// Runs `code` with `python3` (see [`find_python`]) in a fresh sandbox; `stdin` is fed to it
/// (otherwise stdin is /dev/null).
///
/// `Err` means the sandbox itself failed (no interpreter, no temp dir, spawn refused); all
/// behaviour of the code, however bad, is an `Ok(CodeRun)` to render for the agent.
pub fn run_python(code: &str, stdin: Option<&str>, limits: &SandboxLimits) -> Result<CodeRun> {
    let python = find_python()?;
    run_python_with(&python, code, stdin, limits)
}

/// [`run_python`] with an explicit interpreter.
pub fn run_python_with(
    python: &Path,
    code: &str,
    stdin: Option<&str>,
    limits: &SandboxLimits,
) -> Result<CodeRun> {
    let as_root = child::effective_uid() == 0;
    let dir = tempfile::Builder::new()
        .prefix("coa-sandbox-")
        .tempdir()
        .context("creating the sandbox temp dir")?;
    let script = dir.path().join(SCRIPT_NAME);
    fs::write(&script, code).with_context(|| format!("writing {}", script.display()))?;
    let drop_to = if as_root {
        std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY))
            .with_context(|| format!("giving {} to user nobody", dir.path().display()))?;
        Some(NOBODY)
    } else {
        None
    };
    let target_uid = drop_to.unwrap_or_else(child::real_uid);
    let marker = run_marker();
    let setup = ChildSetup {
        cpu_secs: limits.cpu_secs.max(1),
        mem_bytes: limits.mem_bytes,
        file_bytes: limits.file_bytes,
        nproc: limits
            .max_procs
            .saturating_add(child::count_tasks_of_uid(target_uid)),
        drop_to,
    };

    let mut cmd = Command::new(python);
    // Not `-I`: it implies `-E`, which would also ignore PYTHONHASHSEED, and a fixed hash seed
    // makes set/dict-of-str output reproducible. The environment is cleared and rebuilt here,
    // so `-s` (no user site) plus PYTHONSAFEPATH give what `-I` would.
    cmd.arg("-s")
        .arg("-B")
        .arg("-c")
        .arg(PRELUDE)
        .arg(SCRIPT_NAME)
        .current_dir(dir.path())
        .env_clear()
        .envs(sandbox_env(dir.path()))
        .env(MARKER_VAR, &marker[MARKER_VAR.len() + 1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: `apply` only makes async-signal-safe syscalls on plain data copied into it.
    unsafe {
        cmd.pre_exec(move || setup.apply());
    }

    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|e| spawn_error(e, python, as_root))?;
    let escapees = Escapees {
        uid: target_uid,
        marker: marker.as_bytes(),
    };
    let result = supervise(
        &mut child,
        stdin.map(str::as_bytes),
        limits,
        start,
        &escapees,
    );
    remove_sandbox_dir(dir);
    result
}

/// Environment variable that tags every process of one run (see `Escapees`).
const MARKER_VAR: &str = "COA_SANDBOX_RUN";

/// `COA_SANDBOX_RUN=<pid>-<counter>-<nanos>`: unique per run, across processes and time.
fn run_marker() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{MARKER_VAR}={}-{n}-{nanos}", std::process::id())
}

/// How to find a run's processes that left its process group: their uid and the marker
/// `KEY=value` in their initial environment.
struct Escapees<'a> {
    uid: u32,
    marker: &'a [u8],
}

impl Escapees<'_> {
    fn kill(&self) {
        child::kill_marked_processes(self.uid, self.marker);
    }
}

fn sandbox_env(dir: &Path) -> Vec<(&'static str, OsString)> {
    let fixed = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("LANG", "C.UTF-8"),
        ("PYTHONHASHSEED", "0"),
        ("PYTHONIOENCODING", "utf-8"),
        ("PYTHONSAFEPATH", "1"),
        // Unbuffered, so what a program printed before a timeout or a kill is still seen.
        ("PYTHONUNBUFFERED", "1"),
        // Numeric libraries otherwise start a thread per core, and threads count as tasks.
        ("OMP_NUM_THREADS", "1"),
        ("OPENBLAS_NUM_THREADS", "1"),
        ("MKL_NUM_THREADS", "1"),
    ];
    let mut env: Vec<(&'static str, OsString)> =
        fixed.iter().map(|&(k, v)| (k, OsString::from(v))).collect();
    env.push(("HOME", dir.as_os_str().to_owned()));
    env.push(("TMPDIR", dir.as_os_str().to_owned()));
    env
}

/// A spawn failure, explained.
fn spawn_error(e: io::Error, python: &Path, as_root: bool) -> anyhow::Error {
    let who = if as_root { "user nobody" } else { "this user" };
    match (e.kind(), e.raw_os_error()) {
        (io::ErrorKind::NotFound, _) => {
            anyhow!(
                "python interpreter {} not found (set COA_PYTHON)",
                python.display()
            )
        }
        (io::ErrorKind::PermissionDenied, _) => anyhow!(
            "{who} may not execute the python interpreter {} (set COA_PYTHON to one it can run)",
            python.display()
        ),
        (_, Some(libc::EAGAIN)) => anyhow!(
            "could not start {}: {who} is at its process limit (another sandbox's fork bomb?)",
            python.display()
        ),
        _ => anyhow::Error::new(e).context(format!("starting {} in the sandbox", python.display())),
    }
}

/// Pumps the child's pipes until it exits (or is killed at the deadline), kills its group,
/// reaps it and assembles the result. Never returns with the child still running.
fn supervise(
    child: &mut Child,
    input: Option<&[u8]>,
    limits: &SandboxLimits,
    start: Instant,
    escapees: &Escapees,
) -> Result<CodeRun> {
    // The child leads its own group (process_group(0)), so its pid is the group id.
    let pid = child.id() as libc::pid_t;
    let mut out = HeadTail::new(limits.max_output_bytes);
    let mut err = HeadTail::new(limits.max_output_bytes);
    let pumped = pump(child, pid, input, limits.wall, escapees, &mut out, &mut err);
    // Whatever happened: no process of the run outlives it, and the leader is reaped.
    child::kill_group(pid);
    escapees.kill();
    let status = child.wait().context("waiting for the sandboxed process")?;
    let wall = start.elapsed();
    let timed_out = pumped?;

    let status = if timed_out {
        RunStatus::Timeout(limits.wall)
    } else if let Some(code) = status.code() {
        RunStatus::Exit(code)
    } else if let Some(sig) = status.signal() {
        RunStatus::Signal(sig)
    } else {
        bail!("sandboxed process ended with an unknown status: {status:?}");
    };
    let (stdout_bytes, stderr_bytes) = (out.total(), err.total());
    let (stdout, cut_out) = out.finish();
    let (stderr, cut_err) = err.finish();
    Ok(CodeRun {
        status,
        stdout,
        stderr,
        stdout_bytes,
        stderr_bytes,
        truncated: cut_out || cut_err,
        wall,
    })
}

/// The poll loop. Returns whether the wall-clock limit was hit. On return the child has
/// exited (not yet reaped) and its group has been killed, unless an error is returned.
fn pump(
    child: &mut Child,
    pid: libc::pid_t,
    input: Option<&[u8]>,
    wall: Duration,
    escapees: &Escapees,
    out: &mut HeadTail,
    err: &mut HeadTail,
) -> Result<bool> {
    let deadline = Instant::now() + wall;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut stdin = child
        .stdin
        .take()
        .map(|pipe| (pipe, input.unwrap_or_default()));
    for fd in [
        stdout.as_ref().map(|p| p.as_fd()),
        stderr.as_ref().map(|p| p.as_fd()),
    ]
    .into_iter()
    .flatten()
    .chain(stdin.as_ref().map(|(p, _)| p.as_fd()))
    {
        child::set_nonblocking(&fd).context("making the child's pipes non-blocking")?;
    }
    if stdin.as_ref().is_some_and(|(_, data)| data.is_empty()) {
        stdin = None; // close now: EOF for the child
    }
    let pidfd = child::pidfd_open(pid);
    let mut buf = vec![0u8; 64 << 10];
    let mut timed_out = false;
    let mut drain_until: Option<Instant> = None;

    loop {
        let now = Instant::now();
        if drain_until.is_none() {
            if child::has_exited(pid).context("checking on the sandboxed process")? {
                child::kill_group(pid);
                // Escapees may hold the pipes open: kill them now rather than wait out the grace.
                escapees.kill();
                drain_until = Some(now + DRAIN_GRACE);
                stdin = None;
            } else if !timed_out && now >= deadline {
                child::kill_group(pid);
                timed_out = true;
            }
        }
        if let Some(until) = drain_until {
            if (stdout.is_none() && stderr.is_none()) || now >= until {
                return Ok(timed_out);
            }
        }

        let mut wait = match drain_until {
            Some(until) => until - now,
            None if timed_out => Duration::from_millis(50), // killed; exit is imminent
            None => deadline - now,
        };
        if pidfd.is_none() && drain_until.is_none() {
            wait = wait.min(FALLBACK_TICK);
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
        let mut add = |fd: Option<i32>, events: libc::c_short| -> Option<usize> {
            fd.map(|fd| {
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
                fds.len() - 1
            })
        };
        let i_out = add(stdout.as_ref().map(|p| p.as_raw_fd()), libc::POLLIN);
        let i_err = add(stderr.as_ref().map(|p| p.as_raw_fd()), libc::POLLIN);
        let i_in = add(stdin.as_ref().map(|(p, _)| p.as_raw_fd()), libc::POLLOUT);
        if drain_until.is_none() {
            add(pidfd.as_ref().map(|fd| fd.as_raw_fd()), libc::POLLIN);
        }
        let timeout_ms = wait.as_millis().saturating_add(1).min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(anyhow::Error::new(e).context("poll() on the child's pipes"));
        }
        let ready = |i: Option<usize>| i.is_some_and(|i| fds[i].revents != 0);
        if ready(i_out) {
            read_available(&mut stdout, out, &mut buf).context("reading the child's stdout")?;
        }
        if ready(i_err) {
            read_available(&mut stderr, err, &mut buf).context("reading the child's stderr")?;
        }
        if ready(i_in) {
            write_some(&mut stdin);
        }
    }
}

/// Reads what a non-blocking pipe has (bounded per call); `None`s the pipe at EOF.
fn read_available<R: Read>(
    pipe: &mut Option<R>,
    sink: &mut HeadTail,
    buf: &mut [u8],
) -> io::Result<()> {
    let Some(reader) = pipe else { return Ok(()) };
    for _ in 0..MAX_READS_PER_WAKE {
        match reader.read(buf) {
            Ok(0) => {
                *pipe = None;
                return Ok(());
            }
            Ok(n) => sink.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Feeds stdin as far as the pipe takes it; closes it when done. A child that stops reading
/// (or exits) is its own business, not an error of the run.
fn write_some<W: Write>(stdin: &mut Option<(W, &[u8])>) {
    let Some((pipe, data)) = stdin else { return };
    loop {
        match pipe.write(data) {
            Ok(n) => {
                *data = &data[n..];
                if data.is_empty() {
                    *stdin = None;
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(_) => {
                *stdin = None;
                return;
            }
        }
    }
}

/// Removes the sandbox dir. Code running as our own user may have left directories without
/// write permission, so on failure permissions are restored and removal retried; a dir that
/// still cannot be removed is reported on stderr rather than failing a finished run.
fn remove_sandbox_dir(dir: tempfile::TempDir) {
    let path = dir.path().to_owned();
    if dir.close().is_ok() {
        return;
    }
    restore_permissions(&path);
    if let Err(e) = fs::remove_dir_all(&path) {
        if path.exists() {
            eprintln!(
                "coa-tools: could not remove sandbox dir {}: {e}",
                path.display()
            );
        }
    }
}

fn restore_permissions(dir: &Path) {
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                restore_permissions(&entry.path());
            }
        }
    }
}

/// The Python 3 interpreter for sandboxed runs, found once per process:
///
/// - `COA_PYTHON`, if set (used as given, or an error);
/// - else the first `python3` on PATH, resolved to the real binary via `sys.executable`
///   (a pyenv shim is a script that would need the invoking user's pyenv);
/// - else `/usr/local/bin/python3`, `/usr/bin/python3`.
///
/// When we are root the code runs as `nobody`, so the interpreter must be executable by
/// others along its whole path: a pyenv Python under `/root` (mode 700) is skipped in favour
/// of the system one. Point `COA_PYTHON` at a world-readable install if the code needs its
/// packages.
pub fn find_python() -> Result<PathBuf> {
    static FOUND: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| discover_python().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

fn discover_python() -> Result<PathBuf> {
    let for_nobody = child::effective_uid() == 0;
    if let Some(explicit) = std::env::var_os("COA_PYTHON") {
        let path = PathBuf::from(&explicit);
        let real =
            real_interpreter(&path).with_context(|| format!("COA_PYTHON={}", path.display()))?;
        if for_nobody && !others_can_execute(&real) {
            bail!(
                "COA_PYTHON={}: user nobody cannot execute {}",
                path.display(),
                real.display()
            );
        }
        return Ok(real);
    }
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("python3"))
                .collect()
        })
        .unwrap_or_default();
    candidates.push("/usr/local/bin/python3".into());
    candidates.push("/usr/bin/python3".into());
    let mut rejected = Vec::new();
    for cand in candidates.iter().filter(|c| c.is_file()) {
        match real_interpreter(cand) {
            Ok(real) if !for_nobody || others_can_execute(&real) => return Ok(real),
            Ok(real) => rejected.push(format!(
                "{} (user nobody cannot execute it)",
                real.display()
            )),
            Err(e) => rejected.push(format!("{} ({e:#})", cand.display())),
        }
    }
    if rejected.is_empty() {
        bail!("python3 not found on PATH nor in /usr/local/bin or /usr/bin (set COA_PYTHON)");
    }
    bail!(
        "no usable python3 for the code sandbox (set COA_PYTHON); tried: {}",
        rejected.join("; ")
    )
}

/// Asks `python` for its real executable path (resolving shims and symlinks).
fn real_interpreter(python: &Path) -> Result<PathBuf> {
    let out = Command::new(python)
        .args(["-I", "-c", "import sys; print(sys.executable)"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "{} -c 'print(sys.executable)' failed ({}): {}",
            python.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let exe = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if exe.is_empty() {
        bail!("{} does not know its sys.executable", python.display());
    }
    let exe = PathBuf::from(exe);
    fs::canonicalize(&exe).with_context(|| format!("resolving {}", exe.display()))
}

/// Whether a user who is neither owner nor in the group can execute `path`: the file and
/// every directory above it need the "others" execute bit.
fn others_can_execute(path: &Path) -> bool {
    let mode_ok = |p: &Path| fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    mode_ok(path) && path.ancestors().skip(1).all(mode_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(status: RunStatus, stdout: &str, stderr: &str) -> CodeRun {
        CodeRun {
            status,
            stdout: stdout.into(),
            stderr: stderr.into(),
            stdout_bytes: stdout.len() as u64,
            stderr_bytes: stderr.len() as u64,
            truncated: false,
            wall: Duration::from_millis(30),
        }
    }

    #[test]
    fn render_success() {
        assert_eq!(
            run(RunStatus::Exit(0), "42\n", "").render(),
            "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n42\n[STDOUT:END]"
        );
        assert_eq!(
            run(RunStatus::Exit(0), " \n", "warning").render(),
            "[EXECUTED] Code exited with status 0 (no output)."
        );
    }

    #[test]
    fn render_failures() {
        assert_eq!(
            run(RunStatus::Exit(1), "", "boom\n").render(),
            "[FAILED] Code exited with status 1.\n[STDERR:BEGIN]\nboom\n[STDERR:END]"
        );
        assert_eq!(
            run(RunStatus::Exit(2), "", "").render(),
            "[FAILED] Code exited with status 2 (no output)."
        );
        assert_eq!(
            run(RunStatus::Exit(3), "partial\n", "").render(),
            "[FAILED] Code exited with status 3.\n[STDOUT:BEGIN]\npartial\n[STDOUT:END]"
        );
        assert_eq!(
            run(RunStatus::Exit(1), "a", "b").render(),
            "[FAILED] Code exited with status 1 with mixed output:\n\
             [STDOUT:BEGIN]\na\n[STDOUT:END]\n[STDERR:BEGIN]\nb\n[STDERR:END]"
        );
        assert_eq!(
            run(RunStatus::Timeout(Duration::from_secs(2)), "tick\n", "").render(),
            "[FAILED] Code timed out after 2 s.\n[STDOUT:BEGIN]\ntick\n[STDOUT:END]"
        );
        assert_eq!(
            run(RunStatus::Timeout(Duration::from_millis(1500)), "", "").render(),
            "[FAILED] Code timed out after 1.5 s (no output)."
        );
        assert_eq!(
            run(RunStatus::Signal(libc::SIGXCPU), "", "").render(),
            "[FAILED] Code was killed by signal 24 (SIGXCPU: CPU time limit exceeded) (no output)."
        );
    }
}
