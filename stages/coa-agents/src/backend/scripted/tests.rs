//! Unit tests of the scripted expert: observation parsing, sub-task programs, code examples,
//! random streams and noise validation.

use super::math_code::{code_example, edge_inputs, printed_value, setup_program};
use super::multihop::{crawled_text, search_hits};
use super::rng::Streams;
use super::{Noise, ScriptedBackend};

#[test]
fn reads_observations() {
    let obs = "Found 2 results:\n\n1. [Zentor X2](https://wiki.local/Zentor_X2)\nThe Zentor X2 is ...\n\n2. [Zentor X3](https://wiki.local/Zentor_X3)\nsnippet";
    assert_eq!(
        search_hits(obs),
        vec![
            ("Zentor X2".to_string(), "https://wiki.local/Zentor_X2".to_string()),
            ("Zentor X3".to_string(), "https://wiki.local/Zentor_X3".to_string())
        ]
    );
    let crawl = "Page 1 [https://w/a] Summary:\nAlpha text.\n\nPage 2 [https://w/b] Summary:\nBeta text.";
    assert_eq!(crawled_text(crawl, "https://w/a"), Some("Alpha text."));
    assert_eq!(crawled_text(crawl, "https://w/b"), Some("Beta text."));
    assert_eq!(crawled_text(crawl, "https://w/c"), None);
    assert_eq!(printed_value("[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\nx\n6205\n[STDOUT:END]").as_deref(), Some("6205"));
    assert_eq!(printed_value("[FAILED] Code exited with status 1.\n[STDOUT:BEGIN]\n1\n[STDOUT:END]"), None);
}

#[test]
fn sub_task_rounds() {
    assert_eq!(setup_program("import math\nn = 14\nr = 0.75 / 100\ni = r / 12\nprint(n)\n").unwrap(), "# the quantities given in the statement\nn = 14\nr = 0.75 / 100\nprint('n =', n)\nprint('r =', r)");
    assert_eq!(setup_program("x, y = 1, 2\n"), None);
    assert_eq!(edge_inputs("f([20, 33, 68])"), Some(("f".to_string(), vec!["[]".to_string(), "[20]".to_string()])));
    assert_eq!(edge_inputs("f(['a, b', 'c'])"), Some(("f".to_string(), vec!["[]".to_string(), "['a, b']".to_string()])));
    assert_eq!(edge_inputs("f('hello world')"), Some(("f".to_string(), vec!["''".to_string(), "'h'".to_string()])));
    assert_eq!(edge_inputs("f(27)"), Some(("f".to_string(), vec!["1".to_string(), "28".to_string()])));
    assert_eq!(edge_inputs("f([1], 2)"), None);
    assert_eq!(edge_inputs("f('a\\'b')"), None);
}

#[test]
fn finds_code_examples() {
    assert_eq!(
        code_example("Write `f(xs)`.\n\nExample: `f([1, 2])` returns `[2, 1]`."),
        Some(("f([1, 2])".to_string(), "[2, 1]".to_string()))
    );
    assert_eq!(
        code_example("```python\ndef g(a):\n    \"\"\"\n    >>> g([1.0, 2.0], 0.5)\n    False\n    \"\"\"\n```"),
        Some(("g([1.0, 2.0], 0.5)".to_string(), "False".to_string()))
    );
    assert_eq!(code_example("no example"), None);
}

#[test]
fn streams_differ_by_purpose_and_task_and_are_uniform_enough() {
    let s = Streams { seed: 1, task_id: "t" };
    assert_ne!(s.rng("a").next_u64(), s.rng("b").next_u64());
    assert_ne!(s.rng("a").next_u64(), Streams { seed: 1, task_id: "u" }.rng("a").next_u64());
    let mut r = s.rng("x");
    let hits = (0..10_000).filter(|_| r.chance(0.3)).count();
    assert!((2_800..3_200).contains(&hits), "{hits}");
}

#[test]
fn noise_rates_are_checked() {
    assert!(ScriptedBackend::new(0, Noise { give_up: 1.5, ..Noise::default() }).unwrap_err().to_string().contains("--noise-give-up"));
    assert!(ScriptedBackend::new(0, Noise::default()).is_ok());
}
