//! The `multihop` suite: a synthetic world, its corpus, and 2–5 hop questions.
//!
//! # World
//! Entities: countries, cities, universities, companies, people and products, with invented
//! pronounceable names ([`super::names`]). Functional relations (each entity has at most one
//! value of each):
//!
//! | relation | from → to |
//! |---|---|
//! | `born_in` | person → city |
//! | `studied_at` | person → university |
//! | `works_for` | person → company |
//! | `mentor` | person → person |
//! | `located_in` | city → country, university → city |
//! | `capital` | country → city |
//! | `headquartered_in` | company → city |
//! | `founded_by` | company → person |
//! | `ceo` | company → person |
//! | `made_by` | product → company |
//! | `designed_by` | product → person |
//! | `mayor` | city → person |
//! | `president` | country → person |
//!
//! The world is sized from `n` (about `0.8 n` entities for `n = 1000`, never fewer than ~150).
//!
//! # Corpus
//! One `entity` page per entity: url `https://wiki.local/<Title_With_Underscores>`, title = the
//! entity's name, text = natural sentences stating its relations (and some inverse ones, e.g. a
//! city lists people born there), plus filler facts. `distractor` pages: namesakes
//! (`"Ardena Varos (painter)"`, `"Kelmar (river)"`, with different facts), confusable spellings
//! (`"Ardena Varis"`, `"Vellox Systems"` next to `"Vellox Dynamics"`, `"Zentor X3"` next to
//! `"Zentor X2"`), and event pages that mention entities in passing. BM25 search therefore
//! sometimes ranks a wrong page first. The corpus order is shuffled (deterministically).
//!
//! # Questions
//! A question follows a random walk of 2–5 relations from a start entity, never revisiting an
//! entity, rendered as nested noun phrases: "In which country is the city where the founder of the
//! company that makes the Zentor X2 was born?" (4 hops). `answers[0]` is the exact name of the
//! entity reached (a country also has its official name as an alias, which its page states).
//! `hops` = number of relations, `difficulty` = easy (2) / medium (3) / hard (4–5).
//!
//! # Solution format (`Task::solution`, JSON of [`MultihopSolution`])
//! ```json
//! {"hops": [
//!    {"subject": "Zentor X2",            // entity whose page answers this hop (hop 0: named in the question)
//!     "relation": "made_by",             // relation followed (table above)
//!     "query": "Zentor X2 manufacturer", // a good web_search query for this hop
//!     "url": "https://wiki.local/Zentor_X2", // the subject's page, which holds the fact
//!     "evidence": "The Zentor X2 is a smartphone made by Vellox Dynamics.", // a sentence of that page's text, verbatim
//!     "entity": "Vellox Dynamics",       // the answer of this hop (= next hop's subject)
//!     "distractors": ["https://wiki.local/Zentor_X3"]} // distractor pages about confusable/namesake/mentioned subjects
//!    , ...],
//!  "answer": "Veltaria"}                 // = last hop's entity = answers[0]
//! ```
//! Invariants (tested on every task of generated sets): hop `i+1`'s `url` is the page titled hop
//! `i`'s `entity`; each `evidence` occurs verbatim in the text of the page at `url` and contains
//! `entity`; the last `entity` equals `answer` and `answers[0]`; `hops.len() == hops`.

use serde::{Deserialize, Serialize};

/// One hop of a multihop solution (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    pub subject: String,
    pub relation: String,
    pub query: String,
    pub url: String,
    pub evidence: String,
    pub entity: String,
    pub distractors: Vec<String>,
}

/// `Task::solution` of a multihop task (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultihopSolution {
    pub hops: Vec<Hop>,
    pub answer: String,
}

/// Page URL of a title: `https://wiki.local/<Title_With_Underscores>`.
pub fn url_for(title: &str) -> String {
    format!("https://wiki.local/{}", title.replace(' ', "_"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Person,
    City,
    Country,
    Company,
    University,
    Product,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Rel {
    BornIn,
    StudiedAt,
    WorksFor,
    Mentor,
    LocatedIn,
    Capital,
    HeadquarteredIn,
    FoundedBy,
    Ceo,
    MadeBy,
    DesignedBy,
    Mayor,
    President,
}

impl Rel {
    fn as_str(self) -> &'static str {
        match self {
            Rel::BornIn => "born_in",
            Rel::StudiedAt => "studied_at",
            Rel::WorksFor => "works_for",
            Rel::Mentor => "mentor",
            Rel::LocatedIn => "located_in",
            Rel::Capital => "capital",
            Rel::HeadquarteredIn => "headquartered_in",
            Rel::FoundedBy => "founded_by",
            Rel::Ceo => "ceo",
            Rel::MadeBy => "made_by",
            Rel::DesignedBy => "designed_by",
            Rel::Mayor => "mayor",
            Rel::President => "president",
        }
    }

    /// Words added to the subject's name to make a search query.
    fn query_words(self, from: Kind) -> &'static str {
        match (self, from) {
            (Rel::BornIn, _) => "born",
            (Rel::StudiedAt, _) => "studied university",
            (Rel::WorksFor, _) => "works for company",
            (Rel::Mentor, _) => "mentored by",
            (Rel::LocatedIn, Kind::University) => "location",
            (Rel::LocatedIn, _) => "country",
            (Rel::Capital, _) => "capital",
            (Rel::HeadquarteredIn, _) => "headquarters",
            (Rel::FoundedBy, _) => "founder",
            (Rel::Ceo, _) => "chief executive",
            (Rel::MadeBy, _) => "manufacturer",
            (Rel::DesignedBy, _) => "designer",
            (Rel::Mayor, _) => "mayor",
            (Rel::President, _) => "president",
        }
    }
}

#[derive(Debug, Clone)]
struct Entity {
    kind: Kind,
    name: String,
    /// Extra accepted answers (stated on the entity's page).
    aliases: Vec<String>,
    female: bool,
    /// Occupation / industry / category / university type.
    desc: String,
    /// Birth / founding / release year.
    year: i32,
    rels: Vec<(Rel, usize)>,
    /// The sentence of this entity's page stating each outgoing relation.
    evidence: Vec<(Rel, String)>,
    page: usize,
    /// Distractor pages about confusable/namesake/mentioning subjects.
    confusers: Vec<usize>,
    /// Title of the namesake distractor, its descriptor, and whether this page has a hatnote
    /// pointing to it.
    namesake: Option<(String, String, bool)>,
    /// Extra per-entity number (company: year its CEO took office; person: year they took
    /// office as mayor or president).
    year2: i32,
}

impl Entity {
    fn new(kind: Kind, name: String) -> Entity {
        Entity {
            kind,
            name,
            aliases: Vec::new(),
            female: false,
            desc: String::new(),
            year: 0,
            rels: Vec::new(),
            evidence: Vec::new(),
            page: usize::MAX,
            confusers: Vec::new(),
            namesake: None,
            year2: 0,
        }
    }

    fn get(&self, r: Rel) -> Option<usize> {
        self.rels.iter().find(|(x, _)| *x == r).map(|(_, t)| *t)
    }

    fn set(&mut self, r: Rel, t: usize) {
        self.rels.retain(|(x, _)| *x != r);
        self.rels.push((r, t));
    }

    fn evidence_for(&self, r: Rel) -> Option<&str> {
        self.evidence.iter().find(|(x, _)| *x == r).map(|(_, s)| s.as_str())
    }

    /// How the entity is referred to inside a sentence ("the Zentor X2" for products).
    fn np(&self) -> String {
        if self.kind == Kind::Product {
            format!("the {}", self.name)
        } else {
            self.name.clone()
        }
    }

    fn pronouns(&self) -> (&'static str, &'static str, &'static str) {
        if self.female {
            ("She", "she", "her")
        } else {
            ("He", "he", "his")
        }
    }
}

mod distractors;
mod inverse;
mod pages;
mod questions;
mod vocabulary;
mod world;

pub(crate) use questions::generate;
