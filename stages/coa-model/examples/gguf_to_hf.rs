//! Writes the model of a GGUF file as an HF checkpoint directory (config.json, f32
//! model.safetensors, generation_config.json): what `make bench-decode` hands HF transformers,
//! which reads GGUF files only with `accelerate` installed.
//!
//!     cargo run --release -p coa-model --example gguf_to_hf -- model.gguf OUT_DIR

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use coa_model::{Model, SaveDtype};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [gguf, out] = args.as_slice() else {
        bail!("usage: gguf_to_hf FILE.gguf OUT_DIR");
    };
    let m = Model::load(&PathBuf::from(gguf)).with_context(|| format!("reading {gguf}"))?;
    m.save(&PathBuf::from(out), SaveDtype::F32).with_context(|| format!("writing {out}"))?;
    eprintln!("{out}: {} parameters from {gguf}", m.params.iter().map(|t| t.data.len()).sum::<usize>());
    Ok(())
}
