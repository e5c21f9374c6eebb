//! The decoder: init, forward (logits), and forward + backward with a caller-supplied
//! d loss / d logp.

use anyhow::{bail, Context, Result};

use crate::config::ModelConfig;
use crate::lora::{LoraActs, LoraCall, Target};
use crate::ops::{self, AttentionShape, Qkv, QkvGrads};
use crate::params::{layout, param_specs, LayerIdx, Layout, Params, Tensor};
use crate::rng::{fnv1a, SplitMix64};

/// A Llama / Qwen2 / Qwen3 / Mistral decoder with f32 parameters.
#[derive(Debug)]
pub struct Model {
    pub config: ModelConfig,
    pub params: Params,
    /// Training only: the bottom `frozen_layers` decoder layers get no gradient, so the backward
    /// pass stops above them (and the input embedding gets none either; a tied head's rows still
    /// get the head's). With the bottom two thirds frozen a step costs about half as much. 0: all
    /// layers train. Not saved: a property of a run, not of the weights.
    pub frozen_layers: usize,
    /// Training and the trainer's log-probs (`logits`, `forward_backward`): what the linear
    /// layers' and the head's products multiply, f32 (the reference) or both inputs rounded to
    /// bf16 (on AMX tiles where the CPU has them). Decoding has its own format
    /// ([`Model::prepare_decoding_as`]). Not saved: a property of a run.
    pub matmul: crate::MatmulDtype,
    /// The linear weights packed for decoding, from `params` as they are at the first decode
    /// call (decoding serves frozen weights: training never decodes; a clone starts without).
    decode_weights: std::sync::OnceLock<Option<crate::decode_weights::DecodeWeights>>,
    /// A LoRA adapter on the linear layers (see [`crate::lora`]), kept apart from `params`: the
    /// forward adds its term, and with one `forward_backward` trains it alone (the base gets no
    /// gradient). Decoding needs it merged ([`Model::merge_lora`]; [`Model::load`] merges).
    pub lora: Option<crate::lora::Lora>,
}

impl Clone for Model {
    fn clone(&self) -> Model {
        Model { config: self.config.clone(), params: self.params.clone(), frozen_layers: self.frozen_layers, matmul: self.matmul, decode_weights: Default::default(), lora: self.lora.clone() }
    }
}

/// One sequence (or a packed row of several).
#[derive(Clone, Copy, Debug)]
pub struct Seq<'a> {
    /// Token ids `[T]`.
    pub input_ids: &'a [u32],
    /// Optional segment ids `[T]` for packed rows: a segment is a maximal run of equal ids;
    /// attention is causal within a segment only and RoPE positions restart at each segment.
    pub segment_ids: Option<&'a [i32]>,
    /// With segments: the first `shared_prefix` tokens (the first segment) are a prompt every later
    /// segment continues: they see it too and their RoPE positions start after it. Rows that share
    /// a prompt, packed as `prefix | tail 1 | tail 2 | …`, compute what each `prefix | tail`
    /// computes alone (see `ops::attention_forward_prefix`). 0: none.
    pub shared_prefix: usize,
}

impl<'a> Seq<'a> {
    pub fn new(input_ids: &'a [u32]) -> Self {
        Seq { input_ids, segment_ids: None, shared_prefix: 0 }
    }
}

/// Per-token statistics, both `[T]`. `logp[t] = log p(ids[t] | earlier ids of its segment)`,
/// predicted from position t−1 (HF unshifted-labels convention); `entropy[t]` is the entropy of
/// that predictive distribution (nats). Both are 0 where t starts a segment (t = 0 included).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenStats {
    pub logp: Vec<f32>,
    pub entropy: Vec<f32>,
}

/// Above this many logits (T·V floats, 512 MB) the head works in row chunks and recomputes the
/// logits in the backward instead of keeping them all.
const LOGITS_CACHE_LIMIT: usize = 128 << 20;
/// Rows per chunk of the head's evaluation-only passes (the logits are never kept).
const HEAD_CHUNK_ROWS: usize = 256;

/// Rows per chunk of a training step's head when its logits are not kept: as many as two chunk
/// buffers (logits and their gradient) hold within `limit` floats, since every chunk packs the
/// whole head weight `[V, D]` for the matrix kernel again (three times: logits, recomputed
/// logits, d hidden); with 256-row chunks that packing cost as much as a third of the head.
fn head_chunk_rows(v: usize, limit: usize) -> usize {
    (limit / 2 / v.max(1)).max(HEAD_CHUNK_ROWS)
}

/// Activations of one layer kept for the backward.
#[derive(Default)]
struct LayerActs {
    x: Vec<f32>,     // [T,D] layer input (residual stream)
    rstd1: Vec<f32>, // [T]
    h1: Vec<f32>,    // [T,D] input_layernorm output
    q: Vec<f32>,     // [T,Hq*hd] after RoPE
    k: Vec<f32>,     // [T,Hk*hd] after RoPE
    v: Vec<f32>,     // [T,Hk*hd]
    att: Vec<f32>,   // [T,Hq*hd] attention output (before o_proj)
    lse: Vec<f32>,   // [T,Hq]
    x2: Vec<f32>,    // [T,D] residual after attention
    rstd2: Vec<f32>, // [T]
    h2: Vec<f32>,    // [T,D] post_attention_layernorm output
    g: Vec<f32>,     // [T,I] gate_proj output
    u: Vec<f32>,     // [T,I] up_proj output
    a: Vec<f32>,     // [T,I] silu(g)*u
    lora: [LoraActs; 7], // per LoRA target (Target as usize)
    // Qwen3's q/k norm only (else empty): q, k before the norm, and the norm's rstd.
    qr: Vec<f32>,    // [T,Hq*hd]
    kr: Vec<f32>,    // [T,Hk*hd]
    rstdq: Vec<f32>, // [T,Hq]
    rstdk: Vec<f32>, // [T,Hk]
}

impl LayerActs {
    /// Sizes every buffer for `t` tokens (contents are overwritten by the forward).
    fn fit(&mut self, c: &ModelConfig, t: usize) {
        let (d, qd, kvd, i) = (c.hidden_size, c.num_attention_heads * c.head_dim(), c.num_key_value_heads * c.head_dim(), c.intermediate_size);
        for (v, n) in [
            (&mut self.x, t * d),
            (&mut self.rstd1, t),
            (&mut self.h1, t * d),
            (&mut self.q, t * qd),
            (&mut self.k, t * kvd),
            (&mut self.v, t * kvd),
            (&mut self.att, t * qd),
            (&mut self.lse, t * c.num_attention_heads),
            (&mut self.x2, t * d),
            (&mut self.rstd2, t),
            (&mut self.h2, t * d),
            (&mut self.g, t * i),
            (&mut self.u, t * i),
            (&mut self.a, t * i),
        ] {
            fit(v, n);
        }
        let qk = if c.qk_norm() { t } else { 0 };
        for (v, n) in [
            (&mut self.qr, qk * qd),
            (&mut self.kr, qk * kvd),
            (&mut self.rstdq, qk * c.num_attention_heads),
            (&mut self.rstdk, qk * c.num_key_value_heads),
        ] {
            fit(v, n);
        }
    }
}

/// Resizes `v` to `n` values without touching the ones it keeps: a reused buffer costs no
/// allocation (nor page faults) once it has been as long.
fn fit(v: &mut Vec<f32>, n: usize) {
    v.resize(n, 0.0);
}

/// `v` resized to `n` zeros.
fn zeroed(v: &mut Vec<f32>, n: usize) {
    v.clear();
    v.resize(n, 0.0);
}

/// Every buffer of a forward + backward (activations, head, gradients of activations),
/// allocated on first use and reused by later calls (llm.c style: a training run allocates its
/// memory once). A longer sequence grows them. Pass one to [`Model::forward_backward_in`]; the
/// other entry points make a fresh one per call.
#[derive(Default)]
pub struct Workspace {
    /// Activations of the trained layers, kept for the backward.
    layers: Vec<LayerActs>,
    /// A layer whose activations are not kept (inference, frozen layers).
    scratch: LayerActs,
    /// Residual stream `[T, D]`.
    x: Vec<f32>,
    /// Final norm: rstd `[T]`, output `[T, D]`.
    rstd_f: Vec<f32>,
    hf: Vec<f32>,
    /// Final norm output at the head's rows `[n, D]`, and its gradient.
    hs: Vec<f32>,
    dhs: Vec<f32>,
    /// Probabilities then d logits `[n, V]` (or a chunk of rows of them), and a second chunk.
    head: Vec<f32>,
    head2: Vec<f32>,
    /// d loss / d residual `[T, D]`, and d loss / d final norm output `[T, D]`.
    dx: Vec<f32>,
    dhf: Vec<f32>,
    back: BackBufs,
    /// Most logits kept at once (floats); `None`: [`LOGITS_CACHE_LIMIT`].
    logits_limit: Option<usize>,
}

impl Workspace {
    /// A workspace that keeps at most `floats` logits (head rows × vocabulary) at once: above
    /// it the head of a training step runs in row chunks and computes the logits twice (less
    /// memory, more work). The default is 128 Mi floats (512 MB). The result is the same either
    /// way, up to float rounding of the head's weight gradient.
    pub fn with_logits_limit(floats: usize) -> Workspace {
        Workspace { logits_limit: Some(floats), ..Workspace::default() }
    }
}

/// Sequence-level context shared by forward and backward.
struct SeqCtx {
    t: usize,
    seg_start: Vec<usize>,
    /// Shared prefix length (see [`Seq::shared_prefix`]).
    prefix: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Each layer's sliding window (0: none), [`ModelConfig::layer_windows`].
    windows: Vec<usize>,
}

impl SeqCtx {
    /// The attention shape of a layer of model `c` whose sliding window is `window`.
    fn attention<'a>(&'a self, c: &ModelConfig, window: usize) -> AttentionShape<'a> {
        AttentionShape {
            seg_start: &self.seg_start,
            prefix: self.prefix,
            window,
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim(),
        }
    }
}

/// One decoder layer as a pass sees it.
#[derive(Clone, Copy)]
struct LayerAt<'a> {
    /// Its number.
    l: usize,
    /// Its tensors.
    idx: &'a LayerIdx,
    /// Its sliding window (0: none).
    window: usize,
}

/// A linear layer `out[T, o] = x[T, i] wᵀ + bias`: its tensors (indices into the parameters)
/// and its shape.
#[derive(Clone, Copy)]
struct Linear {
    w: usize,
    bias: Option<usize>,
    i: usize,
    o: usize,
}

impl Model {
    /// A fresh model with HF-style init: every linear weight and the embedding ~ N(0,
    /// initializer_range), biases 0, norm weights 1. Deterministic from `seed` (each tensor has its
    /// own stream, keyed by its name).
    pub fn init(config: ModelConfig, seed: u64) -> Result<Model> {
        config.validate()?;
        let std = config.initializer_range;
        let tensors = param_specs(&config)
            .into_iter()
            .map(|s| {
                let mut t = Tensor::zeros(s.name.clone(), s.shape.clone());
                if s.name.ends_with("norm.weight") {
                    t.data.iter_mut().for_each(|x| *x = 1.0);
                } else if s.name.ends_with(".weight") {
                    let mut rng = SplitMix64::new(seed ^ fnv1a(&s.name).rotate_left(17));
                    let mut i = 0;
                    let n = t.data.len();
                    while i < n {
                        // Box-Muller: two normals per pair of uniforms.
                        let u1 = rng.unit_nonzero();
                        let u2 = rng.unit_nonzero();
                        let r = (-2.0 * u1.ln()).sqrt();
                        let th = 2.0 * std::f64::consts::PI * u2;
                        t.data[i] = (std * r * th.cos()) as f32;
                        if i + 1 < n {
                            t.data[i + 1] = (std * r * th.sin()) as f32;
                        }
                        i += 2;
                    }
                }
                t
            })
            .collect();
        Ok(Model { config, params: Params { tensors }, frozen_layers: 0, matmul: Default::default(), decode_weights: Default::default(), lora: None })
    }

    /// The weights packed for decoding, packed on the first call in f32 unless
    /// [`Model::prepare_decoding_as`] chose another format (`None`: the CPU has no packed kernel,
    /// and decoding multiplies the f32 weights as they are).
    pub(crate) fn decode_weights(&self) -> Option<&crate::decode_weights::DecodeWeights> {
        self.decode_weights.get_or_init(|| crate::decode_weights::DecodeWeights::new(&self.config, &self.params, crate::DecodeDtype::F32)).as_ref()
    }

    /// Packs the weights for decoding now (a copy of the linear layers, as many bytes again),
    /// rather than in the first decode call: part of loading a model to decode with.
    pub fn prepare_decoding(&self) {
        self.decode_weights();
    }

    /// [`Model::prepare_decoding`] in `dtype`: every later decode call multiplies the weights as
    /// that format holds them ([`crate::DecodeDtype::round_weight`]). A clone of the model starts
    /// unprepared (f32 unless prepared again). An error if this model
    /// already decodes in another format, or if `dtype` is not f32 and the CPU has no packed
    /// kernel (x86-64 with AVX2 and FMA).
    pub fn prepare_decoding_as(&self, dtype: crate::DecodeDtype) -> Result<()> {
        let got = self.decode_weights.get_or_init(|| crate::decode_weights::DecodeWeights::new(&self.config, &self.params, dtype));
        match got {
            Some(dw) if dw.dtype != dtype => {
                bail!("this model already decodes with {} weights, not {dtype} (load it again to change)", dw.dtype)
            }
            None if dtype != crate::DecodeDtype::F32 => {
                bail!("{dtype} decoding weights need an x86-64 CPU with AVX2 and FMA (this one decodes in f32 only)")
            }
            _ => Ok(()),
        }
    }

    /// Every weight matrix (the embedding table, the linear layers, the head) rounded as `dtype`
    /// holds it ([`crate::DecodeDtype::round_weight`]); norms and biases as they are. What
    /// decoding with `prepare_decoding_as(dtype)` multiplies: f32 decoding of the result gives
    /// its bits.
    pub fn round_weights(&mut self, dtype: crate::DecodeDtype) {
        for t in self.params.iter_mut().filter(|t| t.shape.len() == 2) {
            let k = t.shape[1];
            dtype.round_weight(&mut t.data, k);
        }
    }

    /// The format decoding holds the weights in (f32 until the first decode call or
    /// [`Model::prepare_decoding_as`]).
    pub fn decode_dtype(&self) -> crate::DecodeDtype {
        self.decode_weights.get().and_then(|d| d.as_ref()).map_or(crate::DecodeDtype::F32, |d| d.dtype)
    }

    /// Wrap existing parameters; errors unless they match the config's canonical layout.
    pub fn new(config: ModelConfig, params: Params) -> Result<Model> {
        config.validate()?;
        let m = Model { config, params, frozen_layers: 0, matmul: Default::default(), decode_weights: Default::default(), lora: None };
        m.check_layout()?;
        Ok(m)
    }

    /// Error unless `self.params` has exactly the tensors the config calls for, in order.
    pub fn check_layout(&self) -> Result<()> {
        let specs = param_specs(&self.config);
        if specs.len() != self.params.tensors.len() {
            bail!(
                "model has {} parameter tensors, the config calls for {}",
                self.params.tensors.len(),
                specs.len()
            );
        }
        for (s, t) in specs.iter().zip(&self.params.tensors) {
            if s.name != t.name {
                bail!("parameter tensor {} found where {} was expected", t.name, s.name);
            }
            let n: usize = s.shape.iter().product();
            if s.shape != t.shape || t.data.len() != n {
                bail!(
                    "tensor {} has shape {:?} ({} values), expected {:?}",
                    t.name,
                    t.shape,
                    t.data.len(),
                    s.shape
                );
            }
        }
        Ok(())
    }

    /// Every id must be < vocab_size; the error names the position and the id.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let v = self.config.vocab_size;
        if let Some((pos, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= v) {
            bail!("token id {id} at position {pos} is outside the vocabulary (vocab_size = {v})");
        }
        Ok(())
    }

    fn check_seq(&self, seq: &Seq) -> Result<SeqCtx> {
        let t = seq.input_ids.len();
        if t == 0 {
            bail!("input_ids is empty");
        }
        self.check_ids(seq.input_ids)?;
        if let Some(s) = seq.segment_ids {
            if s.len() != t {
                bail!("segment_ids has length {}, input_ids has length {t}", s.len());
            }
        }
        if seq.shared_prefix > 0 && seq.segment_ids.is_none() {
            bail!("a shared prefix ({} tokens) needs segment ids", seq.shared_prefix);
        }
        let (pos, seg_start) = ops::segment_layout_prefix(t, seq.segment_ids, seq.shared_prefix)?;
        let (cos, sin) = self.config.rope_tables(&pos);
        let windows = self.config.layer_windows()?;
        Ok(SeqCtx { t, seg_start, prefix: seq.shared_prefix, cos, sin, windows })
    }

    fn p(&self, i: usize) -> &[f32] {
        &self.params.tensors[i].data
    }

    fn pb(&self, i: Option<usize>) -> Option<&[f32]> {
        i.map(|i| self.params.tensors[i].data.as_slice())
    }

    /// Forward of one layer: `a.x` `[T, D]` holds the layer input on entry; the activations
    /// are written into `a` and the output residual into `y` `[T, D]`.
    /// `l` is the layer's number; `train`: a training forward (LoRA dropout on, its activations
    /// kept).
    fn layer_forward(&self, layer: LayerAt, a: &mut LayerActs, y: &mut [f32], cx: &SeqCtx, train: bool) {
        let LayerAt { l, idx: li, window } = layer;
        let c = &self.config;
        let (t, d, hd, nh, nkv, inter) =
            (cx.t, c.hidden_size, c.head_dim(), c.num_attention_heads, c.num_key_value_heads, c.intermediate_size);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let eps = c.rms_norm_eps as f32;
        ops::rmsnorm_forward(&mut a.h1, &mut a.rstd1, &a.x, self.p(li.ln1), eps, d);
        // With Qwen3's q/k norm the projections land in qr / kr and the norm writes q / k.
        let (qdst, kdst) = if li.qn.is_some() { (&mut a.qr, &mut a.kr) } else { (&mut a.q, &mut a.k) };
        ops::linear_forward_as(self.matmul, qdst, &a.h1, self.p(li.wq), self.pb(li.bq), (t, d, qd));
        ops::linear_forward_as(self.matmul, kdst, &a.h1, self.p(li.wk), self.pb(li.bk), (t, d, kvd));
        ops::linear_forward_as(self.matmul, &mut a.v, &a.h1, self.p(li.wv), self.pb(li.bv), (t, d, kvd));
        if let Some(lo) = &self.lora {
            // q and k before Qwen3's norm: the adapter adds to the projection, as PEFT's does
            let (qdst, kdst) = if li.qn.is_some() { (&mut a.qr, &mut a.kr) } else { (&mut a.q, &mut a.k) };
            for (tg, out) in [(Target::Q, qdst), (Target::K, kdst), (Target::V, &mut a.v)] {
                lo.forward(self.lora_call(l, tg, train), &a.h1, out, t, Some(&mut a.lora[tg as usize]));
            }
        }
        if let (Some(qn), Some(kn)) = (li.qn, li.kn) {
            ops::rmsnorm_forward(&mut a.q, &mut a.rstdq, &a.qr, self.p(qn), eps, hd);
            ops::rmsnorm_forward(&mut a.k, &mut a.rstdk, &a.kr, self.p(kn), eps, hd);
        }
        ops::rope_forward(&mut a.q, &cx.cos, &cx.sin, nh, hd);
        ops::rope_forward(&mut a.k, &cx.cos, &cx.sin, nkv, hd);
        ops::attention_forward_prefix(&mut a.att, &mut a.lse, Qkv { q: &a.q, k: &a.k, v: &a.v }, cx.attention(c, window), self.matmul);
        ops::linear_forward_as(self.matmul, &mut a.x2, &a.att, self.p(li.wo), self.pb(li.bo), (t, qd, d));
        if let Some(lo) = &self.lora {
            lo.forward(self.lora_call(l, Target::O, train), &a.att, &mut a.x2, t, Some(&mut a.lora[Target::O as usize]));
        }
        a.x2.iter_mut().zip(&a.x).for_each(|(s, b)| *s += b);
        ops::rmsnorm_forward(&mut a.h2, &mut a.rstd2, &a.x2, self.p(li.ln2), eps, d);
        ops::linear_forward_as(self.matmul, &mut a.g, &a.h2, self.p(li.wg), self.pb(li.bg), (t, d, inter));
        ops::linear_forward_as(self.matmul, &mut a.u, &a.h2, self.p(li.wu), self.pb(li.bu), (t, d, inter));
        if let Some(lo) = &self.lora {
            for (tg, out) in [(Target::Gate, &mut a.g), (Target::Up, &mut a.u)] {
                lo.forward(self.lora_call(l, tg, train), &a.h2, out, t, Some(&mut a.lora[tg as usize]));
            }
        }
        ops::swiglu_forward(&mut a.a, &a.g, &a.u);
        ops::linear_forward_as(self.matmul, y, &a.a, self.p(li.wd), self.pb(li.bd), (t, inter, d));
        if let Some(lo) = &self.lora {
            lo.forward(self.lora_call(l, Target::Down, train), &a.a, y, t, Some(&mut a.lora[Target::Down as usize]));
        }
        y.iter_mut().zip(&a.x2).for_each(|(s, b)| *s += b);
    }

    /// Embedding + all layers: `ws.x` `[T, D]` ends as the decoder layers' output; the
    /// activations of layers `keep_from..` are kept in `ws.layers` for the backward (`None`:
    /// none kept).
    fn trunk_forward(&self, lay: &Layout, ids: &[u32], cx: &SeqCtx, keep_from: Option<usize>, ws: &mut Workspace) {
        let d = self.config.hidden_size;
        fit(&mut ws.x, cx.t * d);
        ops::embedding_forward(&mut ws.x, ids, self.p(lay.embed), d);
        let n_kept = keep_from.map_or(0, |k| lay.layers.len() - k);
        ws.layers.resize_with(n_kept, LayerActs::default);
        for (l, li) in lay.layers.iter().enumerate() {
            let a = match keep_from {
                Some(k) if l >= k => &mut ws.layers[l - k],
                _ => &mut ws.scratch,
            };
            a.fit(&self.config, cx.t);
            a.x.copy_from_slice(&ws.x);
            self.layer_forward(LayerAt { l, idx: li, window: cx.windows[l] }, a, &mut ws.x, cx, keep_from.is_some());
        }
    }

    fn head_weight(&self, lay: &Layout) -> usize {
        lay.lm_head.unwrap_or(lay.embed)
    }

    /// Logits `[T, V]`, row-major: row t is the distribution of token t+1.
    pub fn logits(&self, seq: &Seq) -> Result<Vec<f32>> {
        self.check_layout()?;
        let cx = self.check_seq(seq)?;
        let lay = layout(&self.config);
        let (d, v) = (self.config.hidden_size, self.config.vocab_size);
        let mut ws = Workspace::default();
        self.final_norm(&lay, seq.input_ids, &cx, None, &mut ws);
        let mut logits = vec![0f32; cx.t * v];
        ops::linear_forward_as(self.matmul, &mut logits, &ws.hf, self.p(self.head_weight(&lay)), None, (cx.t, d, v));
        Ok(logits)
    }

    /// The trunk (see [`Model::trunk_forward`]), then the final norm into `ws.hf` `[T, D]`.
    fn final_norm(&self, lay: &Layout, ids: &[u32], cx: &SeqCtx, keep_from: Option<usize>, ws: &mut Workspace) {
        let d = self.config.hidden_size;
        self.trunk_forward(lay, ids, cx, keep_from, ws);
        fit(&mut ws.rstd_f, cx.t);
        fit(&mut ws.hf, cx.t * d);
        ops::rmsnorm_forward(&mut ws.hf, &mut ws.rstd_f, &ws.x, self.p(lay.norm), self.config.rms_norm_eps as f32, d);
    }

    /// Token statistics only (no backward).
    pub fn token_stats(&self, seq: &Seq) -> Result<TokenStats> {
        self.token_stats_at(seq, None)
    }

    /// Token statistics of the tokens with `need[t] != 0` (the others 0), the head run on their
    /// rows only (see [`Model::forward_backward_at`]). `None`: every token.
    pub fn token_stats_at(&self, seq: &Seq, need: Option<&[u8]>) -> Result<TokenStats> {
        self.check_layout()?;
        let cx = self.check_seq(seq)?;
        let lay = layout(&self.config);
        let (d, v) = (self.config.hidden_size, self.config.vocab_size);
        let head = HeadRows::new(seq.input_ids, &cx.seg_start, need)?;
        let mut ws = Workspace::default();
        self.final_norm(&lay, seq.input_ids, &cx, None, &mut ws);
        head.gather(&mut ws.hs, &ws.hf, d);
        let n = head.rows.len();
        let (mut lp, mut en, mut lse) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        let mut buf = vec![0f32; HEAD_CHUNK_ROWS.min(n) * v];
        for r0 in (0..n).step_by(HEAD_CHUNK_ROWS) {
            let r1 = (r0 + HEAD_CHUNK_ROWS).min(n);
            let z = &mut buf[..(r1 - r0) * v];
            ops::linear_forward_as(self.matmul, z, &ws.hs[r0 * d..r1 * d], self.p(self.head_weight(&lay)), None, (r1 - r0, d, v));
            ops::logsoftmax_forward(&mut lp[r0..r1], &mut en[r0..r1], &mut lse[r0..r1], z, &head.targets[r0..r1], v);
        }
        Ok(head.token_stats(cx.t, &lp, &en))
    }

    /// Forward, then `dloss_dlogp(&stats)` → d loss / d logp[t] (len T), then backward, ADDING
    /// the parameter gradients into `grads` (which must have the layout of `self.params`).
    /// Returns the stats. Entries of d loss / d logp at segment starts are ignored.
    pub fn forward_backward(
        &self,
        seq: &Seq,
        grads: &mut Params,
        dloss_dlogp: &mut dyn FnMut(&TokenStats) -> Vec<f32>,
    ) -> Result<TokenStats> {
        self.forward_backward_at(seq, None, grads, dloss_dlogp)
    }

    /// [`Model::forward_backward`] where only the tokens with `need[t] != 0` carry a loss: the
    /// head (logits, log-softmax and their backward) runs on the rows predicting those tokens
    /// only, their stats are exact, the others' are 0 and their d loss / d logp must be 0. For
    /// SFT and DAPO `need` is the target mask: prompt and observation tokens (about half of a
    /// CoA row) cost no head work. `None`: every token.
    pub fn forward_backward_at(
        &self,
        seq: &Seq,
        need: Option<&[u8]>,
        grads: &mut Params,
        dloss_dlogp: &mut dyn FnMut(&TokenStats) -> Vec<f32>,
    ) -> Result<TokenStats> {
        self.forward_backward_in(&mut Workspace::default(), seq, need, grads, dloss_dlogp)
    }

    /// [`Model::forward_backward_at`] in the buffers of `ws`, which a training loop keeps from
    /// one call to the next (no allocation once they have grown to the longest sequence). The
    /// result does not depend on what `ws` held before.
    pub fn forward_backward_in(
        &self,
        ws: &mut Workspace,
        seq: &Seq,
        need: Option<&[u8]>,
        grads: &mut Params,
        dloss_dlogp: &mut dyn FnMut(&TokenStats) -> Vec<f32>,
    ) -> Result<TokenStats> {
        self.check_layout()?;
        // With an adapter only it trains: `grads` is laid out as its tensors, the base gets none.
        let (mut base, mut lg) = match &self.lora {
            Some(lora) => {
                grads
                    .check_same_layout(&lora.params, "gradient buffer vs LoRA adapter")
                    .context("forward_backward with a LoRA adapter: grads must be Params::zeros_like(&lora.params)")?;
                if self.frozen_layers > 0 {
                    bail!("frozen layers and a LoRA adapter do not combine (the adapter trains every layer it targets)");
                }
                (None, Some(grads))
            }
            None => {
                grads
                    .check_same_layout(&self.params, "gradient buffer vs model parameters")
                    .context("forward_backward: grads must be Params::zeros_like(&model.params) (or an accumulation of it)")?;
                (Some(grads), None)
            }
        };
        let cx = self.check_seq(seq)?;
        let c = &self.config;
        let lay = layout(c);
        let (t, d, v) = (cx.t, c.hidden_size, c.vocab_size);
        let ids = seq.input_ids;
        let head = HeadRows::new(ids, &cx.seg_start, need)?;

        // ---- forward
        if self.frozen_layers > c.num_hidden_layers {
            bail!("{} frozen layers, but the model has {}", self.frozen_layers, c.num_hidden_layers);
        }
        let frozen = self.frozen_layers;
        self.final_norm(&lay, ids, &cx, Some(frozen), ws);
        let wh = self.head_weight(&lay);
        // The head works on the selected rows only: hs[n, D] = hf[rows].
        let n = head.rows.len();
        head.gather(&mut ws.hs, &ws.hf, d);
        let mut row_lp = vec![0f32; n];
        let mut row_en = vec![0f32; n];
        let mut row_lse = vec![0f32; n];
        let limit = ws.logits_limit.unwrap_or(LOGITS_CACHE_LIMIT);
        let cache = n * v <= limit;
        let chunk = head_chunk_rows(v, limit);
        if cache {
            // ws.head [n, V]: the logits, then the probabilities (the head backward reads them)
            fit(&mut ws.head, n * v);
            ops::linear_forward_as(self.matmul, &mut ws.head, &ws.hs, self.p(wh), None, (n, d, v));
            ops::logsoftmax_forward_inplace(&mut row_lp, &mut row_en, &mut row_lse, &mut ws.head, &head.targets, v);
        } else {
            fit(&mut ws.head, chunk * v);
            for r0 in (0..n).step_by(chunk) {
                let r1 = (r0 + chunk).min(n);
                let z = &mut ws.head[..(r1 - r0) * v];
                ops::linear_forward_as(self.matmul, z, &ws.hs[r0 * d..r1 * d], self.p(wh), None, (r1 - r0, d, v));
                ops::logsoftmax_forward(
                    &mut row_lp[r0..r1],
                    &mut row_en[r0..r1],
                    &mut row_lse[r0..r1],
                    z,
                    &head.targets[r0..r1],
                    v,
                );
            }
        }
        let stats = head.token_stats(t, &row_lp, &row_en);

        // ---- d loss / d logp
        let dlogp_tok = dloss_dlogp(&stats);
        if dlogp_tok.len() != t {
            bail!("d loss / d logp has length {}, the sequence has {t} tokens", dlogp_tok.len());
        }
        if let Some((pos, x)) = dlogp_tok.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            bail!("d loss / d logp at position {pos} is not finite ({x})");
        }
        if let Some(need) = need {
            if let Some(pos) = (1..t).find(|&p| need[p] == 0 && dlogp_tok[p] != 0.0 && cx.seg_start[p] != p) {
                bail!("d loss / d logp at position {pos} is {} but the position was not asked for (need[{pos}] = 0)", dlogp_tok[pos]);
            }
        }
        // selected row k predicts token rows[k] + 1
        let dlogp_row: Vec<f32> = head.rows.iter().map(|&r| dlogp_tok[r + 1]).collect();

        // ---- backward: head
        zeroed(&mut ws.dhs, n * d);
        {
            if cache {
                // overwrite the probabilities with dlogits
                let dl = &mut ws.head;
                ops::logsoftmax_backward_from_probs(dl, &head.targets, &dlogp_row, v);
                self.lin_back(&mut base, Linear { w: wh, bias: None, i: d, o: v }, (&mut ws.dhs, 1.0), dl, &ws.hs, n);
            } else {
                fit(&mut ws.head2, chunk * v);
                for r0 in (0..n).step_by(chunk) {
                    let r1 = (r0 + chunk).min(n);
                    let m = r1 - r0;
                    let (zc, dzc) = (&mut ws.head[..m * v], &mut ws.head2[..m * v]);
                    ops::linear_forward_as(self.matmul, zc, &ws.hs[r0 * d..r1 * d], self.p(wh), None, (m, d, v));
                    ops::logsoftmax_backward(dzc, zc, &row_lse[r0..r1], &head.targets[r0..r1], &dlogp_row[r0..r1], v);
                    self.lin_back(&mut base, Linear { w: wh, bias: None, i: d, o: v }, (&mut ws.dhs[r0 * d..r1 * d], 1.0), dzc, &ws.hs[r0 * d..r1 * d], m);
                }
            }
        }
        head.scatter(&mut ws.dhf, &ws.dhs, t, d);
        zeroed(&mut ws.dx, t * d);
        ws.back.fit(c, t);
        let dnorm = norm_grad(&mut base, &mut ws.back.dnorm, lay.norm, d);
        ops::rmsnorm_backward(&mut ws.dx, dnorm, &ws.dhf, &ws.x, self.p(lay.norm), &ws.rstd_f, d);

        // ---- backward: layers
        for (((l, li), a), &window) in lay.layers.iter().enumerate().skip(frozen).zip(&ws.layers).zip(&cx.windows[frozen..]).rev() {
            self.layer_backward(LayerAt { l, idx: li, window }, a, &cx, &mut ws.dx, &mut base, &mut lg, &mut ws.back);
        }
        if let (0, Some(g)) = (frozen, base) {
            ops::embedding_backward(&mut g.tensors[lay.embed].data, &ws.dx, ids, d);
        }
        Ok(stats)
    }

    /// Backward of one layer (number `l`): `dx[T,D]` holds d loss / d (layer output) on entry
    /// and d loss / d (layer input) on exit. The base's gradients go into `base` (`None`: a
    /// frozen base under LoRA), the adapter's into `lg`.
    #[allow(clippy::too_many_arguments)]
    fn layer_backward(&self, layer: LayerAt, a: &LayerActs, cx: &SeqCtx, dx: &mut [f32], base: &mut Option<&mut Params>, lg: &mut Option<&mut Params>, b: &mut BackBufs) {
        let LayerAt { l, idx: li, window } = layer;
        let c = &self.config;
        let (t, d, hd, nh, nkv, inter) =
            (cx.t, c.hidden_size, c.head_dim(), c.num_attention_heads, c.num_key_value_heads, c.intermediate_size);
        let (qd, kvd) = (nh * hd, nkv * hd);
        // MLP: x3 = x2 + down(silu(gate(h2)) * up(h2)), h2 = rmsnorm(x2)
        self.lin_back(base, Linear { w: li.wd, bias: li.bd, i: inter, o: d }, (&mut b.da, 0.0), dx, &a.a, t);
        self.lora_back(lg, self.lora_call(l, Target::Down, true), &a.a, a, dx, &mut b.da, t);
        b.dg.iter_mut().for_each(|x| *x = 0.0);
        b.du.iter_mut().for_each(|x| *x = 0.0);
        ops::swiglu_backward(&mut b.dg, &mut b.du, &b.da, &a.g, &a.u);
        self.lin_back(base, Linear { w: li.wg, bias: li.bg, i: d, o: inter }, (&mut b.dh, 0.0), &b.dg, &a.h2, t);
        self.lora_back(lg, self.lora_call(l, Target::Gate, true), &a.h2, a, &b.dg, &mut b.dh, t);
        self.lin_back(base, Linear { w: li.wu, bias: li.bu, i: d, o: inter }, (&mut b.dh, 1.0), &b.du, &a.h2, t);
        self.lora_back(lg, self.lora_call(l, Target::Up, true), &a.h2, a, &b.du, &mut b.dh, t);
        let dn = norm_grad(base, &mut b.dnorm, li.ln2, d);
        ops::rmsnorm_backward(dx, dn, &b.dh, &a.x2, self.p(li.ln2), &a.rstd2, d);
        // Attention: x2 = x + o_proj(attn(rope(q(h1)), rope(k(h1)), v(h1))), h1 = rmsnorm(x)
        self.lin_back(base, Linear { w: li.wo, bias: li.bo, i: qd, o: d }, (&mut b.datt, 0.0), dx, &a.att, t);
        self.lora_back(lg, self.lora_call(l, Target::O, true), &a.att, a, dx, &mut b.datt, t);
        b.dq.iter_mut().for_each(|x| *x = 0.0);
        b.dk.iter_mut().for_each(|x| *x = 0.0);
        b.dv.iter_mut().for_each(|x| *x = 0.0);
        let grads = QkvGrads { dq: &mut b.dq, dk: &mut b.dk, dv: &mut b.dv };
        ops::attention_backward_prefix(grads, &b.datt, Qkv { q: &a.q, k: &a.k, v: &a.v }, &a.att, &a.lse, cx.attention(c, window), self.matmul);
        ops::rope_backward(&mut b.dq, &cx.cos, &cx.sin, nh, hd);
        ops::rope_backward(&mut b.dk, &cx.cos, &cx.sin, nkv, hd);
        // Through Qwen3's q/k norm: d loss / d (q, k before it) into dqr / dkr.
        let (dqp, dkp) = if let (Some(qn), Some(kn)) = (li.qn, li.kn) {
            zeroed(&mut b.dqr, t * qd);
            zeroed(&mut b.dkr, t * kvd);
            let dn = norm_grad(base, &mut b.dnorm, qn, hd);
            ops::rmsnorm_backward(&mut b.dqr, dn, &b.dq, &a.qr, self.p(qn), &a.rstdq, hd);
            let dn = norm_grad(base, &mut b.dnorm, kn, hd);
            ops::rmsnorm_backward(&mut b.dkr, dn, &b.dk, &a.kr, self.p(kn), &a.rstdk, hd);
            (&b.dqr, &b.dkr)
        } else {
            (&b.dq, &b.dk)
        };
        self.lin_back(base, Linear { w: li.wq, bias: li.bq, i: d, o: qd }, (&mut b.dh, 0.0), dqp, &a.h1, t);
        self.lora_back(lg, self.lora_call(l, Target::Q, true), &a.h1, a, dqp, &mut b.dh, t);
        self.lin_back(base, Linear { w: li.wk, bias: li.bk, i: d, o: kvd }, (&mut b.dh, 1.0), dkp, &a.h1, t);
        self.lora_back(lg, self.lora_call(l, Target::K, true), &a.h1, a, dkp, &mut b.dh, t);
        self.lin_back(base, Linear { w: li.wv, bias: li.bv, i: d, o: kvd }, (&mut b.dh, 1.0), &b.dv, &a.h1, t);
        self.lora_back(lg, self.lora_call(l, Target::V, true), &a.h1, a, &b.dv, &mut b.dh, t);
        let dn = norm_grad(base, &mut b.dnorm, li.ln1, d);
        ops::rmsnorm_backward(dx, dn, &b.dh, &a.x, self.p(li.ln1), &a.rstd1, d);
    }

    /// A linear layer's backward (weight `w`, bias `bias`, `out[T,O] = x[T,I] wᵀ`): `dx` written
    /// (beta 0) or added to (beta 1); the weight and bias gradients into `base`, none when it is
    /// `None` (a frozen base: that product is skipped).
    fn lin_back(&self, base: &mut Option<&mut Params>, lin: Linear, dx: (&mut [f32], f32), dout: &[f32], x: &[f32], t: usize) {
        let Linear { w, bias, i, o } = lin;
        match base {
            Some(g) => {
                let (dw, db) = grad_pair(&mut g.tensors, w, bias);
                ops::linear_backward_as(self.matmul, Some(dx), dw, db, dout, x, self.p(w), (t, i, o))
            }
            None => ops::linear_backward_input_as(self.matmul, dx.0, dx.1, dout, self.p(w), (t, i, o)),
        }
    }

    /// The adapter's backward for `call` (input `x`, d output `dy`), adding into `dx` and the
    /// adapter gradients `lg`; nothing without an adapter there.
    #[allow(clippy::too_many_arguments)]
    fn lora_back(&self, lg: &mut Option<&mut Params>, call: LoraCall, x: &[f32], a: &LayerActs, dy: &[f32], dx: &mut [f32], t: usize) {
        if let (Some(lora), Some(g)) = (&self.lora, lg.as_deref_mut()) {
            lora.backward(call, x, &a.lora[call.target as usize], dy, dx, g, t);
        }
    }

    /// The adapter call of layer `l`'s `target` in this model's precision.
    fn lora_call(&self, l: usize, target: Target, train: bool) -> LoraCall {
        LoraCall { dtype: self.matmul, layer: l, target, train }
    }

    /// Merges the adapter into the base weights (`W += s · B A`, PEFT's `merge_and_unload`) and
    /// drops it: the model then decodes, and saves as a plain checkpoint.
    pub fn merge_lora(&mut self) -> Result<()> {
        if let Some(lora) = self.lora.take() {
            lora.merge_into(&self.config, &mut self.params)?;
            self.decode_weights = Default::default();
        }
        Ok(())
    }
}

/// The gradient buffer of a norm weight: `base`'s, or a scratch `[D]` whose result is dropped
/// (a frozen base: the norm backward still yields d input).
fn norm_grad<'a>(base: &'a mut Option<&mut Params>, scratch: &'a mut Vec<f32>, w: usize, d: usize) -> &'a mut [f32] {
    match base {
        Some(g) => &mut g.tensors[w].data,
        None => {
            fit(scratch, d);
            scratch
        }
    }
}

/// Scratch gradients reused across layers.
#[derive(Default)]
struct BackBufs {
    dh: Vec<f32>,   // [T,D]
    dq: Vec<f32>,   // [T,Hq*hd]
    dk: Vec<f32>,   // [T,Hk*hd]
    dv: Vec<f32>,   // [T,Hk*hd]
    datt: Vec<f32>, // [T,Hq*hd]
    da: Vec<f32>,   // [T,I]
    dg: Vec<f32>,   // [T,I]
    du: Vec<f32>,   // [T,I]
    dnorm: Vec<f32>, // [D] a frozen norm's discarded weight gradient
    dqr: Vec<f32>,  // [T,Hq*hd] before Qwen3's q norm
    dkr: Vec<f32>,  // [T,Hk*hd] before its k norm
}

impl BackBufs {
    /// Sizes every buffer for `t` tokens (each is zeroed, or written whole, where it is used).
    fn fit(&mut self, c: &ModelConfig, t: usize) {
        let hd = c.head_dim();
        let (qd, kvd, i) = (c.num_attention_heads * hd, c.num_key_value_heads * hd, c.intermediate_size);
        for (v, n) in [
            (&mut self.dh, t * c.hidden_size),
            (&mut self.dq, t * qd),
            (&mut self.dk, t * kvd),
            (&mut self.dv, t * kvd),
            (&mut self.datt, t * qd),
            (&mut self.da, t * i),
            (&mut self.dg, t * i),
            (&mut self.du, t * i),
        ] {
            fit(v, n);
        }
    }
}

/// Mutable weight gradient and optional bias gradient (distinct tensors).
fn grad_pair(g: &mut [Tensor], w: usize, b: Option<usize>) -> (&mut [f32], Option<&mut [f32]>) {
    match b {
        None => (&mut g[w].data, None),
        Some(bi) => {
            debug_assert!(bi > w);
            let (lo, hi) = g.split_at_mut(bi);
            (&mut lo[w].data, Some(&mut hi[0].data))
        }
    }
}

/// Target of each logits row `[T]`: row r predicts ids[r+1] unless r+1 starts a segment.
fn targets_of(ids: &[u32], seg_start: &[usize]) -> Vec<Option<u32>> {
    let t = ids.len();
    (0..t).map(|r| (r + 1 < t && seg_start[r + 1] != r + 1).then(|| ids[r + 1])).collect()
}

/// The rows of the head's work: row r (the prediction of token r+1) is taken when token r+1 is a
/// target within its segment and, with `need`, asked for.
struct HeadRows {
    /// Selected row indices, ascending.
    rows: Vec<usize>,
    /// Target of each selected row.
    targets: Vec<Option<u32>>,
}

impl HeadRows {
    fn new(ids: &[u32], seg_start: &[usize], need: Option<&[u8]>) -> Result<HeadRows> {
        let t = ids.len();
        if let Some(n) = need {
            if n.len() != t {
                bail!("the mask of needed tokens has length {}, the sequence has {t} tokens", n.len());
            }
        }
        let all = targets_of(ids, seg_start);
        let rows: Vec<usize> = (0..t).filter(|&r| all[r].is_some() && need.is_none_or(|n| n[r + 1] != 0)).collect();
        let targets = rows.iter().map(|&r| all[r]).collect();
        Ok(HeadRows { rows, targets })
    }

    /// `out` ← the selected rows `[n, D]` of `x[T, D]`.
    fn gather(&self, out: &mut Vec<f32>, x: &[f32], d: usize) {
        out.clear();
        for &r in &self.rows {
            out.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
    }

    /// `out` ← `[T, D]` holding the selected rows `xs[n, D]`, zeros elsewhere.
    fn scatter(&self, out: &mut Vec<f32>, xs: &[f32], t: usize, d: usize) {
        zeroed(out, t * d);
        for (k, &r) in self.rows.iter().enumerate() {
            out[r * d..(r + 1) * d].copy_from_slice(&xs[k * d..(k + 1) * d]);
        }
    }

    /// Selected-row statistics → token statistics (token r+1 from row r), 0 elsewhere.
    fn token_stats(&self, t: usize, row_lp: &[f32], row_en: &[f32]) -> TokenStats {
        let mut logp = vec![0f32; t];
        let mut entropy = vec![0f32; t];
        for (k, &r) in self.rows.iter().enumerate() {
            logp[r + 1] = row_lp[k];
            entropy[r + 1] = row_en[k];
        }
        TokenStats { logp, entropy }
    }
}

impl Model {
    /// Grows the vocabulary to `new_size` ids (a tokenizer with tokens the checkpoint lacks, e.g.
    /// the CoA tags): the embedding, and an untied head, get a row for every new id, and
    /// `vocab_size` is updated. Row `id` starts as the mean of the rows of `pieces(id)`, the ids
    /// the base tokenizer splits that token's text into (`<code>` from `<`, `code`, `>`): so new
    /// tokens start apart, near what their text meant to the model. (With one shared mean, tags
    /// tied to the head were still indistinguishable after 3 epochs of SFT.)
    pub fn grow_vocab(&mut self, new_size: usize, pieces: &mut dyn FnMut(u32) -> Result<Vec<u32>>) -> Result<()> {
        let old = self.config.vocab_size;
        if new_size < old {
            bail!("cannot shrink the vocabulary from {old} to {new_size} ids");
        }
        if new_size == old {
            return Ok(());
        }
        let d = self.config.hidden_size;
        let lay = layout(&self.config);
        let mut sources = Vec::with_capacity(new_size - old);
        for id in old..new_size {
            let p = pieces(id as u32)?;
            if p.is_empty() {
                bail!("new token id {id}: its text splits into no base tokens to initialise it from");
            }
            if let Some(&bad) = p.iter().find(|&&x| x as usize >= old) {
                bail!("new token id {id}: its text splits into id {bad}, outside the checkpoint's vocabulary of {old} ids");
            }
            sources.push(p);
        }
        let grow = |t: &mut Tensor| {
            let mut data = std::mem::take(&mut t.data);
            data.reserve((new_size - old) * d);
            for p in &sources {
                let mut row = vec![0f64; d];
                for &id in p {
                    let s = id as usize * d;
                    row.iter_mut().zip(&data[s..s + d]).for_each(|(a, &b)| *a += b as f64);
                }
                data.extend(row.iter().map(|x| (x / p.len() as f64) as f32));
            }
            t.data = data;
            t.shape[0] = new_size;
        };
        grow(&mut self.params.tensors[lay.embed]);
        if let Some(h) = lay.lm_head {
            grow(&mut self.params.tensors[h]);
        }
        self.config.vocab_size = new_size;
        self.check_layout()
    }
}
