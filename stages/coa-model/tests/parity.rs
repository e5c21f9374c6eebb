//! Parity with HF transformers (PyTorch CPU, f32) on the committed fixtures of
//! tests/parity/fixtures/<case>/ (made by tests/parity/make_fixtures.py), and LoRA adapters
//! with PEFT (fixtures lora_*/, made by tests/parity/make_lora_fixtures.py).
//!
//! Relative error of a tensor a against the reference b: max_i |a_i − b_i| / max_i |b_i|.
//! Asserted: logits rel err < 1e-5; loss |a − b| < 1e-6; every parameter gradient rel err < 1e-4.

use std::path::{Path, PathBuf};

use coa_model::lora::{Lora, LoraConfig, Target};
use coa_model::rng::random_ids;
use coa_model::{Model, ModelConfig, Params, SaveDtype, Seq, TokenIds};
use safetensors::SafeTensors;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/fixtures")
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).fold(0f64, f64::max);
    let den = b.iter().map(|x| (*x as f64).abs()).fold(0f64, f64::max);
    num / den.max(1e-30)
}

struct Fixture {
    model: Model,
    ids: Vec<u32>,
    mask: Vec<f32>,
    segment_ids: Option<Vec<i32>>,
    loss: f64,
    expected: Vec<(String, Vec<usize>, Vec<f32>)>,
}

fn load_fixture(case: &str) -> Fixture {
    let dir = fixtures().join(case);
    let model = Model::load(&dir).unwrap_or_else(|e| panic!("{case}: {e:#}"));
    let info: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("inputs.json")).unwrap()).unwrap();
    let ids = info["input_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let mask = info["loss_mask"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let segment_ids = info["segment_ids"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_i64().unwrap() as i32).collect());
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let expected = st
        .tensors()
        .into_iter()
        .map(|(name, v)| {
            assert_eq!(v.dtype(), safetensors::Dtype::F32);
            let data = v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            (name, v.shape().to_vec(), data)
        })
        .collect();
    Fixture { model, ids, mask, segment_ids, loss: info["loss"].as_f64().unwrap(), expected }
}

/// Masked mean CE through forward_backward: d loss / d logp[t] = −mask[t] / N for t ≥ 1.
fn sft_loss_and_grads(m: &Model, seq: &Seq, mask: &[f32]) -> (f64, Params) {
    let n: f64 = mask[1..].iter().map(|&x| x as f64).sum();
    let mut grads = m.params.zeros_like();
    let stats = m
        .forward_backward(seq, &mut grads, &mut |_st| {
            let mut d: Vec<f32> = mask.iter().map(|&x| (-(x as f64) / n) as f32).collect();
            d[0] = 0.0;
            d
        })
        .unwrap();
    let loss = -stats.logp[1..].iter().zip(&mask[1..]).map(|(&l, &w)| l as f64 * w as f64).sum::<f64>() / n;
    (loss, grads)
}

fn check_case(case: &str) {
    let f = load_fixture(case);
    let seq = Seq { input_ids: &f.ids, segment_ids: f.segment_ids.as_deref(), shared_prefix: 0 };
    let logits = f.model.logits(&seq).unwrap();
    let (loss, grads) = sft_loss_and_grads(&f.model, &seq, &f.mask);
    let mut logits_err = 0f64;
    let mut max_grad_err = 0f64;
    let mut n_grads = 0;
    for (name, shape, want) in &f.expected {
        if name == "logits" {
            assert_eq!(shape, &vec![f.ids.len(), f.model.config.vocab_size]);
            let e = rel_err(&logits, want);
            logits_err = e;
            assert!(e < 1e-5, "{case}: logits rel err {e:.3e}");
            continue;
        }
        let pname = name.strip_prefix("grad.").unwrap();
        let g = grads.get(pname).unwrap_or_else(|| panic!("{case}: no gradient for {pname}"));
        assert_eq!(&g.shape, shape, "{case}: {pname}");
        let e = rel_err(&g.data, want);
        assert!(e < 1e-4, "{case}: gradient of {pname} rel err {e:.3e}");
        max_grad_err = max_grad_err.max(e);
        n_grads += 1;
    }
    assert_eq!(n_grads, f.model.params.tensors.len(), "{case}: every parameter has a reference gradient");
    let le = (loss - f.loss).abs();
    assert!(le < 1e-6, "{case}: loss {loss} vs HF {} (abs err {le:.3e})", f.loss);
    eprintln!("{case}: logits rel err {logits_err:.2e}, loss abs err {le:.2e}, max grad rel err {max_grad_err:.2e}");
}

#[test]
fn parity_llama_gqa_untied() {
    check_case("llama_gqa_untied");
}

#[test]
fn parity_llama_tied() {
    check_case("llama_tied");
}

#[test]
fn parity_qwen2_bias_gqa() {
    check_case("qwen2_bias_gqa");
}

#[test]
fn parity_llama_bias_headdim() {
    check_case("llama_bias_headdim");
}

#[test]
fn parity_llama_packed() {
    check_case("llama_packed");
}

#[test]
fn parity_llama3_rope() {
    check_case("llama3_rope");
    // The case would not catch a model that ignored the scaling: plain RoPE gives other logits.
    let f = load_fixture("llama3_rope");
    let mut plain = f.model.clone();
    plain.config.extra.remove("rope_parameters");
    let seq = Seq::new(&f.ids);
    let (a, b) = (f.model.logits(&seq).unwrap(), plain.logits(&seq).unwrap());
    assert!(rel_err(&b, &a) > 1e-3, "llama3 scaling changes the logits: {:.2e}", rel_err(&b, &a));
}

#[test]
fn packed_equals_separate_sequences() {
    let f = load_fixture("llama_packed");
    let seg = f.segment_ids.clone().unwrap();
    check_packed(&f.model, &f.ids, &seg, &f.mask);
}

/// `ids` packed with segment ids `seg` equals its segments run one by one: logits row by row,
/// and gradients summed (with the per-segment losses weighted by the same global token count).
fn check_packed(model: &Model, ids: &[u32], seg: &[i32], mask: &[f32]) {
    let seq = Seq { input_ids: ids, segment_ids: Some(seg), shared_prefix: 0 };
    let logits = model.logits(&seq).unwrap();
    let (_, packed_grads) = sft_loss_and_grads(model, &seq, mask);
    let n: f64 = mask[1..].iter().map(|&x| x as f64).sum();
    let v = model.config.vocab_size;
    let mut sep_grads = model.params.zeros_like();
    let mut s = 0;
    while s < ids.len() {
        let mut e = s;
        while e < ids.len() && seg[e] == seg[s] {
            e += 1;
        }
        let sub = &ids[s..e];
        let l = model.logits(&Seq::new(sub)).unwrap();
        assert!(rel_err(&logits[s * v..e * v], &l) < 1e-5, "segment {s}..{e}");
        let m = &mask[s..e];
        model
            .forward_backward(&Seq::new(sub), &mut sep_grads, &mut |_| {
                let mut d: Vec<f32> = m.iter().map(|&x| (-(x as f64) / n) as f32).collect();
                d[0] = 0.0;
                d
            })
            .unwrap();
        s = e;
    }
    for (a, b) in packed_grads.iter().zip(sep_grads.iter()) {
        let e = rel_err(&a.data, &b.data);
        assert!(e < 1e-5, "{}: packed vs separate rel err {e:.3e}", a.name);
    }
}

#[test]
fn parity_qwen3_qknorm() {
    check_case("qwen3_qknorm");
}

/// A windowed case would not catch a model that ignored the window: without it the logits differ.
fn window_matters(case: &str) {
    let f = load_fixture(case);
    let mut full = f.model.clone();
    full.config.extra.insert("sliding_window".into(), Value::Null);
    full.config.extra.remove("layer_types");
    assert!(full.config.layer_windows().unwrap().iter().all(|&w| w == 0));
    let seq = Seq::new(&f.ids);
    let (a, b) = (f.model.logits(&seq).unwrap(), full.logits(&seq).unwrap());
    assert!(rel_err(&b, &a) > 1e-3, "{case}: the window changes the logits: {:.2e}", rel_err(&b, &a));
}

#[test]
fn parity_qwen3_sliding() {
    let f = load_fixture("qwen3_sliding");
    assert_eq!(f.model.config.layer_windows().unwrap(), vec![0, 5, 5]);
    check_case("qwen3_sliding");
    window_matters("qwen3_sliding");
}

#[test]
fn parity_mistral_window() {
    let f = load_fixture("mistral_window");
    assert_eq!(f.model.config.layer_windows().unwrap(), vec![6, 6]);
    check_case("mistral_window");
    window_matters("mistral_window");
}

#[test]
fn parity_qwen2_sliding() {
    let f = load_fixture("qwen2_sliding");
    assert_eq!(f.model.config.layer_windows().unwrap(), vec![4, 0, 4]);
    check_case("qwen2_sliding");
    window_matters("qwen2_sliding");
}

/// Packed rows under a sliding window: the window stays within each segment (positions restart),
/// so the packed row still equals its segments run alone; segments longer than the window.
#[test]
fn packed_with_a_window_equals_separate_sequences() {
    for case in ["mistral_window", "qwen3_sliding"] {
        let f = load_fixture(case);
        let t = f.ids.len();
        let seg: Vec<i32> = (0..t).map(|i| if i < 8 { 0 } else { 1 }).collect();
        let mut mask = f.mask.clone();
        mask[8] = 0.0; // a segment start is never a target
        check_packed(&f.model, &f.ids, &seg, &mask);
    }
}

/// A shared prefix under a sliding window: `prefix | tail 1 | tail 2` computes, for each tail,
/// what `prefix | tail` computes alone (the window counts positions, which continue the prefix).
#[test]
fn shared_prefix_with_a_window_equals_each_row_alone() {
    let f = load_fixture("qwen2_sliding");
    let v = f.model.config.vocab_size;
    let (prefix, tails) = (&f.ids[..5], [&f.ids[5..12], &f.ids[12..]]);
    let mut ids = prefix.to_vec();
    let mut seg = vec![0i32; prefix.len()];
    for (k, tail) in tails.iter().enumerate() {
        ids.extend_from_slice(tail);
        seg.extend(std::iter::repeat_n(k as i32 + 1, tail.len()));
    }
    let packed = f.model.logits(&Seq { input_ids: &ids, segment_ids: Some(&seg), shared_prefix: prefix.len() }).unwrap();
    let mut at = prefix.len();
    for tail in tails {
        let row: Vec<u32> = prefix.iter().chain(tail.iter()).copied().collect();
        let alone = f.model.logits(&Seq::new(&row)).unwrap();
        let e = rel_err(&packed[at * v..(at + tail.len()) * v], &alone[prefix.len() * v..]);
        assert!(e < 1e-5, "tail at {at}: rel err {e:.3e}");
        assert!(rel_err(&packed[..prefix.len() * v], &alone[..prefix.len() * v]) < 1e-5);
        at += tail.len();
    }
}

// ---- LoRA: adapters made by PEFT (tests/parity/make_lora_fixtures.py, fixtures lora_*/)
//
// The base and PEFT's adapter load through our loader and give PEFT's logits, loss and A / B
// gradients (the tolerances above), and the merged model PEFT's merge_and_unload() logits. And
// the other way: PEFT loads an adapter we save (where .venv-torch has peft; skipped with a line
// saying so otherwise).

fn check_lora_case(case: &str) {
    let dir = fixtures().join(case);
    let model = Model::load_with_adapter(&dir.join("adapter")).unwrap_or_else(|e| panic!("{case}: {e:#}"));
    let lora = model.lora.as_ref().expect("the adapter is kept apart");
    let info: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("inputs.json")).unwrap()).unwrap();
    let ids: Vec<u32> = info["input_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let mask: Vec<f64> = info["loss_mask"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let get = |name: &str| -> Vec<f32> {
        let v = st.tensor(name).unwrap_or_else(|_| panic!("{case}: no {name} in expected.safetensors"));
        v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    let seq = Seq::new(&ids);
    let logits_err = rel_err(&model.logits(&seq).unwrap(), &get("logits"));
    assert!(logits_err < 1e-5, "{case}: logits rel err {logits_err:.3e}");

    let n: f64 = mask[1..].iter().sum();
    let mut grads = lora.params.zeros_like();
    let stats = model
        .forward_backward(&seq, &mut grads, &mut |_| {
            let mut d: Vec<f32> = mask.iter().map(|&x| (-x / n) as f32).collect();
            d[0] = 0.0;
            d
        })
        .unwrap();
    let loss = -stats.logp[1..].iter().zip(&mask[1..]).map(|(&l, &w)| l as f64 * w).sum::<f64>() / n;
    let le = (loss - info["loss"].as_f64().unwrap()).abs();
    assert!(le < 1e-6, "{case}: loss {loss} vs PEFT's (abs err {le:.3e})");
    let n_expected = st.names().iter().filter(|n| n.starts_with("grad.")).count();
    assert_eq!(n_expected, grads.len(), "{case}: PEFT trains exactly the adapter's tensors");
    let mut max_grad_err = 0f64;
    for g in grads.iter() {
        let e = rel_err(&g.data, &get(&format!("grad.{}", g.name)));
        assert!(e < 1e-4, "{case}: gradient of {} rel err {e:.3e}", g.name);
        max_grad_err = max_grad_err.max(e);
    }

    let merged = Model::load(&dir.join("adapter")).unwrap();
    assert!(merged.lora.is_none());
    let merged_err = rel_err(&merged.logits(&seq).unwrap(), &get("merged_logits"));
    assert!(merged_err < 1e-5, "{case}: merged logits rel err {merged_err:.3e}");
    eprintln!("{case}: logits rel err {logits_err:.2e}, loss abs err {le:.2e}, max A/B grad rel err {max_grad_err:.2e}, merged logits rel err {merged_err:.2e}");
}

#[test]
fn parity_lora_llama_all_linear() {
    check_lora_case("lora_llama_all_linear");
}

#[test]
fn parity_lora_qwen2_default_targets() {
    check_lora_case("lora_qwen2_default");
}

/// A Python with torch, transformers and peft: COA_TORCH_PYTHON, else .venv-torch.
fn torch_python() -> Option<PathBuf> {
    let p = std::env::var_os("COA_TORCH_PYTHON").map(PathBuf::from).unwrap_or_else(|| fixtures().join("../../../.venv-torch/bin/python"));
    let ok = p.is_file() && std::process::Command::new(&p).args(["-c", "import peft, transformers, torch"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

#[test]
fn peft_loads_our_adapter() {
    let Some(py) = torch_python() else {
        eprintln!("skipped: peft_loads_our_adapter: no Python with torch, transformers and peft (`make .venv-torch/.ok`, or COA_TORCH_PYTHON)");
        return;
    };
    let mut c = ModelConfig::preset("tiny", 71).unwrap();
    (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) = (32, 48, 2, 4, 2);
    c.tie_word_embeddings = false;
    c.bos_token_id = Some(1);
    c.eos_token_id = Some(TokenIds::One(2));
    let mut m = Model::init(c, 4).unwrap();
    let mut lora = Lora::init(&m.config, LoraConfig { rank: 4, alpha: 12.0, dropout: 0.05, targets: vec![Target::Q, Target::O, Target::Up, Target::Down] }, 9).unwrap();
    for t in lora.params.iter_mut() {
        t.data.iter_mut().enumerate().for_each(|(i, x)| *x += 0.05 * ((i % 13) as f32 - 6.0) / 6.0);
    }
    m.lora = Some(lora);
    let dir = tempfile::tempdir().unwrap();
    m.save(dir.path(), SaveDtype::F32).unwrap();
    m.lora.as_ref().unwrap().save(dir.path(), &dir.path().to_string_lossy()).unwrap();
    let ids = random_ids(15, 71, 8);
    let logits = m.logits(&Seq::new(&ids)).unwrap();
    let ids_f: Vec<f32> = ids.iter().map(|&x| x as f32).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (bi, bl) = (bytes(&ids_f), bytes(&logits));
    let views = [
        ("input_ids", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![ids.len()], &bi).unwrap()),
        ("logits", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![ids.len(), 71], &bl).unwrap()),
    ];
    std::fs::write(dir.path().join("parity_logits.safetensors"), safetensors::tensor::serialize(views, None).unwrap()).unwrap();
    let out = std::process::Command::new(&py).arg(fixtures().join("../make_lora_fixtures.py")).arg("--check-adapter").arg(dir.path()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("OK"), "PEFT check failed:\n{text}");
    eprintln!("{}", text.trim());
}
