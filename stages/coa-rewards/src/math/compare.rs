//! When two parsed answers are the same answer (gold first: the comparison is not symmetric for
//! equations, as in the reference checker).
//!
//! - Equations: a gold assignment `x = 5` (variables on the left) is compared by its right side
//!   with a prediction that is no equation (`5`); a predicted equation is compared by its right
//!   side with a gold that is none. Two relations are equal when they relate the same difference
//!   (`lhs - rhs` equal, or equal up to a constant factor: the same solutions), flipped
//!   inequalities included.
//! - Sets (`\{…\}`, bare lists) are unordered, tuples ordered; a tuple against a set is read in
//!   the set's written order; a single value equals the set holding only it; intervals compare
//!   their ends and openness; an open interval `(a, b)` equals the pair `a, b`; unions compare
//!   part by part in any order; matrices entry by entry.
//! - Words and letters: `\text{Evelyn}` equals `evelyn` and the letters `E v e l y n` written
//!   as a product (case-insensitively); `\text{(C)}` equals `C`.
//! - Numbers and expressions: when either side is a decimal as written (`0.333333`, `1.50`),
//!   both are rounded to 6 decimal places and must also agree to a relative 1e-5 (the reference
//!   checker rounds only; that makes `0.0000672` equal `0.0000673`); otherwise exact rationals
//!   when both have one, else the complex values agree to a relative 1e-9 — at 12 seeded random
//!   points when there are variables ([`points`]: real, wide, integers among them; so
//!   `(x+1)(x+2)` equals `x^2+3x+2` and `2\cdot x` equals `2x`, but `x+1` does not equal `y+1`,
//!   `|x|` does not equal `x`, nor `\lceil n/2\rceil` equal `\lceil n/3\rceil`). A percentage
//!   of an integer equals that integer (`50\%` = `50`), otherwise its value (`50\%` = `0.5`).

use std::collections::BTreeSet;

use super::expr::{Const, Expr, RelOp, C64};

/// Evaluation points: each variable drawn on its own, seeded, so the same pair always gets the
/// same verdict. Variables are real, as the reference checker's symbols are, and range wide: a
/// point near 1 alone would make `\lceil n/2 \rceil` equal `\lceil n/3 \rceil` and `|x|` equal
/// `x`. Eight reals in `[-10, -0.1] ∪ [0.1, 10]` and four integers in `±[1, 9]` (where floors,
/// ceilings and factorials jump or are defined).
const REAL_POINTS: usize = 8;
const INTEGER_POINTS: usize = 4;

fn points(symbols: &BTreeSet<String>) -> Vec<Vec<(String, C64)>> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..REAL_POINTS + INTEGER_POINTS)
        .map(|k| {
            symbols
                .iter()
                .map(|s| {
                    let sign = if next() < 0.5 { -1.0 } else { 1.0 };
                    let magnitude = if k < REAL_POINTS { 0.1 + 9.9 * next() } else { 1.0 + (9.0 * next()).floor() };
                    (s.clone(), C64::real(sign * magnitude))
                })
                .collect()
        })
        .collect()
}

fn close(a: C64, b: C64, rel: f64) -> bool {
    if a.re.is_infinite() || b.re.is_infinite() {
        return a.re == b.re && a.im == b.im;
    }
    let scale = a.abs().max(b.abs());
    a.sub(b).abs() <= rel * scale.max(1e-3)
}

/// `x` rounded to 6 decimal places (the reference checker's `Float.round(6)`).
fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Two symbol-free scalar values.
fn numbers_equal(gold: &Expr, pred: &Expr) -> bool {
    if let (Expr::Percent(g), Expr::Percent(p)) = (gold, pred) {
        return numbers_equal(g, p);
    }
    // `9\%` equals `9` when both are integers.
    for (pct, other) in [(gold, pred), (pred, gold)] {
        if let Expr::Percent(inner) = pct {
            if let (Some(a), Some(b)) = (inner.exact(), other.exact()) {
                if a.is_int() && b.is_int() && !inner.is_float_atom() && !other.is_float_atom() {
                    return a == b;
                }
            }
        }
    }
    let (Some(g), Some(p)) = (gold.eval(&|_| None), pred.eval(&|_| None)) else { return false };
    if !g.is_finite() || !p.is_finite() {
        return g.re == p.re && g.re.is_infinite() && g.im == 0.0 && p.im == 0.0;
    }
    // Two numbers as written compare exactly (`1.50` = `1.5`, `0.0000672` ≠ `0.0000673`).
    if let (Some(a), Some(b)) = (gold.exact(), pred.exact()) {
        if !(gold.is_float_atom() || pred.is_float_atom()) || (gold.is_number_atom() && pred.is_number_atom()) {
            return a == b;
        }
    }
    if gold.is_float_atom() || pred.is_float_atom() {
        if !(g.is_real() && p.is_real()) {
            return close(g, p, 1e-9);
        }
        return round6(g.re) == round6(p.re);
    }
    if let (Some(a), Some(b)) = (gold.exact(), pred.exact()) {
        return a == b;
    }
    close(g, p, 1e-9)
}

/// Two scalar expressions, possibly with variables.
fn values_equal(gold: &Expr, pred: &Expr) -> bool {
    let mut symbols = BTreeSet::new();
    gold.free_symbols(&mut symbols);
    pred.free_symbols(&mut symbols);
    if symbols.is_empty() {
        return numbers_equal(gold, pred);
    }
    let mut agreed = 0;
    for point in points(&symbols) {
        let env = |name: &str| point.iter().find(|(s, _)| s == name).map(|(_, v)| *v);
        match (gold.eval(&env), pred.eval(&env)) {
            (Some(g), Some(p)) if g.is_finite() && p.is_finite() => {
                if !close(g, p, 1e-9) {
                    return false;
                }
                agreed += 1;
            }
            (Some(g), Some(p)) if g.is_finite() != p.is_finite() => return false,
            _ => {}
        }
    }
    agreed >= 3
}

/// The letters of a product of single letters (`E v e l y n` → `evelyn`), if it is one.
fn spelled(e: &Expr) -> Option<String> {
    match e {
        Expr::Sym(s) if s.chars().count() == 1 => Some(s.clone()),
        Expr::Const(Const::E) => Some("e".into()),
        Expr::Const(Const::I) => Some("i".into()),
        Expr::Mul(v) => v.iter().map(spelled).collect(),
        _ => None,
    }
}

/// Words, letters and spelled-out words.
fn words_equal(gold: &Expr, pred: &Expr) -> Option<bool> {
    let word = |e: &Expr| match e {
        Expr::Word(w) => Some(w.clone()),
        _ => None,
    };
    match (word(gold), word(pred)) {
        (Some(a), Some(b)) => Some(a == b),
        (Some(a), None) => spelled(pred).map(|b| a == b),
        (None, Some(b)) => spelled(gold).map(|a| a == b),
        (None, None) => match (gold, pred) {
            (Expr::Sym(a), Expr::Sym(b)) => Some(a == b),
            // `E` (a choice, read as the letter e) against Euler's number
            (Expr::Sym(a), Expr::Const(Const::E)) | (Expr::Const(Const::E), Expr::Sym(a)) => Some(a == "e"),
            _ => None,
        },
    }
}

/// The right side of the last relation of a chain.
fn last_rhs(e: &Expr) -> Expr {
    match e {
        Expr::Rel(sides, _) => sides.last().expect("two sides").clone(),
        other => other.clone(),
    }
}

fn only_symbols(e: &Expr) -> bool {
    match e {
        Expr::Sym(_) => true,
        Expr::Mul(v) => v.iter().all(only_symbols),
        _ => false,
    }
}

fn is_equation(e: &Expr) -> bool {
    matches!(e, Expr::Rel(_, ops) if ops.iter().all(|o| *o == RelOp::Eq))
}

/// `x = …` (variables on the left of equalities).
fn is_assignment(e: &Expr) -> bool {
    matches!(e, Expr::Rel(sides, _) if is_equation(e) && only_symbols(&sides[0]))
}

/// The elements of a set-like value and whether their order matters.
fn elements(e: &Expr) -> Option<(Vec<Expr>, bool)> {
    match e {
        Expr::Set(v) => Some((v.clone(), false)),
        Expr::Tuple(v) => Some((v.clone(), true)),
        _ => None,
    }
}

/// Elements matched in order, or as a bijection when `unordered`.
fn elements_equal(gold: &[Expr], pred: &[Expr], unordered: bool) -> bool {
    if gold.len() != pred.len() {
        return false;
    }
    if !unordered {
        return gold.iter().zip(pred).all(|(g, p)| equal(g, p));
    }
    if gold.len() > 8 {
        // long lists: first match for each element (no backtracking)
        let mut used = vec![false; pred.len()];
        return gold.iter().all(|g| match (0..pred.len()).find(|&k| !used[k] && equal(g, &pred[k])) {
            Some(k) => {
                used[k] = true;
                true
            }
            None => false,
        });
    }
    let mut used = vec![false; pred.len()];
    fn assign(gold: &[Expr], pred: &[Expr], used: &mut [bool]) -> bool {
        let Some((g, rest)) = gold.split_first() else { return true };
        for k in 0..pred.len() {
            if !used[k] && equal(g, &pred[k]) {
                used[k] = true;
                if assign(rest, pred, used) {
                    return true;
                }
                used[k] = false;
            }
        }
        false
    }
    assign(gold, pred, &mut used)
}

fn relations_equal(gold: &Expr, pred: &Expr) -> bool {
    let (Expr::Rel(gs, gops), Expr::Rel(ps, pops)) = (gold, pred) else { return false };
    if gops.len() != pops.len() {
        return false;
    }
    if gops.len() > 1 {
        // chains: relation by relation
        return (0..gops.len()).all(|k| {
            let g = Expr::Rel(vec![gs[k].clone(), gs[k + 1].clone()], vec![gops[k]]);
            let p = Expr::Rel(vec![ps[k].clone(), ps[k + 1].clone()], vec![pops[k]]);
            relations_equal(&g, &p)
        });
    }
    let (gop, pop) = (gops[0], pops[0]);
    // `x \in S` against `x \in T`: the same variable, equal sets.
    if gs[1].is_set_like() || ps[1].is_set_like() {
        return gop == pop && equal(&gs[0], &ps[0]) && equal(&gs[1], &ps[1]);
    }
    let diff = |s: &[Expr]| Expr::Add(vec![s[0].clone(), Expr::Neg(Box::new(s[1].clone()))]);
    let (dg, dp) = (diff(gs), diff(ps));
    if gop == pop && values_equal(&dg, &dp) {
        return true;
    }
    if gop.flipped() == pop && gop != pop && values_equal(&dg, &Expr::Neg(Box::new(dp.clone()))) {
        return true;
    }
    // The same solutions: one difference a constant multiple of the other (positive for an
    // inequality kept in direction, negative for one flipped).
    match constant_ratio(&dg, &dp) {
        Some(r) if gop == RelOp::Eq && pop == RelOp::Eq || gop == RelOp::Ne && pop == RelOp::Ne => r != 0.0,
        Some(r) if gop == pop => r > 0.0,
        Some(r) if gop.flipped() == pop => r < 0.0,
        _ => false,
    }
}

/// `a / b` when it is the same real constant at every evaluation point.
fn constant_ratio(a: &Expr, b: &Expr) -> Option<f64> {
    let mut symbols = BTreeSet::new();
    a.free_symbols(&mut symbols);
    b.free_symbols(&mut symbols);
    if symbols.is_empty() {
        return None;
    }
    let mut ratio: Option<C64> = None;
    for point in points(&symbols) {
        let env = |name: &str| point.iter().find(|(s, _)| s == name).map(|(_, v)| *v);
        let (x, y) = (a.eval(&env)?, b.eval(&env)?);
        if y.abs() < 1e-12 || !x.is_finite() || !y.is_finite() {
            return None;
        }
        let r = x.div(y);
        match ratio {
            None => ratio = Some(r),
            Some(q) if close(q, r, 1e-9) => {}
            Some(_) => return None,
        }
    }
    ratio.filter(|r| r.is_real()).map(|r| r.re)
}

/// The entries of a matrix, a negated matrix or a matrix times scalars (`-I`, `2A`).
fn matrix(e: &Expr) -> Option<Vec<Vec<Expr>>> {
    let scale = |m: Vec<Vec<Expr>>, by: &dyn Fn(Expr) -> Expr| m.into_iter().map(|r| r.into_iter().map(by).collect()).collect();
    match e {
        Expr::Matrix(rows) => Some(rows.clone()),
        Expr::Neg(x) => Some(scale(matrix(x)?, &|c| Expr::Neg(Box::new(c)))),
        Expr::Mul(factors) => {
            let k = factors.iter().position(|f| matches!(f, Expr::Matrix(_) | Expr::Neg(_)) && matrix(f).is_some())?;
            let m = matrix(&factors[k])?;
            let scalars: Vec<Expr> = factors.iter().enumerate().filter(|(j, _)| *j != k).map(|(_, f)| f.clone()).collect();
            if scalars.iter().any(|f| matrix(f).is_some()) {
                return None; // a matrix product
            }
            Some(scale(m, &|c| {
                let mut v = scalars.clone();
                v.push(c);
                Expr::Mul(v)
            }))
        }
        _ => None,
    }
}

/// Whether `pred` is the same answer as `gold` (module docs).
pub fn equal(gold: &Expr, pred: &Expr) -> bool {
    let mut gold = gold.clone();
    let mut pred = pred.clone();
    // Assignments and equations (module docs).
    if is_assignment(&gold) {
        if let Expr::Rel(sides, _) = &gold {
            gold = Expr::Rel(vec![sides[0].clone(), sides.last().expect("two").clone()], vec![RelOp::Eq]);
        }
    }
    if is_equation(&pred) && !is_equation(&gold) {
        pred = last_rhs(&pred);
    } else if is_assignment(&gold) && !is_equation(&pred) {
        gold = last_rhs(&gold);
    }
    if gold == pred {
        return true;
    }
    if gold.is_relation() && pred.is_relation() {
        return relations_equal(&gold, &pred);
    }
    if gold.is_relation() || pred.is_relation() {
        return false;
    }
    if gold.is_set_like() || pred.is_set_like() {
        return sets_equal(&gold, &pred);
    }
    match (matrix(&gold), matrix(&pred)) {
        (Some(a), Some(b)) => {
            return a.len() == b.len()
                && a.iter().zip(&b).all(|(ra, rb)| ra.len() == rb.len() && ra.iter().zip(rb).all(|(x, y)| equal(x, y)))
        }
        (None, None) => {}
        _ => return false,
    }
    if let Some(same) = words_equal(&gold, &pred) {
        return same;
    }
    values_equal(&gold, &pred)
}

fn sets_equal(gold: &Expr, pred: &Expr) -> bool {
    match (gold, pred) {
        (Expr::Interval { lo: a, hi: b, lo_open: ao, hi_open: bo }, Expr::Interval { lo: c, hi: d, lo_open: co, hi_open: do_ }) => {
            ao == co && bo == do_ && equal(a, c) && equal(b, d)
        }
        (Expr::Union(a), Expr::Union(b)) => elements_equal(a, b, true),
        // an open interval is also the pair of its ends
        (Expr::Interval { lo, hi, lo_open: true, hi_open: true }, other) | (other, Expr::Interval { lo, hi, lo_open: true, hi_open: true })
            if matches!(other, Expr::Set(v) | Expr::Tuple(v) if v.len() == 2) =>
        {
            let (items, _) = elements(other).expect("set or tuple");
            let pair = [(**lo).clone(), (**hi).clone()];
            if std::ptr::eq(other, pred) {
                elements_equal(&pair, &items, false)
            } else {
                elements_equal(&items, &pair, false)
            }
        }
        _ => {
            let g = elements(gold).unwrap_or_else(|| (vec![gold.clone()], false));
            let p = elements(pred).unwrap_or_else(|| (vec![pred.clone()], false));
            if matches!(gold, Expr::Interval { .. } | Expr::Union(_)) || matches!(pred, Expr::Interval { .. } | Expr::Union(_)) {
                return false;
            }
            // Ordered when the gold is a tuple (a predicted set is then read in its written order).
            elements_equal(&g.0, &p.0, !g.1)
        }
    }
}
