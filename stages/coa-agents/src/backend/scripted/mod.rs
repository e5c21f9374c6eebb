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
use coa_format::ThinkRule;
use coa_schemas::rows::Task;
use coa_schemas::suite::Suite;
use coa_tasks::{Hop, MathSolution, MultihopSolution};
use serde::Deserialize;

use super::{Backend, Mind, Reply, Turn};
use crate::action::{render_output, Action, AgentRole, Step};
use crate::prompts::manager_reply;
use crate::tokens::{estimate_messages, estimate_text};

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

// ---------------------------------------------------------------------------------------------
// Randomness

/// The teacher's generator: [`SplitMix64`] with its modulo draw for indices (the recorded
/// streams were made with it).
#[derive(Debug, Clone)]
pub(crate) struct Rng(SplitMix64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0.unit()
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.below_mod(n)
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

pub(crate) use coa_schemas::rng::fnv1a;
use coa_schemas::rng::SplitMix64;

struct Streams<'a> {
    seed: u64,
    task_id: &'a str,
}

impl Streams<'_> {
    /// The random stream of one purpose of one task.
    fn rng(&self, purpose: &str) -> Rng {
        let mut r = Rng(SplitMix64::new(self.seed ^ fnv1a(self.task_id) ^ fnv1a(purpose).rotate_left(17)));
        r.next_u64();
        r
    }
}

// ---------------------------------------------------------------------------------------------
// The mind: one intent per state, shared by the manager's routing and the agent's action

/// What the expert wants to do next.
#[derive(Debug, Clone)]
struct Intent {
    action: Action,
    think: String,
    body: String,
    /// The manager's one-line reason for routing to it.
    reason: String,
}

enum Expert {
    Web(WebExpert),
    Math(MathExpert),
    Code(CodeExpert),
}

struct ScriptedMind {
    expert: Expert,
    /// The intent decided for the state with this many steps.
    pending: Option<(usize, Intent)>,
}

impl ScriptedMind {
    fn intent(&mut self, steps: &[Step]) -> Result<Intent> {
        if let Some((at, intent)) = &self.pending {
            if *at == steps.len() {
                return Ok(intent.clone());
            }
        }
        let intent = match &mut self.expert {
            Expert::Web(e) => e.decide(steps)?,
            Expert::Math(e) => e.decide(steps)?,
            Expert::Code(e) => e.decide(steps)?,
        };
        self.pending = Some((steps.len(), intent.clone()));
        Ok(intent)
    }
}

impl Mind for ScriptedMind {
    fn reply(&mut self, turn: &Turn<'_>) -> Result<Reply> {
        let intent = self.intent(turn.steps)?;
        let text = if turn.agent == AgentRole::Manager {
            manager_reply(intent.action, &intent.reason)
        } else {
            // A think block only where the grammar has one before this action.
            let think = (intent.action.think_rule(turn.flavor) != ThinkRule::Forbidden).then_some(intent.think.as_str());
            render_output(think, intent.action, &intent.body)
        };
        let (tin, tout) = (estimate_messages(turn.messages), estimate_text(&text));
        let latency_ms = SIM_BASE_MS + SIM_MS_PER_PROMPT_TOKEN * tin as f64 + SIM_MS_PER_OUTPUT_TOKEN * tout as f64;
        Ok(Reply { text, usage: None, latency_ms: (latency_ms * 1000.0).round() / 1000.0 })
    }
}

fn last_observation(steps: &[Step]) -> &str {
    steps.last().and_then(|s| s.observation.as_deref()).unwrap_or("")
}

fn intent(action: Action, think: String, body: String, reason: impl Into<String>) -> Intent {
    Intent { action, think, body, reason: reason.into() }
}

// ---------------------------------------------------------------------------------------------
// multihop

/// Words for a relation in plans and reasoning.
fn relation_phrase(relation: &str) -> &str {
    match relation {
        "born_in" => "birthplace",
        "studied_at" => "university",
        "works_for" => "employer",
        "mentor" => "mentor",
        "located_in" => "location",
        "capital" => "capital",
        "headquartered_in" => "headquarters city",
        "founded_by" => "founder",
        "ceo" => "chief executive",
        "made_by" => "manufacturer",
        "designed_by" => "designer",
        "mayor" => "mayor",
        "president" => "president",
        other => other,
    }
}

/// `[title](url)` hits of a rendered search observation.
fn search_hits(observation: &str) -> Vec<(String, String)> {
    let mut hits = Vec::new();
    for line in observation.lines() {
        let Some(rest) = line.split_once(". [").filter(|(n, _)| n.chars().all(|c| c.is_ascii_digit())).map(|(_, r)| r) else {
            continue;
        };
        if let Some(mid) = rest.rfind("](") {
            if let Some(url) = rest[mid + 2..].strip_suffix(')') {
                hits.push((rest[..mid].to_string(), url.to_string()));
            }
        }
    }
    hits
}

/// The text of the block for `url` in a crawl observation.
fn crawled_text<'a>(observation: &'a str, url: &str) -> Option<&'a str> {
    let marker = format!("[{url}] Summary:\n");
    let start = observation.find(&marker)? + marker.len();
    let rest = &observation[start..];
    let end = rest.find("\n\nPage ").unwrap_or(rest.len());
    Some(&rest[..end])
}

fn title_of(url: &str) -> String {
    url.rsplit('/').next().unwrap_or(url).replace('_', " ")
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Suggest {
    Final,
    Premature,
    GiveUp,
}

#[derive(Debug, Clone, PartialEq)]
enum WebPhase {
    Start,
    /// Ready to retrieve the next unresolved hop.
    Ready,
    /// A routine reflection was made after learning a hop: continue as after learning.
    Reflected,
    Searched { hop: usize, retry: bool },
    /// `crawled` was read for `hop`, whose fact is on the page `url`.
    Crawled { hop: usize, url: String, crawled: String },
    /// A Poor reflection about `hop`'s page; next: re-plan.
    Refuted { hop: usize, wrong: String },
    Replanned { hop: usize },
    Suggested { answer: String, kind: Suggest },
    Checked { score: u8, answer: String },
    Answered { answer: String },
}

/// Attempts at one hop before the expert stops trying (only reached if the corpus lacks a page).
const MAX_HOP_ATTEMPTS: usize = 3;

struct WebExpert {
    question: String,
    sol: MultihopSolution,
    wrong_pick: Vec<bool>,
    direct: Vec<bool>,
    pair_crawl: Vec<bool>,
    premature_after: Option<usize>,
    give_up: bool,
    routine_after: Option<usize>,
    rng: Rng,
    learned: Vec<String>,
    wrong_done: Vec<bool>,
    attempts: Vec<usize>,
    phase: WebPhase,
}

impl WebExpert {
    fn new(task: &Task, sol: MultihopSolution, noise: &Noise, s: &Streams<'_>) -> WebExpert {
        let n = sol.hops.len();
        let mut pick_rng = s.rng("wrong_pick");
        let wrong_pick = (0..n).map(|_| pick_rng.chance(noise.wrong_pick)).collect();
        let mut style = s.rng("style");
        let direct = (0..n).map(|h| h > 0 && style.chance(0.2)).collect();
        let pair_crawl = (0..n).map(|_| style.chance(0.12)).collect();
        let give_up = s.rng("give_up").chance(noise.give_up);
        let mut pre = s.rng("premature");
        let premature_after = (!give_up && n >= 2 && pre.chance(noise.premature)).then(|| pre.below(n - 1));
        let mut rr = s.rng("routine_reflection");
        let routine_after = (n >= 2 && rr.chance(noise.routine_reflection)).then(|| rr.below(n - 1));
        WebExpert {
            question: task.question.clone(),
            sol,
            wrong_pick,
            direct,
            pair_crawl,
            premature_after,
            give_up,
            routine_after,
            rng: s.rng("phrasing"),
            learned: Vec::new(),
            wrong_done: vec![false; n],
            attempts: vec![0; n],
            phase: WebPhase::Start,
        }
    }

    fn n(&self) -> usize {
        self.sol.hops.len()
    }

    fn hop(&self, h: usize) -> &Hop {
        &self.sol.hops[h]
    }

    /// The subject of hop `h` as the expert knows it: named in the question, or learned.
    fn subject(&self, h: usize) -> String {
        if h == 0 {
            self.sol.hops[0].subject.clone()
        } else {
            self.learned[h - 1].clone()
        }
    }

    /// The wiki page of hop `h`'s subject (pages are named after their titles).
    fn subject_url(&self, h: usize) -> String {
        coa_tasks::synth::multihop::url_for(&self.subject(h))
    }

    fn chain(&self) -> String {
        std::iter::once(self.sol.hops[0].subject.clone()).chain(self.learned.iter().cloned()).collect::<Vec<_>>().join(" -> ")
    }

    fn plan_text(&self, revised: Option<String>) -> String {
        let mut lines = Vec::new();
        if let Some(r) = revised {
            lines.push(r);
        }
        for (i, hop) in self.sol.hops.iter().enumerate() {
            let rel = relation_phrase(&hop.relation);
            let line = if i < self.learned.len() {
                format!("{}. Find the {rel} of {} (done: {}).", i + 1, self.subject(i), self.learned[i])
            } else if i <= self.learned.len() {
                format!("{}. Find the {rel} of {}.", i + 1, self.subject(i))
            } else {
                format!("{}. Find the {rel} of the answer of step {i}.", i + 1)
            };
            lines.push(line);
        }
        lines.push(format!("{}. Check the chain and answer with the final entity's exact name.", self.n() + 1));
        lines.join("\n")
    }

    fn decide(&mut self, steps: &[Step]) -> Result<Intent> {
        let phase = self.phase.clone();
        Ok(match phase {
            WebPhase::Start => {
                let n = self.n();
                let think = format!(
                    "{} The question chains {n} relations, starting from {}. I will resolve them one at a time: each answer names the entity to look up next.",
                    self.rng.pick(&["Let me break the question down.", "This is a multi-hop question.", "I need to unpack the question."]),
                    self.sol.hops[0].subject
                );
                self.phase = WebPhase::Ready;
                intent(Action::Plan, think, self.plan_text(None), "the task starts with a plan")
            }
            WebPhase::Ready => self.begin_hop(self.learned.len()),
            WebPhase::Reflected => self.after_learning(),
            WebPhase::Searched { hop, retry } => self.crawl_after_search(steps, hop, retry),
            WebPhase::Crawled { hop, url, crawled } => {
                let evidence = self.hop(hop).evidence.clone();
                let read = crawled_text(last_observation(steps), &url).is_some_and(|t| t.contains(evidence.as_str()));
                if read {
                    self.learned.push(self.hop(hop).entity.clone());
                    self.after_learning()
                } else {
                    self.refute(hop, &url, &crawled)
                }
            }
            WebPhase::Refuted { hop, wrong } => {
                let subject = self.subject(hop);
                let think = format!(
                    "I read {} instead of the page of {subject}. The earlier steps still hold; step {} must use {subject}'s own page.",
                    title_of(&wrong),
                    hop + 1
                );
                let revised = format!("Revised plan (the page {} did not give the fact about {subject}):", title_of(&wrong));
                self.phase = WebPhase::Replanned { hop };
                intent(Action::Plan, think, self.plan_text(Some(revised)), "the reflection graded the last step Poor: re-plan")
            }
            WebPhase::Replanned { hop } => {
                let subject = self.subject(hop);
                if self.rng.chance(0.5) {
                    let rel = relation_phrase(&self.hop(hop).relation).to_string();
                    let query = format!("\"{subject}\" {rel}");
                    let think = format!("A more precise search, with the exact name {subject}, should rank its own page first.");
                    self.phase = WebPhase::Searched { hop, retry: true };
                    intent(Action::WebSearch, think, query, format!("search again for {subject}, more precisely"))
                } else {
                    let url = self.subject_url(hop);
                    let think = format!("Wiki pages are named after their subject, so {subject}'s page is {url}. I will open it directly.");
                    self.attempts[hop] += 1;
                    self.phase = WebPhase::Crawled { hop, url: url.clone(), crawled: url.clone() };
                    intent(Action::CrawlPage, think, url, format!("open {subject}'s own page"))
                }
            }
            WebPhase::Suggested { answer, kind } => self.double_check(&answer, kind),
            WebPhase::Checked { score, answer } => {
                if score >= 3 {
                    self.phase = WebPhase::Answered { answer: answer.clone() };
                    let think = format!("The verifier accepts {answer} (score {score}).");
                    intent(Action::Answer, think, answer, "the double check passed: give the answer")
                } else if self.rng.chance(0.4) {
                    let think = format!("{answer} was only an intermediate entity. The plan goes on from there.");
                    let revised = format!("Revised plan ({answer} is not the final answer; follow the remaining relations):");
                    self.phase = WebPhase::Ready;
                    intent(Action::Plan, think, self.plan_text(Some(revised)), "the double check failed: re-plan")
                } else {
                    self.begin_hop(self.learned.len())
                }
            }
            WebPhase::Answered { answer } => intent(Action::Answer, "The answer stands.".into(), answer, "answer"),
        })
    }

    /// Starts retrieving hop `h` (or suggests the final answer when every hop is known).
    fn begin_hop(&mut self, h: usize) -> Intent {
        if h >= self.n() {
            let answer = self.learned[self.n() - 1].clone();
            return self.suggest(answer, Suggest::Final);
        }
        let subject = self.subject(h);
        let rel = relation_phrase(&self.hop(h).relation).to_string();
        self.attempts[h] += 1;
        if self.direct[h] {
            let url = self.subject_url(h);
            let think = format!("Step {}: the {rel} of {subject}. Its wiki page is {url}; I will read it directly.", h + 1);
            self.phase = WebPhase::Crawled { hop: h, url: url.clone(), crawled: url.clone() };
            return intent(Action::CrawlPage, think, url, format!("open the page of {subject}"));
        }
        let think = if h == 0 {
            format!("Step 1 of the plan: I need the {rel} of {subject}.")
        } else {
            format!("Step {} of the plan, now that step {h} gave {subject}: I need the {rel} of {subject}.", h + 1)
        };
        self.phase = WebPhase::Searched { hop: h, retry: false };
        intent(Action::WebSearch, think, self.hop(h).query.clone(), format!("search for the {rel} of {subject}"))
    }

    fn crawl_after_search(&mut self, steps: &[Step], h: usize, retry: bool) -> Intent {
        let hits = search_hits(last_observation(steps));
        let subject = self.subject(h);
        let correct = self.subject_url(h);
        let rel = relation_phrase(&self.hop(h).relation).to_string();
        if self.wrong_pick[h] && !self.wrong_done[h] && !retry {
            // the mistake: a distractor hit, else another hit — never a page already read, nor
            // one the chain needs later (the run would crawl it twice)
            let mut avoid: Vec<String> = self.sol.hops.iter().map(|hop| hop.url.clone()).chain([coa_tasks::synth::multihop::url_for(&self.sol.answer)]).collect();
            avoid.extend(steps.iter().filter(|st| st.action == Action::CrawlPage).flat_map(|st| st.body.split('|').map(|u| u.trim().to_string())));
            let distractors = &self.hop(h).distractors;
            let wrong = hits
                .iter()
                .filter(|(_, u)| !avoid.contains(u))
                .find(|(_, u)| distractors.contains(u))
                .or_else(|| hits.iter().find(|(_, u)| !avoid.contains(u)))
                .map(|(_, u)| u.clone());
            if let Some(wrong) = wrong {
                self.wrong_done[h] = true;
                let think = format!("The result \"{}\" looks like the page about {subject}; it should give the {rel}.", title_of(&wrong));
                self.phase = WebPhase::Crawled { hop: h, url: correct, crawled: wrong.clone() };
                return intent(Action::CrawlPage, think, wrong, "read the most promising result");
            }
        }
        let found = hits.iter().any(|(_, u)| *u == correct);
        if found && self.pair_crawl[h] {
            if let Some((_, other)) = hits.iter().find(|(_, u)| *u != correct) {
                let think = format!("Two results may state the {rel} of {subject}: its own page and \"{}\". I will read both.", title_of(other));
                let urls = format!("{correct}|{other}");
                self.phase = WebPhase::Crawled { hop: h, url: correct, crawled: urls.clone() };
                return intent(Action::CrawlPage, think, urls, "read the two most promising results");
            }
        }
        let think = if found {
            format!("The result \"{subject}\" is the page of {subject} itself; it should state the {rel}.")
        } else {
            format!("None of the results is {subject}'s own page. Wiki pages are named after their subject, so I will open {correct} directly.")
        };
        self.phase = WebPhase::Crawled { hop: h, url: correct.clone(), crawled: correct.clone() };
        intent(Action::CrawlPage, think, correct, format!("read the page of {subject}"))
    }

    /// The crawled page did not state hop `h`'s fact: a reflection graded Poor (or, after too
    /// many attempts, the expert gives up on the hop and suggests what it has).
    fn refute(&mut self, h: usize, url: &str, crawled: &str) -> Intent {
        let subject = self.subject(h);
        if self.attempts[h] >= MAX_HOP_ATTEMPTS {
            let answer = if h == 0 { subject } else { self.learned[h - 1].clone() };
            return self.suggest(answer, Suggest::GiveUp);
        }
        let rel = relation_phrase(&self.hop(h).relation).to_string();
        let wrong = crawled.split('|').map(str::trim).find(|u| *u != url).unwrap_or(crawled).to_string();
        let conflict = if self.hop(h).distractors.contains(&wrong) { "Poor" } else { "Fair" };
        let body = format!(
            "information_conflict: {conflict}\ntool_effectiveness: Poor\ntrajectory_monitoring: Fair\n\
The page {wrong} is about {}, not {subject}: it does not state the {rel} of {subject}. Reading it was a wrong pick; \
the plan must go back to {subject}'s own page.",
            title_of(&wrong)
        );
        let think = format!("The page I read does not say what the {rel} of {subject} is.");
        self.phase = WebPhase::Refuted { hop: h, wrong };
        intent(Action::Reflection, think, body, "the last page did not answer the step: reflect")
    }

    fn after_learning(&mut self) -> Intent {
        let h = self.learned.len();
        let n = self.n();
        if self.routine_after == Some(h - 1) && h < n {
            self.routine_after = None;
            let grade = if self.rng.chance(0.7) { "Good" } else { "Fair" };
            let body = format!(
                "information_conflict: Good\ntool_effectiveness: {grade}\ntrajectory_monitoring: Good\n\
So far the chain is {}. Each link is stated on its subject's own page, so nothing conflicts; {} relation(s) remain.",
                self.chain(),
                n - h
            );
            let think = format!("Before going on, a check of the chain so far: {h} of {n} relations are resolved.");
            self.phase = WebPhase::Reflected;
            return intent(Action::Reflection, think, body, "take stock before the next hop");
        }
        if self.give_up && h + 1 == n {
            let answer = self.learned[h - 1].clone();
            return self.suggest(answer, Suggest::GiveUp);
        }
        if self.premature_after == Some(h - 1) && h < n {
            self.premature_after = None;
            let answer = self.learned[h - 1].clone();
            return self.suggest(answer, Suggest::Premature);
        }
        self.begin_hop(h)
    }

    fn suggest(&mut self, answer: String, kind: Suggest) -> Intent {
        let think = match kind {
            Suggest::Final => format!("Putting the steps together: {}. The last entity answers the question.", self.chain()),
            Suggest::Premature | Suggest::GiveUp => format!("The chain so far: {}. {answer} may already be what the question asks for.", self.chain()),
        };
        self.phase = WebPhase::Suggested { answer: answer.clone(), kind };
        intent(Action::SuggestedAnswer, think, answer, "propose the answer")
    }

    fn double_check(&mut self, answer: &str, kind: Suggest) -> Intent {
        let n = self.n();
        let h = self.learned.len();
        let (score, body) = match kind {
            Suggest::Final => {
                let score = if self.rng.chance(0.7) { 4 } else { 3 };
                let evidence: Vec<String> = self.sol.hops.iter().map(|hop| format!("- {}", hop.evidence)).collect();
                (
                    score,
                    format!(
                        "score: {score}\nEach relation of the question is stated on the page of its subject:\n{}\nSo {answer} is the {} the question asks for.",
                        evidence.join("\n"),
                        relation_phrase(&self.sol.hops[n - 1].relation)
                    ),
                )
            }
            Suggest::Premature => {
                let score = if self.rng.chance(0.5) { 1 } else { 2 };
                (
                    score,
                    format!(
                        "score: {score}\n{answer} is only the {} of {}. The question asks for more: {} relation(s) are still unresolved, so this is an intermediate entity, not the answer.",
                        relation_phrase(&self.sol.hops[h - 1].relation),
                        self.subject(h - 1),
                        n - h
                    ),
                )
            }
            Suggest::GiveUp => {
                let found = if h == 0 {
                    format!("{answer} is the entity the question starts from")
                } else {
                    format!("the pages state that {answer} is the {} of {}", relation_phrase(&self.sol.hops[h - 1].relation), self.subject(h - 1))
                };
                (3, format!("score: 3\nThe chain {} looks complete: {found}, which matches the question's description.", self.chain()))
            }
        };
        let think = format!("Check {answer} against the question: {}", self.question);
        self.phase = WebPhase::Checked { score, answer: answer.to_string() };
        intent(Action::DoubleCheck, think, body, "verify the suggested answer")
    }
}

// ---------------------------------------------------------------------------------------------
// math and code

/// The value a program printed: the last non-empty stdout line of a successful run.
fn printed_value(observation: &str) -> Option<String> {
    if !observation.starts_with("[EXECUTED]") {
        return None;
    }
    let start = observation.find("[STDOUT:BEGIN]\n")? + "[STDOUT:BEGIN]\n".len();
    let end = observation[start..].find("\n[STDOUT:END]").map_or(observation.len(), |e| start + e);
    observation[start..end].lines().rev().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
}

#[derive(Debug, Clone, PartialEq)]
enum CodePhase {
    Start,
    Planned,
    /// Next: the sub-task round (code: edge inputs).
    SubNext,
    /// Ran the sub-task round: setting up the quantities (math) or edge inputs (code).
    SubRan,
    /// Ran the buggy (`buggy`) or the reference program.
    Ran { buggy: bool },
    /// Reflected; `accept` = the next action is the answer.
    Reflected { accept: Option<String> },
    Answered { answer: String },
}

/// Share of math runs that first set up (and print) the statement's quantities, and of code runs
/// that try the function on edge inputs after the example: the code pattern's sub-task rounds.
const SUBTASK_ROUND: f64 = 0.35;

/// The leading `name = <number expression>` lines of a program (after its imports), as a
/// program that prints each quantity; `None` when there are none.
fn setup_program(code: &str) -> Option<String> {
    let mut lines = Vec::new();
    let mut names = Vec::new();
    for line in code.lines().skip_while(|l| l.starts_with("import ") || l.starts_with("from ")) {
        let Some((lhs, rhs)) = line.split_once(" = ") else { break };
        let is_name = lhs.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && lhs.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let is_number = !rhs.trim().is_empty() && rhs.chars().all(|c| c.is_ascii_digit() || " .+-*/()".contains(c));
        if !is_name || !is_number {
            break;
        }
        lines.push(line.to_string());
        names.push(lhs.to_string());
    }
    if names.is_empty() {
        return None;
    }
    let prints: Vec<String> = names.iter().map(|n| format!("print('{n} =', {n})")).collect();
    Some(format!("# the quantities given in the statement\n{}\n{}", lines.join("\n"), prints.join("\n")))
}

struct MathExpert {
    sol: MathSolution,
    buggy_first: bool,
    give_up: bool,
    setup: Option<String>,
    runs: usize,
    rng: Rng,
    phase: CodePhase,
}

impl MathExpert {
    fn new(sol: MathSolution, noise: &Noise, s: &Streams<'_>) -> MathExpert {
        let give_up = s.rng("give_up").chance(noise.give_up);
        let buggy_first = s.rng("buggy_code").chance(noise.buggy_code);
        let setup = setup_program(&sol.code).filter(|_| s.rng("style").chance(SUBTASK_ROUND));
        MathExpert { sol, buggy_first, give_up, setup, runs: 0, rng: s.rng("phrasing"), phase: CodePhase::Start }
    }

    fn decide(&mut self, steps: &[Step]) -> Result<Intent> {
        let phase = self.phase.clone();
        Ok(match phase {
            CodePhase::Start => {
                self.phase = CodePhase::Planned;
                let think = self.rng.pick(&[
                    "The numbers need exact computation, so I will let a program do the arithmetic.",
                    "This word problem is easiest to solve by computing it in Python.",
                ]);
                let plan = if self.setup.is_some() {
                    "1. Write down the quantities given in the statement as Python variables and check them.\n\
2. Compute the quantity asked for from them, in a short program.\n3. Check the printed value against the statement (rounding, units).\n\
4. Report the value as \\boxed{}."
                } else {
                    "1. Translate the word problem into a short Python program that computes the quantity asked for.\n\
2. Run it and check the printed value against the statement (rounding, units).\n3. Report the value as \\boxed{}."
                };
                intent(Action::Plan, think.to_string(), plan.to_string(), "the task starts with a plan")
            }
            CodePhase::Planned if self.setup.is_some() => {
                let code = self.setup.take().expect("checked");
                self.phase = CodePhase::SubRan;
                intent(Action::Code, "First the quantities of the statement, printed so I can check them.".to_string(), code, "set up the quantities")
            }
            CodePhase::SubNext => bail!("math runs have no edge-input round"),
            CodePhase::SubRan => {
                let obs = last_observation(steps);
                let shown: Vec<&str> = obs.lines().filter(|l| l.contains(" = ")).collect();
                let (grades, text) = if obs.starts_with("[EXECUTED]") {
                    ("information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good", format!("The quantities match the statement: {}. Next, the computation.", shown.join(", ")))
                } else {
                    ("information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair", "Setting up the quantities failed; I will write the whole computation in one program.".to_string())
                };
                self.phase = CodePhase::Reflected { accept: None };
                intent(Action::Reflection, "Do the printed quantities match the statement?".to_string(), format!("{grades}\n{text}"), "check the set-up")
            }
            CodePhase::Planned | CodePhase::Reflected { accept: None } => {
                let buggy = self.runs == 0 && (self.buggy_first || self.give_up);
                self.runs += 1;
                let (think, code) = if self.runs == 1 {
                    ("I will compute the quantity step by step in Python and print it.".to_string(), if buggy { &self.sol.buggy_code } else { &self.sol.code })
                } else {
                    ("Rewrite the computation so that it follows the statement exactly.".to_string(), &self.sol.code)
                };
                let code = code.clone();
                self.phase = CodePhase::Ran { buggy };
                intent(Action::Code, think, code, "compute it")
            }
            CodePhase::Ran { buggy } => {
                let obs = last_observation(steps);
                let value = printed_value(obs);
                let (grades, text, accept) = match &value {
                    None if self.runs < 3 => (
                        "information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair",
                        "The program failed before printing a result; it has to be fixed.".to_string(),
                        None,
                    ),
                    None => (
                        "information_conflict: Fair\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair",
                        "The program keeps failing; there is no value to report.".to_string(),
                        Some(String::new()),
                    ),
                    Some(v) if buggy && !self.give_up => (
                        "information_conflict: Fair\ntool_effectiveness: Good\ntrajectory_monitoring: Fair",
                        format!("The program printed {v}, but re-deriving the computation from the statement shows it does not apply the problem's conditions exactly (a simplified formula or an off-by-one). It must be fixed."),
                        None,
                    ),
                    Some(v) => (
                        "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good",
                        format!("The program follows the statement and printed {v}, in the form the question asks for."),
                        Some(v.clone()),
                    ),
                };
                let think = match &value {
                    Some(v) => format!("The program printed {v}. Does it answer the question as stated?"),
                    None => "The run failed.".to_string(),
                };
                self.phase = CodePhase::Reflected { accept: accept.clone() };
                intent(Action::Reflection, think, format!("{grades}\n{text}"), "judge the program's result")
            }
            CodePhase::Reflected { accept: Some(value) } | CodePhase::Answered { answer: value } => {
                self.phase = CodePhase::Answered { answer: value.clone() };
                let think = format!("The computed value is {value}.");
                intent(Action::Answer, think, format!("\\boxed{{{value}}}"), "the result checks out: answer")
            }
        })
    }
}

/// The example of a code question: (`call`, `expected`) from `Example: \`f(x)\` returns \`y\``
/// (synthetic suite) or the first doctest `>>> f(x)` followed by its result line (HumanEval).
fn code_example(question: &str) -> Option<(String, String)> {
    if let Some(i) = question.find("Example: `") {
        let rest = &question[i + "Example: `".len()..];
        let (call, rest) = rest.split_once("` returns `")?;
        let expected = rest.split('`').next()?;
        return Some((call.to_string(), expected.to_string()));
    }
    let mut lines = question.lines();
    while let Some(line) = lines.next() {
        if let Some(call) = line.trim().strip_prefix(">>> ") {
            let expected = lines.next()?.trim();
            if expected.is_empty() || expected.starts_with(">>>") {
                return None;
            }
            return Some((call.trim().to_string(), expected.to_string()));
        }
    }
    None
}

/// Splits on commas outside brackets and quotes (`None` when the text has escapes).
fn split_top(s: &str) -> Option<Vec<&str>> {
    if s.contains('\\') {
        return None;
    }
    let (mut parts, mut depth, mut quote, mut start) = (Vec::new(), 0i32, None, 0);
    for (i, c) in s.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '\'' | '"' => quote = Some(c),
                '[' | '(' | '{' => depth += 1,
                ']' | ')' | '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            },
        }
    }
    parts.push(&s[start..]);
    Some(parts)
}

/// Edge inputs for a one-argument example call `f(arg)`: an empty and a one-element list, an
/// empty and a one-character string, or 1 and the example's number plus one.
fn edge_inputs(call: &str) -> Option<(String, Vec<String>)> {
    let open = call.find('(')?;
    let name = &call[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let arg = call[open + 1..].strip_suffix(')')?.trim();
    if split_top(arg)?.len() != 1 {
        return None;
    }
    let edges = match arg.chars().next()? {
        '[' => {
            let inner = arg.strip_prefix('[')?.strip_suffix(']')?;
            let first = split_top(inner)?[0].trim().to_string();
            if first.is_empty() {
                return None;
            }
            vec!["[]".to_string(), format!("[{first}]")]
        }
        q @ ('\'' | '"') => {
            let c = arg[1..].chars().next().filter(|c| c.is_ascii_alphanumeric())?;
            vec![format!("{q}{q}"), format!("{q}{c}{q}")]
        }
        '0'..='9' => vec!["1".to_string(), (arg.parse::<i64>().ok()? + 1).to_string()],
        _ => return None,
    };
    Some((name.to_string(), edges))
}

struct CodeExpert {
    program: String,
    buggy: Option<String>,
    example: Option<(String, String)>,
    /// The edge-input round still to do: (function name, argument literals).
    edge: Option<(String, Vec<String>)>,
    signature: String,
    buggy_first: bool,
    give_up: bool,
    runs: usize,
    rng: Rng,
    phase: CodePhase,
    last_program: String,
}

impl CodeExpert {
    fn new(task: &Task, sol: CodeSol, noise: &Noise, s: &Streams<'_>) -> CodeExpert {
        let give_up = sol.buggy_code.is_some() && s.rng("give_up").chance(noise.give_up);
        let buggy_first = sol.buggy_code.is_some() && s.rng("buggy_code").chance(noise.buggy_code);
        let entry = task.entry_point.clone().unwrap_or_else(|| "the function".to_string());
        let signature = task.question.split('`').nth(1).filter(|s| s.contains('(')).map(str::to_string).unwrap_or(entry);
        CodeExpert {
            program: sol.code.trim_end().to_string(),
            buggy: sol.buggy_code.map(|b| b.trim_end().to_string()),
            example: code_example(&task.question),
            edge: code_example(&task.question).and_then(|(call, _)| edge_inputs(&call)).filter(|_| s.rng("style").chance(SUBTASK_ROUND)),
            signature,
            buggy_first,
            give_up,
            runs: 0,
            rng: s.rng("phrasing"),
            phase: CodePhase::Start,
            last_program: String::new(),
        }
    }

    /// The program plus a check on the statement's example.
    fn with_example(&self, program: &str) -> String {
        match &self.example {
            Some((call, expected)) => format!(
                "{program}\n\n\n# check the example from the statement\n_result = {call}\nprint('example result:', repr(_result))\n\
try:\n    _expected = eval({})\nexcept Exception:\n    print('example passed: unknown')\nelse:\n    print('example passed:', _result == _expected)\n",
                serde_json::to_string(expected).unwrap_or_else(|_| "''".to_string())
            ),
            None => format!("{program}\n\nprint('defined without errors')\n"),
        }
    }

    fn decide(&mut self, steps: &[Step]) -> Result<Intent> {
        let phase = self.phase.clone();
        Ok(match phase {
            CodePhase::Start => {
                self.phase = CodePhase::Planned;
                let think = format!("I need to write `{}` and make sure it behaves as described.", self.signature);
                let plan = format!(
                    "1. Implement `{}` following the description.\n2. Run it on the example from the statement and check the result.\n3. Fix any mismatch, then submit the function.",
                    self.signature
                );
                intent(Action::Plan, think, plan, "the task starts with a plan")
            }
            CodePhase::Planned | CodePhase::Reflected { accept: None } => {
                let use_buggy = self.runs == 0 && (self.buggy_first || self.give_up);
                let program = match (&self.buggy, use_buggy) {
                    (Some(b), true) => b.clone(),
                    _ => self.program.clone(),
                };
                self.runs += 1;
                let think = if self.runs == 1 {
                    self.rng.pick(&["I will implement the function and test it on the example.", "A direct implementation, checked against the example from the statement."]).to_string()
                } else {
                    "Fix the implementation so that it follows the description exactly, and test again.".to_string()
                };
                self.last_program = program.clone();
                self.phase = CodePhase::Ran { buggy: use_buggy };
                intent(Action::Code, think, self.with_example(&program), "implement and test it")
            }
            CodePhase::Ran { buggy: _ } => {
                let obs = last_observation(steps);
                let ran = obs.starts_with("[EXECUTED]");
                let passed = ran && !obs.contains("example passed: False");
                if passed && self.runs == 1 && self.edge.is_some() {
                    let body = "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good\n\
The function runs and reproduces the example from the statement. Before submitting, try it on edge inputs.";
                    self.phase = CodePhase::SubNext;
                    return Ok(intent(Action::Reflection, "The run finished; compare it with the example.".to_string(), body.to_string(), "judge the test run"));
                }
                let (grades, text, accept) = if passed {
                    (
                        "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good",
                        if self.example.is_some() { "The function runs and reproduces the example from the statement." } else { "The function is defined and runs without errors." }.to_string(),
                        true,
                    )
                } else if self.give_up || self.runs >= 2 {
                    (
                        "information_conflict: Fair\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair",
                        "The example still does not come out right, but I will submit this version.".to_string(),
                        true,
                    )
                } else if ran {
                    (
                        "information_conflict: Fair\ntool_effectiveness: Good\ntrajectory_monitoring: Fair",
                        "The function returns the wrong result on the example: the implementation does not follow the description (an edge case or an off-by-one). It must be fixed.".to_string(),
                        false,
                    )
                } else {
                    (
                        "information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair",
                        "The program failed with an error; the implementation must be fixed.".to_string(),
                        false,
                    )
                };
                let think = if passed { "The run finished; compare it with the example.".to_string() } else { "The run does not match the example.".to_string() };
                self.phase = CodePhase::Reflected { accept: accept.then(|| self.last_program.clone()) };
                intent(Action::Reflection, think, format!("{grades}\n{text}"), "judge the test run")
            }
            CodePhase::SubNext => {
                let (name, args) = self.edge.take().expect("an edge round is planned");
                let code = format!(
                    "{}\n\n\n# edge inputs\nfor _arg in [{}]:\n    try:\n        print('{name}(' + repr(_arg) + ') ->', repr({name}(_arg)))\n    \
except Exception as _e:\n        print('{name}(' + repr(_arg) + ') raised', type(_e).__name__ + ':', _e)\n",
                    self.last_program,
                    args.join(", ")
                );
                self.phase = CodePhase::SubRan;
                intent(Action::Code, "Edge inputs: what does the function do with the smallest inputs?".to_string(), code, "try edge inputs")
            }
            CodePhase::SubRan => {
                let obs = last_observation(steps);
                let results: Vec<&str> = obs.lines().filter(|l| l.contains(") -> ") || l.contains(") raised ")).collect();
                let raised = results.iter().any(|l| l.contains(") raised "));
                let (grades, text) = if !obs.starts_with("[EXECUTED]") {
                    ("information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Fair", "The edge-input run did not finish; the example passes, so I submit the function.".to_string())
                } else if raised {
                    (
                        "information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Good",
                        format!("On edge inputs: {}. The statement does not define the input that raises, so the behaviour is acceptable.", results.join("; ")),
                    )
                } else {
                    ("information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good", format!("On edge inputs: {}. These agree with the description.", results.join("; ")))
                };
                self.phase = CodePhase::Reflected { accept: Some(self.last_program.clone()) };
                intent(Action::Reflection, "Check the edge results against the description.".to_string(), format!("{grades}\n{text}"), "judge the edge run")
            }
            CodePhase::Reflected { accept: Some(program) } | CodePhase::Answered { answer: program } => {
                self.phase = CodePhase::Answered { answer: program.clone() };
                let think = "Submit the function.".to_string();
                intent(Action::Answer, think, format!("```python\n{program}\n```"), "the function is done: answer")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_observations() {
        let obs = "Found 2 results:\n\n1. [Zentor X2](https://wiki.local/Zentor_X2)\nThe Zentor X2 is ...\n\n2. [Zentor X3](https://wiki.local/Zentor_X3)\nsnippet";
        assert_eq!(
            search_hits(obs),
            vec![
                ("Zentor X2".to_string(), "https://wiki.local/Zentor_X2".to_string()),
                ("Zentor X3".to_string(), "https://wiki.local/Zentor_X3".to_string())
            ]
        );
        let crawl = "Page 1 [https://w/a] Summary:\nAlpha text.\n\nPage 2 [https://w/b] Summary:\nBeta text.";
        assert_eq!(crawled_text(crawl, "https://w/a"), Some("Alpha text."));
        assert_eq!(crawled_text(crawl, "https://w/b"), Some("Beta text."));
        assert_eq!(crawled_text(crawl, "https://w/c"), None);
        assert_eq!(printed_value("[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\nx\n6205\n[STDOUT:END]").as_deref(), Some("6205"));
        assert_eq!(printed_value("[FAILED] Code exited with status 1.\n[STDOUT:BEGIN]\n1\n[STDOUT:END]"), None);
    }

    #[test]
    fn sub_task_rounds() {
        assert_eq!(setup_program("import math\nn = 14\nr = 0.75 / 100\ni = r / 12\nprint(n)\n").unwrap(), "# the quantities given in the statement\nn = 14\nr = 0.75 / 100\nprint('n =', n)\nprint('r =', r)");
        assert_eq!(setup_program("x, y = 1, 2\n"), None);
        assert_eq!(edge_inputs("f([20, 33, 68])"), Some(("f".to_string(), vec!["[]".to_string(), "[20]".to_string()])));
        assert_eq!(edge_inputs("f(['a, b', 'c'])"), Some(("f".to_string(), vec!["[]".to_string(), "['a, b']".to_string()])));
        assert_eq!(edge_inputs("f('hello world')"), Some(("f".to_string(), vec!["''".to_string(), "'h'".to_string()])));
        assert_eq!(edge_inputs("f(27)"), Some(("f".to_string(), vec!["1".to_string(), "28".to_string()])));
        assert_eq!(edge_inputs("f([1], 2)"), None);
        assert_eq!(edge_inputs("f('a\\'b')"), None);
    }

    #[test]
    fn finds_code_examples() {
        assert_eq!(
            code_example("Write `f(xs)`.\n\nExample: `f([1, 2])` returns `[2, 1]`."),
            Some(("f([1, 2])".to_string(), "[2, 1]".to_string()))
        );
        assert_eq!(
            code_example("```python\ndef g(a):\n    \"\"\"\n    >>> g([1.0, 2.0], 0.5)\n    False\n    \"\"\"\n```"),
            Some(("g([1.0, 2.0], 0.5)".to_string(), "False".to_string()))
        );
        assert_eq!(code_example("no example"), None);
    }

    #[test]
    fn streams_differ_by_purpose_and_task_and_are_uniform_enough() {
        let s = Streams { seed: 1, task_id: "t" };
        assert_ne!(s.rng("a").next_u64(), s.rng("b").next_u64());
        assert_ne!(s.rng("a").next_u64(), Streams { seed: 1, task_id: "u" }.rng("a").next_u64());
        let mut r = s.rng("x");
        let hits = (0..10_000).filter(|_| r.chance(0.3)).count();
        assert!((2_800..3_200).contains(&hits), "{hits}");
    }

    #[test]
    fn noise_rates_are_checked() {
        assert!(ScriptedBackend::new(0, Noise { give_up: 1.5, ..Noise::default() }).unwrap_err().to_string().contains("--noise-give-up"));
        assert!(ScriptedBackend::new(0, Noise::default()).is_ok());
    }
}
