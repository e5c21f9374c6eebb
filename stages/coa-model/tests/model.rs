//! Model-level tests: config, init, save/load round trips, accumulation, bad input.

use std::path::Path;

use coa_model::rng::random_ids;
use coa_model::{param_specs, parse_size, Model, ModelConfig, Params, SaveDtype, SaveFormat, Seq, TokenIds};
use serde_json::Value;

fn small_config(model_type: &str, tied: bool) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 97).unwrap();
    c.model_type = model_type.to_string();
    c.architectures = vec![];
    c.hidden_size = 32;
    c.intermediate_size = 40;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.tie_word_embeddings = tied;
    c.bos_token_id = Some(1);
    c.eos_token_id = Some(TokenIds::One(2));
    c.validate().unwrap();
    c
}

fn sft_grads(m: &Model, ids: &[u32]) -> (Params, f64) {
    let n = (ids.len() - 1) as f32;
    let mut g = m.params.zeros_like();
    let st = m
        .forward_backward(&Seq::new(ids), &mut g, &mut |s| {
            let mut d = vec![-1.0 / n; s.logp.len()];
            d[0] = 0.0;
            d
        })
        .unwrap();
    let loss = -st.logp.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    (g, loss)
}

#[test]
fn presets_are_valid_and_sized() {
    let tiny = ModelConfig::preset("tiny", 4096).unwrap();
    let small = ModelConfig::preset("small", 8192).unwrap();
    assert!((1_000_000..3_000_000).contains(&tiny.n_params()), "tiny {}", tiny.n_params());
    assert!((20_000_000..30_000_000).contains(&small.n_params()), "small {}", small.n_params());
    assert_eq!(tiny.num_attention_heads % tiny.num_key_value_heads, 0);
    assert!(tiny.num_key_value_heads < tiny.num_attention_heads, "GQA");
    let m = Model::init(tiny.clone(), 0).unwrap();
    assert_eq!(m.params.n_elements(), tiny.n_params());
    let e = ModelConfig::preset("huge", 10).unwrap_err().to_string();
    assert!(e.contains("huge"), "{e}");
}

#[test]
fn init_is_deterministic_and_hf_style() {
    let c = small_config("qwen2", false);
    let a = Model::init(c.clone(), 7).unwrap();
    let b = Model::init(c.clone(), 7).unwrap();
    let d = Model::init(c.clone(), 8).unwrap();
    assert_eq!(a.params, b.params);
    assert_ne!(a.params, d.params);
    let w = &a.params.get("model.layers.0.mlp.up_proj.weight").unwrap().data;
    let mean = w.iter().map(|&x| x as f64).sum::<f64>() / w.len() as f64;
    let std = (w.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
    assert!(mean.abs() < 0.002 && (std - 0.02).abs() < 0.002, "mean {mean} std {std}");
    assert!(a.params.get("model.norm.weight").unwrap().data.iter().all(|&x| x == 1.0));
    assert!(a.params.get("model.layers.1.self_attn.q_proj.bias").unwrap().data.iter().all(|&x| x == 0.0));
    assert!(a.params.get("model.layers.1.self_attn.o_proj.bias").is_none(), "qwen2 has no o_proj bias");
    assert!(a.params.get("lm_head.weight").is_some());
    let names: Vec<String> = param_specs(&c).into_iter().map(|s| s.name).collect();
    assert_eq!(names.first().unwrap(), "model.embed_tokens.weight");
    assert_eq!(names.last().unwrap(), "lm_head.weight");
}

#[test]
fn stats_match_logits_and_segment_starts_are_zero() {
    let m = Model::init(small_config("llama", true), 3).unwrap();
    let x = random_ids(12, 97, 1);
    let seg = [0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2];
    let seq = Seq { input_ids: &x, segment_ids: Some(&seg), shared_prefix: 0 };
    let logits = m.logits(&seq).unwrap();
    let st = m.token_stats(&seq).unwrap();
    let v = 97;
    for t in 0..x.len() {
        if t == 0 || seg[t] != seg[t - 1] {
            assert_eq!((st.logp[t], st.entropy[t]), (0.0, 0.0), "segment start {t}");
            continue;
        }
        let row: Vec<f64> = logits[(t - 1) * v..t * v].iter().map(|&z| z as f64).collect();
        let lse = row.iter().map(|z| z.exp()).sum::<f64>().ln();
        assert!((st.logp[t] as f64 - (row[x[t] as usize] - lse)).abs() < 1e-5);
        let h = -row.iter().map(|z| (z - lse).exp() * (z - lse)).sum::<f64>();
        assert!((st.entropy[t] as f64 - h).abs() < 1e-5);
    }
    // forward_backward returns the same stats
    let mut g = m.params.zeros_like();
    let st2 = m.forward_backward(&seq, &mut g, &mut |s| vec![0.0; s.logp.len()]).unwrap();
    assert_eq!(st, st2);
    assert_eq!(g.sum_squares(), 0.0, "zero d loss / d logp gives zero gradients");
}

#[test]
fn gradients_accumulate_and_are_deterministic() {
    let m = Model::init(small_config("llama", false), 5).unwrap();
    let x = random_ids(16, 97, 2);
    let (g1, loss) = sft_grads(&m, &x);
    assert!(loss > 3.0 && loss < 6.0, "near ln(97) at init: {loss}");
    let (g1b, _) = sft_grads(&m, &x);
    assert_eq!(g1, g1b, "bit-identical across runs");
    let mut acc = g1.clone();
    m.forward_backward(&Seq::new(&x), &mut acc, &mut |s| {
        let n = (s.logp.len() - 1) as f32;
        let mut d = vec![-1.0 / n; s.logp.len()];
        d[0] = 0.0;
        d
    })
    .unwrap();
    let mut twice = g1.clone();
    twice.scale(2.0);
    for (a, b) in acc.iter().zip(twice.iter()) {
        assert!(a.data.iter().zip(&b.data).all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1e-3)), "{}", a.name);
    }
}

#[test]
fn bf16_matmuls_train_near_the_f32_model() {
    // MatmulDtype::Bf16 rounds both inputs of every linear layer's and the head's products (on
    // AMX tiles where the CPU has them): the loss and each gradient tensor stay near f32's (cosine
    // > 0.999, norm within 2%), not equal to them; the run is deterministic, and a step along the
    // bf16 gradient lowers the f32 loss as the f32 step does.
    for (mt, tied) in [("llama", false), ("qwen2", true)] {
        let mut m = Model::init(small_config(mt, tied), 5).unwrap();
        // Larger weights: products far from rounding noise, logits far from uniform.
        m.params.iter_mut().filter(|t| t.shape.len() == 2).for_each(|t| t.data.iter_mut().for_each(|x| *x *= 4.0));
        let x = random_ids(70, 97, 2);
        let (g32, loss32) = sft_grads(&m, &x);
        let mut mb = m.clone();
        mb.matmul = coa_model::MatmulDtype::Bf16;
        let (g16, loss16) = sft_grads(&mb, &x);
        assert_eq!(g16, sft_grads(&mb, &x).0, "{mt}: bf16 products are deterministic");
        assert!(loss16 != loss32 && (loss16 - loss32).abs() < 0.01 * loss32, "{mt}: loss {loss16} against f32's {loss32}");
        for (a, b) in g16.iter().zip(g32.iter()) {
            let dot: f64 = a.data.iter().zip(&b.data).map(|(x, y)| *x as f64 * *y as f64).sum();
            let (na, nb) = (a.data.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt(), b.data.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt());
            if nb == 0.0 {
                continue;
            }
            let cos = dot / (na * nb);
            assert!(cos > 0.999 && (na / nb - 1.0).abs() < 0.02, "{mt} {}: cosine {cos:.5}, norm ratio {:.4}", a.name, na / nb);
        }
        let step = |g: &Params| {
            let mut s = m.clone();
            s.params.iter_mut().zip(g.iter()).for_each(|(p, g)| p.data.iter_mut().zip(&g.data).for_each(|(w, d)| *w -= 0.05 * d));
            sft_grads(&s, &x).1
        };
        let (after32, after16) = (step(&g32), step(&g16));
        assert!(after16 < loss32 && (after16 - after32).abs() < 0.01 * loss32, "{mt}: {loss32} -> {after16} (f32 gradient: {after32})");
        eprintln!("{mt}: loss {loss32:.5} f32, {loss16:.5} bf16 products; after one step {after32:.5} / {after16:.5}");
    }
}

#[test]
fn gradient_matches_finite_difference_of_loss() {
    // Whole-model check: d loss / d θ for a few coordinates of several tensors.
    let mut m = Model::init(small_config("qwen2", false), 11).unwrap();
    for t in m.params.iter_mut() {
        let n = t.data.len();
        for (i, x) in t.data.iter_mut().enumerate() {
            *x += 0.05 * (((i * 7919 + n) % 101) as f32 / 50.0 - 1.0);
        }
    }
    let x = random_ids(10, 97, 3);
    let (g, _) = sft_grads(&m, &x);
    for name in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.bias",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "lm_head.weight",
    ] {
        let ti = m.params.tensors.iter().position(|t| t.name == name).unwrap();
        let gt = &g.tensors[ti].data;
        // the coordinate with the largest gradient, and one in the middle
        let imax = (0..gt.len()).max_by(|&a, &b| gt[a].abs().total_cmp(&gt[b].abs())).unwrap();
        for i in [imax, gt.len() / 2] {
            let h = 1e-2f32;
            let orig = m.params.tensors[ti].data[i];
            m.params.tensors[ti].data[i] = orig + h;
            let lp = sft_grads(&m, &x).1;
            m.params.tensors[ti].data[i] = orig - h;
            let lm = sft_grads(&m, &x).1;
            m.params.tensors[ti].data[i] = orig;
            let num = (lp - lm) / (2.0 * h as f64);
            let ana = gt[i] as f64;
            assert!((num - ana).abs() <= 2e-3 * gt[imax].abs() as f64 + 1e-5, "{name}[{i}]: analytic {ana} vs numeric {num}");
        }
    }
}

#[test]
fn save_load_round_trip_f32_and_bf16() {
    for (mt, tied) in [("llama", true), ("qwen2", false)] {
        let m = Model::init(small_config(mt, tied), 9).unwrap();
        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path(), SaveDtype::F32).unwrap();
        let back = Model::load(dir.path()).unwrap();
        assert_eq!(back.params, m.params, "{mt}: f32 round trip is exact");
        assert_eq!(back.config, {
            let mut c = m.config.clone();
            c.torch_dtype = Some("float32".into());
            c.architectures = back.config.architectures.clone();
            c
        });
        let cfg: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["model_type"], mt);
        assert_eq!(cfg["architectures"][0], if mt == "qwen2" { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" });
        let gen: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("generation_config.json")).unwrap()).unwrap();
        assert_eq!(gen["eos_token_id"], 2);
        let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(meta.metadata().as_ref().unwrap().get("format").map(String::as_str), Some("pt"));
        assert_eq!(meta.tensors().contains_key("lm_head.weight"), !tied);
        // no temporary files left behind
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(!n.contains(".tmp."), "{n}");
        }

        let dir2 = tempfile::tempdir().unwrap();
        m.save(dir2.path(), SaveDtype::Bf16).unwrap();
        let b16 = Model::load(dir2.path()).unwrap();
        assert_eq!(b16.config.torch_dtype.as_deref(), Some("bfloat16"));
        for (a, b) in b16.params.iter().zip(m.params.iter()) {
            for (x, y) in a.data.iter().zip(&b.data) {
                assert!((x - y).abs() <= y.abs() * (1.0 / 256.0), "{}: {x} vs {y}", a.name);
            }
        }
        // bf16 logits stay close to f32 logits
        let x = random_ids(8, 97, 4);
        let l32 = m.logits(&Seq::new(&x)).unwrap();
        let l16 = b16.logits(&Seq::new(&x)).unwrap();
        let err = l32.iter().zip(&l16).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 0.05, "{err}");
    }
}

#[test]
fn loads_f16_and_sharded_checkpoints() {
    let m = Model::init(small_config("llama", false), 12).unwrap();
    let dir = tempfile::tempdir().unwrap();
    m.save(dir.path(), SaveDtype::F32).unwrap();
    // rewrite as two f16 shards with an index
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    let halves = names.split_at(names.len() / 2);
    for (k, part) in [halves.0, halves.1].into_iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", k + 1);
        let enc: Vec<(String, Vec<usize>, Vec<u8>)> = part
            .iter()
            .map(|n| {
                let t = m.params.get(n).unwrap();
                let b = t.data.iter().flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes()).collect();
                weight_map.insert(n.clone(), Value::from(file.clone()));
                (n.clone(), t.shape.clone(), b)
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = enc
            .iter()
            .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F16, s.clone(), b).unwrap()))
            .collect();
        std::fs::write(dir.path().join(&file), safetensors::tensor::serialize(views, None).unwrap()).unwrap();
    }
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let back = Model::load(dir.path()).unwrap();
    for (a, b) in back.params.iter().zip(m.params.iter()) {
        for (x, y) in a.data.iter().zip(&b.data) {
            assert!((x - y).abs() <= y.abs() / 1000.0 + 1e-7, "{}", a.name);
        }
    }
}

/// The shard files and the index of a checkpoint directory, sorted.
fn weight_file_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("model"))
        .collect();
    v.sort();
    v
}

/// A Python with huggingface_hub and safetensors (what transformers installs): .venv-hf.
fn hub_python() -> Option<std::path::PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-hf/bin/python");
    let ok = std::process::Command::new(&p).args(["-c", "import huggingface_hub, safetensors, numpy"]).output();
    ok.is_ok_and(|o| o.status.success()).then_some(p)
}

/// Issue 47: weights bigger than the shard size are written as `save_pretrained` writes them
/// (model-0000I-of-0000N.safetensors and model.safetensors.index.json, a tensor bigger than the
/// limit alone in its file), load back exactly, and a later save in the other layout leaves no
/// stale weights for the loader to pick.
#[test]
fn big_weights_save_as_shards_with_an_index_and_load_back() {
    let m = Model::init(small_config("llama", false), 13).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The embedding and lm_head (12,416 bytes each) are larger than the limit; the rest packs.
    const LIMIT: u64 = 10_000;
    m.save(dir.path(), SaveFormat { dtype: SaveDtype::F32, max_shard_bytes: LIMIT }).unwrap();
    let names = weight_file_names(dir.path());
    let n = names.len() - 1;
    assert!(n >= 4 && !names.contains(&"model.safetensors".to_string()), "{names:?}");
    assert_eq!(names[n], "model.safetensors.index.json");
    for (i, f) in names[..n].iter().enumerate() {
        assert_eq!(f, &format!("model-{:05}-of-{n:05}.safetensors", i + 1));
        let bytes = std::fs::read(dir.path().join(f)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let payload: usize = st.tensors().iter().map(|(_, v)| v.data().len()).sum();
        assert!(payload as u64 <= LIMIT || st.len() == 1, "{f}: {payload} bytes in {} tensors", st.len());
    }
    let index: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap()).unwrap();
    let total: usize = m.params.iter().map(|t| t.data.len() * 4).sum();
    assert_eq!(index["metadata"]["total_size"], total as u64);
    assert_eq!(index["weight_map"].as_object().unwrap().len(), m.params.len());
    let back = Model::load(dir.path()).unwrap();
    for (a, b) in back.params.iter().zip(m.params.iter()) {
        assert_eq!((&a.name, &a.data), (&b.name, &b.data));
    }
    match hub_python() {
        Some(py) => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/hf/check_sharded.py");
            let order: Vec<&str> = m.params.iter().map(|t| t.name.as_str()).collect();
            let mut child = std::process::Command::new(py)
                .arg(script)
                .arg(dir.path())
                .arg(LIMIT.to_string())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child.stdin.take().unwrap().write_all(serde_json::to_string(&order).unwrap().as_bytes()).unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success() && out.stdout.starts_with(b"ok"), "huggingface_hub disagrees: {}", String::from_utf8_lossy(&out.stderr));
        }
        None => eprintln!("skipped: the huggingface_hub check of the shards: no .venv-hf (make hf-venv)"),
    }
    // Another limit: other shards, none of the old count left.
    m.save(dir.path(), SaveFormat { dtype: SaveDtype::Bf16, max_shard_bytes: 6_000 }).unwrap();
    let again = weight_file_names(dir.path());
    let m2 = again.len() - 1;
    assert!(m2 != n && again[..m2].iter().all(|f| f.ends_with(&format!("-of-{m2:05}.safetensors"))), "{again:?}");
    let b16 = Model::load(dir.path()).unwrap();
    for (a, b) in b16.params.iter().zip(m.params.iter()) {
        let want: Vec<f32> = b.data.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect();
        assert_eq!(a.data, want, "{}", a.name);
    }
    // Small enough for one file: model.safetensors alone, the index and shards gone.
    m.save(dir.path(), SaveDtype::F32).unwrap();
    assert_eq!(weight_file_names(dir.path()), ["model.safetensors"]);
    assert_eq!(Model::load(dir.path()).unwrap().params.tensors[3].data, m.params.tensors[3].data);
}

#[test]
fn shard_sizes_are_read_as_transformers_spells_them() {
    assert_eq!(parse_size("5GB").unwrap(), 5_000_000_000);
    assert_eq!(parse_size("500mb").unwrap(), 500_000_000);
    assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
    assert_eq!(parse_size("10KiB").unwrap(), 10_240);
    assert_eq!(parse_size("123").unwrap(), 123);
    for bad in ["", "GB", "5XB", "-1", "1.5GB", "0", "0MB", "99999999999999GB"] {
        let e = err_of(parse_size(bad));
        assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
    }
}

fn err_of<T: std::fmt::Debug>(r: anyhow::Result<T>) -> String {
    format!("{:#}", r.unwrap_err())
}

#[test]
fn bad_ids_are_errors_naming_position() {
    let m = Model::init(small_config("llama", true), 1).unwrap();
    let e = err_of(m.check_ids(&[1, 2, 97, 3]));
    assert!(e.contains("position 2") && e.contains("97"), "{e}");
    let e = err_of(m.logits(&Seq::new(&[5, 1000])));
    assert!(e.contains("position 1") && e.contains("1000"), "{e}");
    let mut g = m.params.zeros_like();
    let e = err_of(m.forward_backward(&Seq::new(&[5, 99]), &mut g, &mut |s| vec![0.0; s.logp.len()]));
    assert!(e.contains("99"), "{e}");
    let e = err_of(m.logits(&Seq::new(&[])));
    assert!(e.contains("empty"), "{e}");
    let e = err_of(m.logits(&Seq { input_ids: &[1, 2, 3], segment_ids: Some(&[0, 0]), shared_prefix: 0 }));
    assert!(e.contains("segment_ids"), "{e}");
    let e = err_of(m.forward_backward(&Seq::new(&[1, 2, 3]), &mut g, &mut |_| vec![0.0; 2]));
    assert!(e.contains("length 2"), "{e}");
    let e = err_of(m.forward_backward(&Seq::new(&[1, 2, 3]), &mut g, &mut |_| vec![0.0, f32::NAN, 0.0]));
    assert!(e.contains("position 1"), "{e}");
    let mut wrong = Model::init(small_config("llama", false), 1).unwrap().params.zeros_like();
    let e = err_of(m.forward_backward(&Seq::new(&[1, 2, 3]), &mut wrong, &mut |s| vec![0.0; s.logp.len()]));
    assert!(e.contains("grads"), "{e}");
}

#[test]
fn bad_configs_are_errors_naming_the_field() {
    let base = small_config("llama", true);
    let cases: Vec<(Box<dyn Fn(&mut ModelConfig)>, &str)> = vec![
        (Box::new(|c| c.num_attention_heads = 5), "num_attention_heads"),
        (Box::new(|c| c.num_key_value_heads = 3), "num_key_value_heads"),
        (Box::new(|c| c.hidden_size = 36), "head_dim"), // 36 / 4 = 9: odd head dim
        (Box::new(|c| c.vocab_size = 0), "vocab_size"),
        (Box::new(|c| c.model_type = "gpt2".into()), "model_type"),
        (Box::new(|c| c.hidden_act = "gelu".into()), "hidden_act"),
        (Box::new(|c| c.rms_norm_eps = -1.0), "rms_norm_eps"),
        (Box::new(|c| c.rope_theta = 0.0), "rope_theta"),
        (Box::new(|c| c.num_hidden_layers = 0), "num_hidden_layers"),
        (
            Box::new(|c| {
                c.extra.insert("rope_scaling".into(), serde_json::json!({"rope_type": "yarn", "factor": 4.0}));
            }),
            "rope_scaling",
        ),
    ];
    for (f, field) in cases {
        let mut c = base.clone();
        f(&mut c);
        let e = err_of(c.validate());
        assert!(e.contains(field), "expected an error naming {field}: {e}");
        let e = err_of(Model::init(c, 0));
        assert!(e.contains(field), "{e}");
    }
    // config.json parsing errors name the field
    let e = err_of(ModelConfig::from_json(&serde_json::json!({"model_type": "llama", "hidden_size": 8})));
    assert!(e.contains("vocab_size"), "{e}");
    let e = err_of(ModelConfig::from_json(&serde_json::json!({
        "model_type": "llama", "vocab_size": "many", "hidden_size": 8})));
    assert!(e.contains("vocab_size"), "{e}");
}

#[test]
fn config_json_round_trip_keeps_unknown_fields() {
    let text = r#"{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":100,
      "hidden_size":16,"intermediate_size":24,"num_hidden_layers":1,"num_attention_heads":2,
      "num_key_value_heads":1,"rope_parameters":{"rope_theta":1000000.0,"rope_type":"default"},
      "dtype":"bfloat16","sliding_window":4096,"use_sliding_window":false,"eos_token_id":[5,6],
      "my_field":{"a":1}}"#;
    let c: ModelConfig = serde_json::from_str(text).unwrap();
    c.validate().unwrap();
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    assert_eq!(c.eos_token_id, Some(TokenIds::Many(vec![5, 6])));
    assert!(c.qkv_bias() && !c.o_bias());
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(v["my_field"]["a"], 1);
    assert_eq!(v["sliding_window"], 4096);
    assert_eq!(v["eos_token_id"], serde_json::json!([5, 6]));
    let back: ModelConfig = serde_json::from_value(v).unwrap();
    assert_eq!(back, c);
}

fn write_model(dir: &Path, m: &Model) {
    m.save(dir, SaveDtype::F32).unwrap();
}

/// Rewrite model.safetensors with `edit` applied to the (name, shape, data) list.
fn rewrite(dir: &Path, m: &Model, edit: impl Fn(&mut Vec<(String, Vec<usize>, Vec<f32>)>)) {
    let mut ts: Vec<(String, Vec<usize>, Vec<f32>)> =
        m.params.iter().map(|t| (t.name.clone(), t.shape.clone(), t.data.clone())).collect();
    edit(&mut ts);
    let enc: Vec<(String, Vec<usize>, Vec<u8>)> =
        ts.into_iter().map(|(n, s, d)| (n, s, d.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = enc
        .iter()
        .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::tensor::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn bad_checkpoints_are_errors_naming_the_tensor() {
    let m = Model::init(small_config("llama", false), 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &m);

    rewrite(dir.path(), &m, |ts| ts.retain(|t| t.0 != "model.layers.1.mlp.up_proj.weight"));
    let e = err_of(Model::load(dir.path()));
    assert!(e.contains("missing tensor model.layers.1.mlp.up_proj.weight") && e.contains("[40, 32]"), "{e}");

    rewrite(dir.path(), &m, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "model.layers.0.self_attn.k_proj.weight").unwrap();
        t.1 = vec![t.1[1], t.1[0]];
    });
    let e = err_of(Model::load(dir.path()));
    assert!(e.contains("model.layers.0.self_attn.k_proj.weight") && e.contains("expected [16, 32]"), "{e}");

    rewrite(dir.path(), &m, |ts| ts.push(("model.layers.7.mlp.up_proj.weight".into(), vec![2], vec![0.0, 0.0])));
    let e = err_of(Model::load(dir.path()));
    assert!(e.contains("unexpected tensor model.layers.7.mlp.up_proj.weight"), "{e}");

    rewrite(dir.path(), &m, |ts| ts.retain(|t| t.0 != "lm_head.weight"));
    let e = err_of(Model::load(dir.path()));
    assert!(e.contains("lm_head.weight"), "untied model without a head: {e}");

    rewrite(dir.path(), &m, |ts| ts[3].2[5] = f32::NAN);
    let e = err_of(Model::load(dir.path()));
    assert!(e.contains("non-finite"), "{e}");

    std::fs::write(dir.path().join("model.safetensors"), b"not a safetensors file").unwrap();
    let e = err_of(Model::load(dir.path()));
    assert!(e.contains("model.safetensors"), "{e}");

    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let e = err_of(Model::load(dir.path()));
    assert!(e.contains("neither model.safetensors"), "{e}");

    let e = err_of(Model::load(&dir.path().join("nope")));
    assert!(e.contains("config.json"), "{e}");

    // a config the model cannot build
    write_model(dir.path(), &m);
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
    cfg["num_key_value_heads"] = Value::from(3);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let e = err_of(Model::load(dir.path()));
    assert!(e.contains("num_key_value_heads"), "{e}");
}

#[test]
fn tied_checkpoint_with_lm_head_is_accepted() {
    let m = Model::init(small_config("llama", true), 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &m);
    let emb = m.params.get("model.embed_tokens.weight").unwrap().clone();
    rewrite(dir.path(), &m, |ts| ts.push(("lm_head.weight".into(), emb.shape.clone(), emb.data.clone())));
    let back = Model::load(dir.path()).unwrap();
    assert_eq!(back.params, m.params);
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let m = Model::init(ModelConfig::preset("tiny", 300).unwrap(), 6).unwrap();
    let x = random_ids(150, 300, 9);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| sft_grads(&m, &x))
    };
    let (g1, l1) = run(1);
    let (g3, l3) = run(3);
    assert_eq!(l1.to_bits(), l3.to_bits());
    for (a, b) in g1.iter().zip(g3.iter()) {
        assert!(a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits()), "{}", a.name);
    }
}

#[test]
fn grow_vocab_starts_each_new_row_at_its_own_pieces_mean() {
    for tied in [true, false] {
        let mut m = Model::init(small_config("llama", tied), 7).unwrap();
        let before = m.clone();
        let pieces: Vec<Vec<u32>> = vec![vec![3, 10, 4], vec![3, 11, 12, 4], vec![50]];
        let mut calls = Vec::new();
        m.grow_vocab(100, &mut |id| {
            calls.push(id);
            Ok(pieces[(id - 97) as usize].clone())
        })
        .unwrap();
        assert_eq!(calls, vec![97, 98, 99]);
        assert_eq!(m.config.vocab_size, 100);
        let d = m.config.hidden_size;
        let heads: &[&str] = if tied { &["model.embed_tokens.weight"] } else { &["model.embed_tokens.weight", "lm_head.weight"] };
        for name in heads {
            let (old, new) = (&before.params.get(name).unwrap().data, &m.params.get(name).unwrap().data);
            assert_eq!(m.params.get(name).unwrap().shape, vec![100, d]);
            assert_eq!(&new[..97 * d], &old[..], "{name}: old rows unchanged");
            for (k, p) in pieces.iter().enumerate() {
                let row = &new[(97 + k) * d..(98 + k) * d];
                for j in 0..d {
                    let mean = p.iter().map(|&i| old[i as usize * d + j] as f64).sum::<f64>() / p.len() as f64;
                    assert!((row[j] as f64 - mean).abs() < 1e-6, "{name} row {k}");
                }
            }
            // rows of different pieces differ (no shared mean)
            assert_ne!(&new[97 * d..98 * d], &new[98 * d..99 * d]);
        }
        // the grown model trains and its ids up to 99 are valid
        let ids: Vec<u32> = vec![1, 97, 5, 98, 99, 2];
        let (g, loss) = sft_grads(&m, &ids);
        assert!(loss.is_finite());
        assert!(g.get("model.embed_tokens.weight").unwrap().data[97 * d..98 * d].iter().any(|&x| x != 0.0));
        // saved and loaded, vocab_size is the grown one
        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path(), SaveDtype::F32).unwrap();
        let back = Model::load(dir.path()).unwrap();
        assert_eq!(back.config.vocab_size, 100);
        assert_eq!(back.params, m.params);
    }
}

#[test]
fn grow_vocab_refuses_what_it_cannot_do() {
    let mut m = Model::init(small_config("llama", true), 7).unwrap();
    let err = |r: anyhow::Result<()>| format!("{:#}", r.unwrap_err());
    assert!(err(m.grow_vocab(50, &mut |_| Ok(vec![1]))).contains("shrink"));
    assert!(err(m.grow_vocab(99, &mut |_| Ok(vec![]))).contains("no base tokens"));
    assert!(err(m.grow_vocab(99, &mut |_| Ok(vec![97]))).contains("outside the checkpoint's vocabulary"));
    assert!(err(m.grow_vocab(99, &mut |id| anyhow::bail!("no pieces for {id}"))).contains("no pieces for 97"));
    assert_eq!(m.config.vocab_size, 97, "a failed growth changes nothing");
    m.grow_vocab(97, &mut |_| unreachable!()).unwrap();
}

#[test]
fn special_ids_go_into_both_hf_configs() {
    let mut m = Model::init(small_config("llama", true), 7).unwrap();
    m.config.set_special_ids(Some(5), Some(6), Some(6));
    let dir = tempfile::tempdir().unwrap();
    m.save(dir.path(), SaveDtype::F32).unwrap();
    let read = |f: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(dir.path().join(f)).unwrap()).unwrap() };
    for f in ["config.json", "generation_config.json"] {
        let c = read(f);
        assert_eq!((c["bos_token_id"].as_u64(), c["eos_token_id"].as_u64(), c["pad_token_id"].as_u64()), (Some(5), Some(6), Some(6)), "{f}");
    }
    // an EOS already in a list of end tokens keeps the list
    m.config.eos_token_id = Some(TokenIds::Many(vec![6, 8]));
    m.config.set_special_ids(None, Some(8), None);
    assert_eq!(m.config.eos_token_id, Some(TokenIds::Many(vec![6, 8])));
    m.config.set_special_ids(None, Some(9), None);
    assert_eq!(m.config.eos_token_id, Some(TokenIds::One(9)));
}

#[test]
fn llama3_rope_scaling_is_parsed_from_either_layout_and_refuses_others() {
    let base = r#""architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":50,"hidden_size":32,
        "intermediate_size":40,"num_hidden_layers":1,"num_attention_heads":4"#;
    let v4 = format!(r#"{{{base},"rope_theta":10000.0,"rope_scaling":{{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}}}}"#);
    let v5 = format!(r#"{{{base},"rope_parameters":{{"rope_type":"llama3","rope_theta":10000.0,"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}}}}"#);
    let a: ModelConfig = serde_json::from_str(&v4).unwrap();
    let b: ModelConfig = serde_json::from_str(&v5).unwrap();
    a.validate().unwrap();
    b.validate().unwrap();
    let s = a.rope_scaling().unwrap().unwrap();
    assert_eq!(Some(s), b.rope_scaling().unwrap());
    // hd 8, theta 1e4: wavelengths 6.3 (kept), 62.8 (smoothed), 628 and 6283 (divided by 8)
    let plain = coa_model::ops::rope_inv_freq(8, 1e4);
    let scaled = a.rope_inv_freq();
    assert_eq!(scaled[0], plain[0]);
    assert!(scaled[1] < plain[1] && scaled[1] > plain[1] / 8.0);
    assert!((scaled[2] - plain[2] / 8.0).abs() < 1e-12 && (scaled[3] - plain[3] / 8.0).abs() < 1e-12);
    // written back unchanged
    assert_eq!(serde_json::to_value(&a).unwrap()["rope_scaling"]["rope_type"], "llama3");
    let yarn = format!(r#"{{{base},"rope_scaling":{{"rope_type":"yarn","factor":4.0}}}}"#);
    let c: ModelConfig = serde_json::from_str(&yarn).unwrap();
    assert!(format!("{:#}", c.validate().unwrap_err()).contains("rope_scaling.rope_type"));
    let missing = format!(r#"{{{base},"rope_scaling":{{"rope_type":"llama3","factor":8.0}}}}"#);
    let c: ModelConfig = serde_json::from_str(&missing).unwrap();
    assert!(format!("{:#}", c.validate().unwrap_err()).contains("low_freq_factor"));
}

/// llama.cpp's per-frequency divisors (`rope_freqs.weight`): the inverse frequencies divided by
/// them; Llama 3's divisors fitted back to the scaling that makes them (Llama 3.1 and 3.2 sizes,
/// and the hd-8 fixture's, whose one smoothed frequency leaves high_freq_factor to convention);
/// divisors outside that formula fit nothing; bad lists are refused by name.
#[test]
fn rope_freq_factors_divide_and_llama3_ones_are_fitted_back() {
    let llama3 = |factor, orig| coa_model::Llama3Rope {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: orig,
    };
    for (hd, theta, r) in [(128, 5e5, llama3(8.0, 8192.0)), (64, 5e5, llama3(32.0, 8192.0)), (8, 1e4, llama3(8.0, 64.0))] {
        let inv = coa_model::ops::rope_inv_freq(hd, theta);
        let factors = r.factors(&inv);
        assert!(factors.iter().any(|&f| f > 1.0 && f < r.factor), "hd {hd}: no smoothed frequency");
        assert_eq!(coa_model::Llama3Rope::fit(&inv, &factors), Some(r), "hd {hd}");
        // Dividing by the factors is HF's scaling up to f32 rounding.
        for (a, b) in inv.iter().zip(&factors).map(|(f, d)| f / d).zip(r.apply(&inv)) {
            assert!((a - b).abs() <= 2e-7 * b, "hd {hd}: {a} vs {b}");
        }
    }
    let inv = coa_model::ops::rope_inv_freq(8, 1e4);
    assert_eq!(coa_model::Llama3Rope::fit(&inv, &[1.0, 3.0, 2.0, 8.0]), None, "not monotone: no llama3 scaling");
    assert_eq!(coa_model::Llama3Rope::fit(&inv, &[1.0; 4]), None);

    let base = r#""architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":50,"hidden_size":32,
        "intermediate_size":40,"num_hidden_layers":1,"num_attention_heads":4"#;
    let with = |factors: &str| -> ModelConfig {
        serde_json::from_str(&format!(r#"{{{base},"rope_theta":10000.0,"rope_freq_factors":{factors}}}"#)).unwrap()
    };
    let c = with("[1.0, 2.0, 4.0, 0.5]");
    c.validate().unwrap();
    let want: Vec<f32> = inv.iter().zip([1.0f32, 2.0, 4.0, 0.5]).map(|(f, d)| f / d).collect();
    assert_eq!(c.rope_inv_freq(), want);
    // The factors stand for the scaling: a rope_parameters beside them does not apply twice.
    let mut both = c.clone();
    both.extra.insert("rope_parameters".into(), serde_json::json!({"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}));
    assert_eq!(both.rope_inv_freq(), want);
    assert_eq!(serde_json::to_value(&c).unwrap()["rope_freq_factors"][1], 2.0, "written back");
    for (bad, says) in [("[1.0, 2.0, 4.0]", "has 3 factors"), ("[1.0, 2.0, 0.0, 1.0]", "positive numbers"), ("\"x\"", "positive numbers")] {
        let e = format!("{:#}", with(bad).validate().unwrap_err());
        assert!(e.contains("rope_freq_factors") && e.contains(says), "{bad}: {e}");
    }
}

/// Rows that share a prompt, packed as `prefix | tail 1 | tail 2 | …` with `shared_prefix`,
/// compute what each `prefix | tail k` computes alone: the token statistics of every tail, and
/// the sum of the rows' gradients. Sizes cross the 64-row attention blocks: a block holds the end
/// of the prefix and a tail, another two tails.
#[test]
fn shared_prefix_pack_equals_its_rows_alone() {
    for tied in [true, false] {
        let m = Model::init(small_config("llama", tied), 11).unwrap();
        let prefix = random_ids(70, 97, 1);
        let tails: Vec<Vec<u32>> = [30usize, 9, 50, 41].iter().enumerate().map(|(k, &n)| random_ids(n, 97, 10 + k as u64)).collect();
        // d loss / d logp: a fixed weight on every tail token but a tail's first
        let weight = |k: usize, j: usize| if j == 0 { 0.0 } else { -0.01 * (1.0 + ((k * 7 + j) % 5) as f32) };
        let mut alone_grads = m.params.zeros_like();
        let mut alone_stats = Vec::new();
        for (k, tail) in tails.iter().enumerate() {
            let ids = [prefix.clone(), tail.clone()].concat();
            let st = m
                .forward_backward(&Seq::new(&ids), &mut alone_grads, &mut |s| {
                    (0..s.logp.len()).map(|t| if t < prefix.len() { 0.0 } else { weight(k, t - prefix.len()) }).collect()
                })
                .unwrap();
            alone_stats.push(st);
        }
        let mut ids = prefix.clone();
        let mut seg = vec![0i32; prefix.len()];
        let mut offsets = Vec::new();
        for (k, tail) in tails.iter().enumerate() {
            offsets.push(ids.len());
            ids.extend_from_slice(tail);
            seg.resize(ids.len(), k as i32 + 1);
        }
        let seq = Seq { input_ids: &ids, segment_ids: Some(&seg), shared_prefix: prefix.len() };
        let mut packed_grads = m.params.zeros_like();
        let st = m
            .forward_backward(&seq, &mut packed_grads, &mut |s| {
                let mut d = vec![0f32; s.logp.len()];
                for (k, tail) in tails.iter().enumerate() {
                    for j in 0..tail.len() {
                        d[offsets[k] + j] = weight(k, j);
                    }
                }
                d
            })
            .unwrap();
        for (k, tail) in tails.iter().enumerate() {
            for j in 1..tail.len() {
                let (a, b) = (alone_stats[k].logp[prefix.len() + j], st.logp[offsets[k] + j]);
                assert!((a - b).abs() < 1e-5, "tied {tied}: tail {k} token {j}: logp {a} alone vs {b} packed");
            }
        }
        for (a, b) in alone_grads.tensors.iter().zip(&packed_grads.tensors) {
            let scale = a.data.iter().fold(0f32, |x, y| x.max(y.abs())).max(1e-12);
            let err = a.data.iter().zip(&b.data).fold(0f32, |x, (p, q)| x.max((p - q).abs()));
            assert!(err / scale < 1e-4, "tied {tied}: {}: rel err {}", a.name, err / scale);
        }
        // the same ids without the shared prefix are a different computation
        let plain = m.token_stats(&Seq { input_ids: &ids, segment_ids: Some(&seg), shared_prefix: 0 }).unwrap();
        assert!((plain.logp[offsets[1] + 3] - st.logp[offsets[1] + 3]).abs() > 1e-4);
    }
    // bad layouts are errors
    let m = Model::init(small_config("llama", true), 11).unwrap();
    let ids = random_ids(20, 97, 3);
    let seg: Vec<i32> = (0..20).map(|i| if i < 8 { 0 } else { 1 }).collect();
    for (prefix, segs, what) in [(5, Some(&seg[..]), "first segment"), (8, None, "needs segment ids"), (20, Some(&seg[..]), "first segment")] {
        let e = format!("{:#}", m.token_stats(&Seq { input_ids: &ids, segment_ids: segs, shared_prefix: prefix }).unwrap_err());
        assert!(e.contains(what), "{e}");
    }
}

#[test]
fn frozen_layers_get_no_gradient_and_the_layers_above_the_full_models() {
    let mut c = small_config("llama", false);
    c.num_hidden_layers = 3;
    let full = Model::init(c.clone(), 9).unwrap();
    let ids = random_ids(40, 97, 5);
    let (g_full, loss_full) = sft_grads(&full, &ids);
    let mut frozen = full.clone();
    frozen.frozen_layers = 2;
    let (g, loss) = sft_grads(&frozen, &ids);
    assert_eq!(loss, loss_full, "freezing changes the backward pass only");
    for (a, b) in g.tensors.iter().zip(&g_full.tensors) {
        let below = a.name == "model.embed_tokens.weight" || a.name.starts_with("model.layers.0.") || a.name.starts_with("model.layers.1.");
        if below {
            assert!(a.data.iter().all(|&x| x == 0.0), "{} is frozen but got a gradient", a.name);
        } else {
            assert!(a.data == b.data, "{}: the gradient above the frozen layers must be the full model's", a.name);
            assert!(a.data.iter().any(|&x| x != 0.0), "{} got no gradient", a.name);
        }
    }
    frozen.frozen_layers = 4;
    let mut g = frozen.params.zeros_like();
    let err = frozen.forward_backward(&Seq::new(&ids), &mut g, &mut |s| vec![0.0; s.logp.len()]).unwrap_err().to_string();
    assert!(err.contains("4 frozen layers, but the model has 3"), "{err}");
}

/// A workspace reused across calls (longer, shorter, packed with a shared prefix, with a head
/// mask, then frozen layers) gives bit for bit what a fresh one gives: nothing a call leaves in
/// the buffers leaks into the next.
#[test]
fn a_reused_workspace_changes_no_result() {
    let mut c = small_config("qwen2", true);
    c.num_hidden_layers = 3;
    let mut m = Model::init(c, 4).unwrap();
    let long = random_ids(300, 97, 1);
    let short = random_ids(37, 97, 2);
    let packed = random_ids(60, 97, 3);
    let seg: Vec<i32> = (0..60).map(|i| if i < 20 { 0 } else if i < 45 { 1 } else { 2 }).collect();
    let need: Vec<u8> = (0..60).map(|i| (i % 3 != 0) as u8).collect();
    let dloss = |s: &coa_model::TokenStats| -> Vec<f32> { s.logp.iter().enumerate().map(|(i, &l)| if l != 0.0 { -0.01 * (1 + i % 5) as f32 } else { 0.0 }).collect() };
    let mut ws = coa_model::Workspace::default();
    for frozen in [0, 2] {
        m.frozen_layers = frozen;
        let calls: [(&[u32], Option<&[i32]>, usize, Option<&[u8]>); 4] =
            [(&long, None, 0, None), (&short, None, 0, None), (&packed, Some(&seg), 20, Some(&need)), (&long, None, 0, None)];
        for (ids, seg, prefix, need) in calls {
            let seq = Seq { input_ids: ids, segment_ids: seg, shared_prefix: prefix };
            let mut fresh = m.params.zeros_like();
            let st_fresh = m.forward_backward_at(&seq, need, &mut fresh, &mut |s| dloss(s)).unwrap();
            let mut reused = m.params.zeros_like();
            let st_reused = m.forward_backward_in(&mut ws, &seq, need, &mut reused, &mut |s| dloss(s)).unwrap();
            assert_eq!(st_fresh, st_reused, "{} tokens, frozen {frozen}: stats", ids.len());
            for (a, b) in fresh.tensors.iter().zip(&reused.tensors) {
                assert!(a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits()), "{} tokens, frozen {frozen}: {}", ids.len(), a.name);
            }
        }
    }
}

/// A head whose logits are not all kept (a workspace with a small logits limit: row chunks, the
/// logits computed again in the backward) gives the stats and gradients of the kept head, for
/// a tied and an untied head, with a mask of needed tokens: over 256 rows, so several chunks.
#[test]
fn a_chunked_head_equals_the_kept_head() {
    for tied in [true, false] {
        let m = Model::init(small_config("llama", tied), 5).unwrap();
        let ids = random_ids(700, 97, 8);
        let need: Vec<u8> = (0..700).map(|i| (i % 4 != 1) as u8).collect();
        let dloss = |s: &coa_model::TokenStats| -> Vec<f32> { s.logp.iter().enumerate().map(|(i, &l)| if l != 0.0 { -0.002 * (1 + i % 3) as f32 } else { 0.0 }).collect() };
        let seq = Seq::new(&ids);
        let mut kept = m.params.zeros_like();
        let st_kept = m.forward_backward_in(&mut coa_model::Workspace::default(), &seq, Some(&need), &mut kept, &mut |s| dloss(s)).unwrap();
        // 97 ids × 520 rows > 50,000 floats: chunks of max(50,000 / 2 / 97, 256) = 256 rows
        let mut ws = coa_model::Workspace::with_logits_limit(50_000);
        let mut chunked = m.params.zeros_like();
        let st_chunked = m.forward_backward_in(&mut ws, &seq, Some(&need), &mut chunked, &mut |s| dloss(s)).unwrap();
        for (t, (a, b)) in st_kept.logp.iter().zip(&st_chunked.logp).enumerate() {
            assert!((a - b).abs() < 1e-5, "tied {tied}: logp of token {t}: {a} kept vs {b} chunked");
        }
        for (a, b) in kept.tensors.iter().zip(&chunked.tensors) {
            let scale = a.data.iter().fold(0f32, |x, y| x.max(y.abs())).max(1e-12);
            let err = a.data.iter().zip(&b.data).fold(0f32, |x, (p, q)| x.max((p - q).abs()));
            assert!(err / scale < 1e-4, "tied {tied}: {}: rel err {}", a.name, err / scale);
            assert!(a.data.iter().any(|&x| x != 0.0), "tied {tied}: {} got no gradient", a.name);
        }
    }
}

/// Which layers slide, as transformers 5 reads the config; bad window fields are errors naming
/// the field; Qwen3 and Mistral save under their own architecture and reload.
#[test]
fn sliding_window_rules_and_new_architectures() {
    let with = |mt: &str, fields: Value| {
        let mut c = small_config(mt, true);
        c.num_hidden_layers = 4;
        for (k, v) in fields.as_object().unwrap() {
            c.extra.insert(k.clone(), v.clone());
        }
        c
    };
    let w = |mt: &str, fields: Value| with(mt, fields).layer_windows().unwrap();
    // qwen2 / qwen3: only with use_sliding_window, on layers max_window_layers and up
    for mt in ["qwen2", "qwen3"] {
        assert_eq!(w(mt, serde_json::json!({"sliding_window": 8, "max_window_layers": 2})), vec![0; 4]);
        assert_eq!(w(mt, serde_json::json!({"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 2})), vec![0, 0, 8, 8]);
        assert_eq!(w(mt, serde_json::json!({"use_sliding_window": true, "max_window_layers": 3})), vec![0, 0, 0, 4096]);
        assert_eq!(w(mt, serde_json::json!({"use_sliding_window": true, "sliding_window": 8})), vec![0; 4], "max_window_layers defaults to 28");
        let lt = serde_json::json!(["sliding_attention", "full_attention", "sliding_attention", "full_attention"]);
        assert_eq!(w(mt, serde_json::json!({"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0, "layer_types": lt})), vec![8, 0, 8, 0]);
    }
    // mistral: every layer; absent = 4096, null = none; llama: never
    assert_eq!(w("mistral", serde_json::json!({"sliding_window": 6})), vec![6; 4]);
    assert_eq!(w("mistral", serde_json::json!({})), vec![4096; 4]);
    assert_eq!(w("mistral", serde_json::json!({"sliding_window": null})), vec![0; 4]);
    assert_eq!(w("llama", serde_json::json!({"sliding_window": 6, "use_sliding_window": true})), vec![0; 4]);
    for (mt, fields, field) in [
        ("mistral", serde_json::json!({"sliding_window": 0}), "sliding_window"),
        ("qwen2", serde_json::json!({"use_sliding_window": "yes"}), "use_sliding_window"),
        ("qwen3", serde_json::json!({"use_sliding_window": true, "layer_types": ["full_attention"]}), "layer_types"),
        ("qwen3", serde_json::json!({"use_sliding_window": true, "layer_types": ["full_attention", "x", "full_attention", "full_attention"]}), "layer_types"),
        ("qwen2", serde_json::json!({"layer_types": ["sliding_attention", "full_attention", "full_attention", "full_attention"]}), "use_sliding_window"),
    ] {
        let e = err_of(with(mt, fields.clone()).validate());
        assert!(e.contains(field), "{mt} {fields}: expected an error naming {field}: {e}");
    }
    let e = err_of(small_config("llama", true).validate().and_then(|_| {
        let mut c = small_config("llama", true);
        c.model_type = "gemma".into();
        c.validate()
    }));
    assert!(e.contains("qwen3") && e.contains("mistral"), "the refusal lists what is read: {e}");

    // Qwen3: head_dim defaults to 128 (transformers' default), q/k norms per layer
    let c = ModelConfig::from_json(&serde_json::json!({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1})).unwrap();
    assert_eq!(c.head_dim(), 128);
    let c = ModelConfig::from_json(&serde_json::json!({"architectures": ["MistralForCausalLM"], "vocab_size": 10, "hidden_size": 32,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 8})).unwrap();
    assert_eq!((c.model_type.as_str(), c.num_key_value_heads), ("mistral", 8));
    for (mt, arch) in [("qwen3", "Qwen3ForCausalLM"), ("mistral", "MistralForCausalLM")] {
        let mut c = with(mt, serde_json::json!({"sliding_window": 5, "use_sliding_window": true, "max_window_layers": 1}));
        c.attention_bias = true;
        let m = Model::init(c, 4).unwrap();
        let names: Vec<&str> = m.params.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.contains(&"model.layers.0.self_attn.q_norm.weight"), mt == "qwen3");
        assert_eq!(names.contains(&"model.layers.3.self_attn.o_proj.bias"), mt == "qwen3", "qwen3 attention_bias covers o_proj; mistral has none");
        assert!(m.params.get("model.layers.0.self_attn.q_norm.weight").is_none_or(|t| t.data.iter().all(|&x| x == 1.0)));
        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path(), SaveDtype::F32).unwrap();
        let cfg: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
        assert_eq!((cfg["architectures"][0].as_str(), cfg["model_type"].as_str()), (Some(arch), Some(mt)));
        assert_eq!(cfg["sliding_window"], 5);
        let back = Model::load(dir.path()).unwrap();
        assert_eq!(back.params, m.params);
        assert_eq!(back.config.layer_windows().unwrap(), m.config.layer_windows().unwrap());
    }
}
