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
    /// The task's hop count, where it has one (multihop).
    pub hops: Option<i32>,
}

/// pass@1 over the tasks of one hop count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HopLine {
    pub tasks: usize,
    pub pass_at_1: f64,
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
    /// pass@1 by the tasks' hop count (only for suites whose tasks have one).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_hops: BTreeMap<i32, HopLine>,
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
            let mut by_hops: BTreeMap<i32, HopLine> = BTreeMap::new();
            for g in tasks.values() {
                if let Some(h) = g[0].hops {
                    let line = by_hops.entry(h).or_insert(HopLine { tasks: 0, pass_at_1: 0.0 });
                    line.tasks += 1;
                    line.pass_at_1 += pass_at_k(g.len(), g.iter().filter(|s| s.correct).count(), 1);
                }
            }
            by_hops.values_mut().for_each(|l| l.pass_at_1 /= l.tasks as f64);
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
                by_hops,
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
    for l in lines.iter().filter(|l| !l.by_hops.is_empty()) {
        out.push_str(&format!("\n{} / {}: pass@1 by hop count\n\n| hops | tasks | pass@1 |\n|---|---|---|\n", l.suite, l.model));
        for (h, hl) in &l.by_hops {
            out.push_str(&format!("| {h} | {} | {:.1}% |\n", hl.tasks, 100.0 * hl.pass_at_1));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s<'a>(task: &'a str, correct: bool, tokens: usize) -> Sample<'a> {
        Sample { suite: "math", model: "m", task_id: task, correct, format_ok: tokens != 7, tokens, tool_calls: 2, hops: None }
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
        assert!(l.by_hops.is_empty() && !md.contains("hop count"));
        assert!(!serde_json::to_string(&lines).unwrap().contains("by_hops"));
    }

    #[test]
    fn pass_at_1_by_hop_count() {
        let h = |task, correct, hops| Sample { suite: "multihop", model: "m", task_id: task, correct, format_ok: true, tokens: 5, tool_calls: 4, hops: Some(hops) };
        // Two 2-hop tasks (one solved in 1 of 2 samples, one in 2 of 2), one 4-hop task unsolved.
        let samples = [h("a", true, 2), h("a", false, 2), h("b", true, 2), h("b", true, 2), h("c", false, 4), h("c", false, 4)];
        let l = &summarize(&samples)[0];
        assert_eq!(l.by_hops.keys().copied().collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(l.by_hops[&2], HopLine { tasks: 2, pass_at_1: 0.75 });
        assert_eq!(l.by_hops[&4], HopLine { tasks: 1, pass_at_1: 0.0 });
        let md = markdown(&summarize(&samples));
        assert!(md.contains("multihop / m: pass@1 by hop count") && md.contains("| 2 | 2 | 75.0% |") && md.contains("| 4 | 1 | 0.0% |"), "{md}");
        let json = serde_json::to_value(summarize(&samples)).unwrap();
        assert_eq!(json[0]["by_hops"]["2"]["pass_at_1"], 0.75);
    }
}
