//! LaTeX (and plain-text) math answers → [`Expr`], by recursive descent.
//!
//! Precedence, loosest first: top-level `,`/`;` lists (an unordered set of answers; `k=1,2,3`
//! assigns the set to `k`), relations (`=`, `<`, `\le`, `\ne`, `\in`, chained), `\cup`, sums
//! (`+`, `-`, `\pm`), products (`*`, `\cdot`, `\times`, `/`, `\div`, and juxtaposition), unary
//! signs, powers, postfix `!` and `\%`. A whole answer like `1,234` or `11,111,100` (commas
//! every three digits, no spaces) is one number; `1, 234` is a list.
//!
//! Brackets: `(a, b)` / `[a, b]` with numeric ends `a < b` (or an infinite end) are intervals,
//! otherwise tuples; `(a, b]` and `[a, b)` are always intervals; `\{…\}` is a set. A number right
//! before `\frac{p}{q}` with integer `p`, `q` is a mixed number (`3\frac12` = 7/2). Letters are
//! variables (`x`, `x_1`, `\alpha`), lowercased; `e` is Euler's number, `i` the imaginary unit,
//! `\pi`, `\infty` the constants; `^\circ` and a subscript on a number (`52_8`) are dropped.
//! Anything else (an unknown command, unbalanced brackets) is a parse error, and the answer is
//! then compared as text.

use super::expr::{Const, Expr, Func, Ratio, RelOp};

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// Digits with an optional decimal point (`12`, `1.5`, `.5`).
    Num(String),
    Letter(char),
    /// `\name` (letters) or `\` + one other character (`\{`, `\%`, `\,`).
    Cmd(String),
    /// Any other single character.
    Ch(char),
}

fn tokenize(s: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() || c == '~' {
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i < chars.len() && chars[i] == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            out.push(Tok::Num(chars[start..i].iter().collect()));
        } else if c.is_ascii_alphabetic() {
            out.push(Tok::Letter(c));
            i += 1;
        } else if c == '\\' {
            i += 1;
            let start = i;
            while i < chars.len() && chars[i].is_ascii_alphabetic() {
                i += 1;
            }
            if i == start {
                match chars.get(i) {
                    Some(&d) => {
                        out.push(Tok::Cmd(d.to_string()));
                        i += 1;
                    }
                    None => return Err("a lone backslash".into()),
                }
            } else {
                out.push(Tok::Cmd(chars[start..i].iter().collect()));
            }
        } else {
            // Unicode spellings of commands.
            match c {
                'π' => out.push(Tok::Cmd("pi".into())),
                '∞' => out.push(Tok::Cmd("infty".into())),
                '×' | '·' => out.push(Tok::Cmd("cdot".into())),
                '÷' => out.push(Tok::Cmd("div".into())),
                '≤' => out.push(Tok::Cmd("le".into())),
                '≥' => out.push(Tok::Cmd("ge".into())),
                '≠' => out.push(Tok::Cmd("ne".into())),
                '√' => out.push(Tok::Cmd("sqrt".into())),
                '∪' => out.push(Tok::Cmd("cup".into())),
                '±' => out.push(Tok::Cmd("pm".into())),
                '−' => out.push(Tok::Ch('-')),
                '°' => out.push(Tok::Cmd("circ".into())),
                other => out.push(Tok::Ch(other)),
            }
            i += 1;
        }
    }
    Ok(out)
}

/// Commands that are spacing or sizing only.
const IGNORED: &[&str] = &[",", ";", ":", "!", " ", "quad", "qquad", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "left", "right", "displaystyle", "$", "limits", "middle"];

const GREEK: &[&str] = &[
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "rho", "sigma", "tau", "upsilon", "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi",
    "Sigma", "Phi", "Psi", "Omega",
];

fn function_of(name: &str) -> Option<Func> {
    Some(match name {
        "sin" => Func::Sin,
        "cos" => Func::Cos,
        "tan" => Func::Tan,
        "cot" => Func::Cot,
        "sec" => Func::Sec,
        "csc" => Func::Csc,
        "arcsin" => Func::Asin,
        "arccos" => Func::Acos,
        "arctan" => Func::Atan,
        "sinh" => Func::Sinh,
        "cosh" => Func::Cosh,
        "tanh" => Func::Tanh,
        "ln" => Func::Ln,
        "log" | "lg" => Func::Log,
        "exp" => Func::Exp,
        _ => return None,
    })
}

fn relation_of(t: &Tok) -> Option<RelOp> {
    Some(match t {
        Tok::Ch('=') => RelOp::Eq,
        Tok::Ch('<') => RelOp::Lt,
        Tok::Ch('>') => RelOp::Gt,
        Tok::Cmd(c) => match c.as_str() {
            "le" | "leq" | "leqslant" => RelOp::Le,
            "ge" | "geq" | "geqslant" => RelOp::Ge,
            "ne" | "neq" => RelOp::Ne,
            "lt" => RelOp::Lt,
            "gt" => RelOp::Gt,
            "in" | "approx" | "equiv" => RelOp::Eq,
            _ => return None,
        },
        _ => return None,
    })
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    /// Depth of `|…|` being parsed: a `|` then closes instead of opening.
    abs_depth: usize,
    /// Nesting depth of primaries (bounded, so that no input can exhaust the stack).
    depth: usize,
}

/// Deeper nesting than any answer has is refused.
const MAX_DEPTH: usize = 100;

type R<T> = Result<T, String>;

/// Parses a normalised answer.
pub fn parse_answer(s: &str) -> R<Expr> {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if s.trim() == compact && is_thousands_number(&compact) {
        let digits: String = compact.chars().filter(|&c| c != ',').collect();
        return number(&digits);
    }
    let mut p = Parser { toks: tokenize(s)?, pos: 0, abs_depth: 0, depth: 0 };
    p.skip_ignored();
    if p.at_end() {
        return Err("empty".into());
    }
    let e = p.list(None)?;
    p.skip_ignored();
    if !p.at_end() {
        return Err(format!("unexpected {:?}", p.toks[p.pos]));
    }
    Ok(e)
}

/// `1,234,567.5`: commas every three digits.
fn is_thousands_number(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    if frac.is_some_and(|f| f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    let groups: Vec<&str> = int.split(',').collect();
    groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && groups.iter().all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
        && groups[1..].iter().all(|g| g.len() == 3)
}

/// A number literal (digits, optional decimal point, optional sign).
fn number(text: &str) -> R<Expr> {
    let (neg, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let float = body.contains('.');
    let digits = format!("{int}{frac}");
    let trimmed = digits.trim_start_matches('0');
    let value = if trimmed.len() <= 36 && frac.len() <= 36 {
        let n: i128 = if trimmed.is_empty() { 0 } else { trimmed.parse().map_err(|_| format!("bad number {text}"))? };
        10i128.checked_pow(frac.len() as u32).and_then(|d| Ratio::new(n, d))
    } else {
        None
    };
    let approx: f64 = format!("{}{}", if int.is_empty() { "0" } else { int }, if frac.is_empty() { String::new() } else { format!(".{frac}") })
        .parse()
        .map_err(|_| format!("bad number {text}"))?;
    let e = Expr::Num { value, approx, float };
    Ok(if neg { Expr::Neg(Box::new(e)) } else { e })
}

/// Expands `\pm` into its values (`a \pm b` → `a + b`, `a - b`); more than 6 signs are kept
/// as they are (64 values is already no answer anyone writes).
fn expand_pm(e: &Expr) -> Vec<Expr> {
    if count_pm(e) > 6 {
        return vec![e.clone()];
    }
    match e {
        Expr::PlusMinus(a, b) => {
            let mut out = Vec::new();
            for x in expand_pm(a) {
                for y in expand_pm(b) {
                    out.push(Expr::Add(vec![x.clone(), y.clone()]));
                    out.push(Expr::Add(vec![x.clone(), Expr::Neg(Box::new(y))]));
                }
            }
            out
        }
        Expr::Add(v) => {
            let mut acc: Vec<Vec<Expr>> = vec![Vec::new()];
            for term in v {
                let alts = expand_pm(term);
                acc = acc.into_iter().flat_map(|prefix| alts.iter().map(move |a| {
                    let mut p = prefix.clone();
                    p.push(a.clone());
                    p
                })).collect();
            }
            acc.into_iter().map(Expr::Add).collect()
        }
        Expr::Neg(x) => expand_pm(x).into_iter().map(|y| Expr::Neg(Box::new(y))).collect(),
        other => vec![other.clone()],
    }
}

/// `\pm` signs in an expression (each doubles its values).
fn count_pm(e: &Expr) -> usize {
    match e {
        Expr::PlusMinus(a, b) => 1 + count_pm(a) + count_pm(b),
        Expr::Add(v) => v.iter().map(count_pm).sum(),
        Expr::Neg(x) => count_pm(x),
        _ => 0,
    }
}

fn contains_pm(e: &Expr) -> bool {
    match e {
        Expr::PlusMinus(..) => true,
        Expr::Add(v) => v.iter().any(contains_pm),
        Expr::Neg(x) => contains_pm(x),
        _ => false,
    }
}

/// The numeric value of a symbol-free expression, for deciding interval vs tuple.
fn real_value(e: &Expr) -> Option<f64> {
    if e.has_symbols() {
        return None;
    }
    let v = e.eval(&|_| None)?;
    (v.is_real() && !v.re.is_nan()).then_some(v.re)
}

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn skip_ignored(&mut self) {
        while let Some(Tok::Cmd(c)) = self.peek() {
            if IGNORED.contains(&c.as_str()) {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    fn eat_ch(&mut self, c: char) -> bool {
        self.skip_ignored();
        if self.peek() == Some(&Tok::Ch(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn eat_cmd(&mut self, names: &[&str]) -> Option<String> {
        self.skip_ignored();
        if let Some(Tok::Cmd(c)) = self.peek() {
            if names.contains(&c.as_str()) {
                let c = c.clone();
                self.pos += 1;
                return Some(c);
            }
        }
        None
    }

    fn expect_ch(&mut self, c: char) -> R<()> {
        if self.eat_ch(c) {
            Ok(())
        } else {
            Err(format!("expected `{c}`, found {:?}", self.peek()))
        }
    }

    /// Whether the next token ends a list item (`,`, `;`, a closing bracket or the end).
    fn at_item_end(&mut self, close: Option<&Tok>) -> bool {
        self.skip_ignored();
        match self.peek() {
            None => true,
            Some(t) => matches!(t, Tok::Ch(',') | Tok::Ch(';') | Tok::Ch(')') | Tok::Ch(']') | Tok::Ch('}') | Tok::Ch('&'))
                || matches!(t, Tok::Cmd(c) if c == "}" || c == "\\" || c == "rbrace" || c == "end")
                || close.is_some_and(|c| c == t),
        }
    }

    /// Comma-separated items up to `close` (not consumed); one item is returned as itself.
    fn items(&mut self, close: Option<&Tok>) -> R<Vec<Expr>> {
        let mut items = vec![self.relation()?];
        while self.eat_ch(',') || self.eat_ch(';') {
            if self.at_item_end(close) {
                break; // a trailing comma
            }
            items.push(self.relation()?);
        }
        Ok(items)
    }

    /// A top-level list: one item, or an unordered set of items (`\pm` values flattened).
    fn list(&mut self, close: Option<&Tok>) -> R<Expr> {
        let items = self.items(close)?;
        // `k = 1, 2, 3`: the assignment of a set.
        if items.len() > 1 {
            if let Expr::Rel(sides, ops) = &items[0] {
                if ops == &[RelOp::Eq] && matches!(sides[0], Expr::Sym(_)) && items[1..].iter().all(|e| !e.is_relation()) {
                    let mut values = vec![sides[1].clone()];
                    values.extend(items[1..].iter().cloned());
                    return Ok(Expr::Rel(vec![sides[0].clone(), Expr::Set(flatten_pm(values))], vec![RelOp::Eq]));
                }
            }
            return Ok(Expr::Set(flatten_pm(items)));
        }
        let item = items.into_iter().next().expect("one item");
        if contains_pm(&item) {
            return Ok(Expr::Set(expand_pm(&item)));
        }
        Ok(item)
    }

    fn relation(&mut self) -> R<Expr> {
        let first = self.set_op()?;
        let mut sides = vec![first];
        let mut ops = Vec::new();
        loop {
            self.skip_ignored();
            let Some(op) = self.peek().and_then(relation_of) else { break };
            self.pos += 1;
            // `\le` written `<=`, `\ge` as `>=`
            let op = match op {
                RelOp::Lt if self.eat_ch('=') => RelOp::Le,
                RelOp::Gt if self.eat_ch('=') => RelOp::Ge,
                other => other,
            };
            ops.push(op);
            sides.push(self.set_op()?);
        }
        Ok(if ops.is_empty() { sides.pop().expect("one side") } else { Expr::Rel(sides, ops) })
    }

    fn set_op(&mut self) -> R<Expr> {
        let first = self.sum()?;
        let mut parts = vec![first];
        while self.eat_cmd(&["cup"]).is_some() {
            parts.push(self.sum()?);
        }
        Ok(if parts.len() == 1 { parts.pop().expect("one") } else { Expr::Union(parts) })
    }

    fn sum(&mut self) -> R<Expr> {
        let mut terms = vec![self.product()?];
        loop {
            if self.eat_ch('+') {
                terms.push(self.product()?);
            } else if self.eat_ch('-') {
                terms.push(Expr::Neg(Box::new(self.product()?)));
            } else if self.eat_cmd(&["pm"]).is_some() {
                let left = if terms.len() == 1 { terms.pop().expect("one") } else { Expr::Add(std::mem::take(&mut terms)) };
                let right = self.product()?;
                terms.push(Expr::PlusMinus(Box::new(left), Box::new(right)));
            } else if self.eat_cmd(&["mp"]).is_some() {
                let left = if terms.len() == 1 { terms.pop().expect("one") } else { Expr::Add(std::mem::take(&mut terms)) };
                let right = self.product()?;
                terms.push(Expr::PlusMinus(Box::new(left), Box::new(Expr::Neg(Box::new(right)))));
            } else {
                break;
            }
        }
        Ok(if terms.len() == 1 { terms.pop().expect("one") } else { Expr::Add(terms) })
    }

    /// Whether the next token can start a factor of an implicit product.
    fn starts_factor(&mut self) -> bool {
        self.skip_ignored();
        match self.peek() {
            Some(Tok::Num(_)) | Some(Tok::Letter(_)) => true,
            Some(Tok::Ch('(')) | Some(Tok::Ch('[')) | Some(Tok::Ch('{')) => true,
            Some(Tok::Ch('|')) => self.abs_depth == 0,
            Some(Tok::Cmd(c)) => {
                let c = c.as_str();
                matches!(c, "frac" | "sqrt" | "binom" | "dbinom" | "tbinom" | "pi" | "infty" | "infin" | "text" | "{" | "lbrace" | "lfloor" | "lceil" | "begin" | "operatorname" | "vert" | "lvert")
                    || GREEK.contains(&c)
                    || function_of(c).is_some()
            }
            _ => false,
        }
    }

    fn product(&mut self) -> R<Expr> {
        let mut factors = vec![self.unary()?];
        let mut divisors: Vec<Expr> = Vec::new();
        loop {
            if self.eat_ch('*') || self.eat_cmd(&["cdot", "times", "ast"]).is_some() {
                factors.push(self.unary()?);
            } else if self.eat_ch('/') || self.eat_cmd(&["div"]).is_some() {
                divisors.push(self.unary()?);
            } else if self.starts_factor() {
                // A mixed number: `3\frac12`, `137 \frac{1}{2}`.
                let whole = factors.len() == 1 && divisors.is_empty() && matches!(factors[0], Expr::Num { float: false, .. });
                let next = self.power()?;
                if whole {
                    if let Expr::Div(a, b) = &next {
                        if matches!(**a, Expr::Num { float: false, .. }) && matches!(**b, Expr::Num { float: false, .. }) {
                            let w = factors.pop().expect("one");
                            factors.push(Expr::Add(vec![w, next]));
                            continue;
                        }
                    }
                }
                factors.push(next);
            } else {
                break;
            }
        }
        let num = if factors.len() == 1 { factors.pop().expect("one") } else { Expr::Mul(factors) };
        Ok(divisors.into_iter().fold(num, |acc, d| Expr::Div(Box::new(acc), Box::new(d))))
    }

    fn unary(&mut self) -> R<Expr> {
        if self.eat_ch('-') {
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        if self.eat_ch('+') {
            return self.unary();
        }
        if self.eat_cmd(&["pm"]).is_some() {
            let x = self.unary()?;
            return Ok(Expr::PlusMinus(Box::new(Expr::int(0)), Box::new(x)));
        }
        self.power()
    }

    fn power(&mut self) -> R<Expr> {
        let base = self.postfix()?;
        self.skip_ignored();
        if self.eat_ch('^') {
            // `^\circ` / `^{\circ}`: degrees, dropped.
            self.skip_ignored();
            if self.eat_cmd(&["circ"]).is_some() {
                return self.postfix_of(base);
            }
            if self.peek() == Some(&Tok::Ch('{')) && self.toks.get(self.pos + 1) == Some(&Tok::Cmd("circ".into())) && self.toks.get(self.pos + 2) == Some(&Tok::Ch('}')) {
                self.pos += 3;
                return self.postfix_of(base);
            }
            let exp = self.exponent()?;
            return self.postfix_of(Expr::Pow(Box::new(base), Box::new(exp)));
        }
        Ok(base)
    }

    /// An exponent: `{…}`, or one token (`x^2`, `x^-1` with its sign; `x^23` is x^2 · 3, as in
    /// LaTeX).
    fn exponent(&mut self) -> R<Expr> {
        self.skip_ignored();
        if self.eat_ch('-') {
            return Ok(Expr::Neg(Box::new(self.exponent()?)));
        }
        self.group_or_token()
    }

    fn postfix(&mut self) -> R<Expr> {
        let e = self.primary()?;
        self.postfix_of(e)
    }

    fn postfix_of(&mut self, mut e: Expr) -> R<Expr> {
        loop {
            self.skip_ignored();
            if self.eat_ch('!') {
                e = Expr::Func(Func::Factorial, vec![e]);
            } else if self.eat_cmd(&["%"]).is_some() || self.eat_ch('%') {
                e = Expr::Percent(Box::new(e));
            } else if self.eat_cmd(&["circ"]).is_some() || self.eat_ch('\'') {
                // degree sign; a prime
            } else if matches!(e, Expr::Num { .. }) && self.peek() == Some(&Tok::Ch('_')) {
                // a base subscript on a number (`52_8`) is dropped
                self.pos += 1;
                self.group_or_token()?;
            } else {
                return Ok(e);
            }
        }
    }

    /// A braced group or a single token, as an expression.
    fn group_or_token(&mut self) -> R<Expr> {
        self.skip_ignored();
        match self.peek().cloned() {
            Some(Tok::Ch('{')) => {
                self.pos += 1;
                let e = self.list(Some(&Tok::Ch('}')))?;
                self.expect_ch('}')?;
                Ok(e)
            }
            Some(Tok::Num(n)) => {
                self.pos += 1;
                // `\frac12`, `x^23`: one digit per argument
                let first: String = n.chars().take(1).collect();
                let rest: String = n.chars().skip(1).collect();
                if !rest.is_empty() {
                    self.toks.insert(self.pos, Tok::Num(rest));
                }
                number(&first)
            }
            Some(Tok::Letter(c)) => {
                self.pos += 1;
                Ok(letter(c))
            }
            Some(_) => self.primary(),
            None => Err("missing argument".into()),
        }
    }

    /// The raw text of a braced group (for `\text{…}`, subscripts, environment names).
    fn raw_group(&mut self) -> R<String> {
        self.skip_ignored();
        if !self.eat_ch('{') {
            return match self.peek().cloned() {
                Some(Tok::Num(n)) => {
                    self.pos += 1;
                    Ok(n)
                }
                Some(Tok::Letter(c)) => {
                    self.pos += 1;
                    Ok(c.to_string())
                }
                other => Err(format!("expected a group, found {other:?}")),
            };
        }
        let mut depth = 1;
        let mut out = String::new();
        while let Some(t) = self.peek().cloned() {
            self.pos += 1;
            match t {
                Tok::Ch('{') => depth += 1,
                Tok::Ch('}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(out);
                    }
                }
                _ => {}
            }
            match t {
                Tok::Num(n) => out.push_str(&n),
                Tok::Letter(c) | Tok::Ch(c) => out.push(c),
                Tok::Cmd(c) => {
                    out.push('\\');
                    out.push_str(&c);
                }
            }
        }
        Err("unclosed group".into())
    }

    /// Items inside brackets; `close` is any of the accepted closing tokens.
    fn bracketed(&mut self, closes: &[Tok]) -> R<(Vec<Expr>, Tok)> {
        let items = self.items(closes.first())?;
        self.skip_ignored();
        match self.peek().cloned() {
            Some(t) if closes.contains(&t) => {
                self.pos += 1;
                Ok((items, t))
            }
            other => Err(format!("expected a closing bracket, found {other:?}")),
        }
    }

    fn primary(&mut self) -> R<Expr> {
        if self.depth >= MAX_DEPTH {
            return Err("nested too deeply".into());
        }
        self.depth += 1;
        let e = self.primary_inner();
        self.depth -= 1;
        e
    }

    fn primary_inner(&mut self) -> R<Expr> {
        self.skip_ignored();
        let Some(tok) = self.peek().cloned() else { return Err("unexpected end".into()) };
        self.pos += 1;
        match tok {
            Tok::Num(n) => number(&n),
            Tok::Letter(c) => {
                // a subscripted variable: x_1, a_{n}
                if self.peek() == Some(&Tok::Ch('_')) {
                    self.pos += 1;
                    let sub = self.raw_group()?;
                    return Ok(Expr::Sym(format!("{}_{}", c.to_ascii_lowercase(), sub)));
                }
                Ok(letter(c))
            }
            Tok::Ch('(') | Tok::Ch('[') => {
                let open = tok.clone();
                let (items, close) = self.bracketed(&[Tok::Ch(')'), Tok::Ch(']')])?;
                bracket(open == Tok::Ch('('), items, close == Tok::Ch(')'))
            }
            Tok::Ch('{') => {
                let e = self.list(Some(&Tok::Ch('}')))?;
                self.expect_ch('}')?;
                Ok(e)
            }
            Tok::Ch('|') => {
                self.abs_depth += 1;
                let e = self.sum();
                self.abs_depth -= 1;
                let e = e?;
                self.expect_ch('|')?;
                Ok(Expr::Func(Func::Abs, vec![e]))
            }
            Tok::Cmd(c) => self.command(&c),
            other => Err(format!("unexpected {other:?}")),
        }
    }

    fn command(&mut self, c: &str) -> R<Expr> {
        match c {
            "{" | "lbrace" => {
                let (items, _) = self.bracketed(&[Tok::Cmd("}".into()), Tok::Cmd("rbrace".into())])?;
                Ok(Expr::Set(flatten_pm(items)))
            }
            "frac" => {
                let a = self.group_or_token()?;
                let b = self.group_or_token()?;
                Ok(Expr::Div(Box::new(a), Box::new(b)))
            }
            "sqrt" => {
                self.skip_ignored();
                let index = if self.eat_ch('[') {
                    let e = self.sum()?;
                    self.expect_ch(']')?;
                    Some(e)
                } else {
                    None
                };
                let x = self.group_or_token()?;
                let root = match index {
                    Some(n) => Expr::Div(Box::new(Expr::int(1)), Box::new(n)),
                    None => Expr::Div(Box::new(Expr::int(1)), Box::new(Expr::int(2))),
                };
                Ok(Expr::Pow(Box::new(x), Box::new(root)))
            }
            "binom" | "dbinom" | "tbinom" => {
                let n = self.group_or_token()?;
                let k = self.group_or_token()?;
                Ok(Expr::Func(Func::Binom, vec![n, k]))
            }
            "pi" => Ok(Expr::Const(Const::Pi)),
            "infty" | "infin" => Ok(Expr::Const(Const::Infinity)),
            "text" => {
                let raw = self.raw_group()?;
                text_value(&raw)
            }
            "operatorname" => {
                let name = self.raw_group()?;
                self.function(&name)
            }
            "lfloor" | "lceil" => {
                let e = self.sum()?;
                let close = if c == "lfloor" { "rfloor" } else { "rceil" };
                if self.eat_cmd(&[close]).is_none() {
                    return Err(format!("expected \\{close}"));
                }
                Ok(Expr::Func(if c == "lfloor" { Func::Floor } else { Func::Ceil }, vec![e]))
            }
            "vert" | "lvert" => {
                let e = self.sum()?;
                if self.eat_cmd(&["vert", "rvert"]).is_none() {
                    return Err("expected \\rvert".into());
                }
                Ok(Expr::Func(Func::Abs, vec![e]))
            }
            "begin" => self.environment(),
            name if GREEK.contains(&name) => {
                if self.peek() == Some(&Tok::Ch('_')) {
                    self.pos += 1;
                    let sub = self.raw_group()?;
                    return Ok(Expr::Sym(format!("{name}_{sub}")));
                }
                Ok(Expr::Sym(name.to_string()))
            }
            name => self.function(name),
        }
    }

    /// `\sin x`, `\sin^2(x)`, `\log_2 8`, `\ln(x)`.
    fn function(&mut self, name: &str) -> R<Expr> {
        let Some(f) = function_of(name) else { return Err(format!("unknown command \\{name}")) };
        self.skip_ignored();
        let mut power = None;
        let mut base = None;
        loop {
            if self.eat_ch('^') {
                power = Some(self.exponent()?);
            } else if self.eat_ch('_') {
                base = Some(self.group_or_token()?);
            } else {
                break;
            }
        }
        self.skip_ignored();
        let arg = if self.eat_ch('(') {
            let e = self.list(Some(&Tok::Ch(')')))?;
            self.expect_ch(')')?;
            e
        } else {
            self.power()?
        };
        let mut e = match f {
            Func::Log => Expr::Func(Func::Log, vec![arg, base.unwrap_or_else(|| Expr::int(10))]),
            _ if base.is_some() => return Err(format!("\\{name} takes no subscript")),
            f => Expr::Func(f, vec![arg]),
        };
        if let Some(p) = power {
            e = Expr::Pow(Box::new(e), Box::new(p));
        }
        Ok(e)
    }

    /// `\begin{pmatrix} a & b \\ c & d \end{pmatrix}` (also bmatrix, matrix, array, …).
    fn environment(&mut self) -> R<Expr> {
        let name = self.raw_group()?;
        if !name.ends_with("matrix") && name != "array" {
            return Err(format!("unsupported environment {name}"));
        }
        if name == "array" {
            self.raw_group()?; // the column spec
        }
        let mut rows: Vec<Vec<Expr>> = vec![Vec::new()];
        loop {
            self.skip_ignored();
            if self.eat_cmd(&["end"]).is_some() {
                let end = self.raw_group()?;
                if end != name {
                    return Err(format!("\\begin{{{name}}} closed by \\end{{{end}}}"));
                }
                break;
            }
            if self.eat_cmd(&["\\"]).is_some() {
                rows.push(Vec::new());
                continue;
            }
            if self.eat_ch('&') {
                continue;
            }
            let cell = self.relation()?;
            rows.last_mut().expect("a row").push(cell);
        }
        rows.retain(|r| !r.is_empty());
        if rows.is_empty() || rows.iter().any(|r| r.len() != rows[0].len()) {
            return Err("ragged or empty matrix".into());
        }
        Ok(Expr::Matrix(rows))
    }
}

fn flatten_pm(items: Vec<Expr>) -> Vec<Expr> {
    items.into_iter().flat_map(|e| if contains_pm(&e) { expand_pm(&e) } else { vec![e] }).collect()
}

/// A letter as a variable: lowercased, `e` Euler's number, `i` the imaginary unit.
fn letter(c: char) -> Expr {
    match c {
        'e' => Expr::Const(Const::E),
        'i' => Expr::Const(Const::I),
        c => Expr::Sym(c.to_ascii_lowercase().to_string()),
    }
}

/// `\text{…}`: a number, a single letter (a choice such as `(C)`), or a word.
fn text_value(raw: &str) -> R<Expr> {
    let t = raw.trim();
    let t = t.strip_prefix('(').and_then(|x| x.strip_suffix(')')).unwrap_or(t).trim();
    if t.is_empty() {
        return Err("empty text".into());
    }
    if t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return number(t);
    }
    let word: String = t.chars().filter(|c| !c.is_whitespace()).flat_map(char::to_lowercase).collect();
    if word.chars().count() == 1 && word.chars().all(|c| c.is_ascii_alphabetic()) {
        return Ok(Expr::Sym(word));
    }
    Ok(Expr::Word(word))
}

/// `(a, b)` / `[a, b]`: an interval when both ends are numbers in increasing order (or one is
/// infinite), else a tuple; half-open brackets are always intervals; a single item is a group.
fn bracket(open_paren: bool, mut items: Vec<Expr>, close_paren: bool) -> R<Expr> {
    if items.len() == 1 {
        if open_paren != close_paren {
            return Err("a half-open bracket around one item".into());
        }
        let e = items.pop().expect("one");
        return Ok(if contains_pm(&e) { Expr::Set(expand_pm(&e)) } else { e });
    }
    let items = flatten_pm(items);
    if items.len() == 2 {
        let (lo, hi) = (real_value(&items[0]), real_value(&items[1]));
        let interval = open_paren != close_paren
            || matches!((lo, hi), (Some(a), Some(b)) if a < b)
            || lo.is_some_and(f64::is_infinite)
            || hi.is_some_and(f64::is_infinite);
        if interval {
            let mut it = items.into_iter();
            let (lo_e, hi_e) = (it.next().expect("two"), it.next().expect("two"));
            // Infinite ends are always open.
            let lo_open = open_paren || lo.is_some_and(f64::is_infinite);
            let hi_open = close_paren || hi.is_some_and(f64::is_infinite);
            return Ok(Expr::Interval { lo: Box::new(lo_e), hi: Box::new(hi_e), lo_open, hi_open });
        }
    }
    Ok(Expr::Tuple(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Expr {
        parse_answer(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn shapes() {
        assert!(matches!(p("1,234"), Expr::Num { .. }));
        assert!(matches!(p("1, 234"), Expr::Set(v) if v.len() == 2));
        assert!(matches!(p("(1,2)"), Expr::Interval { lo_open: true, hi_open: true, .. }));
        assert!(matches!(p("(2,1)"), Expr::Tuple(_)));
        assert!(matches!(p("(-\\infty, 0]"), Expr::Interval { lo_open: true, hi_open: false, .. }));
        assert!(matches!(p("\\{1,2,3\\}"), Expr::Set(v) if v.len() == 3));
        assert!(matches!(p("1 \\pm \\sqrt{19}"), Expr::Set(v) if v.len() == 2));
        assert!(matches!(p("x=5"), Expr::Rel(_, _)));
        assert!(matches!(p("k=1,2,3"), Expr::Rel(s, _) if matches!(&s[1], Expr::Set(v) if v.len() == 3)));
        assert!(matches!(p("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"), Expr::Matrix(r) if r.len() == 2 && r[0].len() == 2));
        assert!(matches!(p("3\\frac{1}{2}"), Expr::Add(_)));
        assert!(matches!(p("52_8"), Expr::Num { .. }));
        assert!(matches!(p("\\text{(C)}"), Expr::Sym(s) if s == "c"));
        assert!(matches!(p("\\text{Evelyn}"), Expr::Word(s) if s == "evelyn"));
        assert!(parse_answer("\\unknown{x}").is_err());
        assert!(parse_answer("(1,2").is_err());
    }
}
