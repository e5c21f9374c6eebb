//! The `code` suite: function-writing problems with HumanEval-style unit tests.
//!
//! The question names a Python function (signature in backticks), describes its behaviour with
//! the template's parameters baked in (a divisor, a shift, a width, a letter set, ...) and gives
//! one example call with its result. `entry_point` is the function name; `test_code` is
//!
//! ```python
//! def check(candidate):
//!     assert candidate(<args>) == <expected>
//!     ...
//!
//! check(<entry_point>)
//! ```
//!
//! run after the candidate code (exit 0 = pass). `answers` is empty; `tools = ["code"]`. Every
//! number written in a question belongs to the split (see the [`super`] module docs); the
//! expected values in `test_code` come from a Rust re-implementation of each template.
//!
//! # Solution format (`Task::solution`, JSON of [`CodeSolution`])
//! ```json
//! {"code": "def rotate_right(xs):\n    ...",        // reference implementation: passes test_code
//!  "buggy_code": "def rotate_right(xs):\n    ..."}  // plausible wrong one (off-by-one, wrong direction, ...): fails test_code
//! ```

use std::collections::HashSet;

use anyhow::{bail, Result};
use coa_schemas::rows::Task;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{base_task, difficulty, nums, numbers_in_split, Split, Suite};

/// `Task::solution` of a code task (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeSolution {
    pub code: String,
    pub buggy_code: String,
}

/// A Python value, rendered as a literal.
#[derive(Debug, Clone, PartialEq)]
enum Py {
    Int(i64),
    Str(String),
    List(Vec<Py>),
    Bool(bool),
    None,
}

impl Py {
    fn lit(&self) -> String {
        match self {
            Py::Int(v) => v.to_string(),
            Py::Bool(b) => if *b { "True" } else { "False" }.to_string(),
            Py::None => "None".to_string(),
            Py::List(xs) => format!("[{}]", xs.iter().map(Py::lit).collect::<Vec<_>>().join(", ")),
            Py::Str(s) => {
                let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
                let mut out = String::with_capacity(s.len() + 2);
                out.push(q);
                for c in s.chars() {
                    match c {
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if c == q => {
                            out.push('\\');
                            out.push(c);
                        }
                        c => out.push(c),
                    }
                }
                out.push(q);
                out
            }
        }
    }
}

fn ints(xs: &[i64]) -> Py {
    Py::List(xs.iter().map(|&x| Py::Int(x)).collect())
}

fn s(x: &str) -> Py {
    Py::Str(x.to_string())
}

struct Item {
    entry: &'static str,
    /// e.g. `rotate_right(xs)`
    sig: String,
    behaviour: String,
    example: (Vec<Py>, Py),
    reference: String,
    buggy: String,
    tests: Vec<(Vec<Py>, Py)>,
    level: u8,
}

impl Item {
    fn question(&self) -> String {
        let args = self.example.0.iter().map(Py::lit).collect::<Vec<_>>().join(", ");
        format!(
            "Write a Python function `{}` that {}\n\nExample: `{}({})` returns `{}`.",
            self.sig,
            self.behaviour,
            self.entry,
            args,
            self.example.1.lit()
        )
    }

    fn test_code(&self) -> String {
        let mut t = String::from("def check(candidate):\n");
        for (args, want) in &self.tests {
            let a = args.iter().map(Py::lit).collect::<Vec<_>>().join(", ");
            t.push_str(&format!("    assert candidate({a}) == {}\n", want.lit()));
        }
        t.push_str(&format!("\n\ncheck({})\n", self.entry));
        t
    }
}

const WORDS: &[&str] = &[
    "apple", "river", "stone", "zebra", "quiet", "yellow", "mango", "pixel", "lucky", "cloud", "tiger", "ocean", "jazz",
    "fuzzy", "wizard", "lemon", "paper", "kite", "moon", "sun", "bridge", "garden", "violet", "xylophone", "honey",
    "owl", "map", "sky", "tree", "window", "quartz", "rhythm", "ember", "north", "velvet",
];

fn rand_list<R: Rng>(rng: &mut R, len: usize, lo: i64, hi: i64) -> Vec<i64> {
    (0..len).map(|_| rng.random_range(lo..=hi)).collect()
}

/// A list whose every element (as written) belongs to the split.
fn class_list<R: Rng>(rng: &mut R, len: usize, lo: i64, hi: i64, split: Split) -> Vec<i64> {
    (0..len).map(|_| nums::int(rng, lo, hi, split)).collect()
}

fn word<R: Rng>(rng: &mut R) -> &'static str {
    WORDS[rng.random_range(0..WORDS.len())]
}

fn sentence<R: Rng>(rng: &mut R, k: usize) -> String {
    (0..k).map(|_| word(rng)).collect::<Vec<_>>().join(" ")
}

const TEMPLATES: usize = 22;

fn template(rng: &mut ChaCha8Rng, split: Split, t: usize) -> Option<Item> {
    let item = match t {
        0 => {
            let k = nums::int(rng, 3, 19, split);
            let f = |xs: &[i64]| ints(&xs.iter().copied().filter(|x| x % k == 0).collect::<Vec<_>>());
            let mut ex = class_list(rng, 5, 1, 99, split);
            ex[rng.random_range(0..5)] = k * nums::int(rng, 1, 6, split);
            let cases = [vec![0, -k, k, k + 1, 3 * k], vec![], rand_list(rng, 8, -50, 100), rand_list(rng, 6, 0, 200)];
            Item {
                entry: "filter_divisible",
                sig: "filter_divisible(xs)".into(),
                behaviour: format!(
                    "returns a list of the elements of the list of integers `xs` that are divisible by {k}, in their original order."
                ),
                example: (vec![ints(&ex)], f(&ex)),
                reference: format!("def filter_divisible(xs):\n    return [x for x in xs if x % {k} == 0]\n"),
                buggy: format!("def filter_divisible(xs):\n    return [x for x in xs if x % {k} == 0 and x > 0]\n"),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 0,
            }
        }
        1 => {
            let k = nums::int(rng, 1, 25, split);
            let f = |x: &str| {
                s(&x.chars()
                    .map(|c| (if c.is_ascii_lowercase() { (((c as u8 - b'a') as i64 + k) % 26) as u8 + b'a' } else { c as u8 }) as char)
                    .collect::<String>())
            };
            let ex = sentence(rng, 2);
            let cases = ["xyz".to_string(), "hello, world!".to_string(), String::new(), "Zebra zone".to_string(), sentence(rng, 3)];
            Item {
                entry: "caesar",
                sig: "caesar(s)".into(),
                behaviour: format!(
                    "shifts every lowercase letter of the string `s` forward by {k} places in the alphabet, wrapping around from 'z' back to 'a', and leaves all other characters unchanged."
                ),
                example: (vec![s(&ex)], f(&ex)),
                reference: format!(
                    "def caesar(s):\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n            out.append(chr((ord(c) - ord('a') + {k}) % 26 + ord('a')))\n        else:\n            out.append(c)\n    return ''.join(out)\n"
                ),
                buggy: format!(
                    "def caesar(s):\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n            out.append(chr(ord(c) + {k}))\n        else:\n            out.append(c)\n    return ''.join(out)\n"
                ),
                tests: cases.iter().map(|c| (vec![s(c)], f(c))).collect(),
                level: 0,
            }
        }
        2 => {
            let mut letters: Vec<u8> = (b'a'..=b'z').collect();
            letters.shuffle(rng);
            let mut set: Vec<u8> = letters[..rng.random_range(3..=5)].to_vec();
            set.sort();
            let set = String::from_utf8(set).expect("ascii");
            let f = |x: &str| Py::Int(x.chars().filter(|c| set.contains(c.to_ascii_lowercase())).count() as i64);
            let ex = format!("{} {}", word(rng), word(rng).to_uppercase());
            let cases = [set.to_uppercase(), sentence(rng, 4), String::new(), format!("{}{}", set, set.to_uppercase())];
            Item {
                entry: "count_letters",
                sig: "count_letters(s)".into(),
                behaviour: format!(
                    "returns how many characters of the string `s` are one of the letters in \"{set}\", ignoring case (an upper-case letter counts like its lower-case form)."
                ),
                example: (vec![s(&ex)], f(&ex)),
                reference: format!("def count_letters(s):\n    return sum(1 for c in s.lower() if c in '{set}')\n"),
                buggy: format!("def count_letters(s):\n    return sum(1 for c in s if c in '{set}')\n"),
                tests: cases.iter().map(|c| (vec![s(c)], f(c))).collect(),
                level: 0,
            }
        }
        3 => {
            let a = nums::int(rng, 2, 13, split);
            let b = nums::int(rng, 2, 13, split);
            if a == b || a % b == 0 || b % a == 0 {
                return None;
            }
            let f = |n: i64| Py::Int((1..n.max(1)).filter(|x| x % a == 0 || x % b == 0).sum());
            let ex = nums::int(rng, 10, 60, split);
            let cases = [0, 1, a * b + 1, rng.random_range(50..=500), 3 * a * b];
            Item {
                entry: "sum_multiples",
                sig: "sum_multiples(n)".into(),
                behaviour: format!(
                    "returns the sum of all positive integers smaller than `n` that are divisible by {a} or by {b} (a number divisible by both counts once)."
                ),
                example: (vec![Py::Int(ex)], f(ex)),
                reference: format!("def sum_multiples(n):\n    return sum(x for x in range(1, n) if x % {a} == 0 or x % {b} == 0)\n"),
                buggy: format!(
                    "def sum_multiples(n):\n    return sum(x for x in range(1, n) if x % {a} == 0) + sum(x for x in range(1, n) if x % {b} == 0)\n"
                ),
                tests: cases.iter().map(|&c| (vec![Py::Int(c)], f(c))).collect(),
                level: 1,
            }
        }
        4 => {
            let k = nums::int(rng, 1, 9, split);
            let f = |xs: &[i64]| {
                if xs.is_empty() {
                    return ints(&[]);
                }
                let sh = (k as usize) % xs.len();
                let mut v = xs[xs.len() - sh..].to_vec();
                v.extend_from_slice(&xs[..xs.len() - sh]);
                ints(&v)
            };
            let len = rng.random_range(4..=6);
            let ex = class_list(rng, len, 1, 99, split);
            let cases = [rand_list(rng, 11, 0, 50), rand_list(rng, 5, -9, 9), vec![], vec![7], rand_list(rng, 13, 0, 99)];
            Item {
                entry: "rotate_right",
                sig: "rotate_right(xs)".into(),
                behaviour: format!(
                    "returns a new list with the elements of the list `xs` rotated {k} positions to the right (elements that fall off the end wrap around to the front). An empty list gives an empty list."
                ),
                example: (vec![ints(&ex)], f(&ex)),
                reference: format!(
                    "def rotate_right(xs):\n    if not xs:\n        return []\n    s = {k} % len(xs)\n    return xs[len(xs) - s:] + xs[:len(xs) - s]\n"
                ),
                buggy: format!("def rotate_right(xs):\n    if not xs:\n        return []\n    s = {k} % len(xs)\n    return xs[s:] + xs[:s]\n"),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 0,
            }
        }
        5 => {
            let k = nums::int(rng, 2, 7, split);
            let f = |xs: &[i64]| Py::List(xs.chunks(k as usize).map(ints).collect());
            let len = (k + 1) as usize + rng.random_range(0..k as usize);
            let ex = class_list(rng, len, 1, 99, split);
            let cases = [
                rand_list(rng, (k + 1) as usize, 0, 9),
                rand_list(rng, (2 * k) as usize, 0, 9),
                vec![],
                rand_list(rng, (3 * k - 1) as usize, -5, 5),
            ];
            Item {
                entry: "chunk",
                sig: "chunk(xs)".into(),
                behaviour: format!(
                    "splits the list `xs` into consecutive chunks of {k} elements and returns the list of chunks, in order; the last chunk may be shorter. An empty list gives an empty list."
                ),
                example: (vec![ints(&ex)], f(&ex)),
                reference: format!("def chunk(xs):\n    return [xs[i:i + {k}] for i in range(0, len(xs), {k})]\n"),
                buggy: format!("def chunk(xs):\n    return [xs[i:i + {k}] for i in range(0, len(xs) - {k} + 1, {k})]\n"),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 0,
            }
        }
        6 => {
            let f = |xs: &[i64]| {
                let mut t = 0;
                ints(&xs
                    .iter()
                    .map(|x| {
                        t += x;
                        t
                    })
                    .collect::<Vec<_>>())
            };
            let ex = class_list(rng, 3, 1, 40, split);
            let cases = [rand_list(rng, 5, -10, 10), vec![], rand_list(rng, 1, 0, 9), rand_list(rng, 8, 0, 100)];
            Item {
                entry: "running_total",
                sig: "running_total(xs)".into(),
                behaviour: "returns the list of running totals of the list `xs`: each element of the result is the sum of the elements of `xs` up to and including that position.".into(),
                example: (vec![ints(&ex)], f(&ex)),
                reference: "def running_total(xs):\n    out = []\n    total = 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out\n".into(),
                buggy: "def running_total(xs):\n    out = []\n    total = 0\n    for x in xs:\n        out.append(total)\n        total += x\n    return out\n".into(),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 0,
            }
        }
        7 => {
            let lo = nums::int(rng, 10, 25, split);
            let hi = nums::int(rng, lo + 5, 60, split);
            let f = |xs: &[i64]| ints(&xs.iter().map(|&x| x.clamp(lo, hi)).collect::<Vec<_>>());
            let mut ex = class_list(rng, 3, lo, hi, split);
            ex.push(nums::int(rng, hi + 1, hi + 40, split));
            ex.insert(1, nums::int(rng, 0, lo - 1, split));
            let cases = [vec![lo - 1, lo, hi, hi + 1], rand_list(rng, 6, -20, 90), vec![]];
            Item {
                entry: "clamp_all",
                sig: "clamp_all(xs)".into(),
                behaviour: format!(
                    "returns a new list in which every element of the list `xs` that is below {lo} is replaced by {lo} and every element above {hi} is replaced by {hi}; other elements stay as they are."
                ),
                example: (vec![ints(&ex)], f(&ex)),
                reference: format!("def clamp_all(xs):\n    return [min(max(x, {lo}), {hi}) for x in xs]\n"),
                buggy: format!("def clamp_all(xs):\n    return [max(x, {lo}) for x in xs]\n"),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 0,
            }
        }
        8 => {
            let f = |x: &str| {
                let t: Vec<char> = x.chars().filter(|c| c.is_alphabetic()).map(|c| c.to_ascii_lowercase()).collect();
                Py::Bool(t.iter().eq(t.iter().rev()))
            };
            let pals = ["Never odd or even", "Step on no pets", "Was it a car or a cat I saw?", "No lemon, no melon", "Madam, in Eden", "Top spot"];
            let ex = if rng.random_bool(0.5) { pals[rng.random_range(0..pals.len())].to_string() } else { sentence(rng, 2) };
            let cases = ["Abba".to_string(), "hello".to_string(), String::new(), "A man, a plan, a canal: Panama".to_string(), sentence(rng, 3)];
            Item {
                entry: "is_palindrome",
                sig: "is_palindrome(s)".into(),
                behaviour: "returns True if the string `s` reads the same forwards and backwards when only its letters are considered and upper/lower case is ignored, and False otherwise.".into(),
                example: (vec![s(&ex)], f(&ex)),
                reference: "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]\n".into(),
                buggy: "def is_palindrome(s):\n    t = [c for c in s if c.isalpha()]\n    return t == t[::-1]\n".into(),
                tests: cases.iter().map(|c| (vec![s(c)], f(c))).collect(),
                level: 0,
            }
        }
        9 => {
            let f = |mut n: i64| {
                while n >= 10 {
                    n = n.to_string().bytes().map(|b| (b - b'0') as i64).sum();
                }
                Py::Int(n)
            };
            let ex = nums::int(rng, 100, 99999, split);
            let cases = [0, 7, 99, 123456789, rng.random_range(1000..=999999)];
            Item {
                entry: "digital_root",
                sig: "digital_root(n)".into(),
                behaviour: "repeatedly replaces the non-negative integer `n` by the sum of its decimal digits until a single digit remains, and returns that digit.".into(),
                example: (vec![Py::Int(ex)], f(ex)),
                reference: "def digital_root(n):\n    while n >= 10:\n        n = sum(int(d) for d in str(n))\n    return n\n".into(),
                buggy: "def digital_root(n):\n    if n < 10:\n        return n\n    return sum(int(d) for d in str(n))\n".into(),
                tests: cases.iter().map(|&c| (vec![Py::Int(c)], f(c))).collect(),
                level: 0,
            }
        }
        10 => {
            let f = |x: &str| {
                let b = x.as_bytes();
                let mut out = String::new();
                let mut i = 0;
                while i < b.len() {
                    let mut j = i;
                    while j < b.len() && b[j] == b[i] {
                        j += 1;
                    }
                    out.push(b[i] as char);
                    out.push_str(&(j - i).to_string());
                    i = j;
                }
                s(&out)
            };
            let runs = |rng: &mut ChaCha8Rng, k: usize| -> String {
                let mut out = String::new();
                let mut prev = b' ';
                for _ in 0..k {
                    let c = loop {
                        let c = b"abcdxyz"[rng.random_range(0..7)];
                        if c != prev {
                            break c;
                        }
                    };
                    prev = c;
                    for _ in 0..rng.random_range(1..=5) {
                        out.push(c as char);
                    }
                }
                out
            };
            let ex = runs(rng, 3);
            let cases = ["aaabcc".to_string(), String::new(), "z".to_string(), runs(rng, 5), "abc".to_string()];
            Item {
                entry: "run_length",
                sig: "run_length(s)".into(),
                behaviour: "compresses the string `s` by replacing every run of equal consecutive characters with that character followed by the length of the run written in decimal, and returns the result (an empty string gives an empty string).".into(),
                example: (vec![s(&ex)], f(&ex)),
                reference: "def run_length(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)\n".into(),
                buggy: "def run_length(s):\n    out = []\n    count = 0\n    prev = ''\n    for c in s:\n        if c == prev:\n            count += 1\n        else:\n            if prev:\n                out.append(prev + str(count))\n            prev = c\n            count = 1\n    return ''.join(out)\n".into(),
                tests: cases.iter().map(|c| (vec![s(c)], f(c))).collect(),
                level: 1,
            }
        }
        11 => {
            let f = |xs: &[i64]| {
                let mut v = xs.to_vec();
                v.sort();
                v.dedup();
                if v.len() >= 2 {
                    Py::Int(v[v.len() - 2])
                } else {
                    Py::None
                }
            };
            let ex = class_list(rng, 5, 1, 99, split);
            let cases = [vec![5, 5, 3], vec![], vec![4, 4], rand_list(rng, 7, -20, 20), vec![1, 9, 9, 2, 9]];
            Item {
                entry: "second_largest",
                sig: "second_largest(xs)".into(),
                behaviour: "returns the second largest distinct value in the list of integers `xs`, or None if `xs` has fewer than two distinct values.".into(),
                example: (vec![ints(&ex)], f(&ex)),
                reference: "def second_largest(xs):\n    vals = sorted(set(xs))\n    return vals[-2] if len(vals) >= 2 else None\n".into(),
                buggy: "def second_largest(xs):\n    if len(xs) < 2:\n        return None\n    return sorted(xs)[-2]\n".into(),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 1,
            }
        }
        12 => {
            let f = |x: &str| {
                let mut best = "";
                for w in x.split_whitespace() {
                    if w.len() > best.len() {
                        best = w;
                    }
                }
                s(best)
            };
            let ex = sentence(rng, 4);
            let cases = ["cat dog".to_string(), String::new(), "a bb cc d".to_string(), sentence(rng, 5), sentence(rng, 6)];
            Item {
                entry: "longest_word",
                sig: "longest_word(s)".into(),
                behaviour: "returns the longest word of the string `s` (words are separated by spaces); if several words share the greatest length, it returns the first of them. An empty string gives an empty string.".into(),
                example: (vec![s(&ex)], f(&ex)),
                reference: "def longest_word(s):\n    best = ''\n    for w in s.split():\n        if len(w) > len(best):\n            best = w\n    return best\n".into(),
                buggy: "def longest_word(s):\n    best = ''\n    for w in s.split():\n        if len(w) >= len(best):\n            best = w\n    return best\n".into(),
                tests: cases.iter().map(|c| (vec![s(c)], f(c))).collect(),
                level: 0,
            }
        }
        13 => {
            let k = nums::int(rng, 2, 6, split);
            let f = |xs: &[i64]| {
                let mut v = xs.to_vec();
                v.sort();
                Py::Int(v[(k - 1) as usize])
            };
            let ex = class_list(rng, (k + 2) as usize, 1, 99, split);
            let cases = [
                rand_list(rng, (k + 1) as usize, 0, 50),
                rand_list(rng, (k + 4) as usize, -30, 30),
                (1..=k + 1).rev().collect::<Vec<_>>(),
            ];
            Item {
                entry: "kth_smallest",
                sig: "kth_smallest(xs)".into(),
                behaviour: format!(
                    "returns the element that would be at position {k} if the list of integers `xs` were sorted in ascending order, counting positions from one (duplicates count separately). You may assume `xs` has more than {k} elements."
                ),
                example: (vec![ints(&ex)], f(&ex)),
                reference: format!("def kth_smallest(xs):\n    return sorted(xs)[{k} - 1]\n"),
                buggy: format!("def kth_smallest(xs):\n    return sorted(xs)[{k}]\n"),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 0,
            }
        }
        14 => {
            let w = nums::int(rng, 4, 12, split);
            let f = |n: i64| s(&format!("{:0>width$}", n, width = w as usize));
            let ex = nums::int(rng, 1, 999, split);
            let cases = [7, 0, 10i64.pow(w as u32 + 1) + 3, rng.random_range(10..=9999)];
            Item {
                entry: "zero_pad",
                sig: "zero_pad(n)".into(),
                behaviour: format!(
                    "returns the non-negative integer `n` written in decimal as a string, padded on the left with zeros to a length of at least {w} characters."
                ),
                example: (vec![Py::Int(ex)], f(ex)),
                reference: format!("def zero_pad(n):\n    return str(n).zfill({w})\n"),
                buggy: format!("def zero_pad(n):\n    return str(n).rjust({w} - 1, '0')\n"),
                tests: cases.iter().map(|&c| (vec![Py::Int(c)], f(c))).collect(),
                level: 0,
            }
        }
        15 => {
            let lo = nums::int(rng, 1, 30, split);
            let hi = nums::int(rng, lo + 3, lo + 60, split);
            let f = |xs: &[i64]| Py::Int(xs.iter().filter(|&&x| lo <= x && x <= hi).count() as i64);
            let ex = class_list(rng, 5, 1, 99, split);
            let cases = [vec![lo, hi, lo - 1, hi + 1], vec![], rand_list(rng, 10, 0, 100), vec![hi, hi, hi]];
            Item {
                entry: "count_in_range",
                sig: "count_in_range(xs)".into(),
                behaviour: format!(
                    "returns how many elements of the list of integers `xs` lie between {lo} and {hi}, both ends included."
                ),
                example: (vec![ints(&ex)], f(&ex)),
                reference: format!("def count_in_range(xs):\n    return sum(1 for x in xs if {lo} <= x <= {hi})\n"),
                buggy: format!("def count_in_range(xs):\n    return sum(1 for x in xs if {lo} <= x < {hi})\n"),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 0,
            }
        }
        16 => {
            let b = nums::int(rng, 2, 9, split);
            let f = |mut n: i64| {
                if n == 0 {
                    return s("0");
                }
                let mut d = Vec::new();
                while n > 0 {
                    d.push((b'0' + (n % b) as u8) as char);
                    n /= b;
                }
                s(&d.iter().rev().collect::<String>())
            };
            let ex = nums::int(rng, 10, 500, split);
            let cases = [0, b, b * b + 1, rng.random_range(100..=100000), b - 1];
            Item {
                entry: "to_base",
                sig: "to_base(n)".into(),
                behaviour: format!(
                    "returns the representation of the non-negative integer `n` in base {b} as a string of digits, most significant digit first, without leading zeros (zero itself is written as a single zero digit)."
                ),
                example: (vec![Py::Int(ex)], f(ex)),
                reference: format!(
                    "def to_base(n):\n    if n == 0:\n        return '0'\n    digits = []\n    while n > 0:\n        digits.append(str(n % {b}))\n        n //= {b}\n    return ''.join(reversed(digits))\n"
                ),
                buggy: format!(
                    "def to_base(n):\n    if n == 0:\n        return '0'\n    digits = []\n    while n > 0:\n        digits.append(str(n % {b}))\n        n //= {b}\n    return ''.join(digits)\n"
                ),
                tests: cases.iter().map(|&c| (vec![Py::Int(c)], f(c))).collect(),
                level: 1,
            }
        }
        17 => {
            let f = |xs: &[i64]| {
                let mut seen = Vec::new();
                for &x in xs {
                    if !seen.contains(&x) {
                        seen.push(x);
                    }
                }
                ints(&seen)
            };
            let mut ex = class_list(rng, 4, 1, 99, split);
            ex.insert(rng.random_range(1..=4), ex[0]);
            let cases = [vec![3, 1, 3, 2], vec![], rand_list(rng, 10, 0, 5), vec![9, 8, 7, 8, 9]];
            Item {
                entry: "dedupe",
                sig: "dedupe(xs)".into(),
                behaviour: "returns the elements of the list `xs` with repeated values removed, keeping only the first occurrence of each value and preserving the original order.".into(),
                example: (vec![ints(&ex)], f(&ex)),
                reference: "def dedupe(xs):\n    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n".into(),
                buggy: "def dedupe(xs):\n    return sorted(set(xs))\n".into(),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 0,
            }
        }
        18 => {
            let w = nums::int(rng, 2, 5, split);
            let f = |xs: &[i64]| ints(&xs.windows(w as usize).map(|x| x.iter().sum()).collect::<Vec<i64>>());
            let ex = class_list(rng, (w + 1) as usize, 1, 40, split);
            let cases = [rand_list(rng, (w + 3) as usize, -9, 9), rand_list(rng, w as usize, 0, 9), vec![], rand_list(rng, (w - 1) as usize, 0, 9)];
            Item {
                entry: "window_sums",
                sig: "window_sums(xs)".into(),
                behaviour: format!(
                    "returns the sums of every block of {w} consecutive elements of the list `xs`, from left to right (an empty list if `xs` has fewer than {w} elements)."
                ),
                example: (vec![ints(&ex)], f(&ex)),
                reference: format!("def window_sums(xs):\n    return [sum(xs[i:i + {w}]) for i in range(len(xs) - {w} + 1)]\n"),
                buggy: format!("def window_sums(xs):\n    return [sum(xs[i:i + {w}]) for i in range(len(xs) - {w})]\n"),
                tests: cases.iter().map(|c| (vec![ints(c)], f(c))).collect(),
                level: 1,
            }
        }
        19 => {
            let k = nums::int(rng, 3, 7, split);
            let f = |x: &str| Py::Int(x.split_whitespace().filter(|w| w.len() > k as usize).count() as i64);
            let ex = sentence(rng, 4);
            let exact = "q".repeat(k as usize);
            let cases = [format!("{exact} {exact}x"), String::new(), sentence(rng, 6), sentence(rng, 3)];
            Item {
                entry: "count_long_words",
                sig: "count_long_words(s)".into(),
                behaviour: format!("returns how many words of the string `s` (words are separated by spaces) have more than {k} characters."),
                example: (vec![s(&ex)], f(&ex)),
                reference: format!("def count_long_words(s):\n    return sum(1 for w in s.split() if len(w) > {k})\n"),
                buggy: format!("def count_long_words(s):\n    return sum(1 for w in s.split() if len(w) >= {k})\n"),
                tests: cases.iter().map(|c| (vec![s(c)], f(c))).collect(),
                level: 0,
            }
        }
        20 => {
            let f = |mut n: i64| {
                let mut steps = 0;
                while n != 1 {
                    n = if n % 2 == 0 { n / 2 } else { 3 * n + 1 };
                    steps += 1;
                }
                Py::Int(steps)
            };
            let ex = nums::int(rng, 5, 200, split);
            let cases = [1, 2, 27, rng.random_range(3..=1000)];
            Item {
                entry: "collatz_steps",
                sig: "collatz_steps(n)".into(),
                behaviour: "returns how many steps it takes to reach one from the positive integer `n`, where each step halves an even number and replaces an odd number x by three times x plus one.".into(),
                example: (vec![Py::Int(ex)], f(ex)),
                reference: "def collatz_steps(n):\n    steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps\n".into(),
                buggy: "def collatz_steps(n):\n    steps = 1\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps\n".into(),
                tests: cases.iter().map(|&c| (vec![Py::Int(c)], f(c))).collect(),
                level: 1,
            }
        }
        _ => {
            let f = |x: &str| {
                s(&x.split(' ')
                    .map(|w| {
                        let mut c = w.chars();
                        match c.next() {
                            Some(h) => h.to_ascii_uppercase().to_string() + c.as_str(),
                            None => String::new(),
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" "))
            };
            let mut ex = sentence(rng, 3);
            if rng.random_bool(0.5) {
                ex.push_str(" mIxEd");
            }
            let cases = ["hELLO wORLD".to_string(), String::new(), "don't stop".to_string(), sentence(rng, 4)];
            Item {
                entry: "capitalize_words",
                sig: "capitalize_words(s)".into(),
                behaviour: "returns the string `s` with the first character of every word turned into upper case and every other character left unchanged (words are separated by single spaces).".into(),
                example: (vec![s(&ex)], f(&ex)),
                reference: "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n".into(),
                buggy: "def capitalize_words(s):\n    return s.title()\n".into(),
                tests: cases.iter().map(|c| (vec![s(c)], f(c))).collect(),
                level: 0,
            }
        }
    };
    Some(item)
}

pub(crate) fn generate(rng: &mut ChaCha8Rng, n: usize, split: Split) -> Result<Vec<Task>> {
    let mut seen = HashSet::new();
    let mut tasks = Vec::with_capacity(n);
    let mut attempts = 0usize;
    while tasks.len() < n {
        attempts += 1;
        if attempts > 1000 + n * 200 {
            bail!("could not draw {n} distinct code problems");
        }
        let t = rng.random_range(0..TEMPLATES);
        let Some(item) = template(rng, split, t) else { continue };
        let question = item.question();
        if !numbers_in_split(&question, split) || !seen.insert(question.clone()) {
            continue;
        }
        let i = tasks.len();
        let mut task = base_task(Suite::Code, split, i);
        task.question = question;
        task.entry_point = Some(item.entry.to_string());
        task.test_code = Some(item.test_code());
        task.difficulty = Some(difficulty(item.level));
        let sol = CodeSolution { code: item.reference, buggy_code: item.buggy };
        task.solution = Some(serde_json::to_string(&sol).expect("solution serialises"));
        tasks.push(task);
    }
    Ok(tasks)
}

#[cfg(test)]
pub(crate) const N_TEMPLATES: usize = TEMPLATES;

/// (question, reference, buggy, test_code) of one template draw, for tests.
#[cfg(test)]
pub(crate) fn template_for_test(rng: &mut ChaCha8Rng, split: Split, t: usize) -> Option<(String, String, String, String)> {
    template(rng, split, t).map(|i| (i.question(), i.test_code(), i)).map(|(q, tc, i)| (q, i.reference, i.buggy, tc))
}

#[cfg(test)]
mod t {
    use super::*;

    #[test]
    fn python_literals() {
        assert_eq!(Py::List(vec![Py::Int(-3), Py::Str("it's".into()), Py::None, Py::Bool(true)]).lit(), "[-3, \"it's\", None, True]");
        assert_eq!(s("a'b\"c\\").lit(), "'a\\'b\"c\\\\'");
        assert_eq!(Py::List(vec![]).lit(), "[]");
    }
}
