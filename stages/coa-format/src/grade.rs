//! Parsers for the graded role-playing blocks: a `<reflection>` grades three criteria as
//! Good/Fair/Poor (AFM's prompts say Average for Fair; any Poor means re-plan), a `<double_check>` gives `score: N`, 1-4 (3 or 4 means
//! answer, 1 or 2 means re-plan). Keys are matched case-insensitively and light markdown around
//! them is tolerated (`- **tool_effectiveness**: Fair`, `Score: 4/4`); a score written without the
//! colon (`The score is 4`) is read when no `score:` is there.

use std::fmt;

/// A reflection grade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Grade {
    Good,
    Fair,
    Poor,
}

impl Grade {
    pub const ALL: [Grade; 3] = [Grade::Good, Grade::Fair, Grade::Poor];

    pub const fn name(self) -> &'static str {
        match self {
            Grade::Good => "Good",
            Grade::Fair => "Fair",
            Grade::Poor => "Poor",
        }
    }

    /// `Good`, `Fair` or `Poor` (any case); AFM's prompts also grade `Average`, read as Fair.
    fn from_word(w: &str) -> Option<Grade> {
        if w.eq_ignore_ascii_case("average") {
            return Some(Grade::Fair);
        }
        Grade::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(w))
    }
}

impl fmt::Display for Grade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The three criteria a reflection grades, in the order they are written.
pub const REFLECTION_CRITERIA: [&str; 3] = [
    "information_conflict",
    "tool_effectiveness",
    "trajectory_monitoring",
];

/// The grades of one `<reflection>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReflectionGrades {
    pub information_conflict: Grade,
    pub tool_effectiveness: Grade,
    pub trajectory_monitoring: Grade,
}

impl ReflectionGrades {
    pub fn all(&self) -> [Grade; 3] {
        [
            self.information_conflict,
            self.tool_effectiveness,
            self.trajectory_monitoring,
        ]
    }

    /// Any Poor grade: the trajectory must re-plan next.
    pub fn needs_replan(&self) -> bool {
        self.all().contains(&Grade::Poor)
    }

    /// `information_conflict: Good\ntool_effectiveness: …` as a reflection writes it.
    pub fn render(&self) -> String {
        let g = self.all();
        format!(
            "{}: {}\n{}: {}\n{}: {}",
            REFLECTION_CRITERIA[0],
            g[0],
            REFLECTION_CRITERIA[1],
            g[1],
            REFLECTION_CRITERIA[2],
            g[2]
        )
    }
}

/// Why a grade or score could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GradeError {
    /// The key (`tool_effectiveness`, `score`) is not in the text, followed by `:`.
    Missing(&'static str),
    /// The key is there but its value is not one of the allowed ones.
    BadValue { key: &'static str, found: String },
}

impl fmt::Display for GradeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GradeError::Missing("score") => write!(f, "no `score: N` (N = 1-4)"),
            GradeError::Missing(key) => write!(f, "no `{key}: Good|Fair|Poor` grade"),
            GradeError::BadValue {
                key: "score",
                found,
            } => write!(f, "score `{found}` is not 1, 2, 3 or 4"),
            GradeError::BadValue { key, found } => write!(
                f,
                "`{key}` is graded `{found}`, expected Good, Fair or Poor"
            ),
        }
    }
}

impl std::error::Error for GradeError {}

/// Markup tolerated around a key and its value.
fn is_markup(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'*' | b'_' | b'`' | b'"' | b'\'')
}

/// Byte offset of the value after the first `key:` (case-insensitive, markup allowed around the
/// key and the colon), if any.
fn value_after(text: &str, key: &str) -> Option<usize> {
    value_after_any(text, key, &[":"])
}

/// [`value_after`] with any of `separators` in place of the colon (a word separator, `is`, must
/// be followed by a space or markup).
fn value_after_any(text: &str, key: &str, separators: &[&str]) -> Option<usize> {
    let bytes = text.as_bytes();
    let k = key.as_bytes();
    let mut from = 0;
    while from + k.len() <= bytes.len() {
        let rel = bytes[from..]
            .windows(k.len())
            .position(|w| w.eq_ignore_ascii_case(k))?;
        let start = from + rel;
        let mut i = start + k.len();
        // The key must stand alone: no identifier character right before or after it.
        let word_before = start > 0
            && (bytes[start - 1].is_ascii_alphanumeric()
                || bytes[start - 1] == b'_' && key != "score");
        let word_after = bytes.get(i).is_some_and(|b| b.is_ascii_alphanumeric());
        if !word_before && !word_after {
            while i < bytes.len() && is_markup(bytes[i]) {
                i += 1;
            }
            let sep = separators.iter().find(|sep| {
                let sep = sep.as_bytes();
                let word = sep[0].is_ascii_alphabetic();
                bytes.len() >= i + sep.len()
                    && bytes[i..i + sep.len()].eq_ignore_ascii_case(sep)
                    && (!word || bytes.get(i + sep.len()).is_some_and(|&b| is_markup(b)))
            });
            if let Some(sep) = sep {
                i += sep.len();
                while i < bytes.len() && is_markup(bytes[i]) {
                    i += 1;
                }
                return Some(i);
            }
        }
        from = start + 1;
    }
    None
}

fn word_at(text: &str, at: usize) -> &str {
    let rest = &text[at..];
    let end = rest
        .find(|c: char| !c.is_alphanumeric())
        .unwrap_or(rest.len());
    &rest[..end]
}

/// Reads the three grades of a `<reflection>` body.
pub fn parse_reflection(content: &str) -> Result<ReflectionGrades, GradeError> {
    let mut grades = [Grade::Good; 3];
    for (slot, key) in grades.iter_mut().zip(REFLECTION_CRITERIA) {
        // AFM writes the criteria as words (`Information Conflict: Good`).
        let at = value_after(content, key)
            .or_else(|| value_after(content, &key.replace('_', " ")))
            .ok_or(GradeError::Missing(key))?;
        let word = word_at(content, at);
        *slot = Grade::from_word(word).ok_or_else(|| GradeError::BadValue {
            key,
            found: first_chars(&content[at..]),
        })?;
    }
    Ok(ReflectionGrades {
        information_conflict: grades[0],
        tool_effectiveness: grades[1],
        trajectory_monitoring: grades[2],
    })
}

fn first_chars(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    line.chars().take(20).collect()
}

/// Ways of writing a score other than `score: N`, read only when that form is absent: models
/// write `The score is 4`, `score = 4` or `a score of 4` as often as the form the prompts ask for.
const LOOSE_SCORE_SEPARATORS: [&str; 3] = ["=", "is", "of"];

/// Reads the `score: N` (1-4) of a `<double_check>` body; without one, a looser `score is N`,
/// `score = N` or `score of N` ([`LOOSE_SCORE_SEPARATORS`]).
pub fn parse_double_check(content: &str) -> Result<u8, GradeError> {
    let at = value_after(content, "score")
        .or_else(|| value_after_any(content, "score", &LOOSE_SCORE_SEPARATORS))
        .ok_or(GradeError::Missing("score"))?;
    let word = word_at(content, at);
    match word.parse::<u8>() {
        Ok(n @ 1..=4) => Ok(n),
        _ => Err(GradeError::BadValue {
            key: "score",
            found: first_chars(&content[at..]),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_reflection_grades() {
        let g = parse_reflection("The search worked.\ninformation_conflict: Good\ntool_effectiveness: fair\ntrajectory_monitoring: Good").unwrap();
        assert_eq!(g.all(), [Grade::Good, Grade::Fair, Grade::Good]);
        assert!(!g.needs_replan());
        let g = parse_reflection("information_conflict: Average\ntool_effectiveness: Good\ntrajectory_monitoring: Fair").unwrap();
        assert_eq!(g.all(), [Grade::Fair, Grade::Good, Grade::Fair]);
        let g = parse_reflection("(1) Information Conflict: Good\n(2) Tool Effectiveness: Average\n(3) Trajectory Monitoring: Poor").unwrap();
        assert_eq!(g.all(), [Grade::Good, Grade::Fair, Grade::Poor]);
        let g = parse_reflection("- **information_conflict**: Poor\n- **tool_effectiveness**: Good\n- `trajectory_monitoring`: Fair").unwrap();
        assert!(g.needs_replan());
        assert_eq!(parse_reflection(&g.render()).unwrap(), g);
        assert_eq!(
            parse_reflection("information_conflict: Good").unwrap_err(),
            GradeError::Missing("tool_effectiveness")
        );
        let e = parse_reflection(
            "information_conflict: Great\ntool_effectiveness: Good\ntrajectory_monitoring: Good",
        )
        .unwrap_err();
        assert_eq!(
            e,
            GradeError::BadValue {
                key: "information_conflict",
                found: "Great".into()
            }
        );
        assert!(e.to_string().contains("expected Good, Fair or Poor"));
    }

    #[test]
    fn reads_double_check_scores() {
        assert_eq!(
            parse_double_check("The answer matches the page.\nscore: 4"),
            Ok(4)
        );
        assert_eq!(parse_double_check("**Score**: 2/4"), Ok(2));
        assert_eq!(parse_double_check("final_score: 3"), Ok(3));
        assert_eq!(
            parse_double_check("looks right"),
            Err(GradeError::Missing("score"))
        );
        assert_eq!(
            parse_double_check("score: 5"),
            Err(GradeError::BadValue {
                key: "score",
                found: "5".into()
            })
        );
        assert_eq!(
            parse_double_check("score: high"),
            Err(GradeError::BadValue {
                key: "score",
                found: "high".into()
            })
        );
        assert_eq!(parse_double_check("scored well. score: 1"), Ok(1));
    }

    #[test]
    fn reads_loose_double_check_scores() {
        assert_eq!(parse_double_check("The page agrees. The score is 4."), Ok(4));
        assert_eq!(parse_double_check("Score: 4/4"), Ok(4));
        assert_eq!(parse_double_check("score = 2"), Ok(2));
        assert_eq!(parse_double_check("I give it a score of 3 out of 4."), Ok(3));
        assert_eq!(parse_double_check("The **Score** is **1**"), Ok(1));
        // the strict form wins over a loose one written before it
        assert_eq!(parse_double_check("the score is 2 at first sight.\nscore: 4"), Ok(4));
        // still no score: a word that only starts like a separator, or none at all
        assert_eq!(parse_double_check("The score isn't clear"), Err(GradeError::Missing("score")));
        assert_eq!(parse_double_check("scores of 4 elsewhere"), Err(GradeError::Missing("score")));
        assert_eq!(parse_double_check("The score is high"), Err(GradeError::BadValue { key: "score", found: "high".into() }));
        assert_eq!(parse_double_check("The score is 7"), Err(GradeError::BadValue { key: "score", found: "7".into() }));
    }
}
