//! Every kernel against the f32 CPU reference (`coa_model::ops`), on fresh random inputs each run
//! (the seed is printed; `COA_TEST_SEED=N` replays one), with shapes drawn at random too (tails,
//! GQA ratios, packed segments). Every output element is checked, outputs are poisoned with NaN
//! before each launch so an unwritten element fails.
//!
//! Inputs are rounded to bf16 first and the CPU reference runs on the rounded values, so the
//! differences measured are the kernel's own: fp32 accumulation order, bf16 intermediates
//! (attention's P and dS), and the final bf16 rounding of the outputs. Tolerances, per output:
//! `|got - want| <= atol + rtol * |want|` for every element, and for the matmul-like outputs also
//! `||got - want|| / ||want|| <= rel_l2` (values in each check's call below).
//!
//! Without a CUDA device each test prints `skipped: no CUDA device (...)` on stdout and stderr and
//! returns: these tests need the GPU machine (bench/gpu/run.sh runs them there).

use coa_kernels::ops::adamw::AdamWArgs;
use coa_kernels::ops::attention::{AttnLayout, AttnShape};
use coa_kernels::rng::Rng;
use coa_kernels::testing::{gpu_or_skip, seeded};
use coa_kernels::{bf16, Gpu};
use coa_model::ops;

const BF16_ULP: f32 = 1.0 / 128.0; // relative spacing of bf16 (8 significant bits): 2^-7

fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |a, &b| a.max(b.abs()))
}

/// Every element within `atol + rtol*|want|`, no NaN; and relative L2 error <= `rel_l2`.
#[track_caller]
fn check(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32, rel_l2: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f32);
    let mut bad = 0usize;
    let (mut num, mut den) = (0f64, 0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let tol = atol + rtol * w.abs();
        if !(err <= tol) {
            bad += 1;
            if bad == 1 || !(err <= worst.1) {
                worst = (i, err);
            }
        }
        num += ((g - w) as f64).powi(2);
        den += (w as f64).powi(2);
    }
    let rel = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    eprintln!("  {what}: {} elements, max |want| {:.3e}, rel L2 err {rel:.2e}, {bad} outside tolerance", got.len(), max_abs(want));
    assert!(
        bad == 0,
        "{what}: {bad} of {} elements outside atol {atol:e} + rtol {rtol:e}; worst at {}: got {} want {}",
        got.len(),
        worst.0,
        got[worst.0],
        want[worst.0]
    );
    assert!(rel <= rel_l2, "{what}: relative L2 error {rel:e} > {rel_l2:e}");
}

fn poison_bf16(gpu: &Gpu, n: usize) -> coa_kernels::cudarc::driver::CudaSlice<bf16> {
    gpu.upload(&vec![bf16::NAN; n]).unwrap()
}
fn poison_f32(gpu: &Gpu, n: usize) -> coa_kernels::cudarc::driver::CudaSlice<f32> {
    gpu.upload(&vec![f32::NAN; n]).unwrap()
}

/// Random segment ids for a packed sequence of `t` tokens (None half the time).
fn random_segments(rng: &mut Rng, t: usize) -> Option<Vec<i32>> {
    if rng.uniform() < 0.5 {
        return None;
    }
    let mut ids = Vec::with_capacity(t);
    let mut id = 0;
    while ids.len() < t {
        let len = 1 + rng.below(t.max(2) / 2 + 1);
        for _ in 0..len.min(t - ids.len()) {
            ids.push(id);
        }
        id += 1;
    }
    Some(ids)
}

#[test]
fn attention_fwd_bwd_matches_cpu() {
    let test = "attention_fwd_bwd_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    let configs = [(64usize, 4usize, 4usize), (64, 4, 2), (128, 6, 2), (128, 8, 1), (64, 2, 1), (128, 2, 2)];
    for round in 0..6 {
        let (hd, hq, hkv) = configs[round];
        let b = 1 + rng.below(2);
        let t = [1usize, 17, 64, 65, 127, 200, 333][rng.below(7)];
        let s = AttnShape { batch: b, seq: t, q_heads: hq, kv_heads: hkv, head_dim: hd };
        let segs: Vec<Option<Vec<i32>>> = (0..b).map(|_| random_segments(&mut rng, t)).collect();
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
            ops::attention_forward(&mut o_ref[qs.clone()], &mut lse_ref[bi * t * hq..(bi + 1) * t * hq], &q[qs.clone()], &k[ks.clone()], &v[ks.clone()], &start, hq, hkv, hd);
            // The GPU's backward reads the bf16 o it wrote; give the reference the same rounding.
            let o_b = round_bf16(&o_ref[qs.clone()]);
            ops::attention_backward(
                &mut dq_ref[qs.clone()],
                &mut dk_ref[ks.clone()],
                &mut dv_ref[ks.clone()],
                &dout[qs.clone()],
                &q[qs.clone()],
                &k[ks.clone()],
                &v[ks.clone()],
                &o_b,
                &lse_ref[bi * t * hq..(bi + 1) * t * hq],
                &start,
                hq,
                hkv,
                hd,
            );
        }

        let l = AttnLayout::contiguous(&s);
        let (qd, kd, vd, dod) = (gpu.upload_bf16(&q).unwrap(), gpu.upload_bf16(&k).unwrap(), gpu.upload_bf16(&v).unwrap(), gpu.upload_bf16(&dout).unwrap());
        let seg_d = if use_seg { Some(gpu.upload(&seg_start_all).unwrap()) } else { None };
        let mut od = poison_bf16(&gpu, q.len());
        let mut lsed = poison_f32(&gpu, b * t * hq);
        gpu.attention_fwd(&s, &l, &qd, &kd, &vd, seg_d.as_ref(), &mut od, &mut lsed).unwrap();
        let (mut dqd, mut dkd, mut dvd) = (poison_bf16(&gpu, q.len()), poison_bf16(&gpu, k.len()), poison_bf16(&gpu, v.len()));
        gpu.attention_bwd(&s, &l, &qd, &kd, &vd, &od, &lsed, seg_d.as_ref(), &dod, &mut dqd, &mut dkd, &mut dvd).unwrap();
        let o = gpu.download_bf16(&od).unwrap();
        let lse = gpu.download(&lsed).unwrap();
        let vmax = max_abs(&v);
        // o: P rounded to bf16 inside (2^-9 relative per weight) plus the output rounding.
        check("attention o", &o, &o_ref, BF16_ULP * vmax, BF16_ULP, 1e-2);
        check("attention lse", &lse, &lse_ref, 1e-3, 1e-4, 1e-4);
        // Gradients go through bf16 P and dS and two bf16 products: 1/64 of the largest value
        // element-wise, and 2% in L2.
        for (name, d, r) in [("attention dq", &dqd, &dq_ref), ("attention dk", &dkd, &dk_ref), ("attention dv", &dvd, &dv_ref)] {
            let got = gpu.download_bf16(d).unwrap();
            check(name, &got, r, max_abs(r) / 64.0, 2.0 * BF16_ULP, 2e-2);
        }
    }
}

#[test]
fn cross_entropy_matches_cpu() {
    let test = "cross_entropy_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    // Vocab sizes: vector path, scalar path (odd), and one larger than a block's shared-memory
    // row cache (re-read path).
    for &(n, v) in &[(37usize, 4096usize), (16, 1001), (9, 32003), (5, 151_936), (64, 512)] {
        let logits = round_bf16(&(0..n * v).map(|_| rng.normal() * 3.0).collect::<Vec<_>>());
        let targets: Vec<u32> = (0..n).map(|_| rng.below(v) as u32).collect();
        let all_masked = n == 64;
        let mask: Vec<f32> = (0..n).map(|_| if !all_masked && rng.uniform() < 0.7 { 1.0 } else { 0.0 }).collect();
        let (loss_ref, grad_ref) = ops::masked_cross_entropy(&logits, &targets, &mask, v);

        let mut xd = gpu.upload_bf16(&logits).unwrap();
        let td = gpu.upload(&targets.iter().map(|&x| x as i32).collect::<Vec<_>>()).unwrap();
        let md = gpu.upload(&mask).unwrap();
        let loss = gpu.masked_cross_entropy(&mut xd, &td, &md, n, v).unwrap();
        let grad = gpu.download_bf16(&xd).unwrap();
        eprintln!(" N {n} V {v}: loss {loss} (cpu {loss_ref})");
        assert!((loss - loss_ref).abs() <= 1e-4 * (1.0 + loss_ref.abs()), "loss {loss} vs {loss_ref}");
        check(&format!("xent grad (V {v})"), &grad, &grad_ref, 1e-3 * max_abs(&grad_ref) + 1e-9, BF16_ULP, 1e-2);
        if all_masked {
            assert_eq!(loss, 0.0);
            assert!(grad.iter().all(|&g| g == 0.0), "all-masked batch must give zero gradient");
        }

        // RL form: per-token weights c = d loss / d logp (any sign), gradient c * (onehot - p),
        // and the log-probs themselves.
        let c: Vec<f32> = (0..n).map(|i| if i % 5 == 3 { 0.0 } else { rng.normal() }).collect();
        let tg: Vec<Option<u32>> = targets.iter().map(|&t| Some(t)).collect();
        let (mut logp_ref, mut ent, mut lse_ref) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        ops::logsoftmax_forward(&mut logp_ref, &mut ent, &mut lse_ref, &logits, &tg, v);
        let mut z = logits.clone();
        ops::logsoftmax_backward_inplace(&mut z, &lse_ref, &tg, &c, v);
        let mut xd = gpu.upload_bf16(&logits).unwrap();
        let gd = gpu.upload(&c.iter().map(|x| -x).collect::<Vec<_>>()).unwrap();
        let mut logpd = poison_f32(&gpu, n);
        let mut lsed = poison_f32(&gpu, n);
        gpu.xent_fwd_bwd(&mut xd, &td, Some(&gd), &mut logpd, Some(&mut lsed), n, v, true).unwrap();
        let grad = gpu.download_bf16(&xd).unwrap();
        check(&format!("xent RL grad (V {v})"), &grad, &z, 1e-3 * max_abs(&z) + 1e-9, BF16_ULP, 1e-2);
        // Rows with c = 0 are skipped (logp 0); the others carry log-probs.
        let logp = gpu.download(&logpd).unwrap();
        let want: Vec<f32> = (0..n).map(|i| if c[i] == 0.0 { 0.0 } else { logp_ref[i] }).collect();
        check(&format!("xent logp (V {v})"), &logp, &want, 2e-4, 1e-5, 1e-4);
        // Forward only: every row's log-prob, logits unchanged.
        let mut xd = gpu.upload_bf16(&logits).unwrap();
        let mut logpd = poison_f32(&gpu, n);
        gpu.xent_fwd_bwd(&mut xd, &td, None, &mut logpd, Some(&mut lsed), n, v, false).unwrap();
        check(&format!("xent logp fwd-only (V {v})"), &gpu.download(&logpd).unwrap(), &logp_ref, 2e-4, 1e-5, 1e-4);
        check(&format!("xent lse (V {v})"), &gpu.download(&lsed).unwrap(), &lse_ref, 2e-4, 1e-5, 1e-4);
        assert_eq!(gpu.download_bf16(&xd).unwrap(), logits, "forward-only must not touch the logits");
    }
}

#[test]
fn xent_entropy_matches_cpu() {
    let test = "xent_entropy_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    for &(n, v) in &[(37usize, 4096usize), (16, 1001), (5, 151_936)] {
        let logits = round_bf16(&(0..n * v).map(|_| rng.normal() * 3.0).collect::<Vec<_>>());
        // Every 4th row has no target: entropy 0 there, like the CPU reference.
        let tg: Vec<Option<u32>> = (0..n).map(|i| (i % 4 != 1).then(|| rng.below(v) as u32)).collect();
        let (mut logp_ref, mut ent_ref, mut lse_ref) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        ops::logsoftmax_forward(&mut logp_ref, &mut ent_ref, &mut lse_ref, &logits, &tg, v);
        let xd = gpu.upload_bf16(&logits).unwrap();
        let mut xw = gpu.upload_bf16(&logits).unwrap();
        let td = gpu.upload(&tg.iter().map(|t| t.map_or(-1, |x| x as i32)).collect::<Vec<_>>()).unwrap();
        let (mut logpd, mut lsed, mut entd) = (poison_f32(&gpu, n), poison_f32(&gpu, n), poison_f32(&gpu, n));
        gpu.xent_fwd_bwd(&mut xw, &td, None, &mut logpd, Some(&mut lsed), n, v, false).unwrap();
        gpu.xent_entropy(&xd, &td, &lsed, &mut entd, n, v).unwrap();
        // f32 sums of V terms from the same bf16 logits: relative 1e-4.
        check(&format!("xent entropy (V {v})"), &gpu.download(&entd).unwrap(), &ent_ref, 2e-4, 1e-4, 1e-4);
    }
}

#[test]
fn rmsnorm_matches_cpu() {
    let test = "rmsnorm_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    for &(n, d) in &[(1usize, 64usize), (77, 768), (300, 1024), (5, 4098)] {
        let eps = 1e-6f32;
        let x = round_bf16(&rng.normals(n * d, 1.5));
        let w = round_bf16(&(0..d).map(|_| rng.range(0.5, 1.5)).collect::<Vec<_>>());
        let dy = round_bf16(&rng.normals(n * d, 1.0));
        let (mut y_ref, mut rstd_ref) = (vec![0f32; n * d], vec![0f32; n]);
        ops::rmsnorm_forward(&mut y_ref, &mut rstd_ref, &x, &w, eps, d);
        let dx0 = round_bf16(&rng.normals(n * d, 0.5)); // residual gradient already there
        let dw0: Vec<f32> = rng.normals(d, 1.0);
        let (mut dx_ref, mut dw_ref) = (dx0.clone(), dw0.clone());
        ops::rmsnorm_backward(&mut dx_ref, &mut dw_ref, &dy, &x, &w, &rstd_ref, d);

        let (xd, wd, dyd) = (gpu.upload_bf16(&x).unwrap(), gpu.upload_bf16(&w).unwrap(), gpu.upload_bf16(&dy).unwrap());
        let (mut yd, mut rd) = (poison_bf16(&gpu, n * d), poison_f32(&gpu, n));
        gpu.rmsnorm_fwd(&xd, &wd, &mut yd, &mut rd, n, d, eps).unwrap();
        check(&format!("rmsnorm y ({n}x{d})"), &gpu.download_bf16(&yd).unwrap(), &y_ref, 1e-6, BF16_ULP, 1e-2);
        check(&format!("rmsnorm rstd ({n}x{d})"), &gpu.download(&rd).unwrap(), &rstd_ref, 0.0, 1e-5, 1e-5);
        let mut dxd = gpu.upload_bf16(&dx0).unwrap();
        let mut dwd = gpu.upload(&dw0).unwrap();
        gpu.rmsnorm_bwd(&dyd, &xd, &wd, &rd, &mut dxd, &mut dwd, n, d, true).unwrap();
        check(&format!("rmsnorm dx ({n}x{d})"), &gpu.download_bf16(&dxd).unwrap(), &dx_ref, 1e-3 * max_abs(&dx_ref), BF16_ULP, 1e-2);
        check(&format!("rmsnorm dw ({n}x{d})"), &gpu.download(&dwd).unwrap(), &dw_ref, 1e-4 * max_abs(&dw_ref), 1e-4, 1e-4);
    }
}

#[test]
fn rope_matches_cpu() {
    let test = "rope_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    for &(t, h, hd, theta) in &[(50usize, 4usize, 64usize, 10_000.0f64), (129, 2, 128, 1_000_000.0), (3, 8, 32, 500_000.0)] {
        let segs = random_segments(&mut rng, t);
        let (pos, _) = ops::segment_layout(t, segs.as_deref());
        let (cos, sin) = ops::rope_tables(&pos, hd, theta);
        let x = round_bf16(&rng.normals(t * h * hd, 1.0));
        let mut want = x.clone();
        ops::rope_forward(&mut want, &cos, &sin, h, hd);
        let (cd, sd) = (gpu.upload(&cos).unwrap(), gpu.upload(&sin).unwrap());
        let mut xd = gpu.upload_bf16(&x).unwrap();
        gpu.rope(&mut xd, None, &cd, &sd, t, h, hd, h * hd, hd, false).unwrap();
        check(&format!("rope fwd (T {t} hd {hd})"), &gpu.download_bf16(&xd).unwrap(), &want, 1e-3 * max_abs(&want), BF16_ULP, 1e-2);
        // Position-indexed tables (rows = positions 0..max) give the same result.
        let maxp = *pos.iter().max().unwrap() as usize + 1;
        let (cos_p, sin_p) = ops::rope_tables(&(0..maxp as u32).collect::<Vec<_>>(), hd, theta);
        let posd = gpu.upload(&pos.iter().map(|&p| p as i32).collect::<Vec<_>>()).unwrap();
        let (cpd, spd) = (gpu.upload(&cos_p).unwrap(), gpu.upload(&sin_p).unwrap());
        let mut xd = gpu.upload_bf16(&x).unwrap();
        gpu.rope(&mut xd, Some(&posd), &cpd, &spd, t, h, hd, h * hd, hd, false).unwrap();
        check(&format!("rope fwd by position (T {t} hd {hd})"), &gpu.download_bf16(&xd).unwrap(), &want, 1e-3 * max_abs(&want), BF16_ULP, 1e-2);
        // Backward.
        let dy = round_bf16(&rng.normals(t * h * hd, 1.0));
        let mut want = dy.clone();
        ops::rope_backward(&mut want, &cos, &sin, h, hd);
        let mut dd = gpu.upload_bf16(&dy).unwrap();
        gpu.rope(&mut dd, None, &cd, &sd, t, h, hd, h * hd, hd, true).unwrap();
        check(&format!("rope bwd (T {t} hd {hd})"), &gpu.download_bf16(&dd).unwrap(), &want, 1e-3 * max_abs(&want), BF16_ULP, 1e-2);
    }
}

#[test]
fn swiglu_matches_cpu() {
    let test = "swiglu_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    for &(n, f) in &[(1usize, 8usize), (93, 2048), (16, 3001)] {
        // gate and up as the two halves of one fused [N, 2F] buffer (strided rows).
        let fused = round_bf16(&rng.normals(n * 2 * f, 2.0));
        let g: Vec<f32> = (0..n).flat_map(|r| fused[r * 2 * f..r * 2 * f + f].to_vec()).collect();
        let u: Vec<f32> = (0..n).flat_map(|r| fused[r * 2 * f + f..(r + 1) * 2 * f].to_vec()).collect();
        let dh = round_bf16(&rng.normals(n * f, 1.0));
        let mut h_ref = vec![0f32; n * f];
        ops::swiglu_forward(&mut h_ref, &g, &u);
        let (mut dg_ref, mut du_ref) = (vec![0f32; n * f], vec![0f32; n * f]);
        ops::swiglu_backward(&mut dg_ref, &mut du_ref, &dh, &g, &u);

        let fd = gpu.upload_bf16(&fused).unwrap();
        let (gate, up) = (fd.slice(0..), fd.slice(f..));
        let mut hd = poison_bf16(&gpu, n * f);
        gpu.swiglu_fwd(&gate, &up, &mut hd, n, f, 2 * f, 2 * f, f).unwrap();
        check(&format!("swiglu h ({n}x{f})"), &gpu.download_bf16(&hd).unwrap(), &h_ref, 1e-3 * max_abs(&h_ref), BF16_ULP, 1e-2);
        let dhd = gpu.upload_bf16(&dh).unwrap();
        let mut dfused = poison_bf16(&gpu, n * 2 * f);
        gpu.swiglu_bwd_fused(&dhd, &fd, &mut dfused, n, f).unwrap();
        let dfu = gpu.download_bf16(&dfused).unwrap();
        let dg: Vec<f32> = (0..n).flat_map(|r| dfu[r * 2 * f..r * 2 * f + f].to_vec()).collect();
        let du: Vec<f32> = (0..n).flat_map(|r| dfu[r * 2 * f + f..(r + 1) * 2 * f].to_vec()).collect();
        check(&format!("swiglu dgate ({n}x{f})"), &dg, &dg_ref, 1e-3 * max_abs(&dg_ref), BF16_ULP, 1e-2);
        check(&format!("swiglu dup ({n}x{f})"), &du, &du_ref, 1e-3 * max_abs(&du_ref), BF16_ULP, 1e-2);
        // Separate contiguous buffers through the general entry point.
        let (gd, ud) = (gpu.upload_bf16(&g).unwrap(), gpu.upload_bf16(&u).unwrap());
        let (mut dgd, mut dud) = (poison_bf16(&gpu, n * f), poison_bf16(&gpu, n * f));
        gpu.swiglu_bwd(&dhd, &gd, &ud, &mut dgd, &mut dud, n, f, [f; 5]).unwrap();
        check(&format!("swiglu dgate contiguous ({n}x{f})"), &gpu.download_bf16(&dgd).unwrap(), &dg_ref, 1e-3 * max_abs(&dg_ref), BF16_ULP, 1e-2);
        check(&format!("swiglu dup contiguous ({n}x{f})"), &gpu.download_bf16(&dud).unwrap(), &du_ref, 1e-3 * max_abs(&du_ref), BF16_ULP, 1e-2);
    }
}

#[test]
fn embedding_matches_cpu() {
    let test = "embedding_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    for &(n, vocab, d) in &[(1usize, 10usize, 8usize), (500, 97, 768), (64, 5000, 36)] {
        let table = round_bf16(&rng.normals(vocab * d, 1.0));
        // Few distinct ids so that rows repeat (the scatter-add must sum them).
        let ids: Vec<u32> = (0..n).map(|_| rng.below(vocab.min(1 + n / 3)) as u32).collect();
        let mut out_ref = vec![0f32; n * d];
        ops::embedding_forward(&mut out_ref, &ids, &table, d);
        let dout = round_bf16(&rng.normals(n * d, 1.0));
        let dw0 = rng.normals(vocab * d, 1.0);
        let mut dw_ref = dw0.clone();
        ops::embedding_backward(&mut dw_ref, &dout, &ids, d);

        let td = gpu.upload_bf16(&table).unwrap();
        let idd = gpu.upload(&ids.iter().map(|&x| x as i32).collect::<Vec<_>>()).unwrap();
        let mut od = poison_bf16(&gpu, n * d);
        gpu.embedding_fwd(&idd, &td, &mut od, n, d, vocab).unwrap();
        check(&format!("embedding out ({n} ids, D {d})"), &gpu.download_bf16(&od).unwrap(), &out_ref, 0.0, 0.0, 0.0);
        let plan = gpu.embedding_grad_plan(&ids, vocab).unwrap();
        let dod = gpu.upload_bf16(&dout).unwrap();
        let mut dwd = gpu.upload(&dw0).unwrap();
        gpu.embedding_bwd(&plan, &dod, &mut dwd, d).unwrap();
        check(&format!("embedding dW ({n} ids, D {d})"), &gpu.download(&dwd).unwrap(), &dw_ref, 1e-5, 1e-5, 1e-6);
    }
    assert!(gpu.embedding_grad_plan(&[3, 10], 10).is_err(), "id >= vocab must be refused");
}

#[test]
fn adamw_matches_cpu() {
    let test = "adamw_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    let n = 100_003;
    let mut p = rng.normals(n, 0.02);
    let mut m = rng.normals(n, 1e-3);
    let mut v: Vec<f32> = rng.normals(n, 1e-3).iter().map(|x| x * x).collect();
    let (pd0, md0, vd0) = (p.clone(), m.clone(), v.clone());
    let g = rng.normals(n, 1e-2);
    let (lr, b1, b2, eps, wd, t, clip) = (3e-4f64, 0.9f64, 0.95f64, 1e-8f64, 0.1f64, 7u64, 0.5f32);
    // CPU: coa-train-step's update, written out (same order of operations).
    let a = AdamWArgs::new(lr, b1, b2, eps, wd, t, true, clip);
    for i in 0..n {
        let gi = g[i] * clip;
        let pi = p[i] * a.keep;
        let mi = m[i] * a.b1 + (1.0 - a.b1) * gi;
        let vi = v[i] * a.b2 + (1.0 - a.b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - a.step_size * mi / (vi.sqrt() / a.bc2_sqrt + a.eps);
    }
    let (mut pd, gd, mut md, mut vd) = (gpu.upload(&pd0).unwrap(), gpu.upload(&g).unwrap(), gpu.upload(&md0).unwrap(), gpu.upload(&vd0).unwrap());
    let mut pb = poison_bf16(&gpu, n);
    gpu.adamw(&mut pd, &gd, &mut md, &mut vd, Some(&mut pb), n, &a).unwrap();
    // fp32 throughout: only FMA contraction differs (a few ulp).
    check("adamw p", &gpu.download(&pd).unwrap(), &p, 1e-9, 1e-5, 1e-6);
    check("adamw m", &gpu.download(&md).unwrap(), &m, 1e-12, 1e-5, 1e-6);
    check("adamw v", &gpu.download(&vd).unwrap(), &v, 1e-15, 1e-5, 1e-6);
    check("adamw p_bf16", &gpu.download_bf16(&pb).unwrap(), &round_bf16(&p), 0.0, BF16_ULP, 1e-2);
}

#[test]
fn gemm_and_elementwise_match_cpu() {
    let test = "gemm_and_elementwise_match_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    for &(m, n, k) in &[(1usize, 1usize, 1usize), (33, 65, 129), (256, 768, 512)] {
        for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
            let a = round_bf16(&rng.normals(m * k, 1.0));
            let b = round_bf16(&rng.normals(k * n, 1.0));
            let c0 = rng.normals(m * n, 1.0);
            let mut want = c0.clone();
            ops::gemm(m, n, k, &a, a_t, &b, b_t, &mut want, 1.0);
            let (ad, bd) = (gpu.upload_bf16(&a).unwrap(), gpu.upload_bf16(&b).unwrap());
            let mut cd = gpu.upload(&c0).unwrap();
            gpu.gemm(m, n, k, &ad, a_t, &bd, b_t, &mut cd, 1.0, 1.0).unwrap();
            let tol = 1e-5 * (k as f32).sqrt() * max_abs(&want);
            check(&format!("gemm f32 {m}x{n}x{k} a_t {a_t} b_t {b_t}"), &gpu.download(&cd).unwrap(), &want, tol, 1e-5, 1e-5);
            let mut want = vec![0f32; m * n];
            ops::gemm(m, n, k, &a, a_t, &b, b_t, &mut want, 0.0);
            let mut cb = poison_bf16(&gpu, m * n);
            gpu.gemm(m, n, k, &ad, a_t, &bd, b_t, &mut cb, 1.0, 0.0).unwrap();
            check(&format!("gemm bf16 {m}x{n}x{k} a_t {a_t} b_t {b_t}"), &gpu.download_bf16(&cb).unwrap(), &want, tol, BF16_ULP, 1e-2);
        }
    }
    let n = 70_001;
    let x = rng.normals(n, 3.0);
    let xd = gpu.upload(&x).unwrap();
    let mut bd = poison_bf16(&gpu, n);
    gpu.cast_f32_bf16(&xd, &mut bd, n).unwrap();
    check("cast f32->bf16", &gpu.download_bf16(&bd).unwrap(), &round_bf16(&x), 0.0, 0.0, 0.0);
    let mut fd = poison_f32(&gpu, n);
    gpu.cast_bf16_f32(&bd, &mut fd, n).unwrap();
    check("cast bf16->f32", &gpu.download(&fd).unwrap(), &round_bf16(&x), 0.0, 0.0, 0.0);
    let y = round_bf16(&rng.normals(n, 1.0));
    let yd = gpu.upload_bf16(&y).unwrap();
    gpu.add_bf16_inplace(&mut bd, &yd, n).unwrap();
    let want: Vec<f32> = round_bf16(&x).iter().zip(&y).map(|(a, b)| a + b).collect();
    check("add bf16", &gpu.download_bf16(&bd).unwrap(), &round_bf16(&want), 0.0, 0.0, 0.0);
    let acc0 = rng.normals(n, 1.0);
    let mut accd = gpu.upload(&acc0).unwrap();
    gpu.accum_bf16_f32(&yd, &mut accd, n).unwrap();
    let want: Vec<f32> = acc0.iter().zip(&y).map(|(a, b)| a + b).collect();
    check("accum bf16->f32", &gpu.download(&accd).unwrap(), &want, 0.0, 0.0, 0.0);
    let ss = gpu.sumsq(&xd, n).unwrap();
    let want: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    assert!((ss - want).abs() <= 1e-5 * want, "sumsq {ss} vs {want}");
}

/// Decoding: keys and values appended to a slot cache in two calls (a prefill of each slot's first
/// rows, then its last few rows, as a decode step or an observation), each call's rows attending
/// over their slot's cache. The reference is the training attention over each slot's whole
/// sequence (one segment): row p of it equals the decode output at position p.
#[test]
fn decode_attention_matches_cpu() {
    use coa_kernels::ops::decode_attention::CacheShape;
    let test = "decode_attention_matches_cpu";
    let Some(gpu) = gpu_or_skip(test) else { return };
    let mut rng = seeded(test);
    let configs = [(64usize, 4usize, 4usize), (64, 4, 2), (128, 8, 2), (32, 2, 1), (80, 6, 3), (256, 2, 2)];
    for &(hd, hq, hkv) in &configs {
        let (slots, max_len) = (3usize, 300usize);
        let (qw, kw) = (hq * hd, hkv * hd);
        // Per slot: its length and how many of its last rows come in the second call.
        let lens: Vec<usize> = (0..slots).map(|_| 1 + rng.below(max_len)).collect();
        let tails: Vec<usize> = lens.iter().map(|&n| 1 + rng.below(n.min(4))).collect();
        eprintln!(" head_dim {hd}, heads {hq}/{hkv}, slot lengths {lens:?}, second-call rows {tails:?}");
        let q: Vec<Vec<f32>> = lens.iter().map(|&n| round_bf16(&rng.normals(n * qw, 1.0))).collect();
        let k: Vec<Vec<f32>> = lens.iter().map(|&n| round_bf16(&rng.normals(n * kw, 1.0))).collect();
        let v: Vec<Vec<f32>> = lens.iter().map(|&n| round_bf16(&rng.normals(n * kw, 1.0))).collect();
        let o_ref: Vec<Vec<f32>> = (0..slots)
            .map(|s| {
                let n = lens[s];
                let (_, start) = ops::segment_layout(n, None);
                let (mut o, mut lse) = (vec![0f32; n * qw], vec![0f32; n * hq]);
                ops::attention_forward(&mut o, &mut lse, &q[s], &k[s], &v[s], &start, hq, hkv, hd);
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
            let mut od = poison_bf16(&gpu, rows.len() * qw);
            gpu.attn_extend(&shape, &qd, qw, &kc, &vc, &sd, &pd, &mut od).unwrap();
            let got = gpu.download_bf16(&od).unwrap();
            // fp32 softmax and accumulation (fast exp), then one bf16 rounding of the output.
            check(&format!("decode attention (call {call})"), &got, &want, BF16_ULP * max_abs(&vn), BF16_ULP, 1e-2);
        }
    }
}
