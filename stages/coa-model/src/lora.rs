//! LoRA adapters as PEFT defines them (`LoraConfig`, `lora.Linear`), in PEFT's file layout.
//!
//! A targeted linear layer `y = W x (+ b)` becomes `y = W x (+ b) + s · B A drop(x)` with
//! `A [r, in]`, `B [out, r]`, `s = lora_alpha / r`, and `drop` an inverted dropout of rate
//! `lora_dropout` applied in training only. A starts Kaiming-uniform (PEFT's default init:
//! `kaiming_uniform_(a = √5)`, i.e. U(±1/√in)), B at zero, so a fresh adapter changes nothing.
//!
//! On disk (what `PeftModel.save_pretrained` writes): `adapter_config.json` and
//! `adapter_model.safetensors` with tensors named
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (and `lora_B`).
//!
//! The dropout mask is counter-based (a hash of a seed, the layer, the target and the element
//! index), so the backward recomputes it instead of keeping it and a GPU can draw the same one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::ModelConfig;
use crate::ops::{self, Gemm};
use crate::params::{Params, Tensor};
use crate::rng::SplitMix64;
use crate::MatmulDtype;

pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// A linear layer LoRA can target, by PEFT's module name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    /// Every target, in the order of a decoder layer's modules.
    pub const ALL: [Target; 7] = [Target::Q, Target::K, Target::V, Target::O, Target::Gate, Target::Up, Target::Down];

    /// PEFT's `target_modules` name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The module path inside a decoder layer.
    fn module(self) -> String {
        let parent = if matches!(self, Target::Gate | Target::Up | Target::Down) { "mlp" } else { "self_attn" };
        format!("{parent}.{}", self.name())
    }

    /// `(in_features, out_features)` of this layer.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let (d, i) = (c.hidden_size, c.intermediate_size);
        let (qd, kvd) = (c.num_attention_heads * c.head_dim(), c.num_key_value_heads * c.head_dim());
        match self {
            Target::Q => (d, qd),
            Target::K | Target::V => (d, kvd),
            Target::O => (qd, d),
            Target::Gate | Target::Up => (d, i),
            Target::Down => (i, d),
        }
    }

    pub fn parse(name: &str) -> Result<Target> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .with_context(|| format!("unknown LoRA target module {name:?} (one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or all-linear)"))
    }

    /// A comma-separated list of module names, or `all-linear` (every linear layer but the head,
    /// as PEFT expands it).
    pub fn parse_list(s: &str) -> Result<Vec<Target>> {
        if s.trim() == "all-linear" {
            return Ok(Target::ALL.to_vec());
        }
        let mut v = s.split(',').map(|p| Target::parse(p.trim())).collect::<Result<Vec<_>>>()?;
        v.sort();
        v.dedup();
        if v.is_empty() {
            bail!("no LoRA target modules in {s:?}");
        }
        Ok(v)
    }

    /// PEFT's default targets for Llama / Qwen2 (`q_proj`, `v_proj`).
    pub fn peft_default() -> Vec<Target> {
        vec![Target::Q, Target::V]
    }
}

impl Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Target, D::Error> {
        let s = String::deserialize(d)?;
        Target::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The hyper-parameters of an adapter, named as PEFT's `LoraConfig` names them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// `r`.
    pub rank: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `lora_dropout`.
    pub dropout: f64,
    /// `target_modules`, sorted.
    pub targets: Vec<Target>,
}

impl LoraConfig {
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            bail!("LoRA rank (r) must be positive");
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            bail!("lora_alpha must be positive, got {}", self.alpha);
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("lora_dropout must be in [0, 1), got {}", self.dropout);
        }
        if self.targets.is_empty() {
            bail!("LoRA needs at least one target module");
        }
        Ok(())
    }

    /// `s = lora_alpha / r` (PEFT's `scaling`, without rsLoRA).
    pub fn scale(&self) -> f32 {
        (self.alpha / self.rank as f64) as f32
    }
}

/// The adapter tensors' names for layer `l`, target `t`: (A, B).
fn tensor_names(l: usize, t: Target) -> (String, String) {
    let p = format!("base_model.model.model.layers.{l}.{}", t.module());
    (format!("{p}.lora_A.weight"), format!("{p}.lora_B.weight"))
}

/// The dropout mask's definition (CPU and GPU draw it alike; the GPU kernel `lora_dropout` is
/// checked against this): element `idx` of target `t`'s input in layer `l`, for a sequence of
/// mask seed `seed` and rate `p`: 0 (dropped) or 1 / (1 − p).
pub fn dropout_factor(seed: u64, p: f64, l: usize, t: Target, idx: usize) -> f32 {
    let u = SplitMix64::new(seed ^ dropout_key(l, t, idx as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).unit();
    if u < p { 0.0 } else { dropout_keep_scale(p) }
}

/// The per-element key of [`dropout_factor`]: layer and target in the high bits, the element's
/// index within the sequence's `[T, in]` input below.
pub fn dropout_key(l: usize, t: Target, idx: u64) -> u64 {
    ((l as u64) << 44) ^ ((t as u64) << 40) ^ idx
}

/// What a kept element is multiplied by: 1 / (1 − p), rounded to f32.
pub fn dropout_keep_scale(p: f64) -> f32 {
    (1.0 / (1.0 - p)) as f32
}

/// An adapter: its config and its A / B matrices, per layer in [`Target::ALL`] order (A then B).
#[derive(Debug)]
pub struct Lora {
    pub config: LoraConfig,
    pub params: Params,
    /// `index[l][t as usize]`: where layer l's A of target t is in `params` (B follows it).
    index: Vec<[Option<usize>; 7]>,
    /// Seed of the dropout mask of the next forward / backward (see [`Lora::set_dropout_seed`]).
    dropout_seed: AtomicU64,
}

impl Clone for Lora {
    fn clone(&self) -> Lora {
        Lora { config: self.config.clone(), params: self.params.clone(), index: self.index.clone(), dropout_seed: AtomicU64::new(self.dropout_seed.load(Ordering::Relaxed)) }
    }
}

impl PartialEq for Lora {
    fn eq(&self, o: &Lora) -> bool {
        self.config == o.config && self.params == o.params
    }
}

/// What a training forward keeps of one targeted layer for the backward.
#[derive(Default, Debug)]
pub struct LoraActs {
    /// `s · A drop(x)` `[T, r]`.
    xs: Vec<f32>,
    /// `drop(x)` `[T, in]` (only with dropout in training; else the layer input is used).
    xd: Vec<f32>,
}

/// Which adapter a forward or backward runs, and how.
#[derive(Clone, Copy, Debug)]
pub struct LoraCall {
    /// The products' precision.
    pub dtype: MatmulDtype,
    /// The decoder layer's number.
    pub layer: usize,
    /// The projection of that layer.
    pub target: Target,
    /// A training pass: dropout on.
    pub train: bool,
}

impl Lora {
    /// A fresh adapter: A Kaiming-uniform (U(±1/√in), seeded per tensor name), B zeros.
    pub fn init(model: &ModelConfig, config: LoraConfig, seed: u64) -> Result<Lora> {
        config.validate()?;
        let mut tensors = Vec::new();
        for l in 0..model.num_hidden_layers {
            for &t in &config.targets {
                let (inp, out) = t.dims(model);
                let (an, bn) = tensor_names(l, t);
                let mut a = Tensor::zeros(an.clone(), vec![config.rank, inp]);
                let bound = 1.0 / (inp as f64).sqrt();
                let mut rng = SplitMix64::new(seed ^ crate::rng::fnv1a(&an).rotate_left(29));
                a.data.iter_mut().for_each(|x| *x = ((rng.unit() * 2.0 - 1.0) * bound) as f32);
                tensors.push(a);
                tensors.push(Tensor::zeros(bn, vec![out, config.rank]));
            }
        }
        Lora::from_params(model, config, Params { tensors })
    }

    /// Wraps tensors laid out as [`Lora::init`] lays them (names and shapes checked).
    fn from_params(model: &ModelConfig, config: LoraConfig, params: Params) -> Result<Lora> {
        let mut index = vec![[None; 7]; model.num_hidden_layers];
        let mut k = 0;
        for (l, slot) in index.iter_mut().enumerate() {
            for &t in &config.targets {
                let (inp, out) = t.dims(model);
                let (an, bn) = tensor_names(l, t);
                for (name, shape) in [(&an, vec![config.rank, inp]), (&bn, vec![out, config.rank])] {
                    let Some(p) = params.tensors.get(k + (name == &bn) as usize) else { bail!("adapter is missing tensor {name}") };
                    if &p.name != name || p.shape != shape {
                        bail!("adapter tensor {} {:?} found where {name} {shape:?} was expected", p.name, p.shape);
                    }
                }
                slot[t as usize] = Some(k);
                k += 2;
            }
        }
        if k != params.tensors.len() {
            bail!("adapter has {} tensors, its config calls for {k}", params.tensors.len());
        }
        Ok(Lora { config, params, index, dropout_seed: AtomicU64::new(0) })
    }

    /// The seed of the dropout masks of the next forward / backward (a training loop sets one
    /// per sequence; the forward and backward of one sequence must see the same).
    pub fn set_dropout_seed(&self, seed: u64) {
        self.dropout_seed.store(seed, Ordering::Relaxed);
    }

    /// Where layer `l`'s A of target `t` is in `params` (its B follows), if it has an adapter.
    pub fn tensor_index(&self, l: usize, t: Target) -> Option<usize> {
        self.index[l][t as usize]
    }

    /// Whether layer `l` has an adapter on `t`.
    pub fn has(&self, l: usize, t: Target) -> bool {
        self.index[l][t as usize].is_some()
    }

    /// Inverted dropout factor of element `idx` of target `t`'s input in layer `l`: 0 (dropped)
    /// or 1 / (1 − p).
    pub fn dropout_factor(&self, l: usize, t: Target, idx: usize) -> f32 {
        dropout_factor(self.dropout_seed.load(Ordering::Relaxed), self.config.dropout, l, t, idx)
    }

    fn dropout_on(&self, train: bool) -> bool {
        train && self.config.dropout > 0.0
    }

    /// `out[T, out] += s · B A drop(x)` for `call`'s layer and target (no-op where it has no
    /// adapter); `x` `[T, in]`, `n` = T. With `acts` (training) what the backward needs is kept
    /// there.
    pub fn forward(&self, call: LoraCall, x: &[f32], out: &mut [f32], n: usize, acts: Option<&mut LoraActs>) {
        let LoraCall { dtype, layer: l, target: t, train } = call;
        let Some(k) = self.index[l][t as usize] else { return };
        let (a, b) = (&self.params.tensors[k].data, &self.params.tensors[k + 1].data);
        let r = self.config.rank;
        let (inp, o) = (a.len() / r, b.len() / r);
        let mut own = LoraActs::default();
        let acts = acts.unwrap_or(&mut own);
        let xin: &[f32] = if self.dropout_on(train) {
            acts.xd.clear();
            acts.xd.extend(x.iter().enumerate().map(|(i, &v)| v * self.dropout_factor(l, t, i)));
            &acts.xd
        } else {
            x
        };
        acts.xs.resize(n * r, 0.0);
        ops::gemm_as(dtype, Gemm::new(n, r, inp).transposed(false, true), xin, a, &mut acts.xs);
        let s = self.config.scale();
        acts.xs.iter_mut().for_each(|v| *v *= s);
        ops::gemm_as(dtype, Gemm::new(n, o, r).transposed(false, true).beta(1.0), &acts.xs, b, out);
    }

    /// The backward of [`Lora::forward`]: `dy` `[T, out]` is d loss / d out; adds d loss / d x
    /// into `dx` `[T, in]` and the A / B gradients into `grads` (the layout of `self.params`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(&self, call: LoraCall, x: &[f32], acts: &LoraActs, dy: &[f32], dx: &mut [f32], grads: &mut Params, n: usize) {
        let LoraCall { dtype, layer: l, target: t, train } = call;
        let Some(k) = self.index[l][t as usize] else { return };
        let (a, b) = (&self.params.tensors[k].data, &self.params.tensors[k + 1].data);
        let r = self.config.rank;
        let (inp, o) = (a.len() / r, b.len() / r);
        let drop = self.dropout_on(train);
        let xin: &[f32] = if drop { &acts.xd } else { x };
        // dB [out, r] += dyᵀ @ xs
        ops::gemm_as(dtype, Gemm::new(o, r, n).transposed(true, false).beta(1.0), dy, &acts.xs, &mut grads.tensors[k + 1].data);
        // dxa [T, r] = s · dy @ B
        let mut dxa = vec![0f32; n * r];
        ops::gemm_as(dtype, Gemm::new(n, r, o), dy, b, &mut dxa);
        let s = self.config.scale();
        dxa.iter_mut().for_each(|v| *v *= s);
        // dA [r, in] += dxaᵀ @ drop(x)
        ops::gemm_as(dtype, Gemm::new(r, inp, n).transposed(true, false).beta(1.0), &dxa, xin, &mut grads.tensors[k].data);
        // dx += drop'(dxa @ A)
        if drop {
            let mut dxd = vec![0f32; n * inp];
            ops::gemm_as(dtype, Gemm::new(n, inp, r), &dxa, a, &mut dxd);
            dx.iter_mut().zip(&dxd).enumerate().for_each(|(i, (d, &g))| *d += g * self.dropout_factor(l, t, i));
        } else {
            ops::gemm_as(dtype, Gemm::new(n, inp, r).beta(1.0), &dxa, a, dx);
        }
    }

    /// `W += s · B A` for every adapted layer of `params` (a model's, in canonical layout):
    /// PEFT's `merge_and_unload`.
    pub fn merge_into(&self, model: &ModelConfig, params: &mut Params) -> Result<()> {
        let r = self.config.rank;
        let s = self.config.scale();
        for l in 0..model.num_hidden_layers {
            for &t in &self.config.targets {
                let k = self.index[l][t as usize].expect("index covers every target");
                let (a, b) = (&self.params.tensors[k].data, &self.params.tensors[k + 1].data);
                let (inp, o) = t.dims(model);
                let name = format!("model.layers.{l}.{}.weight", t.module());
                let w = params.get_mut(&name).with_context(|| format!("merging LoRA: the model has no {name}"))?;
                let mut delta = vec![0f32; o * inp];
                ops::gemm(Gemm::new(o, inp, r), b, a, &mut delta);
                w.data.iter_mut().zip(&delta).for_each(|(w, d)| *w += d * s);
            }
        }
        Ok(())
    }

    /// Writes `adapter_config.json` and `adapter_model.safetensors` (f32) into `dir`;
    /// `base` is the config's `base_model_name_or_path`.
    pub fn save(&self, dir: &Path, base: &str) -> Result<()> {
        let c = &self.config;
        let cfg = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": c.rank,
            "lora_alpha": c.alpha,
            "lora_dropout": c.dropout,
            "target_modules": c.targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "bias": "none",
            "fan_in_fan_out": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        });
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join(ADAPTER_CONFIG), serde_json::to_string_pretty(&cfg)? + "\n").with_context(|| format!("writing {}", dir.join(ADAPTER_CONFIG).display()))?;
        let encoded: Vec<Vec<u8>> = self.params.tensors.iter().map(|t| t.data.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
        let mut views = BTreeMap::new();
        for (t, bytes) in self.params.tensors.iter().zip(&encoded) {
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.shape.clone(), bytes).map_err(|e| anyhow::anyhow!("{e:?}")).with_context(|| format!("encoding {}", t.name))?;
            views.insert(t.name.clone(), view);
        }
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let bytes = safetensors::tensor::serialize(views, Some(meta)).map_err(|e| anyhow::anyhow!("{e:?}")).context("serialising the adapter")?;
        std::fs::write(dir.join(ADAPTER_WEIGHTS), bytes).with_context(|| format!("writing {}", dir.join(ADAPTER_WEIGHTS).display()))
    }

    /// Whether `dir` holds a PEFT adapter.
    pub fn is_adapter_dir(dir: &Path) -> bool {
        dir.join(ADAPTER_CONFIG).is_file()
    }

    /// Reads `adapter_config.json`: the LoRA settings and `base_model_name_or_path`. Settings this
    /// code does not implement (bias, DoRA, rsLoRA, per-layer patterns, fan_in_fan_out, extra
    /// trained modules) are errors naming the field.
    pub fn read_config(dir: &Path) -> Result<(LoraConfig, Option<String>)> {
        let path = dir.join(ADAPTER_CONFIG);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
        let field = |k: &str| v.get(k).filter(|x| !x.is_null());
        let bad = |k: &str, why: &str| anyhow::anyhow!("{}: {k} {why}", path.display());
        match field("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            other => bail!("{}: peft_type is {other:?}, only \"LORA\" is supported", path.display()),
        }
        let rank = field("r").and_then(Value::as_u64).ok_or_else(|| bad("r", "is missing or not a positive integer"))? as usize;
        let alpha = field("lora_alpha").and_then(Value::as_f64).ok_or_else(|| bad("lora_alpha", "is missing or not a number"))?;
        let dropout = field("lora_dropout").map_or(Some(0.0), Value::as_f64).ok_or_else(|| bad("lora_dropout", "is not a number"))?;
        let targets = match field("target_modules") {
            Some(Value::String(s)) => Target::parse_list(s),
            // PEFT matches an entry against a module path's tail, and writes `all-linear` out as
            // full paths (model.layers.0.self_attn.q_proj, ...): the last part names the target
            // (a layer it leaves out is then a missing tensor, named by `Lora::load`).
            Some(Value::Array(a)) => a.iter().map(|x| x.as_str().map_or_else(|| Err(anyhow::anyhow!("not a string: {x}")), |s| Target::parse(s.rsplit('.').next().unwrap_or(s)))).collect::<Result<Vec<_>>>().map(|mut v| {
                v.sort();
                v.dedup();
                v
            }),
            _ => Err(anyhow::anyhow!("missing")),
        }
        .map_err(|e| bad("target_modules", &format!("is unusable: {e:#}")))?;
        for (k, ok) in [
            ("bias", field("bias").is_none_or(|b| b == "none")),
            ("use_dora", field("use_dora").is_none_or(|b| b == false)),
            ("use_rslora", field("use_rslora").is_none_or(|b| b == false)),
            ("fan_in_fan_out", field("fan_in_fan_out").is_none_or(|b| b == false)),
            ("modules_to_save", field("modules_to_save").is_none_or(|m| m.as_array().is_some_and(|a| a.is_empty()))),
            ("layers_to_transform", field("layers_to_transform").is_none()),
            ("lora_bias", field("lora_bias").is_none_or(|b| b == false)),
            ("exclude_modules", field("exclude_modules").is_none()),
            ("trainable_token_indices", field("trainable_token_indices").is_none()),
            ("layer_replication", field("layer_replication").is_none()),
            ("target_parameters", field("target_parameters").is_none()),
            ("rank_pattern", field("rank_pattern").is_none_or(|m| m.as_object().is_some_and(|o| o.is_empty()))),
            ("alpha_pattern", field("alpha_pattern").is_none_or(|m| m.as_object().is_some_and(|o| o.is_empty()))),
        ] {
            if !ok {
                bail!("{}: {k} = {} is not supported (plain LoRA only)", path.display(), v[k]);
            }
        }
        let config = LoraConfig { rank, alpha, dropout, targets };
        config.validate().with_context(|| path.display().to_string())?;
        let base = field("base_model_name_or_path").and_then(Value::as_str).map(str::to_string);
        Ok((config, base))
    }

    /// Loads the adapter of `dir` for a model of config `model` (tensors f32, bf16 or f16).
    pub fn load(dir: &Path, model: &ModelConfig) -> Result<Lora> {
        let (config, _) = Lora::read_config(dir)?;
        let file = dir.join(ADAPTER_WEIGHTS);
        let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| anyhow::anyhow!("{e:?}")).with_context(|| format!("{} is not a valid safetensors file", file.display()))?;
        let mut tensors = Vec::new();
        let mut expected = std::collections::HashSet::new();
        for l in 0..model.num_hidden_layers {
            for &t in &config.targets {
                let (inp, out) = t.dims(model);
                let (an, bn) = tensor_names(l, t);
                for (name, shape) in [(an, vec![config.rank, inp]), (bn, vec![out, config.rank])] {
                    let view = st.tensor(&name).map_err(|_| anyhow::anyhow!("{} is missing tensor {name} (shape {shape:?})", file.display()))?;
                    if view.shape() != shape.as_slice() {
                        bail!("tensor {name} in {} has shape {:?}, expected {shape:?}", file.display(), view.shape());
                    }
                    let data = crate::params::to_f32(&name, &file, view.dtype(), view.data())?;
                    if let Some(pos) = data.iter().position(|x| !x.is_finite()) {
                        bail!("tensor {name} in {} has a non-finite value at flat index {pos}", file.display());
                    }
                    expected.insert(name.clone());
                    tensors.push(Tensor { name, shape, data });
                }
            }
        }
        if let Some(extra) = st.names().into_iter().find(|n| !expected.contains(*n)) {
            bail!("unexpected tensor {extra} in {} (the adapter config targets {:?} of {} layers)", file.display(), config.targets.iter().map(|t| t.name()).collect::<Vec<_>>(), model.num_hidden_layers);
        }
        Lora::from_params(model, config, Params { tensors })
    }

    /// Where the base model of adapter directory `dir` is: `dir` itself when it holds a model
    /// (what coa-train-step writes), else its `base_model_name_or_path` (relative: to `dir`).
    pub fn base_dir(dir: &Path) -> Result<PathBuf> {
        if dir.join("config.json").is_file() {
            return Ok(dir.to_path_buf());
        }
        let (_, base) = Lora::read_config(dir)?;
        let Some(base) = base else { bail!("{}: no base model beside the adapter and no base_model_name_or_path", dir.join(ADAPTER_CONFIG).display()) };
        let p = PathBuf::from(&base);
        let rel = dir.join(&p);
        if p.is_relative() && rel.join("config.json").is_file() {
            return Ok(rel);
        }
        if p.join("config.json").is_file() {
            return Ok(p);
        }
        bail!("{}: base_model_name_or_path {base:?} is not a local model directory (nor one beside the adapter)", dir.join(ADAPTER_CONFIG).display())
    }
}
