//! Math answer equivalence, agreeing with the field's reference checker (HF math-verify, which
//! AFM's math reward calls) without a computer-algebra system.
//!
//! [`math_equal`]`(pred, gold)`:
//! 1. takes the answer out of `pred`: its last `\boxed{…}` (with the boxes right before it, see
//!    [`boxed_answer`]), else its last `$…$`, `\(…\)` or `\[…\]` math (with the math right
//!    before it when only `,`, `;`, `and`, `or` stand between: `$69$,$84$` is a two-part
//!    answer), else the whole text; the gold is read the same way (a gold is usually bare,
//!    `\frac{3}{56}`);
//! 2. normalises both strings ([`normalize_latex`]: `\left`/`\right`, `\text` wrappers, units,
//!    `{,}`, `\dfrac`, short `\frac12`, …); equal normalised strings (or a normalised prediction
//!    equal to the gold as written) are the same answer;
//! 3. parses both ([`parse`]: numbers, fractions, mixed numbers, radicals, `\pi`, `i`, functions,
//!    variables, `\pm`, tuples, intervals, sets, unions, matrices, equations and inequalities)
//!    and compares the parsed answers ([`compare`]: numbers exactly, decimals to 6 places,
//!    expressions by evaluation at random points, sets unordered, equations by their solutions).
//!    An answer that does not parse is only equal to the same normalised text.
//!
//! An empty answer is never equal to anything. `tests/math_verify/` holds a table of 2,057
//! (gold, answer) pairs built from MATH-500's and AIME24's golds, with math-verify's verdict on each; the
//! `math_verify_agreement` test measures how often `math_equal` agrees (README: "Math answers").

mod compare;
mod expr;
mod normalize;
mod parse;

pub use normalize::{boxed_answer, extract_boxed, normalize_latex};

/// The answer part of a text: its boxed answer, else its last inline or display math (with the
/// math right before it when only `,`, `;`, `and` or `or` stand between: `$69$,$84$` and
/// `$1$ and $-2$` are two-part answers, as the reference checker reads them), else the whole
/// text (trimmed).
fn answer_part(s: &str) -> String {
    if let Some(b) = boxed_answer(s) {
        return b;
    }
    let only_separators = |gap: &str, _: &str| gap.split(|c: char| c.is_whitespace() || c == ',' || c == ';').all(|w| w.is_empty() || w == "and" || w == "or");
    normalize::join_last(s, math_spans(s), only_separators).unwrap_or_else(|| s.trim().to_string())
}

/// Every `$…$`, `$$…$$`, `\(…\)` and `\[…\]` of `s`, left to right, as (start, end, content); an
/// escaped `\$` is a dollar sign, never a delimiter; empty math is left out.
fn math_spans(s: &str) -> Vec<(usize, usize, String)> {
    let unescaped = |at: usize| at == 0 || s.as_bytes()[at - 1] != b'\\';
    let mut spans = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let open = ["$$", "\\[", "\\(", "$"].into_iter().find(|o| rest.starts_with(o) && (!o.starts_with('$') || unescaped(i)));
        let Some(open) = open else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let close = match open {
            "\\[" => "\\]",
            "\\(" => "\\)",
            other => other,
        };
        let body = i + open.len();
        let mut from = body;
        let end = loop {
            match s[from..].find(close) {
                Some(off) if close.starts_with('$') && !unescaped(from + off) => from += off + 1,
                Some(off) => break Some(from + off),
                None => break None,
            }
        };
        let Some(end) = end else { break };
        let content = s[body..end].trim();
        if !content.is_empty() {
            spans.push((i, end + close.len(), content.to_string()));
        }
        i = end + close.len();
    }
    spans
}

/// The answer of `s` normalised as a string (what step 2 of the module docs compares).
pub fn normalize_math(s: &str) -> String {
    normalize_latex(&answer_part(s))
}

/// Whether `pred` and `gold` are the same math answer (see the module docs).
pub fn math_equal(pred: &str, gold: &str) -> bool {
    let p = normalize_math(pred);
    let g = normalize_math(gold);
    if p.is_empty() || g.is_empty() {
        return false;
    }
    if p == g || p == gold.trim() {
        return true;
    }
    let Ok(ge) = parse::parse_answer(&g) else { return false };
    let pe = match parse::parse_answer(&p) {
        Ok(pe) => pe,
        // An answer that does not parse as a whole may still end in a plain fraction
        // (`\frac{3}{4}.`): the reference checker reads that fraction.
        Err(_) => match last_simple_fraction(pred).and_then(|f| parse::parse_answer(&f).ok()) {
            Some(pe) => pe,
            None => return false,
        },
    };
    compare::equal(&ge, &pe)
}

/// The last `\frac{a}{b}` of `s` with plain numbers `a`, `b` (sign included).
fn last_simple_fraction(s: &str) -> Option<String> {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| regex::Regex::new(r"-?\\[dt]?frac\{-?\d+(?:\.\d+)?\}\{-?\d+(?:\.\d+)?\}").expect("valid"));
    re.find_iter(s).last().map(|m| m.as_str().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert!(math_equal("25", "025"));
        assert!(math_equal("2.50", "2.5"));
        assert!(math_equal("\\frac{1}{2}", "0.5"));
        assert!(math_equal("\\dfrac12", "1/2"));
        assert!(math_equal("-\\frac{3}{4}", "\\frac{-3}{4}"));
        assert!(math_equal("1,234,567", "1234567"));
        assert!(math_equal("1{,}000", "1000"));
        assert!(math_equal("$90^\\circ$", "90"));
        assert!(math_equal("50\\%", "50"));
        assert!(math_equal("x = 5", "5"));
        assert!(math_equal("\\boxed{6205}", "6205"));
        assert!(math_equal("10^3", "1000"));
        assert!(math_equal("2^{10}", "1024"));
        assert!(math_equal("3\\frac12", "\\frac{7}{2}"));
        assert!(math_equal("0.333333", "\\frac{1}{3}"));
        assert!(!math_equal("0.33", "\\frac{1}{3}"));
        assert!(!math_equal("6206", "6205"));
        assert!(!math_equal("1725.4", "1725.41"));
        assert!(!math_equal("\\frac{1}{0}", "1"));
        assert!(!math_equal("1, 234", "1234"), "a two-item list is not a number");
        assert!(!math_equal(".0000673", ".0000672"));
        assert!(math_equal("123456789012345678901234567890123456789", "123456789012345678901234567890123456789"));
    }

    #[test]
    fn units_words_and_choices() {
        assert!(math_equal("5\\text{ cm}", "5"));
        assert!(math_equal("5.4", "5.4 \\text{ cents}"));
        assert!(math_equal("90 degrees", "90"));
        assert!(math_equal("\\text{Evelyn}", "Evelyn"));
        assert!(math_equal("evelyn", "\\text{Evelyn}"));
        assert!(math_equal("C", "\\text{(C)}"));
        assert!(!math_equal("A", "\\text{(C)}"));
        assert!(math_equal("+\\infty", "\\infty"));
        assert!(!math_equal("-\\infty", "\\infty"));
    }

    #[test]
    fn expressions() {
        assert!(math_equal("\\frac{\\sqrt{2}}{2}", "\\frac{\\sqrt2}{2}"));
        assert!(math_equal("2\\sqrt2", "\\sqrt8"));
        assert!(math_equal("\\frac{\\pi}{2}", "\\pi/2"));
        assert!(math_equal("2\\cdot x", "2x"));
        assert!(math_equal("(x+1)(x+2)", "x^2+3x+2"));
        assert!(math_equal("2+3x+x^2", "x^2+3x+2"));
        assert!(!math_equal("x^2+3x+3", "x^2+3x+2"));
        assert!(!math_equal("y+1", "x+1"));
        assert!(math_equal("-5i+6", "6 - 5i"));
        assert!(!math_equal("6 + 5i", "6 - 5i"));
        assert!(math_equal("11\\sqrt2", "11\\sqrt{2}"));
    }

    #[test]
    fn structures() {
        assert!(math_equal("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"));
        assert!(math_equal("(3, 1.50)", "\\left(3,\\frac{3}{2}\\right)"));
        assert!(!math_equal("(1, 3]", "(1, 3)"));
        assert!(math_equal("\\{3, 2, 1\\}", "\\{1,2,3\\}"));
        assert!(math_equal("1, -2", "x=-2, x=1"));
        assert!(math_equal("[-2, 7]", "x \\in [-2,7]"));
        assert!(math_equal("1,-2", "1, -2"));
        assert!(!math_equal("1,-3", "1,-2"));
        assert!(math_equal("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"));
        assert!(math_equal("\\begin{bmatrix} -1/3 \\\\ 2/3 \\end{bmatrix}", "\\begin{pmatrix} -\\frac13 \\\\ \\frac23 \\end{pmatrix}"));
        assert!(!math_equal("\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"));
        assert!(math_equal("(9,36) \\cup (0,9)", "(0,9) \\cup (9,36)"));
        assert!(math_equal("2x+3", "y = 2x + 3"));
        assert!(math_equal("-5x + 7y - 11z - 4 = 0", "5x - 7y + 11z + 4 = 0"));
        assert!(math_equal("1 + \\sqrt{19}, 1 - \\sqrt{19}", "1 \\pm \\sqrt{19}"));
        assert!(!math_equal("", ""));
        assert!(!math_equal("\\boxed{}", "1"));
    }

    #[test]
    fn several_part_golds_are_read_whole() {
        // a gold in several math parts is their list, not its last part
        assert!(!math_equal("\\boxed{84}", "$69$,$84$"));
        assert!(!math_equal("\\boxed{69}", "$69$,$84$"));
        assert!(math_equal("\\boxed{84, 69}", "$69$,$84$"));
        assert!(math_equal("\\boxed{\\{69, 84\\}}", "$69$, $84$"));
        assert!(math_equal("The roots are $1$ and $-2$.", "1,-2"));
        assert!(!math_equal("The roots are $1$ and $-2$.", "1"));
        assert!(!math_equal("\\boxed{-2}", "1, -2"));
        // math apart from the answer (other words between) is not joined to it
        assert!(math_equal("With $y = 3$ we get $x = 5$", "5"));
        // an escaped dollar inside the math is a dollar sign, not its end
        assert!(math_equal("The answer is $\\$18.90$.", "\\$18.90"));
    }

    #[test]
    fn variables_range_over_integers_and_negatives() {
        assert!(!math_equal("\\lceil n/3\\rceil+1", "\\lceil n/2\\rceil+1"), "equal only on small positive n");
        assert!(math_equal("1+\\lceil \\frac{n}{2}\\rceil", "\\lceil n/2\\rceil+1"));
        assert!(!math_equal("\\left|2k+2\\right|", "2k+2"), "equal only for k > -1");
        assert!(!math_equal("\\sqrt{(a+5)(a+5)}", "a+5"));
        assert!(!math_equal("2k+2 + \\lfloor k/2 \\rfloor - \\lfloor k/3 \\rfloor", "2k+2"));
        assert!(math_equal("\\sqrt{x^2}", "|x|"), "variables are real, as the reference checker's are");
        assert!(math_equal("\\binom{n+1}{2}", "\\frac{n(n+1)}{2}"));
    }
}
