//! `coa-score`: rollouts → scores. Each rollout's final answer is checked against its task (EM/F1
//! for QA, math equivalence, unit tests in the sandbox for code), its text against the CoA grammar,
//! its length against the overlong band; the reward combines them ([`coa_rewards::shaping`]) and
//! each task's group of G samples gets GRPO advantages. [`report`] summarises a scores table per
//! suite and model; [`run`] is the stage (flags and body) the `coa-score` binary calls.

pub mod report;
pub mod run;

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{ArrayRef, BooleanArray, Float32Array, RecordBatch, StringArray};
use coa_format::{find_last_block, steps_from_text, validate, Flavor, Tag};
use coa_rewards::{boxed_answer, check_answer, code_passes, extract_program, f1, group_advantages, overlong_penalty, total_reward, RewardConfig, SandboxVerdict};
use coa_schemas::rows::{Rollout, Task};
use coa_schemas::suite::{answer_kind, AnswerKind};
use coa_schemas::tables::SCORES;
use coa_tools::SandboxLimits;
use rayon::prelude::*;

/// The verdict on one rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub correct: bool,
    /// SQuAD F1 for QA suites (multihop, qa), else `None`.
    pub f1: Option<f32>,
    pub format_ok: bool,
    /// The first grammar violation, when `format_ok` is false.
    pub format_error: Option<String>,
    pub overlong: f32,
    /// Code tasks with an answer: the sandbox's verdict on its program.
    pub sandbox: Option<SandboxVerdict>,
    pub reward: f32,
    /// Filled in per group once every verdict is known.
    pub advantage: f32,
}

/// The content of the last `<answer>` block. Text that does not parse as CoA still has its
/// answer read (the grammar check penalises it separately): the last `<answer>…</answer>` pair.
pub fn final_answer(text: &str) -> Option<&str> {
    if let Ok(steps) = steps_from_text(text) {
        return steps.iter().rev().find(|s| s.tag == Tag::Answer).map(|s| s.content);
    }
    // The last answer is the rollout's final word (an agent's output in `coa-agents` is read from
    // its first blocks instead).
    find_last_block(text, Tag::Answer)
}

/// Checks one rollout against its task.
/// How a response gives its final answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answers {
    /// In the CoA grammar: the last `<answer>` block; the grammar is checked.
    Coa,
    /// Plain text (`coa-generate policy --plain`): the last `\boxed{}` for math and short
    /// answers, the last fenced code block for code (as Qwen-Math's and LiveCodeBench's
    /// evaluations read them); there is no grammar to break.
    Plain,
}

/// The final answer of a plain response (see [`Answers::Plain`]); code is read from the whole
/// text by [`extract_program`].
pub fn plain_answer<'a>(task: &Task, text: &'a str) -> Option<std::borrow::Cow<'a, str>> {
    match answer_kind(&task.suite) {
        Some(AnswerKind::Program) => Some(std::borrow::Cow::Borrowed(text)),
        _ => boxed_answer(text).map(std::borrow::Cow::Owned),
    }
}

/// [`judge_as`] for CoA responses.
pub fn judge(task: &Task, rollout: &Rollout, config: &RewardConfig, limits: &SandboxLimits) -> Result<Verdict> {
    judge_as(task, rollout, config, limits, Answers::Coa)
}

pub fn judge_as(task: &Task, rollout: &Rollout, config: &RewardConfig, limits: &SandboxLimits, answers: Answers) -> Result<Verdict> {
    let flavor = Flavor::for_suite(&rollout.suite);
    let format_error = match answers {
        Answers::Plain => None,
        Answers::Coa => match steps_from_text(&rollout.response_text) {
            Err(e) => Some(e.to_string()),
            Ok(steps) => validate(&steps, flavor).err().map(|v| v.to_string()),
        },
    };
    let answer = match answers {
        Answers::Coa => final_answer(&rollout.response_text).map(std::borrow::Cow::Borrowed),
        Answers::Plain => plain_answer(task, &rollout.response_text),
    };
    let answer = answer.as_deref();
    let checked = || format!("task {}: checking the answer", task.task_id);
    let (correct, sandbox) = match answer {
        Some(a) if answer_kind(&task.suite) == Some(AnswerKind::Program) => {
            let v = code_passes(task, &extract_program(a.trim()), limits).with_context(checked)?;
            (v.passed, Some(v.sandbox))
        }
        Some(a) => (check_answer(task, a.trim(), limits).with_context(checked)?, None),
        None => (false, None),
    };
    let f1 = match answer_kind(&task.suite) {
        Some(AnswerKind::Phrase) => Some(answer.map_or(0.0, |a| f1(a.trim(), &task.answers) as f32)),
        _ => None,
    };
    let format_ok = format_error.is_none();
    let overlong = overlong_penalty(rollout.response_ids.len(), config.max_len, config.cache_len);
    let reward = total_reward(correct, format_ok, overlong, config);
    Ok(Verdict { correct, f1, format_ok, format_error, overlong, sandbox, reward, advantage: 0.0 })
}

/// Judges every rollout (in parallel: code tasks run their tests) and fills in the group
/// advantages, a group being the samples of one (task, model). `judged` is called once per
/// rollout as its verdict is in (a progress bar).
pub fn score(
    rollouts: &[Rollout],
    tasks: &HashMap<String, Task>,
    config: &RewardConfig,
    limits: &SandboxLimits,
    answers: Answers,
    judged: &(dyn Fn() + Sync),
) -> Result<Vec<Verdict>> {
    for (row, r) in rollouts.iter().enumerate() {
        let Some(task) = tasks.get(&r.task_id) else {
            bail!("row {row}: task `{}` is not in the tasks table (pass the tasks the rollouts were generated from with --tasks)", r.task_id);
        };
        if task.suite != r.suite {
            bail!("row {row}: task `{}` is a `{}` task in the tasks table but the rollout says `{}`", r.task_id, task.suite, r.suite);
        }
    }
    // Every code task's tests planned at once (one planner process), not one task at a time.
    let mut tests: Vec<&str> = rollouts.iter().filter_map(|r| tasks[&r.task_id].test_code.as_deref()).collect();
    tests.sort_unstable();
    tests.dedup();
    coa_rewards::plan::plan_all(&tests).context("planning the code tasks' unit tests")?;
    let mut verdicts: Vec<Verdict> = rollouts
        .par_iter()
        .enumerate()
        .map(|(row, r)| {
            let verdict = judge_as(&tasks[&r.task_id], r, config, limits, answers).with_context(|| format!("row {row}"));
            judged();
            verdict
        })
        .collect::<Result<_>>()?;
    let mut groups: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, r) in rollouts.iter().enumerate() {
        groups.entry((r.task_id.as_str(), r.model.as_str())).or_default().push(i);
    }
    for members in groups.values() {
        let rewards: Vec<f32> = members.iter().map(|&i| verdicts[i].reward).collect();
        for (&i, a) in members.iter().zip(group_advantages(&rewards)) {
            verdicts[i].advantage = a;
        }
    }
    Ok(verdicts)
}

/// The `scores` batch: the rollout columns of `batch` (canonical order) plus the verdicts.
pub fn scores_batch(batch: &RecordBatch, verdicts: &[Verdict]) -> Result<RecordBatch> {
    let schema = SCORES.schema();
    let n_rollout_cols = schema.fields().len() - 7;
    if batch.num_rows() != verdicts.len() {
        return Err(anyhow!("internal: {} rows but {} verdicts", batch.num_rows(), verdicts.len()));
    }
    let mut columns: Vec<ArrayRef> = batch.columns()[..n_rollout_cols].to_vec();
    columns.push(std::sync::Arc::new(Float32Array::from_iter_values(verdicts.iter().map(|v| v.reward))));
    columns.push(std::sync::Arc::new(BooleanArray::from_iter(verdicts.iter().map(|v| Some(v.correct)))));
    columns.push(std::sync::Arc::new(Float32Array::from_iter(verdicts.iter().map(|v| v.f1))));
    columns.push(std::sync::Arc::new(BooleanArray::from_iter(verdicts.iter().map(|v| Some(v.format_ok)))));
    columns.push(std::sync::Arc::new(Float32Array::from_iter_values(verdicts.iter().map(|v| v.overlong))));
    columns.push(std::sync::Arc::new(Float32Array::from_iter_values(verdicts.iter().map(|v| v.advantage))));
    columns.push(std::sync::Arc::new(StringArray::from_iter(verdicts.iter().map(|v| v.sandbox.map(SandboxVerdict::as_str)))));
    Ok(RecordBatch::try_new(schema, columns)?)
}
