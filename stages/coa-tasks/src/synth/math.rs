//! The `math` suite: word problems whose numbers need computing with the `code` tool.
//!
//! Templates: compound interest, depreciation, loan payments, average speed (decimal answers,
//! rounded to the cent / two decimals as the question states), arithmetic and geometric series,
//! modular exponentiation, combinations, unit-rate chains, sums and counts of multiples, and
//! Fibonacci-like sequences (integer answers). Every number written in a question belongs to the
//! split (see the [`super`] module docs).
//!
//! Answers are plain strings: an integer (`"1234"`) or a decimal with exactly two places
//! (`"1234.56"`, no currency sign or separators). `answers = [answer]`, `tools = ["code"]`.
//!
//! # Solution format (`Task::solution`, JSON of [`MathSolution`])
//! ```json
//! {"code": "P = 1500\n...\nprint(f\"{balance:.2f}\")\n", // python3 that prints the answer
//!  "answer": "1725.41",                                  // = answers[0], what `code` prints
//!  "buggy_code": "...",                                  // a plausible wrong program (off-by-one, wrong formula)
//!  "buggy_answer": "1717.50"}                            // what `buggy_code` prints; never equal to `answer`
//! ```

use std::collections::HashSet;

use anyhow::{bail, Result};
use coa_schemas::rows::Task;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::names::NameGen;
use super::{base_task, difficulty, nums, numbers_in_split, Split, Suite};

/// `Task::solution` of a math task (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MathSolution {
    pub code: String,
    pub answer: String,
    pub buggy_code: String,
    pub buggy_answer: String,
}

struct Item {
    question: String,
    answer: String,
    code: String,
    buggy_code: String,
    buggy_answer: String,
    level: u8,
}

/// Cents, or None when the value sits so close to a rounding tie that a last-ulp difference
/// between libms could flip it.
fn cents(v: f64) -> Option<String> {
    if !v.is_finite() {
        return None;
    }
    let x = v * 100.0;
    let frac = x - x.floor();
    if (frac - 0.5).abs() < 1e-4 {
        return None;
    }
    Some(format!("{v:.2}"))
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn modpow(mut b: u128, mut e: u128, m: u128) -> u128 {
    let mut r = 1 % m;
    b %= m;
    while e > 0 {
        if e & 1 == 1 {
            r = r * b % m;
        }
        b = b * b % m;
        e >>= 1;
    }
    r
}

fn comb(n: u128, k: u128) -> u128 {
    let mut r = 1u128;
    for i in 0..k {
        r = r * (n - i) / (i + 1);
    }
    r
}

fn ordinal(n: i64) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

const TEMPLATES: usize = 12;

fn template(rng: &mut ChaCha8Rng, names: &mut NameGen, t: usize) -> Option<Item> {
    let split = names.split();
    match t {
        // compound interest
        0 => {
            let p = nums::int(rng, 500, 50000, split);
            let (rs, r) = nums::hundredths(rng, 2, 48, 25, split);
            let (freq, k) = [("annually", 1i64), ("quarterly", 4), ("monthly", 12), ("daily", 365)][rng.random_range(0..4)];
            let t = nums::int(rng, 2, 30, split);
            let female = rng.random_bool(0.5);
            let name = names.first_name(rng, female, false);
            let rr = r / 100.0;
            let bal = p as f64 * (1.0 + rr / k as f64).powf((k * t) as f64);
            let bug = p as f64 * (1.0 + rr * t as f64);
            let question = format!(
                "{name} deposits ${p} in a savings account that pays {rs}% annual interest, compounded {freq}. \
                 No other deposits or withdrawals are made. What is the balance after {t} years? \
                 Give the amount in dollars, rounded to the nearest cent."
            );
            let head = format!("P = {p}\nr = {rs} / 100\nk = {k}\nt = {t}\n");
            Some(Item {
                question,
                answer: cents(bal)?,
                code: format!("{head}balance = P * (1 + r / k) ** (k * t)\nprint(f\"{{balance:.2f}}\")\n"),
                buggy_code: format!("{head}balance = P * (1 + r * t)\nprint(f\"{{balance:.2f}}\")\n"),
                buggy_answer: cents(bug)?,
                level: 1,
            })
        }
        // depreciation
        1 => {
            let p = nums::int(rng, 5000, 90000, split);
            let (ds, d) = nums::hundredths(rng, 4, 30, 50, split);
            let t = nums::int(rng, 2, 15, split);
            let thing = ["machine", "delivery van", "printing press", "tractor", "server rack"][rng.random_range(0..5)];
            let v = p as f64 * (1.0 - d / 100.0).powf(t as f64);
            let bug = p as f64 * (1.0 - d / 100.0 * t as f64);
            let question = format!(
                "A {thing} bought for ${p} loses {ds}% of its value every year, each year's loss being \
                 computed on its value at the start of that year. What is it worth after {t} years? \
                 Round to the nearest cent."
            );
            let head = format!("P = {p}\nd = {ds}\nt = {t}\n");
            Some(Item {
                question,
                answer: cents(v)?,
                code: format!("{head}value = P * (1 - d / 100) ** t\nprint(f\"{{value:.2f}}\")\n"),
                buggy_code: format!("{head}value = P * (1 - d / 100 * t)\nprint(f\"{{value:.2f}}\")\n"),
                buggy_answer: cents(bug)?,
                level: 1,
            })
        }
        // loan payment
        2 => {
            let p = nums::int(rng, 5000, 400000, split);
            let (rs, r) = nums::hundredths(rng, 4, 40, 25, split);
            let y = nums::int(rng, 2, 30, split);
            let female = rng.random_bool(0.5);
            let name = names.first_name(rng, female, false);
            let i = r / 100.0 / 12.0;
            let n = (y * 12) as f64;
            let pay = p as f64 * i / (1.0 - (1.0 + i).powf(-n));
            let ib = r / 100.0;
            let bug = p as f64 * ib / (1.0 - (1.0 + ib).powf(-n));
            let question = format!(
                "{name} borrows ${p} at an annual interest rate of {rs}%, compounded monthly, and repays it in \
                 equal monthly payments over {y} years. How large is each monthly payment? \
                 Round to the nearest cent."
            );
            let head = format!("P = {p}\nr = {rs}\ny = {y}\n");
            Some(Item {
                question,
                answer: cents(pay)?,
                code: format!("{head}i = r / 100 / 12\nn = y * 12\npayment = P * i / (1 - (1 + i) ** -n)\nprint(f\"{{payment:.2f}}\")\n"),
                buggy_code: format!("{head}i = r / 100\nn = y * 12\npayment = P * i / (1 - (1 + i) ** -n)\nprint(f\"{{payment:.2f}}\")\n"),
                buggy_answer: cents(bug)?,
                level: 2,
            })
        }
        // arithmetic series
        3 => {
            let a = nums::int(rng, 8, 40, split);
            let d = nums::int(rng, 1, 9, split);
            let n = nums::int(rng, 10, 60, split);
            let total = n * a + d * n * (n - 1) / 2;
            let bug = n * a + d * n * (n + 1) / 2;
            let question = format!(
                "The first row of a theatre has {a} seats, and every row after it has {d} more seat{} than the \
                 row in front of it. The theatre has {n} rows. How many seats does it have in total?",
                if d == 1 { "" } else { "s" }
            );
            let head = format!("a = {a}\nd = {d}\nn = {n}\n");
            Some(Item {
                question,
                answer: total.to_string(),
                code: format!("{head}print(sum(a + d * i for i in range(n)))\n"),
                buggy_code: format!("{head}print(sum(a + d * i for i in range(1, n + 1)))\n"),
                buggy_answer: bug.to_string(),
                level: 0,
            })
        }
        // geometric series
        4 => {
            let a = nums::int(rng, 1, 50, split);
            let r = nums::int(rng, 2, 5, split);
            let n = nums::int(rng, 6, 25, split);
            let female = rng.random_bool(0.5);
            let name = names.first_name(rng, female, false);
            let sum = |terms: i64| -> u128 {
                let (mut s, mut x) = (0u128, a as u128);
                for _ in 0..terms {
                    s += x;
                    x *= r as u128;
                }
                s
            };
            let question = format!(
                "{name} saves ${a} in the first week and, in every week after that, saves {r} times as much as in \
                 the week before. How many dollars has {name} saved in total after {n} weeks?"
            );
            let head = format!("a = {a}\nr = {r}\nn = {n}\n");
            Some(Item {
                question,
                answer: sum(n).to_string(),
                code: format!("{head}total = 0\namount = a\nfor week in range(n):\n    total += amount\n    amount *= r\nprint(total)\n"),
                buggy_code: format!("{head}total = 0\namount = a\nfor week in range(n - 1):\n    total += amount\n    amount *= r\nprint(total)\n"),
                buggy_answer: sum(n - 1).to_string(),
                level: 1,
            })
        }
        // modular exponentiation
        5 => {
            let b = nums::int(rng, 2, 999, split);
            let e = nums::int(rng, 1000, 999999, split);
            let m = nums::int(rng, 1000, 99999, split);
            let ans = modpow(b as u128, e as u128, m as u128);
            let bug = modpow(b as u128, (e - 1) as u128, m as u128);
            if ans == bug {
                return None;
            }
            let question = format!(
                "A lock's code is the remainder when {b} raised to the power {e} is divided by {m}. What is the code?"
            );
            let head = format!("b = {b}\ne = {e}\nm = {m}\n");
            Some(Item {
                question,
                answer: ans.to_string(),
                code: format!("{head}print(pow(b, e, m))\n"),
                buggy_code: format!("{head}print(pow(b, e - 1, m))\n"),
                buggy_answer: bug.to_string(),
                level: 2,
            })
        }
        // combinations
        6 => {
            let n = nums::int(rng, 10, 60, split);
            let k = nums::int(rng, 2, (n / 2).min(12), split);
            let question = format!(
                "A club has {n} members. In how many different ways can a committee of {k} members be chosen, \
                 if the order in which they are chosen does not matter?"
            );
            let (nu, ku) = (n as u128, k as u128);
            let perm = comb(nu, ku) * (1..=ku).product::<u128>();
            let head = format!("import math\nn = {n}\nk = {k}\n");
            Some(Item {
                question,
                answer: comb(nu, ku).to_string(),
                code: format!("{head}print(math.comb(n, k))\n"),
                buggy_code: format!("{head}print(math.perm(n, k))\n"),
                buggy_answer: perm.to_string(),
                level: 0,
            })
        }
        // unit-rate chain
        7 => {
            let h = nums::int(rng, 2, 15, split);
            let b = nums::int(rng, 20, 500, split);
            let divisors: Vec<i64> =
                [2i64, 3, 4, 5, 6, 10, 12, 15, 20, 30].into_iter().filter(|d| super::split_of_token(&d.to_string()) == split).collect();
            let m = divisors[rng.random_range(0..divisors.len())];
            let c = nums::int(rng, 6, 48, split);
            let t = nums::int(rng, 2, 12, split);
            let ans = h * b * (60 / m) * t / c;
            let bug = h * b * t / c;
            if ans == bug {
                return None;
            }
            let question = format!(
                "A bottling machine fills {b} bottles every {m} minutes. A crate holds {c} bottles. \
                 How many crates can {h} such machines fill completely in {t} hours?"
            );
            let head = format!("h = {h}\nb = {b}\nm = {m}\nc = {c}\nt = {t}\n");
            Some(Item {
                question,
                answer: ans.to_string(),
                code: format!("{head}bottles = h * b * (60 // m) * t\nprint(bottles // c)\n"),
                buggy_code: format!("{head}bottles = h * b * t\nprint(bottles // c)\n"),
                buggy_answer: bug.to_string(),
                level: 0,
            })
        }
        // sum of multiples of a or b
        8 => {
            let a = nums::int(rng, 3, 19, split);
            let b = nums::int(rng, 3, 19, split);
            if a == b || a % b == 0 || b % a == 0 {
                return None;
            }
            let n = nums::int(rng, 100, 100000, split);
            let s = |k: i128| -> i128 {
                let m = (n as i128 - 1) / k;
                k * m * (m + 1) / 2
            };
            let l = (a * b) as i128 / gcd(a as u128, b as u128) as i128;
            let ans = s(a as i128) + s(b as i128) - s(l);
            let bug = s(a as i128) + s(b as i128);
            if ans == bug {
                return None;
            }
            let question = format!("What is the sum of all positive integers less than {n} that are divisible by {a} or by {b}?");
            let head = format!("n = {n}\na = {a}\nb = {b}\n");
            Some(Item {
                question,
                answer: ans.to_string(),
                code: format!("{head}print(sum(x for x in range(1, n) if x % a == 0 or x % b == 0))\n"),
                buggy_code: format!(
                    "{head}print(sum(x for x in range(1, n) if x % a == 0) + sum(x for x in range(1, n) if x % b == 0))\n"
                ),
                buggy_answer: bug.to_string(),
                level: 1,
            })
        }
        // count divisible by k but not by j
        9 => {
            let k = nums::int(rng, 3, 30, split);
            let j = nums::int(rng, 2, 9, split);
            if k % j == 0 || j == k {
                return None;
            }
            let lo = nums::int(rng, 100, 5000, split);
            let hi = nums::int(rng, lo + 1000, 200000, split);
            let count = |d: i64| hi / d - (lo - 1) / d;
            let l = k * j / gcd(k as u128, j as u128) as i64;
            let ans = count(k) - count(l);
            let bug = count(k);
            if ans == bug {
                return None;
            }
            let question = format!("How many integers from {lo} to {hi}, inclusive, are divisible by {k} but not by {j}?");
            let head = format!("lo = {lo}\nhi = {hi}\nk = {k}\nj = {j}\n");
            Some(Item {
                question,
                answer: ans.to_string(),
                code: format!("{head}print(sum(1 for x in range(lo, hi + 1) if x % k == 0 and x % j != 0))\n"),
                buggy_code: format!("{head}print(sum(1 for x in range(lo, hi + 1) if x % k == 0))\n"),
                buggy_answer: bug.to_string(),
                level: 1,
            })
        }
        // Fibonacci-like sequence
        10 => {
            let a = nums::int(rng, 1, 99, split);
            let b = nums::int(rng, 1, 99, split);
            let n = nums::int(rng, 20, 80, split);
            let term = |n: i64| -> u128 {
                let (mut x, mut y) = (a as u128, b as u128);
                for _ in 0..n - 1 {
                    let z = x + y;
                    x = y;
                    y = z;
                }
                x
            };
            let question = format!(
                "A sequence starts with {a} and {b}, and every later term is the sum of the two terms just before \
                 it. What is the {} term of the sequence?",
                ordinal(n)
            );
            let head = format!("a = {a}\nb = {b}\nn = {n}\n");
            Some(Item {
                question,
                answer: term(n).to_string(),
                code: format!("{head}x, y = a, b\nfor _ in range(n - 1):\n    x, y = y, x + y\nprint(x)\n"),
                buggy_code: format!("{head}x, y = a, b\nfor _ in range(n):\n    x, y = y, x + y\nprint(x)\n"),
                buggy_answer: term(n + 1).to_string(),
                level: 2,
            })
        }
        // average speed
        _ => {
            let d1 = nums::int(rng, 5, 120, split);
            let v1 = nums::int(rng, 8, 45, split);
            let d2 = nums::int(rng, 5, 120, split);
            let v2 = nums::int(rng, 8, 45, split);
            if v1 == v2 {
                return None;
            }
            let avg = (d1 + d2) as f64 / (d1 as f64 / v1 as f64 + d2 as f64 / v2 as f64);
            let bug = (v1 + v2) as f64 / 2.0;
            let (ans, bug) = (cents(avg)?, cents(bug).unwrap_or_else(|| format!("{bug:.2}")));
            if ans == bug {
                return None;
            }
            let female = rng.random_bool(0.5);
            let name = names.first_name(rng, female, false);
            let question = format!(
                "{name} cycles {d1} km at {v1} km/h and then another {d2} km at {v2} km/h. What is the average \
                 speed over the whole ride, in km/h? Round to two decimal places."
            );
            let head = format!("d1 = {d1}\nv1 = {v1}\nd2 = {d2}\nv2 = {v2}\n");
            Some(Item {
                question,
                answer: ans,
                code: format!("{head}avg = (d1 + d2) / (d1 / v1 + d2 / v2)\nprint(f\"{{avg:.2f}}\")\n"),
                buggy_code: format!("{head}avg = (v1 + v2) / 2\nprint(f\"{{avg:.2f}}\")\n"),
                buggy_answer: bug,
                level: 1,
            })
        }
    }
}

pub(crate) fn generate(rng: &mut ChaCha8Rng, n: usize, split: Split) -> Result<Vec<Task>> {
    let mut names = NameGen::new(split);
    let mut seen = HashSet::new();
    let mut tasks = Vec::with_capacity(n);
    let mut attempts = 0usize;
    while tasks.len() < n {
        attempts += 1;
        if attempts > 1000 + n * 100 {
            bail!("could not draw {n} distinct math problems");
        }
        let t = rng.random_range(0..TEMPLATES);
        let Some(item) = template(rng, &mut names, t) else { continue };
        if item.answer == item.buggy_answer || !numbers_in_split(&item.question, split) || !seen.insert(item.question.clone()) {
            continue;
        }
        let i = tasks.len();
        let mut task = base_task(Suite::Math, split, i);
        task.question = item.question;
        task.answers = vec![item.answer.clone()];
        task.difficulty = Some(difficulty(item.level));
        let sol = MathSolution { code: item.code, answer: item.answer, buggy_code: item.buggy_code, buggy_answer: item.buggy_answer };
        task.solution = Some(serde_json::to_string(&sol).expect("solution serialises"));
        tasks.push(task);
    }
    Ok(tasks)
}

/// Number of math templates (for tests that want to cover each).
#[cfg(test)]
pub(crate) const N_TEMPLATES: usize = TEMPLATES;

#[cfg(test)]
pub(crate) fn template_for_test(rng: &mut ChaCha8Rng, split: Split, t: usize) -> Option<(String, String)> {
    let mut names = NameGen::new(split);
    template(rng, &mut names, t).map(|i| (i.question, i.answer))
}
