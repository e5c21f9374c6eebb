//! Incremental decoding with a KV cache, batched over sequences at different positions.
//!
//! A [`KvCache`] holds, per layer, the rotated keys and the values of up to `n_slots` sequences
//! of up to `max_len` tokens each (`[n_slots, Hk, cap, hd]`, `cap` = `max_len` rounded up to
//! [`KEY_TILE`]: one head's keys and values are contiguous, so a decode step streams them;
//! a head's keys in tiles of 16 keys × hd, [`crate::simd::key_at`], so that its scores need no
//! horizontal sums; allocated once, untouched pages are never committed). A *slot* is one
//! sequence; its length grows as tokens are fed.
//!
//! [`Model::extend`] is the one forward: it appends any number of new tokens to any number of
//! distinct slots in one call (a prompt prefill, a one-token decode step, an observation appended
//! after a tool call: all the same), runs every linear layer once over all the new rows (through
//! the model's weights packed once on its first decode call, the operand layout of the GEMM
//! kernel, so a step streams each weight once and packs nothing), attention in parallel against
//! the slot's cached keys (per query head and block of queries for a multi-token item, per
//! key/value head for a one-token item: the query heads that share it read its keys once), and
//! returns the logits of the last new position of each slot.
//! [`Model::prefill`] and [`Model::decode_step`] are its two common shapes.
//!
//! The result equals [`Model::logits`] on the whole sequence (same ops, the linear layers' bits
//! identical, same softmax kernel; only the blocking of the attention sums differs): the tests
//! hold it to 1e-5 relative. Every parallel task writes its own rows and heads, so results do not
//! depend on the thread count.

// `let p = p;` inside closures makes them capture the Send pointer wrappers whole.
#![allow(clippy::redundant_locals)]

use anyhow::{bail, Result};
use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::model::Model;
use crate::ops::{self, SendPtr};
use crate::params::layout;
use crate::quant::DecodeDtype;
use crate::simd::{key_at, KvElem, KvRows, KEY_TILE};
use crate::sgemm::PackedB;

/// Query rows per attention task of a multi-token item (a prompt).
const ATT_BLOCK: usize = 64;


/// One layer's cached keys or values, as stored: f32, or bf16 (half the bytes a decode step's
/// attention reads; each value rounded to nearest even when stored, widened exactly when read).
#[derive(Clone, Debug)]
enum KvStore {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl KvStore {
    fn zeros(dtype: DecodeDtype, n: usize) -> KvStore {
        match dtype {
            DecodeDtype::Bf16 => KvStore::Bf16(vec![0; n]),
            _ => KvStore::F32(vec![0.0; n]),
        }
    }

    /// Values `at..at + n`.
    fn rows(&self, at: usize, n: usize) -> KvRows<'_> {
        match self {
            KvStore::F32(x) => KvRows::F32(&x[at..at + n]),
            KvStore::Bf16(x) => KvRows::Bf16(&x[at..at + n]),
        }
    }

    /// Stores `xs` at `at`, `at + stride`, ... (a value row: stride 1; a key: [`KEY_TILE`]).
    fn set(&mut self, at: usize, stride: usize, xs: &[f32]) {
        let slots = at..at + (xs.len() - 1) * stride + 1;
        match self {
            KvStore::F32(x) => x[slots].iter_mut().step_by(stride).zip(xs).for_each(|(y, &v)| *y = v),
            KvStore::Bf16(x) => x[slots].iter_mut().step_by(stride).zip(xs).for_each(|(y, &v)| *y = crate::quant::bf16_bits(v)),
        }
    }

    fn copy_within(&mut self, src: std::ops::Range<usize>, dst: usize) {
        match self {
            KvStore::F32(x) => x.copy_within(src, dst),
            KvStore::Bf16(x) => x.copy_within(src, dst),
        }
    }
}

/// Keys and values of up to `n_slots` sequences (see the module docs).
#[derive(Clone, Debug)]
pub struct KvCache {
    n_layers: usize,
    n_slots: usize,
    max_len: usize,
    /// Positions per head: `max_len` rounded up to whole key tiles.
    cap: usize,
    n_kv: usize,
    hd: usize,
    /// How keys and values are stored (f32 or bf16).
    dtype: DecodeDtype,
    /// Per layer: rotated keys `[n_slots, Hk, cap / KEY_TILE, hd, KEY_TILE]`.
    k: Vec<KvStore>,
    /// Per layer: values `[n_slots, Hk, cap, hd]`.
    v: Vec<KvStore>,
    /// Tokens held by each slot.
    len: Vec<usize>,
}

impl KvCache {
    /// A cache for `n_slots` sequences of at most `max_len` tokens of a model with `config`, in
    /// f32.
    pub fn new(config: &ModelConfig, n_slots: usize, max_len: usize) -> Result<KvCache> {
        KvCache::new_as(config, n_slots, max_len, DecodeDtype::F32)
    }

    /// [`KvCache::new`] storing keys and values as `dtype`: f32, or bf16 (an error for int8).
    pub fn new_as(config: &ModelConfig, n_slots: usize, max_len: usize, dtype: DecodeDtype) -> Result<KvCache> {
        config.validate()?;
        if !matches!(dtype, DecodeDtype::F32 | DecodeDtype::Bf16) {
            bail!("a KV cache holds f32 or bf16 keys and values, not {dtype}");
        }
        if n_slots == 0 || max_len == 0 {
            bail!("a KV cache needs at least one slot and one position (got {n_slots} slots of {max_len} tokens)");
        }
        let (n_kv, hd) = (config.num_key_value_heads, config.head_dim());
        let cap = max_len.checked_next_multiple_of(KEY_TILE).unwrap_or(usize::MAX);
        let per_layer = n_slots
            .checked_mul(cap)
            .and_then(|x| x.checked_mul(n_kv * hd))
            .filter(|&x| x.checked_mul(2 * 4 * config.num_hidden_layers).is_some())
            .ok_or_else(|| anyhow::anyhow!("KV cache of {n_slots} slots x {max_len} tokens is too large"))?;
        let n_layers = config.num_hidden_layers;
        Ok(KvCache {
            n_layers,
            n_slots,
            max_len,
            cap,
            n_kv,
            hd,
            dtype,
            k: (0..n_layers).map(|_| KvStore::zeros(dtype, per_layer)).collect(),
            v: (0..n_layers).map(|_| KvStore::zeros(dtype, per_layer)).collect(),
            len: vec![0; n_slots],
        })
    }

    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Most tokens a slot can hold.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Tokens held by `slot` (its next position).
    pub fn len(&self, slot: usize) -> usize {
        self.len[slot]
    }

    /// Whether `slot` holds no token.
    pub fn is_empty(&self, slot: usize) -> bool {
        self.len[slot] == 0
    }

    /// Empties `slot` (its memory is reused by the next sequence).
    pub fn reset(&mut self, slot: usize) {
        self.len[slot] = 0;
    }

    /// Makes `to` hold the first `n` tokens of `from` (keys and values copied, `to`'s length set
    /// to `n`): sequences that share a prefix (one prompt sampled several times) compute it once.
    pub fn copy_prefix(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        if from >= self.n_slots || to >= self.n_slots {
            bail!("copy_prefix: slot {} is out of range (the cache has {} slots)", from.max(to), self.n_slots);
        }
        if n > self.len[from] {
            bail!("copy_prefix: slot {from} holds {} tokens, not {n}", self.len[from]);
        }
        if from != to {
            let (head, hd) = (self.cap * self.hd, self.hd);
            // Values: the first n rows. Keys: the whole tiles, then the first n mod 16 keys of
            // each dimension of the last one.
            let (whole, rest) = (n / KEY_TILE * KEY_TILE, n % KEY_TILE);
            for gk in 0..self.n_kv {
                let (src, dst) = ((from * self.n_kv + gk) * head, (to * self.n_kv + gk) * head);
                for layer in &mut self.v {
                    layer.copy_within(src..src + n * hd, dst);
                }
                for layer in &mut self.k {
                    layer.copy_within(src..src + whole * hd, dst);
                    for d in 0..hd * (rest > 0) as usize {
                        let at = key_at(whole, d, hd);
                        layer.copy_within(src + at..src + at + rest, dst + at);
                    }
                }
            }
        }
        self.len[to] = n;
        Ok(())
    }

    /// Bytes allocated (keys and values of every layer).
    pub fn bytes(&self) -> usize {
        let size = if self.dtype == DecodeDtype::Bf16 { 2 } else { 4 };
        2 * self.n_layers * self.n_slots * self.cap * self.n_kv * self.hd * size
    }

    /// How keys and values are stored.
    pub fn dtype(&self) -> DecodeDtype {
        self.dtype
    }

    fn check_model(&self, c: &ModelConfig) -> Result<()> {
        if c.num_hidden_layers != self.n_layers || c.num_key_value_heads != self.n_kv || c.head_dim() != self.hd {
            bail!(
                "KV cache made for {} layers x {} kv heads x head_dim {}, the model has {} x {} x {}",
                self.n_layers,
                self.n_kv,
                self.hd,
                c.num_hidden_layers,
                c.num_key_value_heads,
                c.head_dim()
            );
        }
        Ok(())
    }
}

/// One attention task: rows `[r0, r0 + nb)` of the new rows (absolute positions `p0..`) of the
/// slot `slot`, against its cached keys: the query heads sharing key/value head `h`, of a
/// multi-token item (sgemm per query head over the keys widened once) or of a one-token item
/// (`simd::attend_group`).
struct AttTask {
    slot: usize,
    h: usize,
    /// First new row of the block (index into the batch's rows).
    r0: usize,
    /// Rows in the block.
    nb: usize,
    /// Absolute position of row r0.
    p0: usize,
    /// A one-token item.
    single: bool,
}

/// `out[R,O] = x[R,I] @ w[O,I]ᵀ + b` through a prepacked weight, in parallel over blocks of
/// output columns (each reads its part of the weight once for all rows). The same bits as
/// `ops::linear_forward`, whatever the rows or the threads.
pub(crate) fn linear_packed(out: &mut [f32], x: &[f32], w: &PackedB, b: Option<&[f32]>, r: usize, i: usize, o: usize) {
    debug_assert!(w.n() == o);
    linears_packed(&mut [(out, w, b)], x, r, i);
}

/// Several linear layers of one input, `outs[t].0[R, O_t] = x[R,I] @ w_t[O_t,I]ᵀ + b_t` (a
/// layer's q, k and v; its gate and up): the input packed once and one parallel loop over the
/// column blocks of all of them, so a decode step waits for one loop, not three.
pub(crate) fn linears_packed(outs: &mut [(&mut [f32], &PackedB, Option<&[f32]>)], x: &[f32], r: usize, i: usize) {
    debug_assert!(x.len() == r * i && outs.iter().all(|(out, w, _)| out.len() == r * w.n()));
    let panels: usize = outs.iter().map(|(_, w, _)| w.n().div_ceil(w.panel())).sum();
    // Four tasks per thread (balance), whole panels each.
    let per = panels.div_ceil(4 * rayon::current_num_threads().max(1)).max(1);
    let xa = outs[0].1.pack_a(r, x);
    // (output, first column, last column) per task, in output order.
    let mut tasks = Vec::new();
    for (t, (_, w, _)) in outs.iter().enumerate() {
        let cols = per * w.panel();
        tasks.extend((0..w.n().div_ceil(cols)).map(|c| (t, c * cols, ((c + 1) * cols).min(w.n()))));
    }
    let targets: Vec<(SendPtr, &PackedB, Option<&[f32]>)> = outs.iter_mut().map(|(out, w, b)| (SendPtr(out.as_mut_ptr()), &**w, *b)).collect();
    tasks.into_par_iter().for_each(|(t, j0, j1)| {
        let (outp, w, b) = &targets[t];
        let o = w.n();
        // SAFETY: output t holds r·o values; its columns j0..j1 belong to this task alone.
        unsafe { w.gemm_cols(&xa, outp.0, j0, j1) };
        if let Some(b) = b {
            for row in 0..r {
                // SAFETY: as above.
                let cols = unsafe { std::slice::from_raw_parts_mut(outp.0.add(row * o + j0), j1 - j0) };
                cols.iter_mut().zip(&b[j0..j1]).for_each(|(y, bb)| *y += bb);
            }
        }
    });
}

/// Keys stored in tiles (`kt`, whole tiles covering `rows.len() / hd` keys) as rows `[nk, hd]`.
fn untile_keys<T: KvElem>(kt: &[T], rows: &mut [f32], hd: usize) {
    for (tile, keys) in kt.chunks_exact(KEY_TILE * hd).zip(rows.chunks_mut(KEY_TILE * hd)) {
        for (l, row) in keys.chunks_exact_mut(hd).enumerate() {
            row.iter_mut().enumerate().for_each(|(d, x)| *x = tile[d * KEY_TILE + l].to_f32());
        }
    }
}

impl Model {
    /// Appends `ids` to `slot` at its current position (a prompt, or more tokens such as an
    /// observation) and returns the logits `[V]` of the last of them.
    pub fn prefill(&self, cache: &mut KvCache, slot: usize, ids: &[u32]) -> Result<Vec<f32>> {
        self.extend(cache, &[(slot, ids)])
    }

    /// One token for each of `slots` (distinct), each at its own position: logits `[B, V]`.
    pub fn decode_step(&self, cache: &mut KvCache, slots: &[usize], tokens: &[u32]) -> Result<Vec<f32>> {
        if slots.len() != tokens.len() {
            bail!("decode_step: {} slots but {} tokens", slots.len(), tokens.len());
        }
        let items: Vec<(usize, &[u32])> = slots.iter().zip(tokens).map(|(&s, t)| (s, std::slice::from_ref(t))).collect();
        self.extend(cache, &items)
    }

    /// Appends `ids` to each `slot` of `items` (slots distinct, every `ids` non-empty) and returns
    /// the logits `[items, V]` of the last new position of each, in item order.
    pub fn extend(&self, cache: &mut KvCache, items: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        self.extend_impl(cache, items, false)
    }

    /// As [`Model::extend`], but the logits `[Σ new tokens, V]` of every new position, in item
    /// order (row r predicts the token after new token r).
    pub fn extend_all_logits(&self, cache: &mut KvCache, items: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        self.extend_impl(cache, items, true)
    }

    fn extend_impl(&self, cache: &mut KvCache, items: &[(usize, &[u32])], all: bool) -> Result<Vec<f32>> {
        if self.lora.is_some() {
            anyhow::bail!("decoding reads the linear weights without the LoRA adapter: merge it first (Model::merge_lora; Model::load merges)");
        }
        // A call runs one parallel loop per layer and op (~240 for a decode step of a 30-layer
        // model). From a thread outside rayon's pool each would be a job injected into the pool
        // and a wake-up of the blocked caller; run the whole call on a worker instead, whose
        // loops the other workers pick up while they still spin.
        if rayon::current_thread_index().is_none() {
            return rayon::scope(|_| self.extend_impl(cache, items, all));
        }
        let c = &self.config;
        cache.check_model(c)?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut seen = vec![false; cache.n_slots];
        for &(slot, ids) in items {
            if slot >= cache.n_slots {
                bail!("slot {slot} is out of range (the cache has {} slots)", cache.n_slots);
            }
            if std::mem::replace(&mut seen[slot], true) {
                bail!("slot {slot} appears twice in one call");
            }
            if ids.is_empty() {
                bail!("slot {slot}: no tokens to append");
            }
            if cache.len[slot] + ids.len() > cache.max_len {
                bail!(
                    "slot {slot}: {} + {} tokens exceed the cache's {} positions",
                    cache.len[slot],
                    ids.len(),
                    cache.max_len
                );
            }
            self.check_ids(ids)?;
        }
        let lay = layout(c);
        let (d, hd, nh, nkv, inter, v) =
            (c.hidden_size, c.head_dim(), c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.vocab_size);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let eps = c.rms_norm_eps as f32;
        let p = |i: usize| self.params.tensors[i].data.as_slice();
        let pb = |i: Option<usize>| i.map(|i| self.params.tensors[i].data.as_slice());

        // Rows: the new tokens of the multi-token items (prompts, observations), then those of the
        // one-token items (decode steps). Every linear layer takes all of them at once, and each
        // output is the same sum in the same order whatever the other rows (the packed kernel's
        // contract), so a sequence's logits do not depend on what else shares the batch.
        let r: usize = items.iter().map(|(_, ids)| ids.len()).sum();
        let order: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].1.len() > 1)
            .chain((0..items.len()).filter(|&i| items[i].1.len() == 1))
            .collect();
        let mut ids_all = Vec::with_capacity(r);
        let mut positions = Vec::with_capacity(r);
        // Per item (in item order): (slot, first row, rows, first position)
        let mut spans = vec![(0usize, 0usize, 0usize, 0usize); items.len()];
        for &it in &order {
            let (slot, ids) = items[it];
            let p0 = cache.len[slot];
            spans[it] = (slot, ids_all.len(), ids.len(), p0);
            ids_all.extend_from_slice(ids);
            positions.extend((p0..p0 + ids.len()).map(|x| x as u32));
        }
        let (cos, sin) = c.rope_tables(&positions);
        let mut tasks = Vec::new();
        for &(slot, r0, n, p0) in &spans {
            if n == 1 {
                tasks.extend((0..nkv).map(|h| AttTask { slot, h, r0, nb: 1, p0, single: true }));
                continue;
            }
            for h in 0..nkv {
                for b0 in (0..n).step_by(ATT_BLOCK) {
                    tasks.push(AttTask { slot, h, r0: r0 + b0, nb: ATT_BLOCK.min(n - b0), p0: p0 + b0, single: false });
                }
            }
        }
        // Every row through the weights packed once (where the CPU has a packed kernel), else
        // through `ops::linear_forward`: the same bits either way. `lin` takes the layers that
        // share the input `x` as (output, weight, bias, outputs).
        let packed = self.decode_weights();
        let lin = |x: &[f32], i: usize, layers: &mut [(&mut [f32], usize, Option<usize>, usize)]| match packed {
            Some(dw) => {
                let mut outs: Vec<_> =
                    layers.iter_mut().map(|(out, w, b, _)| (&mut **out, dw.packed[*w].as_ref().expect("a linear weight is packed"), pb(*b))).collect();
                linears_packed(&mut outs, x, r, i)
            }
            None => layers.iter_mut().for_each(|(out, w, b, o)| ops::linear_forward(out, x, p(*w), pb(*b), (r, i, *o))),
        };

        let mut x = vec![0f32; r * d];
        ops::embedding_forward(&mut x, &ids_all, p(lay.embed), d);
        // The embedding table is a weight like the others: its rows in the decoding format.
        if let Some(dw) = packed {
            dw.dtype.round_weight(&mut x, d);
        }
        let mut rstd = vec![0f32; r];
        let mut h = vec![0f32; r * d];
        let mut q = vec![0f32; r * qd];
        let mut k = vec![0f32; r * kvd];
        let mut vv = vec![0f32; r * kvd];
        let mut att = vec![0f32; r * qd];
        let mut y = vec![0f32; r * d];
        let mut g = vec![0f32; r * inter];
        let mut u = vec![0f32; r * inter];
        let mut a = vec![0f32; r * inter];
        // Qwen3's q/k norm: q, k before it, and its rstd (unused elsewhere).
        let (qk_norm, windows) = (c.qk_norm(), c.layer_windows()?);
        let (mut qraw, mut kraw) = if qk_norm { (vec![0f32; r * qd], vec![0f32; r * kvd]) } else { (Vec::new(), Vec::new()) };
        let (mut rstdq, mut rstdk) = if qk_norm { (vec![0f32; r * nh], vec![0f32; r * nkv]) } else { (Vec::new(), Vec::new()) };
        let group = nh / nkv;
        let scale = 1.0 / (hd as f32).sqrt();
        // Head `gk` of slot `s` starts at `(s·Hk + gk)·cap·hd`: its values in rows of hd, its
        // keys in tiles (`key_at`).
        let slot_stride = cache.cap * kvd;
        let head_stride = cache.cap * hd;
        for (l, li) in lay.layers.iter().enumerate() {
            ops::rmsnorm_forward(&mut h, &mut rstd, &x, p(li.ln1), eps, d);
            lin(&h, d, &mut [(&mut q, li.wq, li.bq, qd), (&mut k, li.wk, li.bk, kvd), (&mut vv, li.wv, li.bv, kvd)]);
            if let (Some(qn), Some(kn)) = (li.qn, li.kn) {
                std::mem::swap(&mut q, &mut qraw);
                std::mem::swap(&mut k, &mut kraw);
                ops::rmsnorm_forward(&mut q, &mut rstdq, &qraw, p(qn), eps, hd);
                ops::rmsnorm_forward(&mut k, &mut rstdk, &kraw, p(kn), eps, hd);
            }
            let window = windows[l];
            ops::rope_forward(&mut q, &cos, &sin, nh, hd);
            ops::rope_forward(&mut k, &cos, &sin, nkv, hd);
            // Store the new keys and values in the cache.
            let (kc, vc) = (&mut cache.k[l], &mut cache.v[l]);
            for &(slot, r0, n, p0) in &spans {
                for gk in 0..nkv {
                    let head = slot * slot_stride + gk * head_stride;
                    for i in 0..n {
                        let (dst, src) = (head + (p0 + i) * hd, (r0 + i) * kvd + gk * hd);
                        vc.set(dst, 1, &vv[src..src + hd]);
                        // Dimension d of a key lies KEY_TILE values after dimension d - 1.
                        kc.set(head + key_at(p0 + i, 0, hd), KEY_TILE, &k[src..src + hd]);
                    }
                }
            }
            // Attention of the new rows against everything their slot holds.
            let (kc, vc) = (&cache.k[l], &cache.v[l]);
            let outp = SendPtr(att.as_mut_ptr());
            let qref = &q;
            tasks.par_iter().for_each_init(|| (Vec::new(), Vec::new(), Vec::new()), |(s, rows, vrows): &mut (Vec<f32>, Vec<f32>, Vec<f32>), t| {
                let outp = outp;
                // Keys 0..p0+nb of the slot; row i (position p0+i) sees keys 0..=p0+i, the last
                // `window` of them under a sliding window (the cache keeps them all).
                let nk = t.p0 + t.nb;
                let first_key = |p: usize| if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
                if t.single {
                    // Query heads h·group.. of row r0 share key/value head h; they are contiguous.
                    let kbase = t.slot * slot_stride + t.h * head_stride;
                    let (q0, w) = (t.r0 * qd + t.h * group * hd, group * hd);
                    // SAFETY: row r0, heads h·group..(h+1)·group of `att` belong to this task alone.
                    let o = unsafe { std::slice::from_raw_parts_mut(outp.0.add(q0), w) };
                    let (kh, vh) = (kc.rows(kbase, nk.div_ceil(KEY_TILE) * KEY_TILE * hd), vc.rows(kbase, nk * hd));
                    let shape = crate::simd::GroupShape { group, lo: first_key(t.p0), nk, hd, scale };
                    crate::simd::attend_group(o, &qref[q0..q0 + w], kh, vh, shape, s);
                    return;
                }
                let kbase = t.slot * slot_stride + t.h * head_stride;
                s.resize(t.nb * nk, 0.0);
                // The head's first nk keys as rows [nk, hd] in f32, the GEMM's operand; its
                // values too where they are stored in bf16: once for the group's query heads.
                rows.resize(nk * hd, 0.0);
                match kc.rows(kbase, nk.div_ceil(KEY_TILE) * KEY_TILE * hd) {
                    KvRows::F32(kt) => untile_keys(kt, rows, hd),
                    KvRows::Bf16(kt) => untile_keys(kt, rows, hd),
                }
                let vbase = match vc.rows(kbase, nk * hd) {
                    KvRows::F32(v) => v.as_ptr(),
                    KvRows::Bf16(v) => {
                        vrows.clear();
                        vrows.extend(v.iter().map(|x| x.to_f32()));
                        vrows.as_ptr()
                    }
                };
                for h in t.h * group..(t.h + 1) * group {
                    // SAFETY: reads stay inside q (rows r0..r0+nb, head h) and `rows` (the slot's first
                    // nk keys of kv head t.h); the written block of `att` (rows r0..r0+nb, the group's
                    // heads) belongs to this task alone.
                    unsafe {
                        matrixmultiply::sgemm(
                            t.nb,
                            hd,
                            nk,
                            1.0,
                            qref.as_ptr().add(t.r0 * qd + h * hd),
                            qd as isize,
                            1,
                            rows.as_ptr(),
                            1,
                            hd as isize,
                            0.0,
                            s.as_mut_ptr(),
                            nk as isize,
                            1,
                        );
                    }
                    for i in 0..t.nb {
                        let row = &mut s[i * nk..(i + 1) * nk];
                        let (lo, hi) = (first_key(t.p0 + i), t.p0 + i + 1);
                        row[..lo].iter_mut().for_each(|x| *x = 0.0);
                        row[hi..].iter_mut().for_each(|x| *x = 0.0);
                        let valid = &mut row[lo..hi];
                        let mx = crate::simd::max(valid) * scale;
                        let sum = crate::simd::exp_affine_sum(valid, scale, mx);
                        crate::simd::scale(valid, 1.0 / sum);
                    }
                    unsafe {
                        matrixmultiply::sgemm(
                            t.nb,
                            nk,
                            hd,
                            1.0,
                            s.as_ptr(),
                            nk as isize,
                            1,
                            vbase,
                            hd as isize,
                            1,
                            0.0,
                            outp.0.add(t.r0 * qd + h * hd),
                            qd as isize,
                            1,
                        );
                    }
                }
            });
            lin(&att, qd, &mut [(&mut y, li.wo, li.bo, d)]);
            x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
            ops::rmsnorm_forward(&mut h, &mut rstd, &x, p(li.ln2), eps, d);
            lin(&h, d, &mut [(&mut g, li.wg, li.bg, inter), (&mut u, li.wu, li.bu, inter)]);
            ops::swiglu_forward(&mut a, &g, &u);
            lin(&a, inter, &mut [(&mut y, li.wd, li.bd, d)]);
            x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        }
        for &(slot, _, n, _) in &spans {
            cache.len[slot] += n;
        }
        // Final norm and head on the rows asked for (same row order: multi-token items first).
        let sel: Vec<usize> = if all {
            (0..r).collect()
        } else {
            order.iter().map(|&it| spans[it].1 + spans[it].2 - 1).collect()
        };
        let xs: Vec<f32> = sel.iter().flat_map(|&row| x[row * d..(row + 1) * d].iter().copied()).collect();
        let rows = sel.len();
        let mut rs = vec![0f32; rows];
        let mut hf = vec![0f32; rows * d];
        ops::rmsnorm_forward(&mut hf, &mut rs, &xs, p(lay.norm), eps, d);
        let mut z = vec![0f32; rows * v];
        let head = lay.lm_head.unwrap_or(lay.embed);
        match packed {
            Some(dw) => linear_packed(&mut z, &hf, dw.packed[head].as_ref().expect("the head is packed"), None, rows, d, v),
            None => ops::linear_forward(&mut z, &hf, p(head), None, (rows, d, v)),
        }
        // Back to item order (already so when no one-token item precedes a multi-token one).
        if order.iter().enumerate().all(|(k, &it)| k == it) {
            return Ok(z);
        }
        let mut logits = vec![0f32; rows * v];
        let mut at = 0;
        let mut dst_of_item = vec![0usize; items.len()];
        for (it, &(_, _, n, _)) in spans.iter().enumerate() {
            dst_of_item[it] = at;
            at += if all { n } else { 1 };
        }
        let mut src = 0;
        for &it in &order {
            let n = if all { spans[it].2 } else { 1 };
            let dst = dst_of_item[it];
            logits[dst * v..(dst + n) * v].copy_from_slice(&z[src * v..(src + n) * v]);
            src += n;
        }
        Ok(logits)
    }
}

/// GFLOP/s (the best of many calls: a busy machine disturbs the median) of a linear layer's
/// product on SmolLM2-135M's shapes at ROWS rows (default 1, 16, 48): `ops::linear_forward`
/// (packs the weight on every call, as training does) and `decode::linear_packed` (the weight
/// packed once, as decoding does); both give the same bits:
/// `ROWS="16 48" cargo test -p coa-model --lib linear_speed -- --ignored --nocapture`
#[cfg(test)]
#[test]
#[ignore = "a measurement: run alone on a quiet machine"]
fn linear_speed() {
    let rows: Vec<usize> = std::env::var("ROWS")
        .map_or(vec![1, 16, 48], |s| s.split_whitespace().map(|a| a.parse().expect("ROWS")).collect());
    type Rows = fn(&mut [f32], &[f32], &[f32], usize, usize, usize);
    for &r in &rows {
        for (i, o) in [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49174)] {
            let sgemm: Rows = |out, x, w, r, i, o| ops::linear_forward(out, x, w, None, (r, i, o));
            let packed: Rows = |out, x, w, r, i, o| {
                thread_local!(static PW: std::cell::RefCell<Option<((usize, usize), PackedB)>> = const { std::cell::RefCell::new(None) });
                PW.with(|pw| {
                    let mut pw = pw.borrow_mut();
                    if pw.as_ref().is_none_or(|(p, _)| *p != (w.as_ptr() as usize, o)) {
                        *pw = Some(((w.as_ptr() as usize, o), PackedB::new_as(w, o, i, crate::DecodeDtype::F32).expect("a packed kernel")));
                    }
                    linear_packed(out, x, &pw.as_ref().unwrap().1, None, r, i, o);
                })
            };
            for (name, f) in [("ops::linear_forward", sgemm as Rows), ("decode::linear_packed", packed)] {
                let x: Vec<f32> = (0..r * i).map(|k| (k % 7) as f32 * 0.1).collect();
                let w: Vec<f32> = (0..o * i).map(|k| (k % 5) as f32 * 0.1).collect();
                let mut out = vec![0f32; r * o];
                let flop = 2.0 * (r * i * o) as f64;
                let reps = (4e9 / flop).clamp(5.0, 5000.0) as usize;
                let mut best = f64::INFINITY;
                for _ in 0..reps {
                    let t0 = std::time::Instant::now();
                    f(&mut out, &x, &w, r, i, o);
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                println!("{name:21} rows {r:3} {i:5}x{o:5}: {:6.1} GFLOP/s", flop / best / 1e9);
            }
        }
    }
}
