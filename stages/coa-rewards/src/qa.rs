//! Question-answering rewards: SQuAD normalisation, exact match and token F1.
//!
//! Answers compare after SQuAD's normalisation ([`normalize_answer`]), except an answer that
//! normalises to nothing (only an article, like the multiple-choice letter `A`): it keeps its
//! article ([`comparable_answer`]), so that a gold `A` can be matched.
//!
//! # Several answers: `|`
//! AFM separates several answers in one `<answer>` with `|`. A prediction is split on `|` into
//! its parts (trimmed, empty parts dropped, duplicates after normalisation merged). Gold answers
//! are *alternatives* (any one counts), except that a gold itself containing `|` is a *set* of
//! answers that must all be given. So:
//!
//! - [`exact_match`] is true when **every** predicted part equals (after
//!   [`normalize_answer`]) one of the single golds — so `"Fymdou | Federation of Fymdou"` (two
//!   aliases of one answer) matches, but hedging with a wrong extra part (`"Fymdou|Toultath"`)
//!   does not — or when the set of predicted parts equals the set of parts of a `|` gold
//!   (order-insensitive).
//! - [`f1`] is the best, over golds, SQuAD token F1 between the bag of tokens of all predicted
//!   parts and the bag of tokens of the gold's parts: extra parts cost precision, missing
//!   parts cost recall.

use std::collections::HashMap;

/// SQuAD's answer normalisation: lowercase, drop ASCII punctuation, drop the articles `a`,
/// `an`, `the` (as whitespace-separated words), collapse whitespace.
pub fn normalize_answer(s: &str) -> String {
    let lower = s.to_lowercase();
    let no_punct: String = lower.chars().filter(|c| !c.is_ascii_punctuation()).collect();
    no_punct
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What an answer is compared as: its SQuAD normalisation, or, when that leaves nothing (the
/// answer is only an article, such as the multiple-choice letter `A`, or only punctuation), the
/// same normalisation keeping the articles: lowercase, no ASCII punctuation, single spaces.
pub fn comparable_answer(s: &str) -> String {
    let squad = normalize_answer(s);
    if !squad.is_empty() {
        return squad;
    }
    let lower = s.to_lowercase();
    let no_punct: String = lower.chars().filter(|c| !c.is_ascii_punctuation()).collect();
    no_punct.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The parts of a `|`-separated answer, trimmed, without empty parts.
pub fn split_answers(s: &str) -> Vec<&str> {
    s.split('|').map(str::trim).filter(|p| !p.is_empty()).collect()
}

/// Normalised, deduplicated, non-empty parts (sorted, so sets compare equal).
fn normalized_parts(s: &str) -> Vec<String> {
    let mut parts: Vec<String> = split_answers(s).into_iter().map(comparable_answer).filter(|p| !p.is_empty()).collect();
    parts.sort();
    parts.dedup();
    parts
}

/// Exact match of `pred` against the gold answers (see the module docs for `|`).
/// An empty prediction never matches.
pub fn exact_match<S: AsRef<str>>(pred: &str, golds: &[S]) -> bool {
    let pred_parts = normalized_parts(pred);
    if pred_parts.is_empty() {
        return false;
    }
    let mut singles: Vec<String> = Vec::new();
    for gold in golds {
        let gold = gold.as_ref();
        if split_answers(gold).len() > 1 {
            if normalized_parts(gold) == pred_parts {
                return true;
            }
        } else {
            let g = comparable_answer(gold);
            if !g.is_empty() {
                singles.push(g);
            }
        }
    }
    pred_parts.iter().all(|p| singles.iter().any(|g| g == p))
}

fn token_f1(pred: &[&str], gold: &[&str]) -> f64 {
    if pred.is_empty() || gold.is_empty() {
        return if pred.is_empty() && gold.is_empty() { 1.0 } else { 0.0 };
    }
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for t in gold {
        *counts.entry(t).or_default() += 1;
    }
    let mut common = 0i64;
    for t in pred {
        if let Some(c) = counts.get_mut(t) {
            if *c > 0 {
                *c -= 1;
                common += 1;
            }
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / pred.len() as f64;
    let recall = common as f64 / gold.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// SQuAD token F1 of `pred`, the best over `golds` (see the module docs for `|`). 0 when there
/// is no gold or the prediction is empty.
pub fn f1<S: AsRef<str>>(pred: &str, golds: &[S]) -> f64 {
    let pred_norm = normalized_parts(pred).join(" ");
    let pred_tokens: Vec<&str> = pred_norm.split_whitespace().collect();
    if pred_tokens.is_empty() {
        return 0.0;
    }
    golds
        .iter()
        .map(|g| {
            let gold_norm = normalized_parts(g.as_ref()).join(" ");
            let gold_tokens: Vec<&str> = gold_norm.split_whitespace().collect();
            if gold_tokens.is_empty() {
                0.0
            } else {
                token_f1(&pred_tokens, &gold_tokens)
            }
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squad_normalisation() {
        assert_eq!(normalize_answer("The  Federation of Fymdou!"), "federation of fymdou");
        assert_eq!(normalize_answer("  A cat, an owl & THE dog. "), "cat owl dog");
        assert_eq!(normalize_answer("Vellox-Dynamics"), "velloxdynamics");
        assert_eq!(normalize_answer("theory"), "theory");
        assert_eq!(normalize_answer(""), "");
    }

    #[test]
    fn exact_match_with_aliases_and_several_answers() {
        let golds = ["Fymdou", "Federation of Fymdou"];
        assert!(exact_match("fymdou", &golds));
        assert!(exact_match("the Federation of Fymdou.", &golds));
        assert!(exact_match("Fymdou | Federation of Fymdou", &golds));
        assert!(!exact_match("Fymdou|Toultath", &golds));
        assert!(!exact_match("Toultath", &golds));
        assert!(!exact_match("", &golds));
        assert!(!exact_match(" | ", &golds));
        assert!(!exact_match("Fymdou", &[] as &[&str]));
        // a gold that is itself a set of answers must be given whole, in any order
        let set = ["Paris|London"];
        assert!(exact_match("london | paris", &set));
        assert!(!exact_match("Paris", &set));
        assert!(!exact_match("Paris|London|Rome", &set));
        // an answer that is only an article is compared with its article kept: a gold `A`
        // (a multiple-choice letter) matches `A` and `a.`, not `B` or `the`
        assert!(exact_match("A", &["A"]));
        assert!(exact_match("a.", &["A"]));
        assert!(exact_match("(A)", &["A"]));
        assert!(!exact_match("B", &["A"]));
        assert!(!exact_match("the", &["a"]));
        assert!(!exact_match(" . ", &["."]), "punctuation alone is nothing to compare");
        assert_eq!(f1("A", &["A"]), 1.0);
        assert_eq!(comparable_answer("The Dog"), "dog");
        assert_eq!(comparable_answer("An"), "an");
    }

    #[test]
    fn f1_scores() {
        assert!((f1("Federation of Fymdou", &["Fymdou"]) - 0.5).abs() < 1e-12);
        assert_eq!(f1("fymdou", &["Toultath", "Fymdou"]), 1.0);
        assert_eq!(f1("Toultath", &["Fymdou"]), 0.0);
        assert_eq!(f1("", &["Fymdou"]), 0.0);
        assert!((f1("Paris|Rome", &["Paris|London"]) - 0.5).abs() < 1e-12);
        assert_eq!(f1("London|Paris", &["Paris|London"]), 1.0);
    }
}
