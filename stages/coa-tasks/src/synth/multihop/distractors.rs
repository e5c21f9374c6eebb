//! Distractor planning: which namesake, confusable and event pages the corpus has.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::vocabulary::{idx, pick, EVENT_TYPES, INDUSTRIES, NAMESAKE_DESCS};
use super::world::{product_code, World};
use super::Kind;

pub(super) enum Distractor {
    /// Same name as entity, different person/thing (title has a descriptor).
    Namesake { of: usize },
    /// A confusable name for an entity.
    Confusable { of: usize, title: String },
    /// An event page mentioning some entities.
    Event { city: usize, year: i32, title: String, mentions: Vec<usize> },
}

pub(super) fn plan_distractors(rng: &mut ChaCha8Rng, w: &mut World) -> Vec<Distractor> {
    let mut out = Vec::new();
    // namesakes: people and cities
    for p in w.people.clone() {
        if rng.random_bool(0.15) {
            let desc = loop {
                let d = pick(rng, NAMESAKE_DESCS);
                if d != w.ents[p].desc {
                    break d;
                }
            };
            let title = format!("{} ({desc})", w.ents[p].name);
            if w.titles.insert(title.clone()) {
                w.ents[p].namesake = Some((title, desc.to_string(), rng.random_bool(0.4)));
                out.push(Distractor::Namesake { of: p });
            }
        }
    }
    for c in w.cities.clone() {
        if rng.random_bool(0.15) {
            let title = format!("{} (river)", w.ents[c].name);
            if w.titles.insert(title.clone()) {
                w.ents[c].namesake = Some((title, "river".to_string(), rng.random_bool(0.4)));
                out.push(Distractor::Namesake { of: c });
            }
        }
    }
    // confusable spellings
    for p in w.people.clone() {
        if rng.random_bool(0.06) {
            let (first, last) = w.ents[p].name.split_once(' ').expect("two-word person name");
            let (first, last) = (first.to_string(), last.to_string());
            if let Some(v) = w.names.confusable(rng, &last) {
                let title = format!("{first} {v}");
                if w.titles.insert(title.clone()) {
                    out.push(Distractor::Confusable { of: p, title });
                }
            }
        }
    }
    for c in w.companies.clone() {
        if rng.random_bool(0.15) {
            let (word, suffix) = w.ents[c].name.split_once(' ').expect("two-word company name");
            let (word, suffix) = (word.to_string(), suffix.to_string());
            let title = if rng.random_bool(0.5) {
                let s2 = loop {
                    let s = INDUSTRIES[idx(rng, INDUSTRIES.len())].0;
                    if s != suffix {
                        break s;
                    }
                };
                Some(format!("{word} {s2}"))
            } else {
                w.names.confusable(rng, &word).map(|v| format!("{v} {suffix}"))
            };
            if let Some(title) = title {
                if w.titles.insert(title.clone()) {
                    out.push(Distractor::Confusable { of: c, title });
                }
            }
        }
    }
    for pr in w.products.clone() {
        if rng.random_bool(0.15) {
            let word = w.ents[pr].name.split(' ').next().expect("product word").to_string();
            let title = format!("{word} {}", product_code(rng));
            if w.titles.insert(title.clone()) {
                out.push(Distractor::Confusable { of: pr, title });
            }
        }
    }
    for c in w.cities.clone() {
        if rng.random_bool(0.06) {
            let name = w.ents[c].name.clone();
            let word = name.split(' ').find(|s| *s != "Port" && *s != "Falls").expect("city word").to_string();
            if let Some(v) = w.names.confusable(rng, &word) {
                let title = name.replace(&word, &v);
                if w.titles.insert(title.clone()) {
                    out.push(Distractor::Confusable { of: c, title });
                }
            }
        }
    }
    // events that mention people, companies and products in passing
    let mut mentionable: Vec<usize> = Vec::new();
    for &i in w.people.iter().chain(&w.companies).chain(&w.products) {
        if rng.random_bool(0.10) {
            mentionable.push(i);
        }
    }
    mentionable.shuffle(rng);
    for group in mentionable.chunks(2) {
        let city = w.other(rng, Kind::City, None);
        let year = rng.random_range(1990..=2024);
        let title = format!("{year} {} {}", w.ents[city].name, pick(rng, EVENT_TYPES));
        if w.titles.insert(title.clone()) {
            out.push(Distractor::Event { city, year, title, mentions: group.to_vec() });
        }
    }
    out
}
