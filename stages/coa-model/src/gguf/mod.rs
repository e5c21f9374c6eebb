//! GGUF checkpoints in: a llama.cpp `.gguf` file read as the same model, tokenizer and chat
//! template HF transformers derives from it (`from_pretrained(dir, gguf_file=...)`), so a stage
//! can take a `.gguf` wherever it takes an HF checkpoint directory.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! let path = std::path::Path::new("SmolLM2-135M-Instruct.Q4_1.gguf");
//! if coa_model::gguf::is_gguf(path) {
//!     let ckpt = coa_model::gguf::load(path)?;
//!     let ids = ckpt.tokenizer.tokenizer.encode("What is 17 * 23?", false).map_err(anyhow::Error::msg)?;
//!     println!("{} layers, {} ids", ckpt.model.config.num_hidden_layers, ids.len());
//! }
//! # Ok(()) }
//! ```
//!
//! What is read:
//!
//! - **The container** ([`file`]): GGUF v2 and v3 (header, every metadata type including nested
//!   arrays, tensor infos, `general.alignment`, the data section), memory-mapped.
//! - **Tensors** ([`dequant`]): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants
//!   Q4_K, Q5_K, Q6_K (what Q4_K_M / Q5_K_M / Q6_K files hold), dequantized to f32 on load, bit for
//!   bit as gguf-py does (HF's loader calls it). Any other type is an error naming the tensor and
//!   type.
//! - **Architectures** `llama`, `qwen2` and `qwen3` (`general.architecture`; qwen3's per-head
//!   `attn_q_norm` / `attn_k_norm` → `self_attn.q_norm` / `k_norm`, its head_dim from
//!   `attention.key_length`, which the export always writes for it). Tensor names map to HF's
//!   (`token_embd` → `model.embed_tokens`, `blk.N.attn_q` → `model.layers.N.self_attn.q_proj`,
//!   `attn_norm` → `input_layernorm`, `ffn_norm` → `post_attention_layernorm`, `output_norm` →
//!   `model.norm`, `output` → `lm_head`, ...), ggml dims are reversed into row-major HF shapes, and
//!   for `llama` the row permutation llama.cpp's HF → GGUF converter applies to q/k (weights and
//!   biases) is undone ([`unpermute_qk_rows`]), as transformers' `LlamaTensorProcessor` does.
//!   Qwen2 and Qwen3 files are stored unpermuted. No `output.weight` means tied embeddings.
//! - **Config** ([`model_config`]): the HF `config.json` transformers builds from `<arch>.*`
//!   metadata: block_count, embedding_length, feed_forward_length, attention.head_count(_kv),
//!   rope.freq_base, attention.layer_norm_rms_epsilon, context_length, rope.dimension_count
//!   (llama's head_dim), vocab_size (else the token count), and the tokenizer's BOS/EOS/PAD/UNK
//!   ids. Llama 3.x's `rope_freqs.weight` (per-frequency divisors of the RoPE frequencies, as
//!   llama.cpp applies them) becomes the config's `rope_freq_factors`, plus the `rope_parameters`
//!   (`rope_type: llama3`) that reproduce them where some do, for the HF checkpoints saved from
//!   it (transformers' own GGUF loader drops the tensor: plain RoPE). Other rope scaling
//!   (`<arch>.rope.scaling.type` other than none) is refused.
//! - **Tokenizer** ([`tokenizer`]): byte-level BPE ("gpt2") or SentencePiece BPE ("llama": Llama
//!   2, Mistral, Gemma, Phi-3) from `tokenizer.ggml.*`, encoding exactly as the `tokenizer.json`
//!   transformers derives, with the special tokens and `tokenizer.chat_template`.
//!
//! Out ([`export`]): [`save`] writes a model and its byte-level BPE tokenizer as the GGUF file
//! llama.cpp's converter would (F32, F16, BF16 or Q8_0), which this module reads back.
//!
//! Why a parser of our own: the crates on crates.io did not fit. `gguf-rs` turns metadata into
//! `serde_json` values (losing the distinction between GGUF's integer and float widths and
//! cutting arrays longer than a set maximum, e.g. a 49k-token vocabulary), does not expose where
//! the data section starts, and its errors name neither the file nor the key or tensor; `gguf`
//! (0.1.2, 2023) reads metadata only; candle's reader comes with a whole tensor framework. The
//! format is small and fixed, and a bounds-checked reader gives every error its context.
//!
//! Tested by `tests/gguf.rs` (synthetic files written with [`GgufWriter`]: every dtype against
//! hand-computed values, the q/k un-permutation, bad files) and `tests/gguf_parity.rs` (logits and
//! token ids against HF transformers on committed fixtures; the real SmolLM2 file when `make
//! model` has fetched it); the export by `tests/gguf_export.rs` (round trip in every dtype,
//! gguf-py's reader and quantizer).

pub mod dequant;
pub mod export;
pub mod file;
pub mod tokenizer;

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use serde_json::{json, Map, Value as Json};

pub use export::{check_exportable, hf_tokenizer, hf_tokenizer_from, save, GgufDtype};
pub use file::{GgmlType, GgufFile, GgufWriter, TensorInfo, Value};
pub use tokenizer::{GgufTokenizer, SpecialToken, SpecialTokens};

use crate::config::ModelConfig;
use crate::model::Model;
use crate::params::{param_specs, Params, Tensor};

/// A GGUF file read whole: the f32 model and its tokenizer.
pub struct GgufCheckpoint {
    pub model: Model,
    pub tokenizer: GgufTokenizer,
}

/// Whether `path` is a file that starts with the GGUF magic (false for a directory, a missing
/// path or anything else: the caller then reads it as an HF checkpoint and reports that error).
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == file::MAGIC
}

/// The model, tokenizer, special tokens and chat template of a GGUF file.
pub fn load(path: &Path) -> Result<GgufCheckpoint> {
    let file = GgufFile::open(path)?;
    let tokenizer = tokenizer::from_gguf(&file)?;
    let model = load_model(&file)?;
    Ok(GgufCheckpoint { model, tokenizer })
}

/// Only the tokenizer (no tensor is read).
pub fn load_tokenizer(path: &Path) -> Result<GgufTokenizer> {
    tokenizer::from_gguf(&GgufFile::open(path)?)
}

/// The architectures read, with their HF class.
const ARCHITECTURES: [(&str, &str); 3] = [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM")];

/// The architectures read, for messages: `"llama", "qwen2" and "qwen3"`.
fn architecture_names() -> String {
    let names: Vec<String> = ARCHITECTURES.iter().map(|(a, _)| format!("{a:?}")).collect();
    let (last, rest) = names.split_last().expect("a table");
    format!("{} and {last}", rest.join(", "))
}

/// The whole-number hyper-parameters: HF config field, GGUF key (under `<arch>.`), read from and
/// written to a config; the first four must be in a file, the others may be absent.
const SHAPE_KEYS: [(&str, &str, fn(&ModelConfig) -> usize); 6] = [
    ("hidden_size", "embedding_length", |c| c.hidden_size),
    ("intermediate_size", "feed_forward_length", |c| c.intermediate_size),
    ("num_hidden_layers", "block_count", |c| c.num_hidden_layers),
    ("num_attention_heads", "attention.head_count", |c| c.num_attention_heads),
    ("num_key_value_heads", "attention.head_count_kv", |c| c.num_key_value_heads),
    ("max_position_embeddings", "context_length", |c| c.max_position_embeddings),
];
const REQUIRED_SHAPE_KEYS: usize = 4;

/// `general.architecture`, checked against the ones we read.
pub fn architecture(file: &GgufFile) -> Result<&str> {
    let path = file.path().display();
    let arch = file
        .get_str("general.architecture")?
        .with_context(|| format!("{path}: metadata `general.architecture` is missing"))?;
    if !ARCHITECTURES.iter().any(|(a, _)| *a == arch) {
        bail!("{path}: general.architecture is {arch:?}; only {} models can be read", architecture_names());
    }
    Ok(arch)
}

/// The HF config transformers derives from the file's metadata (see the module doc).
pub fn model_config(file: &GgufFile) -> Result<ModelConfig> {
    let path = file.path().display();
    let arch = architecture(file)?;
    let key = |k: &str| format!("{arch}.{k}");
    if let Some(kind) = file.get_str(&key("rope.scaling.type"))? {
        if kind != "none" {
            bail!(
                "{path}: metadata `{}` is {kind:?}; rope scaling is not supported (plain RoPE only)",
                key("rope.scaling.type")
            );
        }
    }
    let mut c = Map::new();
    let class = ARCHITECTURES.iter().find(|(a, _)| *a == arch).expect("checked").1;
    c.insert("architectures".into(), json!([class]));
    c.insert("model_type".into(), json!(arch));
    for (hf, gguf, _) in &SHAPE_KEYS[..REQUIRED_SHAPE_KEYS] {
        c.insert(hf.to_string(), json!(file.req_u64(&key(gguf))?));
    }
    let mut optional: Vec<(&str, &str)> = SHAPE_KEYS[REQUIRED_SHAPE_KEYS..].iter().map(|(hf, gguf, _)| (*hf, *gguf)).collect();
    if arch == "llama" {
        // transformers reads head_dim from rope.dimension_count for llama only.
        optional.push(("head_dim", "rope.dimension_count"));
    }
    // What our export writes when head_dim is not hidden / heads (llama.cpp's n_embd_head_k).
    optional.push(("head_dim", "attention.key_length"));
    for (hf, gguf) in optional {
        if c.contains_key(hf) {
            continue;
        }
        if let Some(v) = file.get_u64(&key(gguf))? {
            c.insert(hf.into(), json!(v));
        }
    }
    for (hf, gguf) in [("rms_norm_eps", "attention.layer_norm_rms_epsilon"), ("rope_theta", "rope.freq_base")] {
        if let Some(v) = file.get_f64(&key(gguf))? {
            c.insert(hf.into(), json!(v));
        }
    }
    let vocab_size = match file.get_u64(&key("vocab_size"))? {
        Some(v) => v,
        None => match file.get_array("tokenizer.ggml.tokens")? {
            Some(tokens) => tokens.len() as u64,
            None => {
                bail!("{path}: neither `{}` nor `tokenizer.ggml.tokens` gives the vocabulary size", key("vocab_size"))
            }
        },
    };
    c.insert("vocab_size".into(), json!(vocab_size));
    c.insert("tie_word_embeddings".into(), json!(file.tensor("output.weight").is_none()));
    if arch == "llama" || arch == "qwen3" {
        // HF's GGUF config never sets these; a file with such biases is read with them.
        c.insert("attention_bias".into(), json!(file.tensor("blk.0.attn_q.bias").is_some()));
    }
    if arch == "llama" {
        c.insert("mlp_bias".into(), json!(file.tensor("blk.0.ffn_gate.bias").is_some()));
    }
    for (hf, gguf) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
        ("unk_token_id", "tokenizer.ggml.unknown_token_id"),
    ] {
        if let Some(v) = file.get_u64(gguf)? {
            c.insert(hf.into(), json!(v));
        }
    }
    let mut config = ModelConfig::from_json(&Json::Object(c))
        .with_context(|| format!("{path}: the model config from its metadata"))?;
    if let Some(t) = file.tensor(ROPE_FREQS) {
        set_rope_freq_factors(file, t, &mut config)?;
    }
    config.validate().with_context(|| format!("{path}: the model config from its metadata"))?;
    Ok(config)
}

/// `x` as a JSON integer when it is one (HF writes context lengths so).
fn whole(x: f32) -> Json {
    if x.fract() == 0.0 && x.abs() < 1e15 { json!(x as i64) } else { json!(x) }
}

/// The tensor of Llama 3.x rope divisors llama.cpp's converter writes.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// `rope_freqs.weight` into `config`: its divisors as `rope_freq_factors` (none when all are 1),
/// and the Llama 3 `rope_parameters` that give them, when some do.
fn set_rope_freq_factors(file: &GgufFile, t: &TensorInfo, config: &mut ModelConfig) -> Result<()> {
    let path = file.path().display();
    let half = config.head_dim() / 2;
    if t.dims != [half as u64] {
        bail!(
            "{path}: tensor `{ROPE_FREQS}` has dims {:?}, expected [{half}] (one factor per rope frequency of head dimension {})",
            t.dims,
            config.head_dim()
        );
    }
    let factors = file.tensor_f32(t)?;
    if let Some(i) = factors.iter().position(|f| !(f.is_finite() && *f > 0.0)) {
        bail!("{path}: tensor `{ROPE_FREQS}` holds {} at index {i}; rope factors must be positive", factors[i]);
    }
    if factors.iter().all(|&f| f == 1.0) {
        return Ok(());
    }
    let inv_freq = crate::ops::rope_inv_freq(config.head_dim(), config.rope_theta);
    if let Some(r) = crate::config::Llama3Rope::fit(&inv_freq, &factors) {
        config.extra.insert(
            "rope_parameters".into(),
            json!({
                "rope_type": "llama3",
                "rope_theta": config.rope_theta,
                "factor": r.factor,
                "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": whole(r.original_max_position_embeddings),
            }),
        );
    }
    config.extra.insert(crate::config::ROPE_FREQ_FACTORS.into(), json!(factors));
    Ok(())
}

/// GGUF tensor names outside the layers, with their HF names.
const GLOBAL_NAMES: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// GGUF module names inside `blk.N.`, with their HF names inside `model.layers.N.`.
const LAYER_NAMES: [(&str, &str); 11] = [
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
];

/// The HF parameter name of a GGUF tensor name (`blk.3.attn_q.weight` →
/// `model.layers.3.self_attn.q_proj.weight`), or None for one the decoder has no place for.
pub fn hf_name(gguf_name: &str) -> Option<String> {
    rename(gguf_name, "blk.", "model.layers.", |table| table.0, |table| table.1)
}

/// The GGUF tensor name of an HF parameter name (the inverse of [`hf_name`]).
pub fn gguf_name(hf_name: &str) -> Option<String> {
    rename(hf_name, "model.layers.", "blk.", |table| table.1, |table| table.0)
}

fn rename(
    name: &str,
    layer_prefix: &str,
    new_layer_prefix: &str,
    from: impl Fn(&(&'static str, &'static str)) -> &'static str,
    to: impl Fn(&(&'static str, &'static str)) -> &'static str,
) -> Option<String> {
    if let Some(entry) = GLOBAL_NAMES.iter().find(|e| from(e) == name) {
        return Some(to(entry).to_string());
    }
    let (layer, rest) = name.strip_prefix(layer_prefix)?.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let entry = LAYER_NAMES.iter().find(|e| from(e) == module)?;
    Some(format!("{new_layer_prefix}{layer}.{}.{kind}", to(entry)))
}

/// What llama.cpp's converter (`LlamaModel.permute`) does to the rows of q_proj / k_proj (weight
/// `[n_head * head_dim, cols]` or bias, `cols` = 1): within each head, HF's rotary layout (first
/// half, second half) becomes interleaved pairs, i.e. GGUF row `2i + j` of a head is HF row
/// `j * head_dim / 2 + i`.
pub fn permute_qk_rows(hf: &[f32], n_head: usize, cols: usize) -> Result<Vec<f32>> {
    reorder_qk_rows(hf, n_head, cols, false)
}

/// The inverse of [`permute_qk_rows`]: GGUF rows back to HF's order.
pub fn unpermute_qk_rows(gguf: &[f32], n_head: usize, cols: usize) -> Result<Vec<f32>> {
    reorder_qk_rows(gguf, n_head, cols, true)
}

fn reorder_qk_rows(data: &[f32], n_head: usize, cols: usize, to_hf: bool) -> Result<Vec<f32>> {
    if cols == 0 || n_head == 0 || !data.len().is_multiple_of(cols) || !(data.len() / cols).is_multiple_of(2 * n_head) {
        bail!("cannot split {} values into {n_head} heads of an even number of rows of {cols}", data.len());
    }
    let head_rows = data.len() / cols / n_head;
    let half = head_rows / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let gguf_row = h * head_rows + 2 * i + j;
                let hf_row = h * head_rows + j * half + i;
                let (from, to) = if to_hf { (gguf_row, hf_row) } else { (hf_row, gguf_row) };
                out[to * cols..(to + 1) * cols].copy_from_slice(&data[from * cols..(from + 1) * cols]);
            }
        }
    }
    Ok(out)
}

/// `model` as llama.cpp's converter writes it, tokenizer aside, every parameter in F32 (see
/// [`writer_as`]). For tests and tools that need a GGUF of a model; they add the
/// `tokenizer.ggml.*` keys.
pub fn writer_of(model: &Model) -> Result<GgufWriter> {
    writer_as(model, GgufDtype::F32)
}

/// `model` as llama.cpp's converter writes it, tokenizer aside: the `<arch>.*` metadata
/// [`model_config`] reads back (and llama.cpp needs), `general.file_type`,
/// `rope_freqs.weight` when the config has `rope_freq_factors` or a Llama 3 rope scaling, and
/// every parameter under its GGUF name (llama q/k rows permuted), matrices encoded as `dtype`
/// ([`export::encode`]).
/// The GGUF architecture a model of `c` is written as; an error for one GGUF cannot hold.
pub(crate) fn gguf_architecture(c: &ModelConfig) -> Result<&str> {
    let arch = c.model_type.as_str();
    if !ARCHITECTURES.iter().any(|(a, _)| *a == arch) {
        bail!("model_type {arch:?} cannot be written to GGUF (only {})", architecture_names());
    }
    // llama.cpp's llama / qwen2 graphs attend to every earlier token: a window would be lost.
    if c.layer_windows()?.iter().any(|&w| w > 0) {
        bail!("a model with a sliding window (config field `sliding_window`) cannot be written to GGUF: llama.cpp's {arch} has none");
    }
    Ok(arch)
}

pub fn writer_as(model: &Model, dtype: GgufDtype) -> Result<GgufWriter> {
    let c = &model.config;
    let arch = gguf_architecture(c)?;
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    let u32_of = |x: usize| Value::U32(x as u32);
    w.kv("general.architecture", Value::String(arch.into()));
    w.kv("general.file_type", Value::U32(dtype.file_type()));
    w.kv("general.quantization_version", Value::U32(2));
    for (_, key, field) in SHAPE_KEYS {
        w.kv(&k(key), u32_of(field(c)));
    }
    w.kv(&k("vocab_size"), u32_of(c.vocab_size));
    if arch == "llama" {
        w.kv(&k("rope.dimension_count"), u32_of(c.head_dim()));
    }
    if arch == "qwen3" || (c.num_attention_heads > 0 && c.head_dim() * c.num_attention_heads != c.hidden_size) {
        // llama.cpp takes hidden / heads unless told; transformers reads a qwen3 file without it
        // as head_dim 128.
        w.kv(&k("attention.key_length"), u32_of(c.head_dim()));
        w.kv(&k("attention.value_length"), u32_of(c.head_dim()));
    }
    w.kv(&k("rope.freq_base"), Value::F32(c.rope_theta as f32));
    w.kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(c.rms_norm_eps as f32));
    if let Some(factors) = rope_divisors(c)? {
        w.tensor_f32(ROPE_FREQS, &[factors.len()], &factors);
    }
    for t in model.params.iter() {
        let Some(name) = gguf_name(&t.name) else { bail!("parameter {} has no GGUF name", t.name) };
        let data = match (arch, name.contains(".attn_q."), name.contains(".attn_k.")) {
            ("llama", true, _) | ("llama", _, true) => {
                let heads = if name.contains(".attn_q.") { c.num_attention_heads } else { c.num_key_value_heads };
                permute_qk_rows(&t.data, heads, if t.shape.len() == 2 { t.shape[1] } else { 1 })?
            }
            _ => t.data.clone(),
        };
        let (ty, bytes) = export::encode(&data, &t.shape, dtype);
        let dims: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
        w.tensor(&name, &dims, ty, bytes);
    }
    Ok(w)
}

/// The per-frequency divisors llama.cpp applies for this config's rope: its `rope_freq_factors`
/// as they are, else those of a Llama 3 scaling (plain frequency / scaled one); None for plain
/// RoPE.
fn rope_divisors(c: &ModelConfig) -> Result<Option<Vec<f32>>> {
    if let Some(f) = c.rope_freq_factors()? {
        return Ok(Some(f));
    }
    if c.rope_scaling()?.is_none() {
        return Ok(None);
    }
    let plain = crate::ops::rope_inv_freq(c.head_dim(), c.rope_theta);
    Ok(Some(plain.iter().zip(c.rope_inv_freq()).map(|(p, s)| p / s).collect()))
}

/// The model of a GGUF file, its parameters dequantized to f32 in HF order and layout.
pub fn load_model(file: &GgufFile) -> Result<Model> {
    let path = file.path().display();
    let config = model_config(file)?;
    let describe = || {
        format!(
            "{} layers, tie_word_embeddings = {}, model_type = {}",
            config.num_hidden_layers, config.tie_word_embeddings, config.model_type
        )
    };
    let specs = param_specs(&config);
    let index: HashMap<&str, usize> = specs.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let mut jobs: Vec<(usize, &TensorInfo)> = Vec::with_capacity(specs.len());
    for t in &file.tensors {
        if t.name == ROPE_FREQS {
            continue; // read into the config
        }
        let Some(&i) = hf_name(&t.name).as_deref().and_then(|hf| index.get(hf)) else {
            bail!("{path}: unexpected tensor `{}`: the model ({}) has no such parameter", t.name, describe());
        };
        let spec = &specs[i];
        if t.hf_shape() != spec.shape {
            let want: Vec<usize> = spec.shape.iter().rev().copied().collect();
            bail!(
                "{path}: tensor `{}` has dims {:?}, expected {want:?} for {} (HF shape {:?}) of the model in the metadata ({})",
                t.name,
                t.dims,
                spec.name,
                spec.shape,
                describe()
            );
        }
        jobs.push((i, t));
    }
    let mut present = vec![false; specs.len()];
    jobs.iter().for_each(|(i, _)| present[*i] = true);
    if let Some(i) = present.iter().position(|p| !p) {
        let want: Vec<usize> = specs[i].shape.iter().rev().copied().collect();
        bail!(
            "{path}: missing tensor `{}` (dims {want:?}) for {} of the model in the metadata ({})",
            gguf_name(&specs[i].name).unwrap_or_default(),
            specs[i].name,
            describe()
        );
    }
    let unpermute = config.model_type == "llama";
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; specs.len()];
    let decoded = jobs
        .par_iter()
        .map(|&(i, t)| -> Result<(usize, Vec<f32>)> {
            let mut data = file.tensor_f32(t)?;
            let heads = if t.name.contains(".attn_q.") {
                Some(config.num_attention_heads)
            } else if t.name.contains(".attn_k.") {
                Some(config.num_key_value_heads)
            } else {
                None
            };
            if let (true, Some(n_head)) = (unpermute, heads) {
                let cols = if t.dims.len() == 2 { t.dims[0] as usize } else { 1 };
                data =
                    unpermute_qk_rows(&data, n_head, cols).with_context(|| format!("{path}: tensor `{}`", t.name))?;
            }
            if let Some(pos) = data.iter().position(|x| !x.is_finite()) {
                bail!("{path}: tensor `{}` has a non-finite value at flat index {pos}", t.name);
            }
            Ok((i, data))
        })
        .collect::<Result<Vec<_>>>()?;
    for (i, data) in decoded {
        slots[i] = Some(data);
    }
    let tensors = specs
        .into_iter()
        .zip(slots)
        .map(|(s, data)| Tensor { name: s.name, shape: s.shape, data: data.expect("every slot filled") })
        .collect();
    Model::new(config, Params { tensors })
}
