//! The teacher multi-agent system of `coa-generate mas` (docs/ARCHITECTURE.md, "Teacher and
//! distillation").
//!
//! Agents — a **manager** that routes, a **planner** (plans, suggested answers, final answers), a
//! **search agent**, a **crawl agent**, a **code agent**, a **reflector** and a **verifier** —
//! each with its own role prompt ([`prompts`]) and message history, exchange messages through
//! the [`orchestrator`], which runs the real tools ([`tools`]) and logs every activation as an
//! [`Event`]. Agents think through a [`Backend`]: the offline [`ScriptedBackend`] expert (a
//! simulator) or any OpenAI-compatible endpoint ([`OpenAiBackend`]).
//!
//! # Event contract (what `coa-extract` reads)
//! - `seq`: 0, 1, … in order; `agent`: `manager`, `planner`, `search_agent`, `crawl_agent`,
//!   `code_agent`, `reflector` or `verifier`.
//! - `role`: `manager` for a routing decision (output `next: <action>\nreason: …`; when the
//!   grammar allows a single action it is decided by rule: no input messages, 0 tokens) and for a
//!   rejected agent output (agent = the agent that wrote it, output = its raw text; kept for the
//!   token count, no part of the CoA trace). Otherwise the CoA action produced: `plan`,
//!   `web_search`, `crawl_page`, `code`, `reflection`, `suggested_answer`, `double_check`,
//!   `answer`.
//! - A non-manager `output` is canonical CoA text: `<think>…</think>\n` then exactly one action
//!   block (`<code>\n```py\n…\n```\n</code>` for code; math answers `\boxed{…}`, code answers a
//!   ```` ```python ```` block inside `<answer>`). The think block is there exactly where the
//!   grammar's think rule has one: before every action in the web and qa flavors (answers too),
//!   before code and the answer in the code flavor, whose plan and reflection come without one
//!   (AFM's order `plan, (think, code, observation, reflection)*, think, answer`).
//! - Tool events: `tool` = the tag name, `tool_input` = the query / `|`-separated URLs / the
//!   Python source (no fence), `observation` = the tool's output exactly as `coa-tools` renders
//!   it. Other events: all three null.
//! - Ordering follows `coa-format`'s grammar (web flavor for multihop, qa flavor for qa, code
//!   flavor for math/code); a reflection graded Poor (web, qa) is followed by a plan; a double_check with
//!   score ≥ 3 by the answer, ≤ 2 by a plan, search or crawl.
//! - `tokens_in`: the estimate of [`tokens`] over `input_messages` (or the endpoint's usage);
//!   `tokens_out`: over the raw reply. `latency_ms`: measured (openai: every try and the waits
//!   between them) or simulated (scripted).
//!
//! Row fields: `final_answer` is the content of the `<answer>` (for code tasks the program
//! inside its fence), `success` is checked with `coa-rewards` (exact match for multihop/qa,
//! `math_equal` for math, the unit/stdio tests for code), `tokens_in/out` and `latency_ms` are
//! sums over the events.

pub mod action;
pub mod backend;
pub mod event;
pub mod orchestrator;
pub mod prompts;
pub mod tokens;
pub mod tools;

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use coa_schemas::rows::Task;
use rayon::prelude::*;
use serde_json::{json, Value};

pub use action::{Action, AgentRole, Step};
pub use backend::openai::{OpenAiBackend, OpenAiClient, OpenAiConfig};
pub use backend::scripted::{Noise, ScriptedBackend};
pub use backend::{Backend, Mind, Reply, Turn};
pub use event::{ChatMessage, Event, MasRun};
pub use orchestrator::{run_task, RunConfig};
pub use tools::{ToolConfig, Tools};

/// Runs tasks on a fixed number of threads; results come back in input order, and each run
/// depends only on its task (and the backend's seed), so the output is the same for any number
/// of threads.
pub struct Runner {
    pool: rayon::ThreadPool,
}

impl Runner {
    pub fn new(threads: usize) -> Result<Runner> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("coa-mas-{i}"))
            .build()
            .context("starting the task thread pool")?;
        Ok(Runner { pool })
    }

    /// [`run_task`] on every task, in parallel; the first error (in input order) wins.
    pub fn run(&self, tasks: &[Task], backend: &dyn Backend, tools: Tools<'_>, cfg: &RunConfig) -> Result<Vec<MasRun>> {
        self.run_each(tasks, backend, tools, cfg).into_iter().collect()
    }

    /// [`run_task`] on every task, in parallel, each task's outcome on its own (a task whose
    /// backend gave up does not stop the others).
    pub fn run_each(&self, tasks: &[Task], backend: &dyn Backend, tools: Tools<'_>, cfg: &RunConfig) -> Vec<Result<MasRun>> {
        plan_tests(tasks);
        self.pool.install(|| tasks.par_iter().map(|t| run_task(t, backend, tools, cfg)).collect())
    }

    /// [`Runner::run_each`] that counts failures in `budget` as they happen and starts no task
    /// once it is spent (`None` for those): a stage that allows N failures stops after the
    /// (N+1)th, not after a whole batch of tasks failed (only runs already under way finish).
    /// `done` is called as each task ends (a progress bar's tick).
    pub fn run_each_within(
        &self,
        tasks: &[Task],
        backend: &dyn Backend,
        tools: Tools<'_>,
        cfg: &RunConfig,
        budget: &FailureBudget,
        done: &(dyn Fn() + Sync),
    ) -> Vec<Option<Result<MasRun>>> {
        plan_tests(tasks);
        self.pool.install(|| {
            tasks
                .par_iter()
                .map(|t| {
                    if budget.spent() {
                        return None;
                    }
                    let outcome = run_task(t, backend, tools, cfg);
                    if outcome.is_err() {
                        budget.failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    done();
                    Some(outcome)
                })
                .collect()
        })
    }
}

/// How many tasks may fail before no more are started ([`Runner::run_each_within`]), shared by
/// every call that draws on it.
#[derive(Debug, Default)]
pub struct FailureBudget {
    pub max_failed: usize,
    failed: std::sync::atomic::AtomicUsize,
}

impl FailureBudget {
    pub fn new(max_failed: usize) -> FailureBudget {
        FailureBudget { max_failed, failed: Default::default() }
    }

    /// Failures counted so far.
    pub fn failed(&self) -> usize {
        self.failed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// More than `max_failed` tasks failed.
    pub fn spent(&self) -> bool {
        self.failed() > self.max_failed
    }
}

/// Aggregate statistics of runs, for the stage summary and calibration.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    pub runs: u64,
    pub successes: u64,
    pub events: u64,
    /// Events that are part of the CoA trace (not `manager`).
    pub action_events: u64,
    pub min_actions: Option<u64>,
    pub max_actions: u64,
    pub tokens: i64,
    pub runs_with_reflection: u64,
    /// Correct runs that went wrong on the way and recovered: a reflection graded Poor, a
    /// doubted suggested answer, or a program found at fault and rewritten.
    pub recoveries: u64,
    /// Runs with a reflection graded Poor.
    pub runs_with_poor_reflection: u64,
    /// Runs whose first double_check scored ≤ 2 (a premature answer).
    pub runs_with_doubted_answer: u64,
    /// Rejected outputs (contract violations).
    pub rejected: u64,
    pub no_answer: u64,
    /// Per suite: (runs, successes, tokens).
    pub per_suite: BTreeMap<String, (u64, u64, i64)>,
    /// Per suite and hop count, for tasks that have one (multihop): (runs, successes).
    pub per_suite_hops: BTreeMap<String, BTreeMap<i32, (u64, u64)>>,
}

impl RunStats {
    /// Adds one run; `hops` is its task's hop count where it has one (the success by hop
    /// count of `to_json`'s `by_hops`).
    pub fn add(&mut self, run: &MasRun, hops: Option<i32>) {
        self.runs += 1;
        self.successes += run.success as u64;
        self.events += run.events.len() as u64;
        let actions = run.events.iter().filter(|e| e.role != "manager").count() as u64;
        self.action_events += actions;
        self.min_actions = Some(self.min_actions.map_or(actions, |m| m.min(actions)));
        self.max_actions = self.max_actions.max(actions);
        self.tokens += run.tokens_in + run.tokens_out;
        let reflections: Vec<&Event> = run.events.iter().filter(|e| e.role == "reflection").collect();
        self.runs_with_reflection += !reflections.is_empty() as u64;
        let poor = reflections.iter().any(|e| e.output.lines().any(|l| l.contains(": Poor")));
        self.runs_with_poor_reflection += poor as u64;
        let first_check = run.events.iter().find(|e| e.role == "double_check");
        let doubted = first_check.is_some_and(|e| coa_format::parse_double_check(inner(&e.output, "double_check")).is_ok_and(|s| s <= 2));
        self.runs_with_doubted_answer += doubted as u64;
        // code flavor: a reflection that found fault (a grade below Good) followed by another program
        let actions: Vec<&Event> = run.events.iter().filter(|e| e.role != "manager").collect();
        let fixed = actions.windows(2).any(|w| w[0].role == "reflection" && w[1].role == "code" && w[0].output.lines().any(|l| l.contains(": Fair") || l.contains(": Poor")));
        self.recoveries += ((poor || doubted || fixed) && run.success) as u64;
        self.rejected += run.events.iter().filter(|e| e.role == "manager" && e.agent != "manager").count() as u64;
        self.no_answer += run.final_answer.is_none() as u64;
        let s = self.per_suite.entry(run.suite.clone()).or_default();
        s.0 += 1;
        s.1 += run.success as u64;
        s.2 += run.tokens_in + run.tokens_out;
        if let Some(h) = hops {
            let c = self.per_suite_hops.entry(run.suite.clone()).or_default().entry(h).or_default();
            c.0 += 1;
            c.1 += run.success as u64;
        }
    }

    /// The summary fields (rates rounded to 4 digits).
    pub fn to_json(&self) -> Value {
        let n = self.runs.max(1) as f64;
        let r = |x: f64| (x * 10_000.0).round() / 10_000.0;
        // Tokens per solved task: everything the system spent (failed runs included) over what it solved.
        let per_solved = |tokens: f64, ok: u64| if ok == 0 { Value::Null } else { json!(r(tokens / ok as f64)) };
        let suites: serde_json::Map<String, Value> = self
            .per_suite
            .iter()
            .map(|(k, (runs, ok, tokens))| {
                let n = (*runs).max(1) as f64;
                let mut v = json!({
                    "runs": runs,
                    "success_rate": r(*ok as f64 / n),
                    "tokens_per_task": r(*tokens as f64 / n),
                    "tokens_per_solved": per_solved(*tokens as f64, *ok),
                });
                if let Some(hops) = self.per_suite_hops.get(k) {
                    let by: serde_json::Map<String, Value> =
                        hops.iter().map(|(h, (runs, ok))| (h.to_string(), json!({"runs": runs, "success_rate": r(*ok as f64 / (*runs).max(1) as f64)}))).collect();
                    v["by_hops"] = Value::Object(by);
                }
                (k.clone(), v)
            })
            .collect();
        json!({
            "success_rate": r(self.successes as f64 / n),
            "mean_events": r(self.events as f64 / n),
            "mean_actions": r(self.action_events as f64 / n),
            "min_actions": self.min_actions.unwrap_or(0),
            "max_actions": self.max_actions,
            "tokens_per_task": r(self.tokens as f64 / n),
            "tokens_per_solved": per_solved(self.tokens as f64, self.successes),
            "reflection_rate": r(self.runs_with_reflection as f64 / n),
            "poor_reflection_rate": r(self.runs_with_poor_reflection as f64 / n),
            "recovery_rate": r(self.recoveries as f64 / n),
            "doubted_answer_rate": r(self.runs_with_doubted_answer as f64 / n),
            "no_answer": self.no_answer,
            "rejected_outputs": self.rejected,
            "suites": Value::Object(suites),
            // The unrounded counts behind every field above: the summaries of a sharded run's
            // shards add up to the unsharded one (pipelines/merge_stats.py).
            "counts": {
                "runs": self.runs,
                "successes": self.successes,
                "events": self.events,
                "action_events": self.action_events,
                "min_actions": self.min_actions,
                "max_actions": self.max_actions,
                "tokens": self.tokens,
                "runs_with_reflection": self.runs_with_reflection,
                "runs_with_poor_reflection": self.runs_with_poor_reflection,
                "recoveries": self.recoveries,
                "runs_with_doubted_answer": self.runs_with_doubted_answer,
                "rejected": self.rejected,
                "no_answer": self.no_answer,
                "per_suite": self.per_suite.iter().map(|(k, (runs, ok, tokens))| (k.clone(), json!([runs, ok, tokens]))).collect::<serde_json::Map<String, Value>>(),
                "per_suite_hops": self
                    .per_suite_hops
                    .iter()
                    .map(|(k, hops)| (k.clone(), hops.iter().map(|(h, (runs, ok))| (h.to_string(), json!([runs, ok]))).collect::<serde_json::Map<String, Value>>().into()))
                    .collect::<serde_json::Map<String, Value>>(),
            },
        })
    }
}

/// The content of the first `<tag>` block of `text` (or "").
fn inner<'a>(text: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    text.find(&open)
        .and_then(|s| {
            let b = s + open.len();
            text[b..].find(&close).map(|e| &text[b..b + e])
        })
        .unwrap_or("")
}

/// Plans every code task's unit tests with one planner process before the runs start, instead of
/// one process per task as each run checks its program. A failure here is not lost: it comes
/// back, naming its task, where that run's check plans its tests again.
fn plan_tests(tasks: &[Task]) {
    let tests: Vec<&str> = tasks.iter().filter_map(|t| t.test_code.as_deref()).collect();
    let _ = coa_rewards::plan::plan_all(&tests);
}
