//! Steps → CoA text, with the observation spans the tokenizer masks.
//!
//! Layout: one block per step, blocks separated by a single `\n`; a tool-call step is followed by
//! its `<observation>…</observation>` block. Contents are written verbatim, except code, which is
//! fenced: `<code>\n```py\n{source}\n```\n</code>`. [`crate::parse`] reads the text back into
//! exactly the same steps (`code_source` removes the fence).
//!
//! **Observation spans** are character (Unicode scalar) offsets `[start, end)` into the rendered
//! text, covering the whole `<observation>…</observation>` block *including both tags*. Characters
//! rather than bytes because they survive any re-encoding (Python `str` indexes by code point,
//! and polars/pyarrow readers use the same unit); tags included because the model must not learn
//! to write `<observation>` either: generation stops at the tool call's closing tag and the
//! environment appends the whole block.

use std::fmt;

use crate::grammar::Step;
use crate::parse::{char_len, token_at, Span};
use crate::tag::Tag;

/// Why steps cannot be rendered into text that parses back to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderError {
    /// Index of the offending step.
    pub index: usize,
    pub tag: Tag,
    pub problem: RenderProblem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderProblem {
    /// The content holds a CoA tag (only allowed in code and observation bodies).
    ContainsTag(String),
    /// A code or observation body holds its own closing tag.
    ContainsClosingTag(Tag),
    /// The sink refused a write.
    Sink,
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            RenderProblem::ContainsTag(t) => write!(
                f,
                "step {} ({}): content holds the CoA tag `{t}`",
                self.index, self.tag
            ),
            RenderProblem::ContainsClosingTag(t) => {
                write!(
                    f,
                    "step {} ({}): {} body holds its closing tag {}",
                    self.index,
                    self.tag,
                    t.open(),
                    t.close()
                )
            }
            RenderProblem::Sink => write!(
                f,
                "step {} ({}): writing the text failed",
                self.index, self.tag
            ),
        }
    }
}

impl std::error::Error for RenderError {}

/// A rendered trajectory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rendered {
    pub text: String,
    /// Character spans of every `<observation>…</observation>` block (module docs).
    pub observation_spans: Vec<Span>,
}

const FENCE_OPEN: &str = "\n```py\n";
const FENCE_CLOSE: &str = "\n```\n";

/// The first CoA tag token in a non-opaque body, if any (the same test the parser applies).
fn tag_in(content: &str) -> Option<&str> {
    let bytes = content.as_bytes();
    let mut from = 0;
    while let Some(k) = memchr::memchr(b'<', &bytes[from..]) {
        let at = from + k;
        if let Some((_, name, len)) = token_at(bytes, at) {
            if std::str::from_utf8(name)
                .ok()
                .and_then(Tag::from_name)
                .is_some()
            {
                return Some(&content[at..at + len]);
            }
        }
        from = at + 1;
    }
    None
}

fn check_body(index: usize, step_tag: Tag, body_tag: Tag, body: &str) -> Result<(), RenderError> {
    let problem = if body_tag.is_opaque() {
        if memchr::memmem::find(body.as_bytes(), body_tag.close().as_bytes()).is_some() {
            RenderProblem::ContainsClosingTag(body_tag)
        } else {
            return Ok(());
        }
    } else {
        match tag_in(body) {
            Some(t) => RenderProblem::ContainsTag(t.to_string()),
            None => return Ok(()),
        }
    };
    Err(RenderError {
        index,
        tag: step_tag,
        problem,
    })
}

/// Checks that every step renders into text that parses back to it.
pub fn check_steps(steps: &[Step<'_>]) -> Result<(), RenderError> {
    for (i, s) in steps.iter().enumerate() {
        check_body(i, s.tag, s.tag, s.content)?;
        if let Some(obs) = s.observation {
            check_body(i, s.tag, Tag::Observation, obs)?;
        }
    }
    Ok(())
}

/// Checks only the observations (for steps whose contents came out of [`crate::parse`], which
/// already guarantees that every block body renders back: only tool output is foreign text).
pub fn check_observations(steps: &[Step<'_>]) -> Result<(), RenderError> {
    for (i, s) in steps.iter().enumerate() {
        if let Some(obs) = s.observation {
            check_body(i, s.tag, Tag::Observation, obs)?;
        }
    }
    Ok(())
}

/// Writes pieces to a sink and counts the characters written.
struct Writer<'w, W: fmt::Write> {
    out: &'w mut W,
    chars: usize,
}

impl<W: fmt::Write> Writer<'_, W> {
    #[inline]
    fn ascii(&mut self, s: &str) -> fmt::Result {
        debug_assert!(s.is_ascii());
        self.chars += s.len();
        self.out.write_str(s)
    }
    #[inline]
    fn text(&mut self, s: &str) -> fmt::Result {
        self.chars += char_len(s);
        self.out.write_str(s)
    }
}

/// Renders steps into `out`, appending the observation spans (relative to the start of what this
/// call writes) to `spans`. Returns the number of characters written. The steps are checked
/// first ([`check_steps`]), so an error leaves `out` untouched.
pub fn render_to<W: fmt::Write>(
    steps: &[Step<'_>],
    out: &mut W,
    spans: &mut Vec<Span>,
) -> Result<usize, RenderError> {
    check_steps(steps)?;
    let mut w = Writer { out, chars: 0 };
    for (i, s) in steps.iter().enumerate() {
        let sink = |_| RenderError {
            index: i,
            tag: s.tag,
            problem: RenderProblem::Sink,
        };
        if i > 0 {
            w.ascii("\n").map_err(sink)?;
        }
        w.ascii(s.tag.open()).map_err(sink)?;
        if s.tag == Tag::Code {
            w.ascii(FENCE_OPEN).map_err(sink)?;
            w.text(s.content).map_err(sink)?;
            w.ascii(FENCE_CLOSE).map_err(sink)?;
        } else {
            w.text(s.content).map_err(sink)?;
        }
        w.ascii(s.tag.close()).map_err(sink)?;
        if s.tag == Tag::Observation {
            let end = w.chars;
            spans.push(Span {
                start: end - char_len(s.content) - s.tag.open().len() - s.tag.close().len(),
                end,
            });
        }
        if let Some(obs) = s.observation {
            w.ascii("\n").map_err(sink)?;
            let start = w.chars;
            w.ascii(Tag::Observation.open()).map_err(sink)?;
            w.text(obs).map_err(sink)?;
            w.ascii(Tag::Observation.close()).map_err(sink)?;
            spans.push(Span {
                start,
                end: w.chars,
            });
        }
    }
    Ok(w.chars)
}

/// Renders steps into a new string with its observation spans.
pub fn render(steps: &[Step<'_>]) -> Result<Rendered, RenderError> {
    let cap: usize = steps
        .iter()
        .map(|s| s.content.len() + s.observation.map_or(0, str::len) + 48)
        .sum();
    let mut out = Rendered {
        text: String::with_capacity(cap),
        observation_spans: Vec::new(),
    };
    render_to(steps, &mut out.text, &mut out.observation_spans)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_afm_layout() {
        let steps = [
            Step::new(Tag::Think, "plan first"),
            Step::new(Tag::Plan, "1. compute"),
            Step::new(Tag::Think, "run it"),
            Step::tool(
                Tag::Code,
                "print(6*7)",
                "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n42\n[STDOUT:END]",
            ),
            Step::new(Tag::Answer, "\\boxed{42}"),
        ];
        let r = render(&steps).unwrap();
        assert_eq!(
            r.text,
            "<think>plan first</think>\n<plan>1. compute</plan>\n<think>run it</think>\n<code>\n```py\nprint(6*7)\n```\n</code>\n\
             <observation>[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n42\n[STDOUT:END]</observation>\n<answer>\\boxed{42}</answer>"
        );
        assert_eq!(r.observation_spans.len(), 1);
        let s = r.observation_spans[0];
        let block: String = r.text.chars().skip(s.start).take(s.len()).collect();
        assert!(
            block.starts_with("<observation>[EXECUTED]")
                && block.ends_with("[STDOUT:END]</observation>")
        );
    }

    #[test]
    fn refuses_content_that_would_not_parse_back() {
        let e = render(&[Step::new(Tag::Think, "I will write <answer> now")]).unwrap_err();
        assert_eq!(e.problem, RenderProblem::ContainsTag("<answer>".into()));
        assert!(e.to_string().contains("step 0 (<think>)"), "{e}");
        let e = render(&[Step::tool(Tag::WebSearch, "q", "a </observation> b")]).unwrap_err();
        assert_eq!(
            e.problem,
            RenderProblem::ContainsClosingTag(Tag::Observation)
        );
        let e = render(&[Step::tool(Tag::Code, "s = '</code>'", "")]).unwrap_err();
        assert_eq!(e.problem, RenderProblem::ContainsClosingTag(Tag::Code));
        // Markup that is not a CoA tag is fine anywhere; CoA tags are fine in opaque bodies.
        assert!(render(&[
            Step::new(Tag::Plan, "a <b> c < d"),
            Step::tool(Tag::Code, "x = '<think>'", "<plan>")
        ])
        .is_ok());
    }
}
