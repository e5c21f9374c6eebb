//! Writes checkpoints for the on-demand HF load check:
//!
//!     cargo run -p coa-model --example hf_check_export -- OUT_DIR
//!     python3 tests/parity/make_fixtures.py --check-load OUT_DIR/*
//!
//! Each OUT_DIR/<case>/ holds a checkpoint saved by `Model::save` plus parity_logits.safetensors
//! (the input ids and the logits our model computes from the saved weights), which the script
//! compares with the logits of HF's AutoModelForCausalLM loaded from the same directory.

use std::path::PathBuf;

use anyhow::{Context, Result};
use coa_model::{Model, ModelConfig, SaveDtype, Seq, TokenIds};

fn main() -> Result<()> {
    let out = PathBuf::from(std::env::args().nth(1).context("usage: hf_check_export OUT_DIR")?);
    // (name, model_type, tied, attention_bias, dtype, sliding window: on layers 2.. for the Qwens,
    // every layer for Mistral; 40 input ids, so the windows cut)
    type Case = (&'static str, &'static str, bool, bool, SaveDtype, Option<usize>);
    let cases: Vec<Case> = vec![
        ("llama_tied_f32", "llama", true, false, SaveDtype::F32, None),
        ("llama_tied_bf16", "llama", true, false, SaveDtype::Bf16, None),
        ("llama_untied_bias_f32", "llama", false, true, SaveDtype::F32, None),
        ("qwen2_untied_f32", "qwen2", false, false, SaveDtype::F32, None),
        ("qwen2_tied_bf16", "qwen2", true, false, SaveDtype::Bf16, None),
        ("qwen2_window_f32", "qwen2", false, false, SaveDtype::F32, Some(11)),
        ("qwen3_untied_bias_window_f32", "qwen3", false, true, SaveDtype::F32, Some(7)),
        ("qwen3_tied_bf16", "qwen3", true, false, SaveDtype::Bf16, None),
        ("mistral_window_f32", "mistral", false, false, SaveDtype::F32, Some(9)),
    ];
    for (name, mt, tied, bias, dtype, window) in cases {
        let mut c = ModelConfig::preset("tiny", 300)?;
        c.model_type = mt.to_string();
        c.architectures.clear();
        c.tie_word_embeddings = tied;
        c.attention_bias = bias;
        c.bos_token_id = Some(1);
        c.eos_token_id = Some(TokenIds::One(2));
        c.extra.insert("sliding_window".into(), window.into());
        if window.is_some() && mt != "mistral" {
            c.extra.insert("use_sliding_window".into(), true.into());
            c.extra.insert("max_window_layers".into(), 2.into());
        }
        let mut m = Model::init(c, 42)?;
        // Perturb everything (biases and norms included) so each code path matters.
        for t in m.params.iter_mut() {
            let n = t.data.len();
            for (i, x) in t.data.iter_mut().enumerate() {
                *x += 0.1 * ((((i * 2654435761) ^ n) % 1000) as f32 / 500.0 - 1.0);
            }
        }
        let dir = out.join(name);
        m.save(&dir, dtype)?;
        let back = Model::load(&dir)?;
        let ids: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 300).collect();
        let logits = back.logits(&Seq::new(&ids))?;
        let ids_f: Vec<u8> = ids.iter().flat_map(|&i| (i as f32).to_le_bytes()).collect();
        let lg: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        let views = vec![
            ("input_ids", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![ids.len()], &ids_f)?),
            ("logits", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![ids.len(), 300], &lg)?),
        ];
        std::fs::write(dir.join("parity_logits.safetensors"), safetensors::tensor::serialize(views, None)?)?;
        eprintln!("wrote {}", dir.display());
    }
    Ok(())
}
