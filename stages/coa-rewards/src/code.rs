//! Code rewards: run a program against a task's tests in the `coa-tools` sandbox.
//!
//! Two styles, decided by the task. In both the verdict is decided outside the program's
//! process: only plain values (or its stdout) leave it, and no expected value or test source
//! enters it.
//! - **function** (`test_code` set: synthetic code suite, HumanEval, LiveCodeBench functional),
//!   graded one of two ways ([`crate::plan`]):
//!   - *calls*: test code made only of assertions on calls with literal arguments and results
//!     (`assert candidate(ARGS) == V`, `result = Solution().m(ARGS)` then `assert result == V`,
//!     `abs(... - V) < tol`, `math.isclose`, truthiness, `is None`) is planned into calls: the
//!     sandbox's driver runs the program, calls its function with each ARGS and writes the plain
//!     values returned, which are checked here with Python's `==` ([`coa_tools::PyValue`]). A
//!     pass is every call answered and passing, and the run ending with status 0.
//!   - *checker*: other test code (loops, random inputs, the prompt's helpers) runs whole in a
//!     second sandboxed process, which calls the program's functions through the driver and gets
//!     plain values back ([`coa_tools::run_checked`]); a pass is the checker's tests running to
//!     their end (its status 0 and its harness's token).
//!
//!   Either way a returned object's `__eq__`, patched builtins, `unittest` or `sys.modules`,
//!   the caller's frame and audit hooks are the program's own process, where nothing is
//!   decided; a program that exits before being called answers nothing and fails.
//! - **stdio** (`stdio_tests` non-empty: LiveCodeBench AtCoder): the program runs once per test
//!   with its stdin; the test passes when the program ended cleanly (its last statement, or
//!   `sys.exit()` with status 0, proven by the harness's per-run token, see
//!   [`coa_tools::CodeRun::finished`]) and its output, compared here, is what LiveCodeBench's
//!   judge accepts ([`stdout_matches`]): both sides stripped, the same number of lines, each pair
//!   of lines equal once stripped, or equal token by token as decimal numbers (`1.50` = `1.5`,
//!   `1e3` = `1000`). Tests run in order and stop at the first failure (the verdict is already
//!   decided), so `tests_run` may be smaller than `tests_total`.
//!
//! Each check also gives the sandbox's [`SandboxVerdict`] (passed, failed, timed out, killed,
//! output limit), which `coa-score` records per rollout.
//!
//! A task from LiveCodeBench (`source` naming it) runs with the harness's prelude first
//! ([`LIVECODEBENCH_PRELUDE`]: `from typing import *`, `from sys import *` and the other
//! standard-library imports of LiveCodeBench's harness), as LiveCodeBench does: its starter code
//! annotates with `List[int]` without importing it. The program graded is an answer's last fenced
//! block ([`extract_program`]), as LiveCodeBench takes it.
//!
//! A task with both uses both (function first). A task with neither is an error: a code task
//! without tests would silently score nothing. The tests are the public ones a task file carries;
//! LiveCodeBench judges on more hidden tests, so pass rates here are upper bounds.

use anyhow::{bail, Context, Result};
use coa_schemas::rows::Task;
use coa_tools::{run_calls, run_checked, run_program, Answer, CodeRun, Ending, Program, RunStatus, SandboxLimits};

use crate::plan::{plan, Plan, PlannedCall};

/// How a code task is tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestStyle {
    Function,
    Stdio,
    Both,
}

/// How the sandbox judged a program against its tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxVerdict {
    /// Every test run exited 0 after reaching its end, with the expected output.
    Passed,
    /// A test failed: an assertion or exception, a non-zero exit, wrong output, or an exit
    /// before the tests finished.
    Failed,
    /// A run hit its wall-clock limit.
    TimedOut,
    /// A run was killed by a signal (CPU limit, memory, a crash).
    Killed,
    /// A run wrote more output than the sandbox keeps or allows.
    OutputLimit,
}

impl SandboxVerdict {
    /// The name written into the `scores` table.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxVerdict::Passed => "passed",
            SandboxVerdict::Failed => "failed",
            SandboxVerdict::TimedOut => "timed_out",
            SandboxVerdict::Killed => "killed",
            SandboxVerdict::OutputLimit => "output_limit",
        }
    }

    /// The verdict on one finished run, before any output comparison.
    fn of(run: &CodeRun) -> SandboxVerdict {
        match run.status {
            RunStatus::Timeout(_) => SandboxVerdict::TimedOut,
            RunStatus::OutputLimit(_) => SandboxVerdict::OutputLimit,
            RunStatus::Signal(_) | RunStatus::TreeLimit(_) => SandboxVerdict::Killed,
            RunStatus::Exit(_) if run.passed() => SandboxVerdict::Passed,
            RunStatus::Exit(_) => SandboxVerdict::Failed,
        }
    }
}

/// What went wrong in a run that did not pass, for the verdict's `failure` text.
fn describe_failure(run: &CodeRun) -> String {
    if run.success() && !run.finished {
        format!("exited with status 0 before reaching its end (its tests did not finish)\n{}", run.render())
    } else {
        run.render()
    }
}

/// The outcome of [`code_passes`].
#[derive(Debug, Clone, PartialEq)]
pub struct CodeVerdict {
    pub passed: bool,
    /// The sandbox's verdict (of the first failing run, or `Passed`).
    pub sandbox: SandboxVerdict,
    pub style: TestStyle,
    /// Test runs available: 1 for the function-style program, plus one per stdio test.
    pub tests_total: usize,
    /// Test runs executed (stops at the first failure).
    pub tests_run: usize,
    /// Test runs that passed.
    pub tests_passed: usize,
    /// What went wrong first: the sandbox observation of a failing run, or a stdout mismatch.
    pub failure: Option<String>,
}

/// What LiveCodeBench's harness runs before a program (its `import_string`, which AFM's scorer
/// uses too): the standard-library modules contest code uses, star-imported (`from sys import *`
/// included: a bare `setrecursionlimit(10**6)` works) and by name, `builtins` star-imported after
/// them so that `math`'s `pow` and `sys`'s `exit` do not shadow the builtins, `typing` last (starter
/// code says `List[int]`), and a deep recursion limit.
pub const LIVECODEBENCH_PRELUDE: &str = "\
from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
import builtins, string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, functools, operator, io, sys, json
sys.setrecursionlimit(50000)
";

/// The prelude a task's programs run with (LiveCodeBench's, for its tasks; none otherwise).
fn prelude(task: &Task) -> &'static str {
    if task.source.to_ascii_lowercase().contains("livecodebench") {
        LIVECODEBENCH_PRELUDE
    } else {
        ""
    }
}

/// Stdout lines as LiveCodeBench compares them: the whole output stripped, split into lines,
/// each line stripped.
fn stripped_lines(s: &str) -> Vec<&str> {
    s.trim().split('\n').map(str::trim).collect()
}

/// Stdout as shown in a failure message: [`stripped_lines`] joined.
pub fn normalize_stdout(s: &str) -> String {
    stripped_lines(s).join("\n")
}

/// A decimal number as Python's `Decimal` reads one, reduced to (negative, significant digits,
/// exponent) so that equal values compare equal; `None` when the token is no number. Infinities
/// are `("inf", 0)`; NaN is never equal to anything and reads as `None`.
fn decimal(token: &str) -> Option<(bool, String, i64)> {
    let (neg, body) = match token.as_bytes().first() {
        Some(b'-') => (true, &token[1..]),
        Some(b'+') => (false, &token[1..]),
        _ => (false, token),
    };
    let lower = body.to_ascii_lowercase();
    if lower == "inf" || lower == "infinity" {
        return Some((neg, "inf".into(), 0));
    }
    let (mantissa, exp) = match lower.split_once('e') {
        Some((m, e)) => (m, e.parse::<i64>().ok()?),
        None => (lower.as_str(), 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mut exp = exp - frac.len() as i64;
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some((false, String::new(), 0)); // zero, whatever its sign and exponent
    }
    let trimmed = digits.trim_end_matches('0');
    exp += (digits.len() - trimmed.len()) as i64;
    Some((neg, trimmed.to_string(), exp))
}

/// Whether a program's stdout matches the expected stdout, as LiveCodeBench's judge decides
/// (module docs).
pub fn stdout_matches(got: &str, want: &str) -> bool {
    let (got, want) = (stripped_lines(got), stripped_lines(want));
    if got.len() != want.len() {
        return false;
    }
    got.iter().zip(&want).all(|(g, w)| {
        if g == w {
            return true;
        }
        let (gt, wt): (Vec<&str>, Vec<&str>) = (g.split_whitespace().collect(), w.split_whitespace().collect());
        let as_decimals = |t: &[&str]| t.iter().map(|x| decimal(x)).collect::<Option<Vec<_>>>();
        matches!((as_decimals(&gt), as_decimals(&wt)), (Some(a), Some(b)) if a == b)
    })
}

/// The program inside an answer: the last fenced code block (```python, ```py or bare ```; an
/// unclosed last fence runs to the end), as LiveCodeBench and AFM's code reward take it (a model
/// shows a draft or an example before its final program), else the whole text (trimmed).
pub fn extract_program(answer: &str) -> String {
    let mut last = None;
    let mut from = 0;
    while let Some(off) = answer[from..].find("```") {
        let after = &answer[from + off + 3..];
        let body_start = after.find('\n').map(|i| i + 1).unwrap_or(after.len());
        let lang = after[..body_start].trim();
        if !lang.chars().all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-') {
            from += off + 3; // a fence with text after it on its line opens no block
            continue;
        }
        let body = &after[body_start..];
        let end = body.find("```");
        let code = body[..end.unwrap_or(body.len())].trim_end();
        if !code.trim().is_empty() {
            last = Some(code.to_string() + "\n"); // an empty block is no program
        }
        match end {
            Some(end) => from = answer.len() - body.len() + end + 3,
            None => break,
        }
    }
    last.unwrap_or_else(|| answer.trim().to_string())
}

/// Runs `program` against `task`'s tests (see the module docs). `Err` when the task has no tests
/// or the sandbox itself fails; everything the program does is a verdict.
pub fn code_passes(task: &Task, program: &str, limits: &SandboxLimits) -> Result<CodeVerdict> {
    let function = task.test_code.as_deref().filter(|t| !t.trim().is_empty());
    let stdio = &task.stdio_tests;
    let style = match (function.is_some(), !stdio.is_empty()) {
        (true, true) => TestStyle::Both,
        (true, false) => TestStyle::Function,
        (false, true) => TestStyle::Stdio,
        (false, false) => bail!("task {}: code task has neither `test_code` nor `stdio_tests`; nothing to check the program with", task.task_id),
    };
    let tests_total = usize::from(function.is_some()) + stdio.len();
    let mut verdict = CodeVerdict { passed: false, sandbox: SandboxVerdict::Failed, style, tests_total, tests_run: 0, tests_passed: 0, failure: None };
    let program = format!("{}{program}", prelude(task));
    if let Some(test_code) = function {
        let plan = plan(test_code).with_context(|| format!("task {}: planning its unit tests", task.task_id))?;
        let failed = match &*plan {
            Plan::Calls(calls) => check_calls(&program, calls, limits),
            Plan::Checker { remote, .. } => check_in_checker(&program, prelude(task), remote, test_code, limits),
        }
        .with_context(|| format!("task {}: running the unit tests", task.task_id))?;
        verdict.tests_run += 1;
        if let Some((sandbox, failure)) = failed {
            verdict.sandbox = sandbox;
            verdict.failure = Some(failure);
            return Ok(verdict);
        }
        verdict.tests_passed += 1;
    }
    for (i, test) in stdio.iter().enumerate() {
        // Keep enough output to compare: twice the expected output plus slack.
        let limits = SandboxLimits { max_output_bytes: limits.max_output_bytes.max(2 * test.expected_stdout.len() + 4096), ..*limits };
        let run = run_program(&Program { code: &program, tests: None, stdin: Some(&test.stdin), ending: Ending::CleanExit }, &limits)
            .with_context(|| format!("task {}: running stdio test {i}", task.task_id))?;
        verdict.tests_run += 1;
        if !run.passed() {
            verdict.sandbox = SandboxVerdict::of(&run);
            verdict.failure = Some(format!("stdio test {i}: {}", describe_failure(&run)));
            return Ok(verdict);
        }
        let (got, want) = (normalize_stdout(&run.stdout), normalize_stdout(&test.expected_stdout));
        if run.truncated {
            verdict.sandbox = SandboxVerdict::OutputLimit;
            verdict.failure = Some(format!("stdio test {i}: wrong output (more than the {} bytes kept)\n[EXPECTED]\n{want}\n[GOT]\n{got}", limits.max_output_bytes));
            return Ok(verdict);
        }
        if !stdout_matches(&run.stdout, &test.expected_stdout) {
            verdict.failure = Some(format!("stdio test {i}: wrong output\n[EXPECTED]\n{want}\n[GOT]\n{got}"));
            return Ok(verdict);
        }
        verdict.tests_passed += 1;
    }
    verdict.sandbox = SandboxVerdict::Passed;
    verdict.passed = true;
    Ok(verdict)
}

/// A failed function-style test: the sandbox's verdict and what went wrong.
type Failed = Option<(SandboxVerdict, String)>;

/// [`Plan::Calls`]: the driver calls the program, its answers are checked here. A pass needs
/// every call answered with a value that passes its checks, and the run to end with status 0.
fn check_calls(program: &str, calls: &[PlannedCall], limits: &SandboxLimits) -> Result<Failed> {
    let requests: Vec<String> = calls.iter().map(|c| c.request.clone()).collect();
    let (run, answers) = run_calls(program, &requests, limits)?;
    for (i, call) in calls.iter().enumerate() {
        let wrong = match answers.get(i) {
            None => format!("no answer to {} (the program ended or was stopped before it)\n{}", call.shown, run.render()),
            Some(Answer::Raised(e)) => format!("{} raised {e}\n{}", call.shown, run.render()),
            Some(Answer::Garbled(e)) => format!("{}: the answer is no plain value ({e})", call.shown),
            Some(Answer::Value(v)) => match call.checks.iter().find(|c| !c.holds(v)) {
                Some(c) => format!("{} returned {}, expected a result {}", call.shown, v.repr(200), c.describe()),
                None => continue,
            },
        };
        let sandbox = if run.success() { SandboxVerdict::Failed } else { SandboxVerdict::of(&run) };
        return Ok(Some((sandbox, wrong)));
    }
    Ok((!run.success()).then(|| (SandboxVerdict::of(&run), describe_failure(&run))))
}

/// [`Plan::Checker`]: the test code runs in a checker process that calls the program through
/// the driver; it passes when the checker's tests ran to their end.
fn check_in_checker(program: &str, prelude: &str, remote: &[String], tests: &str, limits: &SandboxLimits) -> Result<Failed> {
    let (checker, candidate) = run_checked(program, prelude, remote, tests, limits)?;
    if checker.passed() {
        return Ok(None);
    }
    // The program's own end (a timeout, a crash) explains a checker that lost it.
    let sandbox = match candidate.status {
        RunStatus::Exit(_) => SandboxVerdict::of(&checker),
        _ => SandboxVerdict::of(&candidate),
    };
    Ok(Some((sandbox, format!("{}\nthe program: {}", describe_failure(&checker), candidate.render()))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_is_compared_as_livecodebench_does() {
        assert_eq!(normalize_stdout("a  \nb\t\n\n\n"), "a\nb");
        assert_eq!(normalize_stdout("a\r\nb\r\n"), "a\nb");
        assert_eq!(normalize_stdout(""), "");
        assert!(stdout_matches("  26 \n", "26\n"));
        assert!(stdout_matches("1 2\n  3\n\n", "1 2\n3"));
        assert!(stdout_matches("0.50 1e3\n", "0.5 1000\n"), "numbers compare as decimals");
        assert!(stdout_matches("-0\n", "0\n"));
        assert!(stdout_matches("1  2\n", "1 2\n"), "tokens, not spacing");
        assert!(!stdout_matches("1 2\n", "1 3\n"));
        assert!(!stdout_matches("1\n2\n", "1 2\n"), "line counts must agree");
        assert!(!stdout_matches("0.333\n", "0.3333\n"), "decimals are exact, no tolerance");
        assert!(!stdout_matches("Yes\n", "yes\n"));
        assert!(!stdout_matches("nan\n", "nan1\n"));
        assert_eq!(decimal("1.500e2"), decimal("150"));
        assert_eq!(decimal("abc"), None);
    }

    #[test]
    fn program_extraction() {
        assert_eq!(extract_program("<x>```python\ndef f():\n    return 1\n```\n"), "def f():\n    return 1\n");
        assert_eq!(extract_program("```py\nprint(1)\n```"), "print(1)\n");
        assert_eq!(extract_program("```\nprint(2)"), "print(2)\n");
        assert_eq!(extract_program("  print(3)  "), "print(3)");
        // the last block, as LiveCodeBench grades
        assert_eq!(extract_program("A draft:\n```python\nprint(1)\n```\nFixed:\n```python\nprint(2)\n```\nDone."), "print(2)\n");
        assert_eq!(extract_program("```py\nprint(1)\n```\n```\nprint(2)"), "print(2)\n", "an unclosed last block runs to the end");
        assert_eq!(extract_program("```py\nprint(1)\n``` and ```inline``` text"), "print(1)\n", "a fence with text on its line opens no block");
    }

    /// LiveCodeBench's prelude, run for real: `from sys import *` (a bare `setrecursionlimit`),
    /// `typing` names, and the builtins `math`/`sys` star-imports would shadow (`pow` of three
    /// arguments) left intact.
    #[test]
    fn livecodebench_prelude_has_the_harness_names() {
        let task = Task {
            task_id: "lcb".into(),
            suite: "code".into(),
            source: "skywork_livecodebench_v4".into(),
            stdio_tests: vec![coa_schemas::rows::StdioTest { stdin: "3\n".into(), expected_stdout: "6\n".into() }],
            ..Default::default()
        };
        let program = "setrecursionlimit(10**5)\nx: List[int] = [int(input())]\nprint(sum(accumulate(x)) * 2, file=stdout)\nassert pow(3, 4, 5) == 1 and exit is builtins.exit\n";
        let v = code_passes(&task, program, &SandboxLimits::default()).unwrap();
        assert!(v.passed, "{v:?}");
        // elsewhere no prelude: the bare name fails
        let v = code_passes(&Task { source: "synthetic".into(), ..task }, program, &SandboxLimits::default()).unwrap();
        assert!(!v.passed && v.failure.as_deref().unwrap_or("").contains("NameError"), "{v:?}");
    }

    #[test]
    fn a_task_without_tests_is_an_error() {
        let task = Task { task_id: "c1".into(), suite: "code".into(), ..Default::default() };
        let e = code_passes(&task, "print(1)", &SandboxLimits::default()).unwrap_err().to_string();
        assert!(e.contains("c1") && e.contains("neither"), "{e}");
    }
}
