//! Writes a checkpoint (an HF directory as `coa-train-step --save` leaves it, or a `.gguf`) as a
//! GGUF file llama.cpp, Ollama and LM Studio load, with its tokenizer and chat template: the
//! inverse of `gguf_to_hf` (see `coa_model::gguf::export`).
//!
//!     cargo run --release -p coa-model --example hf_to_gguf -- CHECKPOINT OUT.gguf \
//!         [--dtype F16|BF16|Q8_0|F32] [--tokenizer DIR]
//!
//! The tokenizer is the checkpoint's own (`tokenizer.json` + `tokenizer_config.json` beside the
//! weights, or the GGUF's) unless `--tokenizer DIR` names another directory. Default dtype F16.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use coa_model::gguf::{self, GgufDtype};
use coa_model::Model;

const USAGE: &str = "usage: hf_to_gguf CHECKPOINT OUT.gguf [--dtype F16|BF16|Q8_0|F32] [--tokenizer DIR]";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut positional, mut dtype, mut tokenizer) = (Vec::new(), GgufDtype::F16, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dtype" => dtype = args.next().context(USAGE)?.parse()?,
            "--tokenizer" => tokenizer = Some(PathBuf::from(args.next().context(USAGE)?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ if a.starts_with('-') => bail!("unknown flag {a}\n{USAGE}"),
            _ => positional.push(PathBuf::from(a)),
        }
    }
    let [ckpt, out] = positional.as_slice() else { bail!(USAGE) };
    let model = Model::load(ckpt).with_context(|| format!("reading checkpoint {}", ckpt.display()))?;
    let tok_src = tokenizer.as_ref().unwrap_or(ckpt);
    let tok = if gguf::is_gguf(tok_src) { gguf::load_tokenizer(tok_src) } else { gguf::hf_tokenizer(tok_src) }
        .with_context(|| format!("reading the tokenizer of {}", tok_src.display()))?;
    gguf::save(&model, &tok, out, dtype)
        .with_context(|| format!("exporting {} with the tokenizer of {}", ckpt.display(), tok_src.display()))?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "{}: {dtype}, {} parameters, {} tokens, {:.1} MB, from {}",
        out.display(),
        model.params.iter().map(|t| t.data.len()).sum::<usize>(),
        model.config.vocab_size,
        bytes as f64 / 1e6,
        ckpt.display()
    );
    Ok(())
}
