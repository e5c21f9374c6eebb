//! The `scripted` backend: an offline expert that knows each synthetic task's solution path
//! (`Task::solution`) and acts it out through the real tools, with configurable noise. It is a
//! **simulator**: every run it produces says so (`backend = "scripted"`, `simulator = true`).
//!
//! The expert is honest about what it sees: it learns a multihop hop's entity only by reading
//! the evidence sentence on the subject's own crawled page; a math answer is the value the
//! program actually printed; a code answer is submitted after the program ran on the
//! statement's example. So noise has real consequences, read from real observations.
//!
//! # Behaviour per suite
//! - **multihop**: plan → per hop: web_search (the hop's query) → crawl_page (the subject's
//!   page; later hops sometimes crawl the page of the entity just learned directly) → … →
//!   suggested_answer → double_check (score 3–4) → answer.
//! - **math**: plan → code → reflection → answer `\boxed{printed value}`.
//! - **code**: plan → code (the function + a check on the statement's example) → reflection →
//!   answer (the function in a ```python block).
//!
//! # Noise (each a probability, see [`Noise`])
//! - `wrong_pick` (per hop): crawl a wrong search hit (a namesake / confusable distractor when
//!   one is listed) → the observation lacks the fact → reflection graded Poor → re-plan → a
//!   refined search or a direct crawl → recovery.
//! - `buggy_code` (per run, math/code): run the solution's `buggy_code` first → the reflection
//!   spots the wrong value or the failing example → fix. A buggy function that passes the
//!   example is (honestly) not spotted: the run ends wrong.
//! - `premature` (per run, multihop): suggest an intermediate entity before the last hop →
//!   double_check scores it 1–2 → the team continues (sometimes re-planning first).
//! - `give_up` (per run): the expert commits an unverified answer: multihop stops one hop
//!   short and the verifier is fooled (score 3); math/code submit the buggy program's result.
//! - `routine_reflection` (per run, multihop): a Good/Fair reflection between two hops.
//!
//! Code-flavor reflections (math, code) grade Good or Fair only: in that flavor the grammar has
//! no re-plan, so a failed run is followed by a fixed program, not by a Poor grade.
//!
//! # Determinism
//! Every random choice comes from a SplitMix64 stream seeded by
//! `seed ^ fnv1a(task_id) ^ rotl(fnv1a(purpose), 17)`: one stream per purpose (each noise flag,
//! phrasing), so a run depends only on the seed, the task and the flags — never on concurrency,
//! and changing one noise rate does not reshuffle the other decisions.
//!
//! # Simulated latency
//! A simulator has no real latency, and measured wall-clock time would make outputs differ
//! from run to run, so latencies are modelled: an activation costs 300 ms + 0.02 ms per prompt
//! token + 20 ms per output token (an API serving ~50 tokens/s); a search 400 ms, a crawl
//! 500 ms per URL, a code run 250 ms; a routing decision forced by the protocol 0 ms.

use anyhow::{bail, Context, Result};
use coa_schemas::rows::Task;
use coa_schemas::suite::Suite;
use coa_tasks::{MathSolution, MultihopSolution};
use serde::Deserialize;

use math_code::{CodeExpert, MathExpert};
use mind::{Expert, ScriptedMind};
use multihop::WebExpert;
use rng::Streams;

use super::{Backend, Mind};
use crate::action::Action;

/// Noise rates of the scripted expert (module docs). Each is a probability in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    /// Per multihop hop: crawl a wrong search hit first.
    pub wrong_pick: f64,
    /// Per math/code run: run the buggy program first.
    pub buggy_code: f64,
    /// Per multihop run: suggest an intermediate entity as the answer before the last hop.
    pub premature: f64,
    /// Per run: commit an unverified, wrong answer.
    pub give_up: f64,
    /// Per multihop run: a routine (Good/Fair) reflection between two hops.
    pub routine_reflection: f64,
}

impl Default for Noise {
    /// Calibrated to a realistic teacher: ~70% success, trajectories of ~6–25 actions, reflections
    /// in about a third of the multihop runs, premature answers in ~1 in 14, so that the
    /// distillation filter (`coa-filter`) keeps roughly a third of the runs (`make distill` prints
    /// the shares).
    fn default() -> Self {
        Noise { wrong_pick: 0.1, buggy_code: 0.3, premature: 0.1, give_up: 0.3, routine_reflection: 0.05 }
    }
}

impl Noise {
    /// Checks every rate is a probability; the error names the flag.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("--noise-wrong-pick", self.wrong_pick),
            ("--noise-buggy-code", self.buggy_code),
            ("--noise-premature", self.premature),
            ("--noise-give-up", self.give_up),
            ("--routine-reflection", self.routine_reflection),
        ] {
            if !(0.0..=1.0).contains(&v) {
                bail!("{name}: {v} is not a probability (expected 0 to 1)");
            }
        }
        Ok(())
    }
}

/// Simulated latency model (module docs).
const SIM_BASE_MS: f64 = 300.0;
const SIM_MS_PER_PROMPT_TOKEN: f64 = 0.02;
const SIM_MS_PER_OUTPUT_TOKEN: f64 = 20.0;
const SIM_SEARCH_MS: f64 = 400.0;
const SIM_CRAWL_MS_PER_URL: f64 = 500.0;
const SIM_CODE_MS: f64 = 250.0;

/// The scripted expert backend.
#[derive(Debug, Clone)]
pub struct ScriptedBackend {
    seed: u64,
    noise: Noise,
}

impl ScriptedBackend {
    pub fn new(seed: u64, noise: Noise) -> Result<ScriptedBackend> {
        noise.validate()?;
        Ok(ScriptedBackend { seed, noise })
    }
}

/// A code task's solution: the synthetic suite has `buggy_code`, imported HumanEval does not.
#[derive(Debug, Clone, Deserialize)]
struct CodeSol {
    code: String,
    #[serde(default)]
    buggy_code: Option<String>,
}

enum Solution {
    Web(MultihopSolution),
    Math(MathSolution),
    Code(CodeSol),
}

fn solution_of(task: &Task) -> Result<Solution> {
    let Some(raw) = task.solution.as_deref().filter(|s| !s.trim().is_empty()) else {
        bail!("task {} ({} suite, source {}) has no solution path for the scripted expert (imported tasks have none)", task.task_id, task.suite, task.source);
    };
    let bad = |what: &str| format!("task {}: `solution` is not a {what} solution path", task.task_id);
    match Suite::parse(&task.suite) {
        Some(Suite::Multihop) => {
            let sol: MultihopSolution = serde_json::from_str(raw).with_context(|| bad("multihop"))?;
            if sol.hops.is_empty() {
                bail!("task {}: multihop solution has no hops", task.task_id);
            }
            Ok(Solution::Web(sol))
        }
        Some(Suite::Math) => Ok(Solution::Math(serde_json::from_str(raw).with_context(|| bad("math"))?)),
        Some(Suite::Code) => {
            let sol: CodeSol = serde_json::from_str(raw).with_context(|| bad("code"))?;
            if sol.code.trim().is_empty() {
                bail!("task {}: code solution is empty", task.task_id);
            }
            Ok(Solution::Code(sol))
        }
        Some(Suite::Qa) | None => bail!("task {}: the scripted expert has no script for suite `{}`", task.task_id, task.suite),
    }
}

impl Backend for ScriptedBackend {
    fn label(&self) -> String {
        "scripted".to_string()
    }

    fn simulator(&self) -> bool {
        true
    }

    fn check_task(&self, task: &Task) -> Result<()> {
        solution_of(task).map(|_| ())
    }

    fn start<'a>(&'a self, task: &'a Task) -> Result<Box<dyn Mind + 'a>> {
        let streams = Streams { seed: self.seed, task_id: &task.task_id };
        let expert = match solution_of(task)? {
            Solution::Web(sol) => Expert::Web(WebExpert::new(task, sol, &self.noise, &streams)),
            Solution::Math(sol) => Expert::Math(MathExpert::new(sol, &self.noise, &streams)),
            Solution::Code(sol) => Expert::Code(CodeExpert::new(task, sol, &self.noise, &streams)),
        };
        Ok(Box::new(ScriptedMind { expert, pending: None }))
    }

    fn tool_latency_ms(&self, action: Action, input: &str, _measured_ms: f64) -> f64 {
        match action {
            Action::WebSearch => SIM_SEARCH_MS,
            Action::CrawlPage => SIM_CRAWL_MS_PER_URL * input.split('|').filter(|u| !u.trim().is_empty()).count().max(1) as f64,
            Action::Code => SIM_CODE_MS,
            _ => 0.0,
        }
    }
}

mod math_code;
mod mind;
mod multihop;
mod rng;

#[cfg(test)]
mod tests;
