//! The GGUF export (`coa_model::gguf::save`) on the committed tiny GGUF fixtures (random llama with
//! permuted q/k and qwen2, each with a real byte-level vocabulary, control and user-defined tokens;
//! qwen2 with a ChatML template and a pad token):
//!
//! - read back by our reader: F32 gives the same parameters and logits bit for bit, F16 / BF16 /
//!   Q8_0 the dequantization of exactly what was encoded, logits within each dtype's precision;
//!   the config, the tokenizer (tokenizer.json, special tokens, chat template) and the
//!   `tokenizer.ggml.*` arrays identical to the source file's;
//! - read by gguf-py (0.19, the reader llama.cpp's tools use): tensor names, dims, types,
//!   metadata, and every F16 / BF16 / Q8_0 tensor byte for byte what gguf-py's own `quantize`
//!   makes of the F32 export's values. Needs a Python with `gguf` (COA_GGUF_PYTHON, else
//!   .venv-gguf, .venv-hf, .venv-torch); skips with a line saying so otherwise.
//! - an HF checkpoint directory (config, safetensors, tokenizer.json, tokenizer_config.json) as
//!   `examples/hf_to_gguf` reads it; bad inputs refused with the file and what was expected.

use std::path::{Path, PathBuf};
use std::process::Command;

use coa_model::gguf::{self, GgufCheckpoint, GgufDtype, GgufFile, Value};
use coa_model::{Model, Seq};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/fixtures/gguf").join(name)
}

fn load(path: &Path) -> GgufCheckpoint {
    gguf::load(path).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Prompt ids every fixture vocabulary holds.
const IDS: [u32; 12] = [1, 5, 9, 40, 41, 7, 3, 60, 2, 11, 70, 4];

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    num / b.iter().fold(0f64, |m, y| m.max(y.abs() as f64))
}

/// A token in GPT-2's byte alphabet: as it is when it is spelled in it, else byte by byte.
fn byte_level(token: &Value) -> Value {
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::PreTokenizer;
    let t = token.as_str().unwrap();
    let alphabet = ByteLevel::alphabet();
    if t.chars().all(|c| alphabet.contains(&c)) {
        return token.clone();
    }
    let mut pre = tokenizers::PreTokenizedString::from(t);
    ByteLevel::new(false, false, false).pre_tokenize(&mut pre).unwrap();
    let pieces = pre.get_splits(tokenizers::OffsetReferential::Original, tokenizers::OffsetType::Char);
    Value::String(pieces.into_iter().map(|(s, _, _)| s).collect())
}

/// Where `make model` puts SmolLM2 (or `COA_SMOLLM2_GGUF`).
fn smollm2_path() -> PathBuf {
    match std::env::var_os("COA_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

/// The last row of logits after `ids`, and the `n` tokens greedy decoding appends.
fn greedy(m: &Model, ids: &[u32], n: usize) -> (Vec<f32>, Vec<u32>) {
    let mut seq = ids.to_vec();
    let mut first = Vec::new();
    for _ in 0..n {
        let v = m.config.vocab_size;
        let logits = m.logits(&Seq::new(&seq)).unwrap();
        let last = &logits[logits.len() - v..];
        if first.is_empty() {
            first = last.to_vec();
        }
        seq.push(last.iter().enumerate().fold((0, f32::MIN), |a, (i, &x)| if x > a.1 { (i, x) } else { a }).0 as u32);
    }
    (first, seq[ids.len()..].to_vec())
}

fn tokenizer_json(c: &GgufCheckpoint) -> String {
    c.tokenizer.tokenizer.to_string(false).unwrap()
}

#[test]
fn export_round_trips_through_our_reader_in_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny_llama", "tiny_qwen2"] {
        let src_path = fixture(&format!("{name}.gguf"));
        let src = load(&src_path);
        let src_file = GgufFile::open(&src_path).unwrap();
        let want_logits = src.model.logits(&Seq::new(&IDS)).unwrap();
        for dtype in GgufDtype::ALL {
            let out = dir.path().join(format!("{name}_{dtype}.gguf"));
            gguf::save(&src.model, &src.tokenizer, &out, dtype).unwrap_or_else(|e| panic!("{name} {dtype}: {e:#}"));
            let back = load(&out);
            assert_eq!(back.model.config.to_json(), src.model.config.to_json(), "{name} {dtype}: config");
            assert_eq!(tokenizer_json(&back), tokenizer_json(&src), "{name} {dtype}: tokenizer.json");
            assert_eq!(back.tokenizer.specials, src.tokenizer.specials, "{name} {dtype}: special tokens");
            assert_eq!(back.tokenizer.chat_template, src.tokenizer.chat_template, "{name} {dtype}: chat template");
            let f = GgufFile::open(&out).unwrap();
            // Tokens as the source file has them, except that one outside the byte alphabet
            // (a hand-made fixture's; HF and llama.cpp spell them byte by byte) is written as
            // the byte-level spelling the reader gave it.
            let want_tokens: Vec<Value> =
                src_file.get_array("tokenizer.ggml.tokens").unwrap().unwrap().iter().map(byte_level).collect();
            assert_eq!(f.get_array("tokenizer.ggml.tokens").unwrap().unwrap(), want_tokens, "{name} {dtype}: tokens");
            for key in ["tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
                assert_eq!(f.get(key), src_file.get(key), "{name} {dtype}: {key}");
            }
            assert_eq!(f.get_u64("general.file_type").unwrap(), Some(dtype.file_type() as u64));
            // The name llama.cpp knows for each split (tiny_llama: GPT-2's; tiny_qwen2: qwen2's).
            let pre = if name == "tiny_llama" { "gpt-2" } else { "qwen2" };
            assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), Some(pre), "{name}");
            // Every parameter is the dequantization of exactly what encode() made of it (for
            // llama after the q/k permutation and back), and matrices got the dtype.
            for (a, b) in back.model.params.iter().zip(src.model.params.iter()) {
                let (ty, bytes) = gguf::export::encode(&b.data, &b.shape, dtype);
                let want = gguf::dequant::to_f32(ty, &bytes).unwrap();
                assert!(
                    a.data.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{name} {dtype}: {}",
                    a.name
                );
                let info = f.tensor(&gguf::gguf_name(&a.name).unwrap()).unwrap();
                let want_ty = if b.shape.len() == 2 { dtype.ggml_type() } else { gguf::GgmlType::F32 };
                assert_eq!(info.ggml_type, want_ty, "{name} {dtype}: {}", a.name);
            }
            let logits = back.model.logits(&Seq::new(&IDS)).unwrap();
            let err = rel_err(&logits, &want_logits);
            eprintln!("{name} {dtype}: logits rel err {err:.2e} after export and reload");
            let tol = match dtype {
                GgufDtype::F32 => 0.0,
                GgufDtype::F16 => 2e-3,
                GgufDtype::Bf16 | GgufDtype::Q8_0 => 2e-2,
            };
            assert!(err <= tol, "{name} {dtype}: logits rel err {err:.3e} > {tol:.0e}");
            if dtype == GgufDtype::F32 {
                assert_eq!(back.model.params, src.model.params, "{name}: F32 parameters");
            }
        }
    }
}

/// gguf-py's rounding on values that stress it: ties (x / d = k + 0.5), a zero block, tiny and
/// huge magnitudes; checked by hand on one block.
#[test]
fn q8_0_rounds_half_away_from_zero_with_an_f16_scale() {
    let mut block = [0f32; 32];
    block[0] = 127.0; // d = 1
    block[1] = 2.5;
    block[2] = -2.5;
    block[3] = 0.49;
    block[4] = -126.5;
    let q = gguf::export::quantize_q8_0(&block);
    assert_eq!(&q[..2], &half::f16::from_f32(1.0).to_bits().to_le_bytes());
    assert_eq!(&q[2..7], &[127u8, 3, (-3i8) as u8, 0, (-127i8) as u8]);
    let zero = gguf::export::quantize_q8_0(&[0.0; 32]);
    assert!(zero.iter().all(|&b| b == 0));
    assert_eq!(gguf::dequant::to_f32(gguf::GgmlType::Q8_0, &q).unwrap()[1], 3.0);
    // Rows that are not whole blocks fall back to F16 (as llama.cpp's converter does); 1-D stays F32.
    assert_eq!(gguf::export::encode(&[0.5; 96], &[2, 48], GgufDtype::Q8_0).0, gguf::GgmlType::F16);
    assert_eq!(gguf::export::encode(&[0.5; 64], &[64], GgufDtype::Q8_0).0, gguf::GgmlType::F32);
}

/// A Python whose `import gguf` works: COA_GGUF_PYTHON, else the project's venvs.
fn gguf_python() -> Option<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates: Vec<PathBuf> = match std::env::var_os("COA_GGUF_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => [".venv-gguf", ".venv-hf", ".venv-torch"].iter().map(|v| repo.join(v).join("bin/python")).collect(),
    };
    candidates.into_iter().find(|p| {
        p.exists() && Command::new(p).args(["-c", "import gguf, numpy"]).output().is_ok_and(|o| o.status.success())
    })
}

#[test]
fn gguf_py_reads_the_export_and_quantizes_it_the_same() {
    let Some(python) = gguf_python() else {
        eprintln!(
            "skipped: gguf_py_reads_the_export_and_quantizes_it_the_same: no Python with gguf-py (set COA_GGUF_PYTHON, or `python3 -m venv .venv-gguf && .venv-gguf/bin/pip install numpy gguf==0.19.0`, or `make hf-venv`)"
        );
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/check_gguf_export.py");
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny_llama", "tiny_qwen2"] {
        let src = load(&fixture(&format!("{name}.gguf")));
        let mut files = Vec::new();
        for dtype in GgufDtype::ALL {
            let out = dir.path().join(format!("{name}.{dtype}.gguf"));
            gguf::save(&src.model, &src.tokenizer, &out, dtype).unwrap();
            files.push(out);
        }
        let run = Command::new(&python).arg(&script).args(&files).output().unwrap();
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(run.status.success(), "{name}: {}\n{stdout}", String::from_utf8_lossy(&run.stderr));
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let ours = GgufFile::open(&files[0]).unwrap();
        for (file, r) in files.iter().zip(report.as_array().unwrap()) {
            let f = GgufFile::open(file).unwrap();
            // Every tensor as we wrote it: name, ggml dims, type.
            let tensors: Vec<(String, Vec<u64>, String)> = f
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.dims.clone(), t.ggml_type.name().unwrap().to_string()))
                .collect();
            let theirs: Vec<(String, Vec<u64>, String)> = serde_json::from_value(r["tensors"].clone()).unwrap();
            assert_eq!(theirs, tensors, "{}", file.display());
            // Every metadata key, scalars by value, arrays by length and first element.
            for (k, v) in &f.metadata {
                let got = &r["metadata"][k];
                match v {
                    Value::Array(items) => {
                        assert_eq!(got["len"].as_u64(), Some(items.len() as u64), "{k}");
                        if let Some(Value::String(s)) = items.first() {
                            assert_eq!(got["first"].as_str(), Some(s.as_str()), "{k}");
                        }
                    }
                    Value::String(s) => assert_eq!(got.as_str(), Some(s.as_str()), "{k}"),
                    Value::Bool(b) => assert_eq!(got.as_bool(), Some(*b), "{k}"),
                    Value::F32(x) => assert_eq!(got.as_f64(), Some(*x as f64), "{k}"),
                    other => assert_eq!(got.as_u64(), other.as_u64(), "{k}"),
                }
            }
            assert_eq!(
                r["metadata"].as_object().unwrap().len(),
                f.metadata.len() + 3,
                "{} (gguf-py adds GGUF.*)",
                file.display()
            );
            let same = r["quantized_like_gguf_py"].as_u64().unwrap();
            eprintln!(
                "{}: gguf-py reads {} tensors; {same} encoded byte for byte as gguf-py's quantize",
                file.display(),
                tensors.len()
            );
            if f.tensors.iter().any(|t| t.ggml_type != gguf::GgmlType::F32) {
                assert!(same > 0, "{}", file.display());
            }
        }
        assert_eq!(ours.tensors.len(), report[0]["tensors"].as_array().unwrap().len());
    }
}

/// An HF checkpoint directory (what coa-train-step saves) exported as `examples/hf_to_gguf` does:
/// the tokenizer from tokenizer.json + tokenizer_config.json, BOS / EOS behaviour from its
/// post-processor.
#[test]
fn an_hf_directory_exports_with_its_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let src = load(&fixture("tiny_qwen2.gguf"));
    let ckpt = dir.path().join("ckpt");
    src.model.save(&ckpt, coa_model::SaveDtype::F32).unwrap();
    src.tokenizer.tokenizer.save(ckpt.join("tokenizer.json"), false).unwrap();
    let s = &src.tokenizer.specials;
    let mut config = serde_json::json!({"chat_template": src.tokenizer.chat_template});
    for (k, t) in [("bos_token", &s.bos), ("eos_token", &s.eos), ("pad_token", &s.pad)] {
        if let Some(t) = t {
            config[k] = serde_json::json!(t.content);
        }
    }
    std::fs::write(ckpt.join("tokenizer_config.json"), config.to_string()).unwrap();
    let tok = gguf::hf_tokenizer(&ckpt).unwrap();
    assert_eq!(tok.specials, src.tokenizer.specials);
    let out = dir.path().join("out.gguf");
    gguf::save(&Model::load(&ckpt).unwrap(), &tok, &out, GgufDtype::F32).unwrap();
    let back = load(&out);
    assert_eq!(tokenizer_json(&back), tokenizer_json(&src));
    assert_eq!(back.tokenizer.chat_template, src.tokenizer.chat_template);
    assert_eq!(back.model.logits(&Seq::new(&IDS)).unwrap(), src.model.logits(&Seq::new(&IDS)).unwrap());
}

#[test]
fn bad_inputs_are_refused_with_the_file_and_what_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let e = format!("{:#}", "Q4_K".parse::<GgufDtype>().unwrap_err());
    assert!(e.contains("Q4_K") && e.contains("F16, BF16, Q8_0"), "{e}");
    assert_eq!("bf16".parse::<GgufDtype>().unwrap(), GgufDtype::Bf16);
    // A SentencePiece vocabulary: not written (llama.cpp would need its scores and types).
    let spm = load(&fixture("tiny_llama_spm.gguf"));
    let out = dir.path().join("spm.gguf");
    let e = format!("{:#}", gguf::save(&spm.model, &spm.tokenizer, &out, GgufDtype::F16).unwrap_err());
    assert!(e.contains("byte-level BPE") && e.contains("\"BPE\"") && e.contains("SentencePiece"), "{e}");
    assert!(e.contains("spm.gguf: the tokenizer cannot be written"), "{e}");
    assert!(!out.exists(), "nothing written on error");
    // A pre-tokenizer llama.cpp has no name for.
    let mut src = load(&fixture("tiny_llama.gguf"));
    let split = tokenizers::pre_tokenizers::split::Split::new(
        tokenizers::pre_tokenizers::split::SplitPattern::Regex(r"\d".into()),
        tokenizers::SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap();
    src.tokenizer.tokenizer.with_pre_tokenizer(Some(split));
    let e = format!("{:#}", gguf::save(&src.model, &src.tokenizer, &out, GgufDtype::F16).unwrap_err());
    assert!(e.contains("spm.gguf: the tokenizer cannot be written"), "{e}");
    assert!(e.contains("pre-tokenizer") && e.contains("llama.cpp") && e.contains("\\\\d"), "{e}");
    // A directory without tokenizer.json; a tokenizer_config.json naming a token the vocabulary lacks.
    let e = format!("{:#}", gguf::hf_tokenizer(dir.path()).unwrap_err());
    assert!(e.contains("tokenizer.json"), "{e}");
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    src.tokenizer.tokenizer.save(ckpt.join("tokenizer.json"), false).unwrap();
    std::fs::write(ckpt.join("tokenizer_config.json"), r#"{"eos_token": "<nope>"}"#).unwrap();
    let e = format!("{:#}", gguf::hf_tokenizer(&ckpt).unwrap_err());
    assert!(e.contains("tokenizer_config.json") && e.contains("eos_token") && e.contains("<nope>"), "{e}");
    // An unwritable destination names it.
    let qwen2 = load(&fixture("tiny_qwen2.gguf"));
    std::fs::write(dir.path().join("a_file"), b"").unwrap();
    let bad = dir.path().join("a_file/x.gguf");
    let e = format!("{:#}", gguf::save(&qwen2.model, &qwen2.tokenizer, &bad, GgufDtype::F32).unwrap_err());
    assert!(e.contains("x.gguf"), "{e}");
}

/// A Llama 3 rope scaling given only as `rope_parameters` (an HF checkpoint's config) is written
/// as the `rope_freqs.weight` divisors llama.cpp applies, and reads back as the same rope.
#[test]
fn llama3_rope_parameters_become_rope_freqs() {
    let dir = tempfile::tempdir().unwrap();
    let src = load(&fixture("tiny_llama31.gguf"));
    let mut model = Model::new(src.model.config.clone(), src.model.params.clone()).unwrap();
    model.config.extra.remove(coa_model::config::ROPE_FREQ_FACTORS);
    assert!(model.config.rope_scaling().unwrap().is_some(), "the fixture's config has llama3 rope_parameters");
    let out = dir.path().join("llama3.gguf");
    gguf::save(&model, &src.tokenizer, &out, GgufDtype::F32).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let t = f.tensor("rope_freqs.weight").expect("rope_freqs.weight written");
    let (want, got) = (src.model.config.rope_freq_factors().unwrap().unwrap(), f.tensor_f32(t).unwrap());
    let err = rel_err(&got, &want);
    assert!(err < 1e-6, "divisors {got:?} vs the fixture's {want:?}");
    let back = load(&out);
    let ids: Vec<u32> = (0..40).map(|i| (i * 7 % 60) as u32).collect();
    let err = rel_err(&back.model.logits(&Seq::new(&ids)).unwrap(), &model.logits(&Seq::new(&ids)).unwrap());
    eprintln!("llama3 rope: divisors written, logits rel err {err:.2e} after export and reload");
    assert!(err < 1e-5, "{err:e}");
}

/// The pretrained SmolLM2-135M-Instruct (`make model`, or COA_SMOLLM2_GGUF) exported in F16 and
/// Q8_0 and read back: tokenizer and chat template identical, logits of a chat prompt close to
/// the source's, and (F16) the same greedy tokens. Skips with a line when the file is absent.
#[test]
fn smollm2_exports_and_reads_back() {
    let path = smollm2_path();
    if !path.exists() {
        eprintln!(
            "skipped: smollm2_exports_and_reads_back: {} not found; run `make model` to fetch it",
            path.display()
        );
        return;
    }
    let src = load(&path);
    let prompt = "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n";
    let ids = src.tokenizer.tokenizer.encode(prompt, false).unwrap().get_ids().to_vec();
    let greedy = |m: &Model| greedy(m, &ids, 6);
    let (want_logits, want_tokens) = greedy(&src.model);
    let dir = tempfile::tempdir().unwrap();
    for (dtype, tol) in [(GgufDtype::F16, 1e-2), (GgufDtype::Q8_0, 5e-2)] {
        let out = dir.path().join(format!("smollm2.{dtype}.gguf"));
        gguf::save(&src.model, &src.tokenizer, &out, dtype).unwrap();
        let back = load(&out);
        assert_eq!(tokenizer_json(&back), tokenizer_json(&src), "{dtype}: tokenizer.json");
        assert_eq!(back.tokenizer.chat_template, src.tokenizer.chat_template, "{dtype}");
        let (logits, tokens) = greedy(&back.model);
        let err = rel_err(&logits, &want_logits);
        eprintln!(
            "SmolLM2 {dtype}: {:.1} MB, next-token logits rel err {err:.2e}, greedy {:?}",
            std::fs::metadata(&out).unwrap().len() as f64 / 1e6,
            back.tokenizer.tokenizer.decode(&tokens, false).unwrap()
        );
        assert!(err < tol, "{dtype}: {err:e}");
        // Q8_0 of a Q4_1 model moves the near-tie at the first answer token ("To" / "17"), so
        // only F16 must decode the same.
        if dtype == GgufDtype::F16 {
            assert_eq!(tokens, want_tokens, "{dtype}: greedy tokens");
        }
    }
}

/// A Python with llama-cpp-python: `COA_LLAMA_PYTHON`, else `.venv-llama` (`make
/// .venv-llama/.ok` builds it from the pinned source package).
fn llama_python() -> Option<PathBuf> {
    let p = std::env::var_os("COA_LLAMA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-llama/bin/python"));
    let ok = Command::new(&p).args(["-c", "import llama_cpp, numpy"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

/// llama.cpp loads the exported files: on the tiny fixtures (F16) it tokenizes a text as we do;
/// on SmolLM2 exported in F16 it decodes the chat prompt greedily to the same tokens as our
/// model read from that file. Skips with a line without llama-cpp-python (or, for SmolLM2, the
/// file).
#[test]
fn llama_cpp_loads_the_export_and_decodes_as_we_do() {
    let Some(python) = llama_python() else {
        eprintln!("skipped: llama_cpp_loads_the_export_and_decodes_as_we_do: no llama-cpp-python in .venv-llama (`make .venv-llama/.ok`, or COA_LLAMA_PYTHON)");
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/llama_cpp_greedy.py");
    let dir = tempfile::tempdir().unwrap();
    let run = |file: &Path, ids: &[u32], n: usize, text: &str| -> serde_json::Value {
        let ids = serde_json::to_string(ids).unwrap();
        let out =
            Command::new(&python).arg(&script).arg(file).args([ids.as_str(), &n.to_string(), text]).output().unwrap();
        assert!(out.status.success(), "{}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let ids_of = |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    let text = "The quick brown fox jumps over the lazy dog 123";
    for name in ["tiny_llama", "tiny_qwen2"] {
        let src = load(&fixture(&format!("{name}.gguf")));
        let out = dir.path().join(format!("{name}.F16.gguf"));
        gguf::save(&src.model, &src.tokenizer, &out, GgufDtype::F16).unwrap();
        let r = run(&out, &IDS, 1, text);
        let ours = src.tokenizer.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ids_of(&r["tokenize"]), ours, "{name}: llama.cpp's tokens of {text:?}");
        assert_eq!(r["n_vocab"].as_u64(), Some(src.model.config.vocab_size as u64), "{name}");
        eprintln!("{name} F16: llama.cpp loads it and tokenizes as we do");
    }
    // The same greedy decoding from llama.cpp and from our model read from the F16 export.
    let decodes_alike = |name: &str, model: &Model, tokenizer: &gguf::GgufTokenizer, prompt: &str, n: usize| {
        let out = dir.path().join(format!("{name}.F16.gguf"));
        gguf::save(model, tokenizer, &out, GgufDtype::F16).unwrap();
        let ours = load(&out);
        let ids = ours.tokenizer.tokenizer.encode(prompt, false).unwrap().get_ids().to_vec();
        let (_, tokens) = greedy(&ours.model, &ids, n);
        let r = run(&out, &ids, n, prompt);
        assert_eq!(ids_of(&r["tokenize"]), ids, "{name}: llama.cpp's tokens of the chat prompt");
        assert_eq!(ids_of(&r["greedy"]), tokens, "{name}: greedy tokens, llama.cpp vs ours on the F16 file");
        eprintln!("{name} F16: llama.cpp decodes {:?} as we do", ours.tokenizer.tokenizer.decode(&tokens, false).unwrap());
    };
    let smollm2 = smollm2_path();
    if smollm2.exists() {
        let src = load(&smollm2);
        let prompt = "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n";
        decodes_alike("smollm2", &src.model, &src.tokenizer, prompt, 8);
    } else {
        eprintln!("skipped: the SmolLM2 part of llama_cpp_loads_the_export_and_decodes_as_we_do: run `make model`");
    }
    // A trained agent (e.g. COA_GGUF_CHECK_CKPT=runs/default/rl/checkpoint): its 22 CoA tags are
    // tokens of the file, and it starts its answer with them.
    if let Some(ckpt) = std::env::var_os("COA_GGUF_CHECK_CKPT").map(PathBuf::from) {
        let model = Model::load(&ckpt).unwrap();
        let tok = gguf::hf_tokenizer(&ckpt).unwrap();
        let prompt = "<|im_start|>user\nWhat is 17 * 23? <think>use the code tool</think><|im_end|>\n<|im_start|>assistant\n";
        decodes_alike("checkpoint", &model, &tok, prompt, 24);
    }
}
