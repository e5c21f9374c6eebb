//! What a stage undoes when it is told to stop (SIGTERM, SIGINT, SIGHUP): temporary output files
//! removed, sandboxed code killed. Anything that leaves a trace while the stage works registers an
//! action here and drops the [`Guard`] once the trace is gone (renamed into place, reaped).
//!
//! On the first registration a handler is installed for the three signals (unless the signal is
//! ignored, as under `nohup`): it only writes the signal number into a pipe; a dedicated thread
//! reads it, runs every registered action, then restores the default disposition and re-raises
//! the signal, so the stage still dies of it (its parent sees "killed by SIGTERM", as without us).
//!
//! SIGKILL cannot be caught: what a stage leaves after `kill -9` is bounded by design elsewhere
//! (temporary names that no reader mistakes for outputs; sandbox runs tied to their parent by
//! `PR_SET_PDEATHSIG` and living in namespaces that vanish with them).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// The signals a stage cleans up after.
pub const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

type Action = Box<dyn Fn() + Send + Sync>;

struct Registry {
    next: u64,
    actions: BTreeMap<u64, Action>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { next: 0, actions: BTreeMap::new() });
static INSTALL: Once = Once::new();
/// Write end of the self-pipe (-1 until installed).
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// The process that installed the handler: a forked child (between fork and exec) must not
/// report into its parent's pipe.
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps an action registered; dropping it unregisters the action (without running it).
#[must_use = "the action is unregistered when the guard is dropped"]
pub struct Guard(u64);

impl Drop for Guard {
    fn drop(&mut self) {
        registry().actions.remove(&self.0);
    }
}

/// Runs `action` if the process is told to stop (SIGTERM, SIGINT, SIGHUP) while the guard lives.
///
/// Actions run on the cleanup thread while every other registration waits: a thread about to
/// create a new temporary file blocks here instead (register first, then create). They must not
/// register or drop guards themselves.
pub fn on_signal(action: impl Fn() + Send + Sync + 'static) -> Guard {
    install();
    let mut r = registry();
    let id = r.next;
    r.next += 1;
    r.actions.insert(id, Box::new(action));
    Guard(id)
}

/// Resets the three signals to their default action. For a forked child before it executes
/// anything else (async-signal-safe: plain `sigaction` calls).
///
/// # Safety
/// Only meaningful (and only async-signal-safe) right after `fork`.
pub unsafe fn reset_in_child() {
    for sig in SIGNALS {
        libc::signal(sig, libc::SIG_DFL);
    }
}

extern "C" fn on_signal_handler(sig: libc::c_int) {
    // Only write(2) and getpid(2) here: both async-signal-safe.
    // SAFETY: plain syscalls on an fd we own; errno is saved and restored around them.
    unsafe {
        let errno = *libc::__errno_location();
        if libc::getpid() == OWNER_PID.load(Ordering::Relaxed) {
            let byte = sig as u8;
            libc::write(PIPE_WRITE.load(Ordering::Relaxed), (&byte as *const u8).cast(), 1);
        }
        *libc::__errno_location() = errno;
    }
}

fn install() {
    INSTALL.call_once(|| {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 fills the array on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return; // no cleanup on signals; everything else still works
        }
        let (read_end, write_end) = (fds[0], fds[1]);
        PIPE_WRITE.store(write_end, Ordering::Relaxed);
        // SAFETY: getpid always succeeds.
        OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        let spawned = std::thread::Builder::new().name("coa-cleanup".into()).spawn(move || cleanup_thread(read_end));
        if spawned.is_err() {
            return;
        }
        for sig in SIGNALS {
            // SAFETY: sigaction with a handler that only makes async-signal-safe calls.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction == libc::SIG_IGN {
                    continue; // ignored signals (nohup) stay ignored
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
    });
}

fn cleanup_thread(read_end: libc::c_int) {
    let mut byte = 0u8;
    loop {
        // SAFETY: reading one byte into a valid buffer.
        let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            break;
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return; // the pipe is gone: nothing to wait for
    }
    let sig = byte as libc::c_int;
    // Held until the process dies: nothing registers (and so creates) anything new meanwhile.
    let r = registry();
    for action in r.actions.values() {
        action();
    }
    // SAFETY: restoring the default action and re-raising: the process ends as the signal says.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
        // A signal the default action does not end the process with (none of ours): exit anyway.
        std::thread::sleep(std::time::Duration::from_millis(100));
        libc::_exit(128 + sig);
    }
}
