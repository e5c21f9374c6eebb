//! [`GpuModel`]: the Llama / Qwen2 / Qwen3 / Mistral decoder of `coa_model`, trained on the GPU,
//! llm.c style.
//!
//! Everything lives on the device and is allocated once, for at most `capacity` tokens per pass:
//!
//! ```text
//! parameters, optimizer state   flat buffers of `total` elements, one layout (see `Slot`):
//!   master   f32   the exact weights (AdamW updates these; checkpoints are these)
//!   w        bf16  the working copy every matmul reads (cast from master after each step)
//!   grad     f32   accumulated over the passes of a step (matmul dW with beta = 1)
//!   m, v     f32   AdamW moments
//! per layer, kept for the backward (T = capacity, W = (Hq + 2 Hkv) hd, I = intermediate):
//!   resid[l] [T, D] layer input (resid[L] = the last layer's output)   rstd1, rstd2 f32 [T]
//!   h1, h2   [T, D] the two RMSNorm outputs        qkv [T, W] q | k | v, q and k rotated
//!   Qwen3 only: qk_raw [T (Hq + Hkv), hd] q and k before their norms, qk_rstd f32 [T (Hq + Hkv)]
//!   att      [T, Hq hd] attention output          lse f32 [T, Hq]
//!   x2       [T, D] residual after attention      gu [T, 2I] gate | up    a [T, I] silu(gate) up
//! head: rstdf [T], hf [T, D], logits [T, V] (overwritten in place by d loss / d logits)
//! backward scratch, shared by the layers: dres, dh [T, D], datt [T, Hq hd], dqkv [T, W],
//!   dgu [T, 2I], da [T, I]
//! inputs: tokens, pos, seg_start, targets i32 [T]; g f32 [T] (-d loss/d logp per row);
//!   ones bf16 [T] (bias broadcast and bias gradients through cuBLAS); RoPE cos/sin [T, hd/2]
//! ```
//!
//! Several sequences (the rows of a micro-batch) run as ONE packed sequence: each row and each of
//! its segments is a segment of the pack (attention stays inside it, RoPE positions restart), so a
//! pass costs what its segments cost and matmuls see all its tokens at once.
//!
//! The weights are laid out for fused matmuls: per layer q|k|v stacked into one [W, D] matrix and
//! gate|up into one [2I, D] matrix (their biases likewise), so the attention and MLP inputs are one
//! cuBLAS call each; canonical tensors (`coa_model::param_specs`) map to ranges of the flat buffers
//! for upload, download, and AdamW's per-tensor weight decay.
//!
//! Precision: bf16 weights and activations, fp32 accumulation in every kernel and matmul, fp32
//! weight gradients, master weights and moments. The residual-stream gradient is bf16.
//!
//! What runs where: everything per token on the GPU; the host packs the token ids (and builds the
//! RoPE tables and the embedding-gradient plan), and reads back the per-token log-probs (and
//! entropies) for the objective, which decides d loss / d logp (see [`DLogp`]).

use std::sync::Arc;

use coa_model::lora::Target;
use coa_model::{ops, Lora, ModelConfig, Params, Seq, TokenStats};
use cudarc::driver::CudaSlice;

use crate::gpu::Alloc;
use crate::layout::{check_common, Dims, FlatLayout, Slot};
use crate::lora::{GpuLora, GpuLoraCall};
use crate::ops::attention::{AttnShape, Qkv};
use crate::ops::adamw::AdamWArgs;
use crate::ops::embedding::EmbeddingGradPlan;
use crate::ops::gemm::{linear_bwd, linear_fwd, Linear, LinearWeights};
use crate::{bf16, Error, Gpu, Result};

/// Whether the GPU path can train this model: an error naming the unsupported feature otherwise.
pub fn check_supported(c: &ModelConfig) -> Result<()> {
    let hd = c.head_dim();
    if hd != 64 && hd != 128 {
        return Err(Error(format!(
            "the GPU path's flash attention supports head_dim 64 and 128, and this model has head_dim {hd} \
             (hidden_size {} / num_attention_heads {}, or config `head_dim`)",
            c.hidden_size, c.num_attention_heads
        )));
    }
    check_common(c)
}

/// Activations of one layer kept for the backward. T = capacity, D = hidden, W = (Hq + 2 Hkv) hd,
/// I = intermediate.
struct LayerActs {
    rstd1: CudaSlice<f32>, // [T]
    h1: CudaSlice<bf16>,   // [T, D] input_layernorm(x)
    qkv: CudaSlice<bf16>,  // [T, W] q | k | v, q and k rotated
    att: CudaSlice<bf16>,  // [T, Hq hd] attention output
    lse: CudaSlice<f32>,   // [T, Hq]
    x2: CudaSlice<bf16>,   // [T, D] residual after attention
    rstd2: CudaSlice<f32>, // [T]
    h2: CudaSlice<bf16>,   // [T, D] post_attention_layernorm(x2)
    gu: CudaSlice<bf16>,   // [T, 2I] gate | up
    a: CudaSlice<bf16>,    // [T, I] silu(gate) * up
    /// Qwen3's q/k norm: q then k heads before the norm `[T Hq + T Hkv, hd]`, and the norm's
    /// rstd `[T Hq + T Hkv]` (q rows first).
    qk: Option<(CudaSlice<bf16>, CudaSlice<f32>)>,
}

struct Acts {
    resid: Vec<CudaSlice<bf16>>, // L + 1 x [T, D]: layer l reads resid[l], writes resid[l + 1]
    layers: Vec<LayerActs>,
    rstdf: CudaSlice<f32>,    // [T]
    hf: CudaSlice<bf16>,      // [T, D] model.norm(resid[L])
    logits: CudaSlice<bf16>,  // [T, V], then d loss / d logits in place
    logp: CudaSlice<f32>,     // [T] row r: log p(target of row r) (row r predicts token r + 1)
    lse: CudaSlice<f32>,      // [T]
    entropy: CudaSlice<f32>,  // [T]
}

/// Backward scratch shared by every layer.
struct BackBufs {
    dres: CudaSlice<bf16>, // [T, D] d loss / d residual stream
    dh: CudaSlice<bf16>,   // [T, D] d loss / d (a norm's output)
    datt: CudaSlice<bf16>, // [T, Hq hd]
    dqkv: CudaSlice<bf16>, // [T, W] dq | dk | dv
    dgu: CudaSlice<bf16>,  // [T, 2I] dgate | dup
    da: CudaSlice<bf16>,   // [T, I]
    /// [max(D, hd)] RMSNorm (and Qwen3 q/k norm) weight gradients nobody reads (LoRA: the base
    /// has no gradient buffer).
    dw_sink: CudaSlice<f32>,
}

/// Per-pass inputs, uploaded into fixed buffers.
struct Inputs {
    tokens: CudaSlice<i32>,  // [T]
    pos: CudaSlice<i32>,     // [T] RoPE position (restarts per segment)
    seg: CudaSlice<i32>,     // [T] first token of each token's segment in the pack
    targets: CudaSlice<i32>, // [T] row r's target id, or -1
    g: CudaSlice<f32>,       // [T] row weights -d loss / d logp
    ones: CudaSlice<bf16>,   // [T] all 1: bias broadcast and bias gradients through cuBLAS
    cos: CudaSlice<f32>,     // [T, hd/2] RoPE table by position
    sin: CudaSlice<f32>,     // [T, hd/2]
}

/// One vector per canonical parameter tensor (`coa_model::param_specs` order).
pub type PerTensor = Vec<Vec<f32>>;

/// How a pass gets d loss / d logp of every token (one `Vec` per sequence, like
/// `coa_model::Model::forward_backward`'s callback; entries at segment starts are ignored).
pub enum DLogp<'a> {
    /// Known before the forward, independent of the log-probs (SFT: −1/N on every target): the
    /// fused cross-entropy produces the log-probs and the gradient in one pass over the logits.
    /// The returned log-probs are then computed only where the gradient is non-zero (0 elsewhere),
    /// and entropies are 0.
    Fixed(&'a [Vec<f32>]),
    /// A function of the token statistics (RL): the logits are read twice, once for the
    /// log-probs and entropies (all tokens), once for the gradient.
    FromStats(&'a mut dyn FnMut(&[TokenStats]) -> Vec<Vec<f32>>),
}

/// One packed pass, as uploaded.
struct Packed {
    n: usize,
    /// Start and length of each sequence within the pack.
    spans: Vec<(usize, usize)>,
    ids: Vec<u32>,
    /// Row r's target (token r + 1 of its segment), or −1.
    targets: Vec<i32>,
}

/// The model, its optimizer state and its activations on one GPU (see the module doc).
pub struct GpuModel {
    pub gpu: Arc<Gpu>,
    pub config: ModelConfig,
    dims: Dims,
    /// Each layer's sliding window (0: none).
    windows: Vec<usize>,
    capacity: usize,
    device_bytes: usize,
    flat: FlatLayout,
    master: CudaSlice<f32>,
    w: CudaSlice<bf16>,
    grad: CudaSlice<f32>,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    acts: Acts,
    back: BackBufs,
    io: Inputs,
    /// A LoRA adapter: then it alone trains (`grad`, `m`, `v` above are left unallocated).
    lora: Option<GpuLora>,
    /// The LoRA dropout seeds of the next training pass, one per sequence.
    dropout_seeds: Vec<u64>,
}

/// The buffers of the tensors a run trains: the model's, or its LoRA adapter's.
struct Trained<'a> {
    flat: &'a FlatLayout,
    master: &'a mut CudaSlice<f32>,
    grad: &'a mut CudaSlice<f32>,
    m: &'a mut CudaSlice<f32>,
    v: &'a mut CudaSlice<f32>,
}

impl GpuModel {
    /// Uploads `params` (the f32 master weights, in `param_specs(config)` order) with zero AdamW
    /// moments, and allocates every buffer for passes of up to `capacity` tokens.
    ///
    /// All work runs on `gpu.stream`, so cudarc's cross-stream event tracking is switched off for
    /// this context (it would record events around every launch).
    pub fn new(gpu: Arc<Gpu>, config: &ModelConfig, params: &Params, capacity: usize) -> Result<GpuModel> {
        GpuModel::with_lora(gpu, config, params, None, capacity)
    }

    /// [`GpuModel::new`] with a LoRA adapter on the linear layers (`coa_model::lora`): the adapter
    /// trains (its own gradients and AdamW moments, zero at first), the base weights stay as given.
    pub fn with_lora(gpu: Arc<Gpu>, config: &ModelConfig, params: &Params, lora: Option<&Lora>, capacity: usize) -> Result<GpuModel> {
        check_supported(config)?;
        if capacity == 0 {
            return Err(Error::new("GpuModel: capacity must be at least one token"));
        }
        let flat = FlatLayout::of(config);
        flat.check_tensors(params)?;
        // SAFETY: every buffer of this model, and every launcher of `Gpu`, uses the one stream
        // `gpu.stream`; downloads synchronise it. Nothing needs cross-stream events.
        unsafe { gpu.ctx.disable_event_tracking() };
        let c = Dims::of(config);
        let t = capacity;
        let mut al = Alloc::new(&gpu, format!("allocating GPU buffers for {t} tokens per pass"), "fewer tokens per pass: lower --micro-batch-tokens");
        let total = flat.total;
        // Under LoRA the base needs no gradients or moments.
        let opt = if lora.is_some() { 0 } else { total };
        let (master, w, grad, m, v) = (al.f32(total)?, al.bf16(total)?, al.f32(opt)?, al.f32(opt)?, al.f32(opt)?);
        let mut layers = Vec::with_capacity(c.layers);
        for _ in 0..c.layers {
            layers.push(LayerActs {
                rstd1: al.f32(t)?,
                h1: al.bf16(t * c.d)?,
                qkv: al.bf16(t * c.wqkv)?,
                att: al.bf16(t * c.qd)?,
                lse: al.f32(t * c.hq)?,
                x2: al.bf16(t * c.d)?,
                rstd2: al.f32(t)?,
                h2: al.bf16(t * c.d)?,
                gu: al.bf16(t * 2 * c.inter)?,
                a: al.bf16(t * c.inter)?,
                qk: if config.qk_norm() { Some((al.bf16(t * (c.hq + c.hkv) * c.hd)?, al.f32(t * (c.hq + c.hkv))?)) } else { None },
            });
        }
        let acts = Acts {
            resid: (0..=c.layers).map(|_| al.bf16(t * c.d)).collect::<Result<_>>()?,
            layers,
            rstdf: al.f32(t)?,
            hf: al.bf16(t * c.d)?,
            logits: al.bf16(t * c.vocab)?,
            logp: al.f32(t)?,
            lse: al.f32(t)?,
            entropy: al.f32(t)?,
        };
        let back = BackBufs {
            dres: al.bf16(t * c.d)?,
            dh: al.bf16(t * c.d)?,
            datt: al.bf16(t * c.qd)?,
            dqkv: al.bf16(t * c.wqkv)?,
            dgu: al.bf16(t * 2 * c.inter)?,
            da: al.bf16(t * c.inter)?,
            dw_sink: al.f32(if lora.is_some() { c.d.max(c.hd) } else { 0 })?,
        };
        let mut io = Inputs {
            tokens: al.i32(t)?,
            pos: al.i32(t)?,
            seg: al.i32(t)?,
            targets: al.i32(t)?,
            g: al.f32(t)?,
            ones: al.bf16(t)?,
            cos: al.f32(t * c.hd / 2)?,
            sin: al.f32(t * c.hd / 2)?,
        };
        gpu.stream.memcpy_htod(&vec![bf16::ONE; t], &mut io.ones)?;
        // RoPE tables by position: row p for position p (positions restart per segment, < T).
        let positions: Vec<u32> = (0..t as u32).collect();
        let (cos, sin) = config.rope_tables(&positions);
        gpu.stream.memcpy_htod(&cos, &mut io.cos)?;
        gpu.stream.memcpy_htod(&sin, &mut io.sin)?;
        let lora = lora.map(|l| GpuLora::new(&mut al, &gpu, config, l, capacity)).transpose()?;
        let device_bytes = al.bytes;
        let windows = config.layer_windows().map_err(|e| Error(format!("{e:#}")))?;
        let mut model = GpuModel { gpu, config: config.clone(), dims: c, windows, capacity, device_bytes, flat, master, w, grad, m, v, acts, back, io, lora, dropout_seeds: Vec::new() };
        let host = model.flat.flatten(|i| &params.tensors[i].data);
        model.gpu.stream.memcpy_htod(&host, &mut model.master)?;
        model.restore_working_weights()?;
        Ok(model)
    }

    /// Tokens one pass can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of device memory this model's buffers hold (the launchers' per-call scratch and
    /// cuBLAS's workspace aside).
    pub fn device_bytes(&self) -> usize {
        self.device_bytes
    }

    /// Canonical tensors out of a flat device buffer of layout `flat` (synchronises).
    fn unflatten(&self, flat: &FlatLayout, buf: &CudaSlice<f32>) -> Result<Vec<Vec<f32>>> {
        let host = self.gpu.download(buf)?;
        Ok(flat.slots.iter().map(|s| host[s.offset..s.offset + s.numel].to_vec()).collect())
    }

    fn check_params(&self, p: &Params, what: &str) -> Result<()> {
        self.flat.check_tensors(p).map_err(|e| Error(format!("{what}: {e}")))
    }

    /// The buffers of the trained tensors: the adapter's under LoRA, else the model's.
    fn trained(&mut self) -> Trained<'_> {
        match &mut self.lora {
            Some(l) => Trained { flat: &l.flat, master: &mut l.master, grad: &mut l.grad, m: &mut l.m, v: &mut l.v },
            None => Trained { flat: &self.flat, master: &mut self.master, grad: &mut self.grad, m: &mut self.m, v: &mut self.v },
        }
    }

    fn trained_ref(&self) -> (&FlatLayout, &CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>) {
        match &self.lora {
            Some(l) => (&l.flat, &l.master, &l.grad, &l.m, &l.v),
            None => (&self.flat, &self.master, &self.grad, &self.m, &self.v),
        }
    }

    /// Whether a LoRA adapter trains (instead of the weights).
    pub fn has_lora(&self) -> bool {
        self.lora.is_some()
    }

    /// The LoRA dropout mask seeds of the [`GpuModel::forward_backward`] passes from now on, one
    /// per sequence of a pass (the seed `coa_model::Lora::set_dropout_seed` gives the CPU model for
    /// that sequence); a pass with dropout and another number of sequences is an error.
    pub fn set_dropout_seeds(&mut self, seeds: Vec<u64>) {
        self.dropout_seeds = seeds;
    }

    /// Copies the adapter's f32 A and B into `params` (`Lora::params`' layout).
    pub fn download_lora(&self, params: &mut Params) -> Result<()> {
        let Some(l) = &self.lora else { return Err(Error::new("download_lora: the model has no LoRA adapter")) };
        l.flat.check_tensors(params).map_err(|e| Error(format!("download_lora: {e}")))?;
        for (t, d) in params.tensors.iter_mut().zip(self.unflatten(&l.flat, &l.master)?) {
            t.data = d;
        }
        Ok(())
    }

    /// Copies the master weights into `params` (same layout as the model's).
    pub fn download_params(&self, params: &mut Params) -> Result<()> {
        self.check_params(params, "download_params")?;
        for (t, d) in params.tensors.iter_mut().zip(self.unflatten(&self.flat, &self.master)?) {
            t.data = d;
        }
        Ok(())
    }

    /// Copies the accumulated gradients of the trained tensors into `grads` (the model's layout,
    /// or under LoRA the adapter's).
    pub fn download_grads(&self, grads: &mut Params) -> Result<()> {
        let (flat, _, grad, _, _) = self.trained_ref();
        flat.check_tensors(grads).map_err(|e| Error(format!("download_grads: {e}")))?;
        for (t, d) in grads.tensors.iter_mut().zip(self.unflatten(flat, grad)?) {
            t.data = d;
        }
        Ok(())
    }

    /// The AdamW moments (exp_avg, exp_avg_sq) of the trained tensors (under LoRA: the adapter's).
    pub fn download_moments(&self) -> Result<(PerTensor, PerTensor)> {
        let (flat, _, _, m, v) = self.trained_ref();
        Ok((self.unflatten(flat, m)?, self.unflatten(flat, v)?))
    }

    /// Sets the AdamW moments, one slice per trained tensor (under LoRA: the adapter's).
    pub fn upload_moments(&mut self, exp_avg: &[&[f32]], exp_avg_sq: &[&[f32]]) -> Result<()> {
        let gpu = self.gpu.clone();
        let t = self.trained();
        let n = t.flat.slots.len();
        for (what, x) in [("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)] {
            if x.len() != n || x.iter().zip(&t.flat.slots).any(|(a, s)| a.len() != s.numel) {
                return Err(Error(format!("upload_moments: {what} does not match the trained parameters")));
            }
        }
        let m = t.flat.flatten(|i| exp_avg[i]);
        let v = t.flat.flatten(|i| exp_avg_sq[i]);
        gpu.stream.memcpy_htod(&m, t.m)?;
        gpu.stream.memcpy_htod(&v, t.v)?;
        Ok(())
    }

    /// Runs the forward on other weights (e.g. an RL reference model) until
    /// [`GpuModel::restore_working_weights`]: only the bf16 copy changes, and a LoRA adapter is off
    /// meanwhile (`params` are a whole model).
    pub fn set_working_weights(&mut self, params: &Params) -> Result<()> {
        self.check_params(params, "set_working_weights")?;
        if let Some(l) = &mut self.lora {
            l.active = false;
        }
        let host: Vec<bf16> = self.flat.flatten(|i| &params.tensors[i].data).iter().map(|&x| bf16::from_f32(x)).collect();
        self.gpu.stream.memcpy_htod(&host, &mut self.w)?;
        Ok(())
    }

    /// The bf16 working weights from the f32 masters (a LoRA adapter on again).
    pub fn restore_working_weights(&mut self) -> Result<()> {
        if let Some(l) = &mut self.lora {
            l.active = true;
            l.restore_working_weights(&self.gpu)?;
        }
        self.gpu.cast_f32_bf16(&self.master, &mut self.w, self.flat.total)
    }

    /// Zeroes the trained tensors' gradients.
    pub fn zero_grads(&mut self) -> Result<()> {
        let gpu = self.gpu.clone();
        gpu.stream.memset_zeros(self.trained().grad)?;
        Ok(())
    }

    /// The global L2 norm of the trained tensors' accumulated gradients (synchronises).
    pub fn grad_norm(&self) -> Result<f64> {
        let (flat, _, grad, _, _) = self.trained_ref();
        Ok(self.gpu.sumsq(grad, flat.total)?.sqrt())
    }

    /// One AdamW step of every tensor, with the scalars `args(name, shape)` gives each span of
    /// its elements (decay rule, clipping factor, and the learning rate, which may differ by
    /// rows: new vocabulary rows), then the bf16 working copy from the updated masters.
    /// Neighbouring spans with equal scalars run as one launch (the padding between tensors is all
    /// zeros, which AdamW keeps at zero).
    /// Under LoRA the adapter's tensors step (by their PEFT names), the base stays.
    pub fn adamw_step(&mut self, args: impl Fn(&str, &[usize]) -> Vec<(std::ops::Range<usize>, AdamWArgs)>) -> Result<()> {
        let gpu = self.gpu.clone();
        let Trained { flat, master, grad, m, v } = self.trained();
        let mut slots: Vec<&Slot> = flat.slots.iter().collect();
        slots.sort_by_key(|s| s.offset);
        let mut runs: Vec<(usize, usize, AdamWArgs)> = Vec::new();
        for s in slots {
            for (span, a) in args(&s.name, &s.shape) {
                if span.end > s.numel || span.start > span.end {
                    return Err(Error(format!("AdamW span {span:?} outside tensor {} of {} elements", s.name, s.numel)));
                }
                let (lo, hi) = (s.offset + span.start, s.offset + span.end);
                match runs.last_mut() {
                    Some(r) if r.2 == a => r.1 = hi,
                    _ => runs.push((lo, hi, a)),
                }
            }
        }
        for (lo, hi, a) in runs {
            let n = hi - lo;
            gpu.adamw(&mut master.slice_mut(lo..hi), &grad.slice(lo..hi), &mut m.slice_mut(lo..hi), &mut v.slice_mut(lo..hi), None, n, &a)?;
        }
        match &mut self.lora {
            Some(l) => l.restore_working_weights(&gpu),
            None => self.restore_working_weights(),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        self.gpu.synchronize()
    }

    /// Packs `seqs` into one pass and uploads ids, positions, segment starts and targets.
    fn pack(&mut self, seqs: &[Seq]) -> Result<Packed> {
        if seqs.is_empty() {
            return Err(Error::new("a GPU pass needs at least one sequence"));
        }
        let n: usize = seqs.iter().map(|s| s.input_ids.len()).sum();
        if n > self.capacity {
            return Err(Error(format!(
                "{} sequences of {n} tokens in one pass, but the GPU buffers hold {} tokens",
                seqs.len(),
                self.capacity
            )));
        }
        let vocab = self.dims.vocab;
        let (mut tokens, mut pos, mut seg, mut targets) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let mut ids = Vec::with_capacity(n);
        let mut spans = Vec::with_capacity(seqs.len());
        for (k, s) in seqs.iter().enumerate() {
            let t = s.input_ids.len();
            if t == 0 {
                return Err(Error(format!("sequence {k}: input_ids is empty")));
            }
            if let Some((p, id)) = s.input_ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
                return Err(Error(format!("sequence {k}: token id {id} at position {p} is outside the vocabulary (vocab_size = {vocab})")));
            }
            if let Some(sid) = s.segment_ids {
                if sid.len() != t {
                    return Err(Error(format!("sequence {k}: segment_ids has length {}, input_ids has length {t}", sid.len())));
                }
            }
            let off = tokens.len();
            let (p, st) = ops::segment_layout(t, s.segment_ids);
            for i in 0..t {
                tokens.push(s.input_ids[i] as i32);
                pos.push(p[i] as i32);
                seg.push((off + st[i]) as i32);
                // Row i predicts token i + 1 unless that starts a segment (or the sequence ends).
                targets.push(if i + 1 < t && p[i + 1] != 0 { s.input_ids[i + 1] as i32 } else { -1 });
            }
            ids.extend_from_slice(s.input_ids);
            spans.push((off, t));
        }
        let (st, io) = (&self.gpu.stream, &mut self.io);
        st.memcpy_htod(&tokens, &mut io.tokens)?;
        st.memcpy_htod(&pos, &mut io.pos)?;
        st.memcpy_htod(&seg, &mut io.seg)?;
        st.memcpy_htod(&targets, &mut io.targets)?;
        Ok(Packed { n, spans, ids, targets })
    }

    /// Embedding, every layer, final norm and the head's logits for the `n` packed tokens.
    /// `train`: a training pass (LoRA dropout on).
    fn forward(&mut self, n: usize, train: bool) -> Result<()> {
        let GpuModel { gpu, dims: c, windows, flat, w, acts, io, lora, .. } = self;
        let (d, eps) = (c.d, c.eps);
        gpu.embedding_fwd(&io.tokens, &w.slice(flat.embed..flat.embed + c.vocab * d), &mut acts.resid[0], n, d, c.vocab)?;
        let (s, l) = c.attention(n);
        let ws = LinearWeights { flat: w, ones: &io.ones };
        let [q_rows, k_rows, qk_rows] = c.head_rows(n);
        for (li, (lw, a)) in flat.layers.iter().zip(acts.layers.iter_mut()).enumerate() {
            let (lo, hi) = acts.resid.split_at_mut(li + 1);
            let (x, out) = (&lo[li], &mut hi[0]);
            // attention block: x2 = x + o_proj(attn(rope(qkv(rmsnorm(x)))))
            gpu.rmsnorm_fwd(x, &w.slice(lw.ln1..lw.ln1 + d), &mut a.h1, &mut a.rstd1, n, d, eps)?;
            linear_fwd(gpu, ws, Linear { w: lw.qkv, bias: lw.qkv_bias, shape: (n, d, c.wqkv) }, &a.h1, &mut a.qkv, false)?;
            if let Some(lo) = lora.as_mut() {
                for (tg, col) in [(Target::Q, 0), (Target::K, c.qd), (Target::V, c.qd + c.kvd)] {
                    lo.forward(gpu, GpuLoraCall { layer: li, target: tg, rows: n, col, ld: c.wqkv }, &a.h1, &mut a.qkv, train)?;
                }
            }
            if let (Some((raw, rstd)), Some(qn), Some(kn)) = (&mut a.qk, lw.q_norm, lw.k_norm) {
                // Qwen3: q and k heads normalised in place before RoPE, their inputs kept
                let nq = n * c.hq;
                let (mut rq, mut rk) = raw.split_at_mut(nq * c.hd);
                let (mut rsq, mut rsk) = rstd.split_at_mut(nq);
                gpu.head_rmsnorm_fwd(&mut a.qkv, q_rows, &w.slice(qn..qn + c.hd), &mut rsq, Some(&mut rq), eps)?;
                gpu.head_rmsnorm_fwd(&mut a.qkv.slice_mut(c.qd..), k_rows, &w.slice(kn..kn + c.hd), &mut rsk, Some(&mut rk), eps)?;
            }
            gpu.rope(&mut a.qkv, qk_rows, Some(&io.pos), &io.cos, &io.sin, false)?;
            let (q, k, v) = (a.qkv.slice(..), a.qkv.slice(c.qd..), a.qkv.slice(c.qd + c.kvd..));
            let s = AttnShape { window: windows[li], ..s };
            gpu.attention_fwd(&s, &l, Qkv { q: &q, k: &k, v: &v }, Some(&io.seg), &mut a.att, &mut a.lse)?;
            gpu.stream.memcpy_dtod(&x.slice(..n * d), &mut a.x2.slice_mut(..n * d))?;
            linear_fwd(gpu, ws, Linear { w: lw.o, bias: lw.o_bias, shape: (n, c.qd, d) }, &a.att, &mut a.x2, true)?;
            if let Some(lo) = lora.as_mut() {
                lo.forward(gpu, GpuLoraCall { layer: li, target: Target::O, rows: n, col: 0, ld: d }, &a.att, &mut a.x2, train)?;
            }
            // MLP block: out = x2 + down(silu(gate(h2)) * up(h2)), h2 = rmsnorm(x2)
            gpu.rmsnorm_fwd(&a.x2, &w.slice(lw.ln2..lw.ln2 + d), &mut a.h2, &mut a.rstd2, n, d, eps)?;
            linear_fwd(gpu, ws, Linear { w: lw.gu, bias: lw.gu_bias, shape: (n, d, 2 * c.inter) }, &a.h2, &mut a.gu, false)?;
            let f = c.inter;
            if let Some(lo) = lora.as_mut() {
                for (tg, col) in [(Target::Gate, 0), (Target::Up, f)] {
                    lo.forward(gpu, GpuLoraCall { layer: li, target: tg, rows: n, col, ld: 2 * f }, &a.h2, &mut a.gu, train)?;
                }
            }
            gpu.swiglu_fwd(&a.gu.slice(..), &a.gu.slice(f..), &mut a.a, n, f, 2 * f, 2 * f, f)?;
            gpu.stream.memcpy_dtod(&a.x2.slice(..n * d), &mut out.slice_mut(..n * d))?;
            linear_fwd(gpu, ws, Linear { w: lw.down, bias: lw.down_bias, shape: (n, f, d) }, &a.a, out, true)?;
            if let Some(lo) = lora.as_mut() {
                lo.forward(gpu, GpuLoraCall { layer: li, target: Target::Down, rows: n, col: 0, ld: d }, &a.a, out, train)?;
            }
        }
        let xl = &acts.resid[c.layers];
        gpu.rmsnorm_fwd(xl, &w.slice(flat.norm..flat.norm + d), &mut acts.hf, &mut acts.rstdf, n, d, eps)?;
        linear_fwd(gpu, ws, Linear { w: flat.head, bias: None, shape: (n, d, c.vocab) }, &acts.hf, &mut acts.logits, false)
    }

    /// Backward from d loss / d logits (in `acts.logits`), accumulating every trained gradient:
    /// the weights' (`plan`: the embedding's), or under LoRA the adapter's alone.
    fn backward(&mut self, n: usize, plan: Option<&EmbeddingGradPlan>) -> Result<()> {
        let GpuModel { gpu, dims: c, windows, flat, w, grad, acts, back: b, io, lora, .. } = self;
        let d = c.d;
        // Under LoRA the base weights get no gradient: no dW products, RMSNorm's dw into a sink.
        let base = lora.is_none();
        let ws = LinearWeights { flat: w, ones: &io.ones };
        macro_rules! dw {
            ($r:expr) => {
                if base { grad.slice_mut($r) } else { b.dw_sink.slice_mut(..) }
            };
        }
        linear_bwd(gpu, ws, Linear { w: flat.head, bias: None, shape: (n, d, c.vocab) }, &acts.logits, &acts.hf, &mut b.dh, base.then_some(&mut *grad))?;
        let xl = &acts.resid[c.layers];
        let nw = flat.norm..flat.norm + d;
        gpu.rmsnorm_bwd(&b.dh, xl, &w.slice(nw.clone()), &acts.rstdf, &mut b.dres, &mut dw!(nw), (n, d), false)?;
        let (s, l) = c.attention(n);
        let [q_rows, k_rows, qk_rows] = c.head_rows(n);
        // b.dres holds d loss / d (layer output) on entry to each layer, d loss / d (input) on exit.
        for (li, (lw, a)) in flat.layers.iter().zip(&acts.layers).enumerate().rev() {
            let f = c.inter;
            linear_bwd(gpu, ws, Linear { w: lw.down, bias: lw.down_bias, shape: (n, f, d) }, &b.dres, &a.a, &mut b.da, base.then_some(&mut *grad))?;
            if let Some(lo) = lora.as_mut() {
                lo.backward(gpu, GpuLoraCall { layer: li, target: Target::Down, rows: n, col: 0, ld: d }, &a.a, &b.dres, &mut b.da)?;
            }
            gpu.swiglu_bwd_fused(&b.da, &a.gu, &mut b.dgu, n, f)?;
            linear_bwd(gpu, ws, Linear { w: lw.gu, bias: lw.gu_bias, shape: (n, d, 2 * f) }, &b.dgu, &a.h2, &mut b.dh, base.then_some(&mut *grad))?;
            if let Some(lo) = lora.as_mut() {
                for (tg, col) in [(Target::Gate, 0), (Target::Up, f)] {
                    lo.backward(gpu, GpuLoraCall { layer: li, target: tg, rows: n, col, ld: 2 * f }, &a.h2, &b.dgu, &mut b.dh)?;
                }
            }
            let r2 = lw.ln2..lw.ln2 + d;
            gpu.rmsnorm_bwd(&b.dh, &a.x2, &w.slice(r2.clone()), &a.rstd2, &mut b.dres, &mut dw!(r2), (n, d), true)?;
            linear_bwd(gpu, ws, Linear { w: lw.o, bias: lw.o_bias, shape: (n, c.qd, d) }, &b.dres, &a.att, &mut b.datt, base.then_some(&mut *grad))?;
            if let Some(lo) = lora.as_mut() {
                lo.backward(gpu, GpuLoraCall { layer: li, target: Target::O, rows: n, col: 0, ld: d }, &a.att, &b.dres, &mut b.datt)?;
            }
            let s = AttnShape { window: windows[li], ..s };
            gpu.attention_bwd_qkv(&s, &l, &a.qkv, &a.att, &a.lse, Some(&io.seg), &b.datt, &mut b.dqkv)?;
            gpu.rope(&mut b.dqkv, qk_rows, Some(&io.pos), &io.cos, &io.sin, true)?;
            if let (Some((raw, rstd)), Some(qn), Some(kn)) = (&a.qk, lw.q_norm, lw.k_norm) {
                // through Qwen3's q/k norms, in place on dq | dk (under LoRA their weights frozen)
                let (nq, nk) = (n * c.hq, n * c.hkv);
                let (rq, rk) = (raw.slice(..nq * c.hd), raw.slice(nq * c.hd..(nq + nk) * c.hd));
                let (sq, sk) = (rstd.slice(..nq), rstd.slice(nq..nq + nk));
                let (gq, gk) = (qn..qn + c.hd, kn..kn + c.hd);
                gpu.head_rmsnorm_bwd(&mut b.dqkv, q_rows, &rq, &w.slice(gq.clone()), &sq, &mut dw!(gq))?;
                gpu.head_rmsnorm_bwd(&mut b.dqkv.slice_mut(c.qd..), k_rows, &rk, &w.slice(gk.clone()), &sk, &mut dw!(gk))?;
            }
            linear_bwd(gpu, ws, Linear { w: lw.qkv, bias: lw.qkv_bias, shape: (n, d, c.wqkv) }, &b.dqkv, &a.h1, &mut b.dh, base.then_some(&mut *grad))?;
            if let Some(lo) = lora.as_mut() {
                for (tg, col) in [(Target::Q, 0), (Target::K, c.qd), (Target::V, c.qd + c.kvd)] {
                    lo.backward(gpu, GpuLoraCall { layer: li, target: tg, rows: n, col, ld: c.wqkv }, &a.h1, &b.dqkv, &mut b.dh)?;
                }
            }
            let r1 = lw.ln1..lw.ln1 + d;
            gpu.rmsnorm_bwd(&b.dh, &acts.resid[li], &w.slice(r1.clone()), &a.rstd1, &mut b.dres, &mut dw!(r1), (n, d), true)?;
        }
        match plan {
            Some(plan) => gpu.embedding_bwd(plan, &b.dres, &mut grad.slice_mut(flat.embed..flat.embed + c.vocab * d), d),
            None => Ok(()),
        }
    }

    /// Row weights `g[r] = −d loss / d logp[token r + 1]` of the pack (0 where row r has no
    /// target), uploaded into `io.g`.
    fn upload_row_weights(&mut self, p: &Packed, dlogp: &[Vec<f32>]) -> Result<()> {
        if dlogp.len() != p.spans.len() {
            return Err(Error(format!("d loss / d logp given for {} sequences, the pass has {}", dlogp.len(), p.spans.len())));
        }
        let mut g = vec![0f32; p.n];
        for (k, (&(off, t), dl)) in p.spans.iter().zip(dlogp).enumerate() {
            if dl.len() != t {
                return Err(Error(format!("sequence {k}: d loss / d logp has length {}, the sequence has {t} tokens", dl.len())));
            }
            if let Some((pos, x)) = dl.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(Error(format!("sequence {k}: d loss / d logp at position {pos} is not finite ({x})")));
            }
            for i in 1..t {
                if p.targets[off + i - 1] >= 0 {
                    g[off + i - 1] = -dl[i];
                }
            }
        }
        self.gpu.stream.memcpy_htod(&g, &mut self.io.g)?;
        Ok(())
    }

    /// Token statistics per sequence from the per-row log-probs (and entropies) of the pack:
    /// token t of a sequence gets row t − 1's values; 0 at sequence and segment starts.
    fn token_stats_of(&self, p: &Packed, with_entropy: bool) -> Result<Vec<TokenStats>> {
        let n = p.n;
        let logp = self.gpu.download(&self.acts.logp.slice(..n))?;
        let ent = if with_entropy { Some(self.gpu.download(&self.acts.entropy.slice(..n))?) } else { None };
        Ok(p.spans
            .iter()
            .map(|&(off, t)| {
                let mut s = TokenStats { logp: vec![0f32; t], entropy: vec![0f32; t] };
                s.logp[1..].copy_from_slice(&logp[off..off + t - 1]);
                if let Some(e) = &ent {
                    s.entropy[1..].copy_from_slice(&e[off..off + t - 1]);
                }
                s
            })
            .collect())
    }

    /// Log-probs and entropies of every row, logits left intact.
    fn head_stats(&mut self, n: usize) -> Result<()> {
        let GpuModel { gpu, dims: c, acts, io, .. } = self;
        gpu.xent_fwd_bwd(&mut acts.logits, &io.targets, None, &mut acts.logp, Some(&mut acts.lse), n, c.vocab, false)?;
        gpu.xent_entropy(&acts.logits, &io.targets, &acts.lse, &mut acts.entropy, n, c.vocab)
    }

    /// d loss / d logits in place over the logits, from the row weights in `io.g`.
    fn head_grad(&mut self, n: usize) -> Result<()> {
        let GpuModel { gpu, dims: c, acts, io, .. } = self;
        gpu.xent_fwd_bwd(&mut acts.logits, &io.targets, Some(&io.g), &mut acts.logp, None, n, c.vocab, true)
    }

    /// Token statistics of `seqs` (packed into one pass; no backward): `coa_model::Model::token_stats`.
    pub fn token_stats(&mut self, seqs: &[Seq]) -> Result<Vec<TokenStats>> {
        let p = self.pack(seqs)?;
        self.forward(p.n, false)?;
        self.head_stats(p.n)?;
        self.token_stats_of(&p, true)
    }

    /// Forward and backward of `seqs` packed into one pass, ADDING the parameter gradients into
    /// the gradient buffer (see [`GpuModel::zero_grads`]); `dlogp` gives d loss / d logp. Returns
    /// each sequence's token statistics (`coa_model::Model::forward_backward`'s contract; see
    /// [`DLogp::Fixed`] for what a fixed gradient computes).
    pub fn forward_backward(&mut self, seqs: &[Seq], dlogp: DLogp) -> Result<Vec<TokenStats>> {
        let p = self.pack(seqs)?;
        // The embedding's gradient plan, unless a LoRA adapter trains instead.
        let plan = match &mut self.lora {
            Some(l) => {
                l.upload_seeds(&self.gpu, &self.dropout_seeds, &p.spans)?;
                None
            }
            None => Some(self.gpu.embedding_grad_plan(&p.ids, self.dims.vocab)?),
        };
        if let DLogp::Fixed(dl) = &dlogp {
            self.upload_row_weights(&p, dl)?; // before the forward: a bad gradient fails early
        }
        self.forward(p.n, true)?;
        let stats = match dlogp {
            DLogp::Fixed(_) => None,
            DLogp::FromStats(f) => {
                self.head_stats(p.n)?;
                let stats = self.token_stats_of(&p, true)?;
                let dl = f(&stats);
                self.upload_row_weights(&p, &dl)?;
                Some(stats)
            }
        };
        self.head_grad(p.n)?;
        self.backward(p.n, plan.as_ref())?;
        match stats {
            Some(s) => Ok(s),
            None => self.token_stats_of(&p, false),
        }
    }
}
