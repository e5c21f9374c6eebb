//! Decoding on the GPU (`coa-generate policy --device cuda`): [`GpuDecoder`], the `coa_model`
//! decoder with bf16 weights and a slot KV cache (its attention launchers are in
//! [`crate::ops::decode_attention`]).

use std::sync::Arc;

use coa_model::ops::Gemm;
use coa_model::{ModelConfig, Params};
use cudarc::driver::CudaSlice;
use half::bf16;

use crate::error::{Error, Result};
use crate::gpu::{Alloc, Gpu};
use crate::layout::{check_common, Dims, FlatLayout};
use crate::ops::decode_attention::{CacheShape, KvCacheRows};
use crate::ops::gemm::{linear_fwd, Linear, LinearWeights};

/// Whether the GPU decoder can run this model: an error naming the unsupported feature otherwise.
/// (Decoding does not use the flash-attention kernels, so any even head_dim up to 256 works;
/// training, `model::check_supported`, adds the flash kernels' head_dim 64 or 128 to these.)
pub fn check_decodable(c: &ModelConfig) -> Result<()> {
    let hd = c.head_dim();
    if hd == 0 || hd % 2 != 0 || hd > 256 {
        return Err(Error(format!("GPU decoding supports an even head_dim up to 256, this model has {hd}")));
    }
    check_common(c)
}

/// The model for inference on one GPU, with a KV cache of `slots` sequences of up to `max_len`
/// positions. Everything is allocated once (R = `rows`, the new tokens one call can hold;
/// W = (Hq + 2 Hkv) hd; I = intermediate):
///
/// ```text
/// w        bf16 [total]            the weights, in the training model's fused flat layout
/// k, v     bf16 [layers][S, L, Hkv, hd]
/// x        bf16 [R, D]             the residual stream, updated in place layer by layer
/// h        bf16 [R, D]  rstd f32 [R]   RMSNorm output (qk_rstd f32 [R, Hq]: Qwen3's q/k norm)
/// qkv      bf16 [R, W]             q | k | v, q and k rotated
/// att      bf16 [R, Hq hd]   gu bf16 [R, 2I]   a bf16 [R, I]
/// last     bf16 [S, D]             the residual of each item's last new row (when not all rows are)
/// logits   f32  [S, V]             of those rows only
/// inputs   tokens, slot, pos i32 [R]; RoPE cos/sin f32 [R, hd/2] (one row per new token)
/// ```
///
/// Same semantics as `coa_model::Model::extend` on the CPU (which the policy uses there), in
/// bf16 with fp32 accumulation: logits agree to bf16 tolerance, not bit for bit.
pub struct GpuDecoder {
    pub gpu: Arc<Gpu>,
    pub config: ModelConfig,
    dims: Dims,
    flat: FlatLayout,
    slots: usize,
    max_len: usize,
    rows: usize,
    /// Positions filled per slot (host side).
    len: Vec<usize>,
    w: CudaSlice<bf16>,
    k: Vec<CudaSlice<bf16>>,
    v: Vec<CudaSlice<bf16>>,
    x: CudaSlice<bf16>,
    h: CudaSlice<bf16>,
    rstd: CudaSlice<f32>,
    /// Qwen3's q/k norm rstd [R, Hq] (unused after: decoding keeps no activations).
    qk_rstd: CudaSlice<f32>,
    /// Each layer's sliding window (0: none).
    windows: Vec<usize>,
    qkv: CudaSlice<bf16>,
    att: CudaSlice<bf16>,
    gu: CudaSlice<bf16>,
    a: CudaSlice<bf16>,
    last: CudaSlice<bf16>,
    logits: CudaSlice<f32>,
    tokens: CudaSlice<i32>,
    slot_of: CudaSlice<i32>,
    pos_of: CudaSlice<i32>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    ones: CudaSlice<bf16>,
    device_bytes: usize,
}

impl GpuDecoder {
    /// Uploads `params` as bf16 and allocates the cache and the buffers for calls of up to `rows`
    /// new tokens (longer calls are split).
    pub fn new(gpu: Arc<Gpu>, config: &ModelConfig, params: &Params, slots: usize, max_len: usize, rows: usize) -> Result<GpuDecoder> {
        check_decodable(config)?;
        if slots == 0 || max_len == 0 || rows == 0 {
            return Err(Error(format!("GpuDecoder: slots ({slots}), max_len ({max_len}) and rows ({rows}) must be positive")));
        }
        let flat = FlatLayout::of(config);
        flat.check_tensors(params)?;
        // SAFETY: every buffer and launch of the decoder uses the one stream `gpu.stream`, and
        // downloads synchronise it: nothing needs cudarc's cross-stream events.
        unsafe { gpu.ctx.disable_event_tracking() };
        let c = Dims::of(config);
        let gpu_for_alloc = Arc::clone(&gpu); // `gpu` itself moves into the decoder below
        let mut al = Alloc::new(&gpu_for_alloc, format!("allocating the GPU decoder ({slots} sequences of {max_len} positions)"), "fewer sequences: lower --batch");
        let cache = slots * max_len * c.kvd;
        let host = flat.flatten(|t| &params.tensors[t].data);
        al.count(2 * host.len());
        let w = gpu.upload_bf16(&host).map_err(|e| Error(format!("uploading the weights: {e}")))?;
        drop(host);
        let k = (0..c.layers).map(|_| al.bf16(cache)).collect::<Result<Vec<_>>>()?;
        let v = (0..c.layers).map(|_| al.bf16(cache)).collect::<Result<Vec<_>>>()?;
        let r = rows;
        let mut dec = GpuDecoder {
            x: al.bf16(r * c.d)?,
            h: al.bf16(r * c.d)?,
            rstd: al.f32(r)?,
            qk_rstd: al.f32(r * c.hq)?,
            windows: config.layer_windows().map_err(|e| Error(format!("{e:#}")))?,
            qkv: al.bf16(r * c.wqkv)?,
            att: al.bf16(r * c.qd)?,
            gu: al.bf16(r * 2 * c.inter)?,
            a: al.bf16(r * c.inter)?,
            last: al.bf16(slots * c.d)?,
            logits: al.f32(slots * c.vocab)?,
            tokens: al.i32(r)?,
            slot_of: al.i32(r)?,
            pos_of: al.i32(r)?,
            cos: al.f32(r * c.hd / 2)?,
            sin: al.f32(r * c.hd / 2)?,
            ones: al.bf16(r.max(slots))?,
            device_bytes: 0,
            gpu,
            config: config.clone(),
            dims: c,
            flat,
            slots,
            max_len,
            rows,
            len: vec![0; slots],
            w,
            k,
            v,
        };
        dec.device_bytes = al.bytes;
        let ones = vec![bf16::ONE; r.max(slots)];
        dec.gpu.stream.memcpy_htod(&ones, &mut dec.ones)?;
        Ok(dec)
    }

    pub fn n_slots(&self) -> usize {
        self.slots
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Bytes of device memory held (weights, cache, buffers; cuBLAS's workspace aside).
    pub fn device_bytes(&self) -> usize {
        self.device_bytes
    }

    /// Positions filled in `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.len[slot]
    }

    /// Empties `slot` for a new sequence (its old keys are overwritten as it refills).
    pub fn reset(&mut self, slot: usize) {
        self.len[slot] = 0;
    }

    /// Appends `ids` to each slot of `items` (slots distinct, every `ids` non-empty) and returns
    /// the logits `[items, V]` of the last new position of each, in item order: as
    /// `coa_model::Model::extend`. Calls with more than `rows` new tokens run in several passes.
    pub fn extend(&mut self, items: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        let vocab = self.dims.vocab;
        let mut seen = vec![false; self.slots];
        for &(slot, ids) in items {
            if slot >= self.slots {
                return Err(Error(format!("slot {slot} is out of range (the cache has {} slots)", self.slots)));
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(Error(format!("slot {slot} appears twice in one call")));
            }
            if ids.is_empty() {
                return Err(Error(format!("slot {slot}: no tokens to append")));
            }
            if self.len[slot] + ids.len() > self.max_len {
                return Err(Error(format!("slot {slot}: {} + {} tokens exceed the cache's {} positions", self.len[slot], ids.len(), self.max_len)));
            }
            if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error(format!("slot {slot}: token id {t} is outside the vocabulary of {vocab}")));
            }
        }
        let mut out = vec![0f32; items.len() * vocab];
        // Passes of at most `rows` new tokens; an item longer than what is left of a pass
        // continues in the next one (a slot appears at most once per pass).
        let mut done = vec![0usize; items.len()];
        while done.iter().zip(items).any(|(&d, (_, ids))| d < ids.len()) {
            let mut pass: Vec<(usize, usize, usize)> = Vec::new(); // (item, from, to)
            let mut room = self.rows;
            for (it, (_, ids)) in items.iter().enumerate() {
                if room == 0 {
                    break;
                }
                let from = done[it];
                if from == ids.len() {
                    continue;
                }
                let to = ids.len().min(from + room);
                room -= to - from;
                pass.push((it, from, to));
            }
            let finished = self.pass(items, &pass)?; // items whose logits are in self.logits, in order
            let logits = if finished.is_empty() { Vec::new() } else { self.gpu.download(&self.logits.slice(..finished.len() * vocab))? };
            for (k, &it) in finished.iter().enumerate() {
                out[it * vocab..(it + 1) * vocab].copy_from_slice(&logits[k * vocab..(k + 1) * vocab]);
            }
            for &(it, _, to) in &pass {
                done[it] = to;
            }
        }
        Ok(out)
    }

    /// One forward pass over the new tokens `items[it].1[from..to]` of each `(it, from, to)`.
    /// Writes the logits of the items whose last token is in this pass into `self.logits`, in
    /// order; returns those items.
    fn pass(&mut self, items: &[(usize, &[u32])], pass: &[(usize, usize, usize)]) -> Result<Vec<usize>> {
        let c = self.dims;
        let (mut tokens, mut slot_of, mut pos_of, mut positions) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut finished = Vec::new(); // (item, row of its last token)
        for &(it, from, to) in pass {
            let (slot, ids) = items[it];
            let p0 = self.len[slot];
            for (j, &t) in ids[from..to].iter().enumerate() {
                tokens.push(t as i32);
                slot_of.push(slot as i32);
                pos_of.push((p0 + j) as i32);
                positions.push((p0 + j) as u32);
            }
            if to == ids.len() {
                finished.push((it, tokens.len() - 1));
            }
        }
        let n = tokens.len();
        let (cos, sin) = self.config.rope_tables(&positions);
        let GpuDecoder { gpu, flat, w, k, v, x, h, rstd, qk_rstd, qkv, att, gu, a, last, logits, ones, windows, .. } = self;
        let st = &gpu.stream;
        st.memcpy_htod(&tokens, &mut self.tokens.slice_mut(..n))?;
        st.memcpy_htod(&slot_of, &mut self.slot_of.slice_mut(..n))?;
        st.memcpy_htod(&pos_of, &mut self.pos_of.slice_mut(..n))?;
        st.memcpy_htod(&cos, &mut self.cos.slice_mut(..cos.len()))?;
        st.memcpy_htod(&sin, &mut self.sin.slice_mut(..sin.len()))?;
        let (d, eps, f) = (c.d, c.eps, c.inter);
        let shape = CacheShape { rows: n, q_heads: c.hq, kv_heads: c.hkv, head_dim: c.hd, slots: self.slots, max_len: self.max_len };
        gpu.embedding_fwd(&self.tokens, &w.slice(flat.embed..flat.embed + c.vocab * d), x, n, d, c.vocab)?;
        let ws = LinearWeights { flat: w, ones };
        let [q_rows, k_rows, qk_rows] = c.head_rows(n);
        for (li, lw) in flat.layers.iter().enumerate() {
            // x += o_proj(attn(rope(qkv(rmsnorm(x)))))
            gpu.rmsnorm_fwd(x, &w.slice(lw.ln1..lw.ln1 + d), h, rstd, n, d, eps)?;
            linear_fwd(gpu, ws, Linear { w: lw.qkv, bias: lw.qkv_bias, shape: (n, d, c.wqkv) }, h, qkv, false)?;
            if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
                // Qwen3: q and k heads normalised in place before RoPE
                gpu.head_rmsnorm_fwd(qkv, q_rows, &w.slice(qn..qn + c.hd), qk_rstd, None::<&mut CudaSlice<bf16>>, eps)?;
                gpu.head_rmsnorm_fwd(&mut qkv.slice_mut(c.qd..), k_rows, &w.slice(kn..kn + c.hd), qk_rstd, None::<&mut CudaSlice<bf16>>, eps)?;
            }
            gpu.rope(qkv, qk_rows, None, &self.cos, &self.sin, false)?;
            gpu.kv_append(&shape, &qkv.slice(c.qd..), &qkv.slice(c.qd + c.kvd..), c.wqkv, &mut k[li], &mut v[li], &self.slot_of, &self.pos_of)?;
            let cache = KvCacheRows { k_cache: &k[li], v_cache: &v[li], slot: &self.slot_of, pos: &self.pos_of };
            gpu.attn_extend(&shape, qkv, c.wqkv, cache, att, windows[li])?;
            linear_fwd(gpu, ws, Linear { w: lw.o, bias: lw.o_bias, shape: (n, c.qd, d) }, att, x, true)?;
            // x += down(silu(gate(h)) * up(h)), h = rmsnorm(x)
            gpu.rmsnorm_fwd(x, &w.slice(lw.ln2..lw.ln2 + d), h, rstd, n, d, eps)?;
            linear_fwd(gpu, ws, Linear { w: lw.gu, bias: lw.gu_bias, shape: (n, d, 2 * f) }, h, gu, false)?;
            gpu.swiglu_fwd(&gu.slice(..), &gu.slice(f..), a, n, f, 2 * f, 2 * f, f)?;
            linear_fwd(gpu, ws, Linear { w: lw.down, bias: lw.down_bias, shape: (n, f, d) }, a, x, true)?;
        }
        // The head, on the last new row of each finished item only. In a one-token step (the
        // common case) every row is its item's last, in order: the head reads `x` as it is
        // instead of one copy per row.
        let m = finished.len();
        let head_in: &CudaSlice<bf16> = if m == n {
            x
        } else {
            for (k, &(_, r)) in finished.iter().enumerate() {
                st.memcpy_dtod(&x.slice(r * d..(r + 1) * d), &mut last.slice_mut(k * d..(k + 1) * d))?;
            }
            last
        };
        if m > 0 {
            gpu.rmsnorm_fwd(head_in, &w.slice(flat.norm..flat.norm + d), h, rstd, m, d, eps)?;
            let g = Gemm::new(m, c.vocab, d).transposed(false, true);
            gpu.gemm(g, &h.slice(..m * d), &w.slice(flat.head..flat.head + c.vocab * d), &mut logits.slice_mut(..m * c.vocab))?;
        }
        for &(it, from, to) in pass {
            self.len[items[it].0] += to - from;
        }
        Ok(finished.into_iter().map(|(it, _)| it).collect())
    }
}
