//! Questions: random chains of relations rendered as nested noun phrases, their solution, and
//! [`generate`], which makes the whole suite.

use std::collections::HashSet;

use anyhow::{bail, Result};
use coa_schemas::rows::Task;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::pages::write_corpus;
use super::vocabulary::{idx, pick};
use super::world::{build_world, World};
use super::{Hop, Kind, MultihopSolution, Rel};
use crate::synth::{base_task, difficulty, Generated, Split, Suite};

/// Noun phrase for "the value of `r` applied to `x`" (x is an NP of an entity of kind `from`).
/// When `x` is itself a nested phrase, only forms that end with `x` are used ("the birthplace of
/// X", not "the city where X was born"), so that verbs do not pile up at the end.
fn rel_np<R: Rng>(rng: &mut R, r: Rel, from: Kind, x: &str, nested: bool) -> String {
    let forms: &[&str] = match (r, from) {
        (Rel::BornIn, _) => &["the city where {} was born", "the birthplace of {}"],
        (Rel::StudiedAt, _) => &["the university where {} studied", "the alma mater of {}"],
        (Rel::WorksFor, _) => &["the company {} works for", "the employer of {}"],
        (Rel::Mentor, _) => &["the mentor of {}", "the person who mentored {}"],
        (Rel::LocatedIn, Kind::University) => &["the city where {} is located", "the city that is home to {}"],
        (Rel::LocatedIn, _) => &["the country where {} is located", "the country in which {} lies", "the country that contains {}"],
        (Rel::Capital, _) => &["the capital of {}", "the capital city of {}"],
        (Rel::HeadquarteredIn, _) => &["the city where {} is headquartered", "the headquarters city of {}", "the city that hosts the headquarters of {}"],
        (Rel::FoundedBy, _) => &["the founder of {}", "the person who founded {}"],
        (Rel::Ceo, _) => &["the chief executive of {}", "the CEO of {}"],
        (Rel::MadeBy, _) => &["the company that makes {}", "the maker of {}", "the manufacturer of {}"],
        (Rel::DesignedBy, _) => &["the designer of {}", "the person who designed {}"],
        (Rel::Mayor, _) => &["the mayor of {}"],
        (Rel::President, _) => &["the president of {}", "the head of state of {}"],
    };
    let forms: Vec<&str> = forms.iter().copied().filter(|f| !nested || f.ends_with("{}")).collect();
    forms[idx(rng, forms.len())].replace("{}", x)
}

/// The question asking for `r` of `x`.
fn rel_question<R: Rng>(rng: &mut R, r: Rel, from: Kind, x: &str) -> String {
    let forms: &[&str] = match (r, from) {
        (Rel::BornIn, _) => &["In which city was {} born?", "What is the birthplace of {}?"],
        (Rel::StudiedAt, _) => &["At which university did {} study?", "Which university did {} attend?"],
        (Rel::WorksFor, _) => &["Which company does {} work for?", "Who is the employer of {}?"],
        (Rel::Mentor, _) => &["Who mentored {}?", "Who was the mentor of {}?"],
        (Rel::LocatedIn, Kind::University) => &["In which city is {} located?", "Which city is home to {}?"],
        (Rel::LocatedIn, _) => &["In which country is {}?", "In which country is {} located?"],
        (Rel::Capital, _) => &["What is the capital of {}?", "Which city is the capital of {}?"],
        (Rel::HeadquarteredIn, _) => &["In which city is {} headquartered?", "Where is {} headquartered? Give the city."],
        (Rel::FoundedBy, _) => &["Who founded {}?", "Who is the founder of {}?"],
        (Rel::Ceo, _) => &["Who is the chief executive of {}?", "Who is the CEO of {}?"],
        (Rel::MadeBy, _) => &["Which company makes {}?", "Who manufactures {}?"],
        (Rel::DesignedBy, _) => &["Who designed {}?", "Who is the designer of {}?"],
        (Rel::Mayor, _) => &["Who is the mayor of {}?"],
        (Rel::President, _) => &["Who is the president of {}?", "Who is the head of state of {}?"],
    };
    pick(rng, forms).replace("{}", x)
}

fn render_question<R: Rng>(rng: &mut R, w: &World, chain: &[usize], rels: &[Rel]) -> String {
    let h = rels.len();
    // NPs[k] names chain[k]
    let mut np = w.np(chain[0]);
    let mut nps = vec![np.clone()];
    for k in 0..h - 1 {
        np = rel_np(rng, rels[k], w.ents[chain[k]].kind, &np, k > 0);
        nps.push(np.clone());
    }
    let last = rels[h - 1];
    let from = w.ents[chain[h - 1]].kind;
    // compressed endings: "In which country was X born?"
    if h >= 2 && last == Rel::LocatedIn && from == Kind::City && rng.random_bool(0.5) {
        let prev = rels[h - 2];
        let y = &nps[h - 2];
        if prev == Rel::BornIn {
            return format!("In which country was {y} born?");
        }
        if prev == Rel::HeadquarteredIn {
            return format!("In which country is {y} headquartered?");
        }
    }
    rel_question(rng, last, from, &nps[h - 1])
}

fn make_task(rng: &mut ChaCha8Rng, w: &World, chain: &[usize], rels: &[Rel], split: Split, i: usize) -> Task {
    let h = rels.len();
    let question = render_question(rng, w, chain, rels);
    let mut hops = Vec::with_capacity(h);
    for k in 0..h {
        let s = &w.ents[chain[k]];
        let t = &w.ents[chain[k + 1]];
        let page = &w.pages[s.page];
        hops.push(Hop {
            subject: s.name.clone(),
            relation: rels[k].as_str().to_string(),
            query: format!("{} {}", s.name, rels[k].query_words(s.kind)),
            url: page.url.clone(),
            evidence: s.evidence_for(rels[k]).expect("evidence for every relation").to_string(),
            entity: t.name.clone(),
            distractors: s.confusers.iter().map(|&p| w.pages[p].url.clone()).collect(),
        });
    }
    let target = &w.ents[chain[h]];
    let solution = MultihopSolution { hops, answer: target.name.clone() };
    let mut task = base_task(Suite::Multihop, split, i);
    task.question = question;
    task.answers = std::iter::once(target.name.clone()).chain(target.aliases.iter().cloned()).collect();
    task.hops = Some(h as i32);
    task.difficulty = Some(difficulty(match h {
        2 => 0,
        3 => 1,
        _ => 2,
    }));
    task.solution = Some(serde_json::to_string(&solution).expect("solution serialises"));
    task
}

pub(crate) fn generate(rng: &mut ChaCha8Rng, n: usize, split: Split) -> Result<Generated> {
    let mut w = build_world(rng, n, split);
    write_corpus(rng, &mut w);
    let mut seen: HashSet<(usize, Vec<Rel>)> = HashSet::new();
    let mut tasks = Vec::with_capacity(n);
    let mut attempts = 0usize;
    // hop count of the task being drawn (0 = draw one): kept across retries so that long chains,
    // which dead-end more often, are not under-represented
    let mut h = 0usize;
    while tasks.len() < n {
        attempts += 1;
        if attempts > 1000 + n * 200 {
            bail!("could not draw {n} distinct multihop chains (world too small?)");
        }
        if h == 0 {
            h = rng.random_range(2..=5usize);
        }
        let start = idx(rng, w.ents.len());
        let mut chain = vec![start];
        let mut rels = Vec::with_capacity(h);
        while rels.len() < h {
            let cur = &w.ents[*chain.last().expect("non-empty")];
            let opts: Vec<(Rel, usize)> = cur.rels.iter().copied().filter(|(_, t)| !chain.contains(t)).collect();
            if opts.is_empty() {
                break;
            }
            let (r, t) = opts[idx(rng, opts.len())];
            rels.push(r);
            chain.push(t);
        }
        if rels.len() < h || !seen.insert((start, rels.clone())) {
            continue;
        }
        let i = tasks.len();
        tasks.push(make_task(rng, &w, &chain, &rels, split, i));
        h = 0;
    }
    let mut corpus = std::mem::take(&mut w.pages);
    corpus.shuffle(rng);
    Ok(Generated { tasks, corpus })
}
