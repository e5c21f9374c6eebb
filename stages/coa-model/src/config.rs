//! `ModelConfig`: the HF `config.json` of a Llama / Qwen2 / Qwen3 / Mistral decoder.
//!
//! Parsed by hand from a JSON object (not derived) so that every error names the field, and so
//! that fields we do not model (`transformers_version`, `use_cache`, `sliding_window`, ...) are
//! kept in `extra` and written back unchanged.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `eos_token_id` is an int in most configs and a list in some (Llama 3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(x) => vec![*x],
            TokenIds::Many(v) => v.clone(),
        }
    }
    fn to_json(&self) -> Value {
        match self {
            TokenIds::One(x) => Value::from(*x),
            TokenIds::Many(v) => Value::from(v.clone()),
        }
    }
}

/// Llama 3.x RoPE scaling (`rope_type: "llama3"`): long wavelengths are divided by `factor`,
/// short ones kept, and the band between smoothly interpolated, as HF's
/// `_compute_llama3_parameters` does (in f32).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: f32,
}

impl Llama3Rope {
    fn from_json(field: &str, obj: &Map<String, Value>) -> Result<Self> {
        let num = |key: &str| -> Result<f32> {
            let v = obj.get(key).with_context(|| format!("config field `{field}.{key}` is missing (rope_type llama3)"))?;
            let x = v.as_f64().with_context(|| format!("config field `{field}.{key}` must be a number, got {v}"))?;
            if !(x.is_finite() && x > 0.0) {
                bail!("config field `{field}.{key}` = {x} must be a positive number");
            }
            Ok(x as f32)
        };
        let r = Llama3Rope {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        };
        if r.high_freq_factor <= r.low_freq_factor {
            bail!(
                "config field `{field}`: high_freq_factor {} must exceed low_freq_factor {}",
                r.high_freq_factor,
                r.low_freq_factor
            );
        }
        Ok(r)
    }

    /// llama.cpp's per-frequency divisors for this scaling (what its converter writes into
    /// `rope_freqs.weight`, in f64 there too): 1 for short wavelengths, `factor` for long ones,
    /// the inverse of the smoothed weight between.
    pub fn factors(&self, inv_freq: &[f32]) -> Vec<f32> {
        let (orig, low, high) = (
            f64::from(self.original_max_position_embeddings),
            f64::from(self.low_freq_factor),
            f64::from(self.high_freq_factor),
        );
        let factor = f64::from(self.factor);
        inv_freq
            .iter()
            .map(|&f| {
                let wavelen = 2.0 * std::f64::consts::PI / f64::from(f);
                if wavelen < orig / high {
                    1.0
                } else if wavelen > orig / low {
                    self.factor
                } else {
                    let smooth = (orig / wavelen - low) / (high - low);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect()
    }

    /// The Llama 3 scaling whose [`factors`](Self::factors) are `factors` (each within 1e-4
    /// relative), if there is one: how a GGUF's `rope_freqs.weight` becomes the `rope_parameters`
    /// transformers reads. `factor` is the largest divisor; with `low_freq_factor` 1 (all Llama
    /// 3.x), each smoothed divisor gives `original / wavelen - 1 = s (high - 1)`, so two of them
    /// fix `original` and `high_freq_factor`; with one, `high_freq_factor` is taken as 4, and
    /// with none Llama 3's 8192 / 4 are tried.
    pub fn fit(inv_freq: &[f32], factors: &[f32]) -> Option<Llama3Rope> {
        let factor = factors.iter().copied().fold(0f32, f32::max);
        if inv_freq.len() != factors.len() || factor <= 1.0 {
            return None;
        }
        let big = f64::from(factor);
        // (wavelength, smoothing weight s) of each divisor strictly between 1 and `factor`.
        let smoothed: Vec<(f64, f64)> = inv_freq
            .iter()
            .zip(factors)
            .filter(|(_, &d)| d > 1.0 + 1e-6 && d < factor * (1.0 - 1e-6))
            .map(|(&f, &d)| (2.0 * std::f64::consts::PI / f64::from(f), (1.0 / f64::from(d) - 1.0 / big) / (1.0 - 1.0 / big)))
            .collect();
        let mut candidates = vec![(8192.0, 4.0)];
        match smoothed[..] {
            [] => {}
            [(w, s)] => candidates.insert(0, (w * (1.0 + 3.0 * s), 4.0)),
            [(w1, s1), .., (w2, s2)] => {
                let orig = (s2 - s1) / (s2 / w1 - s1 / w2);
                candidates.insert(0, (orig, 1.0 + (orig / w1 - 1.0) / s1));
            }
        }
        candidates.into_iter().find_map(|(orig, high): (f64, f64)| {
            if !(orig.is_finite() && orig > 0.0 && high.is_finite() && high > 1.0) {
                return None;
            }
            // A context length is a whole number, a band edge a short decimal: drop the fit's
            // rounding noise.
            let orig = if (orig - orig.round()).abs() < 1e-3 * orig { orig.round() } else { orig };
            let snapped = (high * 1000.0).round() / 1000.0;
            let high = if (high - snapped).abs() < 1e-4 * high { snapped } else { high };
            let r = Llama3Rope {
                factor,
                low_freq_factor: 1.0,
                high_freq_factor: high as f32,
                original_max_position_embeddings: orig as f32,
            };
            let close = r.factors(inv_freq).iter().zip(factors).all(|(a, b)| (a - b).abs() <= 1e-4 * b);
            close.then_some(r)
        })
    }

    /// The scaled inverse frequencies.
    pub fn apply(&self, inv_freq: &[f32]) -> Vec<f32> {
        let low_wavelen = self.original_max_position_embeddings / self.low_freq_factor;
        let high_wavelen = self.original_max_position_embeddings / self.high_freq_factor;
        inv_freq
            .iter()
            .map(|&f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / self.factor
                } else {
                    let smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    (1.0 - smooth) * f / self.factor + smooth * f
                }
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architectures: Vec<String>,
    /// One of [`MODEL_TYPES`].
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` when absent (HF convention).
    pub num_key_value_heads: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    /// Top-level `rope_theta`, or `rope_parameters.rope_theta` (transformers v5 layout).
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// Llama, Qwen3: bias on q/k/v AND o_proj. Ignored for qwen2 (always q/k/v bias, no o bias)
    /// and mistral (no bias).
    pub attention_bias: bool,
    /// Llama only: bias on gate/up/down projections.
    pub mlp_bias: bool,
    pub initializer_range: f64,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<TokenIds>,
    pub torch_dtype: Option<String>,
    /// Explicit head dimension, when the config has one; else hidden_size / num_attention_heads.
    pub head_dim: Option<usize>,
    pub hidden_act: String,
    /// Every other field of config.json, preserved in order on save.
    pub extra: Map<String, Value>,
}

/// The `model_type`s read, each with its HF architecture (`architectures[0]`): Llama-shaped
/// decoders; qwen2 adds q/k/v biases, qwen3 a per-head RMSNorm of q and k, mistral and both Qwens
/// a sliding window ([`ModelConfig::layer_windows`]).
pub const MODEL_TYPES: [(&str, &str); 4] = [
    ("llama", "LlamaForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
    ("mistral", "MistralForCausalLM"),
];

/// The HF architecture of a supported `model_type` (Llama's for another).
pub fn hf_architecture(model_type: &str) -> &'static str {
    MODEL_TYPES.iter().find(|(m, _)| *m == model_type).map_or("LlamaForCausalLM", |(_, a)| a)
}

/// The config field of [`ModelConfig::rope_freq_factors`].
pub const ROPE_FREQ_FACTORS: &str = "rope_freq_factors";

const KNOWN: &[&str] = &[
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "torch_dtype",
    "head_dim",
    "hidden_act",
];

fn get_usize(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(x) => Ok(Some(x as usize)),
            None => bail!("config field `{key}` must be a non-negative integer, got {v}"),
        },
    }
}

fn req_usize(obj: &Map<String, Value>, key: &str) -> Result<usize> {
    get_usize(obj, key)?.with_context(|| format!("config field `{key}` is missing"))
}

fn get_f64(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) => Ok(Some(x)),
            None => bail!("config field `{key}` must be a number, got {v}"),
        },
    }
}

fn get_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => bail!("config field `{key}` must be true or false, got {v}"),
    }
}

fn get_str(obj: &Map<String, Value>, key: &str) -> Result<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => bail!("config field `{key}` must be a string, got {v}"),
    }
}

fn get_u32(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>> {
    match get_usize(obj, key)? {
        None => Ok(None),
        Some(x) => u32::try_from(x)
            .map(Some)
            .map_err(|_| anyhow::anyhow!("config field `{key}` = {x} does not fit in u32")),
    }
}

impl ModelConfig {
    /// A fresh llama-style GQA config. "tiny": ~1-2M parameters (with a few-thousand vocab),
    /// trains in minutes on 2 CPU cores. "small": ~25M parameters at an 8k vocab.
    pub fn preset(name: &str, vocab_size: usize) -> Result<Self> {
        let (hidden, layers, heads, kv_heads, inter, max_pos) = match name {
            "tiny" => (128, 4, 4, 2, 384, 2048),
            "small" => (512, 8, 8, 4, 1408, 4096),
            other => bail!("unknown model preset `{other}` (expected `tiny` or `small`)"),
        };
        if vocab_size == 0 {
            bail!("config field `vocab_size` must be positive");
        }
        let c = ModelConfig {
            architectures: vec!["LlamaForCausalLM".to_string()],
            model_type: "llama".to_string(),
            vocab_size,
            hidden_size: hidden,
            intermediate_size: inter,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            max_position_embeddings: max_pos,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            tie_word_embeddings: true,
            attention_bias: false,
            mlp_bias: false,
            initializer_range: 0.02,
            bos_token_id: None,
            eos_token_id: None,
            torch_dtype: Some("float32".to_string()),
            head_dim: None,
            hidden_act: "silu".to_string(),
            extra: Map::new(),
        };
        c.validate()?;
        Ok(c)
    }

    /// Read an HF `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading model config {}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing model config {} as JSON", path.display()))?;
        Self::from_json(&v).with_context(|| format!("model config {}", path.display()))
    }

    /// Parse the JSON object of a config.json (no validation beyond types; see `validate`).
    pub fn from_json(v: &Value) -> Result<Self> {
        let obj = v.as_object().context("config.json must be a JSON object")?;
        let architectures = match obj.get("architectures") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .context("config field `architectures` must be a list of strings")
                })
                .collect::<Result<Vec<_>>>()?,
            Some(other) => bail!("config field `architectures` must be a list, got {other}"),
        };
        let model_type = match get_str(obj, "model_type")? {
            Some(m) => m,
            None => match architectures.first().and_then(|a| MODEL_TYPES.iter().find(|(_, arch)| arch == a)) {
                Some((m, _)) => m.to_string(),
                None => bail!("config field `model_type` is missing"),
            },
        };
        let vocab_size = req_usize(obj, "vocab_size")?;
        let hidden_size = req_usize(obj, "hidden_size")?;
        let intermediate_size = req_usize(obj, "intermediate_size")?;
        let num_hidden_layers = req_usize(obj, "num_hidden_layers")?;
        let num_attention_heads = req_usize(obj, "num_attention_heads")?;
        let mut extra = Map::new();
        for (k, val) in obj {
            if !KNOWN.contains(&k.as_str()) {
                extra.insert(k.clone(), val.clone());
            }
        }
        // transformers v5 keeps rope_theta inside `rope_parameters`, and the dtype under `dtype`.
        let rope_theta = match get_f64(obj, "rope_theta")? {
            Some(t) => t,
            None => match obj.get("rope_parameters").and_then(|p| p.get("rope_theta")) {
                Some(t) => t
                    .as_f64()
                    .with_context(|| format!("config field `rope_parameters.rope_theta` must be a number, got {t}"))?,
                None => 10000.0,
            },
        };
        let torch_dtype = match get_str(obj, "torch_dtype")? {
            Some(d) => Some(d),
            None => get_str(obj, "dtype")?,
        };
        let eos_token_id = match obj.get("eos_token_id") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(TokenIds::Many(
                a.iter()
                    .map(|x| {
                        x.as_u64()
                            .and_then(|x| u32::try_from(x).ok())
                            .context("config field `eos_token_id` must be an int or a list of ints")
                    })
                    .collect::<Result<Vec<_>>>()?,
            )),
            Some(_) => Some(TokenIds::One(get_u32(obj, "eos_token_id")?.unwrap_or(0))),
        };
        Ok(ModelConfig {
            architectures,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            // transformers' defaults where a field is absent
            num_key_value_heads: get_usize(obj, "num_key_value_heads")?.unwrap_or(match model_type.as_str() {
                "mistral" => 8,
                _ => num_attention_heads,
            }),
            max_position_embeddings: get_usize(obj, "max_position_embeddings")?.unwrap_or(match model_type
                .as_str()
            {
                "qwen2" | "qwen3" => 32768,
                "mistral" => 4096 * 32,
                _ => 2048,
            }),
            rms_norm_eps: get_f64(obj, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            tie_word_embeddings: get_bool(obj, "tie_word_embeddings")?.unwrap_or(false),
            attention_bias: get_bool(obj, "attention_bias")?.unwrap_or(false),
            mlp_bias: get_bool(obj, "mlp_bias")?.unwrap_or(false),
            initializer_range: get_f64(obj, "initializer_range")?.unwrap_or(0.02),
            bos_token_id: get_u32(obj, "bos_token_id")?,
            eos_token_id,
            torch_dtype,
            head_dim: get_usize(obj, "head_dim")?.or((model_type == "qwen3").then_some(128)),
            hidden_act: get_str(obj, "hidden_act")?.unwrap_or_else(|| "silu".to_string()),
            model_type,
            extra,
        })
    }

    /// The config.json object: our fields first, then `extra` in its original order.
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        let arch = if self.architectures.is_empty() {
            vec![hf_architecture(&self.model_type).to_string()]
        } else {
            self.architectures.clone()
        };
        o.insert("architectures".into(), Value::from(arch));
        o.insert("model_type".into(), Value::from(self.model_type.clone()));
        o.insert("vocab_size".into(), Value::from(self.vocab_size));
        o.insert("hidden_size".into(), Value::from(self.hidden_size));
        o.insert("intermediate_size".into(), Value::from(self.intermediate_size));
        o.insert("num_hidden_layers".into(), Value::from(self.num_hidden_layers));
        o.insert("num_attention_heads".into(), Value::from(self.num_attention_heads));
        o.insert("num_key_value_heads".into(), Value::from(self.num_key_value_heads));
        o.insert("max_position_embeddings".into(), Value::from(self.max_position_embeddings));
        o.insert("rms_norm_eps".into(), Value::from(self.rms_norm_eps));
        o.insert("rope_theta".into(), Value::from(self.rope_theta));
        o.insert("tie_word_embeddings".into(), Value::from(self.tie_word_embeddings));
        if matches!(self.model_type.as_str(), "llama" | "qwen3") || self.attention_bias {
            o.insert("attention_bias".into(), Value::from(self.attention_bias));
        }
        if self.model_type == "llama" || self.mlp_bias {
            o.insert("mlp_bias".into(), Value::from(self.mlp_bias));
        }
        o.insert("initializer_range".into(), Value::from(self.initializer_range));
        o.insert("hidden_act".into(), Value::from(self.hidden_act.clone()));
        if let Some(b) = self.bos_token_id {
            o.insert("bos_token_id".into(), Value::from(b));
        }
        if let Some(e) = &self.eos_token_id {
            o.insert("eos_token_id".into(), e.to_json());
        }
        if let Some(d) = &self.torch_dtype {
            o.insert("torch_dtype".into(), Value::from(d.clone()));
        }
        // Qwen3 reads an absent head_dim as 128, not hidden_size / heads: always write it there.
        if let Some(h) = self.head_dim.or((self.model_type == "qwen3").then(|| self.head_dim())) {
            o.insert("head_dim".into(), Value::from(h));
        }
        for (k, v) in &self.extra {
            if k == "dtype" {
                // v5 spelling of torch_dtype: keep it in step with what we write.
                if let Some(d) = &self.torch_dtype {
                    o.insert(k.clone(), Value::from(d.clone()));
                    continue;
                }
            }
            if k == "rope_parameters" {
                // Keep rope_parameters.rope_theta in step with our rope_theta.
                if let Value::Object(p) = v {
                    let mut p = p.clone();
                    if p.contains_key("rope_theta") {
                        p.insert("rope_theta".into(), Value::from(self.rope_theta));
                    }
                    o.insert(k.clone(), Value::Object(p));
                    continue;
                }
            }
            o.insert(k.clone(), v.clone());
        }
        Value::Object(o)
    }

    /// Sets the special token ids a checkpoint's HF files carry: `bos_token_id`, `eos_token_id`
    /// (kept as is when it already lists `eos`, e.g. Llama 3's several end tokens) and
    /// `pad_token_id`. `None` leaves a field unchanged.
    pub fn set_special_ids(&mut self, bos: Option<u32>, eos: Option<u32>, pad: Option<u32>) {
        if bos.is_some() {
            self.bos_token_id = bos;
        }
        if let Some(e) = eos {
            if !self.eos_token_id.as_ref().is_some_and(|ids| ids.to_vec().contains(&e)) {
                self.eos_token_id = Some(TokenIds::One(e));
            }
        }
        if let Some(p) = pad {
            self.extra.insert("pad_token_id".into(), Value::from(p));
        }
    }

    /// `pad_token_id`, when the config has one.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.extra.get("pad_token_id").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok())
    }

    /// Per-head dimension.
    pub fn head_dim(&self) -> usize {
        match self.head_dim {
            Some(h) => h,
            None if self.num_attention_heads > 0 => self.hidden_size / self.num_attention_heads,
            None => 0,
        }
    }

    /// The RoPE scaling of this config: none (plain RoPE) or Llama 3's, read from `rope_scaling`
    /// (transformers v4 layout) or `rope_parameters` (v5). Both stay in `extra` and are written
    /// back unchanged. Other scalings (linear, dynamic, yarn, ...) are refused, naming the field.
    pub fn rope_scaling(&self) -> Result<Option<Llama3Rope>> {
        let mut found = None;
        for field in ["rope_scaling", "rope_parameters"] {
            let Some(v) = self.extra.get(field).filter(|v| !v.is_null()) else { continue };
            let obj = v.as_object().with_context(|| format!("config field `{field}` must be an object, got {v}"))?;
            let kind = obj.get("rope_type").or_else(|| obj.get("type")).and_then(Value::as_str).unwrap_or("default");
            match kind {
                "default" => {}
                "llama3" => found = Some(Llama3Rope::from_json(field, obj)?),
                other => bail!("config field `{field}.rope_type` = {other:?} is not supported (only \"default\" and \"llama3\")"),
            }
        }
        Ok(found)
    }

    /// Per-frequency RoPE divisors (config field `rope_freq_factors`, `[head_dim/2]` positive
    /// numbers): llama.cpp's `rope_freqs.weight` of a Llama 3.x GGUF, kept in the config so that a
    /// checkpoint saved from such a file reloads with the same RoPE. Our key, not HF's:
    /// transformers ignores it, and reads the `rope_parameters` the GGUF import fits to the
    /// factors where they follow Llama 3's formula.
    pub fn rope_freq_factors(&self) -> Result<Option<Vec<f32>>> {
        let Some(v) = self.extra.get(ROPE_FREQ_FACTORS).filter(|v| !v.is_null()) else { return Ok(None) };
        let bad = || format!("config field `{ROPE_FREQ_FACTORS}` must be a list of positive numbers, got {v}");
        let items = v.as_array().with_context(bad)?;
        let factors = items
            .iter()
            .map(|x| x.as_f64().filter(|f| f.is_finite() && *f > 0.0).map(|f| f as f32).with_context(bad))
            .collect::<Result<Vec<f32>>>()?;
        if factors.len() != self.head_dim() / 2 {
            bail!(
                "config field `{ROPE_FREQ_FACTORS}` has {} factors; the head dimension {} has {} frequencies",
                factors.len(),
                self.head_dim(),
                self.head_dim() / 2
            );
        }
        Ok(Some(factors))
    }

    /// RoPE inverse frequencies `[head_dim/2]`, with this config's scaling applied: divided by
    /// the `rope_freq_factors` when there are some (as llama.cpp does; they then stand for the
    /// scaling), else scaled by `rope_scaling` / `rope_parameters`.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let inv = crate::ops::rope_inv_freq(self.head_dim(), self.rope_theta);
        // validate() refuses bad factors or a bad scaling before any model is built
        if let Ok(Some(factors)) = self.rope_freq_factors() {
            return inv.iter().zip(&factors).map(|(f, d)| f / d).collect();
        }
        match self.rope_scaling() {
            Ok(Some(s)) => s.apply(&inv),
            _ => inv,
        }
    }

    /// RoPE tables `cos[T, hd/2]`, `sin[T, hd/2]` of this model for the given positions.
    pub fn rope_tables(&self, positions: &[u32]) -> (Vec<f32>, Vec<f32>) {
        crate::ops::rope_tables_from(positions, &self.rope_inv_freq())
    }

    /// Whether q/k/v projections carry a bias.
    pub fn qkv_bias(&self) -> bool {
        match self.model_type.as_str() {
            "qwen2" => true,
            "mistral" => false,
            _ => self.attention_bias,
        }
    }

    /// Whether o_proj carries a bias (llama and qwen3 `attention_bias`).
    pub fn o_bias(&self) -> bool {
        matches!(self.model_type.as_str(), "llama" | "qwen3") && self.attention_bias
    }

    /// Whether q and k go through a per-head RMSNorm (`self_attn.q_norm` / `k_norm`, `[head_dim]`,
    /// eps `rms_norm_eps`) before RoPE: Qwen3.
    pub fn qk_norm(&self) -> bool {
        self.model_type == "qwen3"
    }

    /// The sliding window of each layer (0: full attention), as transformers 5 reads the config:
    /// query i sees key j when `i - j < window` (positions). Mistral: `sliding_window` (absent:
    /// 4096, null: none) on every layer. Qwen2 / Qwen3: `sliding_window` (absent: 4096) only with
    /// `use_sliding_window: true`, on the layers `layer_types` marks `sliding_attention`, or,
    /// without `layer_types`, on layers `max_window_layers` (absent: 28) and up. Llama: none.
    pub fn layer_windows(&self) -> Result<Vec<usize>> {
        let n = self.num_hidden_layers;
        let window = |default_on: bool| -> Result<Option<usize>> {
            match self.extra.get("sliding_window") {
                None if default_on => Ok(Some(4096)),
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(w) if w > 0 => Ok(Some(w as usize)),
                    _ => bail!("config field `sliding_window` must be a positive integer or null, got {v}"),
                },
            }
        };
        match self.model_type.as_str() {
            "mistral" => Ok(vec![window(true)?.unwrap_or(0); n]),
            "qwen2" | "qwen3" => {
                let on = get_bool(&self.extra, "use_sliding_window")?.unwrap_or(false);
                let w = if on { window(true)? } else { None };
                match self.extra.get("layer_types").filter(|v| !v.is_null()) {
                    Some(v) => {
                        let bad = || format!("config field `layer_types` must be a list of {n} \"full_attention\" / \"sliding_attention\", got {v}");
                        let items = v.as_array().with_context(bad)?;
                        if items.len() != n {
                            bail!(bad());
                        }
                        items
                            .iter()
                            .map(|t| match (t.as_str(), w) {
                                (Some("full_attention"), _) => Ok(0),
                                (Some("sliding_attention"), Some(w)) => Ok(w),
                                (Some("sliding_attention"), None) => {
                                    bail!("config field `layer_types` has sliding_attention layers but no window (`use_sliding_window` is not true or `sliding_window` is null)")
                                }
                                _ => bail!(bad()),
                            })
                            .collect()
                    }
                    None => {
                        let from = get_usize(&self.extra, "max_window_layers")?.unwrap_or(28);
                        Ok((0..n).map(|l| if l >= from { w.unwrap_or(0) } else { 0 }).collect())
                    }
                }
            }
            _ => Ok(vec![0; n]),
        }
    }

    /// Whether gate/up/down carry a bias (llama `mlp_bias`).
    pub fn mlp_bias(&self) -> bool {
        self.model_type == "llama" && self.mlp_bias
    }

    /// Check that the model can be built from this config; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if !MODEL_TYPES.iter().any(|(m, _)| *m == self.model_type) {
            let names: Vec<String> = MODEL_TYPES.iter().map(|(m, _)| format!("{m:?}")).collect();
            bail!("config field `model_type` = {:?} is not supported (expected one of {})", self.model_type, names.join(", "));
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                bail!("config field `{name}` must be positive");
            }
        }
        if self.vocab_size > u32::MAX as usize {
            bail!("config field `vocab_size` = {} exceeds u32 ids", self.vocab_size);
        }
        if self.head_dim == Some(0) {
            bail!("config field `head_dim` must be positive");
        }
        if self.head_dim.is_none() && self.hidden_size % self.num_attention_heads != 0 {
            bail!(
                "config field `num_attention_heads` = {} does not divide `hidden_size` = {}",
                self.num_attention_heads,
                self.hidden_size
            );
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            bail!(
                "config field `num_key_value_heads` = {} does not divide `num_attention_heads` = {}",
                self.num_key_value_heads,
                self.num_attention_heads
            );
        }
        if self.head_dim() % 2 != 0 {
            bail!(
                "head dimension {} (config field `head_dim`, or `hidden_size` / `num_attention_heads`) must be even for RoPE",
                self.head_dim()
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            bail!("config field `rms_norm_eps` = {} must be a positive number", self.rms_norm_eps);
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            bail!("config field `rope_theta` = {} must be a positive number", self.rope_theta);
        }
        if !(self.initializer_range.is_finite() && self.initializer_range >= 0.0) {
            bail!("config field `initializer_range` = {} must be a non-negative number", self.initializer_range);
        }
        if self.hidden_act != "silu" {
            bail!("config field `hidden_act` = {:?} is not supported (only \"silu\")", self.hidden_act);
        }
        self.rope_scaling()?;
        self.rope_freq_factors()?;
        self.layer_windows()?;
        if let Some(tp) = self.extra.get("pretraining_tp") {
            if tp.as_u64().is_some_and(|x| x > 1) {
                bail!("config field `pretraining_tp` = {tp} is not supported (only 1)");
            }
        }
        let hd = self.head_dim();
        self.num_attention_heads
            .checked_mul(hd)
            .and_then(|x| x.checked_mul(self.hidden_size))
            .and_then(|_| self.vocab_size.checked_mul(self.hidden_size))
            .and_then(|_| self.intermediate_size.checked_mul(self.hidden_size))
            .context("config sizes overflow")?;
        Ok(())
    }
}

impl Serialize for ModelConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> Deserialize<'de> for ModelConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        ModelConfig::from_json(&v).map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
}
