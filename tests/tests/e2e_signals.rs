//! Stages stopped mid-run: SIGTERM or SIGINT while `coa-generate mas` is writing its output
//! (and running code in the sandbox) removes the temporary file and every sandbox run, and the
//! stage still dies of the signal, as a caller expects.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin(name: &str) -> PathBuf {
    // target/<profile>/deps/e2e_signals-<hash> -> target/<profile>
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(bin.exists(), "{} is missing: run `make test` (it builds the stage binaries before the tests)", bin.display());
    bin
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Tasks for a `mas` run long enough to be stopped mid-write (multihop searches, code runs).
fn write_tasks(d: &Path) {
    let gen = Command::new(bin("coa-generate"))
        .args(["tasks", "--suite", "multihop", "--n", "400", "--suite", "code", "--n", "200", "--seed", "1", "--corpus-out", "corpus.parquet", "-o", "tasks.parquet"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(gen.status.success(), "{}", String::from_utf8_lossy(&gen.stderr));
}

/// Starts `coa-generate mas` with SIGTERM at its default and SIGINT as given, and returns once its
/// temporary output exists. A stage keeps an ignored signal ignored (as under `nohup`), and a
/// background job of a non-interactive shell (a CI runner's, say) inherits SIGINT ignored, so
/// the caller's dispositions are set here rather than inherited.
fn start_mas_writing(d: &Path, sigint: libc::sighandler_t) -> Child {
    let mut mas = Command::new(bin("coa-generate"));
    mas.args(["mas", "-i", "tasks.parquet", "--corpus", "corpus.parquet", "-o", "mas_out.parquet"])
        .current_dir(d)
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe `signal(2)` calls between fork and exec.
    unsafe {
        mas.pre_exec(move || {
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            libc::signal(libc::SIGINT, sigint);
            Ok(())
        });
    }
    let mut mas = mas.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !names(d).iter().any(|n| n.starts_with(".mas_out.parquet.")) {
        assert!(Instant::now() < deadline, "no temporary output appeared: {:?}", names(d));
        assert!(mas.try_wait().unwrap().is_none(), "mas finished before it could be stopped; give it more tasks");
        std::thread::sleep(Duration::from_millis(10));
    }
    mas
}

#[test]
fn a_stage_told_to_stop_leaves_no_temporary_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_tasks(d);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut mas = start_mas_writing(d, libc::SIG_DFL);
        // A little longer: batches are being written.
        std::thread::sleep(Duration::from_millis(300));
        unsafe { libc::kill(mas.id() as i32, signal) };
        let status = mas.wait().unwrap();
        assert_eq!(status.signal(), Some(signal), "the stage should die of the signal: {status:?}");
        assert_eq!(names(d), ["corpus.parquet", "tasks.parquet"], "after signal {signal}");
    }
}

#[test]
fn a_signal_ignored_by_the_caller_stays_ignored() {
    // `nohup stage ...` (SIGHUP ignored) and background jobs of scripts (SIGINT ignored) must not
    // be stopped by the signal their caller chose to ignore; SIGTERM still stops them cleanly.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_tasks(d);
    let mut mas = start_mas_writing(d, libc::SIG_IGN);
    unsafe { libc::kill(mas.id() as i32, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(500));
    assert!(mas.try_wait().unwrap().is_none(), "an ignored SIGINT stopped the stage");
    assert!(names(d).iter().any(|n| n.starts_with(".mas_out.parquet.")), "the temporary output went away: {:?}", names(d));
    unsafe { libc::kill(mas.id() as i32, libc::SIGTERM) };
    let status = mas.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert_eq!(names(d), ["corpus.parquet", "tasks.parquet"]);
}
