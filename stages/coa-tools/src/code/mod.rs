//! `code` offline backend: run Python 3 code in a sandbox and render the observation.
//!
//! Model-written code is hostile by accident (infinite loops, fork bombs, memory hogs, floods
//! of output) and occasionally on purpose (exiting early to fake a pass, killing other runs),
//! and the pipeline runs it ~10^4-10^5 times, often many runs at once, so a run must always
//! end, within its limits, leaving nothing behind, and must not touch other runs. Layers,
//! strongest first (what this machine allows is probed once: [`isolation`]):
//!
//! 1. **Namespaces** (root or CAP_SYS_ADMIN): each run has its own PID namespace (it sees and can
//!    signal only its own processes; when its main process exits, or the stage dies, even of
//!    SIGKILL, every process of the run dies), its own mount namespace (a minimal root, see
//!    `root.rs`: the interpreter and its libraries read-only, a size-limited tmpfs as `/tmp`,
//!    its working directory, and as `/dev/shm`, a procfs of its own, no other host file), no
//!    network, its own IPC and hostname. See `child.rs` for the process layout.
//! 2. **An unprivileged user per concurrent run** (root): uid/gid from a reserved range, no
//!    supplementary groups. Linux does not enforce RLIMIT_NPROC for root and root may write
//!    anywhere; with its own uid a run's process limit is its own, `kill(-1, 9)` reaches only
//!    its own processes, and every process it started can be killed by uid. Without the uid
//!    range, user `nobody`; as a normal user the uid is kept.
//! 3. **rlimits** set before exec: CPU seconds (SIGXCPU, then SIGKILL one second later),
//!    address space (allocations fail: Python raises `MemoryError`), file size, number of
//!    tasks, no core dumps. `PR_SET_NO_NEW_PRIVS` keeps setuid binaries from undoing them.
//!    A **watchdog** in the parent bounds the run's whole process tree: every 20 ms it reads
//!    `/proc` for the tree's private resident memory, CPU time (with the children each process
//!    reaped) and task count (`child::tree_usage`), and kills the run past
//!    [`SandboxLimits::mem_bytes`], [`SandboxLimits::cpu_secs`] or [`SandboxLimits::max_procs`]
//!    ([`RunStatus::TreeLimit`]): four forks that each stay under their own limits do not add up
//!    to four times the run's memory.
//!    A **seccomp filter** (`seccomp.rs`, where the kernel takes one) refuses ptrace,
//!    process_vm_readv/writev, new namespaces, mounts, bpf, perf_event_open, keyctl and the like.
//! 4. **Kills**: on the wall-clock deadline, when the output passes its limit, after every
//!    normal exit, and when the stage gets SIGTERM/SIGINT/SIGHUP, the run's process group gets
//!    SIGKILL (with namespaces that takes the whole namespace); without namespaces also every
//!    process of the run's uid, or, with a shared uid, those carrying the run's environment
//!    marker (`COA_SANDBOX_RUN`).
//! 5. **A proof of completion**: the harness (`prelude.py`) reads a per-run random token from
//!    an inherited in-memory file before the program runs and prints it on its own line only
//!    after the program's last statement (and after its unit tests, which it runs itself,
//!    compiled apart from the program); [`CodeRun::finished`] says whether it appeared, and the
//!    line is removed from the captured stdout. `os._exit(0)`, `sys.exit(0)` before the tests,
//!    a kill or a crash cannot produce it; the token is in no file, argument or environment
//!    variable, and the interpreter features that could dig it out of the harness (gc
//!    introspection, trace, profile and monitoring hooks, ctypes and cffi, `/proc/<pid>/mem`
//!    under any name the path resolves from, directory descriptors outside the working
//!    directory) are refused. The tests run in an audit hook that only the harness's own frame
//!    can start, and the hook holding the token answers only that hook's frame. Not prevented:
//!    a subprocess reading its interpreter's `/proc/PID/mem`, and `os.open(name, dir_fd=fd)`
//!    with a directory fd inside the working directory where a subprocess left a symlink into
//!    `/proc` (the audit event does not carry the dir_fd).
//! 6. **An audit-hook prelude** that refuses Python writes outside the working directory.
//!    Defence in depth only, for the fallback without namespaces where `/tmp` is the host's.
//! 7. **A driver** ([`run_calls`], [`run_checked`]): after the program, the harness calls its
//!    functions on request and writes back plain values only (`plain.py`), so that a grader
//!    decides outside this process, on data: the token proves an end, never a pass.
//!
//! Without namespaces a run's working directory is a fresh host temp dir (removed afterwards,
//! and on SIGTERM/SIGINT/SIGHUP), and files written elsewhere through a subprocess
//! land in the host's `/tmp`; the README lists what holds where.
//!
//! Output is captured without threads: one poll() loop reads stdout and stderr (and feeds
//! stdin) as data arrives, so neither pipe can fill up and deadlock the child, and the loop
//! can stop waiting on a pipe still held open by an escaped grandchild. Each stream keeps its
//! first and last bytes only (see `output::HeadTail`), so memory stays bounded, and a run that
//! writes more than [`SandboxLimits::max_output_total`] bytes is stopped.
//!
//! Linux only (prctl, pidfd, namespaces, /proc).

mod child;
mod isolation;
mod output;
mod root;
mod seccomp;
mod value;

use std::ffi::{CString, OsString};
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use child::{ChildSetup, Namespaces, Report};
use isolation::{claim_uid, effective_uid, kill_uid, real_uid, NOBODY};
pub use isolation::{isolation, Isolation};
use output::HeadTail;
pub use value::PyValue;

/// The encoding of plain values between processes (`plain.py`: Python's half of [`PyValue`]),
/// for the test planner of the code rewards, which writes the arguments the driver reads.
pub const PLAIN_PY: &str = include_str!("plain.py");
/// The Python that installs the sandbox's audit hook, reads the run's token, runs `main.py` as
/// `__main__` (then the tests, if any), prints the token if the program reached its end, and
/// then, as the driver, answers calls with plain values.
const PRELUDE: &str = concat!(include_str!("plain.py"), include_str!("prelude.py"));
/// The checker's side of the driver: functions that forward calls to the candidate's run.
const CLIENT: &str = include_str!("client.py");
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
/// The harness's token line, `\n` + 32 hex digits + `\n`: always kept at the end of stdout.
const TOKEN_LINE_BYTES: usize = 34;
/// Inodes of a run's tmpfs: plenty for a program, not for an inode flood.
const TMP_INODES: u64 = 16384;

/// Resource limits of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Wall-clock limit; then the whole run is killed.
    pub wall: Duration,
    /// CPU seconds (RLIMIT_CPU), summed over the process's threads; each forked process gets
    /// its own, and the watchdog holds the whole tree to it too. At least 1.
    pub cpu_secs: u64,
    /// Address space per process (RLIMIT_AS), and private resident memory of the whole tree
    /// (the watchdog), in bytes.
    pub mem_bytes: u64,
    /// Largest file the code may write (RLIMIT_FSIZE), in bytes.
    pub file_bytes: u64,
    /// Processes + threads the code may add (RLIMIT_NPROC on top of what the user runs; the
    /// watchdog holds the tree to it too).
    pub max_procs: u64,
    /// Output kept per stream (head + tail); the rest is counted and replaced by a marker.
    pub max_output_bytes: usize,
    /// Output (stdout + stderr) after which the run is stopped: [`RunStatus::OutputLimit`].
    pub max_output_total: u64,
    /// Size of the run's private `/tmp` (and of its `/dev/shm`), where namespaces are available.
    pub tmp_bytes: u64,
}

impl Default for SandboxLimits {
    /// 10 s wall, 10 CPU s, 1 GiB address space, 16 MiB files, 64 tasks, 8 KiB of output kept,
    /// stopped after 64 MiB of output, a 64 MiB `/tmp`.
    fn default() -> Self {
        Self {
            wall: Duration::from_secs(10),
            cpu_secs: 10,
            mem_bytes: 1 << 30,
            file_bytes: 16 << 20,
            max_procs: 64,
            max_output_bytes: 8 << 10,
            max_output_total: 64 << 20,
            tmp_bytes: 64 << 20,
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
    /// Still running at the wall-clock limit (this long), so it was killed.
    Timeout(Duration),
    /// Stopped for writing more than this many bytes of output.
    OutputLimit(u64),
    /// Stopped by the watchdog: the run's processes together passed one of its limits.
    TreeLimit(TreeLimit),
}

/// A limit on a run's whole process tree (its processes together; the rlimits hold per process),
/// with what the tree held when the watchdog stopped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeLimit {
    /// Private resident bytes over [`SandboxLimits::mem_bytes`].
    Memory(u64),
    /// CPU milliseconds over [`SandboxLimits::cpu_secs`].
    Cpu(u64),
    /// Tasks (processes and threads) over [`SandboxLimits::max_procs`] plus the harness's own.
    Tasks(u64),
}

impl std::fmt::Display for TreeLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            TreeLimit::Memory(b) => write!(f, "its processes held {} MiB of memory together", b >> 20),
            TreeLimit::Cpu(ms) => write!(f, "its processes used {} CPU seconds together", format_secs(Duration::from_millis(ms))),
            TreeLimit::Tasks(n) => write!(f, "it ran {n} processes and threads at once"),
        }
    }
}

/// What counts as a program having run to its end (when the harness prints the run's token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Its last statement (and the last statement of its tests) ran. `sys.exit()` anywhere
    /// is not an end: unit tests after it would not have run.
    LastStatement,
    /// Its last statement ran, or it called `sys.exit()` / `exit()` with status 0 or none: a
    /// stdin/stdout program may stop early on purpose.
    CleanExit,
}

impl Ending {
    fn as_arg(self) -> &'static str {
        match self {
            Ending::LastStatement => "last-statement",
            Ending::CleanExit => "clean-exit",
        }
    }
}

/// A program to run, with optional unit tests and stdin.
#[derive(Debug, Clone, Copy)]
pub struct Program<'a> {
    pub code: &'a str,
    /// Test code run after `code` in the same `__main__` namespace (assertions calling its
    /// functions). Compiled on its own, so the program's text cannot swallow it (an unclosed
    /// string), and handed to the harness without a file the program could read.
    pub tests: Option<&'a str>,
    /// Fed to stdin (otherwise stdin is /dev/null).
    pub stdin: Option<&'a str>,
    pub ending: Ending,
}

impl<'a> Program<'a> {
    /// A plain program, as the agents' `code` tool runs it.
    pub fn script(code: &'a str, stdin: Option<&'a str>) -> Program<'a> {
        Program { code, tests: None, stdin, ending: Ending::CleanExit }
    }
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
    /// Whether the harness printed the run's token: the program (and its tests) reached the
    /// end as [`Ending`] defines it. The token line itself is not in `stdout`.
    pub finished: bool,
    /// From spawn to reap.
    pub wall: Duration,
}

impl CodeRun {
    /// Exited with status 0.
    pub fn success(&self) -> bool {
        self.status == RunStatus::Exit(0)
    }

    /// Exited with status 0 after reaching its end: what a passing test run must show.
    pub fn passed(&self) -> bool {
        self.success() && self.finished
    }

    /// The observation text, in the reference tool's format:
    ///
    /// - success: `[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n…\n[STDOUT:END]`
    ///   (or `... status 0 (no output).`);
    /// - failure: `[FAILED] Code exited with status N.` then a `[STDERR:BEGIN]…[STDERR:END]`
    ///   block, a stdout block, both (`... with mixed output:`), or `(no output).`;
    /// - `[FAILED] Code timed out after N s` / `[FAILED] Code was killed by signal N (…)` /
    ///   `[FAILED] Code was stopped after more than N bytes of output` with the same output
    ///   blocks, so an agent sees what a looping program printed.
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
            RunStatus::Signal(sig) => format!("[FAILED] Code was killed by signal {sig} ({})", describe_signal(sig)),
            RunStatus::Timeout(after) => format!("[FAILED] Code timed out after {} s", format_secs(after)),
            RunStatus::OutputLimit(limit) => format!("[FAILED] Code was stopped after more than {limit} bytes of output"),
            RunStatus::TreeLimit(what) => format!("[FAILED] Code was stopped: {what}, over the run's limit"),
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
/// (otherwise stdin is /dev/null). The agents' `code` tool.
///
/// `Err` means the sandbox itself failed (no interpreter, spawn refused, a namespace that could
/// not be set up); all behaviour of the code, however bad, is an `Ok(CodeRun)` to render.
pub fn run_python(code: &str, stdin: Option<&str>, limits: &SandboxLimits) -> Result<CodeRun> {
    run_program(&Program::script(code, stdin), limits)
}

/// [`run_python`] with an explicit interpreter.
pub fn run_python_with(python: &Path, code: &str, stdin: Option<&str>, limits: &SandboxLimits) -> Result<CodeRun> {
    run_program_with(python, &Program::script(code, stdin), limits)
}

/// Runs a [`Program`] (with its tests, if any) with `python3` in a fresh sandbox.
pub fn run_program(program: &Program, limits: &SandboxLimits) -> Result<CodeRun> {
    let python = find_python()?;
    run_program_with(&python, program, limits)
}

/// [`run_program`] with an explicit interpreter.
pub fn run_program_with(python: &Path, program: &Program, limits: &SandboxLimits) -> Result<CodeRun> {
    run_sandboxed(python, program, limits, None)
}

/// What a driver's call came back with (see [`run_calls`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The plain value the call returned.
    Value(PyValue),
    /// The call raised: `Type: message`.
    Raised(String),
    /// The run wrote something that is no answer (a program can write to the answers' file).
    Garbled(String),
}

/// Runs `code` (as `python3 main.py` would) with `python3`, then, as its driver, makes one call per
/// request (a line of Python literal text, `([name] or [class, method], (args), {kwargs})`, as
/// [`PLAIN_PY`]'s `lit` writes it) and returns the run with one answer per call it made, in
/// order: fewer when the run ended early (exited, timed out, crashed). The requests reach the run
/// through an in-memory file; the answers come back through another, read here after the run.
/// The caller compares them with what it expects, in its own process: nothing but the requests
/// enters the sandbox.
pub fn run_calls(code: &str, requests: &[String], limits: &SandboxLimits) -> Result<(CodeRun, Vec<Answer>)> {
    let python = find_python()?;
    let mut lines = requests.join("\n");
    lines.push('\n');
    let input = child::memfd_with(lines.as_bytes()).context("passing the driver its calls")?;
    let output = child::memfd_with(b"").context("creating the driver's answers file")?;
    let answers = fs::File::from(output.try_clone().context("keeping the driver's answers file")?);
    let args = vec![input.as_raw_fd().to_string(), output.as_raw_fd().to_string()];
    let program = Program { code, tests: None, stdin: None, ending: Ending::LastStatement };
    let run = run_sandboxed(&python, &program, limits, Some(Channel { fds: vec![input, output], args }))?;
    // Bounded by the run's file size limit (RLIMIT_FSIZE holds for in-memory files too).
    let len = answers.metadata().context("reading the driver's answers")?.len().min(limits.file_bytes);
    let mut bytes = vec![0u8; len as usize];
    std::os::unix::fs::FileExt::read_exact_at(&answers, &mut bytes, 0).context("reading the driver's answers")?;
    let answers = bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()).take(requests.len()).map(answer_of_line).collect();
    Ok((run, answers))
}

fn answer_of_line(line: &[u8]) -> Answer {
    let parsed: serde_json::Result<serde_json::Value> = serde_json::from_slice(line);
    match parsed {
        Ok(serde_json::Value::Object(m)) if m.len() == 1 => match (m.get("v").map(PyValue::from_json), m.get("e").map(PyValue::from_json)) {
            (Some(Ok(v)), _) => Answer::Value(v),
            (_, Some(Ok(PyValue::Str(e)))) => Answer::Raised(e),
            (Some(Err(e)), _) => Answer::Garbled(format!("{e:#}")),
            _ => Answer::Garbled("an answer is {\"v\": value} or {\"e\": text}".into()),
        },
        Ok(_) => Answer::Garbled("an answer is {\"v\": value} or {\"e\": text}".into()),
        Err(e) => Answer::Garbled(format!("not JSON: {e}")),
    }
}

/// Runs `code` as [`run_calls`] does, but the calls come from a second sandboxed run, the
/// checker: `checker_prelude` (trusted setup, such as LiveCodeBench's imports), then one
/// forwarding function per name of `remote` that the prelude did not define, then `tests`, which
/// call them as they would call the program's functions (`check(candidate)`). The two runs share
/// no memory (two processes, each in its own namespaces and under its own uid where the machine
/// allows, joined by two pipes), only plain values cross, and the checker passes when its tests
/// ran to their end (its exit status 0 and its token). Returns (the checker's run, the
/// candidate's run), both within `limits`.
pub fn run_checked(code: &str, checker_prelude: &str, remote: &[String], tests: &str, limits: &SandboxLimits) -> Result<(CodeRun, CodeRun)> {
    let python = find_python()?;
    let (calls_read, calls_write) = child::pipe().context("creating the checker's call pipe")?;
    let (answers_read, answers_write) = child::pipe().context("creating the checker's answer pipe")?;
    let names = serde_json::to_string(remote).context("naming the checker's remote functions")?;
    let checker_code = format!(
        "{checker_prelude}\n{PLAIN_PY}\n_coa_channel = ({}, {}, {names})\n{CLIENT}",
        answers_read.as_raw_fd(),
        calls_write.as_raw_fd()
    );
    let candidate_channel = Channel { args: vec![calls_read.as_raw_fd().to_string(), answers_write.as_raw_fd().to_string()], fds: vec![calls_read, answers_write] };
    let checker_channel = Channel { args: Vec::new(), fds: vec![answers_read, calls_write] };
    let checker = Program { code: &checker_code, tests: Some(tests), stdin: None, ending: Ending::LastStatement };
    let candidate = Program { code, tests: None, stdin: None, ending: Ending::LastStatement };
    std::thread::scope(|s| {
        let checked = s.spawn(|| run_sandboxed(&python, &checker, limits, Some(checker_channel)));
        let ran = run_sandboxed(&python, &candidate, limits, Some(candidate_channel));
        let checked = checked.join().map_err(|_| anyhow!("the checker's thread panicked"))?;
        Ok((checked.context("the checker's run")?, ran?))
    })
}

/// Descriptors a run gets beyond stdio (a driver's calls and answers) and the harness arguments
/// that name them (none for a checker: its code names them). The parent's copies close as soon
/// as the run has started, so that each pipe's reader sees its end when the other run is gone.
struct Channel {
    fds: Vec<std::os::fd::OwnedFd>,
    args: Vec<String>,
}

fn run_sandboxed(python: &Path, program: &Program, limits: &SandboxLimits, channel: Option<Channel>) -> Result<CodeRun> {
    let iso = isolation();
    let slot = if iso.uid_per_run { Some(claim_uid(!iso.namespaces).context("claiming a user id for the sandbox")?) } else { None };
    let run_uid = match (&slot, iso.root) {
        (Some(s), _) => s.uid,
        (None, true) => NOBODY,
        (None, false) => real_uid(),
    };
    let drop_to = iso.root.then_some(run_uid);
    let token = hex(&child::random_bytes::<16>().context("drawing the run's token")?);
    let payload = child::memfd_with(format!("{token}\n{}", program.tests.unwrap_or_default()).as_bytes()).context("passing the harness its token")?;
    let marker = run_marker();
    // What finds the run's processes that left its process group.
    let escapees = match (iso.namespaces, &slot) {
        (true, _) => Escapees::None,
        (false, Some(s)) => Escapees::Uid(s.uid),
        (false, None) => Escapees::Marker { uid: run_uid, marker: marker.clone().into_bytes() },
    };
    let pid_cell = Arc::new(AtomicI32::new(0));
    let (workdir, home, namespaces, status_read, status_write) = if iso.namespaces {
        let (read, write) = child::pipe().context("creating the sandbox's status pipe")?;
        let files = vec![(CString::new(format!("/tmp/{SCRIPT_NAME}")).expect("no NUL"), program.code.as_bytes().to_vec())];
        let tmp_options = CString::new(format!("size={},nr_inodes={TMP_INODES},mode=1777", limits.tmp_bytes.max(1 << 20))).expect("no NUL");
        let root = iso.minimal_root.then(|| root::NewRoot::for_interpreter(python));
        let init = child::InitExec::new(python, write.as_raw_fd());
        let ns = Namespaces { status_fd: write.as_raw_fd(), tmp_options, files, root, stage_strings: child::stage_strings(), init };
        (None, PathBuf::from("/tmp"), Some(ns), Some(read), Some(write))
    } else {
        // The stage's pid in the name says whose a dir is (and whether its stage still lives).
        let dir = tempfile::Builder::new().prefix(&format!("coa-sandbox-{}-", std::process::id())).tempdir().context("creating the sandbox temp dir")?;
        let script = dir.path().join(SCRIPT_NAME);
        fs::write(&script, program.code).with_context(|| format!("writing {}", script.display()))?;
        if let Some(id) = drop_to {
            for p in [dir.path(), script.as_path()] {
                std::os::unix::fs::chown(p, Some(id), Some(id)).with_context(|| format!("giving {} to the run's user", p.display()))?;
            }
        }
        let home = dir.path().to_path_buf();
        (Some(dir), home, None, None, None)
    };
    // SIGTERM/SIGINT/SIGHUP of the stage: kill the run, remove its dir.
    let _on_signal = {
        let (pid, escapees, dir) = (pid_cell.clone(), escapees.clone(), workdir.as_ref().map(|d| d.path().to_path_buf()));
        coa_schemas::cleanup::on_signal(move || {
            child::kill_group(pid.load(Ordering::Relaxed));
            escapees.kill();
            if let Some(dir) = &dir {
                let _ = fs::remove_dir_all(dir);
            }
        })
    };
    let nproc = match &slot {
        // Its own uid: the run's processes, the first included, are all it counts.
        Some(_) => limits.max_procs.saturating_add(1),
        None => limits.max_procs.saturating_add(child::count_tasks_of_uid(run_uid)),
    };
    let setup = ChildSetup {
        cpu_secs: limits.cpu_secs.max(1),
        mem_bytes: limits.mem_bytes,
        file_bytes: limits.file_bytes,
        nproc,
        drop_to,
        payload_fd: payload.as_raw_fd(),
        channel_fds: channel.as_ref().map(|c| c.fds.iter().map(|f| f.as_raw_fd()).collect()).unwrap_or_default(),
        seccomp: if iso.seccomp { Some(seccomp::filters().map_err(|e| anyhow!(e))?) } else { None },
        stage_pid: std::process::id() as libc::pid_t,
        namespaces,
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
        .arg(program.ending.as_arg())
        .arg(payload.as_raw_fd().to_string())
        .args(channel.as_ref().map(|c| c.args.as_slice()).unwrap_or_default())
        .current_dir(workdir.as_ref().map_or(Path::new("/"), |d| d.path()))
        .env_clear()
        .envs(sandbox_env(&home))
        .env(MARKER_VAR, &marker[MARKER_VAR.len() + 1..])
        .stdin(if program.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: `apply` only makes async-signal-safe syscalls on data prepared beforehand.
    unsafe {
        cmd.pre_exec(move || setup.apply());
    }

    let start = Instant::now();
    let spawned = cmd.spawn();
    drop(status_write); // the run's processes hold the write end now
    drop(payload);
    drop(channel);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let reports = status_read.as_ref().map(child::read_reports).unwrap_or_default();
            return Err(spawn_error(e, python, iso.root, &reports));
        }
    };
    pid_cell.store(child.id() as i32, Ordering::Relaxed);
    let result = supervise(&mut child, program.stdin.map(str::as_bytes), limits, start, &escapees);
    // Nothing of the run may survive its slot: a later run gets the same uid.
    escapees.kill();
    if let Some(dir) = workdir {
        remove_sandbox_dir(dir);
    }
    drop(slot);
    let (ended, exit, mut run) = result?;
    let status = if let Some(read) = &status_read {
        match (child::read_reports(read).into_iter().next(), ended) {
            (Some(Report::SetupFailed(step, e)), _) => bail!("sandbox: {}: {}", step.describe(), io::Error::from_raw_os_error(e)),
            (_, Ended::Timeout) => RunStatus::Timeout(limits.wall),
            (_, Ended::OutputLimit) => RunStatus::OutputLimit(limits.max_output_total),
            (_, Ended::TreeLimit(what)) => RunStatus::TreeLimit(what),
            (Some(Report::Exited(raw)), Ended::Exited) => status_from_raw(raw)?,
            (None, Ended::Exited) => bail!("sandbox: the run's init ended without reporting the program's status ({exit})"),
        }
    } else {
        match ended {
            Ended::Timeout => RunStatus::Timeout(limits.wall),
            Ended::OutputLimit => RunStatus::OutputLimit(limits.max_output_total),
            Ended::TreeLimit(what) => RunStatus::TreeLimit(what),
            Ended::Exited => status_from_raw(exit.into_raw())?,
        }
    };
    run.status = status;
    let line = format!("\n{token}\n");
    if let Some(at) = run.stdout.rfind(&line) {
        run.stdout.replace_range(at..at + line.len(), "");
        run.stdout_bytes = run.stdout_bytes.saturating_sub(line.len() as u64);
        run.finished = true;
    }
    Ok(run)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn status_from_raw(raw: libc::c_int) -> Result<RunStatus> {
    if libc::WIFEXITED(raw) {
        Ok(RunStatus::Exit(libc::WEXITSTATUS(raw)))
    } else if libc::WIFSIGNALED(raw) {
        Ok(RunStatus::Signal(libc::WTERMSIG(raw)))
    } else {
        bail!("sandboxed process ended with an unknown wait status {raw:#x}")
    }
}

/// Environment variable that tags every process of one run (see `Escapees`).
const MARKER_VAR: &str = "COA_SANDBOX_RUN";

/// `COA_SANDBOX_RUN=<pid>-<counter>-<nanos>`: unique per run, across processes and time.
fn run_marker() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{MARKER_VAR}={}-{n}-{nanos}", std::process::id())
}

/// How to find a run's processes that left its process group.
#[derive(Clone)]
enum Escapees {
    /// None can: the PID namespace holds them all.
    None,
    /// Every process of the run's own uid.
    Uid(u32),
    /// Processes of a shared uid with the run's marker `KEY=value` in their initial environment.
    Marker { uid: u32, marker: Vec<u8> },
}

impl Escapees {
    fn kill(&self) {
        match self {
            Escapees::None => {}
            Escapees::Uid(uid) => kill_uid(*uid),
            Escapees::Marker { uid, marker } => child::kill_marked_processes(*uid, marker),
        }
    }
}

fn sandbox_env(home: &Path) -> Vec<(&'static str, OsString)> {
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
    let mut env: Vec<(&'static str, OsString)> = fixed.iter().map(|&(k, v)| (k, OsString::from(v))).collect();
    env.push(("HOME", home.as_os_str().to_owned()));
    env.push(("TMPDIR", home.as_os_str().to_owned()));
    env
}

/// A spawn failure, explained (with the failed setup step, when a namespaced run reported one).
fn spawn_error(e: io::Error, python: &Path, as_root: bool, reports: &[Report]) -> anyhow::Error {
    if let Some(Report::SetupFailed(step, errno)) = reports.first() {
        return anyhow!("sandbox: {}: {}", step.describe(), io::Error::from_raw_os_error(*errno));
    }
    let who = if as_root { "the run's user" } else { "this user" };
    match (e.kind(), e.raw_os_error()) {
        (io::ErrorKind::NotFound, _) => anyhow!("python interpreter {} not found (set COA_PYTHON)", python.display()),
        (io::ErrorKind::PermissionDenied, _) => anyhow!(
            "{who} may not execute the python interpreter {} (set COA_PYTHON to one it can run)",
            python.display()
        ),
        (_, Some(libc::EAGAIN)) => anyhow!("could not start {}: {who} is at its process limit (another sandbox's fork bomb?)", python.display()),
        _ => anyhow::Error::new(e).context(format!("starting {} in the sandbox", python.display())),
    }
}

/// How the poll loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Exited,
    Timeout,
    OutputLimit,
    TreeLimit(TreeLimit),
}

/// How often the watchdog reads the run's process tree.
const WATCH_TICK: Duration = Duration::from_millis(20);
/// Tasks of the sandbox's own around the code (outside process, the namespace's init, the
/// interpreter), not counted against [`SandboxLimits::max_procs`].
const HARNESS_TASKS: u64 = 3;

/// The tree-wide limit `usage` passes, if any.
fn over_tree_limit(usage: &child::TreeUsage, limits: &SandboxLimits, ticks_per_sec: u64) -> Option<TreeLimit> {
    if usage.private_bytes > limits.mem_bytes {
        return Some(TreeLimit::Memory(usage.private_bytes));
    }
    if usage.cpu_ticks > limits.cpu_secs * ticks_per_sec {
        return Some(TreeLimit::Cpu(usage.cpu_ticks * 1000 / ticks_per_sec));
    }
    if usage.tasks > limits.max_procs + HARNESS_TASKS {
        return Some(TreeLimit::Tasks(usage.tasks));
    }
    None
}

/// Pumps the child's pipes until it exits (or is killed at the deadline or the output limit),
/// kills its group, reaps it and assembles the output. Never returns with the child running.
fn supervise(
    child: &mut Child,
    input: Option<&[u8]>,
    limits: &SandboxLimits,
    start: Instant,
    escapees: &Escapees,
) -> Result<(Ended, std::process::ExitStatus, CodeRun)> {
    // The child leads its own group (process_group(0)), so its pid is the group id.
    let pid = child.id() as libc::pid_t;
    let mut out = HeadTail::with_tail_reserve(limits.max_output_bytes, TOKEN_LINE_BYTES);
    let mut err = HeadTail::new(limits.max_output_bytes);
    let pumped = pump(child, pid, input, limits, escapees, &mut out, &mut err);
    // Whatever happened: no process of the run outlives it, and the leader is reaped.
    child::kill_group(pid);
    escapees.kill();
    let exit = child.wait().context("waiting for the sandboxed process")?;
    let wall = start.elapsed();
    let ended = pumped?;
    let (stdout_bytes, stderr_bytes) = (out.total(), err.total());
    let (stdout, cut_out) = out.finish();
    let (stderr, cut_err) = err.finish();
    let run = CodeRun {
        status: RunStatus::Exit(0), // set by the caller
        stdout,
        stderr,
        stdout_bytes,
        stderr_bytes,
        truncated: cut_out || cut_err,
        finished: false,
        wall,
    };
    Ok((ended, exit, run))
}

/// The poll loop. On return the child has exited (not yet reaped) and its group has been
/// killed, unless an error is returned.
fn pump(
    child: &mut Child,
    pid: libc::pid_t,
    input: Option<&[u8]>,
    limits: &SandboxLimits,
    escapees: &Escapees,
    out: &mut HeadTail,
    err: &mut HeadTail,
) -> Result<Ended> {
    let deadline = Instant::now() + limits.wall;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut stdin = child.stdin.take().map(|pipe| (pipe, input.unwrap_or_default()));
    for fd in [stdout.as_ref().map(|p| p.as_fd()), stderr.as_ref().map(|p| p.as_fd())]
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
    let mut killed: Option<Ended> = None;
    let mut drain_until: Option<Instant> = None;
    let ticks_per_sec = child::clock_ticks_per_sec();
    let mut next_watch = Instant::now() + WATCH_TICK;

    loop {
        let now = Instant::now();
        if drain_until.is_none() {
            if child::has_exited(pid).context("checking on the sandboxed process")? {
                child::kill_group(pid);
                // Escapees may hold the pipes open: kill them now rather than wait out the grace.
                escapees.kill();
                drain_until = Some(now + DRAIN_GRACE);
                stdin = None;
            } else if killed.is_none() && now >= deadline {
                child::kill_group(pid);
                escapees.kill();
                killed = Some(Ended::Timeout);
            } else if killed.is_none() && out.total() + err.total() > limits.max_output_total {
                child::kill_group(pid);
                escapees.kill();
                killed = Some(Ended::OutputLimit);
            } else if killed.is_none() && now >= next_watch {
                // The watchdog: the rlimits bound each process; the tree is bounded here.
                if let Some(what) = over_tree_limit(&child::tree_usage(pid), limits, ticks_per_sec) {
                    child::kill_group(pid);
                    escapees.kill();
                    killed = Some(Ended::TreeLimit(what));
                }
                next_watch = now + WATCH_TICK;
            }
        }
        if let Some(until) = drain_until {
            if (stdout.is_none() && stderr.is_none()) || now >= until {
                return Ok(killed.unwrap_or(Ended::Exited));
            }
        }

        let mut wait = match drain_until {
            Some(until) => until - now,
            None if killed.is_some() => Duration::from_millis(50), // killed; exit is imminent
            None => deadline.min(next_watch).saturating_duration_since(now),
        };
        if pidfd.is_none() && drain_until.is_none() {
            wait = wait.min(FALLBACK_TICK);
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
        let mut add = |fd: Option<i32>, events: libc::c_short| -> Option<usize> {
            fd.map(|fd| {
                fds.push(libc::pollfd { fd, events, revents: 0 });
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
/// When we are root the code runs as an unprivileged user, so the interpreter must be executable
/// by others along its whole path: a pyenv Python under `/root` (mode 700) is skipped in favour
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
    let unprivileged = effective_uid() == 0;
    if let Some(explicit) = std::env::var_os("COA_PYTHON") {
        let path = PathBuf::from(&explicit);
        let real =
            real_interpreter(&path).with_context(|| format!("COA_PYTHON={}", path.display()))?;
        if unprivileged && !others_can_execute(&real) {
            bail!(
                "COA_PYTHON={}: the sandbox's unprivileged user cannot execute {}",
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
            Ok(real) if !unprivileged || others_can_execute(&real) => return Ok(real),
            Ok(real) => rejected.push(format!(
                "{} (the sandbox's unprivileged user cannot execute it)",
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
            finished: true,
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
