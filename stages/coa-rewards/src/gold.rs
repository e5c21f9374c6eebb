//! Gold and perturbed answers of a task, for checking the checkers on real task files
//! (`make eval-external`: every gold answer must score correct, every perturbed one wrong).
//!
//! - math: the first gold answer, boxed; perturbed: its first number plus one (or `+1` appended
//!   when it has no digit).
//! - qa / multihop: the first gold answer that has anything to compare (NQ has golds that are
//!   only punctuation: such a task has no gold); perturbed: the answer with a word it does not have.
//! - code: the task's own solution (HumanEval's canonical solution, the synthetic suite's
//!   program); for LiveCodeBench, which ships no solutions, a program that answers its public tests
//!   by lookup (stdio: the expected output of each test's input; function: the starter code
//!   returning the asserted value, annotations such as `List[int]` included, so that it needs the
//!   harness's prelude as a real solution does). Perturbed: a program that prints or returns
//!   nothing useful.

use coa_schemas::rows::Task;
use coa_schemas::suite::{answer_kind, AnswerKind};
use serde_json::Value;

/// The gold answer of `task` as a model would write it inside `<answer>`, if the task has one.
pub fn gold_answer(task: &Task) -> Option<String> {
    match answer_kind(&task.suite) {
        Some(AnswerKind::Math) => task.answers.first().map(|g| format!("\\boxed{{{g}}}")),
        Some(AnswerKind::Program) => code_solution(task).map(|p| format!("```python\n{}\n```", p.trim_end())),
        // (a gold that is only punctuation, like NQ's `)`, can never be matched: not a gold)
        _ => task.answers.iter().find(|a| !crate::qa::comparable_answer(a).is_empty()).cloned(),
    }
}

/// A wrong answer close to the gold (module docs).
pub fn perturbed_answer(task: &Task) -> String {
    match answer_kind(&task.suite) {
        Some(AnswerKind::Math) => format!("\\boxed{{{}}}", bump_first_number(task.answers.first().map_or("", String::as_str))),
        Some(AnswerKind::Program) => match &task.entry_point {
            Some(f) => format!("```python\ndef {f}(*args, **kwargs):\n    return None\n```"),
            None if task.stdio_tests.is_empty() => "```python\nclass Solution:\n    def __getattr__(self, name):\n        return lambda *a, **k: None\n```".into(),
            None => "```python\nprint('no answer')\n```".into(),
        },
        _ => format!("{} zyxwvut", task.answers.first().map_or("", String::as_str)),
    }
}

/// `gold` with its first number increased by one (`025` → `026`), or `+1` appended when it has no
/// digit.
pub fn bump_first_number(gold: &str) -> String {
    let bytes = gold.as_bytes();
    let Some(start) = bytes.iter().position(u8::is_ascii_digit) else { return format!("{gold}+1") };
    let end = bytes[start..].iter().position(|b| !b.is_ascii_digit()).map_or(bytes.len(), |e| start + e);
    let mut digits: Vec<u8> = gold[start..end].bytes().collect();
    let mut i = digits.len();
    loop {
        if i == 0 {
            digits.insert(0, b'1');
            break;
        }
        i -= 1;
        if digits[i] == b'9' {
            digits[i] = b'0';
        } else {
            digits[i] += 1;
            break;
        }
    }
    format!("{}{}{}", &gold[..start], String::from_utf8(digits).expect("ASCII digits"), &gold[end..])
}

/// A program that passes the task's public tests (module docs).
fn code_solution(task: &Task) -> Option<String> {
    if let Some(code) = task.solution.as_deref().and_then(|s| serde_json::from_str::<Value>(s).ok()).and_then(|v| v["code"].as_str().map(str::to_string)) {
        return Some(code);
    }
    if !task.stdio_tests.is_empty() {
        let table: Vec<String> = task
            .stdio_tests
            .iter()
            .map(|t| format!("    {}: {},", Value::String(t.stdin.clone()), Value::String(t.expected_stdout.clone())))
            .collect();
        return Some(format!("import sys\nexpected = {{\n{}\n}}\nsys.stdout.write(expected[sys.stdin.read()])\n", table.join("\n")));
    }
    // A LiveCodeBench function task: `result = Solution().f(…)` then `assert result == value, …`.
    let test = task.test_code.as_deref()?;
    let asserted = test.lines().find_map(|l| l.trim().strip_prefix("assert result == "))?;
    let value = asserted.rsplit_once(", f\"Expected").map_or(asserted, |(v, _)| v).trim();
    let extra: Value = serde_json::from_str(task.extra.as_deref()?).ok()?;
    let starter = extra["starter_code"].as_str().filter(|s| !s.trim().is_empty())?;
    let def = starter.lines().rev().find(|l| l.trim_start().starts_with("def "))?;
    let indent = &def[..def.len() - def.trim_start().len()];
    Some(format!("{}\n{indent}    return {value}\n", starter.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_bumped() {
        assert_eq!(bump_first_number("025"), "026");
        assert_eq!(bump_first_number("\\frac{9}{19}"), "\\frac{10}{19}");
        assert_eq!(bump_first_number("\\text{Evelyn}"), "\\text{Evelyn}+1");
    }

    #[test]
    fn livecodebench_function_gold_returns_the_asserted_value() {
        let task = Task {
            suite: "code".into(),
            test_code: Some("\nresult = Solution().f([1, 2], 3)\nassert result == 'ab', f\"Expected 'ab', but got {repr(result)}\"\n".into()),
            extra: Some(r#"{"starter_code": "class Solution:\n    def f(self, a: List[int], k: int) -> str:\n        "}"#.into()),
            ..Default::default()
        };
        let gold = gold_answer(&task).unwrap();
        assert!(gold.contains("    def f(self, a: List[int], k: int) -> str:\n        return 'ab'\n"), "{gold}");
    }
}
