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
use crate::params::{param_specs, to_f32, Params, Tensor};

/// Storage dtype of the saved weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveDtype {
    F32,
    Bf16,
}

impl SaveDtype {
    /// The `torch_dtype` string of config.json.
    /// Whether every value of `x` is stored exactly (bf16: weights that came from a bf16 file).
    pub fn holds_exactly(self, x: &[f32]) -> bool {
        match self {
            SaveDtype::F32 => true,
            SaveDtype::Bf16 => x.iter().all(|&v| half::bf16::from_f32(v).to_f32().to_bits() == v.to_bits()),
        }
    }

    pub fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::Bf16 => "bfloat16",
        }
    }
}

/// The largest weights file [`Model::save`] writes: the Hub's usual shard size (huggingface_hub's
/// default), so a 7B checkpoint saves as the few-GB shards `from_pretrained` and the Hub expect.
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// The index of a sharded checkpoint, as transformers names it.
const INDEX_FILE: &str = "model.safetensors.index.json";

/// A size as transformers' `max_shard_size` spells it: bytes, or a number with KB/MB/GB (powers
/// of 1000) or KiB/MiB/GiB (powers of 1024), any case. At least one byte.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let mult: Option<u64> = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => Some(1),
        "kb" => Some(1_000),
        "mb" => Some(1_000_000),
        "gb" => Some(1_000_000_000),
        "kib" => Some(1 << 10),
        "mib" => Some(1 << 20),
        "gib" => Some(1 << 30),
        _ => None,
    };
    let (Some(mult), Ok(n)) = (mult, digits.parse::<u64>()) else {
        bail!("{text:?} is not a size (expected an integer with an optional unit: 5GB, 500MB, 2GiB, 1000000)")
    };
    match n.checked_mul(mult) {
        Some(0) => bail!("{text:?}: a shard size must be at least one byte"),
        Some(b) => Ok(b),
        None => bail!("{text:?} is too large a size"),
    }
}

/// How a checkpoint's weights are written: their dtype, and the largest file before they are
/// sharded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveFormat {
    pub dtype: SaveDtype,
    pub max_shard_bytes: u64,
}

impl From<SaveDtype> for SaveFormat {
    fn from(dtype: SaveDtype) -> SaveFormat {
        SaveFormat { dtype, max_shard_bytes: DEFAULT_MAX_SHARD_BYTES }
    }
}

/// Tensors in checkpoints that carry no parameters (old HF RoPE buffers).
fn ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
}

/// The safetensors files of a checkpoint directory (what a stage that reads it records as its
/// input): `model.safetensors`, or the files named by
/// `model.safetensors.index.json`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join(INDEX_FILE);
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
    ///
    /// A directory with a PEFT LoRA adapter (`adapter_config.json`, see [`crate::lora`]) loads
    /// as its base with the adapter merged in: the model it describes, ready to decode.
    pub fn load(dir: &Path) -> Result<Model> {
        let mut m = Model::load_with_adapter(dir)?;
        if let Some(lora) = m.lora.take() {
            lora.merge_into(&m.config, &mut m.params).with_context(|| format!("merging the adapter of {}", dir.display()))?;
        }
        Ok(m)
    }

    /// [`Model::load`], but an adapter directory's adapter is kept apart ([`Model::lora`]),
    /// to train it further.
    pub fn load_with_adapter(dir: &Path) -> Result<Model> {
        if crate::lora::Lora::is_adapter_dir(dir) {
            let base = crate::lora::Lora::base_dir(dir)?;
            let mut m = Model::load_base(&base).with_context(|| format!("the base model of adapter {}", dir.display()))?;
            m.lora = Some(crate::lora::Lora::load(dir, &m.config)?);
            return Ok(m);
        }
        Model::load_base(dir)
    }

    /// The model of `dir`'s config.json and weights, ignoring any adapter beside them.
    pub fn load_base(dir: &Path) -> Result<Model> {
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
    /// generation_config.json. Weights larger than the format's `max_shard_bytes` (a bare
    /// [`SaveDtype`]: [`DEFAULT_MAX_SHARD_BYTES`]) are split as `save_pretrained(max_shard_size=...)`
    /// splits them, into `model-0000I-of-0000N.safetensors` files (a tensor larger than the limit
    /// gets a file of its own) named by `model.safetensors.index.json`; the other layout's files
    /// left in `dir` by an earlier save are removed, so the loader cannot pick stale weights. Each
    /// file is written to a temporary name, then renamed. Tied models do not store lm_head.weight
    /// (HF ties it on load).
    pub fn save(&self, dir: &Path, format: impl Into<SaveFormat>) -> Result<()> {
        let SaveFormat { dtype, max_shard_bytes } = format.into();
        self.check_layout()?;
        fs::create_dir_all(dir).with_context(|| format!("creating checkpoint directory {}", dir.display()))?;
        let mut config = self.config.clone();
        config.torch_dtype = Some(dtype.torch_name().to_string());
        if config.architectures.is_empty() {
            config.architectures = vec![crate::config::hf_architecture(&config.model_type).to_string()];
        }
        let cfg_text = serde_json::to_string_pretty(&config.to_json())? + "\n";
        write_atomically_now(&dir.join("config.json"), cfg_text.as_bytes())?;

        self.save_weights(dir, dtype, max_shard_bytes)?;

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

    /// The weights of [`Model::save`]: the tensors in model order, cut into shards as
    /// huggingface_hub cuts a state dict (a shard closes when the next tensor would pass the
    /// limit), each shard encoded only while it is written.
    fn save_weights(&self, dir: &Path, dtype: SaveDtype, max_shard_bytes: u64) -> Result<()> {
        let (st_dtype, width) = match dtype {
            SaveDtype::F32 => (Dtype::F32, 4u64),
            SaveDtype::Bf16 => (Dtype::BF16, 2u64),
        };
        let mut shards: Vec<Vec<&Tensor>> = Vec::new();
        let mut open: Vec<&Tensor> = Vec::new();
        let mut open_bytes = 0u64;
        for t in &self.params.tensors {
            let bytes = t.data.len() as u64 * width;
            if bytes > max_shard_bytes {
                shards.push(vec![t]);
                continue;
            }
            if open_bytes + bytes > max_shard_bytes && !open.is_empty() {
                shards.push(std::mem::take(&mut open));
                open_bytes = 0;
            }
            open.push(t);
            open_bytes += bytes;
        }
        if !open.is_empty() {
            shards.push(open);
        }
        let n = shards.len();
        let names: Vec<String> = if n == 1 {
            vec!["model.safetensors".to_string()]
        } else {
            (1..=n).map(|i| format!("model-{i:05}-of-{n:05}.safetensors")).collect()
        };
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let mut weight_map = Map::new();
        for (shard, file) in shards.iter().zip(&names) {
            let encoded: Vec<Vec<u8>> = shard
                .iter()
                .map(|t| match dtype {
                    SaveDtype::F32 => t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    SaveDtype::Bf16 => t.data.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect(),
                })
                .collect();
            let mut views = BTreeMap::new();
            for (t, bytes) in shard.iter().zip(&encoded) {
                let view = safetensors::tensor::TensorView::new(st_dtype, t.shape.clone(), bytes)
                    .map_err(|e| anyhow::anyhow!("{e:?}"))
                    .with_context(|| format!("encoding tensor {}", t.name))?;
                views.insert(t.name.clone(), view);
                weight_map.insert(t.name.clone(), Value::from(file.as_str()));
            }
            let bytes = safetensors::tensor::serialize(views, Some(meta.clone()))
                .map_err(|e| anyhow::anyhow!("{e:?}"))
                .with_context(|| format!("serialising {file}"))?;
            write_atomically_now(&dir.join(file), &bytes)?;
        }
        // The other layout's files (and shards of another count) go, the index last written.
        let stale_shard = |f: &str| f.starts_with("model-") && f.ends_with(".safetensors") && f.contains("-of-") && !names.iter().any(|n| n == f);
        if n > 1 {
            let total_size: u64 = self.params.tensors.iter().map(|t| t.data.len() as u64 * width).sum();
            let index = serde_json::json!({
                "metadata": { "total_parameters": self.params.n_elements(), "total_size": total_size },
                "weight_map": weight_map,
            });
            write_atomically_now(&dir.join(INDEX_FILE), (serde_json::to_string_pretty(&index)? + "\n").as_bytes())?;
            remove_if_present(&dir.join("model.safetensors"))?;
        } else {
            remove_if_present(&dir.join(INDEX_FILE))?;
        }
        for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let name = entry?.file_name();
            if stale_shard(&name.to_string_lossy()) {
                remove_if_present(&dir.join(&name))?;
            }
        }
        Ok(())
    }
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_context(|| format!("removing stale {}", path.display())),
        _ => Ok(()),
    }
}
