//! LoRA: the adapter's forward against the merged model, its gradients against finite
//! differences, PEFT-layout save / load, and bad adapters.

use coa_model::lora::{Lora, LoraConfig, Target, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use coa_model::rng::random_ids;
use coa_model::{KvCache, Model, ModelConfig, Params, SaveDtype, Seq, TokenIds};

fn config() -> ModelConfig {
    config_of("qwen2") // q/k/v biases: the adapter adds to a biased layer too
}

/// `qwen3`: q/k norms, which the adapter's q and k terms pass through.
fn config_of(model_type: &str) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 97).unwrap();
    c.model_type = model_type.into();
    if model_type == "qwen3" {
        c.head_dim = Some(8);
        c.extra.insert("sliding_window".into(), serde_json::Value::Null);
    }
    c.architectures = vec![];
    c.hidden_size = 32;
    c.intermediate_size = 40;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.tie_word_embeddings = false;
    c.bos_token_id = Some(1);
    c.eos_token_id = Some(TokenIds::One(2));
    c.validate().unwrap();
    c
}

fn lora_config(dropout: f64) -> LoraConfig {
    LoraConfig { rank: 4, alpha: 8.0, dropout, targets: Target::ALL.to_vec() }
}

/// A model with an adapter whose B is nonzero (a fresh one adds nothing).
fn adapted(dropout: f64) -> Model {
    adapted_of("qwen2", dropout)
}

fn adapted_of(model_type: &str, dropout: f64) -> Model {
    let mut m = Model::init(config_of(model_type), 11).unwrap();
    let mut lora = Lora::init(&m.config, lora_config(dropout), 5).unwrap();
    for t in lora.params.iter_mut() {
        let n = t.data.len();
        for (i, x) in t.data.iter_mut().enumerate() {
            *x += 0.1 * (((i * 7919 + n) % 101) as f32 / 50.0 - 1.0);
        }
    }
    m.lora = Some(lora);
    m
}

/// SFT loss and adapter gradients of one sequence (a training forward: dropout on).
fn sft(m: &Model, ids: &[u32]) -> (Params, f64) {
    let n = (ids.len() - 1) as f32;
    let mut g = m.lora.as_ref().unwrap().params.zeros_like();
    let st = m
        .forward_backward(&Seq::new(ids), &mut g, &mut |s| {
            let mut d = vec![-1.0 / n; s.logp.len()];
            d[0] = 0.0;
            d
        })
        .unwrap();
    (g, -st.logp.iter().map(|&x| x as f64).sum::<f64>() / n as f64)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn fresh_adapter_changes_nothing_and_a_is_kaiming_uniform() {
    let mut m = Model::init(config(), 3).unwrap();
    let ids = random_ids(12, 97, 1);
    let base = m.logits(&Seq::new(&ids)).unwrap();
    let lora = Lora::init(&m.config, LoraConfig { rank: 8, alpha: 16.0, dropout: 0.0, targets: Target::peft_default() }, 0).unwrap();
    // q_proj and v_proj of each layer, A then B
    assert_eq!(lora.params.len(), 2 * 2 * 2);
    let a = &lora.params.tensors[0];
    assert_eq!(a.name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    assert_eq!(a.shape, vec![8, 32]);
    let bound = 1.0 / (32f32).sqrt();
    assert!(a.data.iter().all(|x| x.abs() <= bound) && a.data.iter().any(|x| x.abs() > 0.8 * bound));
    assert!(lora.params.tensors[1].data.iter().all(|&x| x == 0.0));
    assert_eq!(lora.params.tensors[1].shape, vec![32, 8]);
    m.lora = Some(lora);
    assert_eq!(m.logits(&Seq::new(&ids)).unwrap(), base);
}

#[test]
fn adapted_forward_equals_the_merged_model() {
    let m = adapted(0.0);
    let ids = random_ids(16, 97, 2);
    let with = m.logits(&Seq::new(&ids)).unwrap();
    let mut merged = m.clone();
    merged.merge_lora().unwrap();
    assert!(merged.lora.is_none());
    let plain = merged.logits(&Seq::new(&ids)).unwrap();
    let mut base = m.clone();
    base.lora = None;
    let b = base.logits(&Seq::new(&ids)).unwrap();
    assert!(max_diff(&with, &b) > 1e-2, "the adapter must change the logits");
    assert!(max_diff(&with, &plain) < 1e-4, "merged vs adapter: {}", max_diff(&with, &plain));
}

#[test]
fn adapter_gradients_match_finite_differences() {
    for (mt, dropout) in [("qwen2", 0.0), ("qwen2", 0.3), ("qwen3", 0.0)] {
        let mut m = adapted_of(mt, dropout);
        assert_eq!(m.params.get("model.layers.0.self_attn.q_norm.weight").is_some(), mt == "qwen3");
        m.lora.as_ref().unwrap().set_dropout_seed(42);
        let ids = random_ids(10, 97, 3);
        let (g, _) = sft(&m, &ids);
        assert_eq!(g.len(), 2 * 7 * 2, "one gradient per A and B, none for the base");
        for ti in 0..g.len() {
            let gt = g.tensors[ti].data.clone();
            let imax = (0..gt.len()).max_by(|&a, &b| gt[a].abs().total_cmp(&gt[b].abs())).unwrap();
            assert!(gt[imax] != 0.0, "{}: zero gradient", g.tensors[ti].name);
            for i in [imax, gt.len() / 2] {
                let h = 1e-2f32;
                let orig = m.lora.as_mut().unwrap().params.tensors[ti].data[i];
                m.lora.as_mut().unwrap().params.tensors[ti].data[i] = orig + h;
                let lp = sft(&m, &ids).1;
                m.lora.as_mut().unwrap().params.tensors[ti].data[i] = orig - h;
                let lm = sft(&m, &ids).1;
                m.lora.as_mut().unwrap().params.tensors[ti].data[i] = orig;
                let num = (lp - lm) / (2.0 * h as f64);
                let ana = gt[i] as f64;
                assert!((num - ana).abs() <= 3e-3 * gt[imax].abs() as f64 + 1e-5, "{mt} dropout {dropout} {}[{i}]: analytic {ana} vs numeric {num}", g.tensors[ti].name);
            }
        }
    }
}

#[test]
fn dropout_is_seeded_and_off_outside_training() {
    let m = adapted(0.5);
    let lora = m.lora.as_ref().unwrap();
    let ids = random_ids(12, 97, 4);
    lora.set_dropout_seed(1);
    let (g1, l1) = sft(&m, &ids);
    let (g1b, l1b) = sft(&m, &ids);
    assert_eq!((g1.clone(), l1), (g1b, l1b), "same seed, same masks");
    lora.set_dropout_seed(2);
    let (g2, l2) = sft(&m, &ids);
    assert!(l1 != l2 && g1 != g2, "another seed, other masks");
    // evaluation (logits, token stats) applies no dropout: equal to the dropout-free adapter's
    let mut nodrop = m.clone();
    nodrop.lora.as_mut().unwrap().config.dropout = 0.0;
    assert_eq!(m.logits(&Seq::new(&ids)).unwrap(), nodrop.logits(&Seq::new(&ids)).unwrap());
}

#[test]
fn base_gradients_are_refused_with_an_adapter_and_decoding_needs_a_merge() {
    let m = adapted(0.0);
    let ids = random_ids(8, 97, 5);
    let mut g = m.params.zeros_like();
    let e = m.forward_backward(&Seq::new(&ids), &mut g, &mut |s| vec![0.0; s.logp.len()]).unwrap_err();
    assert!(format!("{e:#}").contains("LoRA"), "{e:#}");
    let mut cache = KvCache::new(&m.config, 1, 16).unwrap();
    let e = m.prefill(&mut cache, 0, &ids).unwrap_err();
    assert!(format!("{e:#}").contains("merge"), "{e:#}");
    let mut merged = m.clone();
    merged.merge_lora().unwrap();
    let mut cache = KvCache::new(&merged.config, 1, 16).unwrap();
    let last = merged.prefill(&mut cache, 0, &ids).unwrap();
    let full = m.logits(&Seq::new(&ids)).unwrap();
    assert!(max_diff(&last, &full[(ids.len() - 1) * 97..]) < 1e-3);
}

#[test]
fn save_load_in_peft_layout_and_merge_on_load() {
    let m = adapted(0.1);
    let dir = tempfile::tempdir().unwrap();
    m.save(dir.path(), SaveDtype::F32).unwrap();
    m.lora.as_ref().unwrap().save(dir.path(), "some/base").unwrap();
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join(ADAPTER_CONFIG)).unwrap()).unwrap();
    assert_eq!(cfg["peft_type"], "LORA");
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["lora_alpha"], 8.0);
    assert_eq!(cfg["task_type"], "CAUSAL_LM");
    assert_eq!(cfg["target_modules"].as_array().unwrap().len(), 7);
    let kept = Model::load_with_adapter(dir.path()).unwrap();
    assert_eq!(kept.lora.as_ref().unwrap(), m.lora.as_ref().unwrap());
    assert_eq!(kept.params, m.params);
    let merged = Model::load(dir.path()).unwrap();
    assert!(merged.lora.is_none());
    let mut want = m.clone();
    want.merge_lora().unwrap();
    assert_eq!(merged.params, want.params);
    // an adapter directory without a model loads its base from base_model_name_or_path,
    // relative to the adapter
    let ad = dir.path().join("adapter");
    m.lora.as_ref().unwrap().save(&ad, "..").unwrap();
    assert_eq!(Model::load(&ad).unwrap().params, want.params);
}

#[test]
fn bad_adapters_are_errors_naming_the_field_or_tensor() {
    let m = adapted(0.0);
    let lora = m.lora.as_ref().unwrap();
    let dir = tempfile::tempdir().unwrap();
    m.save(dir.path(), SaveDtype::F32).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        lora.save(dir.path(), "x").unwrap();
        let p = dir.path().join(ADAPTER_CONFIG);
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, v.to_string()).unwrap();
        format!("{:#}", Model::load(dir.path()).unwrap_err())
    };
    let e = edit(&|v| v["peft_type"] = "IA3".into());
    assert!(e.contains("peft_type") && e.contains("IA3"), "{e}");
    let e = edit(&|v| v["bias"] = "all".into());
    assert!(e.contains("bias"), "{e}");
    let e = edit(&|v| v["use_dora"] = true.into());
    assert!(e.contains("use_dora"), "{e}");
    let e = edit(&|v| v["target_modules"] = serde_json::json!(["q_proj", "qkv"]));
    assert!(e.contains("target_modules") && e.contains("qkv"), "{e}");
    let e = edit(&|v| v["r"] = 0.into());
    assert!(e.contains("rank"), "{e}");
    // the config says rank 8, the tensors are rank 4
    let e = edit(&|v| v["r"] = 8.into());
    assert!(e.contains("lora_A.weight") && e.contains("[8, 32]"), "{e}");
    // fewer targets than tensors: the extra one is named
    let e = edit(&|v| v["target_modules"] = serde_json::json!(["q_proj"]));
    assert!(e.contains("unexpected tensor"), "{e}");
    lora.save(dir.path(), "x").unwrap();
    std::fs::write(dir.path().join(ADAPTER_WEIGHTS), b"junk").unwrap();
    let e = format!("{:#}", Model::load(dir.path()).unwrap_err());
    assert!(e.contains(ADAPTER_WEIGHTS), "{e}");
    assert!(format!("{:#}", Target::parse_list("q_proj,foo").unwrap_err()).contains("foo"));
}
