//! Rows that share a prompt, computed once: a micro-batch's rows whose token ids begin with the same
//! conditioning tokens (a suite's instruction, the prompt of a task's G rollouts) are packed as
//! one sequence `prefix | tail 1 | tail 2 | …` with a shared prefix (`Seq::shared_prefix`): every
//! tail attends to the prefix and to itself, at the positions it has in its own row, so the pack
//! computes what each row computes alone and the prefix's forward and backward run once. On a CPU
//! training step the prompt is a third of a math row; G rollouts of one task share theirs whole.
//!
//! A prefix is shared only where every row of the pack has mask 0 on it and on the token after
//! it (a tail's first token starts a segment and has no target), so no target moves.
//!
//! The rows that share no prompt run as one sequence too, each row a segment that sees only
//! itself: one matrix product per weight over all their tokens instead of one per row, so the
//! kernel packs each weight once (on 2 cores, 8 rows of 512 tokens: about 4% faster a step).

use coa_model::TokenStats;

use crate::data::Example;

/// Shorter common prompts are not worth a pack.
pub const MIN_SHARED: usize = 32;

/// One sequence of a step: a row alone, rows packed behind a shared prefix, or rows one after
/// another as independent segments.
#[derive(Debug, Clone, PartialEq)]
pub struct Pack {
    /// Rows (indices into the examples), in step order.
    pub rows: Vec<usize>,
    /// Shared prefix length (0: no prefix; a single row is computed as it is, several rows as
    /// segments that see only themselves).
    pub prefix: usize,
}

impl Pack {
    /// The packed sequence: ids, target mask and segment ids (None for a single row).
    pub fn build(&self, examples: &[Example]) -> (Vec<u32>, Vec<u8>, Option<Vec<i32>>) {
        let first = &examples[self.rows[0]];
        if self.prefix == 0 && self.rows.len() == 1 {
            return (first.input_ids.clone(), first.target_mask(), first.segment_ids.clone());
        }
        let p = self.prefix;
        let len = p + self.rows.iter().map(|&r| examples[r].input_ids.len() - p).sum::<usize>();
        let (mut ids, mut mask, mut seg) = (Vec::with_capacity(len), Vec::with_capacity(len), Vec::with_capacity(len));
        ids.extend_from_slice(&first.input_ids[..p]);
        mask.resize(p, 0);
        seg.resize(p, 0);
        // Segment ids: 0 the prefix (if any), k + 1 row k.
        for (k, &r) in self.rows.iter().enumerate() {
            let ex = &examples[r];
            ids.extend_from_slice(&ex.input_ids[p..]);
            mask.extend_from_slice(&ex.target_mask()[p..]);
            seg.resize(ids.len(), k as i32 + 1);
        }
        (ids, mask, Some(seg))
    }

    /// Where row `k` of the pack starts in the packed sequence (its tokens from `prefix` on).
    pub fn offsets(&self, examples: &[Example]) -> Vec<usize> {
        let mut at = self.prefix;
        self.rows
            .iter()
            .map(|&r| {
                let o = at;
                at += examples[r].input_ids.len() - self.prefix;
                o
            })
            .collect()
    }

    /// Row `k`'s statistics from the pack's (its prefix tokens from the shared prefix, 0 there).
    pub fn row_stats(&self, examples: &[Example], packed: &TokenStats, k: usize, offset: usize) -> TokenStats {
        if self.prefix == 0 && self.rows.len() == 1 {
            return packed.clone();
        }
        let n = examples[self.rows[k]].input_ids.len();
        let p = self.prefix;
        let mut logp = vec![0f32; n];
        let mut entropy = vec![0f32; n];
        logp[p..].copy_from_slice(&packed.logp[offset..offset + n - p]);
        entropy[p..].copy_from_slice(&packed.entropy[offset..offset + n - p]);
        TokenStats { logp, entropy }
    }
}

/// Tokens from the start that have mask 0 and are followed by a mask-0 token: the most a shared
/// prefix may hold for this row.
fn shareable(ex: &Example) -> usize {
    if ex.segment_ids.is_some() {
        return 0;
    }
    let mask = ex.target_mask();
    let first_target = mask.iter().position(|&m| m != 0).unwrap_or(mask.len());
    // the token after the prefix must not be a target, and a tail must stay non-empty
    first_target.saturating_sub(1).min(ex.input_ids.len().saturating_sub(1))
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Groups a micro-batch's rows (in order) into packs: a row joins the first pack whose rows it
/// shares at least [`MIN_SHARED`] shareable tokens with; a pack's prefix is what all its rows
/// share. Rows already packed (segment ids) stay alone. Deterministic in the rows given.
pub fn packs(examples: &[Example], rows: &[usize]) -> Vec<Pack> {
    let mut out: Vec<Pack> = Vec::new();
    for &r in rows {
        let ex = &examples[r];
        let limit = shareable(ex);
        let joined = (limit >= MIN_SHARED)
            .then(|| {
                out.iter_mut().find_map(|p| {
                    let first = &examples[p.rows[0]];
                    let cap = if p.rows.len() == 1 { shareable(first) } else { p.prefix };
                    let shared = common_prefix(&first.input_ids, &ex.input_ids).min(limit).min(cap);
                    (shared >= MIN_SHARED && (p.rows.len() > 1 || first.segment_ids.is_none())).then(|| {
                        p.prefix = shared;
                        p.rows.push(r);
                    })
                })
            })
            .flatten();
        if joined.is_none() {
            out.push(Pack { rows: vec![r], prefix: 0 });
        }
    }
    for p in &mut out {
        if p.rows.len() == 1 {
            p.prefix = 0;
        }
    }
    // The rows left alone (no shared prompt, no segments of their own) run as one sequence of
    // independent segments, in the place of the first: the same result as one by one, with
    // matrix products over all their tokens at once (each weight packed for the kernel once
    // instead of once per row).
    let alone = |p: &Pack| p.prefix == 0 && examples[p.rows[0]].segment_ids.is_none();
    let singles: Vec<usize> = out.iter().filter(|p| alone(p)).map(|p| p.rows[0]).collect();
    if singles.len() > 1 {
        let first = out.iter().position(alone).expect("a single row");
        out.retain(|p| !alone(p));
        out.insert(first, Pack { rows: singles, prefix: 0 });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(ids: &[u32], mask: &[u8]) -> Example {
        Example {
            source: 0,
            row: 0,
            task_id: String::new(),
            input_ids: ids.to_vec(),
            loss_mask: mask.to_vec(),
            segment_ids: None,
            n_targets: mask.iter().filter(|&&m| m == 1).count(),
            rl: None,
        }
    }

    #[test]
    fn rows_with_a_common_prompt_pack_and_others_stay_alone() {
        let prompt: Vec<u32> = (0..40).collect();
        let row = |tail: &[u32], question: u32| {
            let mut ids = prompt.clone();
            ids.push(question);
            ids.extend_from_slice(tail);
            let mut mask = vec![0u8; 41];
            mask.extend(std::iter::repeat_n(1, tail.len()));
            ex(&ids, &mask)
        };
        let other = ex(&(100..150).collect::<Vec<_>>(), &[vec![0u8; 45], vec![1u8; 5]].concat());
        let examples = vec![row(&[7, 8, 9], 50), other, row(&[5, 6], 51), row(&[1], 52)];
        let p = packs(&examples, &[0, 1, 2, 3]);
        assert_eq!(p, vec![Pack { rows: vec![0, 2, 3], prefix: 40 }, Pack { rows: vec![1], prefix: 0 }]);
        let (ids, mask, seg) = p[0].build(&examples);
        assert_eq!(ids.len(), 40 + 4 + 3 + 2);
        assert_eq!(&ids[40..44], &[50, 7, 8, 9]);
        assert_eq!(&mask[40..44], &[0, 1, 1, 1]);
        let seg = seg.unwrap();
        assert_eq!((seg[39], seg[40], seg[44], seg[47]), (0, 1, 2, 3));
        assert_eq!(p[0].offsets(&examples), vec![40, 44, 47]);
    }

    #[test]
    fn rows_without_a_common_prompt_run_as_one_sequence_of_segments() {
        let a = ex(&(0..50).collect::<Vec<_>>(), &[vec![0u8; 10], vec![1u8; 40]].concat());
        let b = ex(&(100..130).collect::<Vec<_>>(), &[vec![0u8; 5], vec![1u8; 25]].concat());
        let mut own = ex(&(200..220).collect::<Vec<_>>(), &[vec![0u8; 5], vec![1u8; 15]].concat());
        own.segment_ids = Some([vec![0; 10], vec![1; 10]].concat());
        let c = ex(&(300..340).collect::<Vec<_>>(), &[vec![0u8; 8], vec![1u8; 32]].concat());
        let examples = vec![own, a, b, c];
        let p = packs(&examples, &[0, 1, 2, 3]);
        // the row with segments of its own stays alone; the others join, in order
        assert_eq!(p, vec![Pack { rows: vec![0], prefix: 0 }, Pack { rows: vec![1, 2, 3], prefix: 0 }]);
        let (ids, mask, seg) = p[1].build(&examples);
        assert_eq!(ids, [&examples[1].input_ids[..], &examples[2].input_ids, &examples[3].input_ids].concat());
        assert_eq!(mask, [examples[1].target_mask(), examples[2].target_mask(), examples[3].target_mask()].concat());
        let seg = seg.unwrap();
        assert_eq!((seg[0], seg[49], seg[50], seg[79], seg[80], seg[119]), (1, 1, 2, 2, 3, 3));
        assert_eq!(p[1].offsets(&examples), vec![0, 50, 80]);
        // each row's statistics are its own slice of the pack's
        let packed = TokenStats { logp: (0..120).map(|i| i as f32).collect(), entropy: vec![0.5; 120] };
        let row = p[1].row_stats(&examples, &packed, 1, 50);
        assert_eq!(row.logp, (50..80).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(row.entropy.len(), 30);
    }

    #[test]
    fn no_target_is_ever_inside_or_right_after_the_prefix() {
        // Identical rows: the prefix stops before the token that precedes the first target.
        let ids: Vec<u32> = (0..60).collect();
        let mask = [vec![0u8; 50], vec![1u8; 10]].concat();
        let examples = vec![ex(&ids, &mask), ex(&ids, &mask)];
        let p = packs(&examples, &[0, 1]);
        assert_eq!(p[0].prefix, 49);
        let (_, m, _) = p[0].build(&examples);
        assert_eq!(m.iter().filter(|&&x| x == 1).count(), 20);
        // A short common prompt is not shared: the rows run as plain segments.
        let short = [vec![0u8; 20], vec![1u8; 40]].concat();
        let examples = vec![ex(&ids, &short), ex(&ids, &short)];
        assert_eq!(packs(&examples, &[0, 1]), vec![Pack { rows: vec![0, 1], prefix: 0 }]);
    }
}
