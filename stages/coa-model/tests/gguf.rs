//! The GGUF reader on small files written here with `GgufWriter`: each tensor type against
//! hand-computed values, the q/k row permutation, a model round trip, and every kind of bad file
//! (each error must name the file and what was expected).

use std::path::{Path, PathBuf};

use coa_model::gguf::{self, GgmlType, GgufFile, GgufWriter, Value};
use coa_model::{Model, ModelConfig, Seq};
use serde_json::json;

fn f16_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

fn write(dir: &Path, name: &str, w: &GgufWriter) -> PathBuf {
    let p = dir.join(name);
    w.write(&p).unwrap();
    p
}

fn open_err(path: &Path) -> String {
    format!("{:#}", GgufFile::open(path).expect_err("expected an error"))
}

#[test]
fn every_type_dequantizes_to_hand_computed_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()));

    let f32_vals = [1.5f32, -0.25, 3.0e-8, 1234.5];
    w.tensor("f32", &[4], GgmlType::F32, f32_vals.iter().flat_map(|x| x.to_le_bytes()).collect());
    // F16: exactly representable values, and 0.1, which f16 rounds to 1638 / 16384.
    let f16_in = [1.0f32, -2.5, 0.1, 65504.0];
    w.tensor("f16", &[4], GgmlType::F16, f16_in.iter().flat_map(|&x| f16_bits(x)).collect());
    // BF16: the top 16 bits of an f32.
    let bf16_bits: [u16; 3] = [0x3F80, 0xC040, 0x3E4C];
    w.tensor("bf16", &[3], GgmlType::BF16, bf16_bits.iter().flat_map(|b| b.to_le_bytes()).collect());
    // Q8_0: d = 0.5, q = -128, -127, ..., -97 (one block of 32).
    let mut q8 = f16_bits(0.5).to_vec();
    q8.extend((0..32).map(|j: i32| (j - 128) as i8 as u8));
    w.tensor("q8_0", &[32], GgmlType::Q8_0, q8);
    // Q4_0: d = 2, byte j holds nibble j (low) and 15 - j (high): value j = 2 (j - 8) for j < 16,
    // value 16 + j = 2 (15 - j - 8).
    let mut q4 = f16_bits(2.0).to_vec();
    q4.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    w.tensor("q4_0", &[32], GgmlType::Q4_0, q4);
    // Q4_1: d = 0.25, m = -1, the same nibbles: value = 0.25 n - 1. Two blocks, the second with
    // d = 0.1 (f16: 1638 / 16384), m = 3.
    let mut q41 = f16_bits(0.25).to_vec();
    q41.extend(f16_bits(-1.0));
    q41.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    q41.extend(f16_bits(0.1));
    q41.extend(f16_bits(3.0));
    q41.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    w.tensor("q4_1", &[64], GgmlType::Q4_1, q41);
    let path = write(dir.path(), "types.gguf", &w);

    let f = GgufFile::open(&path).unwrap();
    let read = |name: &str| f.tensor_f32(f.tensor(name).unwrap()).unwrap();
    assert_eq!(read("f32"), f32_vals);
    assert_eq!(read("f16"), [1.0, -2.5, 1638.0 / 16384.0, 65504.0]);
    assert_eq!(read("bf16"), [1.0, -3.0, 0.19921875]);
    let want_q8: Vec<f32> = (0..32).map(|j| (j as f32 - 128.0) * 0.5).collect();
    assert_eq!(read("q8_0"), want_q8);
    let nibbles: Vec<f32> = (0..16).map(|j| j as f32).chain((0..16).map(|j| 15.0 - j as f32)).collect();
    let want_q4: Vec<f32> = nibbles.iter().map(|n| 2.0 * (n - 8.0)).collect();
    assert_eq!(read("q4_0"), want_q4);
    let d2 = 1638.0f32 / 16384.0; // f16(0.1)
    let want_q41: Vec<f32> =
        nibbles.iter().map(|n| 0.25 * n - 1.0).chain(nibbles.iter().map(|n| d2 * n + 3.0)).collect();
    assert_eq!(read("q4_1"), want_q41);
}

/// Q5_0, Q5_1 and the K-quants: blocks packed here from chosen quants and scales (the inverse of
/// the layout the reader decodes), read back as `scale * q - min` of those choices. Values are
/// exact in f32 (small integers times powers of two), so the order of operations cannot hide a
/// misplaced bit. Bit-for-bit agreement with gguf-py is `tests/gguf_parity.rs`'s.
#[test]
fn five_bit_and_k_quant_blocks_decode_to_their_packed_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    // Q5_0 / Q5_1: q[j] = (7 j + 3) mod 32, its fifth bit in bit j of qh.
    let q5: Vec<u32> = (0..32).map(|j| (7 * j + 3) % 32).collect();
    let pack5 = |q: &[u32]| -> Vec<u8> {
        let qh: u32 = q.iter().enumerate().map(|(j, &v)| (v >> 4) << j).sum();
        let mut b = qh.to_le_bytes().to_vec();
        b.extend((0..16).map(|j| (q[j] & 15 | (q[j + 16] & 15) << 4) as u8));
        b
    };
    let mut q50 = f16_bits(0.5).to_vec();
    q50.extend(pack5(&q5));
    w.tensor("q5_0", &[32], GgmlType::Q5_0, q50);
    let mut q51 = f16_bits(0.25).to_vec();
    q51.extend(f16_bits(-2.0));
    q51.extend(pack5(&q5));
    w.tensor("q5_1", &[32], GgmlType::Q5_1, q51);

    // Q4_K / Q5_K: sub-block i has scale 10 + 7 i and min 3 + 8 i (6 bits; those of sub-blocks
    // 4-7 are >= 16, so their top bits land in bytes 0-7); quants q[e] = (5 e + 1) mod 16 or 32.
    let sc: Vec<u8> = (0..8).map(|i| 10 + 7 * i).collect();
    let mn: Vec<u8> = (0..8).map(|i| 3 + 8 * i).collect();
    let mut scales = [0u8; 12];
    for i in 0..4 {
        scales[i] = sc[i] | (sc[i + 4] >> 4) << 6;
        scales[i + 4] = mn[i] | (mn[i + 4] >> 4) << 6;
        scales[i + 8] = (sc[i + 4] & 15) | (mn[i + 4] & 15) << 4;
    }
    let q4k: Vec<u8> = (0..256).map(|e| ((5 * e + 1) % 16) as u8).collect();
    let q5k: Vec<u8> = (0..256).map(|e| ((5 * e + 1) % 32) as u8).collect();
    // Sub-block i: the low (even i) or high (odd i) nibbles of bytes 32 (i / 2) .. + 32.
    let nibbles = |q: &[u8]| -> Vec<u8> {
        (0..128).map(|k| (q[(k / 32) * 64 + k % 32] & 15) | (q[(k / 32) * 64 + 32 + k % 32] & 15) << 4).collect()
    };
    let mut b4 = [f16_bits(0.5), f16_bits(0.25)].concat();
    b4.extend(scales);
    b4.extend(nibbles(&q4k));
    w.tensor("q4_k", &[256], GgmlType::Q4_K, b4);
    let mut b5 = [f16_bits(0.5), f16_bits(0.25)].concat();
    b5.extend(scales);
    b5.extend((0..32).map(|l| (0..8).map(|i| (q5k[32 * i + l] >> 4) << i).sum::<u8>()));
    b5.extend(nibbles(&q5k));
    w.tensor("q5_k", &[256], GgmlType::Q5_K, b5);

    // Q6_K: q[e] = (7 e + 3) mod 64, scales -24, -21, ..., 21 (int8, negative ones too), d = 1/8.
    let q6: Vec<u8> = (0..256).map(|e| ((7 * e + 3) % 64) as u8).collect();
    let s6: Vec<i8> = (0..16).map(|k| (k as i8 - 8) * 3).collect();
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for (e, &q) in q6.iter().enumerate() {
        let (h, g, l) = (e / 128, e / 32 % 4, e % 32);
        ql[64 * h + 32 * (g % 2) + l] |= (q & 15) << (4 * (g / 2));
        qh[32 * h + l] |= (q >> 4) << (2 * g);
    }
    let mut b6 = [ql.as_slice(), qh.as_slice()].concat();
    b6.extend(s6.iter().map(|&s| s as u8));
    b6.extend(f16_bits(0.125));
    w.tensor("q6_k", &[256], GgmlType::Q6_K, b6);

    let f = GgufFile::open(&write(dir.path(), "kq.gguf", &w)).unwrap();
    let read = |name: &str| f.tensor_f32(f.tensor(name).unwrap()).unwrap();
    assert_eq!(read("q5_0"), q5.iter().map(|&q| 0.5 * (q as f32 - 16.0)).collect::<Vec<_>>());
    assert_eq!(read("q5_1"), q5.iter().map(|&q| 0.25 * q as f32 - 2.0).collect::<Vec<_>>());
    let k_want = |q: &[u8]| -> Vec<f32> {
        q.iter().enumerate().map(|(e, &q)| 0.5 * sc[e / 32] as f32 * q as f32 - 0.25 * mn[e / 32] as f32).collect()
    };
    assert_eq!(read("q4_k"), k_want(&q4k));
    assert_eq!(read("q5_k"), k_want(&q5k));
    let want6: Vec<f32> = q6.iter().enumerate().map(|(e, &q)| 0.125 * s6[e / 16] as f32 * (q as f32 - 32.0)).collect();
    assert_eq!(read("q6_k"), want6);
    // The unpacking on its own: a sub-block above 3 takes its top bits from bytes 0-7.
    assert_eq!(gguf::dequant::scale_min_k4(&scales, 6), (52, 51));
}

#[test]
fn metadata_of_every_type_round_trips_with_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let values = vec![
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-100)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-30000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("f32", Value::F32(1e-5)),
        ("bool", Value::Bool(true)),
        ("string", Value::String("héllo\n".into())),
        ("array", Value::Array(vec![Value::I32(1), Value::I32(-2)])),
        ("nested", Value::Array(vec![Value::Array(vec![Value::String("a".into())]), Value::Array(vec![])])),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(-0.5)),
        ("general.alignment", Value::U32(64)),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.kv(k, v.clone());
    }
    w.tensor_f32("a", &[3], &[1.0, 2.0, 3.0]);
    w.tensor_f32("b", &[2, 2], &[4.0, 5.0, 6.0, 7.0]);
    let path = write(dir.path(), "meta.gguf", &w);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 64);
    assert_eq!(f.data_start % 64, 0);
    for (k, v) in &values {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.get_f64("f32").unwrap(), Some(9.999999747378752e-6));
    assert_eq!(f.tensor("b").unwrap().dims, [2, 2]);
    assert_eq!(f.tensor("b").unwrap().offset % 64, 0);
    assert_eq!(f.tensor_f32(f.tensor("b").unwrap()).unwrap(), [4.0, 5.0, 6.0, 7.0]);
    let e = format!("{:#}", f.get_u64("string").unwrap_err());
    assert!(e.contains("meta.gguf") && e.contains("`string`") && e.contains("STRING") && e.contains("integer"), "{e}");
}

#[test]
fn qk_rows_are_unpermuted() {
    // Two heads of head_dim 4, one column: HF rows [first half, second half] per head;
    // llama.cpp interleaves them: GGUF row 2i + j of a head is HF row 2j + i.
    let hf = [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0];
    let gguf_rows = [0.0, 2.0, 1.0, 3.0, 10.0, 12.0, 11.0, 13.0];
    assert_eq!(gguf::permute_qk_rows(&hf, 2, 1).unwrap(), gguf_rows);
    assert_eq!(gguf::unpermute_qk_rows(&gguf_rows, 2, 1).unwrap(), hf);
    // With two columns whole rows move; one head of 8 rows: pairs (0,4), (1,5), (2,6), (3,7).
    let hf2: Vec<f32> = (0..16).map(|x| x as f32).collect();
    let p = gguf::permute_qk_rows(&hf2, 1, 2).unwrap();
    let rows: Vec<f32> = p.chunks(2).map(|r| r[0] / 2.0).collect();
    assert_eq!(rows, [0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]);
    assert_eq!(gguf::unpermute_qk_rows(&p, 1, 2).unwrap(), hf2);
    assert!(gguf::unpermute_qk_rows(&hf, 3, 1).is_err());
}

#[test]
fn names_map_both_ways() {
    for (g, h) in [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("blk.12.attn_q.weight", "model.layers.12.self_attn.q_proj.weight"),
        ("blk.0.attn_k.bias", "model.layers.0.self_attn.k_proj.bias"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
        ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"),
        ("blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ] {
        assert_eq!(gguf::hf_name(g).as_deref(), Some(h));
        assert_eq!(gguf::gguf_name(h).as_deref(), Some(g));
    }
    for bad in ["rope_freqs.weight", "blk.x.attn_q.weight", "blk.0.attn_rot_embd", "blk.0.attn_q.scale"] {
        assert_eq!(gguf::hf_name(bad), None, "{bad}");
    }
}

/// A small random model of `model_type` with every parameter drawn at random.
fn random_model(model_type: &str, tie: bool) -> Model {
    let c = ModelConfig::from_json(&json!({
        "model_type": model_type, "vocab_size": 258, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 50000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": tie,
        "max_position_embeddings": 128, "bos_token_id": 256, "eos_token_id": 257,
        "head_dim": 8, // = 32 / 4: qwen3's absent head_dim would be 128
    }))
    .unwrap();
    let mut m = Model::init(c, 7).unwrap();
    // Init leaves norms at 1 and biases at 0; perturb everything so each maps somewhere visible.
    let mut s = 12345u64;
    for t in m.params.iter_mut() {
        for x in &mut t.data {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *x += ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2;
        }
    }
    m
}

/// `model` as llama.cpp's converter would write it (F32 tensors, llama q/k permuted), with a
/// byte-level vocabulary of the 256 byte characters, "he" and two control tokens.
fn gguf_of(model: &Model) -> GgufWriter {
    let mut w = gguf::writer_of(model).unwrap();
    let mut tokens: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet().into_iter().collect();
    tokens.sort();
    let mut tokens: Vec<Value> = tokens.into_iter().map(|ch| Value::String(ch.to_string())).collect();
    for t in ["<|endoftext|>", "<|im_end|>"] {
        tokens.push(Value::String(t.into()));
    }
    let types: Vec<Value> = (0..tokens.len()).map(|i| Value::I32(if i >= 256 { 3 } else { 1 })).collect();
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.kv("tokenizer.ggml.tokens", Value::Array(tokens));
    w.kv("tokenizer.ggml.token_type", Value::Array(types));
    w.kv("tokenizer.ggml.merges", Value::Array(vec![]));
    w.kv("tokenizer.ggml.bos_token_id", Value::U32(256));
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(257));
    w
}

#[test]
fn llama_qwen2_and_qwen3_models_round_trip_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, tie) in [("llama", false), ("llama", true), ("qwen2", false), ("qwen2", true), ("qwen3", false), ("qwen3", true)] {
        let m = random_model(arch, tie);
        let path = write(dir.path(), &format!("{arch}_{tie}.gguf"), &gguf_of(&m));
        assert!(gguf::is_gguf(&path));
        let ck = gguf::load(&path).unwrap_or_else(|e| panic!("{arch}: {e:#}"));
        let c = &ck.model.config;
        assert_eq!(c.model_type, arch);
        assert_eq!(c.head_dim(), 8, "{arch}: head_dim (qwen3's key_length)");
        assert_eq!(c.tie_word_embeddings, tie, "{arch}: tied is the absence of output.weight");
        assert_eq!((c.vocab_size, c.num_key_value_heads, c.rope_theta), (258, 2, 50000.0));
        assert_eq!(c.bos_token_id, Some(256));
        assert_eq!(ck.model.params, m.params, "{arch} tie={tie}: parameters differ after the round trip");
        let ids = [256u32, 3, 70, 70, 2, 257];
        assert_eq!(ck.model.logits(&Seq::new(&ids)).unwrap(), m.logits(&Seq::new(&ids)).unwrap());
        assert_eq!(ck.tokenizer.specials.eos.as_ref().map(|s| s.content.as_str()), Some("<|im_end|>"));
        assert_eq!(ck.tokenizer.tokenizer.encode("a<|im_end|>", false).unwrap().get_ids().len(), 2);
    }
}

#[test]
fn is_gguf_reads_the_magic() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!gguf::is_gguf(dir.path()), "a directory");
    assert!(!gguf::is_gguf(&dir.path().join("missing.gguf")));
    std::fs::write(dir.path().join("x.gguf"), b"GGML not really").unwrap();
    assert!(!gguf::is_gguf(&dir.path().join("x.gguf")));
    std::fs::write(dir.path().join("y"), b"GGUF").unwrap();
    assert!(gguf::is_gguf(&dir.path().join("y")));
}

#[test]
fn bad_magic_version_and_endianness_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = gguf_of(&random_model("llama", true)).to_bytes();
    let p = dir.path().join("bad.gguf");
    bytes[..4].copy_from_slice(b"GGML");
    std::fs::write(&p, &bytes).unwrap();
    let e = open_err(&p);
    assert!(e.contains("bad.gguf") && e.contains("not a GGUF file") && e.contains("\"GGUF\""), "{e}");
    bytes[..4].copy_from_slice(b"GGUF");
    // Version 2 has the same little-endian layout as 3 and reads the same.
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let v2 = GgufFile::open(&p).unwrap();
    assert_eq!((v2.version, v2.tensors.len()), (2, 20)); // embeddings, 2 x 9 per layer, the final norm
    for (version, says) in [(1u32, "version 1"), (3u32.swap_bytes(), "big-endian"), (7, "version 7")] {
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        std::fs::write(&p, &bytes).unwrap();
        let e = open_err(&p);
        assert!(e.contains("bad.gguf") && e.contains(says) && e.contains("2 or 3"), "{e}");
    }
    std::fs::write(&p, b"GG").unwrap();
    let e = open_err(&p);
    assert!(e.contains("bad.gguf") && e.contains("truncated"), "{e}");
}

#[test]
fn truncated_files_name_what_was_being_read() {
    let dir = tempfile::tempdir().unwrap();
    let m = random_model("llama", true);
    let bytes = gguf_of(&m).to_bytes();
    let f = {
        let p = write(dir.path(), "whole.gguf", &gguf_of(&m));
        GgufFile::open(&p).unwrap()
    };
    let last = f.tensors.iter().max_by_key(|t| t.offset).unwrap();
    let p = dir.path().join("cut.gguf");
    // Cut inside: the header counts, the metadata (the token list), the tensor table, the data.
    for (cut, says) in [
        (20usize, "the metadata count"),
        (2000, "tokenizer.ggml.tokens"),
        (f.data_start as usize - 40, "tensor info"),
        (bytes.len() - 1, last.name.as_str()),
    ] {
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = open_err(&p);
        assert!(e.contains("cut.gguf") && e.contains("truncated") && e.contains(says), "cut at {cut}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

#[test]
fn unsupported_tensor_type_names_tensor_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let m = random_model("llama", true);
    let f = GgufFile::open(&write(dir.path(), "ok.gguf", &gguf_of(&m))).unwrap();
    // The layer-0 up projection ([64, 32], rows of 32) stored as IQ4_NL (32-element blocks of 18
    // bytes, not read), then as Q4_K, whose 256-element blocks cannot hold a row of 32.
    let up = "blk.0.ffn_up.weight";
    let with_up_as = |ty: GgmlType, bytes: usize| {
        let mut w = GgufWriter::new();
        for (k, v) in &f.metadata {
            w.kv(k, v.clone());
        }
        for t in &f.tensors {
            match t.name == up {
                true => w.tensor(up, &t.dims, ty, vec![0u8; bytes]),
                false => w.tensor(&t.name, &t.dims, t.ggml_type, f.tensor_bytes(t).unwrap().to_vec()),
            };
        }
        w
    };
    let p = write(dir.path(), "iq4.gguf", &with_up_as(GgmlType(20), 64 * 18));
    let e = format!("{:#}", gguf::load(&p).err().expect("IQ4_NL must be refused"));
    assert!(e.contains("iq4.gguf") && e.contains(up) && e.contains("IQ4_NL (ggml type 20)") && e.contains("Q6_K"), "{e}");
    assert_eq!(e.lines().count(), 1);
    let p = write(dir.path(), "q4k.gguf", &with_up_as(GgmlType(12), 144));
    let e = open_err(&p);
    assert!(e.contains("q4k.gguf") && e.contains(up) && e.contains("Q4_K") && e.contains("block of 256"), "{e}");
    // An id ggml never defined is reported as such, not sized.
    let mut w3 = GgufWriter::new();
    w3.tensor("odd", &[4], GgmlType(99), vec![0; 16]);
    let f = GgufFile::open(&write(dir.path(), "odd.gguf", &w3)).unwrap();
    let e = format!("{:#}", f.tensor_f32(f.tensor("odd").unwrap()).unwrap_err());
    assert!(e.contains("odd.gguf") && e.contains("`odd`") && e.contains("unknown ggml type 99"), "{e}");
}

/// Rewrites the test model's file with `edit` applied to the metadata and tensors.
fn edited(
    dir: &Path,
    name: &str,
    edit: impl Fn(&mut Vec<(String, Value)>, &mut Vec<(String, Vec<u64>, Vec<f32>)>),
) -> PathBuf {
    let base = write(dir, &format!("base_{name}"), &gguf_of(&random_model("llama", true)));
    let f = GgufFile::open(&base).unwrap();
    let mut meta = f.metadata.clone();
    let mut tensors: Vec<(String, Vec<u64>, Vec<f32>)> =
        f.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), f.tensor_f32(t).unwrap())).collect();
    edit(&mut meta, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.kv(&k, v);
    }
    for (n, dims, data) in tensors {
        w.tensor(&n, &dims, GgmlType::F32, data.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    write(dir, name, &w)
}

fn load_err(path: &Path) -> String {
    format!("{:#}", gguf::load(path).err().expect("expected an error"))
}

#[test]
fn another_architecture_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = edited(dir.path(), "gemma.gguf", |meta, _| {
        meta.iter_mut().find(|(k, _)| k == "general.architecture").unwrap().1 = Value::String("gemma2".into());
    });
    let e = load_err(&p);
    assert!(e.contains("gemma.gguf") && e.contains("\"gemma2\"") && e.contains("\"llama\", \"qwen2\" and \"qwen3\""), "{e}");
    assert_eq!(e.lines().count(), 1);
}

#[test]
fn shape_mismatch_missing_and_unexpected_tensors_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = edited(dir.path(), "shape.gguf", |_, tensors| {
        let t = tensors.iter_mut().find(|t| t.0 == "blk.1.attn_v.weight").unwrap();
        t.1 = vec![16, 32]; // [in, out] swapped: the HF shape is [16, 32]
    });
    let e = load_err(&p);
    assert!(
        e.contains("shape.gguf")
            && e.contains("blk.1.attn_v.weight")
            && e.contains("[16, 32]")
            && e.contains("[32, 16]")
            && e.contains("model.layers.1.self_attn.v_proj.weight"),
        "{e}"
    );
    let p = edited(dir.path(), "missing.gguf", |_, tensors| tensors.retain(|t| t.0 != "blk.0.ffn_gate.weight"));
    let e = load_err(&p);
    assert!(
        e.contains("missing.gguf") && e.contains("model.layers.0.mlp.gate_proj.weight") && e.contains("[32, 64]"),
        "{e}"
    );
    let p = edited(dir.path(), "extra.gguf", |_, tensors| {
        tensors.push(("blk.0.attn_rot_embd".into(), vec![4], vec![0.0; 4]))
    });
    let e = load_err(&p);
    assert!(e.contains("extra.gguf") && e.contains("unexpected tensor `blk.0.attn_rot_embd`"), "{e}");
    // rope_freqs.weight: one positive factor per frequency (head_dim 8: 4).
    let p =
        edited(dir.path(), "rope.gguf", |_, tensors| tensors.push(("rope_freqs.weight".into(), vec![3], vec![1.0; 3])));
    let e = load_err(&p);
    assert!(e.contains("rope.gguf") && e.contains("rope_freqs.weight") && e.contains("expected [4]"), "{e}");
    let p = edited(dir.path(), "rope0.gguf", |_, tensors| {
        tensors.push(("rope_freqs.weight".into(), vec![4], vec![1.0, 2.0, 0.0, 8.0]))
    });
    let e = load_err(&p);
    assert!(e.contains("rope0.gguf") && e.contains("rope_freqs.weight") && e.contains("must be positive"), "{e}");
    let p = edited(dir.path(), "nan.gguf", |_, tensors| tensors[3].2[5] = f32::NAN);
    let e = load_err(&p);
    assert!(e.contains("nan.gguf") && e.contains("non-finite"), "{e}");
}

/// `rope_freqs.weight` divides the rope frequencies (llama.cpp): all ones change nothing, other
/// factors change the logits, and a checkpoint saved from the file keeps them.
#[test]
fn rope_freqs_divide_the_frequencies_and_survive_a_save() {
    let dir = tempfile::tempdir().unwrap();
    let with = |name: &str, factors: Vec<f32>| {
        gguf::load(&edited(dir.path(), name, |_, tensors| tensors.push(("rope_freqs.weight".into(), vec![4], factors.clone()))))
            .unwrap()
            .model
    };
    let plain = gguf::load(&write(dir.path(), "plain.gguf", &gguf_of(&random_model("llama", true)))).unwrap().model;
    let ones = with("ones.gguf", vec![1.0; 4]);
    let scaled = with("scaled.gguf", vec![1.0, 1.5, 8.0, 8.0]);
    assert!(ones.config.rope_freq_factors().unwrap().is_none());
    assert_eq!(scaled.config.rope_freq_factors().unwrap(), Some(vec![1.0, 1.5, 8.0, 8.0]));
    let ids: Vec<u32> = (0..24).map(|i| (i * 7 % 64) as u32).collect();
    let logits = |m: &Model| m.logits(&Seq::new(&ids)).unwrap();
    assert_eq!(logits(&ones), logits(&plain));
    assert_ne!(logits(&scaled), logits(&plain));
    let saved = dir.path().join("saved");
    scaled.save(&saved, coa_model::SaveDtype::F32).unwrap();
    assert_eq!(logits(&Model::load(&saved).unwrap()), logits(&scaled));
}

/// A toy SentencePiece vocabulary read as each tokenizer class transformers picks by
/// architecture. The expected values are transformers 5.23's (`convert_gguf_tokenizer(arch,
/// {"tokenizer_type": "llama", "tokens": ..., "scores": ..., "token_type": ...})`): the merges
/// rebuilt from the scores, the class's default special tokens with the next free ids (Gemma's
/// two runs of spaces both become "▁▁", leaving a hole at 6 that its `<bos>` fills at 7 as
/// tokenizers does), and ids.
#[test]
fn sentencepiece_vocabularies_build_as_transformers_does() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = ["<x>", "a", "b", "ab", "\u{2581}a", "\u{2581}", "  ", " \n"];
    let build = |arch: &str| {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::String(arch.into()));
        w.kv("tokenizer.ggml.model", Value::String("llama".into()));
        w.kv("tokenizer.ggml.tokens", Value::Array(tokens.iter().map(|t| Value::String(t.to_string())).collect()));
        w.kv("tokenizer.ggml.scores", Value::Array([0.0f32, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0].map(Value::F32).to_vec()));
        w.kv("tokenizer.ggml.token_type", Value::Array([3, 1, 1, 1, 1, 1, 1, 1].map(Value::I32).to_vec()));
        gguf::load_tokenizer(&write(dir.path(), &format!("{arch}.gguf"), &w)).unwrap().tokenizer
    };
    let merges = |t: &tokenizers::Tokenizer| -> Vec<String> {
        let j: serde_json::Value = serde_json::from_str(&t.to_string(false).unwrap()).unwrap();
        j["model"]["merges"].as_array().unwrap().iter().map(|m| format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap())).collect()
    };
    let added = |t: &tokenizers::Tokenizer| -> Vec<(u32, String)> {
        let mut a: Vec<(u32, String)> = t.get_added_tokens_decoder().into_iter().map(|(i, t)| (i, t.content)).collect();
        a.sort();
        a
    };
    let ids = |t: &tokenizers::Tokenizer, text: &str| t.encode(text, true).unwrap().get_ids().to_vec();
    let s = |v: &[(u32, &str)]| v.iter().map(|(i, t)| (*i, t.to_string())).collect::<Vec<_>>();
    for arch in ["llama", "phi3"] {
        let t = build(arch);
        assert_eq!(merges(&t), ["a b", "\u{2581} a"], "{arch}");
        assert_eq!(added(&t), s(&[(0, "<x>"), (8, "<s>"), (9, "</s>"), (10, "<unk>")]), "{arch}");
        assert_eq!(ids(&t, "ab a  b<x>"), [5, 3, 4, 5, 5, 2, 0], "{arch}");
    }
    assert_eq!(ids(&build("llama"), " ba"), [5, 2, 1]);
    assert_eq!(ids(&build("phi3"), " ba"), [5, 5, 2, 1], "Phi-3 prepends ▁ to a leading space too");
    let g = build("gemma3");
    assert_eq!(merges(&g), ["a b", "\u{2581} a", "\u{2581} \u{2581}"]);
    assert_eq!(added(&g), s(&[(0, "<x>"), (7, "<bos>"), (8, "<eos>"), (9, "<unk>"), (10, "<pad>"), (11, "<mask>")]));
    assert_eq!(ids(&g, "ab a  b<x>"), [3, 4, 7, 2, 0]);
    assert_eq!(ids(&g, " ba"), [5, 2, 1]);
}

#[test]
fn metadata_errors_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = edited(dir.path(), "nolayers.gguf", |meta, _| meta.retain(|(k, _)| k != "llama.block_count"));
    let e = load_err(&p);
    assert!(e.contains("nolayers.gguf") && e.contains("`llama.block_count` is missing"), "{e}");
    let p = edited(dir.path(), "t5.gguf", |meta, _| {
        meta.iter_mut().find(|(k, _)| k == "tokenizer.ggml.model").unwrap().1 = Value::String("t5".into());
    });
    let e = load_err(&p);
    assert!(e.contains("t5.gguf") && e.contains("\"t5\"") && e.contains("\"gpt2\"") && e.contains("SentencePiece"), "{e}");
    // A SentencePiece vocabulary without merges needs the scores to rebuild them from.
    let p = edited(dir.path(), "spm.gguf", |meta, _| {
        meta.iter_mut().find(|(k, _)| k == "tokenizer.ggml.model").unwrap().1 = Value::String("llama".into());
        meta.retain(|(k, _)| k != "tokenizer.ggml.merges");
    });
    let e = load_err(&p);
    assert!(e.contains("spm.gguf") && e.contains("tokenizer.ggml.scores") && e.contains("missing"), "{e}");
    let p = edited(dir.path(), "badbos.gguf", |meta, _| {
        meta.iter_mut().find(|(k, _)| k == "tokenizer.ggml.bos_token_id").unwrap().1 = Value::U32(5000);
    });
    let e = load_err(&p);
    assert!(e.contains("badbos.gguf") && e.contains("tokenizer.ggml.bos_token_id") && e.contains("5000"), "{e}");
    let p = edited(dir.path(), "scaled.gguf", |meta, _| {
        meta.push(("llama.rope.scaling.type".into(), Value::String("linear".into())))
    });
    let e = load_err(&p);
    assert!(e.contains("scaled.gguf") && e.contains("rope scaling"), "{e}");
}
