//! KV-cache decoding against the full forward: prefill + decode steps give `Model::logits` at
//! every position (1e-5 relative), batched decoding of sequences of different lengths equals
//! decoding each alone, and bad calls are errors.

use coa_model::rng::random_ids;
use coa_model::{DecodeDtype, KvCache, Model, ModelConfig, Seq, TokenIds};

fn config(model_type: &str, tied: bool, nh: usize, nkv: usize) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 61).unwrap();
    c.model_type = model_type.to_string();
    c.architectures = vec![];
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = nh;
    c.num_key_value_heads = nkv;
    c.tie_word_embeddings = tied;
    c.bos_token_id = Some(1);
    c.eos_token_id = Some(TokenIds::One(2));
    c.validate().unwrap();
    c
}

/// A random model whose biases and norm weights are not trivial (so their paths are exercised).
fn model(c: ModelConfig, seed: u64) -> Model {
    let mut m = Model::init(c, seed).unwrap();
    let mut s = seed.wrapping_add(99);
    for t in m.params.iter_mut() {
        if t.name.ends_with(".bias") || t.name.ends_with("norm.weight") {
            for x in &mut t.data {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                *x += ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2;
            }
        } else {
            // larger weights: sharper attention, logits far from uniform
            t.data.iter_mut().for_each(|x| *x *= 8.0);
        }
    }
    m
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).fold(0f64, f64::max);
    let den = b.iter().map(|x| (*x as f64).abs()).fold(0f64, f64::max);
    num / den.max(1e-30)
}

fn row(x: &[f32], i: usize, v: usize) -> &[f32] {
    &x[i * v..(i + 1) * v]
}

#[test]
fn prefill_then_decode_matches_the_full_forward() {
    // llama (GQA, untied), qwen2 (QKV bias, tied), plain MHA; prompts crossing the 64-row block.
    for (mt, tied, nh, nkv, prompt, total) in
        [("llama", false, 4, 2, 5, 40), ("qwen2", true, 4, 1, 70, 150), ("llama", true, 2, 2, 1, 12)]
    {
        let m = model(config(mt, tied, nh, nkv), 3);
        let v = m.config.vocab_size;
        let seq = random_ids(total, v, 11);
        let full = m.logits(&Seq::new(&seq)).unwrap();
        let mut cache = KvCache::new(&m.config, 3, total).unwrap();
        let slot = 2;
        let last = m.prefill(&mut cache, slot, &seq[..prompt]).unwrap();
        assert_eq!(cache.len(slot), prompt);
        let e = rel_err(&last, row(&full, prompt - 1, v));
        assert!(e < 1e-5, "{mt}: prefill logits rel err {e}");
        for (t, &tok) in seq.iter().enumerate().skip(prompt) {
            let lg = m.decode_step(&mut cache, &[slot], &[tok]).unwrap();
            let e = rel_err(&lg, row(&full, t, v));
            assert!(e < 1e-5, "{mt}: decode position {t}: rel err {e}");
        }
        assert_eq!(cache.len(slot), total);
        // the cache is full now
        let err = m.decode_step(&mut cache, &[slot], &[0]).unwrap_err().to_string();
        assert!(err.contains("exceed"), "{err}");

        // every position of a prefill, in two chunks (an "observation" appended mid-sequence)
        cache.reset(slot);
        let mid = total / 2;
        let a = m.extend_all_logits(&mut cache, &[(slot, &seq[..mid])]).unwrap();
        let b = m.extend_all_logits(&mut cache, &[(slot, &seq[mid..])]).unwrap();
        let both: Vec<f32> = a.into_iter().chain(b).collect();
        let e = rel_err(&both, &full);
        assert!(e < 1e-5, "{mt}: chunked prefill rel err {e}");
    }
}

#[test]
fn batched_decode_equals_single_decode() {
    let m = model(config("qwen2", false, 4, 2), 5);
    let v = m.config.vocab_size;
    let lens = [3usize, 17, 9, 1];
    let steps = 12;
    let seqs: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| random_ids(n + steps, v, 100 + i as u64)).collect();

    // alone
    let mut single: Vec<Vec<Vec<f32>>> = Vec::new();
    for s in &seqs {
        let n = s.len() - steps;
        let mut c = KvCache::new(&m.config, 1, s.len()).unwrap();
        let mut out = vec![m.prefill(&mut c, 0, &s[..n]).unwrap()];
        for &tok in &s[n..s.len() - 1] {
            out.push(m.decode_step(&mut c, &[0], &[tok]).unwrap());
        }
        single.push(out);
    }

    // together, in slots given in a scrambled order, prompts prefilled in one mixed call
    let slots = [3usize, 0, 2, 1];
    let mut c = KvCache::new(&m.config, 4, 40).unwrap();
    let items: Vec<(usize, &[u32])> = seqs.iter().zip(slots).map(|(s, slot)| (slot, &s[..s.len() - steps])).collect();
    let first = m.extend(&mut c, &items).unwrap();
    for (i, s) in single.iter().enumerate() {
        let e = rel_err(row(&first, i, v), &s[0]);
        assert!(e < 1e-5, "seq {i}: batched prefill rel err {e}");
    }
    for k in 0..steps - 1 {
        let toks: Vec<u32> = seqs.iter().map(|s| s[s.len() - steps + k]).collect();
        let lg = m.decode_step(&mut c, &slots, &toks).unwrap();
        for (i, s) in single.iter().enumerate() {
            let e = rel_err(row(&lg, i, v), &s[k + 1]);
            assert!(e < 1e-5, "seq {i} step {k}: batched decode rel err {e}"); assert_eq!(row(&lg, i, v), &s[k + 1][..], "bit");
        }
    }
    for (i, &slot) in slots.iter().enumerate() {
        assert_eq!(c.len(slot), lens[i] + steps - 1);
    }
}

#[test]
fn a_copied_prefix_decodes_like_its_own_prefill() {
    let m = model(config("llama", true, 4, 2), 7);
    let v = m.config.vocab_size;
    let seq = random_ids(40, v, 8);
    // Copies of whole key tiles (16 keys) and of part of one, from caches in f32 and in bf16.
    for (dtype, n) in [(DecodeDtype::F32, 12), (DecodeDtype::F32, 35), (DecodeDtype::Bf16, 12), (DecodeDtype::Bf16, 35)] {
        let mut c = KvCache::new_as(&m.config, 3, 50, dtype).unwrap();
        m.prefill(&mut c, 0, &seq[..n + 3]).unwrap();
        c.copy_prefix(0, 2, n).unwrap();
        assert_eq!(c.len(2), n);
        let mut fresh = KvCache::new_as(&m.config, 1, 50, dtype).unwrap();
        m.prefill(&mut fresh, 0, &seq[..n]).unwrap();
        for &t in &seq[n..n + 4] {
            let a = m.decode_step(&mut c, &[2], &[t]).unwrap();
            let b = m.decode_step(&mut fresh, &[0], &[t]).unwrap();
            assert_eq!(a, b, "{dtype} cache, {n} tokens: a copied prefix decodes exactly as the slot that prefilled it");
        }
        assert_eq!(c.len(0), n + 3, "the source slot is untouched");
    }
    let mut c = KvCache::new(&m.config, 3, 40).unwrap();
    m.prefill(&mut c, 0, &seq[..20]).unwrap();
    let e = c.copy_prefix(1, 2, 1).unwrap_err().to_string();
    assert!(e.contains("holds 0 tokens"), "{e}");
    assert!(c.copy_prefix(0, 3, 1).unwrap_err().to_string().contains("out of range"));
}

#[test]
fn a_shared_prefix_prefills_to_the_same_bits() {
    // A prompt that starts from a copy of the prefix it shares with another prompt, and feeds the
    // rest (two or more tokens), gives the bits of prefilling it whole: logits and later decode
    // steps. Shared lengths inside and across the 64-row attention blocks, rests of 2 to 90 tokens.
    let m = model(config("llama", true, 4, 2), 11);
    let v = m.config.vocab_size;
    let cases = [(150, 170, 100, DecodeDtype::F32), (150, 150, 148, DecodeDtype::F32), (80, 72, 70, DecodeDtype::F32), (40, 30, 17, DecodeDtype::F32)];
    for (len_a, len_b, shared, dtype) in cases.into_iter().chain([(200, 135, 64, DecodeDtype::F32), (150, 170, 100, DecodeDtype::Bf16), (40, 30, 17, DecodeDtype::Bf16)]) {
        let a = random_ids(len_a, v, 12);
        let mut b = random_ids(len_b, v, 13);
        b[..shared].copy_from_slice(&a[..shared]);
        let tail = random_ids(6, v, 14);
        let mut whole = KvCache::new_as(&m.config, 1, 220, dtype).unwrap();
        let mut want = vec![m.prefill(&mut whole, 0, &b).unwrap()];
        let mut reuse = KvCache::new_as(&m.config, 2, 220, dtype).unwrap();
        m.prefill(&mut reuse, 0, &a).unwrap();
        reuse.copy_prefix(0, 1, shared).unwrap();
        let mut got = vec![m.extend(&mut reuse, &[(1, &b[shared..])]).unwrap()];
        for &t in &tail {
            want.push(m.decode_step(&mut whole, &[0], &[t]).unwrap());
            got.push(m.decode_step(&mut reuse, &[1], &[t]).unwrap());
        }
        assert_eq!(got, want, "prompts of {len_a} and {len_b} tokens sharing {shared}, {dtype} cache");
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let m = model(config("llama", false, 4, 2), 9);
    let seq = random_ids(90, m.config.vocab_size, 4);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut c = KvCache::new(&m.config, 2, 100).unwrap();
            let mut out = m.prefill(&mut c, 1, &seq[..80]).unwrap();
            for &t in &seq[80..] {
                out.extend(m.decode_step(&mut c, &[1], &[t]).unwrap());
            }
            out
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn bad_calls_are_errors() {
    let m = model(config("llama", false, 4, 2), 1);
    let mut c = KvCache::new(&m.config, 2, 8).unwrap();
    let e = m.prefill(&mut c, 2, &[1]).unwrap_err().to_string();
    assert!(e.contains("slot 2 is out of range"), "{e}");
    let e = m.decode_step(&mut c, &[0, 0], &[1, 2]).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
    let e = m.prefill(&mut c, 0, &[]).unwrap_err().to_string();
    assert!(e.contains("no tokens"), "{e}");
    let e = m.prefill(&mut c, 0, &[1, 9999]).unwrap_err().to_string();
    assert!(e.contains("9999"), "{e}");
    let e = m.decode_step(&mut c, &[0], &[1, 2]).unwrap_err().to_string();
    assert!(e.contains("1 slots but 2 tokens"), "{e}");
    assert_eq!(c.len(0), 0, "a refused call leaves the cache as it was");
    assert!(KvCache::new(&m.config, 0, 8).is_err());
    let other = config("llama", false, 4, 1);
    let mut c2 = KvCache::new(&other, 1, 8).unwrap();
    let e = m.prefill(&mut c2, 0, &[1]).unwrap_err().to_string();
    assert!(e.contains("kv heads"), "{e}");
}

/// `m` with every weight matrix (embedding, linear layers, head) rounded as `dtype` holds it.
fn rounded(m: &Model, dtype: DecodeDtype) -> Model {
    let mut r = m.clone();
    r.round_weights(dtype);
    r
}

/// Prompts of 70 and 5 tokens in two slots, then 12 decode steps of both: every logit returned.
fn decode_run(m: &Model) -> Vec<f32> {
    let seq = random_ids(90, m.config.vocab_size, 6);
    let mut c = KvCache::new(&m.config, 2, 100).unwrap();
    let mut out = m.extend(&mut c, &[(0, &seq[..70]), (1, &seq[70..75])]).unwrap();
    for s in 0..12 {
        out.extend(m.decode_step(&mut c, &[0, 1], &[seq[75 + s], seq[76 + s]]).unwrap());
    }
    out
}

#[test]
fn narrow_decoding_weights_decode_as_the_rounded_model() {
    for (mt, tied) in [("llama", false), ("qwen2", true)] {
        let m = model(config(mt, tied, 4, 2), 12);
        let exact = decode_run(&m);
        for (dtype, bound) in [(DecodeDtype::Bf16, 0.03), (DecodeDtype::Int8, 0.08)] {
            let narrow = m.clone();
            if let Err(e) = narrow.prepare_decoding_as(dtype) {
                eprintln!("narrow_decoding_weights_decode_as_the_rounded_model: skipped ({e:#})");
                return;
            }
            assert_eq!(narrow.decode_dtype(), dtype);
            let got = decode_run(&narrow);
            // The same bits as f32 decoding of the model whose weights hold the rounded values.
            let want = decode_run(&rounded(&m, dtype));
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{mt} {dtype}: not the rounded model's bits");
            // And near the f32 model (the rounding moves the logits, not by much).
            let err = rel_err(&got, &exact);
            assert!(err > 0.0 && err < bound, "{mt} {dtype}: logits {err:.4} (relative) from the f32 model's");
            eprintln!("{mt} {dtype}: logits {err:.4} (max, relative) from the f32 model's");
            // The format is fixed once chosen.
            let again = narrow.prepare_decoding_as(DecodeDtype::F32).unwrap_err().to_string();
            assert!(again.contains(dtype.name()) && again.contains("f32"), "{again}");
        }
    }
}

#[test]
fn a_bf16_cache_decodes_near_the_f32_cache_in_half_the_bytes() {
    for (mt, tied) in [("llama", false), ("qwen2", true)] {
        let m = model(config(mt, tied, 4, 2), 13);
        let seq = random_ids(90, m.config.vocab_size, 6);
        let run = |dtype| {
            let mut c = KvCache::new_as(&m.config, 2, 100, dtype).unwrap();
            let mut out = m.extend(&mut c, &[(0, &seq[..70]), (1, &seq[70..75])]).unwrap();
            for s in 0..12 {
                out.extend(m.decode_step(&mut c, &[0, 1], &[seq[75 + s], seq[76 + s]]).unwrap());
            }
            (out, c.bytes())
        };
        let ((exact, bytes32), (half, bytes16)) = (run(DecodeDtype::F32), run(DecodeDtype::Bf16));
        assert_eq!(bytes16 * 2, bytes32);
        let err = rel_err(&half, &exact);
        assert!(err > 0.0 && err < 0.015, "{mt}: logits {err:.4} (relative) from the f32 cache's");
        eprintln!("{mt}: bf16 cache logits {err:.4} (max, relative) from the f32 cache's");
    }
    let c = config("llama", false, 4, 2);
    let e = KvCache::new_as(&c, 1, 10, DecodeDtype::Int8).unwrap_err().to_string();
    assert!(e.contains("int8") && e.contains("bf16"), "{e}");
    let e = KvCache::new_as(&c, 1, 10, DecodeDtype::Bf16Matmul).unwrap_err().to_string();
    assert!(e.contains("bf16-matmul"), "{e}");
}

#[test]
fn bf16_matmul_decodes_near_the_f32_model_whatever_the_batch_and_threads() {
    // bf16 activations on top of bf16 weights (AMX tiles where the CPU has them): near the f32
    // model, not the weight-only bf16 format's bits, and a sequence's logits do not depend on
    // the other sequences of its batch or on the threads.
    for (mt, tied) in [("llama", false), ("qwen2", true)] {
        let m = model(config(mt, tied, 4, 2), 12);
        let mm = m.clone();
        if let Err(e) = mm.prepare_decoding_as(DecodeDtype::Bf16Matmul) {
            eprintln!("bf16_matmul_decodes_near_the_f32_model: skipped ({e:#})");
            return;
        }
        let got = decode_run(&mm);
        let err = rel_err(&got, &decode_run(&m));
        assert!(err > 0.0 && err < 0.05, "{mt}: logits {err:.4} (relative) from the f32 model's");
        let weights_only = m.clone();
        weights_only.prepare_decoding_as(DecodeDtype::Bf16).unwrap();
        assert_ne!(got, decode_run(&weights_only), "{mt}: the activations are rounded too");
        eprintln!("{mt} bf16-matmul: logits {err:.4} (max, relative) from the f32 model's");

        let v = mm.config.vocab_size;
        let seq = random_ids(90, v, 6);
        let run = |others: bool, threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let mut c = KvCache::new(&mm.config, 2, 100).unwrap();
                let slots: &[usize] = if others { &[0, 1] } else { &[0] };
                let prompts: Vec<(usize, &[u32])> = if others { vec![(0, &seq[..70]), (1, &seq[70..75])] } else { vec![(0, &seq[..70])] };
                let last = mm.extend(&mut c, &prompts).unwrap();
                let mut out = last[..v].to_vec();
                for s in 0..12 {
                    let toks: Vec<u32> = slots.iter().map(|&k| seq[75 + s + k]).collect();
                    out.extend_from_slice(&mm.decode_step(&mut c, slots, &toks).unwrap()[..v]);
                }
                out
            })
        };
        let alone = run(false, 1);
        assert!(alone == run(true, 1) && alone == run(true, 3), "{mt}: slot 0's logits changed with its batch or the threads");
    }
}

/// Qwen3 (q/k norm) and sliding windows (Mistral on every layer, Qwen2 / Qwen3 on some): prefill
/// in two chunks, then decode steps, give the full forward's logits at every position, with
/// windows shorter than the prompt and than the decoded run, and a prompt longer than an
/// attention block (the cache keeps every key; attention looks at the window only). Two slots
/// decode side by side.
#[test]
fn windows_and_qk_norm_decode_like_the_full_forward() {
    let mut cases: Vec<(String, Model)> = Vec::new();
    for (mt, window, layer_types) in [
        ("qwen3", None, None),
        ("mistral", Some(37), None),
        ("qwen2", Some(9), Some(serde_json::json!(["full_attention", "sliding_attention"]))),
        ("qwen3", Some(5), None),
    ] {
        let mut c = config(mt, mt != "mistral", 4, 2);
        c.head_dim = Some(12);
        match window {
            Some(w) => {
                c.extra.insert("sliding_window".into(), w.into());
                c.extra.insert("use_sliding_window".into(), true.into());
                c.extra.insert("max_window_layers".into(), 1.into());
            }
            None => {
                c.extra.insert("sliding_window".into(), serde_json::Value::Null);
            }
        }
        if let Some(lt) = layer_types {
            c.extra.insert("layer_types".into(), lt);
        }
        c.validate().unwrap();
        let expect_windows = match (mt, window) {
            (_, None) => vec![0, 0],
            ("mistral", Some(w)) => vec![w, w],
            (_, Some(w)) => vec![0, w],
        };
        assert_eq!(c.layer_windows().unwrap(), expect_windows, "{mt}");
        cases.push((format!("{mt} window {window:?}"), model(c, 5)));
    }
    let fx = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/fixtures");
    for case in ["qwen3_qknorm", "qwen3_sliding", "mistral_window", "qwen2_sliding"] {
        cases.push((case.to_string(), Model::load(&fx.join(case)).unwrap()));
    }
    for (name, m) in &cases {
        let v = m.config.vocab_size;
        let total = if name.contains("window") && !name.contains("_") { 160 } else { 40 };
        let (p1, p2) = (total / 2 + 3, total * 3 / 4);
        let seqs = [random_ids(total, v, 21), random_ids(total, v, 22)];
        let fulls: Vec<Vec<f32>> = seqs.iter().map(|s| m.logits(&Seq::new(s)).unwrap()).collect();
        let mut cache = KvCache::new(&m.config, 2, total).unwrap();
        for (slot, s) in seqs.iter().enumerate() {
            let all = m.extend_all_logits(&mut cache, &[(slot, &s[..p1])]).unwrap();
            for t in 0..p1 {
                let e = rel_err(row(&all, t, v), row(&fulls[slot], t, v));
                assert!(e < 1e-5, "{name}: prefill position {t}: rel err {e}");
            }
            let last = m.prefill(&mut cache, slot, &s[p1..p2]).unwrap();
            let e = rel_err(&last, row(&fulls[slot], p2 - 1, v));
            assert!(e < 1e-5, "{name}: second chunk: rel err {e}");
        }
        for (t, (&a, &b)) in seqs[0].iter().zip(&seqs[1]).enumerate().skip(p2) {
            let lg = m.decode_step(&mut cache, &[0, 1], &[a, b]).unwrap();
            for (slot, full) in fulls.iter().enumerate() {
                let e = rel_err(row(&lg, slot, v), row(full, t, v));
                assert!(e < 1e-5, "{name}: slot {slot} decode position {t}: rel err {e}");
            }
        }
    }
}
