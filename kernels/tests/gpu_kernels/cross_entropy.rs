//! `kernels/cross_entropy.cu` (launchers: `src/ops/cross_entropy.rs`) against the CPU reference
//! `coa_model::ops::masked_cross_entropy`, `logsoftmax_forward` and `logsoftmax_backward_inplace`.

use super::*;

/// Vocab sizes: vector path, scalar path (odd), one larger than a block's shared-memory row cache
/// (re-read path), a Qwen-sized one, and an all-masked batch.
#[test]
fn cross_entropy_matches_cpu() {
    let test = "cross_entropy_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (n, v) in [(37usize, 4096usize), (16, 1001), (9, 32003), (5, 151_936), (64, 512)] {
        case(&gpu, &mut rng, n, v);
    }
}

#[test]
fn xent_entropy_matches_cpu() {
    let test = "xent_entropy_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (n, v) in [(37usize, 4096usize), (16, 1001), (5, 151_936)] {
        entropy_case(&gpu, &mut rng, n, v);
    }
}

/// For the schedule-order test: the vector path with its shared-memory cache and the scalar path.
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, 6, 4096);
    case(gpu, rng, 5, 1001);
    entropy_case(gpu, rng, 6, 1001);
}

fn case(gpu: &Gpu, rng: &mut Rng, n: usize, v: usize) {

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
    let mut logpd = poison_f32(gpu, n);
    let mut lsed = poison_f32(gpu, n);
    gpu.xent_fwd_bwd(&mut xd, &td, Some(&gd), &mut logpd, Some(&mut lsed), n, v, true).unwrap();
    let grad = gpu.download_bf16(&xd).unwrap();
    check(&format!("xent RL grad (V {v})"), &grad, &z, 1e-3 * max_abs(&z) + 1e-9, BF16_ULP, 1e-2);
    // Rows with c = 0 are skipped (logp 0); the others carry log-probs.
    let logp = gpu.download(&logpd).unwrap();
    let want: Vec<f32> = (0..n).map(|i| if c[i] == 0.0 { 0.0 } else { logp_ref[i] }).collect();
    check(&format!("xent logp (V {v})"), &logp, &want, 2e-4, 1e-5, 1e-4);
    // Forward only: every row's log-prob, logits unchanged.
    let mut xd = gpu.upload_bf16(&logits).unwrap();
    let mut logpd = poison_f32(gpu, n);
    gpu.xent_fwd_bwd(&mut xd, &td, None, &mut logpd, Some(&mut lsed), n, v, false).unwrap();
    check(&format!("xent logp fwd-only (V {v})"), &gpu.download(&logpd).unwrap(), &logp_ref, 2e-4, 1e-5, 1e-4);
    check(&format!("xent lse (V {v})"), &gpu.download(&lsed).unwrap(), &lse_ref, 2e-4, 1e-5, 1e-4);
    assert_eq!(gpu.download_bf16(&xd).unwrap(), logits, "forward-only must not touch the logits");
}

fn entropy_case(gpu: &Gpu, rng: &mut Rng, n: usize, v: usize) {

    let logits = round_bf16(&(0..n * v).map(|_| rng.normal() * 3.0).collect::<Vec<_>>());
    // Every 4th row has no target: entropy 0 there, like the CPU reference.
    let tg: Vec<Option<u32>> = (0..n).map(|i| (i % 4 != 1).then(|| rng.below(v) as u32)).collect();
    let (mut logp_ref, mut ent_ref, mut lse_ref) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    ops::logsoftmax_forward(&mut logp_ref, &mut ent_ref, &mut lse_ref, &logits, &tg, v);
    let xd = gpu.upload_bf16(&logits).unwrap();
    let mut xw = gpu.upload_bf16(&logits).unwrap();
    let td = gpu.upload(&tg.iter().map(|t| t.map_or(-1, |x| x as i32)).collect::<Vec<_>>()).unwrap();
    let (mut logpd, mut lsed, mut entd) = (poison_f32(gpu, n), poison_f32(gpu, n), poison_f32(gpu, n));
    gpu.xent_fwd_bwd(&mut xw, &td, None, &mut logpd, Some(&mut lsed), n, v, false).unwrap();
    gpu.xent_entropy(&xd, &td, &lsed, &mut entd, n, v).unwrap();
    // f32 sums of V terms from the same bf16 logits: relative 1e-4.
    check(&format!("xent entropy (V {v})"), &gpu.download(&entd).unwrap(), &ent_ref, 2e-4, 1e-4, 1e-4);
}
