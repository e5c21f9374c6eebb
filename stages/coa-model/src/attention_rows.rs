//! What both attention paths share (the per-product one in `ops` and the packed one in
//! `attention_packed`): the call's shape and tensors, the query blocks, and per query row the keys
//! it sees, its softmax and its score gradients.

/// Query / key rows per attention task. Each task packs its keys and values for the kernel, so
/// larger blocks pack them fewer times: 128 trained 2-5% faster than 64 (same loss bits at 6
/// digits) on rows of 512 and of up to 4096 tokens, and the score block of a 4096-token row
/// (128 × 4096 floats, 2 MB) still fits a core's L2.
pub(crate) const ATT_BLOCK: usize = 128;

/// The shape of one attention call, which every attention function takes next to its tensors:
/// which keys each token sees and how its heads are laid out.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape<'a> {
    /// The first token of each token's segment (`seg_start[T]`: its length is the sequence's).
    pub seg_start: &'a [usize],
    /// Tokens `[0, prefix)` are a shared prefix that every later segment sees too (0: none).
    pub prefix: usize,
    /// Sliding window: a query sees keys fewer than `window` positions back (0: no window).
    pub window: usize,
    /// Query heads (Hq).
    pub n_heads: usize,
    /// Key/value heads (Hk, a divisor of Hq).
    pub n_kv_heads: usize,
    /// Values per head (hd).
    pub head_dim: usize,
}

impl<'a> AttentionShape<'a> {
    /// Plain causal attention within segments: no shared prefix, no sliding window.
    pub fn segments(seg_start: &'a [usize], n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        AttentionShape { seg_start, prefix: 0, window: 0, n_heads, n_kv_heads, head_dim }
    }
}

/// The attention's inputs: `q[T, Hq*hd]`, `k[T, Hk*hd]`, `v[T, Hk*hd]` (q, k already rotated).
#[derive(Clone, Copy)]
pub struct Qkv<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
}

/// Gradients of [`Qkv`], which the attention backward adds to: `dq[T, Hq*hd]`, `dk[T, Hk*hd]`,
/// `dv[T, Hk*hd]`.
pub struct QkvGrads<'a> {
    pub dq: &'a mut [f32],
    pub dk: &'a mut [f32],
    pub dv: &'a mut [f32],
}

/// The keys a block of queries starting at `i0` reads: the shared prefix `[0, np)` (np = the
/// prefix length when the block lies past it, else 0) and the run `[k0, i1)`.
#[inline]
pub(crate) fn key_span(seg_start: &[usize], prefix: usize, i0: usize) -> (usize, usize) {
    let k0 = seg_start[i0];
    let np = if prefix > 0 && k0 >= prefix { prefix } else { 0 };
    (np, k0)
}

/// Position of token i (its RoPE position): its offset in its segment, after the shared prefix
/// for a token of a later segment. A sliding window compares these.
#[inline]
pub(crate) fn position_of(seg_start: &[usize], prefix: usize, i: usize) -> usize {
    let s = seg_start[i];
    i - s + if prefix > 0 && s >= prefix { prefix } else { 0 }
}

/// Whether query i sees key j under a sliding window of `window` (0: no window): their
/// positions differ by less than the window (transformers' `q_idx - kv_idx < sliding_window`).
/// Only asked of pairs the segments already allow.
#[inline]
pub(crate) fn in_window(seg_start: &[usize], prefix: usize, window: usize, i: usize, j: usize) -> bool {
    window == 0 || position_of(seg_start, prefix, i) - position_of(seg_start, prefix, j) < window
}

/// The columns query i sees in its block's score row (columns: `[0, np)` the prefix keys, then
/// keys from k0): `[a0, a)` (the shared prefix) and `[lo, hi)` (its own segment up to itself).
/// A block that holds prefix tokens (np = 0, k0 = 0) has the prefix keys among its run. A
/// sliding window (`window` > 0) moves `a0` and `lo` up to the first key it still sees.
#[inline]
pub(crate) fn row_span(seg_start: &[usize], prefix: usize, window: usize, np: usize, k0: usize, i: usize) -> (usize, usize, usize, usize) {
    let a = if np > 0 {
        np
    } else if prefix > 0 && seg_start[i] >= prefix {
        prefix - k0
    } else {
        0
    };
    let (mut lo, hi) = (np + seg_start[i] - k0, np + i - k0 + 1);
    let mut a0 = 0;
    if window > 0 {
        lo = lo.max(hi.saturating_sub(window));
        // prefix key j sits in column j; seen while position(i) - j < window
        a0 = (position_of(seg_start, prefix, i) + 1).saturating_sub(window).min(a);
    }
    (a0, a, lo, hi)
}

/// Softmax of one query's score row in place over its visible columns `[a0, a)` (the shared
/// prefix) and `[lo, hi)` (its segment up to itself), the rest set to 0; returns the log-sum-exp
/// of the scaled scores. One place for both attention paths.
pub(crate) fn softmax_row(row: &mut [f32], (a0, a, lo, hi): (usize, usize, usize, usize), scale: f32) -> f32 {
    row[..a0].iter_mut().for_each(|x| *x = 0.0);
    row[a..lo].iter_mut().for_each(|x| *x = 0.0);
    row[hi..].iter_mut().for_each(|x| *x = 0.0);
    let (pre, rest) = row.split_at_mut(a);
    let pre = &mut pre[a0..];
    let valid = &mut rest[lo - a..hi - a];
    let mx = crate::simd::max(pre).max(crate::simd::max(valid)) * scale;
    let sum = crate::simd::exp_affine_sum(pre, scale, mx) + crate::simd::exp_affine_sum(valid, scale, mx);
    crate::simd::scale(pre, 1.0 / sum);
    crate::simd::scale(valid, 1.0 / sum);
    mx + sum.ln()
}

/// One query's probabilities `pr` (from its scores) and score gradients `dsr` (from dP) over its
/// visible columns ([`softmax_row`]'s), given its lse `l` and `delta` = dout·out; dS is 0
/// elsewhere, and so is P when `zero_p` (a second pass that reads whole columns).
#[allow(clippy::too_many_arguments)]
pub(crate) fn ds_row(pr: &mut [f32], dsr: &mut [f32], (a0, a, lo, hi): (usize, usize, usize, usize), scale: f32, l: f32, delta: f32, zero_p: bool) {
    crate::simd::attn_ds_row(&mut pr[a0..a], &mut dsr[a0..a], scale, l, delta);
    crate::simd::attn_ds_row(&mut pr[lo..hi], &mut dsr[lo..hi], scale, l, delta);
    dsr[..a0].iter_mut().for_each(|x| *x = 0.0);
    dsr[a..lo].iter_mut().for_each(|x| *x = 0.0);
    dsr[hi..].iter_mut().for_each(|x| *x = 0.0);
    if zero_p {
        pr[..a0].iter_mut().for_each(|x| *x = 0.0);
        pr[a..lo].iter_mut().for_each(|x| *x = 0.0);
        pr[hi..].iter_mut().for_each(|x| *x = 0.0);
    }
}

/// A recomputing second pass's row of key j (query `i_first + c` in column c, `cols` the
/// queries its segments allow): zeroes P and dS of the queries a sliding window hides from j.
/// Elementwise, since with a shared prefix those queries are not one run.
pub(crate) fn window_cut(pr: &mut [f32], dsr: &mut [f32], shape: &AttentionShape, j: usize, i_first: usize, cols: std::ops::Range<usize>) {
    let AttentionShape { seg_start, prefix, window, .. } = *shape;
    if window == 0 {
        return;
    }
    for c in cols {
        if !in_window(seg_start, prefix, window, i_first + c, j) {
            pr[c] = 0.0;
            dsr[c] = 0.0;
        }
    }
}

/// `lse` and `delta` `[T, Hq]` as head-major copies `[Hq, T]` (a recomputing second pass reads
/// them by column).
pub(crate) fn head_major(lse: &[f32], delta: &[f32], t_len: usize, n_heads: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut lse_hm, mut delta_hm) = (vec![0f32; t_len * n_heads], vec![0f32; t_len * n_heads]);
    for i in 0..t_len {
        for h in 0..n_heads {
            lse_hm[h * t_len + i] = lse[i * n_heads + h];
            delta_hm[h * t_len + i] = delta[i * n_heads + h];
        }
    }
    (lse_hm, delta_hm)
}
