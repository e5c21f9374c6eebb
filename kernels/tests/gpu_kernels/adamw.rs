//! `kernels/adamw.cu` (launcher: `src/ops/adamw.rs`) against the CPU update coa-train-step
//! applies (`coa_model::adamw::adamw_update`).

use super::*;
use coa_kernels::ops::adamw::AdamWArgs;
use coa_model::adamw::{adamw_update, AdamWConfig, Moments};

#[test]
fn adamw_matches_cpu() {
    let test = "adamw_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    case(&gpu, &mut rng, 100_003);
}

/// For the schedule-order test.
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, 1_001);
}

fn case(gpu: &Gpu, rng: &mut Rng, n: usize) {
    let mut p = rng.normals(n, 0.02);
    let exp_avg = rng.normals(n, 1e-3);
    let exp_avg_sq: Vec<f32> = rng.normals(n, 1e-3).iter().map(|x| x * x).collect();
    let (pd0, md0, vd0) = (p.clone(), exp_avg.clone(), exp_avg_sq.clone());
    let g = rng.normals(n, 1e-2);
    let (lr, b1, b2, eps, wd, t, clip) = (3e-4f64, 0.9f64, 0.95f64, 1e-8f64, 0.1f64, 7u64, 0.5f32);
    // CPU: coa-train-step's step, which scales the gradients by the clip factor, then updates.
    let clipped: Vec<f32> = g.iter().map(|x| x * clip).collect();
    let mut moments = Moments { exp_avg, exp_avg_sq };
    adamw_update(&AdamWConfig { beta1: b1, beta2: b2, eps, weight_decay: wd }, lr, t, true, &mut p, &clipped, &mut moments);
    let Moments { exp_avg: m, exp_avg_sq: v } = moments;
    let a = AdamWArgs::new(lr, b1, b2, eps, wd, t, true, clip);
    let (mut pd, gd, mut md, mut vd) = (gpu.upload(&pd0).unwrap(), gpu.upload(&g).unwrap(), gpu.upload(&md0).unwrap(), gpu.upload(&vd0).unwrap());
    let mut pb = poison_bf16(gpu, n);
    gpu.adamw(&mut pd, &gd, &mut md, &mut vd, Some(&mut pb), n, &a).unwrap();
    // fp32 throughout: only FMA contraction differs (a few ulp).
    check("adamw p", &gpu.download(&pd).unwrap(), &p, 1e-9, 1e-5, 1e-6);
    check("adamw m", &gpu.download(&md).unwrap(), &m, 1e-12, 1e-5, 1e-6);
    check("adamw v", &gpu.download(&vd).unwrap(), &v, 1e-15, 1e-5, 1e-6);
    check("adamw p_bf16", &gpu.download_bf16(&pb).unwrap(), &round_bf16(&p), 0.0, BF16_ULP, 1e-2);
}
