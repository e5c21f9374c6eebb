//! The GGUF import against HF transformers loading the same file, on the references that
//! tests/parity/make_gguf_fixtures.py wrote into tests/parity/fixtures/gguf/:
//!
//! - `tiny_llama.gguf`, `tiny_qwen2.gguf` (committed): tiny random models with tensors in F32,
//!   F16, BF16, Q8_0, Q4_0 and Q4_1, llama q/k rows permuted as llama.cpp does, small byte-level
//!   vocabularies; `tiny_llama_kq.gguf`: rows of 256 in Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1.
//! - `quant_blocks.gguf` (committed): random blocks of every quantized type with gguf-py's
//!   dequantization of each, compared bit for bit.
//! - SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, fetched by `make model` into .cache/models/, or
//!   `COA_SMOLLM2_GGUF`): the pretrained model; its tests skip with a line naming `make model`
//!   when the file is absent.
//! - gemma-3-270m-q4_k_m.gguf (242 MB, `make model-gemma3`, or `COA_GEMMA3_GGUF`): a real Q4_K_M
//!   file; every tensor's dequantization against digests of gguf-py's (an architecture we do not
//!   run, so values only); skips with a line naming `make model-gemma3` when absent.
//!
//! Checked per file: the config fields HF derives; the tokenizer.json HF derives (every field;
//! vocabulary and merges by SHA-256); the ids of tricky texts, exactly; logits of a few prompts
//! at several positions (relative error max|a − b| / max|b| over a fixed subset of vocabulary
//! columns, each row's log-sum-exp, and that HF's argmax is ours up to the tolerance).

use std::path::{Path, PathBuf};

use coa_model::gguf::{self, GgufCheckpoint, GgufTokenizer};
use coa_model::{KvCache, Seq};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/fixtures/gguf")
}

/// Where `make model` puts SmolLM2 (or `COA_SMOLLM2_GGUF`).
fn smollm2_path() -> PathBuf {
    match std::env::var_os("COA_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

/// Where `make model-gemma3` puts the Gemma 3 Q4_K_M file (or `COA_GEMMA3_GGUF`).
fn gemma3_path() -> PathBuf {
    match std::env::var_os("COA_GEMMA3_GGUF") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models/gemma-3-270m-q4_k_m.gguf"),
    }
}

fn reference(name: &str) -> Value {
    let path = fixtures().join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn sha256_lines(lines: impl Iterator<Item = String>) -> String {
    let mut h = Sha256::new();
    for l in lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Our tokenizer.json with model.vocab / model.merges replaced by digests, as the script does
/// (and the added tokens too, when the reference has them so).
fn tokenizer_summary(tok: &GgufTokenizer, want: &Value) -> Value {
    let mut j: Value = serde_json::from_str(&tok.tokenizer.to_string(false).unwrap()).unwrap();
    if want["json"]["added_tokens"].is_object() {
        let flag = |a: &Value, k: &str| if a[k].as_bool().unwrap() { "1" } else { "0" };
        let lines: Vec<String> = j["added_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let mut fields = vec![a["id"].to_string(), a["content"].as_str().unwrap().to_string()];
                fields.extend(["special", "normalized", "lstrip", "rstrip", "single_word"].map(|k| flag(a, k).to_string()));
                fields.join("\t")
            })
            .collect();
        j["added_tokens"] = serde_json::json!({"entries": lines.len(), "sha256": sha256_lines(lines.into_iter())});
    }
    let model = j["model"].as_object_mut().unwrap();
    let mut vocab: Vec<(u64, String)> =
        model["vocab"].as_object().unwrap().iter().map(|(t, i)| (i.as_u64().unwrap(), t.clone())).collect();
    vocab.sort();
    let merges: Vec<String> = model["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect::<Vec<_>>().join(" "))
        .collect();
    model.insert(
        "vocab".into(),
        serde_json::json!({"entries": vocab.len(), "sha256": sha256_lines(vocab.iter().map(|(i, t)| format!("{i}\t{t}")))}),
    );
    model.insert(
        "merges".into(),
        serde_json::json!({"entries": merges.len(), "sha256": sha256_lines(merges.iter().cloned())}),
    );
    j
}

fn check_config(ckpt: &GgufCheckpoint, want: &Value) {
    let c = &ckpt.model.config;
    let ours = c.to_json();
    for (k, v) in want.as_object().unwrap() {
        let got = match k.as_str() {
            "rope_theta" => Value::from(c.rope_theta),
            // HF writes head_dim even where it is hidden / heads; ours may leave it implicit.
            "head_dim" => Value::from(c.head_dim()),
            _ => ours.get(k).cloned().unwrap_or(Value::Null),
        };
        assert_eq!(&got, v, "config field {k}");
    }
}

fn check_tokenizer(ours: &GgufTokenizer, want: &Value) {
    let tok = &want["tokenizer"];
    let summary = tokenizer_summary(ours, tok);
    for (k, v) in tok["json"].as_object().unwrap() {
        assert_eq!(&summary[k], v, "tokenizer.json field {k}");
    }
    assert_eq!(ours.chat_template.as_deref(), tok["chat_template"].as_str(), "chat template");
    let specials = &ours.specials;
    for (name, s) in [("bos_token", &specials.bos), ("eos_token", &specials.eos), ("pad_token", &specials.pad)] {
        assert_eq!(s.as_ref().map(|s| s.content.as_str()), tok["special_tokens"][name].as_str(), "{name}");
    }
    let mut n = 0;
    for t in want["texts"].as_array().unwrap() {
        let text = t["text"].as_str().unwrap();
        let enc = ours.tokenizer.encode(text, true).unwrap();
        let want_ids: Vec<u32> = t["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(enc.get_ids(), &want_ids[..], "ids of {text:?}");
        n += 1;
    }
    assert!(n >= 10, "only {n} texts");
}

/// Logits of every prompt; returns the largest relative error seen.
fn check_logits(ckpt: &GgufCheckpoint, want: &Value, tol: f64) -> f64 {
    let v = ckpt.model.config.vocab_size;
    let columns: Vec<usize> =
        want["columns"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let mut worst = 0f64;
    for p in want["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let ids: Vec<u32> = p["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let enc = ckpt.tokenizer.tokenizer.encode(p["text"].as_str().unwrap(), true).unwrap();
        assert_eq!(enc.get_ids(), &ids[..], "prompt {name}: ids");
        let logits = ckpt.model.logits(&Seq::new(&ids)).unwrap();
        let (mut num, mut den) = (0f64, 0f64);
        for (r, pos) in p["positions"].as_array().unwrap().iter().enumerate() {
            let row = &logits[pos.as_u64().unwrap() as usize * v..][..v];
            for (c, &col) in columns.iter().enumerate() {
                let b = p["logits"][r][c].as_f64().unwrap();
                num = num.max((row[col] as f64 - b).abs());
                den = den.max(b.abs());
            }
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            let want_lse = p["logsumexp"][r].as_f64().unwrap();
            assert!(
                (lse - want_lse).abs() <= tol * want_lse.abs().max(1.0),
                "prompt {name} position {pos}: logsumexp {lse} vs HF {want_lse}"
            );
            let hf_argmax = p["argmax"][r].as_u64().unwrap() as usize;
            assert!(
                row[hf_argmax] as f64 >= max - tol * max.abs().max(1.0),
                "prompt {name} position {pos}: HF's argmax {hf_argmax} has logit {} here, ours peaks at {max}",
                row[hf_argmax]
            );
        }
        let rel = num / den;
        eprintln!("{}: prompt {name} ({} tokens): logits rel err {rel:.2e}", want["file"].as_str().unwrap(), ids.len());
        assert!(rel < tol, "prompt {name}: logits rel err {rel:.3e} >= {tol:.0e}");
        worst = worst.max(rel);
    }
    worst
}

fn check_tiny(name: &str) {
    let want = reference(name);
    let ckpt = gguf::load(&fixtures().join(format!("{name}.gguf"))).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    check_config(&ckpt, &want["config"]);
    // The compact references (same vocabulary as tiny_llama) carry no tokenizer part.
    if want.get("tokenizer").is_some() {
        check_tokenizer(&ckpt.tokenizer, &want);
    }
    // Both sides dequantize to the same f32 values: only the f32 forward differs.
    check_logits(&ckpt, &want, 1e-5);
}

#[test]
fn tiny_llama_matches_hf() {
    check_tiny("tiny_llama");
}

#[test]
fn tiny_qwen2_matches_hf() {
    check_tiny("tiny_qwen2");
}

/// A SentencePiece vocabulary (`tokenizer.ggml.model` "llama", as Llama 2 and Mistral files): the
/// tokenizer.json transformers derives (merges rebuilt from the scores, byte fallback, Metaspace,
/// BOS added by default, control and user-defined tokens), token ids of the tricky texts, logits.
#[test]
fn tiny_llama_spm_matches_hf() {
    check_tiny("tiny_llama_spm");
}

/// Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 weights (every type feeds the logits), tied Q6_K embeddings.
#[test]
fn tiny_llama_kq_matches_hf() {
    let f = gguf::GgufFile::open(&fixtures().join("tiny_llama_kq.gguf")).unwrap();
    for ty in ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"] {
        assert!(f.tensors.iter().any(|t| t.ggml_type.name() == Some(ty)), "no {ty} tensor in the fixture");
    }
    check_tiny("tiny_llama_kq");
}

/// A Llama 3.1-style file: `rope_freqs.weight` applied as llama.cpp does, against the HF model
/// with `rope_parameters` llama3 it was converted from (transformers' GGUF loader drops the
/// tensor: `hf_gguf_rel_err` records how far that plain-RoPE model is). The config gets the
/// factors and the llama3 parameters fitted to them (the fixture's own), and a checkpoint saved
/// from it computes the same logits.
#[test]
fn tiny_llama31_rope_freqs_match_hf() {
    check_tiny("tiny_llama31");
    let want = reference("tiny_llama31");
    let plain_err = want["hf_gguf_rel_err"].as_f64().unwrap();
    assert!(plain_err > 1e-2, "the factors should matter: plain RoPE is only {plain_err:e} away");
    let ckpt = gguf::load(&fixtures().join("tiny_llama31.gguf")).unwrap();
    let c = &ckpt.model.config;
    assert_eq!(c.rope_freq_factors().unwrap().map(|f| f.len()), Some(4));
    let fitted = c.rope_scaling().unwrap().expect("llama3 parameters fitted to the factors");
    assert_eq!(
        (fitted.factor, fitted.low_freq_factor, fitted.high_freq_factor, fitted.original_max_position_embeddings),
        (8.0, 1.0, 4.0, 64.0)
    );
    let dir = tempfile::tempdir().unwrap();
    ckpt.model.save(dir.path(), coa_model::SaveDtype::F32).unwrap();
    let ids: Vec<u32> = want["prompts"][1]["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let reloaded = coa_model::Model::load(dir.path()).unwrap();
    assert_eq!(reloaded.logits(&Seq::new(&ids)).unwrap(), ckpt.model.logits(&Seq::new(&ids)).unwrap());
}

/// Random blocks of every quantized type (all bits of every field in play) dequantize to
/// exactly the f32 values gguf-py's `dequantize` gave (`<TYPE>.want`).
#[test]
fn quant_blocks_match_gguf_py_bit_for_bit() {
    let f = gguf::GgufFile::open(&fixtures().join("quant_blocks.gguf")).unwrap();
    let mut types = Vec::new();
    for t in f.tensors.iter().filter(|t| !t.name.ends_with(".want")) {
        let want_info = f.tensor(&format!("{}.want", t.name)).unwrap_or_else(|| panic!("no {}.want", t.name));
        let ours = f.tensor_f32(t).unwrap();
        let want = f.tensor_f32(want_info).unwrap();
        assert_eq!(ours.len(), want.len(), "{}", t.name);
        for (i, (a, b)) in ours.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{} value {i}: ours {a:e}, gguf-py {b:e}", t.name);
        }
        types.push(t.ggml_type.name().unwrap());
        eprintln!("{}: {} values identical to gguf-py's", t.name, ours.len());
    }
    assert_eq!(types, ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]);
}

/// The tiny llama vocabulary has no `<|endoftext|>`: HF still adds it (GPT2Tokenizer's default
/// special token) with the next id, and so do we.
#[test]
fn tiny_llama_gets_hfs_extra_endoftext() {
    let tok = gguf::load_tokenizer(&fixtures().join("tiny_llama.gguf")).unwrap();
    let ckpt_vocab = reference("tiny_llama")["config"]["vocab_size"].as_u64().unwrap() as u32;
    assert_eq!(tok.tokenizer.token_to_id("<|endoftext|>"), Some(ckpt_vocab));
    // USER_DEFINED tokens are whole but not special: decode(skip_special_tokens) keeps them.
    let ids = tok.tokenizer.encode("<think>x</think>", false).unwrap().get_ids().to_vec();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(tok.tokenizer.decode(&ids, true).unwrap(), "<think>x</think>");
    let bos = tok.specials.bos.as_ref().unwrap();
    assert!(tok.specials.add_bos);
    assert_eq!(tok.tokenizer.encode("x", true).unwrap().get_ids()[0], bos.id);
}

/// The pretrained SmolLM2-135M-Instruct (Q4_1) against HF: config, tokenizer, logits within
/// 1e-4 relative, and the greedy answer to the chat prompt token for token.
#[test]
fn smollm2_matches_hf() {
    let path = smollm2_path();
    if !path.exists() {
        eprintln!("SKIP smollm2_matches_hf: {} not found; run `make model` to fetch it", path.display());
        return;
    }
    let want = reference("smollm2");
    let t0 = std::time::Instant::now();
    let ckpt = gguf::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("loaded {} in {:.1} s", path.display(), t0.elapsed().as_secs_f64());

    // What the issue states about the model.
    let c = &ckpt.model.config;
    assert_eq!(c.model_type, "llama");
    assert_eq!(
        (
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim(),
            c.intermediate_size
        ),
        (30, 576, 9, 3, 64, 1536)
    );
    assert!(c.tie_word_embeddings);
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.rope_theta, 1e5);
    let template = ckpt.tokenizer.chat_template.as_deref().unwrap();
    assert!(template.contains("<|im_start|>") && template.contains("<|im_end|>"), "not a ChatML template: {template}");
    check_config(&ckpt, &want["config"]);
    check_tokenizer(&ckpt.tokenizer, &want);
    check_logits(&ckpt, &want, 1e-4);

    // Greedy decoding of the chat prompt, as HF generate(do_sample=False) did.
    let greedy = &want["greedy"];
    let prompt = want["prompts"].as_array().unwrap().iter().find(|p| p["name"] == greedy["prompt"]).unwrap();
    let ids: Vec<u32> = prompt["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let want_gen: Vec<u32> = greedy["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let m = &ckpt.model;
    let mut cache = KvCache::new(&m.config, 1, ids.len() + want_gen.len()).unwrap();
    let mut logits = m.prefill(&mut cache, 0, &ids).unwrap();
    let mut gen = Vec::new();
    for _ in 0..want_gen.len() {
        let next =
            logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |a, (i, &x)| if x > a.1 { (i, x) } else { a }).0
                as u32;
        gen.push(next);
        logits = m.decode_step(&mut cache, &[0], &[next]).unwrap();
    }
    let text = ckpt.tokenizer.tokenizer.decode(&gen, false).unwrap();
    eprintln!("greedy answer: {text:?}");
    assert_eq!(gen, want_gen, "greedy continuation: ours {text:?} vs HF {:?}", greedy["text"]);
    assert!(text.contains("17 * 23"), "{text:?}");
}

/// The script's digest of a tensor: sum over i of bits_i * (2 i + 1) mod 2^64, bits_i the f32
/// bit pattern of value i.
fn position_digest(values: &[f32]) -> u64 {
    values.iter().enumerate().fold(0u64, |acc, (i, x)| {
        acc.wrapping_add(u64::from(x.to_bits()).wrapping_mul(2 * i as u64 + 1))
    })
}

/// Gemma 3 270M in Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0 and F32 tensors, 268M values): every tensor
/// dequantizes to gguf-py's values (digest of all of them, and sampled values bit for bit). The
/// architecture itself is refused for inference, by name.
#[test]
fn gemma3_q4_k_m_dequantizes_as_gguf_py() {
    use rayon::prelude::*;
    let path = gemma3_path();
    if !path.exists() {
        eprintln!(
            "skipped: gemma3_q4_k_m_dequantizes_as_gguf_py: {} not found; run `make model-gemma3` to fetch it",
            path.display()
        );
        return;
    }
    let want = reference("gemma3_270m_q4_k_m");
    let f = gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{e:#}"));
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), f.tensors.len(), "tensor count");
    let t0 = std::time::Instant::now();
    let checked: Vec<&str> = tensors
        .par_iter()
        .map(|w| {
            let name = w["name"].as_str().unwrap();
            let t = f.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
            let ty = t.ggml_type.name().unwrap();
            assert_eq!(ty, w["type"].as_str().unwrap(), "{name}: type");
            let dims: Vec<u64> = w["dims"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            assert_eq!(t.dims, dims, "{name}: dims");
            let values = f.tensor_f32(t).unwrap_or_else(|e| panic!("{e:#}"));
            for s in w["samples"].as_array().unwrap() {
                let (i, v) = (s[0].as_u64().unwrap() as usize, s[1].as_f64().unwrap() as f32);
                assert_eq!(values[i].to_bits(), v.to_bits(), "{name} ({ty}) value {i}: ours {}, gguf-py {v}", values[i]);
            }
            let digest: u64 = w["digest"].as_str().unwrap().parse().unwrap();
            assert_eq!(position_digest(&values), digest, "{name} ({ty}): digest of its {} values", values.len());
            ty
        })
        .collect();
    let mut count = std::collections::BTreeMap::new();
    checked.iter().for_each(|ty| *count.entry(*ty).or_insert(0) += 1);
    eprintln!(
        "{}: {} tensors dequantized as gguf-py does ({count:?}) in {:.1} s",
        path.display(),
        checked.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(count.contains_key("Q4_K") && count.contains_key("Q6_K"), "{count:?}");
    let e = format!("{:#}", gguf::load_model(&f).err().expect("gemma3 is not an architecture we run"));
    assert!(e.contains("\"gemma3\"") && e.contains("general.architecture"), "{e}");
    // Its SentencePiece vocabulary (262144 tokens, merges rebuilt from the token order, runs of
    // spaces respelled, 6k added tokens), as transformers builds it.
    let t0 = std::time::Instant::now();
    let tok = gguf::load_tokenizer(&path).unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("Gemma 3 tokenizer built in {:.1} s", t0.elapsed().as_secs_f64());
    check_tokenizer(&tok, &want);
}
