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

use std::collections::HashSet;

use anyhow::{bail, Result};
use coa_schemas::rows::{CorpusPage, Task};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::names::NameGen;
use super::{base_task, difficulty, Generated, Split, Suite};

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

// ---- vocabulary -------------------------------------------------------------------------------

const OCCUPATIONS: &[&str] = &[
    "engineer", "economist", "chemist", "architect", "journalist", "physician", "historian", "lawyer",
    "mathematician", "geologist", "civil servant", "accountant", "biologist", "urban planner",
];
const NAMESAKE_DESCS: &[&str] = &["painter", "footballer", "poet", "sculptor", "cyclist", "singer", "novelist", "chess player"];
const FIELDS: &[&str] = &[
    "economics", "physics", "chemistry", "law", "history", "mechanical engineering", "computer science",
    "architecture", "medicine", "mathematics", "philosophy", "biology",
];
const TOPICS: &[&str] = &[
    "renewable energy", "public transport", "water management", "early education", "trade policy",
    "materials science", "local history", "medical imaging", "food safety", "urban housing",
];
const HOBBIES: &[&str] = &["sailing", "chess", "mountain hiking", "photography", "gardening", "amateur astronomy", "cycling"];
const CITY_FEATURES: &[&str] = &[
    "harbour", "old town", "annual music festival", "textile mills", "botanical garden", "cathedral", "stone bridges",
    "covered markets", "wine cellars", "glassworks",
];
const CITY_ADJ: &[&str] = &["coastal", "mountain", "river", "industrial", "historic", "university", "market"];
const DIRECTIONS: &[&str] = &["north", "south", "east", "west", "centre", "north-east", "south-west"];
const PRODUCT_FEATURES: &[&str] = &["battery life", "low price", "build quality", "simple design", "durability", "speed", "comfort"];
const COUNTRY_FORMS: &[&str] = &["Republic of", "Kingdom of", "Federation of", "Commonwealth of", "Union of"];
const UNIV_FORMS: &[&str] = &["University of {}", "{} University", "{} Institute of Technology", "{} College", "{} State University"];
const EVENT_TYPES: &[&str] = &["Trade Fair", "Summit", "Innovation Forum", "Film Festival", "Science Expo", "Charity Gala"];

/// (name suffix, industry, product categories)
const INDUSTRIES: &[(&str, &str, &[&str])] = &[
    ("Dynamics", "robotics", &["industrial robot", "delivery drone", "robot vacuum"]),
    ("Systems", "software", &["database", "office suite", "operating system"]),
    ("Electronics", "consumer electronics", &["smartphone", "laptop", "smartwatch", "tablet"]),
    ("Motors", "automotive", &["electric car", "motorcycle", "pickup truck"]),
    ("Foods", "food", &["breakfast cereal", "energy drink", "snack bar"]),
    ("Apparel", "clothing", &["running shoe", "raincoat", "backpack"]),
    ("Aerospace", "aerospace", &["passenger jet", "satellite", "helicopter"]),
    ("Pharma", "pharmaceutical", &["pain reliever", "allergy tablet", "cough syrup"]),
    ("Instruments", "musical instrument", &["digital piano", "electric guitar", "synthesizer"]),
    ("Biolabs", "biotechnology", &["gene sequencer", "lab centrifuge", "test kit"]),
];

fn pick<'a, R: Rng, T: ?Sized>(rng: &mut R, xs: &'a [&'a T]) -> &'a T {
    xs[rng.random_range(0..xs.len())]
}

fn idx<R: Rng>(rng: &mut R, len: usize) -> usize {
    rng.random_range(0..len)
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u', 'A', 'E', 'I', 'O', 'U']) {
        "an"
    } else {
        "a"
    }
}

/// "A", "A and B", "A, B and C".
fn list_and(items: &[String]) -> String {
    match items.len() {
        0 => String::new(),
        1 => items[0].clone(),
        _ => format!("{} and {}", items[..items.len() - 1].join(", "), items[items.len() - 1]),
    }
}

/// Up to `k` distinct items of `xs`, in a random order.
fn sample<R: Rng>(rng: &mut R, xs: &[usize], k: usize) -> Vec<usize> {
    let mut v = xs.to_vec();
    v.shuffle(rng);
    v.truncate(k);
    v
}

// ---- world ------------------------------------------------------------------------------------

struct World {
    ents: Vec<Entity>,
    pages: Vec<CorpusPage>,
    titles: HashSet<String>,
    names: NameGen,
    people: Vec<usize>,
    cities: Vec<usize>,
    countries: Vec<usize>,
    companies: Vec<usize>,
    univs: Vec<usize>,
    products: Vec<usize>,
}

impl World {
    fn add(&mut self, e: Entity) -> usize {
        let k = e.kind;
        let i = self.ents.len();
        assert!(self.titles.insert(e.name.clone()), "duplicate title {}", e.name);
        self.ents.push(e);
        match k {
            Kind::Person => self.people.push(i),
            Kind::City => self.cities.push(i),
            Kind::Country => self.countries.push(i),
            Kind::Company => self.companies.push(i),
            Kind::University => self.univs.push(i),
            Kind::Product => self.products.push(i),
        }
        i
    }

    fn name(&self, i: usize) -> &str {
        &self.ents[i].name
    }

    fn np(&self, i: usize) -> String {
        self.ents[i].np()
    }

    fn add_page(&mut self, title: String, text: String, kind: &str) -> usize {
        let i = self.pages.len();
        self.pages.push(CorpusPage { url: url_for(&title), title, text, kind: kind.to_string() });
        i
    }

    /// A fresh person name (unused title) of the split.
    fn fresh_person_name<R: Rng>(&mut self, rng: &mut R) -> (String, bool) {
        loop {
            let female = rng.random_bool(0.5);
            let first = self.names.first_name(rng, female, false);
            let last = self.names.word(rng, true);
            let name = format!("{first} {last}");
            if !self.titles.contains(&name) {
                return (name, female);
            }
        }
    }

    fn ents_of(&self, k: Kind) -> &[usize] {
        match k {
            Kind::Person => &self.people,
            Kind::City => &self.cities,
            Kind::Country => &self.countries,
            Kind::Company => &self.companies,
            Kind::University => &self.univs,
            Kind::Product => &self.products,
        }
    }

    /// A random entity of kind `k` other than `not`.
    fn other<R: Rng>(&self, rng: &mut R, k: Kind, not: Option<usize>) -> usize {
        let xs = self.ents_of(k);
        loop {
            let x = xs[idx(rng, xs.len())];
            if Some(x) != not || xs.len() == 1 {
                return x;
            }
        }
    }
}

fn build_world(rng: &mut ChaCha8Rng, n: usize, split: Split) -> World {
    let u = n.max(40);
    let n_countries = (u / 50).clamp(4, 30);
    let n_cities = n_countries * 4;
    let n_univs = (u / 30).max(4);
    let n_companies = (u / 8).max(6);
    let n_people = (u / 3).max(n_companies * 2 + n_cities + n_countries + 10);
    let n_products = (u / 5).max(8);

    let mut w = World {
        ents: Vec::new(),
        pages: Vec::new(),
        titles: HashSet::new(),
        names: NameGen::new(split),
        people: Vec::new(),
        cities: Vec::new(),
        countries: Vec::new(),
        companies: Vec::new(),
        univs: Vec::new(),
        products: Vec::new(),
    };

    // countries
    for _ in 0..n_countries {
        let name = w.names.word(rng, true);
        let mut e = Entity::new(Kind::Country, name.clone());
        e.aliases.push(format!("{} {}", pick(rng, COUNTRY_FORMS), name));
        e.year = rng.random_range(1800..=1990);
        w.add(e);
    }
    // cities: city i lies in country i % n_countries; the first city of each country is its capital
    for i in 0..n_cities {
        let word = w.names.word(rng, true);
        let name = match rng.random_range(0..10) {
            0 => format!("Port {word}"),
            1 => format!("{word} Falls"),
            _ => word,
        };
        let mut e = Entity::new(Kind::City, name);
        e.year = rng.random_range(900..=1900);
        let country = w.countries[i % n_countries];
        e.set(Rel::LocatedIn, country);
        let c = w.add(e);
        if i < n_countries {
            w.ents[country].set(Rel::Capital, c);
        }
    }
    // universities
    for _ in 0..n_univs {
        let word = w.names.word(rng, true);
        let name = pick(rng, UNIV_FORMS).replace("{}", &word);
        let mut e = Entity::new(Kind::University, name);
        e.desc = if rng.random_bool(0.6) { "public" } else { "private" }.to_string();
        e.year = rng.random_range(1600..=1980);
        let city = w.other(rng, Kind::City, None);
        e.set(Rel::LocatedIn, city);
        w.add(e);
    }
    // people
    for i in 0..n_people {
        let (name, female) = w.fresh_person_name(rng);
        let mut e = Entity::new(Kind::Person, name);
        e.female = female;
        e.desc = pick(rng, OCCUPATIONS).to_string();
        e.year = rng.random_range(1935..=1995);
        e.set(Rel::BornIn, w.other(rng, Kind::City, None));
        if rng.random_bool(0.85) {
            e.set(Rel::StudiedAt, w.other(rng, Kind::University, None));
        }
        if i > 0 && rng.random_bool(0.4) {
            // mentors come earlier in the list, so mentoring never cycles
            let m = w.people[idx(rng, w.people.len())];
            e.set(Rel::Mentor, m);
        }
        w.add(e);
    }
    // companies, each founded by a distinct person; most have a distinct CEO
    let mut staff = w.people.clone();
    staff.shuffle(rng);
    let mut staff = staff.into_iter();
    for _ in 0..n_companies {
        let (suffix, industry, _) = INDUSTRIES[idx(rng, INDUSTRIES.len())];
        let word = w.names.word(rng, true);
        let mut e = Entity::new(Kind::Company, format!("{word} {suffix}"));
        e.desc = industry.to_string();
        let founder = staff.next().expect("enough people for founders");
        e.year = (w.ents[founder].year + rng.random_range(25..=45)).min(2020);
        e.set(Rel::FoundedBy, founder);
        e.set(Rel::HeadquarteredIn, w.other(rng, Kind::City, None));
        let c = w.add(e);
        w.ents[founder].set(Rel::WorksFor, c);
        if rng.random_bool(0.6) {
            let ceo = staff.next().expect("enough people for CEOs");
            let lo = w.ents[c].year.max(w.ents[ceo].year + 30);
            let since = rng.random_range(lo..=lo.max(2024));
            w.ents[c].set(Rel::Ceo, ceo);
            w.ents[c].year2 = since;
            w.ents[ceo].set(Rel::WorksFor, c);
        }
    }
    // mayors of most cities, a president for every country (people not otherwise in office)
    for c in w.cities.clone() {
        if rng.random_bool(0.6) {
            let m = staff.next().expect("enough people for mayors");
            w.ents[c].set(Rel::Mayor, m);
            w.ents[m].year2 = rng.random_range((w.ents[m].year + 30).min(2024)..=2024);
        }
    }
    for k in w.countries.clone() {
        let p = staff.next().expect("enough people for presidents");
        w.ents[k].set(Rel::President, p);
        w.ents[p].year2 = rng.random_range((w.ents[p].year + 35).min(2024)..=2024);
    }
    // everyone else mostly works for some company
    for p in w.people.clone() {
        if w.ents[p].get(Rel::WorksFor).is_none() && w.ents[p].year2 == 0 && rng.random_bool(0.8) {
            let c = w.other(rng, Kind::Company, None);
            w.ents[p].set(Rel::WorksFor, c);
        }
    }
    // products
    for _ in 0..n_products {
        let company = w.other(rng, Kind::Company, None);
        let cats = INDUSTRIES.iter().find(|(_, ind, _)| *ind == w.ents[company].desc).expect("industry").2;
        let word = w.names.word(rng, true);
        let name = format!("{word} {}", product_code(rng));
        let mut e = Entity::new(Kind::Product, name);
        e.desc = pick(rng, cats).to_string();
        e.year = rng.random_range(w.ents[company].year.max(1950)..=2024.max(w.ents[company].year));
        e.set(Rel::MadeBy, company);
        if rng.random_bool(0.6) {
            let staff: Vec<usize> =
                w.people.iter().copied().filter(|&p| w.ents[p].get(Rel::WorksFor) == Some(company)).collect();
            let d = if staff.is_empty() { w.other(rng, Kind::Person, None) } else { staff[idx(rng, staff.len())] };
            e.set(Rel::DesignedBy, d);
        }
        w.add(e);
    }
    w
}

fn product_code<R: Rng>(rng: &mut R) -> String {
    let d = rng.random_range(2..=99);
    match rng.random_range(0..7) {
        0 => format!("X{d}"),
        1 => format!("S{d}"),
        2 => format!("GT{d}"),
        3 => format!("Pro {d}"),
        4 => format!("Mark {d}"),
        5 => format!("{}", rng.random_range(1..=9) * 100),
        _ => format!("Z{d}"),
    }
}

// ---- inverse indexes --------------------------------------------------------------------------

struct Inverse {
    born_here: Vec<Vec<usize>>,
    hq_here: Vec<Vec<usize>>,
    univ_here: Vec<Vec<usize>>,
    cities_of: Vec<Vec<usize>>,
    alumni: Vec<Vec<usize>>,
    products_of: Vec<Vec<usize>>,
    designed: Vec<Vec<usize>>,
    mentees: Vec<Vec<usize>>,
    /// Person -> city they are mayor of / country they are president of.
    office: Vec<Option<(Rel, usize)>>,
}

fn inverse(w: &World) -> Inverse {
    let n = w.ents.len();
    let mut inv = Inverse {
        born_here: vec![Vec::new(); n],
        hq_here: vec![Vec::new(); n],
        univ_here: vec![Vec::new(); n],
        cities_of: vec![Vec::new(); n],
        alumni: vec![Vec::new(); n],
        products_of: vec![Vec::new(); n],
        designed: vec![Vec::new(); n],
        mentees: vec![Vec::new(); n],
        office: vec![None; n],
    };
    for (i, e) in w.ents.iter().enumerate() {
        for &(r, t) in &e.rels {
            match (r, e.kind) {
                (Rel::BornIn, _) => inv.born_here[t].push(i),
                (Rel::HeadquarteredIn, _) => inv.hq_here[t].push(i),
                (Rel::LocatedIn, Kind::University) => inv.univ_here[t].push(i),
                (Rel::LocatedIn, Kind::City) => inv.cities_of[t].push(i),
                (Rel::StudiedAt, _) => inv.alumni[t].push(i),
                (Rel::MadeBy, _) => inv.products_of[t].push(i),
                (Rel::DesignedBy, _) => inv.designed[t].push(i),
                (Rel::Mentor, _) => inv.mentees[t].push(i),
                (Rel::Mayor, _) | (Rel::President, _) => inv.office[t] = Some((r, i)),
                _ => {}
            }
        }
    }
    inv
}

// ---- distractor planning ----------------------------------------------------------------------

enum Distractor {
    /// Same name as entity, different person/thing (title has a descriptor).
    Namesake { of: usize },
    /// A confusable name for an entity.
    Confusable { of: usize, title: String },
    /// An event page mentioning some entities.
    Event { city: usize, year: i32, title: String, mentions: Vec<usize> },
}

fn plan_distractors(rng: &mut ChaCha8Rng, w: &mut World) -> Vec<Distractor> {
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

// ---- page writing -----------------------------------------------------------------------------

fn person_page(rng: &mut ChaCha8Rng, w: &mut World, inv: &Inverse, i: usize) -> String {
    let e = w.ents[i].clone();
    let n = &e.name;
    let (p_cap, p, poss) = e.pronouns();
    let mut ev: Vec<(Rel, String)> = Vec::new();
    let mut body: Vec<String> = Vec::new();
    let intro = match idx(rng, 2) {
        0 => format!("{n} (born {}) is {} {}.", e.year, article(&e.desc), e.desc),
        _ => format!("{n} is {} {} born in {}.", article(&e.desc), e.desc, e.year),
    };
    if let Some(c) = e.get(Rel::BornIn) {
        let c = w.name(c);
        let s = match idx(rng, 3) {
            0 => format!("{n} was born in {c}."),
            1 => format!("{p_cap} was born in {c} in {}.", e.year),
            _ => format!("Born in {c}, {n} showed an early interest in {}.", pick(rng, TOPICS)),
        };
        ev.push((Rel::BornIn, s));
    }
    if let Some(u) = e.get(Rel::StudiedAt) {
        let u = w.name(u);
        let f = pick(rng, FIELDS);
        let s = match idx(rng, 3) {
            0 => format!("{n} studied {f} at {u}."),
            1 => format!("{p_cap} graduated from {u} with a degree in {f}."),
            _ => format!("{n} earned a degree in {f} from {u}."),
        };
        ev.push((Rel::StudiedAt, s));
    }
    if let Some(c) = e.get(Rel::WorksFor) {
        let ce = &w.ents[c];
        let cn = &ce.name;
        let s = if ce.get(Rel::FoundedBy) == Some(i) {
            format!("{n} founded {cn} in {} and has worked there ever since.", ce.year)
        } else if ce.get(Rel::Ceo) == Some(i) {
            format!("{n} works for {cn}, where {p} has been chief executive since {}.", ce.year2)
        } else {
            match idx(rng, 3) {
                0 => format!("{n} works for {cn}."),
                1 => format!("{p_cap} has worked at {cn} since {}.", (e.year + rng.random_range(22..=35)).min(2024)),
                _ => format!("{n} is employed by {cn} as {} {}.", article(&e.desc), e.desc),
            }
        };
        ev.push((Rel::WorksFor, s));
    }
    if let Some(m) = e.get(Rel::Mentor) {
        let m = w.name(m);
        let s = match idx(rng, 2) {
            0 => format!("{n} was mentored by {m}."),
            _ => format!("Early in {poss} career, {n} trained under {m}."),
        };
        ev.push((Rel::Mentor, s));
    }
    match inv.office[i] {
        Some((Rel::Mayor, c)) => body.push(format!("{n} has been mayor of {} since {}.", w.name(c), e.year2)),
        Some((_, k)) => body.push(format!("{n} has served as president of {} since {}.", w.name(k), e.year2)),
        None => {}
    }
    let mentees: Vec<String> = sample(rng, &inv.mentees[i], 2).into_iter().map(|x| w.name(x).to_string()).collect();
    if !mentees.is_empty() {
        body.push(format!("{p_cap} later mentored {}.", list_and(&mentees)));
    }
    let designed: Vec<String> = sample(rng, &inv.designed[i], 2).into_iter().map(|x| w.np(x)).collect();
    if !designed.is_empty() {
        body.push(format!("{n} designed {}.", list_and(&designed)));
    }
    let fillers = [
        format!("{p_cap} is known for {poss} work on {}.", pick(rng, TOPICS)),
        format!("In {}, {p} received the {} Prize.", (e.year + rng.random_range(30..=45)).min(2024), w.names.word(rng, false)),
        format!("{p_cap} lives near the coast with {poss} family."),
        format!("{p_cap} enjoys {} in {poss} spare time.", pick(rng, HOBBIES)),
    ];
    add_fillers(rng, &mut body, &fillers, 1, 2);
    finish_page(rng, w, i, intro, ev, body)
}

fn city_page(rng: &mut ChaCha8Rng, w: &mut World, inv: &Inverse, i: usize) -> String {
    let e = w.ents[i].clone();
    let c = &e.name;
    let k = e.get(Rel::LocatedIn).expect("city has a country");
    let kn = w.name(k).to_string();
    let intro = match idx(rng, 4) {
        0 => format!("{c} is a city in {kn}."),
        1 => {
            let adj = pick(rng, CITY_ADJ);
            format!("{c} is {} {adj} city in the {} of {kn}.", article(adj), pick(rng, DIRECTIONS))
        }
        2 => format!("{c} is a town located in {kn}."),
        _ => format!("{c} lies in the {} of {kn}.", pick(rng, DIRECTIONS)),
    };
    let mut ev = vec![(Rel::LocatedIn, intro.clone())];
    if let Some(m) = e.get(Rel::Mayor) {
        let (mn, since) = (w.name(m).to_string(), w.ents[m].year2);
        let s = match idx(rng, 2) {
            0 => format!("The mayor of {c} is {mn}."),
            _ => format!("{mn} has been mayor of {c} since {since}."),
        };
        ev.push((Rel::Mayor, s));
    }
    let mut body = Vec::new();
    if w.ents[k].get(Rel::Capital) == Some(i) {
        body.push(format!("{c} is the capital of {kn}."));
    }
    let born: Vec<String> = sample(rng, &inv.born_here[i], 3).into_iter().map(|x| w.name(x).to_string()).collect();
    if !born.is_empty() {
        body.push(format!("Notable people born in {c} include {}.", list_and(&born)));
    }
    let hq: Vec<String> = sample(rng, &inv.hq_here[i], 2).into_iter().map(|x| w.name(x).to_string()).collect();
    if !hq.is_empty() {
        body.push(format!("Companies based in {c} include {}.", list_and(&hq)));
    }
    let un: Vec<String> = sample(rng, &inv.univ_here[i], 2).into_iter().map(|x| w.name(x).to_string()).collect();
    if !un.is_empty() {
        body.push(format!("{c} is home to {}.", list_and(&un)));
    }
    let fillers = [
        format!("It has a population of about {}.", rng.random_range(8..=900) * 1000),
        format!("The city was founded in {}.", e.year),
        format!("{c} is known for its {}.", pick(rng, CITY_FEATURES)),
    ];
    add_fillers(rng, &mut body, &fillers, 1, 3);
    finish_page(rng, w, i, String::new(), ev, body)
        .trim_start()
        .to_string()
}

fn country_page(rng: &mut ChaCha8Rng, w: &mut World, inv: &Inverse, i: usize) -> String {
    let e = w.ents[i].clone();
    let k = &e.name;
    let alias = &e.aliases[0];
    let intro = match idx(rng, 2) {
        0 => format!("{k}, officially the {alias}, is a country on the coast of the {} Sea.", w.names.word(rng, false)),
        _ => {
            let others: Vec<usize> = w.countries.iter().copied().filter(|&x| x != i).collect();
            let nb: Vec<String> = sample(rng, &others, 2).into_iter().map(|x| w.name(x).to_string()).collect();
            format!("{k}, officially the {alias}, is a landlocked country bordered by {}.", list_and(&nb))
        }
    };
    let mut ev = Vec::new();
    let mut body = Vec::new();
    if let Some(cap) = e.get(Rel::Capital) {
        let cn = w.name(cap);
        let s = match idx(rng, 3) {
            0 => format!("The capital of {k} is {cn}."),
            1 => format!("{cn} is the capital and largest city of {k}."),
            _ => format!("Its capital is {cn}."),
        };
        ev.push((Rel::Capital, s));
    }
    if let Some(p) = e.get(Rel::President) {
        let (pn, since) = (w.name(p).to_string(), w.ents[p].year2);
        let s = match idx(rng, 2) {
            0 => format!("The president of {k} is {pn}."),
            _ => format!("{pn} has served as president of {k} since {since}."),
        };
        ev.push((Rel::President, s));
    }
    let cap = e.get(Rel::Capital);
    let others: Vec<usize> = inv.cities_of[i].iter().copied().filter(|&x| Some(x) != cap).collect();
    let others: Vec<String> = sample(rng, &others, 3).into_iter().map(|x| w.name(x).to_string()).collect();
    if !others.is_empty() {
        body.push(format!("Other cities in {k} include {}.", list_and(&others)));
    }
    let fillers = [
        format!("The currency of {k} is the {} mark.", w.names.word(rng, false)),
        format!("{k} has a population of about {} million.", rng.random_range(2..=90)),
        format!("{k} became independent in {}.", e.year),
    ];
    add_fillers(rng, &mut body, &fillers, 1, 3);
    finish_page(rng, w, i, intro, ev, body)
}

fn company_page(rng: &mut ChaCha8Rng, w: &mut World, inv: &Inverse, i: usize) -> String {
    let e = w.ents[i].clone();
    let co = &e.name;
    let ind = &e.desc;
    let a = article(ind);
    let hq = w.name(e.get(Rel::HeadquarteredIn).expect("company has a city")).to_string();
    let mut ev = Vec::new();
    let intro = if rng.random_bool(0.5) {
        let s = format!("{co} is {a} {ind} company headquartered in {hq}.");
        ev.push((Rel::HeadquarteredIn, s.clone()));
        s
    } else {
        let s = match idx(rng, 3) {
            0 => format!("Its headquarters are in {hq}."),
            1 => format!("The company's head office is in {hq}."),
            _ => format!("{co} is headquartered in {hq}."),
        };
        ev.push((Rel::HeadquarteredIn, s));
        format!("{co} is {a} {ind} company.")
    };
    if let Some(f) = e.get(Rel::FoundedBy) {
        let f = w.name(f);
        let s = match idx(rng, 3) {
            0 => format!("{co} was founded by {f} in {}.", e.year),
            1 => format!("The company was founded in {} by {f}.", e.year),
            _ => format!("{f} founded {co} in {}.", e.year),
        };
        ev.push((Rel::FoundedBy, s));
    }
    if let Some(c) = e.get(Rel::Ceo) {
        let c = w.name(c);
        let s = match idx(rng, 2) {
            0 => format!("Its chief executive is {c}."),
            _ => format!("{c} has been the chief executive of {co} since {}.", e.year2),
        };
        ev.push((Rel::Ceo, s));
    }
    let mut body = Vec::new();
    let prods: Vec<String> = sample(rng, &inv.products_of[i], 3).into_iter().map(|x| w.np(x)).collect();
    if !prods.is_empty() {
        body.push(format!("Its products include {}.", list_and(&prods)));
    }
    let fillers = [
        format!("{co} employs about {} people.", rng.random_range(2..=400) * 50),
        format!("In {}, the company opened a new factory.", rng.random_range(e.year..=2024.max(e.year))),
        format!("The company's shares trade on the {} stock exchange.", w.names.word(rng, false)),
    ];
    add_fillers(rng, &mut body, &fillers, 1, 2);
    finish_page(rng, w, i, intro, ev, body)
}

fn university_page(rng: &mut ChaCha8Rng, w: &mut World, inv: &Inverse, i: usize) -> String {
    let e = w.ents[i].clone();
    let u = &e.name;
    let city = w.name(e.get(Rel::LocatedIn).expect("university has a city")).to_string();
    let (intro, year_said) = match idx(rng, 3) {
        0 => (format!("{u} is {} {} university in {city}.", article(&e.desc), e.desc), false),
        1 => (format!("{u} is a research university located in {city}."), false),
        _ => (format!("Founded in {}, {u} is a university based in {city}.", e.year), true),
    };
    let ev = vec![(Rel::LocatedIn, intro.clone())];
    let mut body = Vec::new();
    let al: Vec<String> = sample(rng, &inv.alumni[i], 3).into_iter().map(|x| w.name(x).to_string()).collect();
    if !al.is_empty() {
        body.push(format!("Notable alumni include {}.", list_and(&al)));
    }
    let mut fillers = vec![
        format!("It has about {} students.", rng.random_range(20..=600) * 100),
        format!("The university is known for its {} programme.", pick(rng, FIELDS)),
    ];
    if !year_said {
        fillers.push(format!("It was founded in {}.", e.year));
    }
    add_fillers(rng, &mut body, &fillers, 1, 2);
    finish_page(rng, w, i, String::new(), ev, body).trim_start().to_string()
}

fn product_page(rng: &mut ChaCha8Rng, w: &mut World, i: usize) -> String {
    let e = w.ents[i].clone();
    let pr = &e.name;
    let cat = &e.desc;
    let a = article(cat);
    let co = w.name(e.get(Rel::MadeBy).expect("product has a maker")).to_string();
    let (intro, year_said) = match idx(rng, 3) {
        0 => (format!("The {pr} is {a} {cat} made by {co}."), false),
        1 => (format!("The {pr} is {a} {cat} manufactured by {co}."), false),
        _ => (format!("{co} released the {pr}, {a} {cat}, in {}.", e.year), true),
    };
    let mut ev = vec![(Rel::MadeBy, intro.clone())];
    if let Some(d) = e.get(Rel::DesignedBy) {
        let d = w.name(d);
        let s = match idx(rng, 3) {
            0 => format!("It was designed by {d}."),
            1 => format!("The {pr} was designed by {d}."),
            _ => format!("Its lead designer was {d}."),
        };
        ev.push((Rel::DesignedBy, s));
    }
    let mut body = Vec::new();
    let mut fillers = vec![
        format!("The {pr} sold about {} units in its first year.", rng.random_range(1..=500) * 1000),
        format!("Reviewers praised its {}.", pick(rng, PRODUCT_FEATURES)),
    ];
    if !year_said {
        fillers.push(format!("It was released in {}.", e.year));
    }
    add_fillers(rng, &mut body, &fillers, 1, 2);
    finish_page(rng, w, i, String::new(), ev, body).trim_start().to_string()
}

fn add_fillers<R: Rng>(rng: &mut R, body: &mut Vec<String>, fillers: &[String], lo: usize, hi: usize) {
    let k = rng.random_range(lo..=hi.min(fillers.len()));
    let mut order: Vec<usize> = (0..fillers.len()).collect();
    order.shuffle(rng);
    for &j in order.iter().take(k) {
        body.push(fillers[j].clone());
    }
}

/// Orders the sentences (intro, then the first relation sentence, then the rest shuffled, then
/// the hatnote), records the evidence on the entity, and returns the text.
fn finish_page(rng: &mut ChaCha8Rng, w: &mut World, i: usize, intro: String, ev: Vec<(Rel, String)>, body: Vec<String>) -> String {
    let mut first = Vec::new();
    let mut rest: Vec<String> = body;
    for (k, (_, s)) in ev.iter().enumerate() {
        if k == 0 {
            first.push(s.clone());
        } else {
            rest.push(s.clone());
        }
    }
    rest.shuffle(rng);
    let mut sentences = Vec::new();
    if !intro.is_empty() && !first.contains(&intro) {
        sentences.push(intro);
    }
    // a relation sentence that opens with a pronoun must follow a sentence naming the subject
    sentences.extend(first);
    sentences.extend(rest);
    if let Some((title, desc, true)) = &w.ents[i].namesake {
        sentences.push(format!("For the {desc} of the same name, see {title}."));
    }
    // keep every sentence unique on the page
    let mut seen = HashSet::new();
    sentences.retain(|s| seen.insert(s.clone()));
    w.ents[i].evidence = ev;
    sentences.join(" ")
}

fn distractor_page(rng: &mut ChaCha8Rng, w: &mut World, d: &Distractor) -> (String, String, Vec<usize>) {
    match d {
        Distractor::Namesake { of } => {
            let e = w.ents[*of].clone();
            let (title, desc, _) = e.namesake.clone().expect("namesake planned");
            match e.kind {
                Kind::Person => {
                    let (p_cap, _, poss) = e.pronouns();
                    let city = w.other(rng, Kind::City, e.get(Rel::BornIn));
                    let univ = w.other(rng, Kind::University, e.get(Rel::StudiedAt));
                    let year = rng.random_range(1935..=1998);
                    let co = w.other(rng, Kind::Company, e.get(Rel::WorksFor));
                    let (cn, un, con) = (w.name(city).to_string(), w.name(univ).to_string(), w.name(co).to_string());
                    let (mentor, _) = w.fresh_person_name(rng);
                    let n = &e.name;
                    let text = [
                        format!("{n} (born {year}) is {} {desc} from {cn}.", article(&desc)),
                        format!("{n} was born in {cn} and studied at {un}."),
                        format!("{n} also works for {con}, a company that sponsors {poss} work as {} {desc}.", article(&desc)),
                        format!("{p_cap} was mentored by {mentor}."),
                        format!("{p_cap} is best known for {poss} early work from the {}s.", (year + 25) / 10 * 10),
                    ]
                    .join(" ");
                    (title, text, vec![*of])
                }
                _ => {
                    let country = w.other(rng, Kind::Country, e.get(Rel::LocatedIn));
                    let kn = w.name(country).to_string();
                    let sea = w.names.word(rng, false);
                    let text = [
                        format!("The {} is a river in the country of {kn}.", e.name),
                        format!("It flows for about {} kilometres before reaching the {sea} Sea.", rng.random_range(40..=900)),
                        format!("The {} is known for its {}.", e.name, pick(rng, &["fishing", "rapids", "water mills", "wide delta"])),
                    ]
                    .join(" ");
                    (title, text, vec![*of])
                }
            }
        }
        Distractor::Confusable { of, title } => {
            let e = w.ents[*of].clone();
            let text = match e.kind {
                Kind::Person => {
                    let female = rng.random_bool(0.5);
                    let p_cap = if female { "She" } else { "He" };
                    let occ = pick(rng, OCCUPATIONS);
                    let city = w.other(rng, Kind::City, e.get(Rel::BornIn));
                    let co = w.other(rng, Kind::Company, e.get(Rel::WorksFor));
                    [
                        format!("{title} (born {}) is {} {occ}.", rng.random_range(1935..=1995), article(occ)),
                        format!("{p_cap} was born in {}.", w.name(city)),
                        format!("{p_cap} works for {}.", w.name(co)),
                    ]
                    .join(" ")
                }
                Kind::Company => {
                    let (_, ind, _) = INDUSTRIES[idx(rng, INDUSTRIES.len())];
                    let city = w.other(rng, Kind::City, e.get(Rel::HeadquarteredIn));
                    let (founder, _) = w.fresh_person_name(rng);
                    [
                        format!("{title} is {} {ind} company headquartered in {}.", article(ind), w.name(city)),
                        format!("It was founded by {founder} in {}.", rng.random_range(1900..=2015)),
                        format!("{title} employs about {} people.", rng.random_range(2..=200) * 50),
                    ]
                    .join(" ")
                }
                Kind::Product => {
                    let co = w.other(rng, Kind::Company, e.get(Rel::MadeBy));
                    let cats = INDUSTRIES.iter().find(|(_, ind, _)| *ind == w.ents[co].desc).expect("industry").2;
                    let cat = pick(rng, cats);
                    [
                        format!("The {title} is {} {cat} made by {}.", article(cat), w.name(co)),
                        format!("It was released in {}.", rng.random_range(1960..=2024)),
                    ]
                    .join(" ")
                }
                _ => {
                    let country = w.other(rng, Kind::Country, e.get(Rel::LocatedIn));
                    [
                        format!("{title} is a small town in {}.", w.name(country)),
                        format!("It has a population of about {}.", rng.random_range(1..=40) * 500),
                    ]
                    .join(" ")
                }
            };
            (title.clone(), text, vec![*of])
        }
        Distractor::Event { city, year, title, mentions } => {
            let cn = w.name(*city).to_string();
            let mut s = vec![format!("The {title} was an event held in {cn} in {year}.")];
            for &m in mentions {
                let e = &w.ents[m];
                let n = e.np();
                let cap = capitalise_first(&n);
                match e.kind {
                    Kind::Person => {
                        s.push(format!("{n} gave a talk at the event."));
                        s.push(format!("Reporters later asked {n} about {}.", pick(rng, TOPICS)));
                    }
                    Kind::Company => {
                        s.push(format!("{n} sponsored the event."));
                        s.push(format!("Representatives of {n} presented new plans."));
                    }
                    _ => {
                        s.push(format!("Visitors could try {n} on the exhibition floor."));
                        s.push(format!("{cap} drew long queues."));
                    }
                }
            }
            s.push(format!("The event was founded in {} by a group of local volunteers.", year - rng.random_range(3..=40)));
            s.push("Many of the speakers were born and raised in the region.".to_string());
            (title.clone(), s.join(" "), mentions.clone())
        }
    }
}

fn capitalise_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

fn write_corpus(rng: &mut ChaCha8Rng, w: &mut World) {
    let inv = inverse(w);
    let distractors = plan_distractors(rng, w);
    for i in 0..w.ents.len() {
        let text = match w.ents[i].kind {
            Kind::Person => person_page(rng, w, &inv, i),
            Kind::City => city_page(rng, w, &inv, i),
            Kind::Country => country_page(rng, w, &inv, i),
            Kind::Company => company_page(rng, w, &inv, i),
            Kind::University => university_page(rng, w, &inv, i),
            Kind::Product => product_page(rng, w, i),
        };
        let title = w.ents[i].name.clone();
        let p = w.add_page(title, text, "entity");
        w.ents[i].page = p;
    }
    for d in &distractors {
        let (title, text, about) = distractor_page(rng, w, d);
        let p = w.add_page(title, text, "distractor");
        for a in about {
            w.ents[a].confusers.push(p);
        }
    }
}

// ---- questions --------------------------------------------------------------------------------

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
