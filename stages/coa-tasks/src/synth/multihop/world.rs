//! The world: entities of each kind and their relations, drawn from the seed.

use std::collections::HashSet;

use coa_schemas::rows::CorpusPage;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::synth::names::NameGen;
use crate::synth::Split;
use super::vocabulary::{idx, pick, COUNTRY_FORMS, INDUSTRIES, OCCUPATIONS, UNIV_FORMS};
use super::{url_for, Entity, Kind, Rel};

pub(super) struct World {
    pub(super) ents: Vec<Entity>,
    pub(super) pages: Vec<CorpusPage>,
    pub(super) titles: HashSet<String>,
    pub(super) names: NameGen,
    pub(super) people: Vec<usize>,
    pub(super) cities: Vec<usize>,
    pub(super) countries: Vec<usize>,
    pub(super) companies: Vec<usize>,
    pub(super) univs: Vec<usize>,
    pub(super) products: Vec<usize>,
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

    pub(super) fn name(&self, i: usize) -> &str {
        &self.ents[i].name
    }

    pub(super) fn np(&self, i: usize) -> String {
        self.ents[i].np()
    }

    pub(super) fn add_page(&mut self, title: String, text: String, kind: &str) -> usize {
        let i = self.pages.len();
        self.pages.push(CorpusPage { url: url_for(&title), title, text, kind: kind.to_string() });
        i
    }

    /// A fresh person name (unused title) of the split.
    pub(super) fn fresh_person_name<R: Rng>(&mut self, rng: &mut R) -> (String, bool) {
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
    pub(super) fn other<R: Rng>(&self, rng: &mut R, k: Kind, not: Option<usize>) -> usize {
        let xs = self.ents_of(k);
        loop {
            let x = xs[idx(rng, xs.len())];
            if Some(x) != not || xs.len() == 1 {
                return x;
            }
        }
    }
}

pub(super) fn build_world(rng: &mut ChaCha8Rng, n: usize, split: Split) -> World {
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

pub(super) fn product_code<R: Rng>(rng: &mut R) -> String {
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
