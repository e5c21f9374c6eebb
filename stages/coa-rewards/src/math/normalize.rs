//! String-level clean-up of a LaTeX answer before it is parsed: the same families of rewrites the
//! field's reference checker (HF math-verify's LaTeX normalisation) applies, so that the two read
//! an answer the same way:
//!
//! - `\boxed{…}` / `\fbox{…}`: the last box (with the boxes right before it when they are close or
//!   separated by `,`, `and`, `or`, joined by commas);
//! - clean-up: `\left`/`\right` before a delimiter, `$`, `\$`, quotes, `\displaystyle`, `\!`,
//!   empty `\text{}`; `\mathrm`/`\mathbf`/`\textbf`/… → `\text`; `\dfrac`/`\tfrac`/`\cfrac` →
//!   `\frac`; `{,}` → `,`; the words `and`/`or` between items → `,`; `\ ` → space; `infinity` /
//!   `inf` → `\infty`; `\ldots` → space; `percent`, `percentage`, `pct` → `\%`;
//! - units: a trailing `\text{…}` or `\mbox{…}` (and a `^2` after it), then up to two trailing unit
//!   words (`cm`, `degrees`, `dollars`, … a fixed list) after a number, a brace or a space;
//! - leading `.5` → `0.5`, and an answer that is exactly `0.5` → `\frac{1}{2}`;
//! - short arguments: `\frac12` → `\frac{1}{2}`, `\sqrt2` → `\sqrt{2}`, `^(…)` → `^{…}`, and an
//!   answer that is exactly `a/b` with integers → `\frac{a}{b}`.

use std::sync::OnceLock;

use regex::Regex;

/// Every well-formed `\boxed{…}` / `\fbox{…}` of `s` (`\boxed 5` too), as (start, end, content),
/// in order.
fn boxes(s: &str) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for cmd in ["\\boxed", "\\fbox"] {
        let mut from = 0;
        while let Some(off) = s[from..].find(cmd) {
            let start = from + off;
            let after = start + cmd.len();
            from = after;
            if let Some((content, end)) = command_argument(s, after) {
                out.push((start, end, content));
            }
        }
    }
    out.sort_by_key(|b| b.0);
    out
}

/// The content of the last well-formed `\boxed{…}` or `\fbox{…}` in `s` (`\boxed 5` is also
/// read), or `None`. (A single box; [`boxed_answer`] also collects the boxes right before it.)
pub fn extract_boxed(s: &str) -> Option<String> {
    boxes(s).pop().map(|(_, _, content)| content)
}

/// The argument of a command whose name ends at byte `at`: `{…}` (balanced) or, after spaces,
/// one bare token (`\boxed 5`). Returns the argument and the byte just after it.
fn command_argument(s: &str, at: usize) -> Option<(String, usize)> {
    let rest = &s[at..];
    if rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None; // a longer command name, e.g. \boxedx
    }
    let trimmed = rest.trim_start();
    let skipped = rest.len() - trimmed.len();
    if let Some(inner) = trimmed.strip_prefix('{') {
        let end = matching_brace(inner)?;
        return Some((inner[..end].to_string(), at + skipped + 1 + end + 1));
    }
    if skipped > 0 {
        let token: String = trimmed.chars().take_while(|c| !c.is_whitespace() && *c != '$').collect();
        if !token.is_empty() {
            let len = token.len();
            return Some((token, at + skipped + len));
        }
    }
    None
}

/// Byte offset of the `}` closing a group whose `{` was just before `s`.
pub(crate) fn matching_brace(s: &str) -> Option<usize> {
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

/// The boxed answer of `s`: the last box, joined (with commas) with the boxes right before it
/// when they follow each other closely (under 10 characters apart) or are separated by `,`,
/// `;`, `and` or `or` (under 70 characters apart); `None` without a box.
pub fn boxed_answer(s: &str) -> Option<String> {
    join_last(s, boxes(s), |gap, _| {
        let n = gap.chars().count();
        n < 10 || n < 70 && separators().is_match(gap)
    })
}

/// The content of the last of `spans` (start, end, content; in order, not overlapping), joined
/// with commas to the spans before it for as long as `joins(gap, content)` accepts the text
/// between two of them. A content equal to the one after it is not repeated. `None` without spans.
pub(crate) fn join_last(s: &str, spans: Vec<(usize, usize, String)>, joins: impl Fn(&str, &str) -> bool) -> Option<String> {
    let mut spans: Vec<(usize, usize, String)> = spans.into_iter().map(|(a, b, c)| (a, b, c.trim().to_string())).collect();
    let (mut after_start, _, last) = spans.pop()?;
    let mut out = vec![last];
    // Walk leftwards while each span is joined to the one after it.
    while let Some((start, end, content)) = spans.pop() {
        if end > after_start {
            break;
        }
        let newest = out.last().expect("one span");
        let gap = &s[end..after_start];
        if !(&content == newest && gap.chars().count() < 10 || &content != newest && joins(gap, &content)) {
            break;
        }
        if &content != newest {
            out.push(content);
        }
        after_start = start;
    }
    out.reverse();
    Some(out.join(","))
}

fn separators() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\b(and|or)\b|,|;").expect("valid"))
}

/// Trailing unit words an answer may carry after its number (the reference checker's list).
const UNITS: &[&str] = &[
    "integerpoint", "feet", "sue", "digit", "pound", "meal", "edge", "student", "children ticket", "multiple", "east",
    "degree", "mph", "kmph", "ft", "m square", " m east", "sq m", "deg", "mile", "q .", "monkey", "prime", "ratio",
    "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm", "lt", "gain", "ab", "way", "west", "a .",
    "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t", "h", "no change", "men", "soldier", "pie", "bc", "excess",
    "st", "inches", "noon", "cent", "by", "gal", "kmh", "c", "acre", "rise", "a . m", "th", "π r 2", "sq", "mark",
    "l", "toy", "coin", "sq . m", "gallon", "° f", "profit", "minw", "yr", "women", "am", "pm", "hr", "cu cm",
    "square", "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm", "number", "kmph", "day", "hour",
    "minute", "min", "second", "man", "woman", "sec", "cube", "mt", "sq inch", "mp", "∏ cm ³", "hectare", "more",
    "sec", "unit", "cu . m", "cm 2", "rs .", "rs", "kg", "g", "month", "km", "m", "cm", "mm", "apple", "liter",
    "loss", "yard", "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m", "s .",
    "metre", "meter", "inch", "dollar",
];

struct Patterns {
    left_right: Regex,
    remove: Regex,
    text_cmds: Regex,
    frac_cmds: Regex,
    brace_comma: Regex,
    and_or: Regex,
    and_or_text: Regex,
    backslash_space: Regex,
    ldots: Regex,
    percent_words: Regex,
    inf: Regex,
    double_backslash_cmd: Regex,
    unit_text: Regex,
    unit_word: Regex,
    paren_power: Regex,
    slash_int: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let units: Vec<String> = UNITS.iter().map(|u| regex::escape(u)).collect();
        Patterns {
            left_right: Regex::new(r"\\m?(?:left|right)\s*(\\\{|\\\}|\\\||\||\(|\)|\[|\]|\\[lr]?vert|\\lbrace|\\rbrace|\\langle|\\rangle|\\lfloor|\\rfloor|\\lceil|\\rceil)").expect("valid"),
            remove: Regex::new(r#"\\mathrm\{th\}|\\!\s*|\\text\s*\{\s*\}|\\\$|\$|"|'|\\displaystyle"#).expect("valid"),
            text_cmds: Regex::new(r"\\(?:mathrm|mathit|mathbf|textnormal|textbf|textit|textrm|mbox)\b").expect("valid"),
            frac_cmds: Regex::new(r"\\[dtc]frac").expect("valid"),
            brace_comma: Regex::new(r"\s*\{\s*,\s*\}").expect("valid"),
            and_or: Regex::new(r"(^|[^a-zA-Z\\])(,?\s*(?:and|or))([^a-zA-Z]|$)").expect("valid"),
            and_or_text: Regex::new(r",?\s*\\text\{\s*(?:and|or)\s*\}").expect("valid"),
            backslash_space: Regex::new(r"(^|[^\\])\\ ").expect("valid"),
            ldots: Regex::new(r",?\s*\\(?:ldots|dots|cdots)").expect("valid"),
            percent_words: Regex::new(r"\s*\b(?:percentage|percent|pct)\b").expect("valid"),
            inf: Regex::new(r"(^|[^\\a-zA-Z])inf(?:inity)?\b").expect("valid"),
            double_backslash_cmd: Regex::new(r"\\\\([a-zA-Z])").expect("valid"),
            unit_text: Regex::new(r"\\text\{.*?\}(?:\^\d|\{\^\d\})?\s*$").expect("valid"),
            unit_word: Regex::new(&format!(r"(\d|\}}|\s)\s*(?:{})(?:s|es)?\s*$", units.join("|"))).expect("valid"),
            paren_power: Regex::new(r"\^\s?\(([^()]*)\)").expect("valid"),
            slash_int: Regex::new(r"^(-?\d+)/(\d+)$").expect("valid"),
        }
    })
}

/// The normalisation of the module docs, on text that is already the answer (no box).
pub fn normalize_latex(text: &str) -> String {
    let p = patterns();
    let mut t = text.to_string();
    t = t.replace("\\mathrm{T}", "T").replace("\\mathrm{d}", "d");
    t = p.left_right.replace_all(&t, "$1").into_owned();
    t = p.remove.replace_all(&t, "").into_owned();
    t = p.text_cmds.replace_all(&t, "\\text").into_owned();
    t = p.frac_cmds.replace_all(&t, "\\frac").into_owned();
    t = p.brace_comma.replace_all(&t, ",").into_owned();
    t = p.and_or_text.replace_all(&t, ",").into_owned();
    t = p.and_or.replace_all(&t, "$1,$3").into_owned();
    t = p.backslash_space.replace_all(&t, "$1 ").into_owned();
    t = p.ldots.replace_all(&t, " ").into_owned();
    t = t.replace("\\text{percentage}", "\\%").replace("\\text{percent}", "\\%").replace("\\text{pct}", "\\%");
    t = p.percent_words.replace_all(&t, "\\%").into_owned();
    t = p.inf.replace_all(&t, "$1\\infty").into_owned();
    t = t.replace(['\n', '\t'], " ");
    if !t.contains("matrix") && !t.contains("array") {
        t = p.double_backslash_cmd.replace_all(&t, "\\$1").into_owned();
    }
    // Units: a trailing \text{…} (with a ^2), then unit words.
    let trimmed = p.unit_text.replace(&t, "").trim().to_string();
    if !trimmed.is_empty() && trimmed != t.trim() {
        t = trimmed;
    }
    for _ in 0..2 {
        let cut = p.unit_word.replace(&t, "$1").into_owned();
        if !cut.trim().is_empty() && cut != t {
            t = cut;
        }
    }
    let mut t = t.trim().to_string();
    if t.starts_with('.') {
        t.insert(0, '0');
    }
    if t == "0.5" {
        t = "\\frac{1}{2}".to_string();
    }
    t = p.paren_power.replace_all(&t, "^{$1}").into_owned();
    t = brace_short_arguments(&t);
    if let Some(c) = p.slash_int.captures(&t) {
        t = format!("\\frac{{{}}}{{{}}}", &c[1], &c[2]);
    }
    t.trim().to_string()
}

/// `\frac12` → `\frac{1}{2}`, `\frac1{x}` → `\frac{1}{x}`, `\sqrt2` → `\sqrt{2}` (spaces after the
/// command allowed).
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
            while i < chars.len() && chars[i] == ' ' {
                i += 1;
            }
            if i >= chars.len() {
                break;
            }
            match chars[i] {
                '{' | '[' => {
                    // copy the group verbatim (an `\sqrt[n]` index, then its argument)
                    let (open, close) = if chars[i] == '{' { ('{', '}') } else { ('[', ']') };
                    let mut depth = 0usize;
                    while i < chars.len() {
                        let c = chars[i];
                        out.push(c);
                        i += 1;
                        if c == open {
                            depth += 1;
                        } else if c == close {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                    }
                    if open == '[' {
                        // the index does not count as an argument
                        continue;
                    }
                }
                '\\' => break,
                c => {
                    out.push('{');
                    out.push(c);
                    out.push('}');
                    i += 1;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes() {
        assert_eq!(extract_boxed("so \\boxed{\\frac{1}{2}} done").as_deref(), Some("\\frac{1}{2}"));
        assert_eq!(extract_boxed("\\boxed{1} then \\boxed{2}").as_deref(), Some("2"));
        assert_eq!(extract_boxed("\\boxed 5$").as_deref(), Some("5"));
        assert_eq!(extract_boxed("\\fbox{7}").as_deref(), Some("7"));
        assert_eq!(extract_boxed("\\boxed{unclosed"), None);
        assert_eq!(extract_boxed("no box"), None);
        assert_eq!(boxed_answer("\\boxed{1} and \\boxed{2}").as_deref(), Some("1,2"));
        assert_eq!(boxed_answer("first \\boxed{1}, then a long way of talking about other things, far too long to be one list, then \\boxed{2}").as_deref(), Some("2"));
        assert_eq!(boxed_answer("\\boxed{1}, and then \\boxed{1}").as_deref(), Some("1"));
        assert_eq!(boxed_answer("x").as_deref(), None);
    }

    #[test]
    fn clean_up() {
        assert_eq!(normalize_latex("\\left( 3, \\dfrac{\\pi}{2} \\right)"), "( 3, \\frac{\\pi}{2} )");
        assert_eq!(normalize_latex("\\$32,\\!348"), "32,348");
        assert_eq!(normalize_latex("5.4 \\text{ cents}"), "5.4");
        assert_eq!(normalize_latex("864 \\mbox{ inches}^2"), "864");
        assert_eq!(normalize_latex("90 degrees"), "90");
        assert_eq!(normalize_latex("1{,}000"), "1,000");
        assert_eq!(normalize_latex("\\frac43"), "\\frac{4}{3}");
        assert_eq!(normalize_latex("11\\sqrt2"), "11\\sqrt{2}");
        assert_eq!(normalize_latex("\\sqrt[3]{2}"), "\\sqrt[3]{2}");
        assert_eq!(normalize_latex(".35625"), "0.35625");
        assert_eq!(normalize_latex("3/4"), "\\frac{3}{4}");
        assert_eq!(normalize_latex("1 and 2"), "1, 2");
        assert_eq!(normalize_latex("50 percent"), "50\\%");
        assert_eq!(normalize_latex("\\textbf{Evelyn}"), "\\text{Evelyn}");
        assert_eq!(normalize_latex("\\text{east}"), "\\text{east}");
    }
}
