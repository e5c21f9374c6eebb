//! Vocabulary of the multihop world: the fixed word lists that pages and names are drawn from,
//! plus what draws from them ([`pick`], [`idx`], [`sample`]) and what is used to join words into
//! phrases ([`article`], [`list_and`]).

use rand::seq::SliceRandom;
use rand::Rng;

pub(super) const OCCUPATIONS: &[&str] = &[
    "engineer", "economist", "chemist", "architect", "journalist", "physician", "historian", "lawyer",
    "mathematician", "geologist", "civil servant", "accountant", "biologist", "urban planner",
];
pub(super) const NAMESAKE_DESCS: &[&str] = &["painter", "footballer", "poet", "sculptor", "cyclist", "singer", "novelist", "chess player"];
pub(super) const FIELDS: &[&str] = &[
    "economics", "physics", "chemistry", "law", "history", "mechanical engineering", "computer science",
    "architecture", "medicine", "mathematics", "philosophy", "biology",
];
pub(super) const TOPICS: &[&str] = &[
    "renewable energy", "public transport", "water management", "early education", "trade policy",
    "materials science", "local history", "medical imaging", "food safety", "urban housing",
];
pub(super) const HOBBIES: &[&str] = &["sailing", "chess", "mountain hiking", "photography", "gardening", "amateur astronomy", "cycling"];
pub(super) const CITY_FEATURES: &[&str] = &[
    "harbour", "old town", "annual music festival", "textile mills", "botanical garden", "cathedral", "stone bridges",
    "covered markets", "wine cellars", "glassworks",
];
pub(super) const CITY_ADJ: &[&str] = &["coastal", "mountain", "river", "industrial", "historic", "university", "market"];
pub(super) const DIRECTIONS: &[&str] = &["north", "south", "east", "west", "centre", "north-east", "south-west"];
pub(super) const PRODUCT_FEATURES: &[&str] = &["battery life", "low price", "build quality", "simple design", "durability", "speed", "comfort"];
pub(super) const COUNTRY_FORMS: &[&str] = &["Republic of", "Kingdom of", "Federation of", "Commonwealth of", "Union of"];
pub(super) const UNIV_FORMS: &[&str] = &["University of {}", "{} University", "{} Institute of Technology", "{} College", "{} State University"];
pub(super) const EVENT_TYPES: &[&str] = &["Trade Fair", "Summit", "Innovation Forum", "Film Festival", "Science Expo", "Charity Gala"];

/// (name suffix, industry, product categories)
pub(super) const INDUSTRIES: &[(&str, &str, &[&str])] = &[
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

pub(super) fn pick<'a, R: Rng, T: ?Sized>(rng: &mut R, xs: &'a [&'a T]) -> &'a T {
    xs[rng.random_range(0..xs.len())]
}

pub(super) fn idx<R: Rng>(rng: &mut R, len: usize) -> usize {
    rng.random_range(0..len)
}

pub(super) fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u', 'A', 'E', 'I', 'O', 'U']) {
        "an"
    } else {
        "a"
    }
}

/// "A", "A and B", "A, B and C".
pub(super) fn list_and(items: &[String]) -> String {
    match items.len() {
        0 => String::new(),
        1 => items[0].clone(),
        _ => format!("{} and {}", items[..items.len() - 1].join(", "), items[items.len() - 1]),
    }
}

/// Up to `k` distinct items of `xs`, in a random order.
pub(super) fn sample<R: Rng>(rng: &mut R, xs: &[usize], k: usize) -> Vec<usize> {
    let mut v = xs.to_vec();
    v.shuffle(rng);
    v.truncate(k);
    v
}
