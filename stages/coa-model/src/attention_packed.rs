//! The attention forward and backward (`ops::attention_forward_prefix`,
//! `ops::attention_backward_prefix`) on a bf16 engine ([`crate::bf16mm`]), with every
//! operand that many products share packed once per call: each key/value head's keys and values,
//! each query head's queries and output gradients. Through [`crate::sgemm`]'s interface every
//! product (one per head and block of 128 queries, four or five of them in the backward) packed
//! its keys or values again, up to 4096 of them for 128 queries: a packed value fed 256 flops,
//! and the packing took about a fifth of a multihop SFT step.
//!
//! The same arithmetic as the per-product path (operands rounded to bf16, f32 sums, the same
//! softmax), but not its bits: a block's key columns start at a multiple of 32 (the panels'
//! grain), so the depth pairs of P·V and dS·K fall differently.

use rayon::prelude::*;

use crate::bf16mm::{gemm_prepacked, round_to_bf16, AElem, Engine, Panels};
use crate::attention_rows::{ds_row, head_major, key_span, row_span, softmax_row, window_cut, AttentionShape, Qkv, QkvGrads, ATT_BLOCK};
use crate::par::SendPtr;

/// Where a product may start inside packed panels (their columns and depths).
const GRAIN: usize = 32;

thread_local! {
    /// The calling thread's packed heads, kept between calls (a fresh allocation per layer cost
    /// page faults).
    static HEADS: std::cell::RefCell<Vec<Panels>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The backward's kept P and scale·dS as bf16 bits (pass 1 writes them, pass 2 reads them).
    static KEPT_BF16: std::cell::RefCell<(Vec<u16>, Vec<u16>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `f` over `n` packed-operand buffers of this thread, packed in parallel by `pack(index, buffer)`.
fn with_heads<R>(n: usize, pack: impl Fn(usize, &mut Panels) + Sync, f: impl FnOnce(&[Panels]) -> R) -> R {
    let mut heads = HEADS.take();
    if heads.len() < n {
        heads.resize_with(n, Panels::default);
    }
    heads[..n].par_iter_mut().enumerate().for_each(|(x, p)| pack(x, p));
    let r = f(&heads[..n]);
    HEADS.set(heads);
    r
}

/// A block of `nb` queries ending before `i1`, and its score columns: the shared prefix's keys
/// `[0, np)` in columns `[0, np)` (padded to `npa`), then the keys from `k0a` (the block's first
/// key `k0` rounded down to the grain) in columns `npa..`; `w` columns in all, a multiple of the
/// grain. Columns of keys a row does not see hold 0 once its softmax ran.
struct BlockCols {
    np: usize,
    npa: usize,
    k0: usize,
    k0a: usize,
    w: usize,
    nb: usize,
    i1: usize,
}

impl BlockCols {
    fn new(seg_start: &[usize], prefix: usize, i0: usize, i1: usize) -> BlockCols {
        let (np, k0) = key_span(seg_start, prefix, i0);
        let (npa, k0a) = (np.next_multiple_of(GRAIN), k0 / GRAIN * GRAIN);
        BlockCols { np, npa, k0, k0a, w: npa + (i1 - k0a).next_multiple_of(GRAIN), nb: i1 - i0, i1 }
    }

    /// Query i's columns: `[a0, a)` (the shared prefix) and `[lo, hi)` (its segment up to itself),
    /// [`row_span`]'s in this layout.
    fn row(&self, seg_start: &[usize], prefix: usize, window: usize, i: usize) -> (usize, usize, usize, usize) {
        let (a0, a, lo, hi) = row_span(seg_start, prefix, window, self.np, self.k0, i);
        // A block with prefix tokens among its run has k0 = k0a = 0: no shift for its [0, a).
        let shift = self.npa - self.np + self.k0 - self.k0a;
        (a0, a, lo + shift, hi + shift)
    }

    /// The column of key `j` of the block's run (`j >= k0a`).
    fn own(&self, j: usize) -> usize {
        self.npa + j - self.k0a
    }
}

/// `s[nb, w] = X[i0.., head] · Yᵀ` for the block's columns, unscaled: X's rows `x` (`ld` apart),
/// Y a head packed as Yᵀ (depth hd, a column per token).
///
/// # Safety
/// `engine` is one this CPU has ([`crate::bf16mm::engine`]); `x` addresses nb rows of hd; `s`
/// holds nb·w.
unsafe fn block_scores(engine: Engine, s: &mut [f32], x: *const f32, ld: usize, y: &Panels, cols: &BlockCols, hd: usize) {
    let BlockCols { nb, i1, .. } = *cols;
    if cols.np > 0 {
        gemm_prepacked(engine, nb, 1.0, x, ld, 1, y, 0..hd, 0..cols.np, false, s.as_mut_ptr(), cols.w);
    }
    gemm_prepacked(engine, nb, 1.0, x, ld, 1, y, 0..hd, cols.k0a..i1, false, s.as_mut_ptr().add(cols.npa), cols.w);
}

/// `out[nb, hd] += alpha · p[nb, w] · Y` over the block's columns: Y a head packed by token
/// (depth: tokens, a column per dimension); `out` rows `ld` apart; `p` in f32 or bf16 bits
/// (alpha 1, [`AElem`]).
///
/// # Safety
/// `engine` is one this CPU has ([`crate::bf16mm::engine`]); `out` addresses nb rows of hd,
/// written by this caller alone; `p` holds nb·w.
#[allow(clippy::too_many_arguments)]
unsafe fn block_times<T: AElem>(engine: Engine, out: *mut f32, ld: usize, alpha: f32, p: &[T], y: &Panels, cols: &BlockCols, hd: usize) {
    let BlockCols { nb, i1, .. } = *cols;
    gemm_prepacked(engine, nb, alpha, p.as_ptr().add(cols.npa), cols.w, 1, y, cols.k0a..i1, 0..hd, true, out, ld);
    if cols.np > 0 {
        gemm_prepacked(engine, nb, alpha, p.as_ptr(), cols.w, 1, y, 0..cols.np, 0..hd, true, out, ld);
    }
}

/// `ops::attention_forward_prefix` on `engine`.
pub(crate) fn forward(engine: Engine, out: &mut [f32], lse: &mut [f32], x: Qkv, shape: &AttentionShape) {
    let AttentionShape { seg_start, prefix, window, n_heads, n_kv_heads, head_dim: hd } = *shape;
    let Qkv { q, k, v } = x;
    let t_len = seg_start.len();
    let (qw, kw) = (n_heads * hd, n_kv_heads * hd);
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let n_blocks = t_len.div_ceil(ATT_BLOCK);
    // Head g's keys as Kᵀ (2g) and its values by token (2g + 1).
    let pack = |x: usize, p: &mut Panels| {
        let at = (x / 2) * hd;
        // SAFETY: head x / 2 of k / v: t_len rows of hd, kw apart.
        unsafe {
            if x.is_multiple_of(2) {
                p.pack(k.as_ptr().add(at), hd, t_len, 1, kw)
            } else {
                p.pack(v.as_ptr().add(at), t_len, hd, kw, 1)
            }
        }
    };
    out.fill(0.0);
    let outp = SendPtr(out.as_mut_ptr());
    let lsep = SendPtr(lse.as_mut_ptr());
    with_heads(2 * n_kv_heads, pack, |heads| {
        (0..n_heads * n_blocks).into_par_iter().for_each_init(Vec::new, |s, task| {
            let (outp, lsep) = (outp, lsep);
            let (h, blk) = (task / n_blocks, task % n_blocks);
            let g = h / group;
            let i0 = blk * ATT_BLOCK;
            let i1 = (i0 + ATT_BLOCK).min(t_len);
            let nb = i1 - i0;
            let cols = BlockCols::new(seg_start, prefix, i0, i1);
            s.resize(nb * cols.w, 0.0);
            // SAFETY: rows i0..i1 of head h of q.
            unsafe { block_scores(engine, s, q.as_ptr().add(i0 * qw + h * hd), qw, &heads[2 * g], &cols, hd) };
            for r in 0..nb {
                let i = i0 + r;
                let l = softmax_row(&mut s[r * cols.w..(r + 1) * cols.w], cols.row(seg_start, prefix, window, i), scale);
                // SAFETY: (i, h) is written by this task only.
                unsafe { *lsep.0.add(i * n_heads + h) = l };
            }
            // SAFETY: rows i0..i1, head h of out belong to this task alone (zeroed above).
            unsafe { block_times(engine, outp.0.add(i0 * qw + h * hd), qw, 1.0, s, &heads[2 * g + 1], &cols, hd) };
        });
    });
}

/// What the attention backward reads per query row besides Q: the output gradient
/// `dout[T, Hq*hd]`, the forward's `lse[T, Hq]` and `delta[T, Hq]` (dout·out per head).
#[derive(Clone, Copy)]
pub(crate) struct QueryRows<'a> {
    pub(crate) dout: &'a [f32],
    pub(crate) lse: &'a [f32],
    pub(crate) delta: &'a [f32],
}

/// `ops::attention_backward_keep` on `engine`, given `rows` and `seg_end` (the end of
/// the queries that see each key).
pub(crate) fn backward(engine: Engine, grads: QkvGrads, x: Qkv, rows: QueryRows, shape: &AttentionShape, seg_end: &[usize], keep_limit: usize) {
    let AttentionShape { seg_start, prefix, window, n_heads, n_kv_heads, head_dim: hd } = *shape;
    let (Qkv { q, k, v }, QkvGrads { dq, dk, dv }, QueryRows { dout, lse, delta }) = (x, grads, rows);
    let t_len = seg_start.len();
    let (qw, kw) = (n_heads * hd, n_kv_heads * hd);
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let n_blocks = t_len.div_ceil(ATT_BLOCK);
    let block = |blk: usize| {
        let i0 = blk * ATT_BLOCK;
        let i1 = (i0 + ATT_BLOCK).min(t_len);
        (i0, i1, BlockCols::new(seg_start, prefix, i0, i1))
    };
    // Where task (h, query block) keeps its P and dS [nb, w], if all of them fit (the limit
    // counts f32 values; they are kept as bf16, the values pass 2's products round them to).
    let mut offsets = Vec::with_capacity(n_heads * n_blocks + 1);
    offsets.push(0usize);
    for _ in 0..n_heads {
        for blk in 0..n_blocks {
            let (i0, i1, cols) = block(blk);
            offsets.push(offsets.last().unwrap() + (i1 - i0) * cols.w);
        }
    }
    let kept_len = *offsets.last().unwrap();
    let keep = 2 * kept_len <= keep_limit;
    // Packed heads: per kv head g, keys as Kᵀ (3g), values as Vᵀ (3g + 1), keys by token
    // (3g + 2); then per query head h, queries and output gradients by token, and without
    // keeping, also as Qᵀ and dOᵀ (the recomputing pass's scores).
    let per_q = if keep { 2 } else { 4 };
    let kv_at = |g: usize| 3 * g;
    let q_at = |h: usize| 3 * n_kv_heads + per_q * h;
    let pack = |x: usize, p: &mut Panels| {
        // SAFETY: one head of k, v, q or dout: t_len rows of hd, kw or qw apart.
        unsafe {
            if x < 3 * n_kv_heads {
                let at = (x / 3) * hd;
                match x % 3 {
                    0 => p.pack(k.as_ptr().add(at), hd, t_len, 1, kw),
                    1 => p.pack(v.as_ptr().add(at), hd, t_len, 1, kw),
                    _ => p.pack(k.as_ptr().add(at), t_len, hd, kw, 1),
                }
            } else {
                let y = x - 3 * n_kv_heads;
                let at = (y / per_q) * hd;
                match y % per_q {
                    0 => p.pack(q.as_ptr().add(at), t_len, hd, qw, 1),
                    1 => p.pack(dout.as_ptr().add(at), t_len, hd, qw, 1),
                    2 => p.pack(q.as_ptr().add(at), hd, t_len, 1, qw),
                    _ => p.pack(dout.as_ptr().add(at), hd, t_len, 1, qw),
                }
            }
        }
    };
    // lse and delta head-major [Hq, T], for a recomputing pass 2's column-wise use.
    let (lse_hm, delta_hm) = if keep { (Vec::new(), Vec::new()) } else { head_major(lse, delta, t_len, n_heads) };
    let (lse_hm, delta_hm) = (&lse_hm, &delta_hm);
    let (mut kept, mut kept_ds) = KEPT_BF16.take();
    if keep && kept.len() < kept_len {
        kept.resize(kept_len, 0);
        kept_ds.resize(kept_len, 0);
    }
    let (keptp, kept_dsp) = (SendPtr(kept.as_mut_ptr()), SendPtr(kept_ds.as_mut_ptr()));
    let (dqp, dkp, dvp) = (SendPtr(dq.as_mut_ptr()), SendPtr(dk.as_mut_ptr()), SendPtr(dv.as_mut_ptr()));
    let offsets = &offsets;
    with_heads(3 * n_kv_heads + per_q * n_heads, pack, |heads| {
        // Pass 1: P, dS and dq, per (query head, query block).
        (0..n_heads * n_blocks).into_par_iter().for_each_init(
            || (Vec::new(), Vec::new()),
            |(s, dp): &mut (Vec<f32>, Vec<f32>), task| {
                let (dqp, keptp, kept_dsp) = (dqp, keptp, kept_dsp);
                let (h, blk) = (task / n_blocks, task % n_blocks);
                let g = h / group;
                let (i0, i1, cols) = block(blk);
                let nb = i1 - i0;
                s.resize(nb * cols.w, 0.0);
                dp.resize(nb * cols.w, 0.0);
                // SAFETY: [offsets[task], offsets[task + 1]) (= nb·w values) of kept and kept_ds
                // belong to this task alone.
                let (kept_p, kept_s) = if keep {
                    unsafe {
                        (
                            std::slice::from_raw_parts_mut(keptp.0.add(offsets[task]), nb * cols.w),
                            std::slice::from_raw_parts_mut(kept_dsp.0.add(offsets[task]), nb * cols.w),
                        )
                    }
                } else {
                    (&mut [][..], &mut [][..])
                };
                // S = Q·Kᵀ, dP = dO·Vᵀ   [nb, w]
                // SAFETY: rows i0..i1 of head h of q and dout.
                unsafe {
                    block_scores(engine, s, q.as_ptr().add(i0 * qw + h * hd), qw, &heads[kv_at(g)], &cols, hd);
                    block_scores(engine, dp, dout.as_ptr().add(i0 * qw + h * hd), qw, &heads[kv_at(g) + 1], &cols, hd);
                }
                for r in 0..nb {
                    let i = i0 + r;
                    let (l, d) = (lse[i * n_heads + h], delta[i * n_heads + h]);
                    let (pr, dsr) = (&mut s[r * cols.w..(r + 1) * cols.w], &mut dp[r * cols.w..(r + 1) * cols.w]);
                    ds_row(pr, dsr, cols.row(seg_start, prefix, window, i), scale, l, d, keep);
                    if keep {
                        // Rounded as the products round them, while the row is in L1.
                        let row = r * cols.w..(r + 1) * cols.w;
                        round_to_bf16(engine, &mut kept_p[row.clone()], pr, 1.0);
                        round_to_bf16(engine, &mut kept_s[row], dsr, scale);
                    }
                }
                // dQ[i0..i1, h] += scale · dS · K
                // SAFETY: rows i0..i1, head h of dq belong to this task alone.
                unsafe {
                    let dqh = dqp.0.add(i0 * qw + h * hd);
                    if keep {
                        block_times(engine, dqh, qw, 1.0, kept_s, &heads[kv_at(g) + 2], &cols, hd)
                    } else {
                        block_times(engine, dqh, qw, scale, dp, &heads[kv_at(g) + 2], &cols, hd)
                    }
                };
            },
        );

        if keep {
            // Pass 2 from the kept P and dS: task (g, key block [j0, j1)), for every query head of
            // the group and every query block that may see these keys: dV += Pᵀ·dO and
            // dK += scale·dSᵀ·Q over the keys' columns of that block.
            (0..n_kv_heads * n_blocks).into_par_iter().for_each(|task| {
                let (dkp, dvp) = (dkp, dvp);
                let (g, kb) = (task / n_blocks, task % n_blocks);
                let j0 = kb * ATT_BLOCK;
                let j1 = (j0 + ATT_BLOCK).min(t_len);
                let e = seg_end[j0..j1].iter().copied().max().unwrap_or(j1);
                for h in g * group..(g + 1) * group {
                    let (qh, doh) = (&heads[q_at(h)], &heads[q_at(h) + 1]);
                    for qb in kb..e.div_ceil(ATT_BLOCK) {
                        let (i0, i1, cols) = block(qb);
                        let off = offsets[h * n_blocks + qb];
                        // (first key, end key, first column) of the runs of [j0, j1) in this block
                        let prefix_run = (j0, j1.min(cols.np), j0);
                        let ja = j0.max(cols.k0);
                        let own_run = (ja, j1.min(i1), cols.own(ja));
                        for (ja, jb, col) in [prefix_run, own_run] {
                            if ja >= jb {
                                continue;
                            }
                            // SAFETY: the block's kept rows are [off, off + nb·w), columns
                            // col..col + (jb − ja) ≤ w; rows ja..jb, kv head g of dk / dv belong
                            // to this task alone.
                            unsafe {
                                let (pa, dsa) = (kept.as_ptr().add(off + col), kept_ds.as_ptr().add(off + col));
                                let (dvh, dkh) = (dvp.0.add(ja * kw + g * hd), dkp.0.add(ja * kw + g * hd));
                                gemm_prepacked(engine, jb - ja, 1.0, pa, 1, cols.w, doh, i0..i1, 0..hd, true, dvh, kw);
                                // scale·dS was rounded so in pass 1
                                gemm_prepacked(engine, jb - ja, 1.0, dsa, 1, cols.w, qh, i0..i1, 0..hd, true, dkh, kw);
                            }
                        }
                    }
                }
            });
            return;
        }

        // Pass 2 recomputing P and dS: task (g, key block [j0, j1)) against queries
        // [j0, seg_end[j1 − 1]), over every query head of the group, keys as rows.
        (0..n_kv_heads * n_blocks).into_par_iter().for_each_init(
            || (Vec::new(), Vec::new()),
            |(s, dp), task| {
                let (dkp, dvp) = (dkp, dvp);
                let (g, blk) = (task / n_blocks, task % n_blocks);
                let j0 = blk * ATT_BLOCK;
                let j1 = (j0 + ATT_BLOCK).min(t_len);
                let e = seg_end[j0..j1].iter().copied().max().unwrap_or(j1);
                let (nb, nq) = (j1 - j0, e - j0);
                s.resize(nb * nq, 0.0);
                dp.resize(nb * nq, 0.0);
                for h in g * group..(g + 1) * group {
                    let at = q_at(h);
                    // SAFETY: rows j0..j1 of kv head g of k and v.
                    unsafe {
                        // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ   [nb, nq]
                        gemm_prepacked(engine, nb, 1.0, k.as_ptr().add(j0 * kw + g * hd), kw, 1, &heads[at + 2], 0..hd, j0..e, false, s.as_mut_ptr(), nq);
                        gemm_prepacked(engine, nb, 1.0, v.as_ptr().add(j0 * kw + g * hd), kw, 1, &heads[at + 3], 0..hd, j0..e, false, dp.as_mut_ptr(), nq);
                    }
                    for r in 0..nb {
                        let j = j0 + r;
                        // valid queries: j <= i < seg_end[j]
                        let (lo, hi) = (j - j0, seg_end[j] - j0);
                        let pr = &mut s[r * nq..(r + 1) * nq];
                        let dsr = &mut dp[r * nq..(r + 1) * nq];
                        let (c0, c1) = (h * t_len + j0 + lo, h * t_len + j0 + hi);
                        crate::simd::attn_ds_row_cols(&mut pr[lo..hi], &mut dsr[lo..hi], scale, &lse_hm[c0..c1], &delta_hm[c0..c1]);
                        pr[..lo].iter_mut().for_each(|x| *x = 0.0);
                        pr[hi..].iter_mut().for_each(|x| *x = 0.0);
                        dsr[..lo].iter_mut().for_each(|x| *x = 0.0);
                        dsr[hi..].iter_mut().for_each(|x| *x = 0.0);
                        window_cut(pr, dsr, shape, j, j0, lo..hi);
                    }
                    // dV[j0..j1, g] += Pᵀ · dO[j0..e, h];  dK[j0..j1, g] += scale · dSᵀ · Q[j0..e, h]
                    // SAFETY: rows j0..j1, kv head g of dk / dv belong to this task alone.
                    unsafe {
                        gemm_prepacked(engine, nb, 1.0, s.as_ptr(), nq, 1, &heads[at + 1], j0..e, 0..hd, true, dvp.0.add(j0 * kw + g * hd), kw);
                        gemm_prepacked(engine, nb, scale, dp.as_ptr(), nq, 1, &heads[at], j0..e, 0..hd, true, dkp.0.add(j0 * kw + g * hd), kw);
                    }
                }
            },
        );
    });
    KEPT_BF16.set((kept, kept_ds));
}
