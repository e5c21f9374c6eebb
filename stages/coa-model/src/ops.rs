//! The CPU reference ops, forward and backward, as plain functions over f32 slices.
//!
//! Conventions (llm.c style): every tensor is a row-major slice, its shape written next to the
//! argument; T = tokens, D = hidden size, V = vocab, I = intermediate size, Hq / Hk = query /
//! key-value heads, hd = head dim. Backward functions ACCUMULATE (`+=`) into weight gradients and
//! into input gradients unless the doc says "written"; callers zero buffers once.
//!
//! Every op is deterministic: parallel work is split into fixed-size chunks (independent of the
//! thread count) and partial sums are reduced in chunk order, so a result is bit-identical
//! whatever the number of rayon threads.

// `let p = p;` inside closures makes them capture the Send pointer wrappers whole.
#![allow(clippy::redundant_locals)]

use rayon::prelude::*;

use crate::MatmulDtype;

use crate::attention_rows::{ds_row, head_major, key_span, row_span, softmax_row, window_cut, ATT_BLOCK};
pub use crate::attention_rows::{AttentionShape, Qkv, QkvGrads};
pub(crate) use crate::par::SendPtr;
use crate::sgemm::sgemm_as;

/// Rows per parallel task for row-wise ops (fixed: results do not depend on the thread count).
const ROW_CHUNK: usize = 16;

// ---------------------------------------------------------------------------------------------
// matmul

/// The register kernel [`gemm`] runs on this CPU: `"avx512"` (12×32 tiles), `"avx2"` (6×16) or
/// `"portable"` (the `matrixmultiply` crate). `COA_CPU_KERNEL=avx2` caps it at AVX2.
pub fn gemm_kernel() -> &'static str {
    crate::sgemm::kernel().name()
}

/// One product `c[m,n] = alpha * a' @ b' + beta * c` in row-major terms, as the CPU's [`gemm`]
/// and the GPU's (`coa_kernels`' `Gpu::gemm`) take it: a' = a (stored [m,k]) or aᵀ (a stored
/// [k,m], `a_t`); b' = b (stored [k,n]) or bᵀ (b stored [n,k], `b_t`). `Gemm::new(m, n, k)` is `c = a @ b` on dense operands;
/// the other methods set the rest, e.g. linear forward `y[T,O] = x @ wᵀ` is
/// `Gemm::new(T, O, I).transposed(false, true)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_t: bool,
    pub b_t: bool,
    /// Elements between the stored rows of a, b and c (row-major leading dimensions), for
    /// sub-matrices such as a column block of a fused q|k|v buffer; None: dense operands (the
    /// CPU's [`gemm`] takes dense operands only).
    pub ld: Option<[usize; 3]>,
    pub alpha: f32,
    pub beta: f32,
}

impl Gemm {
    /// `c[m,n] = a[m,k] @ b[k,n]`: dense, not transposed, alpha 1, c overwritten (beta 0).
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Gemm { m, n, k, a_t: false, b_t: false, ld: None, alpha: 1.0, beta: 0.0 }
    }
    /// Which of a and b are stored transposed.
    pub fn transposed(self, a_t: bool, b_t: bool) -> Self {
        Gemm { a_t, b_t, ..self }
    }
    /// The operands are sub-matrices whose stored rows are `lda`, `ldb`, `ldc` elements apart.
    pub fn ld(self, lda: usize, ldb: usize, ldc: usize) -> Self {
        Gemm { ld: Some([lda, ldb, ldc]), ..self }
    }
    /// Scales the product.
    pub fn alpha(self, alpha: f32) -> Self {
        Gemm { alpha, ..self }
    }
    /// Keeps `beta * c` (1: accumulate into c).
    pub fn beta(self, beta: f32) -> Self {
        Gemm { beta, ..self }
    }
    /// (stored rows, stored columns) of a and of b.
    pub fn stored_shapes(&self) -> [(usize, usize); 2] {
        let Gemm { m, n, k, .. } = *self;
        [if self.a_t { (k, m) } else { (m, k) }, if self.b_t { (n, k) } else { (k, n) }]
    }
    /// The leading dimensions of a, b, c: the given ones, or the stored rows' lengths.
    pub fn leading_dims(&self) -> [usize; 3] {
        let [(_, ac), (_, bc)] = self.stored_shapes();
        self.ld.unwrap_or([ac, bc, self.n])
    }
}

/// `g`'s product on dense row-major operands: `c[m,n] = alpha * a' @ b' + beta * c`. With
/// `beta == 0` the old contents of `c` are ignored (may be anything, even NaN).
/// Parallel over output tiles with rayon; single-threaded [`crate::sgemm`] per tile.
pub fn gemm(g: Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    gemm_as(MatmulDtype::F32, g, a, b, c)
}

/// [`gemm`] with its operands as `dtype` has them: f32, or rounded to bf16 (f32 sums; on AMX
/// tiles where the CPU has them).
pub fn gemm_as(dtype: MatmulDtype, g: Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    let Gemm { m, n, k, a_t, b_t, alpha, beta, .. } = g;
    assert!(g.ld.is_none(), "gemm: the CPU reference takes dense operands (no leading dimensions)");
    assert_eq!(a.len(), m * k, "gemm: a has {} elements, expected {m}x{k}", a.len());
    assert_eq!(b.len(), k * n, "gemm: b has {} elements, expected {k}x{n}", b.len());
    assert_eq!(c.len(), m * n, "gemm: c has {} elements, expected {m}x{n}", c.len());
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.iter_mut().for_each(|x| *x *= beta);
        if beta == 0.0 {
            c.iter_mut().for_each(|x| *x = 0.0);
        }
        return;
    }
    let (rsa, csa) = if a_t { (1isize, m as isize) } else { (k as isize, 1isize) };
    let (rsb, csb) = if b_t { (1isize, k as isize) } else { (n as isize, 1isize) };
    let threads = rayon::current_num_threads().max(1);
    let work = m * n * k;
    // Tile the output along its longer side: 2 tiles per thread (balance), but one where that
    // side is long, since every tile packs the whole of the other operand (for the linear layers
    // a weight, read from L3): 4096x1536x576 nt took 33.5 ms at 2 tiles per thread, 29.6 at one.
    // Tiling never changes a bit.
    let (mt, nt) = if work < 32 * 32 * 32 || threads == 1 {
        (m, n)
    } else {
        let long = m.max(n);
        let per_thread = if long >= 512 * threads || k >= 2048 { 1 } else { 2 };
        let t = long.div_ceil(per_thread * threads).next_multiple_of(16).min(long);
        if m >= n { (t, n) } else { (m, t) }
    };
    let tiles_m = m.div_ceil(mt);
    let tiles_n = n.div_ceil(nt);
    let cp = SendPtr(c.as_mut_ptr());
    let ap = a.as_ptr() as usize;
    let bp = b.as_ptr() as usize;
    let run = |tile: usize| {
        let cp = cp; // capture the Send wrapper, not its raw-pointer field
        let (ti, tj) = (tile / tiles_n, tile % tiles_n);
        let i0 = ti * mt;
        let j0 = tj * nt;
        let mm = mt.min(m - i0);
        let nn = nt.min(n - j0);
        // SAFETY: tiles are disjoint blocks of c; a and b are only read; offsets stay in bounds
        // because i0 < m, j0 < n and the strides describe the checked lengths above.
        unsafe {
            let a0 = (ap as *const f32).offset(i0 as isize * rsa);
            let b0 = (bp as *const f32).offset(j0 as isize * csb);
            let c0 = cp.0.add(i0 * n + j0);
            match dtype {
                MatmulDtype::F32 => crate::sgemm::sgemm(mm, nn, k, alpha, a0, rsa as usize, csa as usize, b0, rsb as usize, csb as usize, beta, c0, n),
                MatmulDtype::Bf16 => crate::sgemm::sgemm_bf16(mm, nn, k, alpha, a0, rsa as usize, csa as usize, b0, rsb as usize, csb as usize, beta, c0, n),
            }
        }
    };
    let n_tiles = tiles_m * tiles_n;
    if n_tiles == 1 {
        run(0);
    } else {
        (0..n_tiles).into_par_iter().for_each(run);
    }
}

/// Linear layer forward: `out[T,O] = x[T,I] @ w[O,I]ᵀ + b[O]` (out is written).
pub fn linear_forward(out: &mut [f32], x: &[f32], w: &[f32], b: Option<&[f32]>, (t, i, o): (usize, usize, usize)) {
    linear_forward_as(MatmulDtype::F32, out, x, w, b, (t, i, o))
}

/// [`linear_forward`] with the product in `dtype` ([`gemm_as`]).
pub fn linear_forward_as(dtype: MatmulDtype, out: &mut [f32], x: &[f32], w: &[f32], b: Option<&[f32]>, (t, i, o): (usize, usize, usize)) {
    gemm_as(dtype, Gemm::new(t, o, i).transposed(false, true), x, w, out);
    if let Some(b) = b {
        assert_eq!(b.len(), o);
        out.par_chunks_mut(o * ROW_CHUNK).for_each(|rows| {
            for row in rows.chunks_mut(o) {
                row.iter_mut().zip(b).for_each(|(y, bb)| *y += bb);
            }
        });
    }
}

/// Linear layer backward. Accumulates `dx[T,I] += dout[T,O] @ w[O,I]` (when `dx` is given),
/// `dw[O,I] += dout[T,O]ᵀ @ x[T,I]`, `db[O] += Σ_t dout[t,:]`.
pub fn linear_backward(dx: Option<&mut [f32]>, dw: &mut [f32], db: Option<&mut [f32]>, dout: &[f32], x: &[f32], w: &[f32], shape: (usize, usize, usize)) {
    linear_backward_as(MatmulDtype::F32, dx.map(|d| (d, 1.0)), dw, db, dout, x, w, shape)
}

/// [`linear_backward`] with the products in `dtype` ([`gemm_as`]); `dx` is written (`beta` 0: the
/// first contribution to a gradient, no zeroing pass, C not read) or added to (`beta` 1).
#[allow(clippy::too_many_arguments)]
pub fn linear_backward_as(
    dtype: MatmulDtype,
    dx: Option<(&mut [f32], f32)>,
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    dout: &[f32],
    x: &[f32],
    w: &[f32],
    shape: (usize, usize, usize),
) {
    let (t, i, o) = shape;
    if let Some((dx, beta)) = dx {
        linear_backward_input_as(dtype, dx, beta, dout, w, shape);
    }
    gemm_as(dtype, Gemm::new(o, i, t).transposed(true, false).beta(1.0), dout, x, dw);
    if let Some(db) = db {
        let partial = column_sums(dout, t, o);
        db.iter_mut().zip(&partial).for_each(|(a, b)| *a += b);
    }
}

/// The input half of [`linear_backward_as`]: `dx[T,I] = dout[T,O] @ w[O,I] + beta · dx` (a
/// frozen weight needs no gradient of its own).
pub fn linear_backward_input_as(dtype: MatmulDtype, dx: &mut [f32], beta: f32, dout: &[f32], w: &[f32], (t, i, o): (usize, usize, usize)) {
    gemm_as(dtype, Gemm::new(t, i, o).beta(beta), dout, w, dx);
}

/// Σ over rows of `x[T,C]` → `[C]`, with fixed chunking (deterministic).
fn column_sums(x: &[f32], t: usize, c: usize) -> Vec<f32> {
    let chunk_rows = 64;
    let partials: Vec<Vec<f32>> = x[..t * c]
        .par_chunks(c * chunk_rows)
        .map(|rows| {
            let mut acc = vec![0f32; c];
            for row in rows.chunks(c) {
                acc.iter_mut().zip(row).for_each(|(a, b)| *a += b);
            }
            acc
        })
        .collect();
    let mut out = vec![0f32; c];
    for p in partials {
        out.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// embedding

/// `out[T,D] = table[V,D][ids[T]]` (written). Ids must be < V (checked by the caller).
pub fn embedding_forward(out: &mut [f32], ids: &[u32], table: &[f32], d: usize) {
    out.par_chunks_mut(d).zip(ids.par_iter()).for_each(|(row, &id)| {
        let s = id as usize * d;
        row.copy_from_slice(&table[s..s + d]);
    });
}

/// `dtable[V,D][ids[t]] += dout[T,D][t]` for every t (sequential: ids repeat).
pub fn embedding_backward(dtable: &mut [f32], dout: &[f32], ids: &[u32], d: usize) {
    for (row, &id) in dout.chunks(d).zip(ids) {
        let s = id as usize * d;
        dtable[s..s + d].iter_mut().zip(row).for_each(|(a, b)| *a += b);
    }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

/// `out[T,D] = x[T,D] * rstd[T] * w[D]`, `rstd[t] = 1 / sqrt(mean(x[t]²) + eps)` (both written).
pub fn rmsnorm_forward(out: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], eps: f32, d: usize) {
    out.par_chunks_mut(d)
        .zip(rstd.par_iter_mut())
        .zip(x.par_chunks(d))
        .with_min_len(ROW_CHUNK)
        .for_each(|((o, r), xr)| {
            let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let rs = 1.0 / (ss + eps).sqrt();
            *r = rs;
            o.iter_mut().zip(xr).zip(w).for_each(|((o, &xv), &wv)| *o = wv * (xv * rs));
        });
}

/// RMSNorm backward: `dx[T,D] += ...`, `dw[D] += Σ_t dout·x·rstd`.
/// With g = dout·w: `dx = rstd·g − x·rstd³·(Σ_i g_i x_i)/D`.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward(
    dx: &mut [f32],
    dw: &mut [f32],
    dout: &[f32],
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
    d: usize,
) {
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(d * ROW_CHUNK)
        .zip(dout.par_chunks(d * ROW_CHUNK))
        .zip(x.par_chunks(d * ROW_CHUNK))
        .zip(rstd.par_chunks(ROW_CHUNK))
        .map(|(((dxc, dyc), xc), rc)| {
            let mut dwp = vec![0f32; d];
            for (((dxr, dyr), xr), &rs) in dxc.chunks_mut(d).zip(dyc.chunks(d)).zip(xc.chunks(d)).zip(rc) {
                let mut dot = 0f32;
                for i in 0..d {
                    dot += dyr[i] * w[i] * xr[i];
                    dwp[i] += dyr[i] * xr[i] * rs;
                }
                let c = rs * rs * rs * dot / d as f32;
                for i in 0..d {
                    dxr[i] += rs * dyr[i] * w[i] - xr[i] * c;
                }
            }
            dwp
        })
        .collect();
    for p in partials {
        dw.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
    }
}

// ---------------------------------------------------------------------------------------------
// RoPE

/// The default RoPE inverse frequencies `[hd/2]`: inv_freq[i] = 1 / theta^(2i/hd), computed like
/// HF (`1.0 / base ** (arange(0, hd, 2).float() / hd)`).
pub fn rope_inv_freq(hd: usize, theta: f64) -> Vec<f32> {
    (0..hd / 2)
        .map(|i| {
            let e = (2 * i) as f32 / hd as f32;
            (1.0 / (theta as f32 as f64).powf(e as f64)) as f32
        })
        .collect()
}

/// RoPE tables for the given positions and inverse frequencies `inv_freq[hd/2]`:
/// `cos[T, hd/2]`, `sin[T, hd/2]` (returned), angle = pos · inv_freq[i] in f32 like HF.
pub fn rope_tables_from(positions: &[u32], inv_freq: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = vec![0f32; positions.len() * half];
    let mut sin = vec![0f32; positions.len() * half];
    for (t, &p) in positions.iter().enumerate() {
        for (i, &f) in inv_freq.iter().enumerate() {
            let ang = p as f32 * f;
            cos[t * half + i] = (ang as f64).cos() as f32;
            sin[t * half + i] = (ang as f64).sin() as f32;
        }
    }
    (cos, sin)
}

/// Plain RoPE tables (no scaling) for the given positions: `cos[T, hd/2]`, `sin[T, hd/2]`.
/// A model's own tables come from [`crate::ModelConfig::rope_tables`], which applies its scaling.
pub fn rope_tables(positions: &[u32], hd: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    rope_tables_from(positions, &rope_inv_freq(hd, theta))
}

/// In-place RoPE on `x[T, H*hd]` (HF rotate_half convention: pairs (i, i + hd/2)):
/// `x'[i] = x[i]·cos − x[i+h]·sin`, `x'[i+h] = x[i+h]·cos + x[i]·sin`, cos/sin `[T, hd/2]`.
pub fn rope_forward(x: &mut [f32], cos: &[f32], sin: &[f32], n_heads: usize, hd: usize) {
    rope_apply(x, cos, sin, n_heads, hd, 1.0);
}

/// In-place RoPE backward on the gradient `dx[T, H*hd]`: the transpose rotation (angle −θ).
pub fn rope_backward(dx: &mut [f32], cos: &[f32], sin: &[f32], n_heads: usize, hd: usize) {
    rope_apply(dx, cos, sin, n_heads, hd, -1.0);
}

fn rope_apply(x: &mut [f32], cos: &[f32], sin: &[f32], n_heads: usize, hd: usize, sign: f32) {
    let half = hd / 2;
    let width = n_heads * hd;
    x.par_chunks_mut(width).enumerate().with_min_len(ROW_CHUNK).for_each(|(t, row)| {
        let c = &cos[t * half..(t + 1) * half];
        let s = &sin[t * half..(t + 1) * half];
        for head in row.chunks_mut(hd) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                let si = sign * s[i];
                a[i] = x1 * c[i] - x2 * si;
                b[i] = x2 * c[i] + x1 * si;
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// segments

/// From optional segment ids `[T]`: RoPE positions `[T]` (restart at 0 at each segment start)
/// and the start index of each token's segment `[T]`. A segment is a maximal run of equal ids.
pub fn segment_layout(t: usize, segment_ids: Option<&[i32]>) -> (Vec<u32>, Vec<usize>) {
    let mut pos = Vec::with_capacity(t);
    let mut start = Vec::with_capacity(t);
    let mut s0 = 0usize;
    for i in 0..t {
        if let Some(seg) = segment_ids {
            if i > 0 && seg[i] != seg[i - 1] {
                s0 = i;
            }
        }
        start.push(s0);
        pos.push((i - s0) as u32);
    }
    (pos, start)
}

/// [`segment_layout`] with a shared prefix (see `Seq::shared_prefix`): the first `prefix` tokens
/// must be exactly the first segment; every later segment's positions start at `prefix`, as if
/// it followed the prefix alone.
pub fn segment_layout_prefix(t: usize, segment_ids: Option<&[i32]>, prefix: usize) -> anyhow::Result<(Vec<u32>, Vec<usize>)> {
    let (mut pos, start) = segment_layout(t, segment_ids);
    if prefix == 0 {
        return Ok((pos, start));
    }
    if prefix >= t || start[prefix] != prefix || start[prefix - 1] != 0 {
        anyhow::bail!("the shared prefix ({prefix} tokens) must be the first segment of a longer sequence ({t} tokens)");
    }
    for (p, &s) in pos.iter_mut().zip(&start).skip(prefix) {
        *p += prefix as u32;
        debug_assert!(s >= prefix);
    }
    Ok((pos, start))
}

/// End (exclusive) of each token's segment `[T]`, from the segment starts `[T]`.
pub fn segment_ends(seg_start: &[usize]) -> Vec<usize> {
    let t = seg_start.len();
    let mut end = vec![t; t];
    for i in (0..t).rev() {
        end[i] = if i + 1 < t && seg_start[i + 1] == seg_start[i] { end[i + 1] } else { i + 1 };
    }
    end
}

// ---------------------------------------------------------------------------------------------
// attention

#[cfg(test)]
thread_local! {
    /// Tests: the attention takes the per-product path in bf16 too (the packed path's reference).
    pub(crate) static PER_PRODUCT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The engine of the attention with its operands packed once per call
/// ([`crate::attention_packed`]): bf16 products on a CPU with a bf16 engine; else each product
/// packs its own operands (f32, or bf16 on rounded copies).
#[cfg(target_arch = "x86_64")]
fn packed_attention(dtype: MatmulDtype) -> Option<crate::bf16mm::Engine> {
    #[cfg(test)]
    if PER_PRODUCT.get() {
        return None;
    }
    match dtype {
        MatmulDtype::Bf16 => crate::bf16mm::engine(),
        MatmulDtype::F32 => None,
    }
}

/// Causal grouped-query attention within segments (with `shape`'s shared prefix and sliding
/// window, see [`attention_forward_prefix`]), scale 1/sqrt(hd), in f32 products.
/// `out[T, Hq*hd]` and `lse[T, Hq]` (log-sum-exp of the scaled scores) are written.
/// Query head h reads kv head h / (Hq/Hk). Token i attends to j in [seg_start[i], i]:
/// `out_i = Σ_j softmax_j(scale · q_i·k_j) v_j`.
///
/// Work: one task per (head, block of 64 queries); scores for the block against every key its
/// rows may see are one sgemm, the softmax is row-wise, and P·V is one sgemm.
pub fn attention_forward(out: &mut [f32], lse: &mut [f32], x: Qkv, shape: AttentionShape) {
    attention_forward_prefix(out, lse, x, shape, MatmulDtype::F32);
}

/// [`attention_forward_prefix`] with a shared prefix: tokens `[0, prefix)` (the first segment) are seen
/// by every later segment too, so token i of a later segment attends to `[0, prefix) ∪
/// [seg_start[i], i]`. Rows that share a prompt packed as `prefix | tail 1 | tail 2 | …` compute
/// exactly what each row `prefix | tail k` computes alone, the prefix once. `prefix = 0`: plain
/// segments.
pub fn attention_forward_prefix(out: &mut [f32], lse: &mut [f32], x: Qkv, shape: AttentionShape, dtype: MatmulDtype) {
    let AttentionShape { seg_start, prefix, window, n_heads, n_kv_heads, head_dim: hd } = shape;
    let Qkv { q, k, v } = x;
    let t_len = seg_start.len();
    let (qw, kw) = (n_heads * hd, n_kv_heads * hd);
    assert!(q.len() == t_len * qw && out.len() == t_len * qw && lse.len() == t_len * n_heads);
    assert!(k.len() == t_len * kw && v.len() == t_len * kw);
    assert!(prefix <= t_len && (prefix == 0 || seg_start.get(prefix).is_none_or(|&s| s == prefix)), "the shared prefix must end at a segment start");
    #[cfg(target_arch = "x86_64")]
    if let Some(engine) = packed_attention(dtype) {
        return crate::attention_packed::forward(engine, out, lse, x, &shape);
    }
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let n_blocks = t_len.div_ceil(ATT_BLOCK);
    let outp = SendPtr(out.as_mut_ptr());
    let lsep = SendPtr(lse.as_mut_ptr());
    (0..n_heads * n_blocks).into_par_iter().for_each_init(Vec::new, |s, task| {
        let (outp, lsep) = (outp, lsep);
        let (h, blk) = (task / n_blocks, task % n_blocks);
        let g = h / group;
        let i0 = blk * ATT_BLOCK;
        let i1 = (i0 + ATT_BLOCK).min(t_len);
        let (np, k0) = key_span(seg_start, prefix, i0);
        // columns: the prefix keys [0, np), then the keys [k0, i1)
        let (nb, nk) = (i1 - i0, np + i1 - k0);
        s.resize(nb * nk, 0.0);
        // S[nb, nk] = Q[i0..i1, h] · K[keys, g]ᵀ (unscaled)
        // SAFETY: all reads are inside q / k (rows < T, columns < hd within the head).
        unsafe {
            let qp = q.as_ptr().add(i0 * qw + h * hd);
            if np > 0 {
                sgemm_as(dtype, nb, np, hd, 1.0, qp, qw, 1, k.as_ptr().add(g * hd), 1, kw, 0.0, s.as_mut_ptr(), nk);
            }
            sgemm_as(dtype, nb, nk - np, hd, 1.0, qp, qw, 1, k.as_ptr().add(k0 * kw + g * hd), 1, kw, 0.0, s.as_mut_ptr().add(np), nk);
        }
        for r in 0..nb {
            let i = i0 + r;
            let l = softmax_row(&mut s[r * nk..(r + 1) * nk], row_span(seg_start, prefix, window, np, k0, i), scale);
            // SAFETY: (i, h) is written by this task only.
            unsafe { *lsep.0.add(i * n_heads + h) = l };
        }
        // O[i0..i1, h] = P[nb, nk] · V[keys, g]
        // SAFETY: rows i0..i1, columns h·hd..(h+1)·hd of out belong to this task alone.
        unsafe {
            let op = outp.0.add(i0 * qw + h * hd);
            sgemm_as(dtype, nb, hd, nk - np, 1.0, s.as_ptr().add(np), nk, 1, v.as_ptr().add(k0 * kw + g * hd), kw, 1, 0.0, op, qw);
            if np > 0 {
                sgemm_as(dtype, nb, hd, np, 1.0, s.as_ptr(), nk, 1, v.as_ptr().add(g * hd), kw, 1, 1.0, op, qw);
            }
        }
    });
}

/// Attention backward, in f32 products. Accumulates `grads` from `dout[T, Hq*hd]`, using the
/// forward's `x`, `out[T, Hq*hd]`, `lse[T, Hq]` and `shape`.
/// Probabilities are recomputed from lse: p_ij = exp(scale·q_i·k_j − lse_i).
/// With delta_i = dout_i·out_i and dS_ij = p_ij (dout_i·v_j − delta_i):
/// dq_i = scale Σ_j dS_ij k_j; dk_j = scale Σ_i dS_ij q_i; dv_j = Σ_i p_ij dout_i.
/// Two race-free passes: tasks over (query head, query block) for dq, then over (kv head, key
/// block) for dk and dv.
pub fn attention_backward(grads: QkvGrads, dout: &[f32], x: Qkv, out: &[f32], lse: &[f32], shape: AttentionShape) {
    attention_backward_prefix(grads, dout, x, out, lse, shape, MatmulDtype::F32);
}

/// [`attention_backward`] with a shared prefix (see [`attention_forward_prefix`]).
pub fn attention_backward_prefix(grads: QkvGrads, dout: &[f32], x: Qkv, out: &[f32], lse: &[f32], shape: AttentionShape, dtype: MatmulDtype) {
    attention_backward_keep(grads, dout, x, out, lse, shape, dtype, ATT_KEEP_LIMIT)
}

thread_local! {
    /// P and dS kept by the attention backward's first pass (see [`attention_backward_keep`]).
    pub(crate) static KEPT: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Most floats of probabilities and score gradients (together) the attention backward keeps
/// from its first pass for its second (512 MB); a longer sequence recomputes them instead.
const ATT_KEEP_LIMIT: usize = 128 << 20;

/// [`attention_backward_prefix`]. Pass 1 computes, per (query head, query block), the block's
/// probabilities P and score gradients dS and from them dQ; pass 2 needs the same P and dS by
/// key block. When all of them fit in `keep_limit` floats, pass 1 keeps them and pass 2 is two
/// products per (query block, key run) (dV += Pᵀ·dO, dK += scale·dSᵀ·Q); otherwise pass 2
/// recomputes them in the transposed layout (two more products and the exponentials again).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_keep(grads: QkvGrads, dout: &[f32], x: Qkv, out: &[f32], lse: &[f32], shape: AttentionShape, dtype: MatmulDtype, keep_limit: usize) {
    let AttentionShape { seg_start, prefix, window, n_heads, n_kv_heads, head_dim: hd } = shape;
    let Qkv { q, k, v } = x;
    let QkvGrads { dq, dk, dv } = grads;
    let t_len = seg_start.len();
    let (qw, kw) = (n_heads * hd, n_kv_heads * hd);
    assert!(q.len() == t_len * qw && dq.len() == t_len * qw && dout.len() == t_len * qw && out.len() == t_len * qw);
    assert!(k.len() == t_len * kw && v.len() == t_len * kw && dk.len() == t_len * kw && dv.len() == t_len * kw);
    assert!(lse.len() == t_len * n_heads);
    // Queries that see key j: [j, seg_end[j]) within a segment; every later token for a prefix key.
    let mut seg_end = segment_ends(seg_start);
    seg_end[..prefix].iter_mut().for_each(|e| *e = t_len);
    let n_blocks = t_len.div_ceil(ATT_BLOCK);
    // delta[T, Hq] = dout_i,h · out_i,h
    let mut delta = vec![0f32; t_len * n_heads];
    delta.par_chunks_mut(n_heads).enumerate().with_min_len(ROW_CHUNK).for_each(|(i, drow)| {
        for h in 0..n_heads {
            let r = i * qw + h * hd..i * qw + (h + 1) * hd;
            drow[h] = crate::simd::dot(&dout[r.clone()], &out[r]);
        }
    });
    let delta = &delta;
    #[cfg(target_arch = "x86_64")]
    if let Some(engine) = packed_attention(dtype) {
        let rows = crate::attention_packed::QueryRows { dout, lse, delta };
        return crate::attention_packed::backward(engine, QkvGrads { dq, dk, dv }, x, rows, &shape, &seg_end, keep_limit);
    }
    // Where task (h, query block) keeps its P and dS [nb, nk]: offsets into `kept` (P) and
    // `kept_ds`, if all of them fit.
    let block_cols = |blk: usize| {
        let i0 = blk * ATT_BLOCK;
        let (np, k0) = key_span(seg_start, prefix, i0);
        np + (i0 + ATT_BLOCK).min(t_len) - k0
    };
    let mut offsets = Vec::with_capacity(n_heads * n_blocks + 1);
    offsets.push(0usize);
    for _ in 0..n_heads {
        for blk in 0..n_blocks {
            let nb = (blk * ATT_BLOCK + ATT_BLOCK).min(t_len) - blk * ATT_BLOCK;
            offsets.push(offsets.last().unwrap() + nb * block_cols(blk));
        }
    }
    let kept_len = *offsets.last().unwrap();
    let keep = 2 * kept_len <= keep_limit;
    // lse and delta head-major [Hq, T], for a recomputing pass 2's column-wise use.
    let (lse_hm, delta_hm) = if keep { (Vec::new(), Vec::new()) } else { head_major(lse, delta, t_len, n_heads) };
    // The calling thread's buffers, grown to the longest sequence and reused (every kept float
    // is written by pass 1 before pass 2 reads it): a fresh zeroed allocation per layer cost
    // more in page faults than the recomputation saved. Put back when the passes are done.
    let (mut kept, mut kept_ds) = KEPT.take();
    if keep && kept.len() < kept_len {
        kept.resize(kept_len, 0.0);
        kept_ds.resize(kept_len, 0.0);
    }
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let offsets = &offsets;
    let (keptp, kept_dsp) = (SendPtr(kept.as_mut_ptr()), SendPtr(kept_ds.as_mut_ptr()));

    // Pass 1: dq. Task (h, query block [i0, i1)) against the block's keys (see key_span).
    let dqp = SendPtr(dq.as_mut_ptr());
    (0..n_heads * n_blocks).into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(s_own, dp_own), task| {
            let (dqp, keptp, kept_dsp) = (dqp, keptp, kept_dsp);
            let (h, blk) = (task / n_blocks, task % n_blocks);
            let g = h / group;
            let i0 = blk * ATT_BLOCK;
            let i1 = (i0 + ATT_BLOCK).min(t_len);
            let (np, k0) = key_span(seg_start, prefix, i0);
            let (nb, nk) = (i1 - i0, np + i1 - k0);
            let (s, dp): (&mut [f32], &mut [f32]) = if keep {
                // SAFETY: [offsets[task], offsets[task + 1]) (= nb·nk floats) of kept and
                // kept_ds belong to this task alone.
                unsafe {
                    (
                        std::slice::from_raw_parts_mut(keptp.0.add(offsets[task]), nb * nk),
                        std::slice::from_raw_parts_mut(kept_dsp.0.add(offsets[task]), nb * nk),
                    )
                }
            } else {
                s_own.resize(nb * nk, 0.0);
                dp_own.resize(nb * nk, 0.0);
                (&mut s_own[..], &mut dp_own[..])
            };
            // SAFETY: reads inside q, k, v, dout; see attention_forward_prefix.
            unsafe {
                // S = Q·Kᵀ, dP = dO·Vᵀ   [nb, nk]
                let (qp, dop) = (q.as_ptr().add(i0 * qw + h * hd), dout.as_ptr().add(i0 * qw + h * hd));
                if np > 0 {
                    sgemm_as(dtype, nb, np, hd, 1.0, qp, qw, 1, k.as_ptr().add(g * hd), 1, kw, 0.0, s.as_mut_ptr(), nk);
                    sgemm_as(dtype, nb, np, hd, 1.0, dop, qw, 1, v.as_ptr().add(g * hd), 1, kw, 0.0, dp.as_mut_ptr(), nk);
                }
                sgemm_as(dtype, nb, nk - np, hd, 1.0, qp, qw, 1, k.as_ptr().add(k0 * kw + g * hd), 1, kw, 0.0, s.as_mut_ptr().add(np), nk);
                sgemm_as(dtype, nb, nk - np, hd, 1.0, dop, qw, 1, v.as_ptr().add(k0 * kw + g * hd), 1, kw, 0.0, dp.as_mut_ptr().add(np), nk);
            }
            for r in 0..nb {
                let i = i0 + r;
                let span = row_span(seg_start, prefix, window, np, k0, i);
                let (l, d) = (lse[i * n_heads + h], delta[i * n_heads + h]);
                ds_row(&mut s[r * nk..(r + 1) * nk], &mut dp[r * nk..(r + 1) * nk], span, scale, l, d, keep);
            }
            // dQ[i0..i1, h] += scale · dS · K[keys, g]
            // SAFETY: rows i0..i1, head h of dq belong to this task alone.
            unsafe {
                let dqh = dqp.0.add(i0 * qw + h * hd);
                sgemm_as(dtype, nb, hd, nk - np, scale, dp.as_ptr().add(np), nk, 1, k.as_ptr().add(k0 * kw + g * hd), kw, 1, 1.0, dqh, qw);
                if np > 0 {
                    sgemm_as(dtype, nb, hd, np, scale, dp.as_ptr(), nk, 1, k.as_ptr().add(g * hd), kw, 1, 1.0, dqh, qw);
                }
            }
        },
    );

    let dkp = SendPtr(dk.as_mut_ptr());
    let dvp = SendPtr(dv.as_mut_ptr());
    let seg_end = &seg_end;
    if keep {
        // Pass 2 from the kept P and dS: task (g, key block [j0, j1)), for every query head of
        // the group and every query block that may see these keys, the keys' columns of that
        // block (its prefix columns, then its own keys from k0; columns of keys a row does not
        // see hold 0).
        (0..n_kv_heads * n_blocks).into_par_iter().for_each(|task| {
            let (dkp, dvp) = (dkp, dvp);
            let (g, kb) = (task / n_blocks, task % n_blocks);
            let j0 = kb * ATT_BLOCK;
            let j1 = (j0 + ATT_BLOCK).min(t_len);
            let e = seg_end[j0..j1].iter().copied().max().unwrap_or(j1);
            for h in g * group..(g + 1) * group {
                for qb in kb..e.div_ceil(ATT_BLOCK) {
                    let i0 = qb * ATT_BLOCK;
                    let i1 = (i0 + ATT_BLOCK).min(t_len);
                    let (np, k0) = key_span(seg_start, prefix, i0);
                    let nk = np + i1 - k0;
                    let off = offsets[h * n_blocks + qb];
                    // (first key, end key, first column) of the runs of [j0, j1) in this block
                    let prefix_run = (j0, j1.min(np), j0);
                    let own_run = (j0.max(k0), j1.min(i1), np + j0.max(k0) - k0);
                    for (ja, jb, col) in [prefix_run, own_run] {
                        if ja >= jb {
                            continue;
                        }
                        // SAFETY: the block's kept rows are [off, off + nb·nk), columns
                        // col..col + (jb − ja) ≤ nk; rows ja..jb, kv head g of dk / dv belong to
                        // this task alone; dout and q rows i0..i1 are in bounds.
                        unsafe {
                            let (pa, dsa) = (kept.as_ptr().add(off + col), kept_ds.as_ptr().add(off + col));
                            let (dop, qp) = (dout.as_ptr().add(i0 * qw + h * hd), q.as_ptr().add(i0 * qw + h * hd));
                            sgemm_as(dtype, jb - ja, hd, i1 - i0, 1.0, pa, 1, nk, dop, qw, 1, 1.0, dvp.0.add(ja * kw + g * hd), kw);
                            sgemm_as(dtype, jb - ja, hd, i1 - i0, scale, dsa, 1, nk, qp, qw, 1, 1.0, dkp.0.add(ja * kw + g * hd), kw);
                        }
                    }
                }
            }
        });
        KEPT.set((kept, kept_ds));
        return;
    }

    // Pass 2 recomputing P and dS: task (g, key block [j0, j1)) against queries
    // [j0, seg_end[j1 − 1]), over every query head of the group, in the transposed layout
    // (keys as rows).
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
                // SAFETY: reads inside q, k, v, dout.
                unsafe {
                    // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ   [nb, nq]
                    sgemm_as(dtype, nb, nq, hd, 1.0, k.as_ptr().add(j0 * kw + g * hd), kw, 1, q.as_ptr().add(j0 * qw + h * hd), 1, qw, 0.0, s.as_mut_ptr(), nq);
                    sgemm_as(dtype, nb, nq, hd, 1.0, v.as_ptr().add(j0 * kw + g * hd), kw, 1, dout.as_ptr().add(j0 * qw + h * hd), 1, qw, 0.0, dp.as_mut_ptr(), nq);
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
                    window_cut(pr, dsr, &shape, j, j0, lo..hi);
                }
                // SAFETY: rows j0..j1, kv head g of dk / dv belong to this task alone.
                unsafe {
                    // dV[j0..j1, g] += Pᵀ · dO[j0..e, h];  dK[j0..j1, g] += scale · dSᵀ · Q[j0..e, h]
                    sgemm_as(dtype, nb, hd, nq, 1.0, s.as_ptr(), nq, 1, dout.as_ptr().add(j0 * qw + h * hd), qw, 1, 1.0, dvp.0.add(j0 * kw + g * hd), kw);
                    sgemm_as(dtype, nb, hd, nq, scale, dp.as_ptr(), nq, 1, q.as_ptr().add(j0 * qw + h * hd), qw, 1, 1.0, dkp.0.add(j0 * kw + g * hd), kw);
                }
            }
        },
    );
    KEPT.set((kept, kept_ds));
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

/// `out[T,I] = silu(g[T,I]) * u[T,I]` (written), silu(x) = x·σ(x).
pub fn swiglu_forward(out: &mut [f32], g: &[f32], u: &[f32]) {
    out.par_chunks_mut(4096)
        .zip(g.par_chunks(4096))
        .zip(u.par_chunks(4096))
        .for_each(|((o, g), u)| crate::simd::swiglu(o, g, u));
}

/// SwiGLU backward: `dg[T,I] += dout·u·σ(g)·(1 + g·(1 − σ(g)))`, `du[T,I] += dout·silu(g)`.
pub fn swiglu_backward(dg: &mut [f32], du: &mut [f32], dout: &[f32], g: &[f32], u: &[f32]) {
    dg.par_chunks_mut(4096)
        .zip(du.par_chunks_mut(4096))
        .zip(dout.par_chunks(4096))
        .zip(g.par_chunks(4096).zip(u.par_chunks(4096)))
        .for_each(|(((dg, du), dy), (g, u))| crate::simd::swiglu_back(dg, du, dy, g, u));
}

// ---------------------------------------------------------------------------------------------
// log-softmax / cross-entropy from logits

/// Statistics of one logits row for the target id.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    /// log Σ_i exp(z_i)
    pub lse: f32,
    /// z_target − lse
    pub logp: f32,
    /// −Σ_i p_i log p_i
    pub entropy: f32,
}

/// Stats of one row `z[V]` for `target`, overwriting `z` with the probabilities softmax(z).
pub fn logsoftmax_row_inplace(z: &mut [f32], target: usize) -> RowStats {
    let zt = z[target];
    let mx = crate::simd::max(z);
    // e_i = exp(z_i − mx); sum = Σ e; sz = Σ e·(z − mx)
    let (sum, sz) = crate::simd::exp_shift_sums(z, mx);
    crate::simd::scale(z, (1.0 / sum) as f32);
    let lse = mx as f64 + sum.ln();
    RowStats {
        lse: lse as f32,
        logp: (zt as f64 - lse) as f32,
        // entropy = lse − E_p[z] = ln(sum) − E_p[z − mx]
        entropy: (sum.ln() - sz / sum) as f32,
    }
}

/// Per-row log-prob of the targets: `logp[R] = z[r, target[r]] − lse[r]`, `entropy[R]`,
/// `lse[R]` (written) from `logits[R,V]` (read only). Rows with `target[r] = None` get
/// logp = entropy = 0 (lse is still written).
pub fn logsoftmax_forward(
    logp: &mut [f32],
    entropy: &mut [f32],
    lse: &mut [f32],
    logits: &[f32],
    targets: &[Option<u32>],
    v: usize,
) {
    logp.par_iter_mut()
        .zip(entropy.par_iter_mut())
        .zip(lse.par_iter_mut())
        .zip(logits.par_chunks(v))
        .zip(targets.par_iter())
        .for_each_init(
            || vec![0f32; v],
            |buf, ((((lp, en), ls), row), tgt)| {
                buf.copy_from_slice(row);
                let st = logsoftmax_row_inplace(buf, tgt.unwrap_or(0) as usize);
                *ls = st.lse;
                (*lp, *en) = if tgt.is_some() { (st.logp, st.entropy) } else { (0.0, 0.0) };
            },
        );
}

/// `logsoftmax_forward` that overwrites `z[R,V]` with the probabilities softmax(z) (for
/// `logsoftmax_backward_from_probs`, saving the second exp).
pub fn logsoftmax_forward_inplace(
    logp: &mut [f32],
    entropy: &mut [f32],
    lse: &mut [f32],
    z: &mut [f32],
    targets: &[Option<u32>],
    v: usize,
) {
    logp.par_iter_mut()
        .zip(entropy.par_iter_mut())
        .zip(lse.par_iter_mut())
        .zip(z.par_chunks_mut(v))
        .zip(targets.par_iter())
        .for_each(|((((lp, en), ls), row), tgt)| {
            let st = logsoftmax_row_inplace(row, tgt.unwrap_or(0) as usize);
            *ls = st.lse;
            (*lp, *en) = if tgt.is_some() { (st.logp, st.entropy) } else { (0.0, 0.0) };
        });
}

/// Backward of `logp[r] = log_softmax(z[r])[target[r]]`: `dlogits[R,V]` (written) =
/// `dlogp[r] · (onehot(target[r]) − softmax(z[r]))`, from `logits[R,V]` and `lse[R]`.
/// Rows with no target get 0.
pub fn logsoftmax_backward(
    dlogits: &mut [f32],
    logits: &[f32],
    lse: &[f32],
    targets: &[Option<u32>],
    dlogp: &[f32],
    v: usize,
) {
    dlogits.copy_from_slice(&logits[..dlogits.len()]);
    logsoftmax_backward_inplace(dlogits, lse, targets, dlogp, v);
}

/// `logsoftmax_backward` in place: `z[R,V]` holds the logits on entry and dlogits on exit.
pub fn logsoftmax_backward_inplace(z: &mut [f32], lse: &[f32], targets: &[Option<u32>], dlogp: &[f32], v: usize) {
    z.par_chunks_mut(v).enumerate().for_each(|(r, row)| match targets[r] {
        Some(tg) if dlogp[r] != 0.0 => {
            crate::simd::neg_c_exp_shift(row, dlogp[r], lse[r]);
            row[tg as usize] += dlogp[r];
        }
        _ => row.iter_mut().for_each(|x| *x = 0.0),
    });
}

/// `logsoftmax_backward` from probabilities: `p[R,V]` holds softmax(z) on entry (as left by
/// `logsoftmax_forward_inplace`) and dlogits on exit.
pub fn logsoftmax_backward_from_probs(p: &mut [f32], targets: &[Option<u32>], dlogp: &[f32], v: usize) {
    p.par_chunks_mut(v).enumerate().for_each(|(r, row)| match targets[r] {
        Some(tg) if dlogp[r] != 0.0 => {
            crate::simd::neg_scale(row, dlogp[r]);
            row[tg as usize] += dlogp[r];
        }
        _ => row.iter_mut().for_each(|x| *x = 0.0),
    });
}

/// Masked mean cross-entropy of `logits[R,V]` against `targets[R]` with weights `mask[R]`:
/// `loss = −Σ_r mask[r]·logp[r] / Σ_r mask[r]` and `dlogits[R,V]` (returned). Rows with a zero
/// mask contribute nothing. If Σ mask = 0 the loss is 0 with zero gradient.
pub fn masked_cross_entropy(logits: &[f32], targets: &[u32], mask: &[f32], v: usize) -> (f32, Vec<f32>) {
    let r = targets.len();
    let tg: Vec<Option<u32>> = targets.iter().zip(mask).map(|(&t, &m)| (m != 0.0).then_some(t)).collect();
    let mut logp = vec![0f32; r];
    let mut ent = vec![0f32; r];
    let mut lse = vec![0f32; r];
    logsoftmax_forward(&mut logp, &mut ent, &mut lse, logits, &tg, v);
    let n: f64 = mask.iter().map(|&m| m as f64).sum();
    if n == 0.0 {
        return (0.0, vec![0f32; r * v]);
    }
    let loss = -(logp.iter().zip(mask).map(|(&l, &m)| l as f64 * m as f64).sum::<f64>() / n);
    let dlogp: Vec<f32> = mask.iter().map(|&m| (-(m as f64) / n) as f32).collect();
    let mut d = vec![0f32; r * v];
    logsoftmax_backward(&mut d, logits, &lse, &tg, &dlogp, v);
    (loss as f32, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention_rows::in_window;
    use crate::rng::SplitMix64;

    /// The attention backward's two second passes (from the kept P and dS, and recomputing them)
    /// give the same gradients: one sequence, segments whose bounds are not block-aligned, and a
    /// shared prefix that ends inside a block, with grouped heads.
    #[test]
    fn attention_backward_kept_and_recomputed_agree() {
        let (nh, nkv, hd) = (4, 2, 16);
        let mut rng = SplitMix64::new(5);
        let mut vec = |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.unit_nonzero() * 2.0 - 1.0) as f32).collect() };
        let t = 300;
        let segs: Vec<i32> = (0..t).map(|i| if i < 70 { 0 } else if i < 150 { 1 } else if i < 230 { 2 } else { 3 }).collect();
        for (seg, prefix) in [(None, 0), (Some(&segs), 0), (Some(&segs), 70)] {
            let (q, k, v, dout) = (vec(t * nh * hd), vec(t * nkv * hd), vec(t * nkv * hd), vec(t * nh * hd));
            let (_, seg_start) = segment_layout_prefix(t, seg.map(|s| &s[..]), prefix).unwrap();
            let (x, shape) = (Qkv { q: &q, k: &k, v: &v }, AttentionShape { prefix, ..AttentionShape::segments(&seg_start, nh, nkv, hd) });
            let (mut out, mut lse) = (vec![0f32; t * nh * hd], vec![0f32; t * nh]);
            attention_forward_prefix(&mut out, &mut lse, x, shape, MatmulDtype::F32);
            let grads = |limit: usize| {
                let (mut dq, mut dk, mut dv) = (vec![0f32; t * nh * hd], vec![0f32; t * nkv * hd], vec![0f32; t * nkv * hd]);
                attention_backward_keep(QkvGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv }, &dout, x, &out, &lse, shape, MatmulDtype::F32, limit);
                (dq, dk, dv)
            };
            let (kept, recomputed) = (grads(usize::MAX), grads(0));
            for (name, a, b) in [("dq", &kept.0, &recomputed.0), ("dk", &kept.1, &recomputed.1), ("dv", &kept.2, &recomputed.2)] {
                let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(scale > 0.0 && err <= 1e-5 * scale, "segments {}, prefix {prefix}: {name} differs by {err} (scale {scale})", seg.is_some());
            }
        }
    }

    /// With bf16 products (`--matmul bf16`) the attention's outputs and gradients are the f32
    /// attention's within bf16 rounding (inputs of magnitude 1, sums over up to 300 keys), on
    /// both second passes of the backward, and not its bits (the products were rounded).
    #[test]
    fn attention_in_bf16_products_is_near_the_f32_attention() {
        let (nh, nkv, hd) = (4, 2, 64);
        let mut rng = SplitMix64::new(11);
        let mut vec = |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.unit_nonzero() * 2.0 - 1.0) as f32).collect() };
        let t = 300;
        let segs: Vec<i32> = (0..t).map(|i| if i < 70 { 0 } else if i < 200 { 1 } else { 2 }).collect();
        let (q, k, v, dout) = (vec(t * nh * hd), vec(t * nkv * hd), vec(t * nkv * hd), vec(t * nh * hd));
        let (_, seg_start) = segment_layout_prefix(t, Some(&segs), 70).unwrap();
        let (x, shape) = (Qkv { q: &q, k: &k, v: &v }, AttentionShape { prefix: 70, ..AttentionShape::segments(&seg_start, nh, nkv, hd) });
        let run = |dtype: MatmulDtype, limit: usize| {
            let (mut out, mut lse) = (vec![0f32; t * nh * hd], vec![0f32; t * nh]);
            attention_forward_prefix(&mut out, &mut lse, x, shape, dtype);
            let (mut dq, mut dk, mut dv) = (vec![0f32; t * nh * hd], vec![0f32; t * nkv * hd], vec![0f32; t * nkv * hd]);
            attention_backward_keep(QkvGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv }, &dout, x, &out, &lse, shape, dtype, limit);
            [out, lse, dq, dk, dv]
        };
        let reference = run(MatmulDtype::F32, usize::MAX);
        for limit in [usize::MAX, 0] {
            let got = run(MatmulDtype::Bf16, limit);
            for (name, a, b) in ["out", "lse", "dq", "dk", "dv"].iter().zip(&got).zip(&reference).map(|((n, a), b)| (n, a, b)) {
                let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(scale > 0.0 && err <= 2e-2 * scale, "{name} (keep limit {limit}): {err} from f32 (scale {scale})");
                assert!(err > 0.0, "{name}: the bits of f32, so the products were not rounded");
            }
        }
    }

    /// Naive attention (f64) under segments, a shared prefix and a sliding window: every (i, j)
    /// pair tested one by one. Returns out and d q, d k, d v for the output gradient `dout`.
    fn naive_attention(x: Qkv, dout: &[f32], shape: AttentionShape) -> [Vec<f32>; 4] {
        let (Qkv { q, k, v }, AttentionShape { seg_start, prefix, window, n_heads: nh, n_kv_heads: nkv, head_dim: hd }) = (x, shape);
        let t = seg_start.len();
        let (qw, kw, group) = (nh * hd, nkv * hd, nh / nkv);
        let scale = 1.0 / (hd as f64).sqrt();
        let (mut out, mut dq, mut dk, mut dv) = (vec![0f64; t * qw], vec![0f64; t * qw], vec![0f64; t * kw], vec![0f64; t * kw]);
        let sees = |i: usize, j: usize| {
            let allowed = j <= i && (seg_start[j] == seg_start[i] || (prefix > 0 && j < prefix && seg_start[i] >= prefix));
            allowed && in_window(seg_start, prefix, window, i, j)
        };
        for h in 0..nh {
            let g = h / group;
            for i in 0..t {
                let js: Vec<usize> = (0..t).filter(|&j| sees(i, j)).collect();
                let dot = |a: &[f32], ao: usize, b: &[f32], bo: usize| (0..hd).map(|d| a[ao + d] as f64 * b[bo + d] as f64).sum::<f64>();
                let sc: Vec<f64> = js.iter().map(|&j| scale * dot(q, i * qw + h * hd, k, j * kw + g * hd)).collect();
                let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
                let p: Vec<f64> = sc.iter().map(|x| (x - mx).exp() / z).collect();
                for (&j, &pj) in js.iter().zip(&p) {
                    for d in 0..hd {
                        out[i * qw + h * hd + d] += pj * v[j * kw + g * hd + d] as f64;
                    }
                }
                // dP_j = dout_i · v_j; dS_j = P_j (dP_j − Σ P dP)
                let dp: Vec<f64> = js.iter().map(|&j| dot(dout, i * qw + h * hd, v, j * kw + g * hd)).collect();
                let pdp: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for ((&j, &pj), &dpj) in js.iter().zip(&p).zip(&dp) {
                    let ds = pj * (dpj - pdp) * scale;
                    for d in 0..hd {
                        dq[i * qw + h * hd + d] += ds * k[j * kw + g * hd + d] as f64;
                        dk[j * kw + g * hd + d] += ds * q[i * qw + h * hd + d] as f64;
                        dv[j * kw + g * hd + d] += pj * dout[i * qw + h * hd + d] as f64;
                    }
                }
            }
        }
        [out, dq, dk, dv].map(|x| x.into_iter().map(|y| y as f32).collect())
    }

    /// A sliding window smaller than the segments (and than the prefix), on the plain and
    /// the packed (bf16 engine) attention, with both second passes of the backward, equals the
    /// naive attention that tests every pair; without segments, with segments, with a prefix.
    #[test]
    fn a_sliding_window_matches_the_naive_attention() {
        let (nh, nkv, hd) = (4, 2, 16);
        let mut rng = SplitMix64::new(17);
        let mut vec = |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.unit_nonzero() * 2.0 - 1.0) as f32).collect() };
        let t = 300;
        let segs: Vec<i32> = (0..t).map(|i| if i < 70 { 0 } else if i < 150 { 1 } else if i < 230 { 2 } else { 3 }).collect();
        let (q, k, v, dout) = (vec(t * nh * hd), vec(t * nkv * hd), vec(t * nkv * hd), vec(t * nh * hd));
        for (seg, prefix, window) in [(None, 0, 33), (None, 0, 200), (Some(&segs), 0, 21), (Some(&segs), 70, 50), (Some(&segs), 70, 95), (Some(&segs), 70, 1)] {
            let (_, seg_start) = segment_layout_prefix(t, seg.map(|s| &s[..]), prefix).unwrap();
            let (x, shape) = (Qkv { q: &q, k: &k, v: &v }, AttentionShape { prefix, window, ..AttentionShape::segments(&seg_start, nh, nkv, hd) });
            let want = naive_attention(x, &dout, shape);
            for (dtype, tol) in [(MatmulDtype::F32, 1e-5), (MatmulDtype::Bf16, 2e-2)] {
                for limit in [usize::MAX, 0] {
                    let (mut out, mut lse) = (vec![0f32; t * nh * hd], vec![0f32; t * nh]);
                    attention_forward_prefix(&mut out, &mut lse, x, shape, dtype);
                    let (mut dq, mut dk, mut dv) = (vec![0f32; t * nh * hd], vec![0f32; t * nkv * hd], vec![0f32; t * nkv * hd]);
                    attention_backward_keep(QkvGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv }, &dout, x, &out, &lse, shape, dtype, limit);
                    for (name, a, b) in [("out", &out, &want[0]), ("dq", &dq, &want[1]), ("dk", &dk, &want[2]), ("dv", &dv, &want[3])] {
                        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                        let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                        // (a window of 1: each query sees itself only, d q and d k are 0 up to rounding)
                        assert!(err <= tol * scale.max(1.0), "window {window}, prefix {prefix}, {dtype:?}, keep limit {limit}: {name} off by {err} (scale {scale})");
                    }
                }
            }
        }
    }

    /// The packed path computes what the per-product path computes (the same rounded operands,
    /// sums grouped differently): outputs, lse and gradients within 1e-5 of their scale (6e-8
    /// measured), on
    /// segments and a shared prefix that end off the 32-grain and off the 128-query blocks,
    /// grouped heads (3 per key/value head), both second passes of the backward.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_attention_matches_the_per_product_path() {
        if crate::bf16mm::engine().is_none() {
            eprintln!("packed_attention_matches_the_per_product_path: skipped, this CPU has no bf16 engine");
            return;
        }
        let (nh, nkv, hd) = (6, 2, 64);
        let mut rng = SplitMix64::new(21);
        let mut vec = |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.unit_nonzero() * 2.0 - 1.0) as f32).collect() };
        let t = 437;
        let segs: Vec<i32> = (0..t as i32).map(|i| if i < 77 { 0 } else if i < 181 { 1 } else if i < 300 { 2 } else { 3 }).collect();
        let (q, k, v, dout) = (vec(t * nh * hd), vec(t * nkv * hd), vec(t * nkv * hd), vec(t * nh * hd));
        for (seg, prefix) in [(None, 0), (Some(&segs), 0), (Some(&segs), 77)] {
            let (_, seg_start) = segment_layout_prefix(t, seg.map(|s| &s[..]), prefix).unwrap();
            let (x, shape) = (Qkv { q: &q, k: &k, v: &v }, AttentionShape { prefix, ..AttentionShape::segments(&seg_start, nh, nkv, hd) });
            let run = |per_product: bool, limit: usize| {
                PER_PRODUCT.set(per_product);
                let (mut out, mut lse) = (vec![f32::NAN; t * nh * hd], vec![0f32; t * nh]);
                attention_forward_prefix(&mut out, &mut lse, x, shape, MatmulDtype::Bf16);
                let (mut dq, mut dk, mut dv) = (vec![0f32; t * nh * hd], vec![0f32; t * nkv * hd], vec![0f32; t * nkv * hd]);
                attention_backward_keep(QkvGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv }, &dout, x, &out, &lse, shape, MatmulDtype::Bf16, limit);
                PER_PRODUCT.set(false);
                [out, lse, dq, dk, dv]
            };
            for limit in [usize::MAX, 0] {
                let (want, got) = (run(true, limit), run(false, limit));
                for (name, a, b) in ["out", "lse", "dq", "dk", "dv"].iter().zip(&got).zip(&want).map(|((n, a), b)| (n, a, b)) {
                    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                    assert!(scale > 0.0 && err <= 1e-5 * scale, "prefix {prefix}, segments {}, keep limit {limit}: {name} differs by {err} (scale {scale})", seg.is_some());
                }
            }
        }
    }

    /// The attention of one 4096-token row of SmolLM2-135M's shape (9 query heads, 3 key/value
    /// heads, hd 64), forward and backward, on both paths:
    /// `cargo test --release -p coa-model --lib packed_attention_speed -- --ignored --nocapture`
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore = "a measurement: run alone on a quiet machine"]
    fn packed_attention_speed() {
        if crate::bf16mm::engine().is_none() {
            eprintln!("packed_attention_speed: skipped, this CPU has no bf16 engine");
            return;
        }
        let (nh, nkv, hd, t) = (9, 3, 64, 4096);
        let mut rng = SplitMix64::new(3);
        let mut vec = |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.unit_nonzero() * 2.0 - 1.0) as f32).collect() };
        let (q, k, v, dout) = (vec(t * nh * hd), vec(t * nkv * hd), vec(t * nkv * hd), vec(t * nh * hd));
        let (_, seg_start) = segment_layout_prefix(t, None, 0).unwrap();
        let (x, shape) = (Qkv { q: &q, k: &k, v: &v }, AttentionShape::segments(&seg_start, nh, nkv, hd));
        let (mut out, mut lse) = (vec![0f32; t * nh * hd], vec![0f32; t * nh]);
        let (mut dq, mut dk, mut dv) = (vec![0f32; t * nh * hd], vec![0f32; t * nkv * hd], vec![0f32; t * nkv * hd]);
        for rep in 0..3 {
            // (per product, keeping P and dS from pass 1 for pass 2)
            for (per_product, keep) in [(true, true), (false, true), (false, false)] {
                PER_PRODUCT.set(per_product);
                let t0 = std::time::Instant::now();
                attention_forward_prefix(&mut out, &mut lse, x, shape, MatmulDtype::Bf16);
                let t1 = std::time::Instant::now();
                let keep_limit = if keep { usize::MAX } else { 0 };
                attention_backward_keep(QkvGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv }, &dout, x, &out, &lse, shape, MatmulDtype::Bf16, keep_limit);
                let t2 = std::time::Instant::now();
                PER_PRODUCT.set(false);
                let name = match (per_product, keep) {
                    (true, _) => "per product",
                    (false, true) => "packed once, P and dS kept",
                    (false, false) => "packed once, P and dS recomputed",
                };
                eprintln!("rep {rep} {name}: forward {:.1} ms, backward {:.1} ms", (t1 - t0).as_secs_f64() * 1e3, (t2 - t1).as_secs_f64() * 1e3);
            }
        }
    }
}
