//! The code sandbox against real Python, hostile code included. Each test asserts the
//! observation an agent would get and that nothing escaped.
//!
//! Tests take a global lock: all sandboxes run as one user (`nobody` under root), so a fork
//! bomb running concurrently would eat into the other tests' process budget, and on a 2-core
//! machine the timing assertions need the CPU.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use coa_tools::{find_python, run_python, run_python_with, CodeRun, RunStatus, SandboxLimits};

static SERIAL: Mutex<()> = Mutex::new(());

fn limits(wall_secs: u64) -> SandboxLimits {
    SandboxLimits {
        wall: Duration::from_secs(wall_secs),
        cpu_secs: wall_secs + 5,
        ..SandboxLimits::default()
    }
}

fn run(code: &str, stdin: Option<&str>, limits: &SandboxLimits) -> CodeRun {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    run_python(code, stdin, limits).expect("sandbox infrastructure failed")
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Live (non-zombie) processes of group `pgid`, waiting up to 1 s for SIGKILLed ones to die.
/// Zombies are fine: killed orphans are reparented to pid 1, which reaps them in its own time.
fn live_members_of_group(pgid: i32) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let mut live = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // pid (comm) state ppid pgrp ...; comm may contain spaces, so split after ')'.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
                live.push(pid);
            }
        }
        if live.is_empty() || Instant::now() > deadline {
            return live;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn success_with_stdout() {
    let r = run("print(6 * 7)\nprint('é ok')", None, &limits(5));
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert_eq!(r.stdout, "42\né ok\n");
    assert_eq!(
        r.render(),
        "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n42\né ok\n[STDOUT:END]"
    );
    assert!(!r.truncated);
}

#[test]
fn no_output() {
    let r = run("x = 1", None, &limits(5));
    assert_eq!(
        r.render(),
        "[EXECUTED] Code exited with status 0 (no output)."
    );
}

#[test]
fn stdin_is_passed() {
    let r = run(
        "import sys\ndata = sys.stdin.read()\nprint(sum(int(x) for x in data.split()))",
        Some("1 2 3\n4\n"),
        &limits(5),
    );
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert_eq!(r.stdout, "10\n");
    // input() works too, and without stdin the code reads EOF instead of hanging.
    let r = run("print(input()[::-1])", Some("abc\n"), &limits(5));
    assert_eq!(r.stdout, "cba\n");
    let r = run(
        "import sys\nprint(repr(sys.stdin.read()))",
        None,
        &limits(5),
    );
    assert_eq!(r.stdout, "''\n");
}

#[test]
fn large_stdin_does_not_deadlock() {
    // 1 MiB of input against a program that prints as it reads: both pipes fill up unless
    // they are pumped together.
    let input = "x\n".repeat(512 * 1024);
    let r = run(
        "import sys\nn = 0\nfor line in sys.stdin:\n    n += 1\n    print(n)\n",
        Some(&input),
        &SandboxLimits {
            max_output_bytes: 64,
            ..limits(10)
        },
    );
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert!(r.stdout.ends_with("524288\n"), "{}", r.stdout);
}

#[test]
fn nonzero_exit_with_stderr() {
    let r = run(
        "import sys\nsys.stderr.write('boom\\n')\nsys.exit(3)",
        None,
        &limits(5),
    );
    assert_eq!(r.status, RunStatus::Exit(3));
    assert_eq!(
        r.render(),
        "[FAILED] Code exited with status 3.\n[STDERR:BEGIN]\nboom\n[STDERR:END]"
    );
}

#[test]
fn exception_traceback_shows_only_user_code() {
    let r = run(
        "def f(x):\n    return 1 / x\n\nprint('before')\nf(0)\n",
        None,
        &limits(5),
    );
    assert_eq!(r.status, RunStatus::Exit(1));
    assert_eq!(r.stdout, "before\n");
    assert!(
        r.stderr
            .starts_with("Traceback (most recent call last):\n  File \"main.py\", line 5"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("    return 1 / x"),
        "source lines shown: {}",
        r.stderr
    );
    assert!(r
        .stderr
        .trim_end()
        .ends_with("ZeroDivisionError: division by zero"));
    assert!(
        !r.stderr.contains("<string>") && !r.stderr.contains("_coa"),
        "prelude leaked: {}",
        r.stderr
    );
    assert!(r.render().starts_with(
        "[FAILED] Code exited with status 1 with mixed output:\n[STDOUT:BEGIN]\nbefore\n"
    ));
}

#[test]
fn syntax_error() {
    let r = run("print('unclosed'\n", None, &limits(5));
    assert_eq!(r.status, RunStatus::Exit(1));
    assert!(
        r.stderr.contains("File \"main.py\", line 1"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("SyntaxError"), "{}", r.stderr);
    assert!(!r.stderr.contains("Traceback"), "{}", r.stderr);
}

#[test]
fn runs_like_a_script() {
    let r = run(
        "print(sorted(k for k in globals() if not k.startswith('__')))",
        None,
        &limits(5),
    );
    assert_eq!(r.stdout, "[]\n", "no prelude names leak into __main__");
    let r = run(
        "import sys, os\nprint(__name__, sys.argv, os.path.basename(__file__))\n\
         print(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'], sys.path[0] == os.getcwd())",
        None,
        &limits(5),
    );
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert_eq!(r.stdout, "__main__ ['main.py'] main.py\nTrue True\n");
    // Fixed hash seed: set order, hence printed output, is the same every run.
    let a = run(
        "print({'alpha', 'beta', 'gamma', 'delta'})",
        None,
        &limits(5),
    );
    let b = run(
        "print({'alpha', 'beta', 'gamma', 'delta'})",
        None,
        &limits(5),
    );
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn infinite_loop_times_out_and_keeps_output() {
    let r = run(
        "print('started')\nwhile True:\n    pass\n",
        None,
        &limits(1),
    );
    assert_eq!(r.status, RunStatus::Timeout(Duration::from_secs(1)));
    assert!(r.wall >= Duration::from_secs(1));
    assert!(
        r.wall < Duration::from_millis(1500),
        "killed only after {:?}",
        r.wall
    );
    assert_eq!(
        r.render(),
        "[FAILED] Code timed out after 1 s.\n[STDOUT:BEGIN]\nstarted\n[STDOUT:END]"
    );
}

#[test]
fn sleeping_code_times_out() {
    let r = run("import time\ntime.sleep(60)", None, &limits(1));
    assert_eq!(r.status, RunStatus::Timeout(Duration::from_secs(1)));
    assert!(
        r.wall < Duration::from_millis(1500),
        "killed only after {:?}",
        r.wall
    );
}

#[test]
fn cpu_limit_kills_a_busy_loop() {
    let lim = SandboxLimits {
        wall: Duration::from_secs(10),
        cpu_secs: 1,
        ..SandboxLimits::default()
    };
    let r = run("while True:\n    pass\n", None, &lim);
    assert!(
        matches!(
            r.status,
            RunStatus::Signal(libc::SIGXCPU) | RunStatus::Signal(libc::SIGKILL)
        ),
        "{r:?}"
    );
    assert!(r.wall < Duration::from_secs(4), "took {:?}", r.wall);
    assert!(
        r.render().starts_with("[FAILED] Code was killed by signal"),
        "{}",
        r.render()
    );
}

#[test]
fn fork_bomb_is_contained() {
    // Every process forks forever; failures are counted and reported once by the first process.
    let code = r#"
import os, sys
print(os.getpgrp(), flush=True)
root = os.getpid()
failed = 0
while True:
    try:
        os.fork()
    except OSError:
        failed += 1
        if failed == 1 and os.getpid() == root:
            print("fork refused", flush=True)
"#;
    let r = run(
        code,
        None,
        &SandboxLimits {
            max_procs: 32,
            ..limits(2)
        },
    );
    assert_eq!(
        r.status,
        RunStatus::Timeout(Duration::from_secs(2)),
        "{r:?}"
    );
    assert!(r.wall < Duration::from_secs(3), "took {:?}", r.wall);
    let pgid: i32 = r
        .stdout
        .lines()
        .next()
        .and_then(|l| l.parse().ok())
        .expect("pgid printed");
    if is_root() {
        // Under root the code runs as nobody, where RLIMIT_NPROC applies.
        assert!(
            r.stdout.contains("fork refused"),
            "process limit never hit: {r:?}"
        );
    }
    // Nothing of the group survives the run.
    let live = live_members_of_group(pgid);
    assert!(
        live.is_empty(),
        "processes of group {pgid} survived: {live:?}"
    );
    // And the machine is usable right after.
    let r = run("print('still here')", None, &limits(5));
    assert_eq!(r.stdout, "still here\n");
}

#[test]
fn children_do_not_outlive_a_normal_exit() {
    let r = run(
        "import os, subprocess, sys\n\
         p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n\
         print(os.getpgrp(), p.pid)\n",
        None,
        &limits(5),
    );
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert!(
        r.wall < Duration::from_secs(3),
        "waited for the orphan: {:?}",
        r.wall
    );
    let pgid: i32 = r.stdout.split_whitespace().next().unwrap().parse().unwrap();
    let live = live_members_of_group(pgid);
    assert!(live.is_empty(), "background child survived: {live:?}");
}

#[test]
fn processes_that_leave_the_group_are_killed_too() {
    // A daemon-style escape: fork, setsid (new session and group), keep stdout open, sleep.
    let r = run(
        "import os, time\n\
         pid = os.fork()\n\
         if pid == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n\
         print(pid)\n",
        None,
        &limits(5),
    );
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert!(
        r.wall < Duration::from_secs(2),
        "waited for the escapee: {:?}",
        r.wall
    );
    let pid: i32 = r.stdout.trim().parse().unwrap();
    let live = live_members_of_group(pid);
    assert!(live.is_empty(), "escaped process {pid} survived: {live:?}");
}

#[test]
fn memory_hog_fails_clearly() {
    let lim = SandboxLimits {
        mem_bytes: 256 << 20,
        ..limits(10)
    };
    let r = run(
        "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))\n",
        None,
        &lim,
    );
    match r.status {
        RunStatus::Exit(1) => assert!(r.stderr.contains("MemoryError"), "{r:?}"),
        RunStatus::Signal(_) => {}
        other => panic!("unexpected status {other:?}: {r:?}"),
    }
    assert!(r.render().starts_with("[FAILED]"));
    let r = run("x = bytearray(8 << 30)", None, &lim);
    assert_eq!(r.status, RunStatus::Exit(1));
    assert!(r.stderr.trim_end().ends_with("MemoryError"), "{}", r.stderr);
}

#[test]
fn huge_output_is_truncated_head_and_tail() {
    let lim = SandboxLimits {
        max_output_bytes: 1000,
        ..limits(10)
    };
    let r = run("for i in range(300000):\n    print(i)\n", None, &lim);
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    let total: u64 = (0..300000u64).map(|i| i.to_string().len() as u64 + 1).sum();
    assert_eq!(r.stdout_bytes, total);
    assert!(r.truncated);
    assert!(r.stdout.starts_with("0\n1\n2\n"), "{}", &r.stdout[..50]);
    assert!(r.stdout.ends_with("299998\n299999\n"));
    assert!(
        r.stdout
            .contains(&format!("... [{} bytes truncated] ...", total - 1000)),
        "{}",
        r.stdout
    );
    assert!(r.stdout.len() < 1100);
}

#[test]
fn endless_output_is_bounded_and_times_out() {
    let lim = SandboxLimits {
        max_output_bytes: 4096,
        ..limits(1)
    };
    let r = run(
        "import sys\nwhile True:\n    sys.stdout.write('y' * 4096)\n",
        None,
        &lim,
    );
    assert_eq!(r.status, RunStatus::Timeout(Duration::from_secs(1)));
    assert!(
        r.stdout_bytes > 1 << 20,
        "only {} bytes seen",
        r.stdout_bytes
    );
    assert!(r.stdout.len() < 4200);
    assert!(r.truncated);
}

#[test]
fn file_size_limit() {
    let lim = SandboxLimits {
        file_bytes: 1 << 20,
        ..limits(5)
    };
    let r = run(
        "with open('big.bin', 'wb') as f:\n    f.write(b'0' * (4 << 20))\n",
        None,
        &lim,
    );
    assert_eq!(r.status, RunStatus::Exit(1), "{r:?}");
    assert!(r.stderr.contains("File too large"), "{}", r.stderr);
}

#[test]
fn writes_inside_the_sandbox_work() {
    let r = run(
        "import os, tempfile, shutil\n\
         open('a.txt', 'w').write('hi')\n\
         os.mkdir('sub'); os.rename('a.txt', 'sub/b.txt')\n\
         with tempfile.TemporaryDirectory() as t:\n    open(os.path.join(t, 'x'), 'w').write('x')\n\
         fd, p = tempfile.mkstemp(); os.close(fd); os.remove(p)\n\
         shutil.rmtree('sub')\n\
         print(open('main.py').read().count('\\n') > 0, os.listdir('.'))",
        None,
        &limits(5),
    );
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert_eq!(r.stdout, "True ['main.py']\n");
}

#[test]
fn writes_outside_the_sandbox_fail() {
    let pid = std::process::id();
    let in_tmp = PathBuf::from(format!("/tmp/coa-escape-{pid}"));
    let in_crate = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("coa-escape-{pid}"));
    for target in [&in_tmp, &in_crate] {
        let t = target.display();
        let attempts = [
            format!("open('{t}', 'w').write('escaped')"),
            format!("import os\nos.close(os.open('{t}', os.O_CREAT | os.O_WRONLY))"),
            format!("import os\nos.mkdir('{t}')"),
            format!("import os\nos.chdir('/tmp')\nopen('{t}', 'a').write('x')"),
            format!("import os\nos.symlink('{t}', 'link')\nopen('link', 'w').write('x')"),
        ];
        for code in &attempts {
            let r = run(code, None, &limits(5));
            assert_eq!(r.status, RunStatus::Exit(1), "{code}: {r:?}");
            assert!(r.stderr.contains("PermissionError"), "{code}: {}", r.stderr);
            assert!(!target.exists(), "{code}: created {t}");
        }
    }
    // Deleting and renaming outside are refused too.
    let victim = tempfile::NamedTempFile::new().unwrap();
    let v = victim.path().display();
    for code in [
        format!("import os\nos.remove('{v}')"),
        format!("import os\nos.rename('{v}', 'stolen')"),
    ] {
        let r = run(&code, None, &limits(5));
        assert!(r.stderr.contains("PermissionError"), "{code}: {}", r.stderr);
        assert!(victim.path().exists());
    }
}

#[test]
fn privileges_are_dropped_under_root() {
    if !is_root() {
        eprintln!("not root: uid is kept by design; skipping");
        return;
    }
    let r = run(
        "import os\nprint(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n\
         try:\n    open('/etc/coa-escape', 'w')\nexcept PermissionError as e:\n    print('denied')",
        None,
        &limits(5),
    );
    assert_eq!(r.stdout, "65534 65534 65534 []\ndenied\n", "{r:?}");
}

#[test]
fn network_is_cut_where_permitted() {
    if !is_root() {
        eprintln!("not root: CLONE_NEWNET needs CAP_SYS_ADMIN; skipping");
        return;
    }
    let r = run(
        "import socket\nprint([n for _, n in socket.if_nameindex()])\n\
         try:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\nexcept OSError as e:\n    print(type(e).__name__)",
        None,
        &limits(5),
    );
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert!(
        r.stdout.starts_with("['lo']\n"),
        "host interfaces visible: {}",
        r.stdout
    );
}

#[test]
fn sandbox_dirs_are_removed() {
    let r = run(
        "import os\nprint(os.getcwd())\nopen('f', 'w').write('x' * 1000)",
        None,
        &limits(5),
    );
    let dir = PathBuf::from(r.stdout.trim());
    assert!(
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("coa-sandbox-"),
        "{dir:?}"
    );
    assert!(!dir.exists(), "{dir:?} left behind");
}

#[test]
fn missing_interpreter_is_a_clear_error() {
    let err = run_python_with(
        "/nonexistent/python3".as_ref(),
        "print(1)",
        None,
        &limits(5),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("/nonexistent/python3") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn interpreter_is_found() {
    let python = find_python().expect("a python3 on this machine");
    assert!(python.is_absolute(), "{python:?}");
}
