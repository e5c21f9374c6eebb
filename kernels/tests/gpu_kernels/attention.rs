//! `kernels/attention.cu` (launchers: `src/ops/attention.rs`) against the CPU reference
//! `coa_model::ops::attention_forward_prefix` / `attention_backward_prefix`: GQA ratios, both head
//! dims, tails, packed segments, batches of two, sliding windows.

use super::*;
use coa_kernels::ops::attention::{AttnLayout, AttnShape, Qkv, QkvGrads};

#[test]
fn attention_fwd_bwd_matches_cpu() {
    let test = "attention_fwd_bwd_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (hd, hq, hkv) in [(64usize, 4usize, 4usize), (64, 4, 2), (128, 6, 2), (128, 8, 1), (64, 2, 1), (128, 2, 2)] {
        let b = 1 + rng.below(2);
        let t = [1usize, 17, 64, 65, 127, 200, 333][rng.below(7)];
        case(&gpu, &mut rng, AttnShape { batch: b, seq: t, q_heads: hq, kv_heads: hkv, head_dim: hd, window: 0 });
    }
}

/// Sliding windows shorter than the sequence (1: each query sees itself only; 37 and 100, not
/// block-aligned; 64, one key block), on one sequence and on packed segments longer and shorter
/// than the window: the forward must skip and mask the keys before each query's window, and the
/// backward's query loop must stop where the key block's window ends.
#[test]
fn attention_sliding_window_cases() {
    let test = "attention_sliding_window_cases";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    let split: Vec<i32> = (0..200).map(|i| if i < 30 { 0 } else if i < 150 { 1 } else { 2 }).collect();
    for (hd, hq, hkv, window) in [(64usize, 4usize, 2usize, 37usize), (128, 2, 1, 100), (64, 2, 2, 1), (128, 4, 2, 64)] {
        let s = AttnShape { batch: 1, seq: 200, q_heads: hq, kv_heads: hkv, head_dim: hd, window };
        case_with(&gpu, &mut rng, s, Some(vec![None]));
        case_with(&gpu, &mut rng, s, Some(vec![Some(split.clone())]));
    }
}

/// The cases random shapes may miss, in every run: a sequence of four 64-row blocks, so the
/// forward refills a K/V buffer (the third key block of a query block goes into the first one's
/// buffer) and the backward's dQ rows take atomics from several key blocks; and the same length
/// packed as two segments split at row 100, inside key block 1 (rows 64..127): query blocks past
/// the split still see that block's keys 100..127, so the backward's query loop must not stop
/// before them (`m_stop`), whatever the seed.
#[test]
fn attention_long_and_packed_cases() {
    let test = "attention_long_and_packed_cases";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    let split: Vec<i32> = (0..256).map(|i| i32::from(i >= 100)).collect();
    for (hd, hq, hkv) in [(64usize, 4usize, 2usize), (128, 2, 1)] {
        let s = AttnShape { batch: 1, seq: 256, q_heads: hq, kv_heads: hkv, head_dim: hd, window: 0 };
        case_with(&gpu, &mut rng, s, Some(vec![None]));
        case_with(&gpu, &mut rng, s, Some(vec![Some(split.clone())]));
    }
}

/// For the schedule-order test: two query blocks (the diagonal and the one before it), GQA, both
/// head dims.
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, AttnShape { batch: 1, seq: 70, q_heads: 4, kv_heads: 2, head_dim: 64, window: 0 });
    case(gpu, rng, AttnShape { batch: 2, seq: 40, q_heads: 2, kv_heads: 1, head_dim: 128, window: 0 });
    case(gpu, rng, AttnShape { batch: 1, seq: 70, q_heads: 2, kv_heads: 1, head_dim: 64, window: 19 });
}

fn case(gpu: &Gpu, rng: &mut Rng, s: AttnShape) {
    case_with(gpu, rng, s, None)
}

/// One case with the given segment ids per sequence (None: random ones).
fn case_with(gpu: &Gpu, rng: &mut Rng, s: AttnShape, segments: Option<Vec<Option<Vec<i32>>>>) {
    let AttnShape { batch: b, seq: t, q_heads: hq, kv_heads: hkv, head_dim: hd, window } = s;

    let segs: Vec<Option<Vec<i32>>> = segments.unwrap_or_else(|| (0..b).map(|_| random_segments(rng, t)).collect());
    let use_seg = segs.iter().any(|x| x.is_some());
    eprintln!(" shape {s:?}, segments {use_seg}");
    let (qw, kw) = (hq * hd, hkv * hd);
    let q = round_bf16(&rng.normals(b * t * qw, 1.0));
    let k = round_bf16(&rng.normals(b * t * kw, 1.0));
    let v = round_bf16(&rng.normals(b * t * kw, 1.0));
    let dout = round_bf16(&rng.normals(b * t * qw, 1.0));

    // CPU reference, one sequence at a time.
    let mut o_ref = vec![0f32; b * t * qw];
    let mut lse_ref = vec![0f32; b * t * hq];
    let (mut dq_ref, mut dk_ref, mut dv_ref) = (vec![0f32; b * t * qw], vec![0f32; b * t * kw], vec![0f32; b * t * kw]);
    let mut seg_start_all = Vec::with_capacity(b * t);
    for bi in 0..b {
        let (_, start) = ops::segment_layout(t, segs[bi].as_deref());
        seg_start_all.extend(start.iter().map(|&x| x as i32));
        let (qs, ks) = (bi * t * qw..(bi + 1) * t * qw, bi * t * kw..(bi + 1) * t * kw);
        let f32_ = coa_model::MatmulDtype::F32;
        let x = ops::Qkv { q: &q[qs.clone()], k: &k[ks.clone()], v: &v[ks.clone()] };
        let shape = ops::AttentionShape { window, ..ops::AttentionShape::segments(&start, hq, hkv, hd) };
        ops::attention_forward_prefix(&mut o_ref[qs.clone()], &mut lse_ref[bi * t * hq..(bi + 1) * t * hq], x, shape, f32_);
        // The GPU's backward reads the bf16 o it wrote; give the reference the same rounding.
        let o_b = round_bf16(&o_ref[qs.clone()]);
        let grads = ops::QkvGrads { dq: &mut dq_ref[qs.clone()], dk: &mut dk_ref[ks.clone()], dv: &mut dv_ref[ks.clone()] };
        ops::attention_backward_prefix(grads, &dout[qs.clone()], x, &o_b, &lse_ref[bi * t * hq..(bi + 1) * t * hq], shape, f32_);
    }

    let l = AttnLayout::contiguous(&s);
    let (qd, kd, vd, dod) = (gpu.upload_bf16(&q).unwrap(), gpu.upload_bf16(&k).unwrap(), gpu.upload_bf16(&v).unwrap(), gpu.upload_bf16(&dout).unwrap());
    let seg_d = if use_seg { Some(gpu.upload(&seg_start_all).unwrap()) } else { None };
    let mut od = poison_bf16(gpu, q.len());
    let mut lsed = poison_f32(gpu, b * t * hq);
    gpu.attention_fwd(&s, &l, Qkv { q: &qd, k: &kd, v: &vd }, seg_d.as_ref(), &mut od, &mut lsed).unwrap();
    let (mut dqd, mut dkd, mut dvd) = (poison_bf16(gpu, q.len()), poison_bf16(gpu, k.len()), poison_bf16(gpu, v.len()));
    let grads = QkvGrads { dq: &mut dqd, dk: &mut dkd, dv: &mut dvd };
    gpu.attention_bwd(&s, &l, Qkv { q: &qd, k: &kd, v: &vd }, &od, &lsed, seg_d.as_ref(), &dod, grads).unwrap();
    let o = gpu.download_bf16(&od).unwrap();
    let lse = gpu.download(&lsed).unwrap();
    let vmax = max_abs(&v);
    // o: P rounded to bf16 inside (2^-9 relative per weight) plus the output rounding.
    check("attention o", &o, &o_ref, BF16_ULP * vmax, BF16_ULP, 1e-2);
    check("attention lse", &lse, &lse_ref, 1e-3, 1e-4, 1e-4);
    // Gradients go through bf16 P and dS and two bf16 products: 1/64 of the largest value
    // element-wise, and 2% in L2. The terms of dS = P (dP - delta) are of order |dO| |V|; where
    // they cancel (one key: P = 1, dS = 0, so dq = dk = 0) the f32 reference holds only rounding
    // noise (~1e-7), so the scale is at least a thousandth of |dO| |V| and the L2 check needs a
    // gradient above that.
    let floor = 1e-3 * max_abs(&dout) * vmax;
    for (name, d, r) in [("attention dq", &dqd, &dq_ref), ("attention dk", &dkd, &dk_ref), ("attention dv", &dvd, &dv_ref)] {
        let got = gpu.download_bf16(d).unwrap();
        let scale = max_abs(r).max(floor);
        let rel_l2 = if max_abs(r) > floor { 2e-2 } else { f64::INFINITY };
        check(name, &got, r, scale / 64.0, 2.0 * BF16_ULP, rel_l2);
    }
}
