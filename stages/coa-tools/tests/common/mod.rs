//! Helpers shared by the sandbox tests.
//!
//! Tests take a global lock: the timing assertions need the CPU on a 2-core machine, and the
//! checks for surviving processes look at the whole machine, so only one test's runs may exist
//! at a time (a test about concurrent runs starts them itself, under the lock).
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use coa_tools::{run_program, run_python, CodeRun, Ending, Program, SandboxLimits};

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the machine for one test.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// First uid of the per-run range (see `isolation.rs`).
pub const SLOT_BASE: u32 = 1_879_048_192;

pub fn limits(wall_secs: u64) -> SandboxLimits {
    SandboxLimits { wall: Duration::from_secs(wall_secs), cpu_secs: wall_secs + 5, ..SandboxLimits::default() }
}

pub fn run(code: &str, stdin: Option<&str>, limits: &SandboxLimits) -> CodeRun {
    let _guard = serial();
    run_python(code, stdin, limits).expect("sandbox infrastructure failed")
}

/// `program` followed by its unit tests, as the code reward runs them.
pub fn run_tests(program: &str, tests: &str, limits: &SandboxLimits) -> CodeRun {
    let _guard = serial();
    run_program(&Program { code: program, tests: Some(tests), stdin: None, ending: Ending::LastStatement }, limits).expect("sandbox infrastructure failed")
}

pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Live (non-zombie) processes whose command line contains `tag`, after waiting up to 2 s for
/// killed ones to go. Zombies are fine: killed orphans are reaped by their new parent in time.
pub fn survivors(tag: &str) -> Vec<(i32, String)> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut live = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
            if pid == std::process::id() as i32 {
                continue;
            }
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if !cmdline.contains(tag) {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // pid (comm) state ...; comm may contain spaces, so split after ')'.
            let state = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()).unwrap_or("?");
            if state != "Z" && state != "X" {
                live.push((pid, cmdline.chars().take(120).collect()));
            }
        }
        if live.is_empty() || Instant::now() > deadline {
            return live;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sandbox dirs (`coa-sandbox-<pid>-*`) in the host's temp dir of the stage process `pid`
/// (other people's sandboxes may come and go there meanwhile).
pub fn sandbox_dirs(pid: u32) -> BTreeSet<PathBuf> {
    let prefix = format!("coa-sandbox-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// A tag unique to this test process and call, for command lines and file names.
pub fn unique_tag(what: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!("coa-hostile-{what}-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}
