//! The multihop expert: searches, crawls each hop's subject page and reads the fact off it.

use anyhow::Result;
use coa_schemas::rows::Task;
use coa_tasks::{Hop, MultihopSolution};

use super::mind::{intent, last_observation, Intent};
use super::rng::{Rng, Streams};
use super::Noise;
use crate::action::{Action, Step};

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

/// What a crawl of `subject`'s page looks for, in the words its pages state the relation with
/// (the crawl tool summarizes a page for the agent's last thought, `coa_tools::crawl`, so the
/// thought names the fact as a page would: "born", "degree", "trained", "head office").
fn look_for(relation: &str, subject: &str) -> String {
    match relation {
        "born_in" => format!("where {subject} was born"),
        "studied_at" => format!("where {subject} studied and took a degree"),
        "works_for" => format!("which company {subject} works for or is employed by"),
        "mentor" => format!("who mentored or trained {subject}"),
        "located_in" => format!("where {subject} is located"),
        "capital" => format!("the capital of {subject}"),
        "headquartered_in" => format!("where {subject} is headquartered (its head office)"),
        "founded_by" => format!("who founded {subject}"),
        "ceo" => format!("who is the chief executive of {subject}"),
        "made_by" => format!("who made, manufactured or released {subject}"),
        "designed_by" => format!("who designed {subject}"),
        "mayor" => format!("who is the mayor of {subject}"),
        "president" => format!("who is the president of {subject}"),
        other => format!("the {} of {subject}", relation_phrase(other)),
    }
}

/// `[title](url)` hits of a rendered search observation.
pub(super) fn search_hits(observation: &str) -> Vec<(String, String)> {
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
pub(super) fn crawled_text<'a>(observation: &'a str, url: &str) -> Option<&'a str> {
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

pub(super) struct WebExpert {
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
    pub(super) fn new(task: &Task, sol: MultihopSolution, noise: &Noise, s: &Streams<'_>) -> WebExpert {
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

    pub(super) fn decide(&mut self, steps: &[Step]) -> Result<Intent> {
        let phase = self.phase.clone();
        Ok(match phase {
            WebPhase::Start => {
                let n = self.n();
                // The relations are read off the question from its innermost name outward before
                // they are counted, so a student learns to list them rather than to guess a count.
                let unnested = std::iter::once(self.sol.hops[0].subject.as_str())
                    .chain(self.sol.hops.iter().map(|h| relation_phrase(&h.relation)))
                    .collect::<Vec<_>>()
                    .join(" -> ");
                let think = format!(
                    "{} Unnesting it from the innermost name outward: {unnested}. That is {n} relations. I will resolve them one at a time: each answer names the entity to look up next.",
                    self.rng.pick(&["Let me break the question down.", "This is a multi-hop question.", "I need to unpack the question."]),
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
                    let goal = look_for(&self.hop(hop).relation, &subject);
                    let think = format!("Wiki pages are named after their subject, so {subject}'s page is {url}. I will open it to read {goal}.");
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
            let think = format!("Step {}: {}. Its wiki page is {url}; I will read it directly.", h + 1, look_for(&self.hop(h).relation, &subject));
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
                let think = format!("The result \"{}\" looks like the page about {subject}; it should say {}.", title_of(&wrong), look_for(&self.hop(h).relation, &subject));
                self.phase = WebPhase::Crawled { hop: h, url: correct, crawled: wrong.clone() };
                return intent(Action::CrawlPage, think, wrong, "read the most promising result");
            }
        }
        let found = hits.iter().any(|(_, u)| *u == correct);
        if found && self.pair_crawl[h] {
            if let Some((_, other)) = hits.iter().find(|(_, u)| *u != correct) {
                let think = format!("Two results may say {}: its own page and \"{}\". I will read both.", look_for(&self.hop(h).relation, &subject), title_of(other));
                let urls = format!("{correct}|{other}");
                self.phase = WebPhase::Crawled { hop: h, url: correct, crawled: urls.clone() };
                return intent(Action::CrawlPage, think, urls, "read the two most promising results");
            }
        }
        let think = if found {
            format!("The result \"{subject}\" is the page of {subject} itself; it should say {}.", look_for(&self.hop(h).relation, &subject))
        } else {
            format!("None of the results is {subject}'s own page. Wiki pages are named after their subject, so I will open {correct} to read {}.", look_for(&self.hop(h).relation, &subject))
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
