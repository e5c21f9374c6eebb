//! Length policy (`--max-len`, `--overlong`) and greedy packing (`--pack`).

use std::collections::VecDeque;

use crate::encode::Encoded;

/// What to do with a row longer than `--max-len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Overlong {
    /// Drop the row and count it (`dropped_overlong`).
    Drop,
    /// Cut the row at the last token boundary `<= max-len` that is not inside an observation
    /// (an observation is kept whole or not at all); the cut row has no EOS. A row whose cut would
    /// leave no target is dropped and counted.
    Truncate,
}

/// The outcome of the length policy for one row.
#[derive(Debug, PartialEq, Eq)]
pub enum Fate {
    Keep(Encoded),
    Truncated(Encoded),
    Dropped,
}

/// The cut point for truncating `enc` to at most `max_len` tokens: `max_len`, moved back to the
/// start of the observation it would fall inside.
pub fn cut_point(enc: &Encoded, max_len: usize) -> usize {
    let k = max_len.min(enc.len());
    for &(a, b) in &enc.observations {
        let (a, b) = (a as usize, b as usize);
        if a < k && k < b {
            return a;
        }
    }
    k
}

/// Applies the length policy to one row.
pub fn apply_max_len(mut enc: Encoded, max_len: Option<usize>, policy: Overlong) -> Fate {
    let Some(max_len) = max_len else { return Fate::Keep(enc) };
    if enc.len() <= max_len {
        return Fate::Keep(enc);
    }
    match policy {
        Overlong::Drop => Fate::Dropped,
        Overlong::Truncate => {
            let k = cut_point(&enc, max_len);
            if k <= enc.prompt_len as usize || !enc.mask[..k].contains(&1) {
                return Fate::Dropped;
            }
            enc.ids.truncate(k);
            enc.mask.truncate(k);
            enc.observations.retain(|&(_, b)| b as usize <= k);
            Fate::Truncated(enc)
        }
    }
}

/// One output row: a single sequence, or several packed (with their segment ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutRow {
    /// Task id of the (first) sequence.
    pub task_id: String,
    pub ids: Vec<u32>,
    pub mask: Vec<u8>,
    /// Per token: index of its sequence within the packed row; `None` when not packed.
    pub segment_ids: Option<Vec<i32>>,
}

impl OutRow {
    pub fn single(task_id: String, enc: Encoded) -> OutRow {
        OutRow { task_id, ids: enc.ids, mask: enc.mask, segment_ids: None }
    }
}

/// Greedy first-fit packing into rows of at most `max_len` tokens, streaming: a sequence goes
/// into the first open row with room for it, else opens a new row; with more than `window` open
/// rows the oldest is emitted. Deterministic (input order only). Sequences are never split.
pub struct Packer {
    max_len: usize,
    window: usize,
    open: VecDeque<(OutRow, usize)>,
    /// Rows emitted and tokens in them, for the fill ratio.
    pub rows: u64,
    pub tokens: u64,
}

impl Packer {
    pub fn new(max_len: usize, window: usize) -> Packer {
        Packer { max_len, window: window.max(1), open: VecDeque::new(), rows: 0, tokens: 0 }
    }

    /// Adds a sequence (`enc.len() <= max_len`); returns the rows that closed.
    pub fn push(&mut self, task_id: &str, enc: Encoded, out: &mut Vec<OutRow>) {
        debug_assert!(enc.len() <= self.max_len);
        let n = enc.len();
        if let Some((row, count)) = self.open.iter_mut().find(|(r, _)| r.ids.len() + n <= self.max_len) {
            let seg = *count as i32;
            row.ids.extend_from_slice(&enc.ids);
            row.mask.extend_from_slice(&enc.mask);
            if let Some(s) = row.segment_ids.as_mut() {
                s.resize(s.len() + n, seg);
            }
            *count += 1;
            return;
        }
        let row = OutRow { task_id: task_id.to_string(), segment_ids: Some(vec![0; n]), ids: enc.ids, mask: enc.mask };
        self.open.push_back((row, 1));
        while self.open.len() > self.window {
            let (row, _) = self.open.pop_front().expect("non-empty");
            self.emit(row, out);
        }
    }

    /// Emits every open row, oldest first.
    pub fn finish(&mut self, out: &mut Vec<OutRow>) {
        while let Some((row, _)) = self.open.pop_front() {
            self.emit(row, out);
        }
    }

    fn emit(&mut self, row: OutRow, out: &mut Vec<OutRow>) {
        self.rows += 1;
        self.tokens += row.ids.len() as u64;
        out.push(row);
    }

    /// Mean fraction of `max_len` the emitted rows fill.
    pub fn fill(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.tokens as f64 / (self.rows as f64 * self.max_len as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(n: usize, prompt: u32, obs: &[(u32, u32)]) -> Encoded {
        let mut mask = vec![1u8; n];
        mask[..prompt as usize].fill(0);
        for &(a, b) in obs {
            mask[a as usize..b as usize].fill(0);
        }
        Encoded { ids: (0..n as u32).collect(), mask, observations: obs.to_vec(), prompt_len: prompt, aligned: true }
    }

    #[test]
    fn truncation_never_cuts_inside_an_observation() {
        let e = enc(20, 3, &[(5, 10), (12, 15)]);
        assert_eq!(cut_point(&e, 7), 5);
        assert_eq!(cut_point(&e, 10), 10);
        assert_eq!(cut_point(&e, 11), 11);
        assert_eq!(cut_point(&e, 14), 12);
        match apply_max_len(e.clone(), Some(14), Overlong::Truncate) {
            Fate::Truncated(t) => {
                assert_eq!(t.ids, (0..12).collect::<Vec<u32>>());
                assert_eq!(t.observations, vec![(5, 10)]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(apply_max_len(e.clone(), Some(14), Overlong::Drop), Fate::Dropped);
        assert_eq!(apply_max_len(e.clone(), Some(20), Overlong::Drop), Fate::Keep(e.clone()));
        // A cut inside the prompt leaves no target: dropped.
        assert_eq!(apply_max_len(e.clone(), Some(3), Overlong::Truncate), Fate::Dropped);
        // A cut that moves back to an observation right after the prompt: no target, dropped.
        let f = enc(20, 3, &[(3, 10)]);
        assert_eq!(apply_max_len(f, Some(8), Overlong::Truncate), Fate::Dropped);
    }

    #[test]
    fn first_fit_packing_with_segment_ids() {
        let mut p = Packer::new(10, 2);
        let mut out = Vec::new();
        p.push("a", enc(6, 1, &[]), &mut out);
        p.push("b", enc(5, 1, &[]), &mut out); // does not fit with a: opens a second row
        p.push("c", enc(4, 1, &[]), &mut out); // fits after a
        assert!(out.is_empty());
        p.push("d", enc(9, 1, &[]), &mut out); // third open row: the oldest (a+c) is emitted
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].task_id, "a");
        assert_eq!(out[0].ids.len(), 10);
        assert_eq!(out[0].segment_ids.as_deref(), Some(&[0, 0, 0, 0, 0, 0, 1, 1, 1, 1][..]));
        p.finish(&mut out);
        let ids: Vec<&str> = out.iter().map(|r| r.task_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "d"]);
        assert_eq!(p.rows, 3);
        assert_eq!(p.tokens, 24);
    }
}
