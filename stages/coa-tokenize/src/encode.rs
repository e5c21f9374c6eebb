//! One row → token ids and loss mask.
//!
//! **Layout** (no chat template): `[BOS…] prompt "\n" text [EOS]`. The prompt and the separator are
//! conditioning (mask 0), as is the BOS; the text is what the model writes (mask 1) except its
//! observation spans (mask 0); the EOS is a target (mask 1) so the model learns to stop.
//! With a chat template (see [`crate::chat`]): `template(system, user, generation prompt) text
//! [EOS]`, the rendered prefix conditioning (mask 0); for a ChatML model the EOS is `<|im_end|>`,
//! which closes the assistant turn.
//!
//! **Segments.** The mask comes from character offsets, never from token patterns: the sequence
//! is cut into segments at the prompt/text boundary and at every observation span boundary, each
//! segment is encoded on its own (no token ever straddles a boundary), and every token of a
//! segment gets the segment's mask. This is how RL rollouts build their sequences too
//! (token-in/token-out: an observation is encoded and appended, never merged with its
//! neighbours). The ids equal the tokenizer's encoding of the joined string whenever every
//! boundary touches a special token: true for `coa-convert` output, whose spans cover
//! `<observation>…</observation>` with both tags and whose text starts with a tag. A row where a
//! boundary falls elsewhere is counted (`rows_unaligned` in the summary; `--verify-joined`
//! compares against the joined encoding outright).

use coa_format::Span;

use crate::vocab::Vocab;

/// What joins the prompt and the text (part of the prompt segment, mask 0).
pub const PROMPT_SEPARATOR: &str = "\n";

/// A tokenized row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoded {
    pub ids: Vec<u32>,
    /// 1 = target.
    pub mask: Vec<u8>,
    /// Token ranges `[a, b)` of the observation segments, in order.
    pub observations: Vec<(u32, u32)>,
    /// Number of leading conditioning tokens (BOS + prompt + separator).
    pub prompt_len: u32,
    /// Whether every segment boundary touches a special token (so the ids equal the joined encoding).
    pub aligned: bool,
}

impl Encoded {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    pub fn targets(&self) -> usize {
        self.mask.iter().filter(|&&m| m == 1).count()
    }
}

/// Checks observation spans (character offsets) against a text of `n_chars` characters: each
/// `0 <= start <= end <= n_chars`, in order, not overlapping. The error names the span.
pub fn check_spans(starts: &[i32], ends: &[i32], n_chars: usize) -> Result<(), String> {
    let mut prev_end: i64 = 0;
    for (i, (&s, &e)) in starts.iter().zip(ends).enumerate() {
        let (s, e) = (s as i64, e as i64);
        let what = format!("observation_spans[{i}] = [{s}, {e})");
        if s < 0 || e < 0 {
            return Err(format!("{what}: negative offset"));
        }
        if e < s {
            return Err(format!("{what}: end < start"));
        }
        if e > n_chars as i64 {
            return Err(format!("{what}: out of range, `text` has {n_chars} characters"));
        }
        if s < prev_end {
            return Err(format!("{what}: overlaps or precedes the previous span (ending at {prev_end}); spans must be sorted and disjoint"));
        }
        prev_end = e;
    }
    Ok(())
}

/// Byte offsets of the sorted character offsets `chars` in `text` (each `<=` the char count).
pub fn char_to_byte(text: &str, chars: &[usize]) -> Vec<usize> {
    if text.is_ascii() {
        return chars.to_vec();
    }
    let mut out = Vec::with_capacity(chars.len());
    let mut it = chars.iter().peekable();
    for (ci, (bi, _)) in text.char_indices().enumerate() {
        while let Some(&&c) = it.peek() {
            if c == ci {
                out.push(bi);
                it.next();
            } else {
                break;
            }
        }
        if it.peek().is_none() {
            break;
        }
    }
    out.extend(it.map(|_| text.len()));
    out
}

/// The conditioning text before the model's text: the prompt and [`PROMPT_SEPARATOR`], or, with
/// a chat template, the prompt's system and user turns and the generation prompt.
pub fn prompt_segment(vocab: &Vocab, prompt: &str) -> Result<String, String> {
    match &vocab.chat {
        Some(t) => t.prefix(prompt).map_err(|e| format!("{e:#}")),
        None => Ok(format!("{prompt}{PROMPT_SEPARATOR}")),
    }
}

/// Encodes one row. `starts`/`ends` are checked character spans (see [`check_spans`]).
pub fn encode_row(vocab: &Vocab, prompt: &str, text: &str, starts: &[i32], ends: &[i32]) -> Result<Encoded, String> {
    encode_row_untrained(vocab, prompt, text, starts, ends, &[])
}

/// [`encode_row`] with `untrained` character spans of the text also kept out of the loss (mask 0)
/// though they are not observations: the retracted steps of `--mask-retracted`. Sorted, disjoint
/// from each other and from the observation spans (an overlap is an error naming both).
pub fn encode_row_untrained(vocab: &Vocab, prompt: &str, text: &str, starts: &[i32], ends: &[i32], untrained: &[Span]) -> Result<Encoded, String> {
    // (start, end, is_observation) in character offsets, sorted by start.
    let mut masked: Vec<(usize, usize, bool)> = starts.iter().zip(ends).map(|(&s, &e)| (s as usize, e as usize, true)).collect();
    masked.extend(untrained.iter().map(|s| (s.start, s.end, false)));
    masked.sort_unstable();
    for w in masked.windows(2) {
        if w[1].0 < w[0].1 {
            let name = |(s, e, obs): (usize, usize, bool)| format!("{} [{s}, {e})", if obs { "observation span" } else { "retracted step" });
            return Err(format!("{} overlaps {}", name(w[1]), name(w[0])));
        }
    }
    let chars: Vec<usize> = masked.iter().flat_map(|&(s, e, _)| [s, e]).collect();
    let bytes = char_to_byte(text, &chars);

    let prompt_seg = prompt_segment(vocab, prompt)?;

    // (segment, mask, is_observation) in order; empty segments dropped.
    let mut segments: Vec<(&str, u8, bool)> = Vec::with_capacity(2 + bytes.len());
    segments.push((&prompt_seg, 0, false));
    let mut at = 0;
    for (pair, &(_, _, is_obs)) in bytes.chunks(2).zip(&masked) {
        let (s, e) = (pair[0], pair[1]);
        if s > at {
            segments.push((&text[at..s], 1, false));
        }
        if e > s {
            segments.push((&text[s..e], 0, is_obs));
        }
        at = e;
    }
    if at < text.len() {
        segments.push((&text[at..], 1, false));
    }

    let mut aligned = true;
    for w in segments.windows(2) {
        if !(vocab.ends_with_special(w[0].0) || vocab.starts_with_special(w[1].0)) {
            aligned = false;
        }
    }

    let mut out = Encoded { aligned, ..Encoded::default() };
    out.ids.extend_from_slice(&vocab.bos);
    out.mask.resize(vocab.bos.len(), 0);
    for (i, (seg, mask, is_obs)) in segments.iter().enumerate() {
        if seg.is_empty() {
            continue;
        }
        let a = out.ids.len() as u32;
        vocab.encode_into(seg, &mut out.ids).map_err(|e| format!("tokenizing: {e:#}"))?;
        out.mask.resize(out.ids.len(), *mask);
        if *is_obs {
            out.observations.push((a, out.ids.len() as u32));
        }
        if i == 0 {
            out.prompt_len = out.ids.len() as u32;
        }
    }
    if let Some(eos) = vocab.eos {
        out.ids.push(eos);
        out.mask.push(1);
    }
    Ok(out)
}

/// The tokenizer's own encoding of the joined sequence (BOS + `prompt "\n" text` + EOS): what
/// [`encode_row`]'s ids are compared with under `--verify-joined`.
pub fn encode_joined(vocab: &Vocab, prompt: &str, text: &str) -> Result<Vec<u32>, String> {
    let joined = format!("{}{text}", prompt_segment(vocab, prompt)?);
    let enc = vocab.tokenizer.encode_fast(joined.as_str(), false).map_err(|e| format!("tokenizing: {e}"))?;
    let mut ids = vocab.bos.clone();
    ids.extend_from_slice(enc.get_ids());
    ids.extend(vocab.eos);
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_offsets_map_to_bytes() {
        let t = "añb€c";
        // chars: a(0) ñ(1) b(2) €(3) c(4); bytes: a0 ñ1-2 b3 €4-6 c7
        assert_eq!(char_to_byte(t, &[0, 1, 2, 3, 4, 5]), vec![0, 1, 3, 4, 7, 8]);
        assert_eq!(char_to_byte("abc", &[1, 3]), vec![1, 3]);
        assert_eq!(char_to_byte(t, &[5, 5]), vec![8, 8]);
    }

    #[test]
    fn span_checks_name_the_problem() {
        assert!(check_spans(&[0, 3], &[2, 5], 5).is_ok());
        assert!(check_spans(&[3], &[2], 5).unwrap_err().contains("end < start"));
        assert!(check_spans(&[3], &[6], 5).unwrap_err().contains("out of range"));
        assert!(check_spans(&[0, 1], &[2, 3], 5).unwrap_err().contains("overlaps"));
        assert!(check_spans(&[-1], &[2], 5).unwrap_err().contains("negative"));
    }
}
