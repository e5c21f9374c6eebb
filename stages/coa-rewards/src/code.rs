//! Code rewards: run a program against a task's tests in the `coa-tools` sandbox.
//!
//! Two styles, decided by the task:
//! - **function** (`test_code` set: synthetic code suite, HumanEval, LiveCodeBench functional):
//!   the program followed by the test program runs once; exit status 0 is a pass.
//! - **stdio** (`stdio_tests` non-empty: LiveCodeBench AtCoder): the program runs once per test
//!   with its stdin; the test passes when stdout equals the expected stdout after trimming
//!   trailing whitespace on every line and dropping trailing blank lines. Tests run in order and
//!   stop at the first failure (the verdict is already decided), so `tests_run` may be smaller
//!   than `tests_total`.
//!
//! A task with both uses both (function first). A task with neither is an error: a code task
//! without tests would silently score nothing.

use anyhow::{bail, Context, Result};
use coa_schemas::rows::Task;
use coa_tools::{run_python, SandboxLimits};

/// How a code task is tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestStyle {
    Function,
    Stdio,
    Both,
}

/// The outcome of [`code_passes`].
#[derive(Debug, Clone, PartialEq)]
pub struct CodeVerdict {
    pub passed: bool,
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

/// Stdout as compared: trailing whitespace trimmed per line, trailing blank lines dropped.
pub fn normalize_stdout(s: &str) -> String {
    let mut lines: Vec<&str> = s.lines().map(str::trim_end).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines.join("\n")
}

/// The program inside an answer: the first fenced code block (```python, ```py or bare ```)
/// if there is one, else the whole text (trimmed).
pub fn extract_program(answer: &str) -> String {
    if let Some(start) = answer.find("```") {
        let after = &answer[start + 3..];
        let body_start = after.find('\n').map(|i| i + 1).unwrap_or(after.len());
        let lang = after[..body_start].trim();
        if lang.chars().all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-') {
            let body = &after[body_start..];
            let end = body.find("```").unwrap_or(body.len());
            return body[..end].trim_end().to_string() + "\n";
        }
    }
    answer.trim().to_string()
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
    let mut verdict = CodeVerdict { passed: false, style, tests_total, tests_run: 0, tests_passed: 0, failure: None };
    if let Some(test_code) = function {
        let full = format!("{}\n\n{}\n", program.trim_end(), test_code);
        let run = run_python(&full, None, limits).with_context(|| format!("task {}: running the unit tests", task.task_id))?;
        verdict.tests_run += 1;
        if !run.success() {
            verdict.failure = Some(run.render());
            return Ok(verdict);
        }
        verdict.tests_passed += 1;
    }
    for (i, test) in stdio.iter().enumerate() {
        let run = run_python(program, Some(&test.stdin), limits)
            .with_context(|| format!("task {}: running stdio test {i}", task.task_id))?;
        verdict.tests_run += 1;
        if !run.success() {
            verdict.failure = Some(format!("stdio test {i}: {}", run.render()));
            return Ok(verdict);
        }
        let (got, want) = (normalize_stdout(&run.stdout), normalize_stdout(&test.expected_stdout));
        if run.truncated || got != want {
            verdict.failure = Some(format!(
                "stdio test {i}: wrong output{}\n[EXPECTED]\n{want}\n[GOT]\n{got}",
                if run.truncated { " (output truncated)" } else { "" }
            ));
            return Ok(verdict);
        }
        verdict.tests_passed += 1;
    }
    verdict.passed = true;
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_normalisation() {
        assert_eq!(normalize_stdout("a  \nb\t\n\n\n"), "a\nb");
        assert_eq!(normalize_stdout("a\r\nb\r\n"), "a\nb");
        assert_eq!(normalize_stdout(""), "");
    }

    #[test]
    fn program_extraction() {
        assert_eq!(extract_program("<x>```python\ndef f():\n    return 1\n```\n"), "def f():\n    return 1\n");
        assert_eq!(extract_program("```py\nprint(1)\n```"), "print(1)\n");
        assert_eq!(extract_program("```\nprint(2)"), "print(2)\n");
        assert_eq!(extract_program("  print(3)  "), "print(3)");
    }

    #[test]
    fn a_task_without_tests_is_an_error() {
        let task = Task { task_id: "c1".into(), suite: "code".into(), ..Default::default() };
        let e = code_passes(&task, "print(1)", &SandboxLimits::default()).unwrap_err().to_string();
        assert!(e.contains("c1") && e.contains("neither"), "{e}");
    }
}
