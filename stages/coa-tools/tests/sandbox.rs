//! The code sandbox against real Python: what an agent's ordinary program sees (output,
//! errors, stdin, limits, the script environment) and how unit tests are run after a program.
//! Hostile code is in `hostile.rs`.

mod common;



use common::{limits, run, run_tests, serial};
use coa_tools::{find_python, run_python_with, RunStatus, SandboxLimits};

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
    // The source lines come from main.py on disk, found through sys.path[0] after a chdir too.
    let r = run("import os\nos.chdir('/')\nhalf = 1 / 0\n", None, &limits(5));
    assert!(r.stderr.contains("line 3, in <module>\n    half = 1 / 0"), "{}", r.stderr);
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
fn missing_interpreter_is_a_clear_error() {
    let _guard = serial();
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

#[test]
fn unit_tests_run_after_the_program_in_its_namespace() {
    let program = "def add(a, b):\n    return a + b\n\nprint('program ran')\n";
    let r = run_tests(program, "assert add(2, 3) == 5\nprint('tests ran', __name__)\n", &limits(5));
    assert_eq!(r.status, RunStatus::Exit(0), "{r:?}");
    assert!(r.finished && r.passed(), "{r:?}");
    assert_eq!(r.stdout, "program ran\ntests ran __main__\n", "the harness's token line is not in the output");
    // A failing assertion: the traceback names the tests' line; no pass.
    let r = run_tests(program, "\nassert add(2, 2) == 5, 'add is wrong'\n", &limits(5));
    assert_eq!(r.status, RunStatus::Exit(1), "{r:?}");
    assert!(!r.finished && !r.passed());
    assert!(r.stderr.contains("File \"tests.py\", line 2") && r.stderr.contains("AssertionError: add is wrong"), "{}", r.stderr);
    // The tests are not a file the program could read.
    let r = run_tests("import os\nprint(sorted(os.listdir('.')))\n", "pass\n", &limits(5));
    assert_eq!(r.stdout, "['main.py']\n", "{r:?}");
}

#[test]
fn a_program_cannot_swallow_its_tests() {
    // An unclosed string or a trailing backslash would turn appended tests into text; compiled
    // on their own, the program fails to compile instead.
    for program in ["def f():\n    return 1\nx = \"\"\"\n", "def f():\n    return 1\nx = 1 + \\\n"] {
        let r = run_tests(program, "assert f() == 2\n", &limits(5));
        assert!(!r.passed() && !r.finished, "{program:?}: {r:?}");
        assert!(r.stderr.contains("SyntaxError"), "{}", r.stderr);
    }
}

#[test]
fn a_clean_exit_ends_a_stdin_program() {
    // Programs read stdin and may stop early with sys.exit() (0 or none): that is their end.
    for code in ["import sys\nprint(input())\nsys.exit()", "print(input())\nexit(0)", "print(input())"] {
        let r = run(code, Some("hello\n"), &limits(5));
        assert!(r.passed(), "{code}: {r:?}");
        assert_eq!(r.stdout, "hello\n");
    }
    for code in ["print(input())\nimport os\nos._exit(0)", "import sys\nprint(input())\nsys.exit(3)"] {
        let r = run(code, Some("hello\n"), &limits(5));
        assert!(!r.finished && !r.passed(), "{code}: {r:?}");
        assert_eq!(r.stdout, "hello\n");
    }
}

// ---------------------------------------------------------------------------------------------
// The driver: a program's functions called from outside, plain values back

fn calls(code: &str, requests: &[&str]) -> (coa_tools::CodeRun, Vec<coa_tools::Answer>) {
    let _guard = serial();
    let requests: Vec<String> = requests.iter().map(|r| r.to_string()).collect();
    coa_tools::run_calls(code, &requests, &limits(10)).expect("sandbox infrastructure failed")
}

fn value(json: &str) -> coa_tools::PyValue {
    coa_tools::PyValue::from_json(&serde_json::from_str(json).unwrap()).unwrap()
}

#[test]
fn the_driver_calls_functions_and_methods_and_returns_plain_values() {
    use coa_tools::Answer;
    let code = "def add(a, b=0):\n    return a + b\n\
                def boom():\n    raise ValueError('no')\n\
                def odd():\n    class A:\n        def __eq__(self, o):\n            return True\n    return A()\n\
                def mixed():\n    return {'k': (1, 2.5, None, b'x', {3}), 2: [True, 'é']}\n\
                class Solution:\n    def twice(self, xs):\n        return [2 * x for x in xs]\n\
                print('module ran')\n";
    let (run, answers) = calls(code, &[
        "(['add'], (2, 40), {})",
        "(['add'], ('a',), {'b': 'b'})",
        "(['boom'], (), {})",
        "(['odd'], (), {})",
        "(['mixed'], (), {})",
        "(['Solution', 'twice'], ([1, 0.5],), {})",
        "(['missing'], (), {})",
    ]);
    assert_eq!(run.status, RunStatus::Exit(0), "{run:?}");
    assert_eq!(run.stdout, "module ran\n");
    assert_eq!(answers.len(), 7, "{answers:?}");
    assert!(matches!(&answers[0], Answer::Value(v) if v.py_eq(&value(r#"{"i": "42"}"#))), "{answers:?}");
    assert!(matches!(&answers[1], Answer::Value(v) if v.py_eq(&value(r#"{"u": "6162"}"#))), "{answers:?}");
    assert!(matches!(&answers[2], Answer::Raised(e) if e == "ValueError: no"), "{answers:?}");
    assert!(matches!(&answers[3], Answer::Raised(e) if e.starts_with("TypeError: not a plain value: A")), "an object with its own __eq__ does not cross: {answers:?}");
    let want = value(r#"{"d": [[{"i": "2"}, {"l": [true, {"u": "c3a9"}]}], [{"u": "6b"}, {"t": [{"i": "1"}, {"f": "2.5"}, null, {"b": "78"}, {"s": [{"i": "3"}]}]}]]}"#);
    assert!(matches!(&answers[4], Answer::Value(v) if v.py_eq(&want)), "{answers:?}");
    assert!(matches!(&answers[5], Answer::Value(v) if v.py_eq(&value(r#"{"l": [{"i": "2"}, {"f": "1.0"}]}"#))), "{answers:?}");
    assert!(matches!(&answers[6], Answer::Raised(e) if e.starts_with("KeyError")), "{answers:?}");
}

#[test]
fn the_driver_answers_nothing_after_an_exit_and_garbage_is_no_answer() {
    let (run, answers) = calls("import sys\nsys.exit(0)\ndef f():\n    return 1\n", &["(['f'], (), {})"]);
    assert!(answers.is_empty() && run.status == RunStatus::Exit(0), "{run:?} {answers:?}");
    // A program that writes its own "answers" to every descriptor it can find gets them read as
    // what they are: values it chose (or garbage), never a verdict.
    let forge = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"v\": true}\\nnot json\\n')\n    except OSError:\n        pass\ndef f():\n    return 1\n";
    let (_, answers) = calls(forge, &["(['f'], (), {})", "(['f'], (), {})"]);
    assert!(matches!(&answers[..], [coa_tools::Answer::Value(v), coa_tools::Answer::Garbled(_)] if v.py_eq(&value("true"))), "{answers:?}");
}

#[test]
fn a_checker_runs_the_tests_in_its_own_process() {
    let _guard = serial();
    let code = "def add(a, b):\n    return a + b\ndef helper(x):\n    return -x\n";
    let tests = "import random\ndef check(candidate):\n    for _ in range(50):\n        a, b = random.randint(-9, 9), random.randint(-9, 9)\n        assert candidate(a, b) == a + b\n    assert helper(3) == -3\n    try:\n        candidate('a', 1)\n        raise AssertionError('no TypeError')\n    except TypeError:\n        pass\n\ncheck(add)\n";
    let remote = vec!["add".to_string(), "helper".to_string()];
    let (checker, candidate) = coa_tools::run_checked(code, "", &remote, tests, &limits(10)).unwrap();
    assert!(checker.passed(), "{checker:?}\n{candidate:?}");
    assert_eq!(candidate.status, RunStatus::Exit(0), "the candidate's driver ends when the checker does: {candidate:?}");
    let wrong = "def add(a, b):\n    return a - b\ndef helper(x):\n    return -x\n";
    let (checker, _) = coa_tools::run_checked(wrong, "", &remote, tests, &limits(10)).unwrap();
    assert!(!checker.passed() && checker.stderr.contains("AssertionError"), "{checker:?}");
    // The candidate dies mid-test: the checker fails at once (not at its timeout).
    let dies = "def add(a, b):\n    import os\n    os._exit(0)\ndef helper(x):\n    return -x\n";
    let (checker, _) = coa_tools::run_checked(dies, "", &remote, tests, &limits(10)).unwrap();
    assert!(!checker.passed() && checker.stderr.contains("the program under test is gone"), "{checker:?}");
    assert!(checker.wall < std::time::Duration::from_secs(5), "{checker:?}");
}
