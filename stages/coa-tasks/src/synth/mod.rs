//! Offline synthetic task suites (docs/ARCHITECTURE.md, "Tasks and tools"): `multihop`, `math` and
//! `code`.
//!
//! Every suite is generated from a seed and is verifiable:
//! - [`Suite::Multihop`]: a synthetic world of people, places, organisations and products, a
//!   document corpus (one page per entity plus distractor pages), and questions that chain 2–5
//!   relation hops. The answer is an exact entity name. See [`multihop`] for the solution format.
//! - [`Suite::Math`]: word problems whose numbers need computing with the `code` tool; numeric
//!   answer strings. See [`math`].
//! - [`Suite::Code`]: function-writing problems with HumanEval-style unit tests. See [`code`].
//!
//! # Determinism
//! The same `(suite, n, seed, split)` gives byte-identical output: all randomness comes from one
//! `ChaCha8Rng` seeded from the seed, the suite and the split, and nothing in the output depends on
//! hash-map iteration order. (Floating-point answers go through the platform's `pow`; parameter sets
//! whose rounded answer would sit within 1e-4 of a rounding tie are rejected, so the answers are
//! stable across libms.)
//!
//! # Held-out split
//! Train and test are disjoint *whatever the seeds*, through two fixed partitions:
//! - **Name words.** Every proper-noun word the generators invent (entity names, distractor titles,
//!   people in word problems, prize and river names) is built from syllables and kept only if
//!   [`split_of_token`] of its lowercase form equals the split being generated (and only if it
//!   is not a word of the generators' fixed text, such as "State" or "river"). So the sets of
//!   invented words of the two splits are disjoint, and no test entity name, alias or page title
//!   (each holds at least one invented word) occurs in any train question, answer, page title or
//!   page text, and vice versa.
//! - **Numbers (math and code).** Every number written in a math or code *question* (each maximal
//!   `digits` or `digits.digits` token, see [`number_tokens`]) satisfies
//!   `split_of_token(token) == split`; a rendered question that breaks this is re-drawn. So no
//!   number token of a test math/code question appears in any train math/code question. (Hidden
//!   test code, reference code and answers are not restricted.)

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use coa_schemas::rng::{fnv1a, splitmix64_mix};
use coa_schemas::rows::{CorpusPage, Task};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub mod code;
pub mod math;
pub mod multihop;
pub mod names;

#[cfg(test)]
mod tests;

pub use coa_schemas::suite::Suite;

/// The synthesised suite named `s` (case and surrounding spaces ignored): multihop, math or code.
pub fn parse_synthesised(s: &str) -> Result<Suite> {
    let name = s.trim().to_ascii_lowercase();
    match Suite::parse(&name).filter(|suite| Suite::SYNTHESISED.contains(suite)) {
        Some(suite) => Ok(suite),
        None => {
            let known: Vec<&str> = Suite::SYNTHESISED.iter().map(|s| s.as_str()).collect();
            bail!("unknown suite `{name}` (expected {})", or_list(&known))
        }
    }
}

/// `a, b or c`.
fn or_list(items: &[&str]) -> String {
    match items.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The suite's byte in the random stream's key (`qa` is never synthesised).
fn suite_tag(suite: Suite) -> u8 {
    match suite {
        Suite::Multihop => 1,
        Suite::Math => 2,
        Suite::Code => 3,
        Suite::Qa => 4,
    }
}

/// Train or held-out test split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Split {
    Train,
    Test,
}

impl Split {
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }

    fn tag(self) -> u8 {
        match self {
            Split::Train => 1,
            Split::Test => 2,
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Split {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Split> {
        match s.trim().to_ascii_lowercase().as_str() {
            "train" => Ok(Split::Train),
            "test" => Ok(Split::Test),
            other => bail!("unknown split `{other}` (expected train or test)"),
        }
    }
}

/// Output of [`generate`]: the tasks, and for `multihop` the corpus their questions need.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Generated {
    pub tasks: Vec<Task>,
    /// One page per entity plus distractors (multihop); empty for math and code.
    pub corpus: Vec<CorpusPage>,
}

/// Generates `n` tasks of `suite` for `split` from `seed`. Deterministic: the same arguments give
/// identical output.
pub fn generate(suite: Suite, n: usize, seed: u64, split: Split) -> Result<Generated> {
    let mut rng = suite_rng(seed, suite, split);
    match suite {
        Suite::Multihop => multihop::generate(&mut rng, n, split),
        Suite::Math => Ok(Generated { tasks: math::generate(&mut rng, n, split)?, corpus: Vec::new() }),
        Suite::Code => Ok(Generated { tasks: code::generate(&mut rng, n, split)?, corpus: Vec::new() }),
        Suite::Qa => bail!("the `qa` suite is imported from task files, not synthesised (expected multihop, math or code)"),
    }
}

/// The random stream of one (seed, suite, split): distinct suites and splits never share a stream.
fn suite_rng(seed: u64, suite: Suite, split: Split) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8] = suite_tag(suite);
    key[9] = split.tag();
    key[10..26].copy_from_slice(b"coa-tasks/synth1");
    ChaCha8Rng::from_seed(key)
}

/// `multihop-train-000042`.
pub(crate) fn task_id(suite: Suite, split: Split, i: usize) -> String {
    format!("{}-{}-{:06}", suite.as_str(), split.as_str(), i)
}

/// A blank synthetic task row of the suite and split (the caller fills question, answers, ...).
pub(crate) fn base_task(suite: Suite, split: Split, i: usize) -> Task {
    Task {
        task_id: task_id(suite, split, i),
        suite: suite.as_str().to_string(),
        split: split.as_str().to_string(),
        source: "synthetic".to_string(),
        tools: suite.tools().iter().map(|t| t.to_string()).collect(),
        ..Task::default()
    }
}

/// The split a token (an invented name word in lowercase, or a number token) belongs to: a fixed
/// hash partition, independent of any seed. See the module docs for what it guarantees.
pub fn split_of_token(token: &str) -> Split {
    // FNV-1a, then the splitmix64 finaliser so that every bit depends on every byte.
    let h = splitmix64_mix(fnv1a(token));
    if h >> 63 == 0 {
        Split::Train
    } else {
        Split::Test
    }
}

/// The number tokens of a text: maximal runs of ASCII digits, with a fractional part when a `.`
/// is directly followed by a digit (`"$1500.25 at 4.5%."` gives `["1500.25", "4.5"]`).
pub fn number_tokens(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            out.push(&text[start..i]);
        } else {
            i += 1;
        }
    }
    out
}

/// Whether every number token of `text` belongs to `split`.
pub(crate) fn numbers_in_split(text: &str, split: Split) -> bool {
    number_tokens(text).into_iter().all(|t| split_of_token(t) == split)
}

/// Difficulty label used by every suite.
pub(crate) fn difficulty(level: u8) -> String {
    match level {
        0 => "easy",
        1 => "medium",
        _ => "hard",
    }
    .to_string()
}

/// Integer draws restricted to the split's numbers.
pub(crate) mod nums {
    use super::{split_of_token, Split};
    use rand::Rng;

    /// A uniform integer in `lo..=hi` whose decimal digits (without a sign, as [`super::number_tokens`]
    /// reads them) belong to `split`.
    ///
    /// Panics if the range holds no such integer (ranges are constants of the templates; a test
    /// covers every template in both splits).
    pub fn int<R: Rng>(rng: &mut R, lo: i64, hi: i64, split: Split) -> i64 {
        assert!(lo <= hi);
        if hi - lo < 4096 {
            let cands: Vec<i64> = (lo..=hi).filter(|v| split_of_token(&v.unsigned_abs().to_string()) == split).collect();
            assert!(!cands.is_empty(), "no {split} number in {lo}..={hi}");
            return cands[rng.random_range(0..cands.len())];
        }
        loop {
            let v = rng.random_range(lo..=hi);
            if split_of_token(&v.unsigned_abs().to_string()) == split {
                return v;
            }
        }
    }

    /// A value `k * step / 100` (k in `lo_k..=hi_k`), rendered without trailing zeros
    /// (`"4.25"`, `"4.5"`, `"4"`), whose rendering belongs to `split`. Returns (text, value).
    pub fn hundredths<R: Rng>(rng: &mut R, lo_k: i64, hi_k: i64, step: i64, split: Split) -> (String, f64) {
        let cands: Vec<String> = (lo_k..=hi_k)
            .map(|k| render_hundredths(k * step))
            .filter(|s| split_of_token(s) == split)
            .collect();
        assert!(!cands.is_empty(), "no {split} value in range");
        let s = cands[rng.random_range(0..cands.len())].clone();
        let v: f64 = s.parse().expect("rendered number");
        (s, v)
    }

    fn render_hundredths(h: i64) -> String {
        let (int, frac) = (h / 100, h % 100);
        if frac == 0 {
            int.to_string()
        } else if frac % 10 == 0 {
            format!("{int}.{}", frac / 10)
        } else {
            format!("{int}.{frac:02}")
        }
    }

    #[cfg(test)]
    mod t {
        #[test]
        fn renders_hundredths() {
            assert_eq!(super::render_hundredths(425), "4.25");
            assert_eq!(super::render_hundredths(450), "4.5");
            assert_eq!(super::render_hundredths(400), "4");
            assert_eq!(super::render_hundredths(5), "0.05");
        }
    }
}
