//! GGUF checkpoints out: a model and its byte-level BPE tokenizer written as the GGUF v3 file
//! llama.cpp's HF converter (`convert_hf_to_gguf.py`) would write, so llama.cpp, Ollama and LM
//! Studio run a model trained here.
//!
//! What is written ([`save`]):
//!
//! - `general.architecture` (`llama` or `qwen2`), `general.file_type` (llama.cpp's `LLAMA_FTYPE`
//!   of the dtype), `general.quantization_version` 2, and the `<arch>.*` hyper-parameters
//!   [`super::model_config`] reads back (see [`super::writer_as`]); a Llama 3 rope scaling as the
//!   `rope_freqs.weight` divisors llama.cpp applies.
//! - Tensors under llama.cpp's names, ggml dims (HF shapes reversed), llama q/k rows permuted.
//!   Matrices in the chosen [`GgufDtype`]; norms, biases and rope factors stay F32 (as the
//!   converter keeps 1-D tensors). F16 and BF16 round to nearest even; Q8_0 is gguf-py's
//!   `quantize`: per block of 32, `d = max|x| / 127`, `q = round_half_away(x / d)` with `1 / d`
//!   multiplied in f32, `d` stored as f16. A matrix whose rows are not whole Q8_0 blocks falls back
//!   to F16, as the converter does.
//! - The tokenizer ([`tokenizer_metadata`]): `tokenizer.ggml.model` "gpt2", `pre` (the split
//!   llama.cpp must apply, recognised from the tokenizer's pre-tokenizer), `tokens` (one per
//!   embedding row: ids without a token become `[PAD<id>]`, UNUSED), `token_type` (added special
//!   tokens CONTROL, other added tokens USER_DEFINED, the rest NORMAL), `merges`, the BOS / EOS /
//!   PAD / UNK ids, `add_bos_token` / `add_eos_token`, and `tokenizer.chat_template`.
//!
//! The file goes to a temporary name and is renamed into place.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use serde_json::Value as Json;
use tokenizers::Tokenizer;

use super::file::{GgmlType, Value};
use super::tokenizer::{GgufTokenizer, SpecialToken, SpecialTokens};
use crate::model::Model;

/// The element type of the exported matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufDtype {
    F32,
    F16,
    Bf16,
    Q8_0,
}

impl GgufDtype {
    pub const ALL: [GgufDtype; 4] = [GgufDtype::F32, GgufDtype::F16, GgufDtype::Bf16, GgufDtype::Q8_0];

    pub fn ggml_type(self) -> GgmlType {
        match self {
            GgufDtype::F32 => GgmlType::F32,
            GgufDtype::F16 => GgmlType::F16,
            GgufDtype::Bf16 => GgmlType::BF16,
            GgufDtype::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// llama.cpp's `llama_ftype` (`general.file_type`): ALL_F32, MOSTLY_F16, MOSTLY_BF16, MOSTLY_Q8_0.
    pub fn file_type(self) -> u32 {
        match self {
            GgufDtype::F32 => 0,
            GgufDtype::F16 => 1,
            GgufDtype::Bf16 => 32,
            GgufDtype::Q8_0 => 7,
        }
    }
}

impl fmt::Display for GgufDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.ggml_type().name().expect("a ggml type"))
    }
}

impl FromStr for GgufDtype {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<GgufDtype> {
        GgufDtype::ALL
            .into_iter()
            .find(|d| d.to_string().eq_ignore_ascii_case(s))
            .with_context(|| format!("GGUF dtype {s:?} is not one of F32, F16, BF16, Q8_0"))
    }
}

/// A tensor of HF shape `hf_shape` encoded as `dtype`: the ggml type it got and its bytes.
/// 1-D tensors stay F32; Q8_0 needs rows of whole blocks of 32, else F16.
pub fn encode(data: &[f32], hf_shape: &[usize], dtype: GgufDtype) -> (GgmlType, Vec<u8>) {
    let row = hf_shape.last().copied().unwrap_or(1);
    let dtype = match dtype {
        _ if hf_shape.len() < 2 => GgufDtype::F32,
        GgufDtype::Q8_0 if !row.is_multiple_of(32) => GgufDtype::F16,
        d => d,
    };
    let bytes = match dtype {
        GgufDtype::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        GgufDtype::F16 => data.iter().flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes()).collect(),
        GgufDtype::Bf16 => data.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect(),
        GgufDtype::Q8_0 => quantize_q8_0(data),
    };
    (dtype.ggml_type(), bytes)
}

/// Q8_0 blocks of `data` (a multiple of 32 values), as gguf-py's `quantize` computes them: every
/// step one f32 operation in its order, so the bytes are the same.
pub fn quantize_q8_0(data: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / 32 * 34);
    for block in data.chunks_exact(32) {
        let d = block.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        // f32::round rounds half away from zero, as gguf-py's `np_roundf`.
        out.extend(block.iter().map(|&x| (x * inv).round() as i8 as u8));
    }
    out
}

/// Whether [`save`] can write a model of `config` with `tokenizer`: the architecture and the
/// vocabulary checked before a long run rather than after it.
pub fn check_exportable(config: &crate::ModelConfig, tokenizer: &GgufTokenizer) -> Result<()> {
    super::gguf_architecture(config)?;
    tokenizer_metadata(tokenizer, config.vocab_size).map(drop)
}

/// Writes `model` with `tokenizer` (its special tokens and chat template) as a GGUF file at
/// `path`, matrices in `dtype` (see the module doc).
pub fn save(model: &Model, tokenizer: &GgufTokenizer, path: &Path, dtype: GgufDtype) -> Result<()> {
    model.check_layout()?;
    let mut w = super::writer_as(model, dtype)?;
    let kv = tokenizer_metadata(tokenizer, model.config.vocab_size)
        .with_context(|| format!("{}: the tokenizer cannot be written", path.display()))?;
    for (k, v) in kv {
        w.kv(&k, v);
    }
    w.write(path).with_context(|| format!("writing GGUF file {}", path.display()))
}

/// The `tokenizer.ggml.*` names llama.cpp gives the pre-tokenizer splits [`super::tokenizer`]
/// reads back: the first name of each regex there.
const PRE_NAMES: [&str; 5] = ["llama3", "tekken", "qwen2", "qwen35", "gpt-4o"];

/// `tokenizer.ggml.pre` for the tokenizer's pre-tokenizer (as serialised in tokenizer.json):
/// "gpt-2" (llama.cpp's spelling; "gpt2" is unknown to it) for plain byte-level with GPT-2's
/// regex, else the name of its split regex (isolating the matches, as llama.cpp splits). Any
/// other pre-tokenizer (or one adding a prefix space) has no llama.cpp equivalent: an error
/// saying what it is.
fn pre_name(pre: &Json) -> Result<&'static str> {
    let ty = |v: &Json| v["type"].as_str().unwrap_or("").to_string();
    let byte_level =
        |v: &Json, regex: bool| ty(v) == "ByteLevel" && v["use_regex"] == regex && v["add_prefix_space"] != true;
    if byte_level(pre, true) {
        return Ok("gpt-2");
    }
    if let Some([split, bl]) = pre["pretokenizers"].as_array().map(Vec::as_slice) {
        let isolated = ty(split) == "Split" && split["behavior"] == "Isolated" && split["invert"] != true;
        if isolated && byte_level(bl, false) {
            if let Some(regex) = split["pattern"]["Regex"].as_str() {
                if let Some(name) = PRE_NAMES.into_iter().find(|n| super::tokenizer::split_regex(n) == Some(regex)) {
                    return Ok(name);
                }
            }
        }
    }
    bail!(
        "its pre-tokenizer {} is none llama.cpp knows (byte-level with GPT-2's regex, or a split regex of {})",
        short_json(pre),
        PRE_NAMES.join(", ")
    )
}

fn short_json(v: &Json) -> String {
    let s = v.to_string();
    if s.chars().count() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const UNUSED: i32 = 5;

/// The `tokenizer.*` metadata of a byte-level BPE tokenizer for a model of `vocab_size`
/// embedding rows (see the module doc). Errors say what the tokenizer is when it is not one
/// llama.cpp can run as we do.
pub fn tokenizer_metadata(tok: &GgufTokenizer, vocab_size: usize) -> Result<Vec<(String, Value)>> {
    let json: Json = serde_json::from_str(&tok.tokenizer.to_string(false).map_err(anyhow::Error::msg)?)
        .context("serialising the tokenizer")?;
    let model = &json["model"];
    let byte_level = json["decoder"]["type"] == "ByteLevel";
    if model["type"] != "BPE" || !byte_level {
        let sentencepiece = model["byte_fallback"] == true;
        bail!(
            "only byte-level BPE tokenizers (model BPE, decoder ByteLevel: Llama 3, Qwen2, SmolLM) can be written to GGUF; this one has model {} and decoder {}{}",
            model["type"],
            json["decoder"]["type"],
            if sentencepiece { " (a SentencePiece vocabulary with byte fallback, as Llama 2, Mistral and Gemma have)" } else { "" }
        );
    }
    let pre = pre_name(&json["pre_tokenizer"])?;
    let mut tokens: Vec<Option<String>> = vec![None; vocab_size];
    let mut types = vec![NORMAL; vocab_size];
    for (t, id) in model["vocab"].as_object().context("tokenizer.json model.vocab is not an object")? {
        if let Some(slot) = id.as_u64().and_then(|i| tokens.get_mut(i as usize)) {
            *slot = Some(t.clone());
        }
    }
    for (id, t) in tok.tokenizer.get_added_tokens_decoder() {
        if let Some(slot) = tokens.get_mut(id as usize) {
            *slot = Some(t.content.clone());
            types[id as usize] = if t.special { 3 } else { 4 }; // CONTROL, USER_DEFINED
        }
    }
    let tokens: Vec<Value> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| match t {
            Some(t) => Value::String(t),
            None => {
                types[i] = UNUSED;
                Value::String(format!("[PAD{i}]"))
            }
        })
        .collect();
    let merges = model["merges"]
        .as_array()
        .context("tokenizer.json model.merges is not a list")?
        .iter()
        .map(|m| match (m.as_str(), m.as_array().map(Vec::as_slice)) {
            (Some(s), _) => Ok(Value::String(s.to_string())),
            (_, Some([Json::String(a), Json::String(b)])) => Ok(Value::String(format!("{a} {b}"))),
            _ => bail!("tokenizer.json model.merges holds {m}, not a pair"),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut kv = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types.into_iter().map(Value::I32).collect())),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges)),
    ];
    let s = &tok.specials;
    for (key, t) in
        [("bos_token_id", &s.bos), ("eos_token_id", &s.eos), ("padding_token_id", &s.pad), ("unknown_token_id", &s.unk)]
    {
        let Some(t) = t else { continue };
        if t.id as usize >= vocab_size {
            bail!(
                "the tokenizer's {key} {} ({:?}) is outside the model's {vocab_size} embedding rows",
                t.id,
                t.content
            );
        }
        kv.push((format!("tokenizer.ggml.{key}"), Value::U32(t.id)));
    }
    kv.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(s.add_bos)));
    kv.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(s.add_eos)));
    if let Some(t) = &tok.chat_template {
        kv.push(("tokenizer.chat_template".into(), Value::String(t.clone())));
    }
    Ok(kv)
}

/// The tokenizer of an HF checkpoint directory (`tokenizer.json`, with `tokenizer_config.json`'s
/// special tokens and chat template, or `chat_template.jinja`), as the export takes it. Whether
/// it adds BOS / EOS is read from what its post-processor does.
pub fn hf_tokenizer(dir: &Path) -> Result<GgufTokenizer> {
    let file = dir.join("tokenizer.json");
    let json = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let config_path = dir.join("tokenizer_config.json");
    let config = std::fs::read_to_string(&config_path).ok();
    let jinja = dir.join("chat_template.jinja");
    let jinja = match jinja.is_file() {
        true => Some(std::fs::read_to_string(&jinja).with_context(|| format!("reading {}", jinja.display()))?),
        false => None,
    };
    hf_tokenizer_from(&json, config.as_deref(), jinja, &file, &config_path)
}

/// [`hf_tokenizer`] of the files' texts (`tokenizer.json`, `tokenizer_config.json` when there
/// is one, `chat_template.jinja` when there is one): what a trainer holds before it saves them.
/// `file` and `config_path` name them in errors.
pub fn hf_tokenizer_from(json: &str, config: Option<&str>, jinja: Option<String>, file: &Path, config_path: &Path) -> Result<GgufTokenizer> {
    let tokenizer: Tokenizer =
        json.parse().map_err(|e| anyhow::anyhow!("{}: not a tokenizer.json ({e})", file.display()))?;
    let config: Json = match config {
        Some(text) => serde_json::from_str(text).with_context(|| format!("{}: not JSON", config_path.display()))?,
        None => Json::Null,
    };
    let special = |name: &str| -> Result<Option<SpecialToken>> {
        let v = &config[name];
        let Some(content) = v.as_str().or_else(|| v["content"].as_str()) else { return Ok(None) };
        match tokenizer.token_to_id(content) {
            Some(id) => Ok(Some(SpecialToken { id, content: content.to_string() })),
            None => bail!("{}: {name} {content:?} is not a token of {}", config_path.display(), file.display()),
        }
    };
    let (bos, eos) = (special("bos_token")?, special("eos_token")?);
    let ids = |with: bool| tokenizer.encode("a", with).map(|e| e.get_ids().to_vec()).map_err(anyhow::Error::msg);
    let (plain, with) = (ids(false)?, ids(true)?);
    let added = |t: &Option<SpecialToken>, at: Option<&u32>| {
        with.len() > plain.len() && t.as_ref().map(|t| t.id) == at.copied()
    };
    let specials = SpecialTokens {
        add_bos: added(&bos, with.first()),
        add_eos: added(&eos, with.last()),
        bos,
        eos,
        pad: special("pad_token")?,
        unk: special("unk_token")?,
    };
    let chat_template = config["chat_template"].as_str().map(str::to_string).or(jinja);
    Ok(GgufTokenizer { tokenizer, specials, chat_template })
}
