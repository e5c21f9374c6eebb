//! Page writing: the text of every entity and distractor page, and the corpus they make.

use std::collections::HashSet;

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::distractors::{plan_distractors, Distractor};
use super::inverse::{inverse, Inverse};
use super::vocabulary::{
    article, idx, list_and, pick, sample, CITY_ADJ, CITY_FEATURES, DIRECTIONS, FIELDS, HOBBIES, INDUSTRIES, OCCUPATIONS,
    PRODUCT_FEATURES, TOPICS,
};
use super::world::World;
use super::{Kind, Rel};

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

pub(super) fn write_corpus(rng: &mut ChaCha8Rng, w: &mut World) {
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
