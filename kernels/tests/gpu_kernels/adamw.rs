//! `kernels/adamw.cu` (launcher: `src/ops/adamw.rs`) against coa-train-step's CPU update
//! (`optim::adamw_update`, written out below in the same order of operations).

use super::*;
use coa_kernels::ops::adamw::AdamWArgs;

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
    let mut pb = poison_bf16(gpu, n);
    gpu.adamw(&mut pd, &gd, &mut md, &mut vd, Some(&mut pb), n, &a).unwrap();
    // fp32 throughout: only FMA contraction differs (a few ulp).
    check("adamw p", &gpu.download(&pd).unwrap(), &p, 1e-9, 1e-5, 1e-6);
    check("adamw m", &gpu.download(&md).unwrap(), &m, 1e-12, 1e-5, 1e-6);
    check("adamw v", &gpu.download(&vd).unwrap(), &v, 1e-15, 1e-5, 1e-6);
    check("adamw p_bf16", &gpu.download_bf16(&pb).unwrap(), &round_bf16(&p), 0.0, BF16_ULP, 1e-2);
}
