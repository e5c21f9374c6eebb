//! Math answer equivalence.
//!
//! [`math_equal`]`(pred, gold)`:
//! 1. takes the content of the last `\boxed{…}` (or `\fbox{…}`) of each side when there is one
//!    (balanced braces), else the whole text;
//! 2. normalises both with [`normalize_math`]: `$` signs, `\left`/`\right`, spacing commands,
//!    `\displaystyle`, `\text{…}`-like wrappers (kept: their content), `\dfrac`/`\tfrac` → `\frac`,
//!    degree marks (`^\circ`), percent signs, whitespace, a trailing period, a leading `x=` (one
//!    variable on the left of a single `=`), thousands separators in a plain number
//!    (`1,234,567`), `\frac12` → `\frac{1}{2}`, `\sqrt2` → `\sqrt{2}`;
//! 3. compares as numbers when both sides are numbers: integers, decimals (`"025"` = `"25"`,
//!    `"2.50"` = `"2.5"`), fractions `\frac{a}{b}` and `a/b`, with a sign — exactly, as
//!    rationals (falling back to a relative tolerance of 1e-9 only for numbers too long for
//!    128-bit rationals);
//! 4. otherwise as normalised strings, and for tuples/intervals (`(3,\frac{\pi}{2})`, `1,-2`)
//!    element by element with the same rules when both have the same brackets and length.
//!
//! An empty answer is never equal to anything.

/// The content of the last well-formed `\boxed{…}` or `\fbox{…}` in `s` (`\boxed 5` is also
/// read), or `None`.
pub fn extract_boxed(s: &str) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for cmd in ["\\boxed", "\\fbox"] {
        let mut from = 0;
        while let Some(off) = s[from..].find(cmd) {
            let start = from + off;
            let after = start + cmd.len();
            from = after;
            if let Some(content) = command_argument(s, after) {
                if best.as_ref().is_none_or(|(pos, _)| start > *pos) {
                    best = Some((start, content));
                }
            }
        }
    }
    best.map(|(_, c)| c)
}

/// The argument of a command whose name ends at byte `at`: `{…}` (balanced) or, after spaces,
/// one bare token (`\boxed 5`).
fn command_argument(s: &str, at: usize) -> Option<String> {
    let rest = &s[at..];
    if rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None; // a longer command name, e.g. \boxedx
    }
    let trimmed = rest.trim_start();
    if let Some(inner) = trimmed.strip_prefix('{') {
        let end = matching_brace(inner)?;
        return Some(inner[..end].to_string());
    }
    if trimmed.len() < rest.len() {
        let token: String = trimmed.chars().take_while(|c| !c.is_whitespace() && *c != '$').collect();
        if !token.is_empty() {
            return Some(token);
        }
    }
    None
}

/// Byte offset of the `}` closing a group whose `{` was just before `s`.
fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 1usize;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The boxed content of `s` if it has one, else `s`.
fn answer_text(s: &str) -> String {
    extract_boxed(s).unwrap_or_else(|| s.to_string())
}

/// Replaces `\cmd{X}` by `X` for each wrapper command (balanced braces, repeatedly).
fn unwrap_commands(s: &str, cmds: &[&str]) -> String {
    let mut out = s.to_string();
    for cmd in cmds {
        let mut from = 0;
        while let Some(off) = out[from..].find(cmd) {
            let start = from + off;
            let after = start + cmd.len();
            let rest = &out[after..];
            let Some(inner) = rest.trim_start().strip_prefix('{') else {
                from = after;
                continue;
            };
            if rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
                from = after;
                continue;
            }
            let open = after + (rest.len() - rest.trim_start().len());
            let Some(end) = matching_brace(inner) else {
                from = after;
                continue;
            };
            let content = inner[..end].to_string();
            let close = open + 1 + end;
            out.replace_range(start..close + 1, &content);
            from = start;
        }
    }
    out
}

/// Removes `cmd` where it is not followed by a letter (so `\left` goes, `\leftarrow` stays).
fn remove_command(s: &str, cmd: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(cmd) {
        let after = &rest[i + cmd.len()..];
        out.push_str(&rest[..i]);
        if after.starts_with(|c: char| c.is_ascii_alphabetic()) {
            out.push_str(cmd);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `\frac12` → `\frac{1}{2}`, `\frac1{x}` → `\frac{1}{x}`, `\sqrt2` → `\sqrt{2}` (whitespace
/// already removed).
fn brace_short_arguments(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let rest: String = chars[i..].iter().take(5).collect();
        let (cmd, nargs) = if rest.starts_with("\\frac") {
            ("\\frac", 2)
        } else if rest.starts_with("\\sqrt") {
            ("\\sqrt", 1)
        } else {
            out.push(chars[i]);
            i += 1;
            continue;
        };
        out.push_str(cmd);
        i += cmd.len();
        if i < chars.len() && chars[i].is_ascii_alphabetic() {
            continue; // another command name
        }
        for _ in 0..nargs {
            if i >= chars.len() {
                break;
            }
            if chars[i] == '{' {
                // copy the braced group verbatim
                let mut depth = 0usize;
                while i < chars.len() {
                    let c = chars[i];
                    out.push(c);
                    i += 1;
                    if c == '{' {
                        depth += 1;
                    } else if c == '}' {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                }
            } else if chars[i] != '\\' {
                out.push('{');
                out.push(chars[i]);
                out.push('}');
                i += 1;
            } else {
                break;
            }
        }
    }
    out
}

/// `1,234,567.5` (a plain number with thousands separators).
fn is_thousands_number(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    if let Some(f) = frac {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
    }
    let groups: Vec<&str> = int.split(',').collect();
    groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_digit()))
        && groups[1..].iter().all(|g| g.len() == 3)
}

/// The normalisation of step 2 in the module docs (no `\boxed` extraction).
pub fn normalize_math(s: &str) -> String {
    let mut t = s.trim().replace("\\$", "").replace('$', "");
    t = unwrap_commands(&t, &["\\textbf", "\\textit", "\\textrm", "\\text", "\\mathrm", "\\mathbf", "\\mbox", "\\operatorname"]);
    for (from, to) in [("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("^{\\circ}", ""), ("^\\circ", ""), ("°", ""), ("\\%", ""), ("%", "")] {
        t = t.replace(from, to);
    }
    for cmd in ["\\left", "\\right", "\\displaystyle", "\\circ"] {
        t = remove_command(&t, cmd);
    }
    for sp in ["\\!", "\\,", "\\;", "\\:", "\\ "] {
        t = t.replace(sp, "");
    }
    t.retain(|c| !c.is_whitespace());
    t = brace_short_arguments(&t);
    while t.ends_with('.') {
        t.pop();
    }
    // `x=5` -> `5` (one variable on the left of a single `=`)
    if t.matches('=').count() == 1 && !t.contains(['<', '>']) {
        if let Some((lhs, rhs)) = t.split_once('=') {
            let var = lhs.len() == 1 && lhs.chars().all(|c| c.is_ascii_alphabetic())
                || lhs.len() <= 8 && lhs.starts_with('\\') && lhs.len() > 1 && lhs[1..].chars().all(|c| c.is_ascii_alphabetic());
            if var && !rhs.is_empty() {
                t = rhs.to_string();
            }
        }
    }
    if is_thousands_number(&t) {
        t.retain(|c| c != ',');
    }
    t
}

/// A number: an exact rational when it fits, else a float.
#[derive(Debug, Clone, Copy)]
enum Num {
    Ratio(i128, i128),
    Float(f64),
}

impl Num {
    fn value(self) -> f64 {
        match self {
            Num::Ratio(n, d) => n as f64 / d as f64,
            Num::Float(x) => x,
        }
    }

    fn neg(self) -> Num {
        match self {
            Num::Ratio(n, d) => Num::Ratio(-n, d),
            Num::Float(x) => Num::Float(-x),
        }
    }

    fn div(self, other: Num) -> Option<Num> {
        match (self, other) {
            (_, Num::Ratio(0, _)) => None,
            (Num::Ratio(a, b), Num::Ratio(c, d)) => match (a.checked_mul(d), b.checked_mul(c)) {
                (Some(n), Some(m)) => Some(ratio(n, m)),
                _ => Some(Num::Float(self.value() / other.value())),
            },
            _ => {
                let v = other.value();
                (v != 0.0).then(|| Num::Float(self.value() / v))
            }
        }
    }

    fn equals(self, other: Num) -> bool {
        if let (Num::Ratio(a, b), Num::Ratio(c, d)) = (self, other) {
            if let (Some(x), Some(y)) = (a.checked_mul(d), c.checked_mul(b)) {
                return x == y;
            }
        }
        let (x, y) = (self.value(), other.value());
        x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
    }
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn ratio(n: i128, d: i128) -> Num {
    let g = gcd(n, d).max(1);
    let (n, d) = (n / g, d / g);
    if d < 0 {
        Num::Ratio(-n, -d)
    } else {
        Num::Ratio(n, d)
    }
}

/// `123`, `0.50`, `.5`, `12.` as a number (no sign).
fn parse_decimal(s: &str) -> Option<Num> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() <= 30 && frac.len() <= 30 {
        let n: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
        return Some(ratio(n, 10i128.pow(frac.len() as u32)));
    }
    s.parse::<f64>().ok().filter(|x| x.is_finite()).map(Num::Float)
}

/// A normalised answer as a number: optional sign, then a decimal, `\frac{a}{b}` or `a/b`.
fn parse_number(s: &str) -> Option<Num> {
    if let Some(rest) = s.strip_prefix('-') {
        return parse_number(rest).map(Num::neg);
    }
    if let Some(rest) = s.strip_prefix('+') {
        return parse_number(rest);
    }
    if let Some(rest) = s.strip_prefix("\\frac{") {
        let end = matching_brace(rest)?;
        let num = &rest[..end];
        let den = rest[end + 1..].strip_prefix('{')?;
        let dend = matching_brace(den)?;
        if dend + 1 != den.len() {
            return None;
        }
        return parse_number(num)?.div(parse_number(&den[..dend])?);
    }
    if let Some((a, b)) = s.split_once('/') {
        if b.contains('/') {
            return None;
        }
        return parse_number(a)?.div(parse_number(b)?);
    }
    parse_decimal(s)
}

/// Splits on commas outside brackets and braces.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// `(a,b)` → (`(`, `a,b`, `)`) when the outer brackets enclose the whole text.
fn strip_brackets(s: &str) -> (Option<char>, &str, Option<char>) {
    let (Some(first), Some(last)) = (s.chars().next(), s.chars().last()) else {
        return (None, s, None);
    };
    if s.len() >= 2 && matches!(first, '(' | '[') && matches!(last, ')' | ']') {
        // the first bracket must close at the end, not earlier: `(1)+(2)` is no tuple
        let mut depth = 0i32;
        for (i, c) in s.char_indices() {
            match c {
                '(' | '[' => depth += 1,
                ')' | ']' => {
                    depth -= 1;
                    if depth == 0 && i + c.len_utf8() != s.len() {
                        return (None, s, None);
                    }
                }
                _ => {}
            }
        }
        return (Some(first), &s[1..s.len() - 1], Some(last));
    }
    (None, s, None)
}

fn equal_normalized(p: &str, g: &str, depth: usize) -> bool {
    if p.is_empty() || g.is_empty() {
        return false;
    }
    if let (Some(a), Some(b)) = (parse_number(p), parse_number(g)) {
        return a.equals(b);
    }
    if p == g {
        return true;
    }
    if depth > 4 {
        return false;
    }
    let (po, pin, pc) = strip_brackets(p);
    let (go, gin, gc) = strip_brackets(g);
    if po != go || pc != gc {
        return false;
    }
    let (pp, gp) = (split_top_level(pin), split_top_level(gin));
    if pp.len() < 2 || pp.len() != gp.len() {
        return false;
    }
    pp.iter().zip(&gp).all(|(a, b)| equal_normalized(a, b, depth + 1))
}

/// Whether `pred` and `gold` are the same math answer (see the module docs).
pub fn math_equal(pred: &str, gold: &str) -> bool {
    let p = normalize_math(&answer_text(pred));
    let g = normalize_math(&answer_text(gold));
    equal_normalized(&p, &g, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_extraction() {
        assert_eq!(extract_boxed("so \\boxed{\\frac{1}{2}} done").as_deref(), Some("\\frac{1}{2}"));
        assert_eq!(extract_boxed("\\boxed{1} then \\boxed{2}").as_deref(), Some("2"));
        assert_eq!(extract_boxed("\\boxed 5$").as_deref(), Some("5"));
        assert_eq!(extract_boxed("\\fbox{7}").as_deref(), Some("7"));
        assert_eq!(extract_boxed("\\boxed{unclosed"), None);
        assert_eq!(extract_boxed("no box"), None);
        assert_eq!(extract_boxed("\\boxed{a\\}b}").as_deref(), Some("a\\}b"));
    }

    #[test]
    fn numbers() {
        assert!(math_equal("25", "025"));
        assert!(math_equal("2.50", "2.5"));
        assert!(math_equal("\\frac{1}{2}", "0.5"));
        assert!(math_equal("\\dfrac12", "1/2"));
        assert!(math_equal("-\\frac{3}{4}", "\\frac{-3}{4}"));
        assert!(math_equal("1,234,567", "1234567"));
        assert!(math_equal("$90^\\circ$", "90"));
        assert!(math_equal("50\\%", "50"));
        assert!(math_equal("x = 5", "5"));
        assert!(math_equal("\\boxed{6205}", "6205"));
        assert!(!math_equal("6206", "6205"));
        assert!(!math_equal("1725.4", "1725.41"));
        assert!(!math_equal("\\frac{1}{0}", "1"));
        assert!(math_equal("123456789012345678901234567890123456789", "123456789012345678901234567890123456789"));
    }

    #[test]
    fn strings_and_tuples() {
        assert!(math_equal("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"));
        assert!(math_equal("(3, 1.50)", "\\left(3,\\frac{3}{2}\\right)"));
        assert!(!math_equal("[3, 1.5)", "(3, 1.5)"));
        assert!(math_equal("\\text{Evelyn}", "Evelyn"));
        assert!(math_equal("11\\sqrt2", "11\\sqrt{2}"));
        assert!(math_equal("1, -2", "1,-2"));
        assert!(!math_equal("1,-3", "1,-2"));
        assert!(!math_equal("", ""));
        assert!(!math_equal("\\boxed{}", "1"));
        assert!(math_equal("\\leftarrow", "\\leftarrow"));
    }
}
