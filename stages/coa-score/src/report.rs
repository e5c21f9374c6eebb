//! The eval table per suite and model (docs/ARCHITECTURE.md, "Evaluation"): pass@1, pass@k, tokens
//! per task and per solved task, tool calls, format-error rate.

use std::collections::BTreeMap;

use coa_rewards::pass_at_k;
use serde::Serialize;

/// What the report needs of one scored rollout.
#[derive(Debug, Clone)]
pub struct Sample<'a> {
    pub suite: &'a str,
    pub model: &'a str,
    pub task_id: &'a str,
    pub correct: bool,
    pub format_ok: bool,
    /// Tokens the model processed for this sample: the prompt plus every response token over all
    /// turns (observations included). With a KV cache nothing is processed twice, so this is the
    /// counterpart of a multi-agent run's tokens in + out.
    pub tokens: usize,
    pub tool_calls: i32,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    pub suite: String,
    pub model: String,
    pub tasks: usize,
    /// Samples per task (the smallest group when groups differ): the k of pass@k.
    pub k: usize,
    pub samples: usize,
    pub pass_at_1: f64,
    pub pass_at_k: f64,
    /// Mean tokens (prompt + response) per sample.
    pub tokens_per_task: f64,
    /// All tokens spent divided by the samples that solved their task (`None` when
    /// nothing was solved).
    pub tokens_per_solved: Option<f64>,
    pub tool_calls: f64,
    pub format_error_rate: f64,
}

/// Groups samples by (suite, model) and task; pass@k uses the unbiased estimator per task with
/// n = the task's samples and k = the smallest group size of the line.
pub fn summarize(samples: &[Sample<'_>]) -> Vec<Line> {
    let mut by_line: BTreeMap<(&str, &str), BTreeMap<&str, Vec<&Sample<'_>>>> = BTreeMap::new();
    for s in samples {
        by_line.entry((s.suite, s.model)).or_default().entry(s.task_id).or_default().push(s);
    }
    by_line
        .into_iter()
        .map(|((suite, model), tasks)| {
            let k = tasks.values().map(|g| g.len()).min().unwrap_or(1);
            let all: Vec<&Sample<'_>> = tasks.values().flatten().copied().collect();
            let n = all.len() as f64;
            let (mut p1, mut pk) = (0.0, 0.0);
            for g in tasks.values() {
                let c = g.iter().filter(|s| s.correct).count();
                p1 += pass_at_k(g.len(), c, 1);
                pk += pass_at_k(g.len(), c, k);
            }
            let solved = all.iter().filter(|s| s.correct).count();
            let tokens: usize = all.iter().map(|s| s.tokens).sum();
            Line {
                suite: suite.to_string(),
                model: model.to_string(),
                tasks: tasks.len(),
                k,
                samples: all.len(),
                pass_at_1: p1 / tasks.len() as f64,
                pass_at_k: pk / tasks.len() as f64,
                tokens_per_task: tokens as f64 / n,
                tokens_per_solved: (solved > 0).then(|| tokens as f64 / solved as f64),
                tool_calls: all.iter().map(|s| s.tool_calls as f64).sum::<f64>() / n,
                format_error_rate: all.iter().filter(|s| !s.format_ok).count() as f64 / n,
            }
        })
        .collect()
}

/// The report as a markdown table.
pub fn markdown(lines: &[Line]) -> String {
    let mut out = String::from(
        "| suite | model | tasks | k | pass@1 | pass@k | tokens/task | tokens/solved | tool calls | format errors |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for l in lines {
        let solved = l.tokens_per_solved.map_or("-".to_string(), |t| format!("{t:.0}"));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.1}% | {:.1}% | {:.0} | {} | {:.2} | {:.1}% |\n",
            l.suite,
            l.model,
            l.tasks,
            l.k,
            100.0 * l.pass_at_1,
            100.0 * l.pass_at_k,
            l.tokens_per_task,
            solved,
            l.tool_calls,
            100.0 * l.format_error_rate
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s<'a>(task: &'a str, correct: bool, tokens: usize) -> Sample<'a> {
        Sample { suite: "math", model: "m", task_id: task, correct, format_ok: tokens != 7, tokens, tool_calls: 2 }
    }

    #[test]
    fn pass_rates_tokens_and_format_errors() {
        // Task a: 1 of 2 solved; task b: 0 of 2.
        let samples = [s("a", true, 10), s("a", false, 20), s("b", false, 30), s("b", false, 7)];
        let lines = summarize(&samples);
        assert_eq!(lines.len(), 1);
        let l = &lines[0];
        assert_eq!((l.tasks, l.k, l.samples), (2, 2, 4));
        assert!((l.pass_at_1 - 0.25).abs() < 1e-12);
        assert!((l.pass_at_k - 0.5).abs() < 1e-12);
        assert!((l.tokens_per_task - 16.75).abs() < 1e-12);
        assert_eq!(l.tokens_per_solved, Some(67.0));
        assert!((l.format_error_rate - 0.25).abs() < 1e-12);
        let md = markdown(&lines);
        assert!(md.contains("| math | m | 2 | 2 | 25.0% | 50.0% | 17 | 67 | 2.00 | 25.0% |"), "{md}");
    }
}
