//! Rewards on real task files from `$COA_EXTERNAL_DATA` (default `../shared/data/external`; read
//! through the importers). Without the files each test prints one `skipped:` line.

use coa_rewards::gold::{bump_first_number, gold_answer};
use coa_rewards::{answer_correct, code_passes, math_equal};
use coa_schemas::rows::{StdioTest, Task};
use coa_tasks::external::file_or_skip;
use coa_tools::SandboxLimits;

#[test]
fn math500_and_aime_golds_match_themselves_and_boxed_copies_but_not_perturbed_ones() {
    let test = "math500_and_aime_golds_match_themselves_and_boxed_copies_but_not_perturbed_ones";
    for (file, count) in [("math500.parquet", 500), ("aime24.parquet", 30)] {
        let Some(path) = file_or_skip(test, file) else { continue };
        let tasks = coa_tasks::import::import_file(&path, None).unwrap();
        assert_eq!(tasks.len(), count, "{file}");
        for task in &tasks {
            assert_eq!(task.suite, "math", "{}", task.task_id);
            let gold = &task.answers[0];
            assert!(math_equal(gold, gold), "{}: {gold:?} vs itself", task.task_id);
            let boxed = format!("The answer is $\\boxed{{{gold}}}$.");
            assert!(math_equal(&boxed, gold), "{}: {boxed:?} vs {gold:?}", task.task_id);
            assert!(answer_correct(task, &boxed).unwrap(), "{}", task.task_id);
            let wrong = bump_first_number(gold);
            assert!(!math_equal(&wrong, gold), "{}: perturbed {wrong:?} equals {gold:?}", task.task_id);
            assert!(!math_equal(&format!("\\boxed{{{wrong}}}"), gold), "{}: boxed perturbed {wrong:?}", task.task_id);
        }
    }
}

fn limits() -> SandboxLimits {
    SandboxLimits { wall: std::time::Duration::from_secs(20), ..SandboxLimits::default() }
}

#[test]
fn humaneval_canonical_solution_passes_and_a_broken_one_fails() {
    let Some(path) = file_or_skip("humaneval_canonical_solution_passes_and_a_broken_one_fails", "HumanEval.jsonl.gz") else { return };
    let tasks = coa_tasks::import::import_file(&path, None).unwrap();
    let task = &tasks[0];
    let solution: serde_json::Value = serde_json::from_str(task.solution.as_deref().unwrap()).unwrap();
    let code = solution["code"].as_str().unwrap();
    let verdict = code_passes(task, code, &limits()).unwrap();
    assert!(verdict.passed, "{verdict:?}");
    assert_eq!((verdict.tests_run, verdict.tests_passed), (1, 1));
    // break it: the same function, answering the opposite
    let broken = format!("{code}\n\n_orig = {ep}\ndef {ep}(*a, **k):\n    return not _orig(*a, **k)\n", ep = task.entry_point.as_deref().unwrap());
    let verdict = code_passes(task, &broken, &limits()).unwrap();
    assert!(!verdict.passed);
    // Decided here, call by call, on the value that came back.
    assert_eq!(verdict.failure.as_deref(), Some("has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) returned False, expected a result == True"), "{verdict:?}");
}

const VERTICAL_WRITING: &str = "n = int(input())
s = [input().strip() for _ in range(n)]
m = max(len(x) for x in s)
for j in range(m):
    row = ''.join(s[n - 1 - i][j] if j < len(s[n - 1 - i]) else '*' for i in range(n))
    print(row.rstrip('*'))
";

#[test]
fn livecodebench_stdio_task_abc366_b() {
    let Some(path) = file_or_skip("livecodebench_stdio_task_abc366_b", "livecodebench_v4.parquet") else { return };
    let tasks = coa_tasks::import::import_file(&path, None).unwrap();
    let task = tasks.iter().find(|t| t.question.contains("Vertical Writing") || t.extra.as_deref().is_some_and(|e| e.contains("abc366_b"))).unwrap();
    assert!(!task.stdio_tests.is_empty());
    let verdict = code_passes(task, VERTICAL_WRITING, &limits()).unwrap();
    assert!(verdict.passed, "{verdict:?}");
    assert_eq!(verdict.tests_passed, task.stdio_tests.len());
    // forgetting to strip the trailing `*` fails on the first test
    let wrong = VERTICAL_WRITING.replace("print(row.rstrip('*'))", "print(row)");
    let verdict = code_passes(task, &wrong, &limits()).unwrap();
    assert!(!verdict.passed);
    assert_eq!(verdict.tests_run, 1);
    assert!(verdict.failure.as_deref().unwrap().contains("wrong output"), "{verdict:?}");
}

/// LeetCode-style LiveCodeBench tasks: a correct method written on the starter code passes (its
/// `List[int]` annotations need the harness's `from typing import *`), and fails without the
/// prelude exactly where the starter code uses a `typing` name.
#[test]
fn livecodebench_function_tasks_run_with_the_harness_prelude() {
    let Some(path) = file_or_skip("livecodebench_function_tasks_run_with_the_harness_prelude", "livecodebench_v4.parquet") else { return };
    let tasks = coa_tasks::import::import_file(&path, None).unwrap();
    let functional: Vec<&Task> = tasks.iter().filter(|t| t.test_code.is_some()).collect();
    assert_eq!(functional.len(), 35);
    let typing_names = ["List[", "Optional[", "Dict[", "Tuple[", "Set["];
    let (mut passed, mut uses_typing, mut fail_without_prelude) = (0, 0, 0);
    for task in &functional {
        let gold = gold_answer(task).unwrap_or_else(|| panic!("{}: no gold program", task.task_id));
        let program = coa_rewards::extract_program(&gold);
        let verdict = code_passes(task, &program, &limits()).unwrap();
        assert!(verdict.passed, "{}: {verdict:?}\n{program}", task.task_id);
        passed += 1;
        let typed = typing_names.iter().any(|n| program.contains(n));
        uses_typing += typed as usize;
        // The same program judged without the prelude (as this checker did before).
        let bare = Task { source: "elsewhere".into(), ..(*task).clone() };
        let verdict = code_passes(&bare, &program, &limits()).unwrap();
        if !verdict.passed {
            fail_without_prelude += 1;
            assert!(verdict.failure.as_deref().unwrap_or("").contains("NameError"), "{}: {verdict:?}", task.task_id);
        }
    }
    assert_eq!(passed, 35);
    assert_eq!(uses_typing, 24, "LiveCodeBench v4: 24 of 35 starters use List[int] and the like");
    assert_eq!(fail_without_prelude, uses_typing);
}

#[test]
fn synthetic_stdio_task_with_both_styles_and_whitespace_rules() {
    let task = Task {
        task_id: "s1".into(),
        suite: "code".into(),
        test_code: Some("assert double(2) == 4\n".into()),
        stdio_tests: vec![
            StdioTest { stdin: "3\n".into(), expected_stdout: "6\n".into() },
            StdioTest { stdin: "5\n".into(), expected_stdout: "10".into() },
        ],
        ..Default::default()
    };
    let good = "def double(x):\n    return 2 * x\n\nif __name__ == '__main__':\n    import sys\n    data = sys.stdin.read().split()\n    if data:\n        print(double(int(data[0])), '  ')\n        print()\n";
    let v = code_passes(&task, good, &limits()).unwrap();
    assert!(v.passed, "{v:?}");
    assert_eq!((v.style, v.tests_total, v.tests_run, v.tests_passed), (coa_rewards::TestStyle::Both, 3, 3, 3));
    let crash = "x = int(input())\nif x == 5:\n    raise ValueError('boom')\nprint(2 * x)\n";
    let v = code_passes(&Task { test_code: None, ..task.clone() }, crash, &limits()).unwrap();
    assert!(!v.passed);
    assert_eq!((v.style, v.tests_run, v.tests_passed), (coa_rewards::TestStyle::Stdio, 2, 1), "{v:?}");
    let failure = v.failure.unwrap();
    assert!(failure.contains("stdio test 1") && failure.contains("[FAILED]") && failure.contains("boom"), "{failure}");
}
