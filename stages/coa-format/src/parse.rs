//! Splitting CoA text into tagged segments.
//!
//! The text is a sequence of `<tag>…</tag>` blocks separated by whitespace only. Inside a block,
//! the parser looks for that tag's own closing tag. Bodies of role-playing, tool-call and answer
//! blocks must not contain other CoA tags (a nested `<plan>` or a `</think>` inside `<answer>` is
//! an error); `<code>` and `<observation>` bodies are opaque (program source and environment output
//! may hold anything except their own closing tag). Text that merely looks like markup (`<div>`,
//! `a < b`) is content.
//!
//! Offsets come in two units: byte ranges (to slice the `&str`) and character (Unicode scalar)
//! spans, the unit `coa_text.observation_spans` uses.

use std::fmt;
use std::ops::Range;

use crate::tag::Tag;

/// A half-open range `[start, end)` of character (Unicode scalar value) offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn len(&self) -> usize {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// One `<tag>content</tag>` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment<'a> {
    pub tag: Tag,
    /// The text between the opening and closing tag, verbatim.
    pub content: &'a str,
    /// Byte range of the whole block, tags included.
    pub bytes: Range<usize>,
    /// Character span of the whole block, tags included.
    pub span: Span,
    /// Character span of `content`.
    pub content_span: Span,
}

/// What went wrong, and where (the position of the offending tag or text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub kind: ParseErrorKind,
    /// Byte offset in the text.
    pub byte: usize,
    /// Character offset in the text.
    pub char: usize,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// An opening tag whose closing tag never comes (the position is the opening tag's).
    Unclosed(Tag),
    /// A closing tag with no open block.
    StrayClose(Tag),
    /// Something tag-shaped (`<foo>`, `</Think>`) that is no CoA tag, between blocks.
    UnknownTag(String),
    /// A CoA tag opened inside another block's body.
    Nested { outer: Tag, inner: Tag },
    /// A closing tag of another block inside a body (`<think> … </plan>`).
    Mismatched { open: Tag, close: Tag },
    /// Non-whitespace text between blocks (the first characters of it).
    TextOutsideTags(String),
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseErrorKind::Unclosed(t) => {
                write!(f, "{} is never closed (expected {})", t.open(), t.close())
            }
            ParseErrorKind::StrayClose(t) => write!(
                f,
                "stray closing tag {} with no open {}",
                t.close(),
                t.open()
            ),
            ParseErrorKind::UnknownTag(s) => write!(f, "unknown tag `{s}`"),
            ParseErrorKind::Nested { outer, inner } => {
                write!(
                    f,
                    "{inner} nested inside {outer} (tags do not nest; close {outer} first)"
                )
            }
            ParseErrorKind::Mismatched { open, close } => {
                write!(f, "{close} inside {open} (expected {})", open.close())
            }
            ParseErrorKind::TextOutsideTags(s) => write!(f, "text outside any tag: {s:?}"),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at line {}, column {} (char {})",
            self.kind, self.line, self.column, self.char
        )
    }
}

impl std::error::Error for ParseError {}

/// Number of Unicode scalars in a UTF-8 byte slice (bytes that are not continuation bytes).
#[inline]
pub(crate) fn count_chars(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| (b as i8) >= -0x40).count()
}

/// Character count of a string; ASCII strings cost one pass of `is_ascii`.
#[inline]
pub fn char_len(s: &str) -> usize {
    count_chars(s.as_bytes())
}

/// Converts increasing byte offsets into character offsets in one pass over the text.
struct Cursor<'a> {
    bytes: &'a [u8],
    byte: usize,
    chars: usize,
}

impl Cursor<'_> {
    #[inline]
    fn at(&mut self, byte: usize) -> usize {
        debug_assert!(byte >= self.byte);
        self.chars += count_chars(&self.bytes[self.byte..byte]);
        self.byte = byte;
        self.chars
    }
}

/// A tag-shaped token at `pos` (which holds `<`): `(closing, name, token length)`.
pub(crate) fn token_at(bytes: &[u8], pos: usize) -> Option<(bool, &[u8], usize)> {
    let mut i = pos + 1;
    let closing = bytes.get(i) == Some(&b'/');
    if closing {
        i += 1;
    }
    let start = i;
    while i < bytes.len()
        && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'-')
    {
        i += 1;
    }
    if i == start
        || i - start > 64
        || bytes.get(i) != Some(&b'>')
        || !bytes[start].is_ascii_alphabetic() && bytes[start] != b'_'
    {
        return None;
    }
    Some((closing, &bytes[start..i], i + 1 - pos))
}

fn tag_of(name: &[u8]) -> Option<Tag> {
    std::str::from_utf8(name).ok().and_then(Tag::from_name)
}

fn error(text: &str, byte: usize, kind: ParseErrorKind) -> ParseError {
    let before = &text.as_bytes()[..byte];
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |k| k + 1);
    ParseError {
        kind,
        byte,
        char: count_chars(before),
        line: 1 + before.iter().filter(|&&b| b == b'\n').count(),
        column: 1 + count_chars(&before[line_start..]),
    }
}

/// The stray text up to the end of its line or the next `<` (at most 24 characters).
fn snippet(s: &str) -> String {
    let line = &s[..s.find(['\n', '<']).unwrap_or(s.len())];
    let line = if line.is_empty() { s } else { line };
    let mut out: String = line.chars().take(24).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

/// Splits `text` into its tagged blocks, in order.
pub fn parse(text: &str) -> Result<Vec<Segment<'_>>, ParseError> {
    let mut out = Vec::new();
    parse_into(text, &mut out)?;
    Ok(out)
}

/// [`parse`], appending to `out` (reuse one vector across many texts).
pub fn parse_into<'a>(text: &'a str, out: &mut Vec<Segment<'a>>) -> Result<(), ParseError> {
    let bytes = text.as_bytes();
    let mut cur = Cursor {
        bytes,
        byte: 0,
        chars: 0,
    };
    let mut pos = 0;
    loop {
        // Between blocks: whitespace only.
        let rest = &text[pos..];
        let trimmed = rest.trim_start();
        pos += rest.len() - trimmed.len();
        if pos == bytes.len() {
            return Ok(());
        }
        if bytes[pos] != b'<' {
            return Err(error(
                text,
                pos,
                ParseErrorKind::TextOutsideTags(snippet(&text[pos..])),
            ));
        }
        let Some((closing, name, len)) = token_at(bytes, pos) else {
            return Err(error(
                text,
                pos,
                ParseErrorKind::TextOutsideTags(snippet(&text[pos..])),
            ));
        };
        let Some(tag) = tag_of(name) else {
            return Err(error(
                text,
                pos,
                ParseErrorKind::UnknownTag(text[pos..pos + len].to_string()),
            ));
        };
        if closing {
            return Err(error(text, pos, ParseErrorKind::StrayClose(tag)));
        }
        let open_at = pos;
        let body = pos + len;
        let close = tag.close().as_bytes();
        let mut scan = body;
        let body_end = if tag.is_opaque() {
            match memchr::memmem::find(&bytes[body..], close) {
                Some(k) => body + k,
                None => return Err(error(text, open_at, ParseErrorKind::Unclosed(tag))),
            }
        } else {
            loop {
                let Some(k) = memchr_lt(&bytes[scan..]) else {
                    return Err(error(text, open_at, ParseErrorKind::Unclosed(tag)));
                };
                let at = scan + k;
                if bytes[at..].starts_with(close) {
                    break at;
                }
                if let Some((inner_closing, inner_name, _)) = token_at(bytes, at) {
                    if let Some(inner) = tag_of(inner_name) {
                        let kind = if inner_closing {
                            ParseErrorKind::Mismatched {
                                open: tag,
                                close: inner,
                            }
                        } else {
                            ParseErrorKind::Nested { outer: tag, inner }
                        };
                        return Err(error(text, at, kind));
                    }
                }
                scan = at + 1;
            }
        };
        let end = body_end + close.len();
        let c_open = cur.at(open_at);
        let c_body = cur.at(body);
        let c_body_end = cur.at(body_end);
        let c_end = cur.at(end);
        out.push(Segment {
            tag,
            content: &text[body..body_end],
            bytes: open_at..end,
            span: Span {
                start: c_open,
                end: c_end,
            },
            content_span: Span {
                start: c_body,
                end: c_body_end,
            },
        });
        pos = end;
    }
}

#[inline]
fn memchr_lt(haystack: &[u8]) -> Option<usize> {
    memchr::memchr(b'<', haystack)
}

/// The first `<tag>…</tag>` block of `text` at or after byte `from`, found by plain text search:
/// the first opening tag and the first closing tag after it, with no grammar (for text that does
/// not [`parse`], where a lenient reader still wants its blocks). Returns the block's byte range,
/// tags included, and its content; `None` when either tag is missing or `from` is not a character
/// boundary of `text`.
pub fn find_block(text: &str, tag: Tag, from: usize) -> Option<(Range<usize>, &str)> {
    let start = from + text.get(from..)?.find(tag.open())?;
    let body = start + tag.open().len();
    let len = text[body..].find(tag.close())?;
    Some((start..body + len + tag.close().len(), &text[body..body + len]))
}

/// The content of the last `<tag>…</tag>` block of `text`, found by plain text search: the last
/// opening tag and the first closing tag after it (`None` when that opening tag is never closed,
/// even if an earlier block is).
pub fn find_last_block(text: &str, tag: Tag) -> Option<&str> {
    let body = text.rfind(tag.open())? + tag.open().len();
    let len = text[body..].find(tag.close())?;
    Some(&text[body..body + len])
}

/// The Python source of a `<code>` body: the text inside a ```` ```py ```` (or ```` ```python ````,
/// or bare ```` ``` ````) fence, exactly as [`crate::render`] wrote it; an unfenced body is
/// returned trimmed.
pub fn code_source(content: &str) -> &str {
    let t = content.trim_start();
    let Some(after_fence) = t.strip_prefix("```") else {
        return content.trim();
    };
    // Drop the rest of the fence line (the language).
    let body = match after_fence.find('\n') {
        Some(k) => &after_fence[k + 1..],
        None => return "",
    };
    let tail = body.trim_end();
    match tail.strip_suffix("```") {
        Some(inner) => inner.strip_suffix('\n').unwrap_or(inner),
        None => body.trim_end(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_blocks_with_offsets() {
        let text =
            "<think>ä b</think>\n<plan>1. x < y</plan> <observation><div>é</div></observation>";
        let segs = parse(text).unwrap();
        assert_eq!(segs.len(), 3);
        assert_eq!(segs[0].tag, Tag::Think);
        assert_eq!(segs[0].content, "ä b");
        assert_eq!(segs[0].span, Span { start: 0, end: 18 });
        assert_eq!(segs[0].content_span, Span { start: 7, end: 10 });
        assert_eq!(segs[1].content, "1. x < y");
        assert_eq!(segs[2].content, "<div>é</div>");
        let chars: Vec<char> = text.chars().collect();
        let s = segs[2].span;
        assert_eq!(
            chars[s.start..s.end].iter().collect::<String>(),
            "<observation><div>é</div></observation>"
        );
        assert_eq!(
            &text[segs[2].bytes.clone()],
            "<observation><div>é</div></observation>"
        );
    }

    #[test]
    fn errors_name_the_problem_and_position() {
        let e = parse("<think>a</think>\n<plan>b").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::Unclosed(Tag::Plan));
        assert_eq!((e.line, e.column, e.char), (2, 1, 17));
        assert!(e.to_string().contains("<plan> is never closed"), "{e}");

        let e = parse("<think>a</think></plan>").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::StrayClose(Tag::Plan));
        assert_eq!(e.char, 16);

        let e = parse("<thinking>a</thinking>").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::UnknownTag("<thinking>".into()));

        let e = parse("<think>a <plan>b</plan></think>").unwrap_err();
        assert_eq!(
            e.kind,
            ParseErrorKind::Nested {
                outer: Tag::Think,
                inner: Tag::Plan
            }
        );
        assert_eq!(e.char, 9);

        let e = parse("<think>a </plan>").unwrap_err();
        assert_eq!(
            e.kind,
            ParseErrorKind::Mismatched {
                open: Tag::Think,
                close: Tag::Plan
            }
        );

        let e = parse("<think>a</think> so the answer is").unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::TextOutsideTags(_)));
        assert!(e.to_string().contains("\"so the answer is\""), "{e}");

        let e = parse("<think>é\nü</think>\n  x").unwrap_err();
        assert_eq!((e.line, e.column), (3, 3));
    }

    #[test]
    fn opaque_bodies_may_hold_tags() {
        let segs = parse("<code>\n```py\nprint('<think>')\n```\n</code><observation><plan></answer></observation>").unwrap();
        assert_eq!(segs.len(), 2);
        assert_eq!(code_source(segs[0].content), "print('<think>')");
        assert_eq!(segs[1].content, "<plan></answer>");
    }

    #[test]
    fn code_source_unfences() {
        assert_eq!(code_source("\n```py\nx = 1\n```\n"), "x = 1");
        assert_eq!(code_source("\n```python\nx = 1\n\n```\n"), "x = 1\n");
        assert_eq!(code_source("```\n  y\n```"), "  y");
        assert_eq!(code_source("\nx = 2\n"), "x = 2");
        assert_eq!(code_source("\n```py\n```\n"), "");
    }

    #[test]
    fn blocks_are_found_by_plain_text_search() {
        // chatter around the blocks, and text that does not parse (an unclosed <plan>)
        let text = "Sure! <think>a</think>\n<plan>x <answer>1</answer> chatter <answer>2</answer> <answer>3";
        assert!(parse(text).is_err());
        let (range, think) = find_block(text, Tag::Think, 0).unwrap();
        assert_eq!((think, &text[range.clone()]), ("a", "<think>a</think>"));
        // the first block at or after `from`
        let (r1, a1) = find_block(text, Tag::Answer, range.end).unwrap();
        assert_eq!(a1, "1");
        assert_eq!(find_block(text, Tag::Answer, r1.end).unwrap().1, "2");
        assert_eq!(find_block(text, Tag::Answer, r1.start + 1).unwrap().1, "2");
        // an opening tag never closed, a missing tag, a `from` past the end or inside a character
        assert_eq!(find_block(text, Tag::Plan, 0), None);
        assert_eq!(find_block(text, Tag::Code, 0), None);
        assert_eq!(find_block(text, Tag::Think, text.len() + 1), None);
        assert_eq!(find_block("é<think>a</think>", Tag::Think, 1), None);
        // no grammar: a block's content may hold other tags
        assert_eq!(find_block("<plan>p <code>c</code></plan>", Tag::Plan, 0).unwrap().1, "p <code>c</code>");
        // the last opening tag, closed by the first closing tag after it: here never closed
        assert_eq!(find_last_block(text, Tag::Answer), None);
        assert_eq!(find_last_block("<answer>1</answer> <answer>2</answer>x", Tag::Answer), Some("2"));
        assert_eq!(find_last_block("<answer>1 <answer>2</answer></answer>", Tag::Answer), Some("2"));
        assert_eq!(find_last_block("no tags", Tag::Answer), None);
    }

    #[test]
    fn empty_and_whitespace_texts_have_no_segments() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse(" \n\t").unwrap().is_empty());
    }
}
