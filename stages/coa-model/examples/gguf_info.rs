//! What a GGUF file holds, as this crate reads it: the HF config.json it maps to, the special
//! tokens, the tensor table, and optionally the tokenizer as a `tokenizer.json`.
//!
//! ```text
//! cargo run -p coa-model --example gguf_info -- model.gguf [--tokenizer-json out.json]
//! ```

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use coa_model::gguf::{self, GgufFile};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut path, mut json_out) = (None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--tokenizer-json" => json_out = Some(PathBuf::from(args.next().context("--tokenizer-json needs a path")?)),
            _ if path.is_none() => path = Some(PathBuf::from(a)),
            other => bail!("unexpected argument {other:?} (usage: gguf_info FILE.gguf [--tokenizer-json OUT.json])"),
        }
    }
    let path = path.context("usage: gguf_info FILE.gguf [--tokenizer-json OUT.json]")?;
    let file = GgufFile::open(&path)?;
    println!(
        "GGUF v{}, {} metadata keys, {} tensors, alignment {}",
        file.version,
        file.metadata.len(),
        file.tensors.len(),
        file.alignment
    );
    println!("{}", serde_json::to_string_pretty(&gguf::model_config(&file)?.to_json())?);
    let tok = gguf::tokenizer::from_gguf(&file)?;
    println!("specials: {:?}", tok.specials);
    println!("chat template: {} chars", tok.chat_template.as_ref().map_or(0, String::len));
    let mut types = std::collections::BTreeMap::new();
    for t in &file.tensors {
        *types.entry(t.ggml_type.to_string()).or_insert(0) += 1;
    }
    println!("tensor types: {types:?}");
    if let Some(out) = json_out {
        tok.tokenizer.save(&out, false).map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
        println!("wrote {}", out.display());
    }
    Ok(())
}
