//! Verifiable rewards for every suite (docs/ARCHITECTURE.md, "RL"):
//!
//! - [`qa`]: SQuAD answer normalisation, [`exact_match`] and token [`f1`] against a list of gold
//!   answers, with `|`-separated multi-answer predictions (semantics documented there);
//! - [`math`]: [`math_equal`], equivalence of `\boxed{}` / plain math answers as HF math-verify
//!   (AFM's math reward) decides it: LaTeX normalisation, then numbers, expressions, sets,
//!   intervals, matrices and equations compared by value, without a computer-algebra system;
//! - [`code`]: [`code_passes`], running a program against a task's unit tests (`test_code`) or
//!   its stdin/stdout tests in the `coa-tools` sandbox, the verdict decided outside it;
//! - [`plan`]: assert-style test code turned into (call, expected) pairs.
//!
//! - [`gold`]: gold and perturbed answers of a task, for checking the checkers on real files.
//! - [`shaping`]: the total reward (outcome, format, DAPO overlong shaping), GRPO group
//!   advantages and pass@k; [`OverlongCacheArg`], the `--overlong-cache` flag of the commands
//!   that compute rewards.
//!
//! [`answer_correct`] picks the right check for a text answer by suite; [`check_answer`] also
//! covers code tasks (it runs the tests).

pub mod code;
pub mod gold;
pub mod math;
pub mod plan;
pub mod qa;
pub mod shaping;

use anyhow::{bail, Result};
use coa_schemas::rows::Task;
use coa_schemas::suite::{answer_kind, AnswerKind};
use coa_tools::SandboxLimits;

pub use code::{code_passes, extract_program, CodeVerdict, SandboxVerdict, TestStyle};
pub use math::{boxed_answer, extract_boxed, math_equal, normalize_math};
pub use qa::{comparable_answer, exact_match, f1, normalize_answer, split_answers};
pub use shaping::{group_advantages, overlong_penalty, pass_at_k, total_reward, OverlongCacheArg, RewardConfig};

/// Whether a text `answer` is correct for `task`: exact match (after SQuAD normalisation) for the
/// `multihop` and `qa` suites, [`math_equal`] against any gold for `math`.
///
/// Code tasks have no text answer (their tests decide: see [`code_passes`] or [`check_answer`]),
/// and an unknown suite has no checker: both are errors naming the task, never a silent `false`.
pub fn answer_correct(task: &Task, answer: &str) -> Result<bool> {
    match answer_kind(&task.suite) {
        Some(AnswerKind::Phrase) => Ok(exact_match(answer, &task.answers)),
        Some(AnswerKind::Math) => {
            if task.answers.is_empty() {
                bail!("task {}: math task has no gold answer to compare with", task.task_id);
            }
            Ok(task.answers.iter().any(|g| math_equal(answer, g)))
        }
        Some(AnswerKind::Program) => bail!("task {}: code tasks are checked by running their tests (code_passes), not by a text answer", task.task_id),
        None => bail!("task {}: no answer checker for suite `{}` (expected multihop, qa, math or code)", task.task_id, task.suite),
    }
}

/// [`answer_correct`] for text suites, [`code_passes`] (on the program inside `answer`, see
/// [`extract_program`]) for code. `Err` only when the check itself cannot run (unknown suite,
/// a code task without tests, the sandbox failing).
pub fn check_answer(task: &Task, answer: &str, limits: &SandboxLimits) -> Result<bool> {
    if answer_kind(&task.suite) == Some(AnswerKind::Program) {
        return Ok(code_passes(task, &extract_program(answer), limits)?.passed);
    }
    answer_correct(task, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(suite: &str, answers: &[&str]) -> Task {
        Task {
            task_id: "t".into(),
            suite: suite.into(),
            answers: answers.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn dispatches_by_suite() {
        assert!(answer_correct(&task("multihop", &["Fymdou", "Federation of Fymdou"]), "the Federation of Fymdou").unwrap());
        assert!(!answer_correct(&task("multihop", &["Fymdou"]), "Toultath").unwrap());
        assert!(answer_correct(&task("qa", &["Paris"]), "paris.").unwrap());
        assert!(answer_correct(&task("math", &["1725.41"]), "\\boxed{1725.41}").unwrap());
        assert!(!answer_correct(&task("math", &["1725.41"]), "\\boxed{1725.42}").unwrap());
        let e = answer_correct(&task("code", &[]), "x").unwrap_err().to_string();
        assert!(e.contains("code_passes"), "{e}");
        let e = answer_correct(&task("poetry", &[]), "x").unwrap_err().to_string();
        assert!(e.contains("poetry"), "{e}");
        assert!(answer_correct(&task("math", &[]), "1").is_err());
    }
}
