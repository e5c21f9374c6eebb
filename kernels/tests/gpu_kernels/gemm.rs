//! cuBLAS matmuls (`src/ops/gemm.rs`, `Gpu::gemm`) against the CPU reference
//! `coa_model::ops::gemm`: every transpose combination, f32 output accumulating (beta = 1) and bf16
//! output written (beta = 0).

use super::*;

#[test]
fn gemm_matches_cpu() {
    let test = "gemm_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (m, n, k) in [(1usize, 1usize, 1usize), (33, 65, 129), (256, 768, 512)] {
        case(&gpu, &mut rng, m, n, k);
    }
}

fn case(gpu: &Gpu, rng: &mut Rng, m: usize, n: usize, k: usize) {
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
        let mut cb = poison_bf16(gpu, m * n);
        gpu.gemm(m, n, k, &ad, a_t, &bd, b_t, &mut cb, 1.0, 0.0).unwrap();
        check(&format!("gemm bf16 {m}x{n}x{k} a_t {a_t} b_t {b_t}"), &gpu.download_bf16(&cb).unwrap(), &want, tol, BF16_ULP, 1e-2);
    }
}
