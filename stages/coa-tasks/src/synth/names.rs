//! Pronounceable invented names, partitioned by split.
//!
//! A word is 2–3 syllables (onset + nucleus, a light coda inside the word, an optional final
//! coda), capitalised. A word is only ever produced for the split that [`split_of_token`] of its
//! lowercase form names, so the two splits draw from disjoint word sets whatever the seed.

use std::collections::HashSet;
use std::sync::LazyLock;

use rand::Rng;

use super::{split_of_token, Split};

const ONSETS: &[&str] = &[
    "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st", "th", "sh",
    "gr", "vr", "h", "j", "c", "fl", "pr",
];
const NUCLEI: &[&str] = &["a", "e", "i", "o", "u", "a", "e", "o", "i", "a", "ae", "ou", "y"];
const INNER_CODAS: &[&str] = &["", "", "", "n", "r", "l", "s", "m"];
const FINAL_CODAS: &[&str] = &["", "", "n", "r", "l", "s", "x", "th", "nd", "rk", "m", "sh"];
const FEMALE_ENDINGS: &[&str] = &["a", "ia", "ina", "elle", "ys", "ara", "e"];
const MALE_ENDINGS: &[&str] = &["o", "an", "or", "us", "ek", "im", "ard", "el"];

/// Every word of the generators' own source (template sentences, vocabulary lists, comments):
/// an invented word never equals one of them, so that a name cannot coincide with fixed text
/// shared by both splits (e.g. a product called "State" next to "... State University").
static RESERVED: LazyLock<HashSet<String>> = LazyLock::new(|| {
    // Every file of the generators: a file added to `multihop/` belongs here too.
    let src = [
        include_str!("multihop/mod.rs"),
        include_str!("multihop/vocabulary.rs"),
        include_str!("multihop/world.rs"),
        include_str!("multihop/inverse.rs"),
        include_str!("multihop/distractors.rs"),
        include_str!("multihop/pages.rs"),
        include_str!("multihop/questions.rs"),
        include_str!("math.rs"),
        include_str!("code.rs"),
        include_str!("mod.rs"),
    ];
    src.iter()
        .flat_map(|s| s.split(|c: char| !c.is_ascii_alphabetic()))
        .filter(|w| w.len() >= 3)
        .map(|w| w.to_ascii_lowercase())
        .collect()
});

/// Draws invented words for one split; with `unique`, never the same word twice.
pub struct NameGen {
    split: Split,
    used: HashSet<String>,
}

fn pick<'a, R: Rng>(rng: &mut R, xs: &[&'a str]) -> &'a str {
    xs[rng.random_range(0..xs.len())]
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
        None => String::new(),
    }
}

/// A raw lowercase word (any split).
fn raw_word<R: Rng>(rng: &mut R, syllables: usize, ending: Option<&str>) -> String {
    let mut w = String::new();
    for i in 0..syllables {
        let last = i + 1 == syllables;
        // Some words begin with a vowel; clusters only at the start of a syllable after a vowel.
        let onset = if i == 0 && rng.random_bool(0.15) {
            ""
        } else if i > 0 && !w.ends_with(['a', 'e', 'i', 'o', 'u', 'y']) {
            // after a consonant coda, a single consonant only
            loop {
                let o = pick(rng, ONSETS);
                if o.len() == 1 {
                    break o;
                }
            }
        } else {
            pick(rng, ONSETS)
        };
        w.push_str(onset);
        w.push_str(pick(rng, NUCLEI));
        if last {
            match ending {
                Some(e) => {
                    // endings start with a vowel or not; avoid vowel pile-ups
                    if e.starts_with(['a', 'e', 'i', 'o', 'u']) {
                        w.push_str(pick(rng, &["n", "r", "l", "s", "d", "m", "v", "t"]));
                    }
                    w.push_str(e);
                }
                None => w.push_str(pick(rng, FINAL_CODAS)),
            }
        } else {
            w.push_str(pick(rng, INNER_CODAS));
        }
    }
    w
}

fn well_formed(w: &str) -> bool {
    let b = w.as_bytes();
    if !(4..=9).contains(&b.len()) {
        return false;
    }
    // no letter three times in a row, no four vowels / four consonants in a row
    let vowel = |c: u8| b"aeiouy".contains(&c);
    let (mut run_v, mut run_c) = (0, 0);
    for (i, &c) in b.iter().enumerate() {
        if i >= 2 && b[i - 1] == c && b[i - 2] == c {
            return false;
        }
        if vowel(c) {
            run_v += 1;
            run_c = 0;
        } else {
            run_c += 1;
            run_v = 0;
        }
        if run_v >= 4 || run_c >= 4 {
            return false;
        }
    }
    true
}

impl NameGen {
    pub fn new(split: Split) -> NameGen {
        NameGen { split, used: HashSet::new() }
    }

    pub fn split(&self) -> Split {
        self.split
    }

    /// Whether `word` (any case) belongs to this generator's split.
    pub fn in_split(&self, word: &str) -> bool {
        split_of_token(&word.to_ascii_lowercase()) == self.split
    }

    /// Marks a word as taken (so `unique` draws avoid it). Returns false if it already was.
    pub fn reserve(&mut self, word: &str) -> bool {
        self.used.insert(word.to_ascii_lowercase())
    }

    pub fn is_used(&self, word: &str) -> bool {
        self.used.contains(&word.to_ascii_lowercase())
    }

    fn draw<R: Rng>(&mut self, rng: &mut R, unique: bool, ending: &dyn Fn(&mut R) -> Option<&'static str>) -> String {
        loop {
            let e = ending(rng);
            let syl = match (e.is_some(), rng.random_bool(0.75)) {
                (false, true) => 2,
                (false, false) => 3,
                (true, true) => 1,
                (true, false) => 2,
            };
            let w = raw_word(rng, syl, e);
            if !well_formed(&w) || split_of_token(&w) != self.split || RESERVED.contains(&w) {
                continue;
            }
            if unique && !self.used.insert(w.clone()) {
                continue;
            }
            return capitalise(&w);
        }
    }

    /// A capitalised invented word of this split.
    pub fn word<R: Rng>(&mut self, rng: &mut R, unique: bool) -> String {
        self.draw(rng, unique, &|_| None)
    }

    /// A first name with a feminine or masculine ending.
    pub fn first_name<R: Rng>(&mut self, rng: &mut R, female: bool, unique: bool) -> String {
        if female {
            self.draw(rng, unique, &|r: &mut R| Some(pick(r, FEMALE_ENDINGS)))
        } else {
            self.draw(rng, unique, &|r: &mut R| Some(pick(r, MALE_ENDINGS)))
        }
    }

    /// A word that differs from `word` in one vowel (a confusable spelling), of this split and
    /// unused; marks it used. None if no such variant exists.
    pub fn confusable<R: Rng>(&mut self, rng: &mut R, word: &str) -> Option<String> {
        let lower = word.to_ascii_lowercase();
        let b = lower.as_bytes();
        let mut variants = Vec::new();
        for (i, &c) in b.iter().enumerate() {
            if !b"aeiou".contains(&c) {
                continue;
            }
            for &v in b"aeiou" {
                if v == c {
                    continue;
                }
                let mut nb = b.to_vec();
                nb[i] = v;
                let s = String::from_utf8(nb).expect("ascii");
                if well_formed(&s) && split_of_token(&s) == self.split && !self.used.contains(&s) && !RESERVED.contains(&s) {
                    variants.push(s);
                }
            }
        }
        if variants.is_empty() {
            return None;
        }
        let s = variants.swap_remove(rng.random_range(0..variants.len()));
        self.used.insert(s.clone());
        Some(capitalise(&s))
    }
}

#[cfg(test)]
mod t {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn words_are_in_split_unique_and_pronounceable() {
        for split in [Split::Train, Split::Test] {
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let mut g = NameGen::new(split);
            let mut seen = HashSet::new();
            for _ in 0..3000 {
                let w = g.word(&mut rng, true);
                assert!(w.chars().next().unwrap().is_ascii_uppercase());
                assert!(w.chars().all(|c| c.is_ascii_alphabetic()), "{w}");
                assert_eq!(split_of_token(&w.to_ascii_lowercase()), split);
                assert!(seen.insert(w.clone()), "duplicate {w}");
                assert!(well_formed(&w.to_ascii_lowercase()));
                assert!(!RESERVED.contains(&w.to_ascii_lowercase()));
            }
            for female in [true, false] {
                let f = g.first_name(&mut rng, female, false);
                assert!(g.in_split(&f));
            }
            assert!(RESERVED.contains("state") && RESERVED.contains("university") && RESERVED.contains("river"));
            let c = g.confusable(&mut rng, "Vellorax").unwrap();
            assert_eq!(c.len(), "Vellorax".len());
            assert_ne!(c, "Vellorax");
            assert!(g.in_split(&c));
        }
    }
}
