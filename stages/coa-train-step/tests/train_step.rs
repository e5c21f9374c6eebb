//! End-to-end checks of the `coa-train-step` binary on small token tables: exact resume, a
//! falling loss, accumulation equivalence against a hand-computed reference, checkpoints, plots
//! and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float32Array, Int32Array, Int64Array, ListArray, StringArray, UInt8Array};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use coa_model::{Model, ModelConfig, Params, Seq};
use coa_schemas::io::{self, Provenance};
use coa_schemas::tables::{METRICS, TOKENS};

const VOCAB: usize = 64;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coa-train-step"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("running coa-train-step")
}

fn ok(args: &[&str]) -> Output {
    let out = run(args);
    assert!(out.status.success(), "coa-train-step {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert!(!out.status.success(), "coa-train-step {args:?} should have failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A row: ids, mask, optional segments.
type Row = (Vec<i32>, Vec<u8>, Option<Vec<i32>>);

fn list_i32(rows: impl Iterator<Item = Option<Vec<i32>>>) -> ArrayRef {
    let rows: Vec<Option<Vec<i32>>> = rows.collect();
    let lens: Vec<usize> = rows.iter().map(|r| r.as_ref().map_or(0, |v| v.len())).collect();
    let values: Vec<i32> = rows.iter().flat_map(|r| r.clone().unwrap_or_default()).collect();
    let nulls = if rows.iter().any(|r| r.is_none()) { Some(rows.iter().map(|r| r.is_some()).collect::<Vec<_>>().into()) } else { None };
    Arc::new(ListArray::new(Arc::new(Field::new("item", DataType::Int32, true)), OffsetBuffer::from_lengths(lens), Arc::new(Int32Array::from(values)), nulls))
}

fn list_u8(rows: &[Vec<u8>]) -> ArrayRef {
    let lens: Vec<usize> = rows.iter().map(|v| v.len()).collect();
    let values: Vec<u8> = rows.iter().flatten().copied().collect();
    Arc::new(ListArray::new(Arc::new(Field::new("item", DataType::UInt8, true)), OffsetBuffer::from_lengths(lens), Arc::new(UInt8Array::from(values)), None))
}

fn tokens_batch(rows: &[Row]) -> RecordBatch {
    let task: ArrayRef = Arc::new(StringArray::from((0..rows.len()).map(|i| format!("task{i}")).collect::<Vec<_>>()));
    let ids = list_i32(rows.iter().map(|r| Some(r.0.clone())));
    let masks: Vec<Vec<u8>> = rows.iter().map(|r| r.1.clone()).collect();
    let seg = list_i32(rows.iter().map(|r| r.2.clone()));
    let n_tok: ArrayRef = Arc::new(Int32Array::from(rows.iter().map(|r| r.0.len() as i32).collect::<Vec<_>>()));
    let n_tgt: ArrayRef = Arc::new(Int32Array::from(rows.iter().map(|r| r.1.iter().filter(|&&m| m == 1).count() as i32).collect::<Vec<_>>()));
    RecordBatch::try_new(TOKENS.schema(), vec![task, ids, list_u8(&masks), seg, n_tok, n_tgt]).unwrap()
}

fn provenance() -> Provenance {
    Provenance { stage: "test".into(), version: "0".into(), args: vec![], seed: None, inputs: vec![] }
}

fn write_tokens(path: &Path, rows: &[Row]) {
    let batch = tokens_batch(rows);
    io::write_all(Some(path), None, &batch.schema(), &[batch], &provenance()).unwrap();
}

/// A deterministic pseudo-random data set: prompt tokens (mask 0) then an answer (mask 1) that
/// is a fixed function of the prompt, so there is something to learn.
fn dataset(n: usize, seed: u64) -> Vec<Row> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|_| {
            let p = 4 + (next() % 12) as usize;
            let a = 3 + (next() % 10) as usize;
            let mut ids: Vec<i32> = (0..p).map(|_| 2 + (next() % (VOCAB as u64 - 2)) as i32).collect();
            let start = ids[p - 1];
            ids.extend((0..a).map(|k| 2 + ((start as usize + 3 * k) % (VOCAB - 2)) as i32));
            let mut mask = vec![0u8; p];
            mask.extend(vec![1u8; a]);
            (ids, mask, None)
        })
        .collect()
}

/// A small llama config (fast on a CPU) written as an HF config.json.
fn write_config(dir: &Path) -> PathBuf {
    let mut v = ModelConfig::preset("tiny", VOCAB).unwrap().to_json();
    let o = v.as_object_mut().unwrap();
    o.insert("hidden_size".into(), 32.into());
    o.insert("intermediate_size".into(), 64.into());
    o.insert("num_hidden_layers".into(), 2.into());
    o.insert("num_attention_heads".into(), 4.into());
    o.insert("num_key_value_heads".into(), 2.into());
    o.insert("max_position_embeddings".into(), 128.into());
    let p = dir.join("config.json");
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    p
}

fn read_metrics(path: &Path) -> Vec<(i64, f32, f32, f32, i64)> {
    let (_, batches) = io::read_all(Some(path), &METRICS).unwrap();
    let mut out = Vec::new();
    for b in batches {
        let step = b.column_by_name("step").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
        let f = |n: &str| b.column_by_name(n).unwrap().as_any().downcast_ref::<Float32Array>().unwrap().clone();
        let (loss, lr, gn) = (f("loss"), f("lr"), f("grad_norm"));
        let tokens = b.column_by_name("tokens").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
        assert_eq!(b.column_by_name("reward_mean").unwrap().null_count(), b.num_rows(), "RL columns are null for sft");
        for i in 0..b.num_rows() {
            out.push((step.value(i), loss.value(i), lr.value(i), gn.value(i), tokens.value(i)));
        }
    }
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

struct Env {
    dir: tempfile::TempDir,
    tokens: PathBuf,
    config: PathBuf,
}

fn env(n_rows: usize) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.parquet");
    write_tokens(&tokens, &dataset(n_rows, 7));
    let config = write_config(dir.path());
    Env { dir, tokens, config }
}

impl Env {
    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn base<'a>(e: &'a Env, extra: &[&'a str]) -> Vec<String> {
    let mut v: Vec<String> = ["-i", s(&e.tokens), "--init-config", s(&e.config), "--seed", "5", "--batch-tokens", "60", "--lr", "3e-3", "--warmup-steps", "2", "--threads", "2"]
        .iter()
        .map(|x| x.to_string())
        .collect();
    v.extend(extra.iter().map(|x| x.to_string()));
    v
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(|x| x.as_str()).collect()
}

fn load_params(dir: &Path) -> Params {
    Model::load(dir).unwrap().params
}

#[test]
fn resume_is_bit_identical_to_an_uninterrupted_run() {
    let e = env(14);
    // 2N = 8 steps of <= 60 tokens cross an epoch boundary (14 rows of 7..24 tokens).
    let full = e.p("full");
    ok(&args(&base(&e, &["--steps", "8", "--save", s(&full), "-o", s(&e.p("full.parquet"))])));
    let part = e.p("part");
    // First half saved in bf16 (exact f32 masters go to optimizer.safetensors), then resumed
    // into the same directory.
    ok(&args(&base(&e, &["--steps", "8", "--stop-at-step", "4", "--save", s(&part), "--save-dtype", "bf16", "-o", s(&e.p("a.parquet"))])));
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(part.join("trainer_state.json")).unwrap()).unwrap();
    assert_eq!(state["step"], 4);
    ok(&["-i", s(&e.tokens), "--resume", s(&part), "--save", s(&part), "--threads", "1", "-o", s(&e.p("b.parquet"))]);

    let a = load_params(&full);
    let b = load_params(&part);
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!(x.name, y.name);
        assert!(x.data.iter().zip(&y.data).all(|(p, q)| p.to_bits() == q.to_bits()), "{} differs after resume", x.name);
    }
    assert!(std::fs::read(full.join("optimizer.safetensors")).unwrap() == std::fs::read(part.join("optimizer.safetensors")).unwrap(), "optimizer state differs");
    let sa: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(full.join("trainer_state.json")).unwrap()).unwrap();
    let sb: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(part.join("trainer_state.json")).unwrap()).unwrap();
    assert_eq!(sa["cursor"], sb["cursor"], "data cursor and RNG state");
    assert!(sa["cursor"]["epoch"].as_u64().unwrap() >= 1, "the run crossed an epoch boundary");
    assert_eq!(sa["history"], sb["history"]);
    let m_full = read_metrics(&e.p("full.parquet"));
    let mut m_split = read_metrics(&e.p("a.parquet"));
    m_split.extend(read_metrics(&e.p("b.parquet")));
    assert_eq!(m_full.len(), 8);
    let strip = |m: &[(i64, f32, f32, f32, i64)]| m.iter().map(|r| (r.0, r.1.to_bits(), r.2.to_bits(), r.3.to_bits(), r.4)).collect::<Vec<_>>();
    assert_eq!(strip(&m_full), strip(&m_split));
    // A resumed run that is already complete does nothing more.
    ok(&["-i", s(&e.tokens), "--resume", s(&part), "-o", s(&e.p("c.parquet"))]);
    assert!(read_metrics(&e.p("c.parquet")).is_empty());
}

#[test]
fn loss_falls_on_a_tiny_overfit_set() {
    let e = env(6);
    let out = e.p("m.parquet");
    let png = e.p("loss.png");
    let o = ok(&args(&base(&e, &["--steps", "40", "--lr", "1e-2", "--min-lr", "1e-3", "--batch-tokens", "1000", "-o", s(&out), "--plot", s(&png), "--log-every", "10"])));
    let m = read_metrics(&out);
    assert_eq!(m.len(), 40);
    assert_eq!(m.iter().map(|r| r.0).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
    let first = m[0].1;
    let last = m[39].1;
    assert!(first > 3.0, "an untrained model is near ln(64) = 4.16, got {first}");
    assert!(last < 0.5 * first, "loss did not fall: {first} -> {last}");
    assert!(m.iter().all(|r| r.4 > 0 && r.3.is_finite()));
    // lr follows the schedule: warmup to 1e-2 at step 2, cosine to 1e-3 at step 40.
    assert!((m[0].2 - 5e-3).abs() < 1e-9 && (m[1].2 - 1e-2).abs() < 1e-9 && (m[39].2 - 1e-3).abs() < 1e-9);
    let png_bytes = std::fs::read(&png).unwrap();
    assert_eq!(&png_bytes[..4], b"\x89PNG");
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(log.contains("grad_norm") && log.lines().filter(|l| l.trim_start().starts_with("40 ")).count() == 1, "log table:\n{log}");
    // The plot subcommand draws the same curve from the metrics table.
    let png2 = e.p("again.png");
    ok(&["plot", "-i", s(&out), "-o", s(&png2)]);
    assert_eq!(&std::fs::read(&png2).unwrap()[..4], b"\x89PNG");
}

/// The reference: loss and gradient of the step computed by hand from the model library, with the
/// token mean over the whole batch.
fn reference_step(config: &Path, rows: &[Row], seed: u64) -> (f64, f64) {
    let model = Model::init(ModelConfig::from_file(config).unwrap(), seed).unwrap();
    let n: usize = rows.iter().map(|r| r.1.iter().skip(1).filter(|&&m| m == 1).count()).sum();
    let mut grads = model.params.zeros_like();
    let mut loss = 0.0f64;
    for (ids, mask, _) in rows {
        let ids: Vec<u32> = ids.iter().map(|&x| x as u32).collect();
        let mut l = 0.0;
        let mut f = |st: &coa_model::TokenStats| {
            (0..ids.len())
                .map(|t| {
                    if t > 0 && mask[t] == 1 {
                        l -= st.logp[t] as f64;
                        -1.0 / n as f32
                    } else {
                        0.0
                    }
                })
                .collect::<Vec<f32>>()
        };
        model.forward_backward(&Seq { input_ids: &ids, segment_ids: None, shared_prefix: 0 }, &mut grads, &mut f).unwrap();
        loss += l;
    }
    (loss / n as f64, grads.sum_squares().sqrt())
}

#[test]
fn accumulation_matches_one_big_batch_and_the_hand_computed_step() {
    let e = env(5);
    let rows = dataset(5, 7);
    let big = e.p("big.parquet");
    let micro = e.p("micro.parquet");
    // One step over all rows (batch 1000 tokens): one micro-batch, vs. one row per micro-batch.
    ok(&args(&base(&e, &["--steps", "2", "--batch-tokens", "1000", "--grad-clip", "0", "--save", s(&e.p("big")), "-o", s(&big)])));
    ok(&args(&base(&e, &["--steps", "2", "--batch-tokens", "1000", "--micro-batch-tokens", "1", "--grad-clip", "0", "--save", s(&e.p("micro")), "-o", s(&micro)])));
    let a = read_metrics(&big);
    let b = read_metrics(&micro);
    for (x, y) in a.iter().zip(&b) {
        assert!((x.1 - y.1).abs() <= 1e-6 * x.1.abs(), "loss {} vs {}", x.1, y.1);
        assert!((x.3 - y.3).abs() <= 1e-5 * x.3.abs(), "grad_norm {} vs {}", x.3, y.3);
    }
    let (pa, pb) = (load_params(&e.p("big")), load_params(&e.p("micro")));
    for (x, y) in pa.tensors.iter().zip(&pb.tensors) {
        for (p, q) in x.data.iter().zip(&y.data) {
            assert!((p - q).abs() <= 1e-6 * (1.0 + p.abs()), "{}: {p} vs {q}", x.name);
        }
    }
    // The first step's loss and pre-clip gradient norm are the token mean over the whole batch.
    let (ref_loss, ref_norm) = reference_step(&e.config, &rows, 5);
    assert!((a[0].1 as f64 - ref_loss).abs() < 1e-5 * ref_loss, "loss {} vs reference {ref_loss}", a[0].1);
    assert!((a[0].3 as f64 - ref_norm).abs() < 1e-4 * ref_norm, "grad_norm {} vs reference {ref_norm}", a[0].3);
    // ... and not the mean of per-row means (which the data makes different).
    let model = Model::init(ModelConfig::from_file(&e.config).unwrap(), 5).unwrap();
    let mut per_row = 0.0;
    for (ids, mask, _) in &rows {
        let ids: Vec<u32> = ids.iter().map(|&x| x as u32).collect();
        let st = model.token_stats(&Seq { input_ids: &ids, segment_ids: None, shared_prefix: 0 }).unwrap();
        let k = mask.iter().skip(1).filter(|&&m| m == 1).count() as f64;
        per_row += (1..ids.len()).filter(|&t| mask[t] == 1).map(|t| -(st.logp[t] as f64)).sum::<f64>() / k;
    }
    per_row /= rows.len() as f64;
    assert!((per_row - ref_loss).abs() > 1e-4, "test data must tell the two means apart");
    assert_eq!(a[0].4, rows.iter().map(|r| r.1.iter().skip(1).filter(|&&m| m == 1).count() as i64).sum::<i64>());
}

#[test]
fn checkpoint_holds_hf_files_tokenizer_and_state() {
    let e = env(6);
    let tok = e.p("tokenizer.json");
    // A minimal tokenizer.json whose ids and the 22 CoA tags loading adds fill the model's 64 rows;
    // id 0 is the EOS token by its usual name.
    let tags = coa_tokenize::tag_strings().len();
    let name = |i: usize| if i == 0 { "<|endoftext|>".to_string() } else { format!("t{i}") };
    let vocab: serde_json::Map<String, serde_json::Value> = (0..VOCAB - tags).map(|i| (name(i), serde_json::Value::from(i))).collect();
    std::fs::write(&tok, serde_json::json!({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": []}).to_string()).unwrap();
    let ck = e.p("ck");
    ok(&args(&base(&e, &["--steps", "3", "--tokenizer", s(&tok), "--save", s(&ck), "--save-every", "1", "-o", s(&e.p("m.parquet"))])));
    for f in ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "optimizer.safetensors", "trainer_state.json"] {
        assert!(ck.join(f).exists(), "{f} missing");
    }
    let leftovers: Vec<_> = std::fs::read_dir(e.dir.path()).unwrap().filter_map(|d| d.ok()).map(|d| d.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with('.')).collect();
    assert!(leftovers.is_empty(), "temporary directories left: {leftovers:?}");
    // --init from the checkpoint: fresh optimizer, step 1 again, tokenizer carried along.
    let ck2 = e.p("ck2");
    ok(&["-i", s(&e.tokens), "--init", s(&ck), "--steps", "1", "--save", s(&ck2), "-o", s(&e.p("m2.parquet"))]);
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        assert_eq!(std::fs::read(ck2.join(f)).unwrap(), std::fs::read(ck.join(f)).unwrap(), "{f}");
    }
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(ck.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["eos_token_id"], 0, "{config}");
    assert_eq!(read_metrics(&e.p("m2.parquet"))[0].0, 1);
    // A tokenizer larger than the model's vocabulary is refused.
    let big: serde_json::Map<String, serde_json::Value> = (0..VOCAB + 5 - tags).map(|i| (name(i), serde_json::Value::from(i))).collect();
    std::fs::write(&tok, serde_json::json!({"model": {"type": "BPE", "vocab": big, "merges": []}, "added_tokens": []}).to_string()).unwrap();
    let err = fails(&args(&base(&e, &["--steps", "1", "--tokenizer", s(&tok)])));
    assert!(err.contains("has 69 ids") && err.contains("vocab_size is 64"), "{err}");
    // A preset takes its vocabulary size from the tokenizer.
    let err = fails(&["-i", s(&e.tokens), "--init-config", "tiny", "--steps", "1"]);
    assert!(err.contains("--vocab-size"), "{err}");
}

/// A pretrained-like model of the test config: an HF directory (with a tokenizer.json of `ids`
/// ids, no tags, no tokenizer_config.json; `eos` names id 0 `<|endoftext|>`, a known EOS) and
/// the same model as a GGUF with that vocabulary.
fn pretrained(e: &Env, name: &str, ids: usize, eos: bool) -> (PathBuf, PathBuf) {
    let model = Model::init(ModelConfig::from_file(&e.config).unwrap(), 5).unwrap();
    let dir = e.p(name);
    model.save(&dir, coa_model::SaveDtype::F32).unwrap();
    let token = |i: usize| if i == 0 && eos { "<|endoftext|>".to_string() } else { format!("t{i}") };
    let vocab: serde_json::Map<String, serde_json::Value> = (0..ids).map(|i| (token(i), serde_json::Value::from(i))).collect();
    std::fs::write(dir.join("tokenizer.json"), serde_json::json!({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": []}).to_string()).unwrap();
    let mut w = coa_model::gguf::writer_of(&model).unwrap();
    use coa_model::gguf::Value;
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.kv("tokenizer.ggml.tokens", Value::Array((0..ids).map(|i| Value::String(token(i))).collect()));
    w.kv("tokenizer.ggml.token_type", Value::Array((0..ids).map(|i| Value::I32(if i == 0 && eos { 3 } else { 1 })).collect()));
    w.kv("tokenizer.ggml.merges", Value::Array(vec![]));
    let gguf = e.p(&format!("{name}.gguf"));
    w.write(&gguf).unwrap();
    (dir, gguf)
}

/// Issue 47: `--init` of a pretrained model without `--tokenizer` leaves its vocabulary as it is,
/// from an HF directory (which used to grow by the 22 tags its tokenizer gets on loading) and
/// from a GGUF alike, so the first step's loss on plain text is the unchanged model's (what
/// transformers computes: tests/parity).
#[test]
fn init_without_tokenizer_leaves_a_pretrained_vocabulary_unchanged() {
    let e = env(5);
    let rows = dataset(5, 7);
    let (dir, gguf) = pretrained(&e, "pre", VOCAB, true);
    let (ref_loss, _) = reference_step(&e.config, &rows, 5);
    let first_loss = |init: &Path, extra: &[&str], name: &str| -> (f64, usize, String) {
        let (m, ck) = (e.p(&format!("{name}.parquet")), e.p(name));
        let mut a = vec!["-i", s(&e.tokens), "--init", s(init), "--steps", "1", "--batch-tokens", "1000", "--threads", "2", "--save", s(&ck), "-o", s(&m)];
        a.extend_from_slice(extra);
        let out = ok(&a);
        let rows = ModelConfig::from_file(&ck.join("config.json")).unwrap().vocab_size;
        (read_metrics(&m)[0].1 as f64, rows, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (from_dir, dir_rows, note) = first_loss(&dir, &[], "ck_dir");
    let (from_gguf, gguf_rows, _) = first_loss(&gguf, &[], "ck_gguf");
    assert_eq!((dir_rows, gguf_rows), (VOCAB, VOCAB), "no rows added");
    assert!(note.contains("left as it is") && note.contains("--tokenizer"), "{note}");
    assert_eq!(from_dir, from_gguf, "the same model from a directory and from a GGUF");
    assert!((from_dir - ref_loss).abs() < 1e-5 * ref_loss, "loss {from_dir} vs the unchanged model's {ref_loss}");
    // Growing for an explicit --tokenizer needs one that splits the tags into base pieces:
    // tests/tests/hf_checkpoint.rs runs it on SmolLM2.
}

/// Issue 47: a tokenizer with no tokenizer_config.json and no usual EOS name asks for `--eos`,
/// a flag this stage has (it used to suggest one only coa-tokenize had); `--eos none` and
/// `--eos TOKEN` are taken, and the token goes into the saved config.
#[test]
fn a_tokenizer_without_an_eos_asks_for_the_eos_flag_it_has() {
    let e = env(3);
    let tags = coa_tokenize::tag_strings().len();
    // 42 ids + the 22 tags fill the 64 rows: the tokenizer fits the model and is kept.
    let (dir, _) = pretrained(&e, "noeos", VOCAB - tags, false);
    let run_with = |extra: &[&str], name: &str| {
        let out = e.p(name);
        let mut a = vec!["-i", s(&e.tokens), "--init", s(&dir), "--steps", "1", "--threads", "2", "-o", s(&out)];
        a.extend_from_slice(extra);
        a.iter().map(|x| x.to_string()).collect::<Vec<_>>()
    };
    let err = fails(&args(&run_with(&[], "m0.parquet")));
    assert!(err.contains("cannot tell the EOS token") && err.contains("--eos none"), "{err}");
    ok(&args(&run_with(&["--eos", "none"], "m1.parquet")));
    let ck = e.p("ck");
    ok(&args(&run_with(&["--eos", "t7", "--save", s(&ck)], "m2.parquet")));
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(ck.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["eos_token_id"], 7, "{config}");
    let err = fails(&args(&run_with(&["--eos", "nosuch"], "m3.parquet")));
    assert!(err.contains("nosuch") && err.contains("--eos"), "{err}");
}

/// The arguments recorded in the provenance of a metrics table.
fn recorded_args(path: &Path) -> Vec<String> {
    io::open(Some(path), &METRICS).unwrap().provenance().expect("provenance").args
}

#[test]
fn provenance_records_what_determines_the_metrics_not_where_or_how_fast() {
    let e = env(6);
    // Two runs of the same training: other outputs, checkpoint directories, thread counts and
    // log cadence, in both spellings of a flag.
    ok(&args(&base(&e, &["--steps", "2", "--save", s(&e.p("ck1")), "--save-every", "1", "--log-every", "1", "-o", s(&e.p("a.parquet"))])));
    let mut second = base(&e, &["--steps", "2", &format!("--save={}", s(&e.p("ck2"))), "--output", s(&e.p("b.parquet"))]);
    let threads = second.iter().position(|a| a == "--threads").unwrap();
    second.splice(threads..threads + 2, ["--threads=1".to_string()]);
    ok(&args(&second));
    let (a, b) = (recorded_args(&e.p("a.parquet")), recorded_args(&e.p("b.parquet")));
    assert_eq!(a, b, "the provenance differs between runs that train the same");
    for dropped in ["--save", "--save-every", "--log-every", "--threads", "-o", "ck1", "a.parquet"] {
        assert!(!a.iter().any(|x| x == dropped || x.ends_with(dropped)), "{dropped} recorded in {a:?}");
    }
    // What changes the data is kept.
    for kept in ["--seed", "--lr", "--steps", "--batch-tokens", "--init-config"] {
        assert!(a.iter().any(|x| x == kept), "{kept} missing from {a:?}");
    }
    // And a setting that changes the run gives another provenance.
    ok(&args(&base(&e, &["--steps", "2", "--lr", "1e-3", "-o", s(&e.p("c.parquet"))])));
    assert_ne!(recorded_args(&e.p("c.parquet")), a);
}

#[test]
fn corrupt_optimizer_state_names_the_tensor() {
    let e = env(6);
    let ck = e.p("ck");
    ok(&args(&base(&e, &["--steps", "4", "--stop-at-step", "1", "--save", s(&ck), "-o", s(&e.p("m.parquet"))])));
    // Rewrite optimizer.safetensors without one tensor.
    let bytes = std::fs::read(ck.join("optimizer.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(|s| s.to_string()).collect();
    names.sort();
    let dropped = names.iter().find(|n| n.starts_with("exp_avg_sq.")).unwrap().clone();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = names.iter().filter(|n| **n != dropped).map(|n| (n.clone(), st.tensor(n).unwrap())).collect();
    std::fs::write(ck.join("optimizer.safetensors"), safetensors::serialize(kept, None).unwrap()).unwrap();
    let err = fails(&["-i", s(&e.tokens), "--resume", s(&ck), "-o", s(&e.p("x.parquet"))]);
    assert!(err.contains(&dropped) && err.contains("missing"), "{err}");
    assert!(!e.p("x.parquet").exists());
}

#[test]
fn bad_input_is_refused_with_the_row_and_column() {
    let e = env(4);
    let out = e.p("out.parquet");
    let save = e.p("never");
    let run_on = |rows: &[Row]| -> String {
        let p = e.p("bad.parquet");
        write_tokens(&p, rows);
        let mut a = base(&e, &["--steps", "1", "-o", s(&out), "--save", s(&save)]);
        a[1] = s(&p).to_string();
        let err = fails(&args(&a));
        assert!(!out.exists() && !save.exists(), "no partial output");
        err
    };
    let mut rows = dataset(3, 1);
    rows[1].1.pop();
    let err = run_on(&rows);
    assert!(err.contains("row 1") && err.contains("loss_mask") && err.contains("input_ids"), "{err}");

    let mut rows = dataset(3, 1);
    rows[2].0[3] = VOCAB as i32 + 6;
    let err = run_on(&rows);
    assert!(err.contains("row 2") && err.contains("position 3") && err.contains("70") && err.contains("vocab"), "{err}");

    let mut rows = dataset(3, 1);
    rows[0].0[1] = -4;
    let err = run_on(&rows);
    assert!(err.contains("row 0") && err.contains("-4"), "{err}");

    let mut rows = dataset(3, 1);
    rows[1].1[2] = 7;
    let err = run_on(&rows);
    assert!(err.contains("row 1") && err.contains("loss_mask") && err.contains('7'), "{err}");

    let mut rows = dataset(3, 1);
    let n = rows[0].0.len();
    rows[0].2 = Some(vec![0; n - 1]);
    let err = run_on(&rows);
    assert!(err.contains("row 0") && err.contains("segment_ids"), "{err}");

    let rows: Vec<Row> = dataset(3, 1).into_iter().map(|(i, m, s)| (i, vec![0; m.len()], s)).collect();
    let err = run_on(&rows);
    assert!(err.contains("no row has a target"), "{err}");

    // Several inputs: an error names the input and its own row numbering.
    let good = e.p("good.parquet");
    write_tokens(&good, &dataset(3, 2));
    let mut rows = dataset(3, 1);
    rows[2].1.push(1);
    let bad = e.p("bad2.parquet");
    write_tokens(&bad, &rows);
    let mut a = base(&e, &["--steps", "1", "-o", s(&out)]);
    a[1] = s(&good).to_string();
    a.push(s(&bad).to_string());
    let err = fails(&args(&a));
    assert!(err.contains("bad2.parquet: row 2"), "{err}");

    // A table without `loss_mask`.
    let full = tokens_batch(&dataset(2, 1));
    let keep: Vec<usize> = (0..full.num_columns()).filter(|&i| full.schema().field(i).name() != "loss_mask").collect();
    let fields: Vec<Field> = keep.iter().map(|&i| full.schema().field(i).clone()).collect();
    let cols: Vec<ArrayRef> = keep.iter().map(|&i| full.column(i).clone()).collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
    let p = e.p("nomask.parquet");
    io::write_all(Some(&p), None, &batch.schema(), &[batch], &provenance()).unwrap();
    let mut a = base(&e, &["--steps", "1", "-o", s(&out)]);
    a[1] = s(&p).to_string();
    let err = fails(&args(&a));
    assert!(err.contains("loss_mask"), "{err}");

    // Flags.
    let err = fails(&args(&base(&e, &["--objective", "ppo"])));
    assert!(err.contains("--objective") && err.contains("ppo"), "{err}");
    // DAPO trains on scored rollouts, not on the tokens table.
    let err = fails(&args(&base(&e, &["--objective", "dapo"])));
    assert!(err.contains("`scores` table"), "{err}");
    let err = fails(&args(&base(&e, &["--objective", "dapo", "--kl-coef", "0.1"])));
    assert!(err.contains("--ref"), "{err}");
    let err = fails(&args(&base(&e, &["--min-lr", "1"])));
    assert!(err.contains("--min-lr"), "{err}");
    let err = fails(&["-i", s(&e.tokens), "--steps", "1"]);
    assert!(err.contains("--init-config"), "{err}");
    let bad_cfg = e.p("bad_config.json");
    std::fs::write(&bad_cfg, r#"{"model_type": "llama", "vocab_size": 64, "hidden_size": 30, "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 8}"#).unwrap();
    let err = fails(&["-i", s(&e.tokens), "--init-config", s(&bad_cfg), "--steps", "1"]);
    assert!(err.contains("--init-config"), "{err}");
    assert!(!out.exists());
}

#[test]
fn resume_refuses_other_settings_and_other_data() {
    let e = env(6);
    let ck = e.p("ck");
    ok(&args(&base(&e, &["--steps", "4", "--stop-at-step", "2", "--save", s(&ck), "-o", s(&e.p("m.parquet"))])));
    let resume = |extra: &[&str]| -> String {
        let x = e.p("x.parquet");
        let mut a = vec!["-i", s(&e.tokens), "--resume", s(&ck), "-o", s(&x)];
        a.extend_from_slice(extra);
        let err = fails(&a);
        assert!(!e.p("x.parquet").exists());
        err
    };
    let err = resume(&["--lr", "1e-3"]);
    assert!(err.contains("--lr") && err.contains("trainer_state.json"), "{err}");
    let err = resume(&["--batch-tokens", "100"]);
    assert!(err.contains("--batch-tokens"), "{err}");
    let err = resume(&["--steps", "9"]);
    assert!(err.contains("--steps"), "{err}");
    let err = resume(&["--seed", "6"]);
    assert!(err.contains("--seed"), "{err}");
    let err = resume(&["--matmul", "bf16"]);
    assert!(err.contains("--matmul") && err.contains("trainer_state.json"), "{err}");
    let err = resume(&["--matmul", "fp8"]);
    assert!(err.contains("--matmul") && err.contains("fp8") && err.contains("bf16"), "{err}");
    let err = resume(&["--init-config", "tiny"]);
    assert!(err.contains("--resume") || err.contains("--init-config"), "{err}");
    // Other data.
    let other = e.p("other.parquet");
    write_tokens(&other, &dataset(6, 99));
    let err = fails(&["-i", s(&other), "--resume", s(&ck), "-o", s(&e.p("x.parquet"))]);
    assert!(err.contains("not the data"), "{err}");
    // Other data: the same rows split over two inputs in another order.
    let (r1, r2) = (e.p("r1.parquet"), e.p("r2.parquet"));
    let all = dataset(6, 7);
    write_tokens(&r1, &all[3..]);
    write_tokens(&r2, &all[..3]);
    let err = fails(&["--resume", s(&ck), s(&r1), s(&r2), "-o", s(&e.p("x.parquet"))]);
    assert!(err.contains("not the data"), "{err}");
    // The same rows split over two inputs in the same order are the same data.
    write_tokens(&r1, &all[..3]);
    write_tokens(&r2, &all[3..]);
    ok(&["--resume", s(&ck), "--stop-at-step", "3", s(&r1), s(&r2), "-o", s(&e.p("z.parquet"))]);
    // Same values (and a different micro-batch) are fine.
    ok(&["-i", s(&e.tokens), "--resume", s(&ck), "--lr", "3e-3", "--micro-batch-tokens", "20", "-o", s(&e.p("y.parquet"))]);
    assert_eq!(read_metrics(&e.p("y.parquet")).iter().map(|r| r.0).collect::<Vec<_>>(), vec![3, 4]);
}

/// Scored rollouts (the `scores` table) for DAPO: `groups` tasks of 4 samples each, random ids,
/// a 6-token prompt, observations (mask 0, log-prob 0) in the middle of each response.
/// Writes `groups` groups of 4 scored rollouts (each group's first rewarded 1, the rest 0) and
/// returns them with their rewards.
fn write_scores(path: &Path, groups: usize, ragged_row: Option<usize>) -> (Vec<coa_schemas::rows::Rollout>, Vec<f32>) {
    use coa_schemas::rows::{self, Rollout};
    let mut rng = 7u64;
    let mut next = || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) as i32
    };
    let mut rollouts = Vec::new();
    let mut rewards = Vec::new();
    for g in 0..groups {
        for k in 0..4 {
            let len = 20 + (next() % 10) as usize;
            let response_ids: Vec<i32> = (0..len).map(|_| next() % VOCAB as i32).collect();
            let loss_mask: Vec<u8> = (0..len).map(|t| if (8..12).contains(&t) { 0 } else { 1 }).collect();
            let logprobs: Vec<f32> = loss_mask.iter().map(|&m| if m == 1 { -4.2 } else { 0.0 }).collect();
            rollouts.push(Rollout {
                task_id: format!("t{g}"),
                suite: "math".into(),
                sample_idx: k,
                model: "m".into(),
                prompt_ids: (0..6).map(|_| next() % VOCAB as i32).collect(),
                response_ids,
                loss_mask,
                logprobs,
                response_text: String::new(),
                turns: 1,
                tool_calls: 1,
                finish_reason: "answer".into(),
            });
            rewards.push(if k == 0 { 1.0f32 } else { 0.0 });
        }
    }
    if let Some(r) = ragged_row {
        rollouts[r].logprobs.pop();
    }
    let base = rows::to_batch(&rollouts).unwrap();
    let n = base.num_rows();
    let mut cols = base.columns().to_vec();
    let adv: Vec<f32> = rewards.chunks(4).flat_map(|g| coa_rewards_like_advantages(g)).collect();
    cols.push(Arc::new(Float32Array::from(rewards.clone())));
    cols.push(Arc::new(arrow::array::BooleanArray::from(rewards.iter().map(|&r| r > 0.0).collect::<Vec<_>>())));
    cols.push(Arc::new(Float32Array::from(vec![None::<f32>; n])));
    cols.push(Arc::new(arrow::array::BooleanArray::from(vec![true; n])));
    cols.push(Arc::new(Float32Array::from(vec![0.0f32; n])));
    cols.push(Arc::new(Float32Array::from(adv)));
    cols.push(Arc::new(arrow::array::StringArray::from(vec![None::<&str>; n])));
    let batch = RecordBatch::try_new(coa_schemas::tables::SCORES.schema(), cols).unwrap();
    io::write_all(Some(path), None, &batch.schema(), &[batch], &provenance()).unwrap();
    (rollouts, rewards)
}

/// (R - mean) / (std + 1e-6), sample std: the values coa-score writes.
fn coa_rewards_like_advantages(r: &[f32]) -> Vec<f32> {
    let n = r.len() as f32;
    let mean = r.iter().sum::<f32>() / n;
    let std = (r.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / (n - 1.0)).sqrt();
    r.iter().map(|x| (x - mean) / (std + 1e-6)).collect()
}

/// Scored rollouts (3 groups of 4) and a starting checkpoint for DAPO in `dir`: (scores, init).
fn dapo_start(dir: &Path) -> (PathBuf, PathBuf) {
    let scores = dir.join("scores.parquet");
    write_scores(&scores, 3, None);
    let config = write_config(dir);
    let init = dir.join("init");
    // A starting checkpoint (one SFT-free step is enough to have the HF files).
    let tokens = dir.join("tokens.parquet");
    write_tokens(&tokens, &dataset(4, 1));
    ok(&["-i", s(&tokens), "--init-config", s(&config), "--steps", "1", "--lr", "1e-30", "--save", s(&init), "-o", s(&dir.join("m0.parquet"))]);
    (scores, init)
}

#[test]
fn dapo_trains_on_scored_rollouts_and_reports_rl_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (scores, init) = dapo_start(dir.path());

    let out_dir = dir.path().join("rl");
    let m = dir.path().join("rl.parquet");
    let out = ok(&["-i", s(&scores), "--objective", "dapo", "--init", s(&init), "--lr", "1e-2", "--batch-tokens", "60", "--save", s(&out_dir), "-o", s(&m)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("old log-probs of 12 rollouts"), "{stderr}");
    let reader = io::open(Some(&m), &METRICS).unwrap();
    let batches: Vec<RecordBatch> = reader.collect::<anyhow::Result<_>>().unwrap();
    let b = &batches[0];
    assert!(b.num_rows() > 1, "several mini-batch steps");
    let col = |n: &str| b.column_by_name(n).unwrap().as_any().downcast_ref::<Float32Array>().unwrap().clone();
    for name in ["reward_mean", "clip_frac", "entropy", "response_len", "logprob_mismatch"] {
        let c = col(name);
        assert_eq!(c.null_count(), 0, "{name} is filled for DAPO steps");
    }
    // The first step runs at ratio 1: nothing clipped. The sampler's log-probs (-4.2) are not
    // the model's, so the mismatch is visible.
    assert_eq!(col("clip_frac").value(0), 0.0);
    assert!(col("logprob_mismatch").value(0) > 0.1);
    // Weights moved.
    let before = load_params(&init);
    let after = load_params(&out_dir);
    let moved = before.tensors.iter().zip(&after.tensors).any(|(a, b)| a.data != b.data);
    assert!(moved, "DAPO updated the weights");

    // Bad input: a rollout whose log-probs do not cover its response is named.
    write_scores(&scores, 3, Some(5));
    let err = fails(&["-i", s(&scores), "--objective", "dapo", "--init", s(&init), "-o", s(&m)]);
    assert!(err.contains("row 5") && err.contains("logprobs"), "{err}");
}

/// The sign of the whole DAPO path (advantages → per-token gradients → model backward →
/// AdamW): after a few steps on fixed rollouts, the responses that won their group (positive
/// advantage) are more likely under the new weights and the others less likely.
#[test]
fn dapo_makes_the_winning_responses_more_likely_and_the_losing_ones_less() {
    let dir = tempfile::tempdir().unwrap();
    let scores = dir.path().join("scores.parquet");
    let (rollouts, rewards) = write_scores(&scores, 3, None);
    let config = write_config(dir.path());
    let (init, tokens) = (dir.path().join("init"), dir.path().join("tokens.parquet"));
    write_tokens(&tokens, &dataset(4, 1));
    ok(&["-i", s(&tokens), "--init-config", s(&config), "--steps", "1", "--lr", "1e-30", "--save", s(&init), "-o", s(&dir.path().join("m0.parquet"))]);
    let trained = dir.path().join("rl");
    ok(&["-i", s(&scores), "--objective", "dapo", "--init", s(&init), "--lr", "3e-3", "--batch-tokens", "60", "--save", s(&trained), "-o", s(&dir.path().join("rl.parquet"))]);

    // Mean log-probability of a rollout's own (target) response tokens under a checkpoint.
    let mean_logp = |ck: &Path, r: &coa_schemas::rows::Rollout| -> f32 {
        let model = Model::load(ck).unwrap();
        let ids: Vec<u32> = r.prompt_ids.iter().chain(&r.response_ids).map(|&i| i as u32).collect();
        let logp = model.token_stats(&Seq::new(&ids)).unwrap().logp;
        let at: Vec<f32> = r.loss_mask.iter().enumerate().filter(|(_, &m)| m == 1).map(|(t, _)| logp[r.prompt_ids.len() + t]).collect();
        at.iter().sum::<f32>() / at.len() as f32
    };
    let (mut won, mut lost) = (Vec::new(), Vec::new());
    for (r, &reward) in rollouts.iter().zip(&rewards) {
        let change = mean_logp(&trained, r) - mean_logp(&init, r);
        if reward > 0.0 { won.push(change) } else { lost.push(change) }
    }
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    assert!(mean(&won) > 0.0 && mean(&lost) < 0.0, "log-prob change: winners {won:?}, losers {lost:?}");
    assert!(won.iter().all(|&c| c > 0.0), "every winner rises: {won:?}");
}

/// Rows that begin with the same prompt are computed as one sequence with the prompt once
/// (`share.rs`); the step is the same as computing every row alone (`--no-share-prompts`), up to
/// f32 summation order.
#[test]
fn shared_prompts_train_as_rows_alone() {
    let dir = tempfile::tempdir().unwrap();
    let prompt: Vec<i32> = (0..40).map(|i| 2 + (i * 7 % (VOCAB as i32 - 2))).collect();
    let rows: Vec<Row> = dataset(12, 3)
        .into_iter()
        .map(|(ids, mask, _)| {
            let mut all = prompt.clone();
            all.extend(&ids);
            let mut m = vec![0u8; prompt.len()];
            m.extend(&mask);
            (all, m, None)
        })
        .collect();
    let tokens = dir.path().join("tokens.parquet");
    write_tokens(&tokens, &rows);
    let config = write_config(dir.path());
    let run_with = |name: &str, extra: &[&str]| {
        let (ck, m) = (dir.path().join(name), dir.path().join(format!("{name}.parquet")));
        let mut a = vec!["-i", s(&tokens), "--init-config", s(&config), "--seed", "5", "--batch-tokens", "400", "--lr", "3e-3", "--steps", "3", "--threads", "2", "--save", s(&ck), "-o", s(&m)];
        a.extend_from_slice(extra);
        ok(&a);
        (read_metrics(&m), load_params(&ck))
    };
    let (shared, p_shared) = run_with("shared", &[]);
    let (alone, p_alone) = run_with("alone", &["--no-share-prompts"]);
    assert_eq!(shared.len(), 3);
    for (a, b) in shared.iter().zip(&alone) {
        assert_eq!((a.0, a.4), (b.0, b.4), "same steps and tokens");
        assert!((a.1 - b.1).abs() <= 1e-5 * b.1.abs().max(1.0), "loss {} vs {}", a.1, b.1);
        assert!((a.3 - b.3).abs() <= 1e-4 * b.3.abs().max(1.0), "grad_norm {} vs {}", a.3, b.3);
    }
    for (x, y) in p_shared.tensors.iter().zip(&p_alone.tensors) {
        let diff = x.data.iter().zip(&y.data).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "{}: max |diff| {diff}", x.name);
    }
}

/// A Python that imports TensorBoard's own reader: `COA_TB_PYTHON`, else .venv-hf (`make
/// hf-venv` installs tensorboard there), else `python3`.
fn tensorboard_python() -> Option<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates: Vec<PathBuf> = match std::env::var_os("COA_TB_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec![repo.join(".venv-hf/bin/python"), PathBuf::from("python3")],
    };
    candidates.into_iter().find(|py| {
        Command::new(py).args(["-c", "import tensorboard.backend.event_processing.event_accumulator"]).output().is_ok_and(|o| o.status.success())
    })
}

#[test]
fn tensorboard_scalars_are_the_metrics_and_a_resume_repeats_no_step() {
    let e = env(14);
    let tb = e.p("tb");
    let part = e.p("part");
    ok(&args(&base(&e, &["--steps", "8", "--stop-at-step", "4", "--save", s(&part), "--tensorboard", s(&tb), "-o", s(&e.p("a.parquet"))])));
    ok(&["-i", s(&e.tokens), "--resume", s(&part), "--save", s(&part), "--tensorboard", s(&tb), "-o", s(&e.p("b.parquet"))]);
    let mut metrics = read_metrics(&e.p("a.parquet"));
    metrics.extend(read_metrics(&e.p("b.parquet")));
    assert_eq!(metrics.len(), 8);

    // Two event files, one per invocation, each step in exactly one of them.
    let files = coa_train_step::tensorboard::event_files(&tb).unwrap();
    assert_eq!(files.len(), 2, "{files:?}");
    let steps: Vec<Vec<i64>> = files.iter().map(|f| coa_train_step::tensorboard::record_steps(&std::fs::read(f).unwrap()).0.into_iter().map(|(_, s)| s).filter(|&s| s > 0).collect()).collect();
    assert!(steps[0].iter().all(|&s| (1..=4).contains(&s)) && steps[1].iter().all(|&s| (5..=8).contains(&s)), "{steps:?}");
    // The run's provenance does not depend on where the curves went.
    assert!(!recorded_args(&e.p("a.parquet")).iter().any(|a| a.contains("tensorboard")));

    // Read back by TensorBoard itself.
    let Some(python) = tensorboard_python() else {
        eprintln!("tensorboard_scalars_are_the_metrics_and_a_resume_repeats_no_step: skipped the TensorBoard reader check: no Python with the tensorboard package (run `make hf-venv`, or set COA_TB_PYTHON)");
        return;
    };
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
"#;
    let out = Command::new(&python).args(["-c", script, s(&tb)]).output().unwrap();
    assert!(out.status.success(), "the TensorBoard reader failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let read: std::collections::BTreeMap<String, Vec<(i64, f64)>> = serde_json::from_slice(&out.stdout).unwrap();
    for tag in ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"] {
        let curve = read.get(tag).unwrap_or_else(|| panic!("no {tag} in {:?}", read.keys()));
        assert_eq!(curve.iter().map(|p| p.0).collect::<Vec<_>>(), (1..=8).collect::<Vec<_>>(), "{tag}: every step once, in order");
    }
    for (m, (step, loss)) in metrics.iter().zip(&read["train/loss"]) {
        assert_eq!(m.0, *step);
        assert_eq!(m.1, *loss as f32, "step {step}: the loss in TensorBoard is the metrics row's");
    }
    for (m, (_, lr)) in metrics.iter().zip(&read["train/lr"]) {
        assert_eq!(m.2, *lr as f32);
    }
}

#[test]
fn progress_bar_only_on_a_terminal() {
    let e = env(6);
    let metrics = e.p("m.parquet");
    let run_args = base(&e, &["--steps", "3", "--log-every", "1", "-o", s(&metrics)]);
    // Not a terminal (a pipe, as under CI or a log file): the plain log lines, no control characters.
    let o = ok(&args(&run_args));
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(log.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count() == 3, "one log line per step:\n{log}");
    assert!(!log.contains('\x1b') && !log.contains('\r'), "control characters in a piped log:\n{log:?}");
    // On a terminal (`script` gives the run a pseudo-terminal): the bar, with its ETA, and the same lines above it.
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("progress_bar_only_on_a_terminal: skipped the terminal half: no `script` (util-linux) to make a pseudo-terminal");
        return;
    }
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_coa-train-step").to_string()).chain(run_args).map(|a| format!("'{a}'")).collect();
    let out = Command::new("script").args(["-qec", &quoted.join(" "), "/dev/null"]).output().unwrap();
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(tty.contains("coa-train-step training") && tty.contains("eta"), "no progress bar on a terminal:\n{tty:?}");
    assert!(tty.contains("grad_norm"), "the log table is still printed:\n{tty:?}");
}

fn gguf_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/fixtures/gguf").join(name)
}

/// Issue 47: `--save-gguf` writes the run's final weights with the checkpoint's tokenizer (its
/// tags, special tokens and chat template) as GGUF; read back, the weights are the checkpoint's
/// (F32: exactly) and the tokenizer splits text as the checkpoint's does.
#[test]
fn save_gguf_writes_the_trained_model_with_its_tokenizer() {
    let e = env(5);
    let pre = gguf_fixture("tiny_llama.gguf");
    let (ck, gguf) = (e.p("ck"), e.p("out.gguf"));
    let out = ok(&["-i", s(&e.tokens), "--init", s(&pre), "--tokenizer", s(&pre), "--steps", "2", "--threads", "2", "--save", s(&ck), "--save-gguf", s(&gguf), "--gguf-dtype", "f32", "-o", s(&e.p("m.parquet"))]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(s(&gguf)), "the note names the file");
    let saved = Model::load(&ck).unwrap();
    let back = coa_model::gguf::load(&gguf).unwrap();
    assert_eq!(back.model.config.vocab_size, saved.config.vocab_size);
    assert!(saved.config.vocab_size > 306, "the tags grew the vocabulary");
    for (a, b) in back.model.params.iter().zip(saved.params.iter()) {
        assert_eq!((&a.name, &a.data), (&b.name, &b.data), "the GGUF's weights are the checkpoint's");
    }
    let hf = coa_model::gguf::hf_tokenizer(&ck).unwrap();
    let text = "<think>plan</think> 12+30 <answer>42</answer>";
    let ids = |t: &coa_model::gguf::GgufTokenizer| t.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(ids(&back.tokenizer), ids(&hf));
    assert_eq!(back.tokenizer.specials, hf.specials);
    assert!(back.tokenizer.chat_template.is_some() && back.tokenizer.chat_template == hf.chat_template);
    let left: Vec<_> = std::fs::read_dir(e.dir.path()).unwrap().filter_map(|d| d.ok()).map(|d| d.file_name()).filter(|n| n.to_string_lossy().starts_with('.')).collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A GGUF the run could not write is refused before the first step, with the flag named; so is
/// --save-gguf without --save, and a shard size that is not one.
#[test]
fn save_gguf_and_shard_size_are_checked_before_training() {
    let e = env(3);
    let tok = e.p("tokenizer.json");
    // A BPE that is not byte-level: GGUF cannot hold it.
    let tags = coa_tokenize::tag_strings().len();
    let vocab: serde_json::Map<String, serde_json::Value> = (0..VOCAB - tags).map(|i| (if i == 0 { "<|endoftext|>".to_string() } else { format!("t{i}") }, serde_json::Value::from(i))).collect();
    std::fs::write(&tok, serde_json::json!({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": []}).to_string()).unwrap();
    let (ck, gguf, m) = (e.p("ck"), e.p("x.gguf"), e.p("m.parquet"));
    let err = fails(&args(&base(&e, &["--steps", "1", "--tokenizer", s(&tok), "--save", s(&ck), "--save-gguf", s(&gguf), "-o", s(&m)])));
    assert!(err.contains("--save-gguf") && err.contains("byte-level"), "{err}");
    assert!(!ck.exists() && !gguf.exists() && !m.exists(), "nothing written");
    let err = fails(&args(&base(&e, &["--steps", "1", "--save-gguf", s(&gguf), "-o", s(&m)])));
    assert!(err.contains("--save"), "{err}");
    let err = fails(&args(&base(&e, &["--steps", "1", "--save", s(&ck), "--max-shard-size", "5XB", "-o", s(&m)])));
    assert!(err.contains("--max-shard-size") && err.contains("5XB"), "{err}");
}

/// Issue 47: a checkpoint saved in shards (--max-shard-size) resumes exactly: the weights after
/// resuming equal an uninterrupted run's, bit for bit.
#[test]
fn a_sharded_checkpoint_resumes_exactly() {
    let e = env(8);
    let full = e.p("full");
    ok(&args(&base(&e, &["--steps", "4", "--save", s(&full), "-o", s(&e.p("full.parquet"))])));
    let part = e.p("part");
    ok(&args(&base(&e, &["--steps", "4", "--stop-at-step", "2", "--save", s(&part), "--max-shard-size", "10KB", "-o", s(&e.p("a.parquet"))])));
    assert!(part.join("model.safetensors.index.json").is_file() && !part.join("model.safetensors").exists());
    ok(&["-i", s(&e.tokens), "--resume", s(&part), "--save", s(&part), "--threads", "2", "-o", s(&e.p("b.parquet"))]);
    assert!(part.join("model.safetensors").is_file() && !part.join("model.safetensors.index.json").exists(), "saved again in one file");
    for (x, y) in load_params(&full).tensors.iter().zip(&load_params(&part).tensors) {
        assert!(x.name == y.name && x.data.iter().zip(&y.data).all(|(p, q)| p.to_bits() == q.to_bits()), "{} differs after resume", x.name);
    }
}

/// The adapter's tensors of a LoRA checkpoint.
fn adapter(dir: &Path) -> Params {
    Model::load_with_adapter(dir).unwrap().lora.unwrap().params
}

#[test]
fn lora_trains_only_the_adapter_and_resumes_bit_identically() {
    let e = env(14);
    let lora = ["--lora-rank", "4", "--lora-alpha", "16", "--lora-dropout", "0.1", "--lora-targets", "all-linear"];
    let full = e.p("full");
    let mut a = base(&e, &["--steps", "8", "--save", s(&full), "-o", s(&e.p("full.parquet"))]);
    a.extend(lora.iter().map(|x| x.to_string()));
    ok(&args(&a));
    // PEFT's layout, and the base as it started (the fresh model of --init-config, seed 5)
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(full.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!((cfg["peft_type"].as_str(), cfg["r"].as_u64(), cfg["lora_alpha"].as_f64(), cfg["lora_dropout"].as_f64()), (Some("LORA"), Some(4), Some(16.0), Some(0.1)));
    assert_eq!(cfg["target_modules"].as_array().unwrap().len(), 7);
    assert_eq!(cfg["base_model_name_or_path"].as_str().unwrap(), std::path::absolute(&full).unwrap().to_str().unwrap());
    let fresh = Model::init(ModelConfig::from_file(&e.config).unwrap(), 5).unwrap();
    assert_eq!(Model::load_base(&full).unwrap().params, fresh.params, "the base does not train");
    let ad = adapter(&full);
    assert!(ad.tensors.iter().filter(|t| t.name.contains("lora_B")).all(|t| t.data.iter().any(|&x| x != 0.0)), "every B trained");
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(full.join("trainer_state.json")).unwrap()).unwrap();
    assert_eq!(state["lora"]["rank"], 4);
    // the optimizer holds the adapter's moments only
    let opt = std::fs::read(full.join("optimizer.safetensors")).unwrap();
    assert!(opt.len() < 3 * 4 * ad.n_elements() + 64 * 1024, "optimizer state of {} bytes for {} adapter values", opt.len(), ad.n_elements());

    // interrupted at step 4 (saved in bf16: the f32 base is kept in f32), resumed
    let part = e.p("part");
    let mut b = base(&e, &["--steps", "8", "--stop-at-step", "4", "--save", s(&part), "--save-dtype", "bf16", "-o", s(&e.p("a.parquet"))]);
    b.extend(lora.iter().map(|x| x.to_string()));
    ok(&args(&b));
    ok(&["-i", s(&e.tokens), "--resume", s(&part), "--save", s(&part), "--threads", "1", "-o", s(&e.p("b.parquet"))]);
    assert_eq!(adapter(&part), ad, "adapter differs after resume");
    assert_eq!(Model::load_base(&part).unwrap().params, fresh.params);
    assert!(std::fs::read(full.join("optimizer.safetensors")).unwrap() == std::fs::read(part.join("optimizer.safetensors")).unwrap(), "optimizer state differs");
    let mut m_split = read_metrics(&e.p("a.parquet"));
    m_split.extend(read_metrics(&e.p("b.parquet")));
    let strip = |m: &[(i64, f32, f32, f32, i64)]| m.iter().map(|r| (r.0, r.1.to_bits(), r.2.to_bits(), r.3.to_bits(), r.4)).collect::<Vec<_>>();
    assert_eq!(strip(&read_metrics(&e.p("full.parquet"))), strip(&m_split));
    let err = fails(&["-i", s(&e.tokens), "--resume", s(&part), "--lora-rank", "8", "-o", s(&e.p("c.parquet"))]);
    assert!(err.contains("--lora-rank 8") && err.contains("differs"), "{err}");

    // Model::load merges; merge-lora writes the same weights as a plain checkpoint
    let merged = e.p("merged");
    ok(&["merge-lora", "-i", s(&full), "-o", s(&merged)]);
    assert!(!merged.join("adapter_config.json").exists());
    let mut want = Model::load_with_adapter(&full).unwrap();
    want.merge_lora().unwrap();
    assert_eq!(Model::load(&merged).unwrap().params, want.params);
    assert_eq!(Model::load(&full).unwrap().params, want.params);
    let err = fails(&["merge-lora", "-i", s(&merged), "-o", s(&e.p("m2"))]);
    assert!(err.contains("adapter_config.json"), "{err}");

    // --init of the adapter: with --lora-rank its adapter trains on (its settings the default),
    // without it the merged model is fine-tuned
    let more = e.p("more");
    ok(&["-i", s(&e.tokens), "--init", s(&full), "--lora-rank", "4", "--steps", "1", "--save", s(&more), "-o", s(&e.p("d.parquet"))]);
    assert_ne!(adapter(&more), ad);
    let err = fails(&["-i", s(&e.tokens), "--init", s(&full), "--lora-rank", "8", "--steps", "1", "-o", s(&e.p("d.parquet"))]);
    assert!(err.contains("--init adapter"), "{err}");
    let plain = e.p("plain");
    ok(&["-i", s(&e.tokens), "--init", s(&full), "--steps", "1", "--save", s(&plain), "-o", s(&e.p("d.parquet"))]);
    assert!(!plain.join("adapter_config.json").exists());
}

#[test]
fn lora_flags_are_checked() {
    let e = env(4);
    let o = e.p("m.parquet");
    for (extra, want) in [
        (vec!["--lora-alpha", "16"], "need --lora-rank"),
        (vec!["--lora-rank", "4", "--lora-targets", "q_proj,qkv"], "qkv"),
        (vec!["--lora-rank", "4", "--lora-dropout", "1.5"], "lora_dropout"),
        (vec!["--lora-rank", "0"], "--lora-rank"),
        (vec!["--lora-rank", "4", "--freeze-layers", "1"], "--freeze-layers"),
    ] {
        let mut a = base(&e, &["--steps", "1", "-o", s(&o)]);
        a.extend(extra.iter().map(|x| x.to_string()));
        let err = fails(&args(&a));
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // a full fine-tune resumed with --lora-rank
    let ck = e.p("ck");
    ok(&args(&base(&e, &["--steps", "2", "--stop-at-step", "1", "--save", s(&ck), "-o", s(&o)])));
    let err = fails(&["-i", s(&e.tokens), "--resume", s(&ck), "--lora-rank", "4", "-o", s(&o)]);
    assert!(err.contains("--lora-rank") && err.contains("no adapter"), "{err}");
}

#[test]
fn dapo_trains_a_lora_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let (scores, init) = dapo_start(dir.path());
    let out_dir = dir.path().join("rl");
    let m = dir.path().join("rl.parquet");
    ok(&["-i", s(&scores), "--objective", "dapo", "--init", s(&init), "--lora-rank", "4", "--lr", "1e-2", "--batch-tokens", "60", "--save", s(&out_dir), "-o", s(&m)]);
    assert_eq!(Model::load_base(&out_dir).unwrap().params, Model::load(&init).unwrap().params, "the base does not train");
    let ad = adapter(&out_dir);
    assert!(ad.tensors.iter().any(|t| t.name.contains("v_proj.lora_B") && t.data.iter().any(|&x| x != 0.0)));
    // the policy the next rollouts sample from is the adapted one
    let (a, b) = (Model::load(&init).unwrap(), Model::load(&out_dir).unwrap());
    let ids: Vec<u32> = (0..12).collect();
    assert_ne!(a.logits(&Seq::new(&ids)).unwrap(), b.logits(&Seq::new(&ids)).unwrap());
}
