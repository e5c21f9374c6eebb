//! Parameters in canonical order, with HF names.

use std::path::Path;

use anyhow::{bail, Result};
use safetensors::Dtype;

use crate::config::ModelConfig;

/// A named f32 tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn zeros(name: impl Into<String>, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor { name: name.into(), shape, data: vec![0.0; n] }
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

/// All parameters of a model, in canonical order (see `param_specs`).
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub tensors: Vec<Tensor>,
}

impl Params {
    /// Same names and shapes, all zeros (a gradient buffer).
    pub fn zeros_like(&self) -> Params {
        Params {
            tensors: self.tensors.iter().map(|t| Tensor::zeros(t.name.clone(), t.shape.clone())).collect(),
        }
    }
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Tensor> {
        self.tensors.iter_mut().find(|t| t.name == name)
    }
    pub fn iter(&self) -> std::slice::Iter<'_, Tensor> {
        self.tensors.iter()
    }
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Tensor> {
        self.tensors.iter_mut()
    }
    pub fn len(&self) -> usize {
        self.tensors.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
    /// Total number of f32 elements.
    pub fn n_elements(&self) -> usize {
        self.tensors.iter().map(|t| t.data.len()).sum()
    }
    pub fn fill_zero(&mut self) {
        for t in &mut self.tensors {
            t.data.iter_mut().for_each(|x| *x = 0.0);
        }
    }
    /// Sum of squares of every element (f64 accumulation), e.g. for a global grad norm.
    pub fn sum_squares(&self) -> f64 {
        self.tensors
            .iter()
            .map(|t| t.data.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>())
            .sum()
    }
    /// Multiply every element by `s`.
    pub fn scale(&mut self, s: f32) {
        for t in &mut self.tensors {
            t.data.iter_mut().for_each(|x| *x *= s);
        }
    }
    /// `self += other` elementwise; names and shapes must match.
    pub fn add_assign(&mut self, other: &Params) -> Result<()> {
        self.check_same_layout(other, "add_assign")?;
        for (a, b) in self.tensors.iter_mut().zip(&other.tensors) {
            a.data.iter_mut().zip(&b.data).for_each(|(x, y)| *x += *y);
        }
        Ok(())
    }
    /// Error unless `other` has the same tensors (names, order, shapes).
    pub fn check_same_layout(&self, other: &Params, what: &str) -> Result<()> {
        if self.tensors.len() != other.tensors.len() {
            bail!("{what}: {} tensors vs {}", self.tensors.len(), other.tensors.len());
        }
        for (a, b) in self.tensors.iter().zip(&other.tensors) {
            if a.name != b.name || a.shape != b.shape || a.data.len() != b.data.len() {
                bail!("{what}: tensor {} {:?} does not match {} {:?}", a.name, a.shape, b.name, b.shape);
            }
        }
        Ok(())
    }
}

/// Name and shape of one parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

/// Index of every tensor of a layer within `Params::tensors`.
#[derive(Clone, Debug)]
pub struct LayerIdx {
    pub wq: usize,
    pub bq: Option<usize>,
    pub wk: usize,
    pub bk: Option<usize>,
    pub wv: usize,
    pub bv: Option<usize>,
    pub wo: usize,
    pub bo: Option<usize>,
    /// Qwen3's per-head RMSNorm weights of q and k (`[head_dim]`).
    pub qn: Option<usize>,
    pub kn: Option<usize>,
    pub wg: usize,
    pub bg: Option<usize>,
    pub wu: usize,
    pub bu: Option<usize>,
    pub wd: usize,
    pub bd: Option<usize>,
    pub ln1: usize,
    pub ln2: usize,
}

/// Index of every tensor within `Params::tensors` (canonical order).
#[derive(Clone, Debug)]
pub struct Layout {
    pub embed: usize,
    pub layers: Vec<LayerIdx>,
    pub norm: usize,
    /// `None` when tied: the head is `embed`.
    pub lm_head: Option<usize>,
}

/// The canonical parameter list, in HF module order:
/// embed_tokens; per layer: q,k,v,o (+biases), q_norm, k_norm (qwen3), gate, up, down (+biases), input_layernorm,
/// post_attention_layernorm; final norm; lm_head (only when untied).
pub fn param_specs(c: &ModelConfig) -> Vec<ParamSpec> {
    build(c).0
}

// Here rather than in config.rs so that config does not depend on params.
impl ModelConfig {
    /// Number of parameters (each tied matrix counted once).
    pub fn n_params(&self) -> usize {
        param_specs(self).iter().map(|s| s.shape.iter().product::<usize>()).sum()
    }
}

/// Where each tensor of [`param_specs`] sits (for code that lays the parameters out anew, e.g.
/// the GPU model).
pub fn layout(c: &ModelConfig) -> Layout {
    build(c).1
}

fn build(c: &ModelConfig) -> (Vec<ParamSpec>, Layout) {
    let d = c.hidden_size;
    let hd = c.head_dim();
    let qd = c.num_attention_heads * hd;
    let kvd = c.num_key_value_heads * hd;
    let inter = c.intermediate_size;
    let mut specs: Vec<ParamSpec> = Vec::new();
    let mut push = |name: String, shape: Vec<usize>| -> usize {
        specs.push(ParamSpec { name, shape });
        specs.len() - 1
    };
    let embed = push("model.embed_tokens.weight".into(), vec![c.vocab_size, d]);
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}.");
        let qkvb = c.qkv_bias();
        let wq = push(format!("{p}self_attn.q_proj.weight"), vec![qd, d]);
        let bq = qkvb.then(|| push(format!("{p}self_attn.q_proj.bias"), vec![qd]));
        let wk = push(format!("{p}self_attn.k_proj.weight"), vec![kvd, d]);
        let bk = qkvb.then(|| push(format!("{p}self_attn.k_proj.bias"), vec![kvd]));
        let wv = push(format!("{p}self_attn.v_proj.weight"), vec![kvd, d]);
        let bv = qkvb.then(|| push(format!("{p}self_attn.v_proj.bias"), vec![kvd]));
        let wo = push(format!("{p}self_attn.o_proj.weight"), vec![d, qd]);
        let bo = c.o_bias().then(|| push(format!("{p}self_attn.o_proj.bias"), vec![d]));
        let qn = c.qk_norm().then(|| push(format!("{p}self_attn.q_norm.weight"), vec![hd]));
        let kn = c.qk_norm().then(|| push(format!("{p}self_attn.k_norm.weight"), vec![hd]));
        let mb = c.mlp_bias();
        let wg = push(format!("{p}mlp.gate_proj.weight"), vec![inter, d]);
        let bg = mb.then(|| push(format!("{p}mlp.gate_proj.bias"), vec![inter]));
        let wu = push(format!("{p}mlp.up_proj.weight"), vec![inter, d]);
        let bu = mb.then(|| push(format!("{p}mlp.up_proj.bias"), vec![inter]));
        let wd = push(format!("{p}mlp.down_proj.weight"), vec![d, inter]);
        let bd = mb.then(|| push(format!("{p}mlp.down_proj.bias"), vec![d]));
        let ln1 = push(format!("{p}input_layernorm.weight"), vec![d]);
        let ln2 = push(format!("{p}post_attention_layernorm.weight"), vec![d]);
        layers.push(LayerIdx { wq, bq, wk, bk, wv, bv, wo, bo, qn, kn, wg, bg, wu, bu, wd, bd, ln1, ln2 });
    }
    let norm = push("model.norm.weight".into(), vec![d]);
    let lm_head = (!c.tie_word_embeddings).then(|| push("lm_head.weight".into(), vec![c.vocab_size, d]));
    (specs, Layout { embed, layers, norm, lm_head })
}

/// Decode one safetensors tensor to f32; errors name the tensor and file.
pub(crate) fn to_f32(name: &str, file: &Path, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        other => bail!(
            "tensor {name} in {} has dtype {other:?}; only F32, BF16 and F16 are supported",
            file.display()
        ),
    })
}
