//! HF checkpoint IO: `config.json`, `model.safetensors` (or a sharded index),
//! `generation_config.json`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::{Dtype, SafeTensors};
use serde_json::{Map, Value};

use coa_schemas::output::write_atomically_now;

use crate::config::ModelConfig;
use crate::model::Model;
use crate::params::{param_specs, Params, Tensor};

/// Storage dtype of the saved weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveDtype {
    F32,
    Bf16,
}

impl SaveDtype {
    /// The `torch_dtype` string of config.json.
    pub fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::Bf16 => "bfloat16",
        }
    }
}

/// Tensors in checkpoints that carry no parameters (old HF RoPE buffers).
fn ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
}

/// Decode one safetensors tensor to f32; errors name the tensor and file.
fn to_f32(name: &str, file: &Path, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
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

/// The safetensors files of a checkpoint directory: `model.safetensors`, or the files named by
/// `model.safetensors.index.json`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .with_context(|| format!("{} has no `weight_map` object", index.display()))?;
        let mut files: Vec<String> = Vec::new();
        for (name, f) in map {
            let f = f
                .as_str()
                .with_context(|| format!("{}: weight_map entry for {name} is not a file name", index.display()))?;
            if f.contains('/') || f.contains('\\') || f == ".." {
                bail!("{}: weight_map entry for {name} names {f:?}, outside the checkpoint", index.display());
            }
            if !files.iter().any(|x| x == f) {
                files.push(f.to_string());
            }
        }
        files.sort();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    bail!(
        "checkpoint {} has neither model.safetensors nor model.safetensors.index.json",
        dir.display()
    )
}

impl Model {
    /// Load an HF checkpoint directory (config.json + model.safetensors or a sharded index;
    /// weights in f32, bf16 or f16). Missing, misshaped or unexpected tensors are errors naming
    /// the tensor and the expected shape. A tied model may or may not contain lm_head.weight.
    /// A GGUF file (see [`crate::gguf`]) loads too: the same model HF transformers derives from it.
    pub fn load(dir: &Path) -> Result<Model> {
        if crate::gguf::is_gguf(dir) {
            return crate::gguf::load_model(&crate::gguf::GgufFile::open(dir)?);
        }
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        config.validate().with_context(|| format!("model config {}", dir.join("config.json").display()))?;
        let specs = param_specs(&config);
        let index: HashMap<&str, usize> = specs.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
        let mut slots: Vec<Option<Vec<f32>>> = vec![None; specs.len()];
        for file in weight_files(dir)? {
            let bytes = fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let st = SafeTensors::deserialize(&bytes)
                .map_err(|e| anyhow::anyhow!("{e:?}"))
                .with_context(|| format!("{} is not a valid safetensors file", file.display()))?;
            let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
            names.sort();
            for name in names {
                let view = st
                    .tensor(&name)
                    .map_err(|e| anyhow::anyhow!("{e:?}"))
                    .with_context(|| format!("reading tensor {name} from {}", file.display()))?;
                let Some(&i) = index.get(name.as_str()) else {
                    if ignorable(&name) || (config.tie_word_embeddings && name == "lm_head.weight") {
                        continue;
                    }
                    bail!(
                        "unexpected tensor {name} in {}: the config ({} layers, tie_word_embeddings = {}, model_type = {}) has no such parameter",
                        file.display(),
                        config.num_hidden_layers,
                        config.tie_word_embeddings,
                        config.model_type
                    );
                };
                let spec = &specs[i];
                if view.shape() != spec.shape.as_slice() {
                    bail!(
                        "tensor {name} in {} has shape {:?}, expected {:?}",
                        file.display(),
                        view.shape(),
                        spec.shape
                    );
                }
                if slots[i].is_some() {
                    bail!("tensor {name} appears twice (again in {})", file.display());
                }
                slots[i] = Some(to_f32(&name, &file, view.dtype(), view.data())?);
            }
        }
        let mut tensors = Vec::with_capacity(specs.len());
        for (spec, slot) in specs.into_iter().zip(slots) {
            let Some(data) = slot else {
                bail!(
                    "checkpoint {} is missing tensor {} (expected shape {:?})",
                    dir.display(),
                    spec.name,
                    spec.shape
                );
            };
            if let Some(pos) = data.iter().position(|x| !x.is_finite()) {
                bail!("tensor {} has a non-finite value at flat index {pos}", spec.name);
            }
            tensors.push(Tensor { name: spec.name, shape: spec.shape, data });
        }
        Model::new(config, Params { tensors })
    }

    /// Save as an HF checkpoint: config.json, model.safetensors (metadata {"format": "pt"}),
    /// generation_config.json. Each file is written to a temporary name, then renamed. Tied models
    /// do not store lm_head.weight (HF ties it on load).
    pub fn save(&self, dir: &Path, dtype: SaveDtype) -> Result<()> {
        self.check_layout()?;
        fs::create_dir_all(dir).with_context(|| format!("creating checkpoint directory {}", dir.display()))?;
        let mut config = self.config.clone();
        config.torch_dtype = Some(dtype.torch_name().to_string());
        if config.architectures.is_empty() {
            config.architectures = vec![crate::config::hf_architecture(&config.model_type).to_string()];
        }
        let cfg_text = serde_json::to_string_pretty(&config.to_json())? + "\n";
        write_atomically_now(&dir.join("config.json"), cfg_text.as_bytes())?;

        // safetensors: every tensor as little-endian bytes of the chosen dtype.
        let (st_dtype, encoded): (Dtype, Vec<Vec<u8>>) = match dtype {
            SaveDtype::F32 => (
                Dtype::F32,
                self.params.tensors.iter().map(|t| t.data.iter().flat_map(|x| x.to_le_bytes()).collect()).collect(),
            ),
            SaveDtype::Bf16 => (
                Dtype::BF16,
                self.params
                    .tensors
                    .iter()
                    .map(|t| t.data.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect())
                    .collect(),
            ),
        };
        let mut views = BTreeMap::new();
        for (t, bytes) in self.params.tensors.iter().zip(&encoded) {
            let view = safetensors::tensor::TensorView::new(st_dtype, t.shape.clone(), bytes)
                .map_err(|e| anyhow::anyhow!("{e:?}"))
                .with_context(|| format!("encoding tensor {}", t.name))?;
            views.insert(t.name.clone(), view);
        }
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let bytes = safetensors::tensor::serialize(views, Some(meta))
            .map_err(|e| anyhow::anyhow!("{e:?}"))
            .context("serialising model.safetensors")?;
        write_atomically_now(&dir.join("model.safetensors"), &bytes)?;

        let mut gen = Map::new();
        gen.insert("_from_model_config".into(), Value::Bool(true));
        if let Some(b) = self.config.bos_token_id {
            gen.insert("bos_token_id".into(), Value::from(b));
        }
        if let Some(e) = &self.config.eos_token_id {
            let ids = e.to_vec();
            gen.insert(
                "eos_token_id".into(),
                if ids.len() == 1 { Value::from(ids[0]) } else { Value::from(ids) },
            );
        }
        if let Some(p) = self.config.pad_token_id() {
            gen.insert("pad_token_id".into(), Value::from(p));
        }
        let gen_text = serde_json::to_string_pretty(&Value::Object(gen))? + "\n";
        write_atomically_now(&dir.join("generation_config.json"), gen_text.as_bytes())?;
        Ok(())
    }
}
