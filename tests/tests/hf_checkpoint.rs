//! A checkpoint we save, loaded by HF transformers as verl, vLLM and TRL users load it.
//!
//! The real pipeline on a few math tasks (teacher -> extract -> filter -> convert), tokenized with
//! SmolLM2-135M-Instruct's GGUF tokenizer (ChatML template, the 22 CoA tags added), one SFT step
//! from the GGUF (the vocabulary grows), saved; then tests/hf/check_checkpoint.py asserts in
//! transformers: special ids in tokenizer/config/generation config, `apply_chat_template` = our
//! prompt ids, tags single ids kept by `decode(skip_special_tokens=True)`, a CoA text round trip,
//! `tokenizer.pad`, and (with PyTorch) greedy `generate` stopping at EOS.
//!
//! The same checks on a checkpoint whose tokenizer was trained here (`--train-bpe`) and whose
//! model starts from scratch (`--init-config tiny`).
//!
//! Needs the GGUF (`make model`; the first test only) and a Python with transformers (`make
//! hf-venv`: .venv-hf, no PyTorch; .venv-torch or `COA_HF_PYTHON` for the generate check); skips
//! with a line otherwise.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use polars::prelude::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let b = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(b.exists(), "{name} is missing: run `make test` (it builds the stage binaries first)");
    b
}

/// A Python that imports transformers: `COA_HF_PYTHON`, else .venv-torch (generates too), else .venv-hf.
fn hf_python() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("COA_HF_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec![repo().join(".venv-torch/bin/python"), repo().join(".venv-hf/bin/python")],
    };
    candidates.into_iter().find(|p| {
        p.exists() && Command::new(p).args(["-c", "import transformers"]).output().is_ok_and(|o| o.status.success())
    })
}

fn smollm2() -> PathBuf {
    match std::env::var_os("COA_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => repo().join(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

fn sh(dir: &Path, script: &str) {
    let path = format!("{}:{}", bin("coa-generate").parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash").args(["-c", &format!("set -euo pipefail\n{script}")]).current_dir(dir).env("PATH", path).output().unwrap();
    assert!(out.status.success(), "{script}\n{}", String::from_utf8_lossy(&out.stderr));
}

fn column_str(df: &DataFrame, name: &str) -> String {
    df.column(name).unwrap().str().unwrap().get(0).unwrap().to_string()
}

/// Runs `script` (the pipeline up to a checkpoint saved in `ck`, its CoA text in
/// `coa_text.parquet` and tokens in `tokens.parquet`) in a fresh folder, then checks the
/// checkpoint in transformers with tests/hf/check_checkpoint.py.
fn check_in_transformers(python: &Path, script: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    sh(d, script);
    // The first row: its prompt split as the template's turns, and the ids coa-tokenize laid out
    // before the first target token.
    let text = ParquetReader::new(File::open(d.join("coa_text.parquet")).unwrap()).finish().unwrap();
    let tokens = ParquetReader::new(File::open(d.join("tokens.parquet")).unwrap()).finish().unwrap();
    let ids: Vec<i64> = tokens.column("input_ids").unwrap().list().unwrap().get_as_series(0).unwrap().cast(&DataType::Int64).unwrap().i64().unwrap().into_no_null_iter().collect();
    let mask: Vec<i64> = tokens.column("loss_mask").unwrap().list().unwrap().get_as_series(0).unwrap().cast(&DataType::Int64).unwrap().i64().unwrap().into_no_null_iter().collect();
    let prefix_len = mask.iter().position(|&m| m == 1).unwrap();
    let prompt = column_str(&text, "prompt");
    let (system, question) = prompt.split_once("\n\nQuestion: ").unwrap();
    let tags = ["<think>", "</think>", "<plan>", "</plan>", "<reflection>", "</reflection>", "<code>", "</code>", "<observation>", "</observation>", "<answer>", "</answer>"];
    let case = serde_json::json!({
        "system": system, "question": question, "prefix_ids": &ids[..prefix_len],
        "coa_text": column_str(&text, "text"), "tags": tags,
    });
    std::fs::write(d.join("case.json"), case.to_string()).unwrap();
    let out = Command::new(python)
        .arg(repo().join("tests/hf/check_checkpoint.py"))
        .args([d.join("ck"), d.join("case.json")])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("apply_chat_template: the") && stdout.contains("round-trips"), "{stdout}");
}

/// The distilled CoA text of a few math tasks, as every checkpoint below is trained on.
const COA_TEXT: &str = "coa-generate tasks --suite math --n 12 --seed 4 | coa-generate mas --seed 4 | coa-extract | coa-filter \
     | coa-convert -o coa_text.parquet";

#[test]
fn transformers_loads_a_saved_checkpoint_unchanged() {
    let gguf = smollm2();
    if !gguf.exists() {
        eprintln!("skipped: no {} (run `make model`)", gguf.display());
        return;
    }
    let Some(python) = hf_python() else {
        eprintln!("skipped: no Python with transformers (run `make hf-venv`, or set COA_HF_PYTHON)");
        return;
    };
    let g = gguf.display();
    check_in_transformers(
        &python,
        &format!(
            "{COA_TEXT}\n\
             coa-tokenize --tokenizer {g} -i coa_text.parquet -o tokens.parquet --save-tokenizer tok/tokenizer.json\n\
             coa-train-step -i tokens.parquet --init {g} --tokenizer tok --steps 1 --lr 1e-7 --batch-tokens 1024 --save ck -o metrics.parquet"
        ),
    );
}

/// A byte-level BPE trained here (`--train-bpe`, the smoke and full sizes' tokenizer) and a model
/// from scratch: the tokenizer's split patterns must be ones HF tokenizers' Oniguruma accepts.
#[test]
fn transformers_loads_a_train_bpe_checkpoint_unchanged() {
    let Some(python) = hf_python() else {
        eprintln!("skipped: no Python with transformers (run `make hf-venv`, or set COA_HF_PYTHON)");
        return;
    };
    check_in_transformers(
        &python,
        &format!(
            "{COA_TEXT}\n\
             coa-tokenize --train-bpe --vocab-size 400 -i coa_text.parquet -o tokens.parquet --save-tokenizer tok/tokenizer.json\n\
             coa-train-step -i tokens.parquet --init-config tiny --tokenizer tok --steps 1 --batch-tokens 8192 --save ck -o metrics.parquet"
        ),
    );
}
