//! `kernels/decode_attention.cu` (launchers: `src/ops/decode_attention.rs`): keys and values
//! appended to a slot cache in two calls (a prefill of each slot's first rows, then its last few
//! rows, as a decode step or an observation), each call's rows attending over their slot's cache.
//! The reference is the training attention over each slot's whole sequence (one segment,
//! `coa_model::ops::attention_forward`): row p of it equals the decode output at position p.

use super::*;
use coa_kernels::ops::decode_attention::{CacheShape, KvCacheRows};

#[test]
fn decode_attention_matches_cpu() {
    let test = "decode_attention_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (hd, hq, hkv) in [(64usize, 4usize, 4usize), (64, 4, 2), (128, 8, 2), (32, 2, 1), (80, 6, 3), (256, 2, 2)] {
        case(&gpu, &mut rng, hd, hq, hkv, 300, 0);
    }
}

/// A sliding window shorter than the slots' lengths (not a multiple of the 32-key chunk, and 1):
/// each row attends to its last `window` positions only, though the cache holds them all.
#[test]
fn decode_attention_with_a_window_matches_cpu() {
    let test = "decode_attention_with_a_window_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (hd, hq, hkv, window) in [(64usize, 4usize, 2usize, 45usize), (128, 2, 1, 1), (32, 2, 2, 70)] {
        case(&gpu, &mut rng, hd, hq, hkv, 300, window);
    }
}

/// For the schedule-order test.
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, 64, 4, 2, 70, 0);
    case(gpu, rng, 64, 2, 1, 70, 9);
}

fn case(gpu: &Gpu, rng: &mut Rng, hd: usize, hq: usize, hkv: usize, max_len: usize, window: usize) {

    let slots = 3usize;
    let (qw, kw) = (hq * hd, hkv * hd);
    // Per slot: its length and how many of its last rows come in the second call.
    let lens: Vec<usize> = (0..slots).map(|_| 1 + rng.below(max_len)).collect();
    let tails: Vec<usize> = lens.iter().map(|&n| 1 + rng.below(n.min(4))).collect();
    eprintln!(" head_dim {hd}, heads {hq}/{hkv}, window {window}, slot lengths {lens:?}, second-call rows {tails:?}");
    let q: Vec<Vec<f32>> = lens.iter().map(|&n| round_bf16(&rng.normals(n * qw, 1.0))).collect();
    let k: Vec<Vec<f32>> = lens.iter().map(|&n| round_bf16(&rng.normals(n * kw, 1.0))).collect();
    let v: Vec<Vec<f32>> = lens.iter().map(|&n| round_bf16(&rng.normals(n * kw, 1.0))).collect();
    let o_ref: Vec<Vec<f32>> = (0..slots)
        .map(|s| {
            let n = lens[s];
            let (_, start) = ops::segment_layout(n, None);
            let (mut o, mut lse) = (vec![0f32; n * qw], vec![0f32; n * hq]);
            let shape = ops::AttentionShape { window, ..ops::AttentionShape::segments(&start, hq, hkv, hd) };
            ops::attention_forward_prefix(&mut o, &mut lse, ops::Qkv { q: &q[s], k: &k[s], v: &v[s] }, shape, coa_model::MatmulDtype::F32);
            o
        })
        .collect();

    let (mut kc, mut vc) = (gpu.zeros::<bf16>(slots * max_len * kw).unwrap(), gpu.zeros::<bf16>(slots * max_len * kw).unwrap());
    for call in 0..2 {
        // Rows of this call, slots interleaved: (slot, position).
        let mut rows: Vec<(usize, usize)> = Vec::new();
        for s in 0..slots {
            let split = lens[s] - tails[s];
            let range = if call == 0 { 0..split } else { split..lens[s] };
            rows.extend(range.map(|p| (s, p)));
        }
        for i in (1..rows.len()).rev() {
            rows.swap(i, rng.below(i + 1));
        }
        if rows.is_empty() {
            continue;
        }
        let gather = |src: &[Vec<f32>], w: usize| -> Vec<f32> { rows.iter().flat_map(|&(s, p)| src[s][p * w..(p + 1) * w].to_vec()).collect() };
        let (qn, kn, vn, want) = (gather(&q, qw), gather(&k, kw), gather(&v, kw), gather(&o_ref, qw));
        let slot_i: Vec<i32> = rows.iter().map(|&(s, _)| s as i32).collect();
        let pos_i: Vec<i32> = rows.iter().map(|&(_, p)| p as i32).collect();
        let shape = CacheShape { rows: rows.len(), q_heads: hq, kv_heads: hkv, head_dim: hd, slots, max_len };
        let (qd, kd, vd) = (gpu.upload_bf16(&qn).unwrap(), gpu.upload_bf16(&kn).unwrap(), gpu.upload_bf16(&vn).unwrap());
        let (sd, pd) = (gpu.upload(&slot_i).unwrap(), gpu.upload(&pos_i).unwrap());
        gpu.kv_append(&shape, &kd, &vd, kw, &mut kc, &mut vc, &sd, &pd).unwrap();
        let mut od = poison_bf16(gpu, rows.len() * qw);
        let cache = KvCacheRows { k_cache: &kc, v_cache: &vc, slot: &sd, pos: &pd };
        gpu.attn_extend(&shape, &qd, qw, cache, &mut od, window).unwrap();
        let got = gpu.download_bf16(&od).unwrap();
        // fp32 softmax and accumulation (fast exp), then one bf16 rounding of the output.
        check(&format!("decode attention (call {call})"), &got, &want, BF16_ULP * max_abs(&vn), BF16_ULP, 1e-2);
    }
}
