//! cuBLAS matmuls (`src/ops/gemm.rs`, `Gpu::gemm`) against the CPU reference
//! `coa_model::ops::gemm`: every transpose combination, f32 output accumulating (beta = 1) and bf16
//! output written (beta = 0); and sub-matrices through leading dimensions (`Gemm::ld`).

use super::*;
use coa_model::ops::Gemm;

#[test]
fn gemm_matches_cpu() {
    let test = "gemm_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (m, n, k) in [(1usize, 1usize, 1usize), (33, 65, 129), (256, 768, 512)] {
        case(&gpu, &mut rng, m, n, k);
    }
}

/// `Gemm::ld` on column blocks of wider buffers (LoRA's q / k / v blocks of a fused q|k|v row):
/// a, b and c each a block at a column offset of rows `pad` elements longer; the columns around
/// c's block must stay as they were.
#[test]
fn gemm_on_column_blocks_matches_cpu() {
    let test = "gemm_on_column_blocks_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (m, n, k) in [(1usize, 1usize, 1usize), (17, 33, 8), (40, 64, 24)] {
        for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
            let (pad, off) = (1 + rng.below(9), rng.below(5));
            let block = |rows: usize, cols: usize, rng: &mut Rng| -> (Vec<f32>, Vec<f32>, usize) {
                let ld = cols + pad + off;
                let full = round_bf16(&rng.normals(rows * ld, 1.0));
                let dense = (0..rows).flat_map(|r| full[r * ld + off..r * ld + off + cols].to_vec()).collect();
                (full, dense, ld)
            };
            let (a_full, a, lda) = if a_t { block(k, m, &mut rng) } else { block(m, k, &mut rng) };
            let (b_full, b, ldb) = if b_t { block(n, k, &mut rng) } else { block(k, n, &mut rng) };
            let (c_full, c, ldc) = block(m, n, &mut rng);
            let mut want_block = c.clone();
            ops::gemm(Gemm::new(m, n, k).transposed(a_t, b_t).beta(1.0), &a, &b, &mut want_block);
            let mut want = c_full.clone();
            for r in 0..m {
                want[r * ldc + off..r * ldc + off + n].copy_from_slice(&want_block[r * n..(r + 1) * n]);
            }
            let (ad, bd) = (gpu.upload_bf16(&a_full).unwrap(), gpu.upload_bf16(&b_full).unwrap());
            let mut cd = gpu.upload_bf16(&c_full).unwrap();
            let g = Gemm::new(m, n, k).transposed(a_t, b_t).ld(lda, ldb, ldc).beta(1.0);
            gpu.gemm(g, &ad.slice(off..), &bd.slice(off..), &mut cd.slice_mut(off..)).unwrap();
            let tol = 1e-5 * (k as f32).sqrt() * max_abs(&want);
            check(&format!("gemm on blocks {m}x{n}x{k} a_t {a_t} b_t {b_t} lds {lda} {ldb} {ldc}"), &gpu.download_bf16(&cd).unwrap(), &want, tol, BF16_ULP, 1e-2);
        }
    }
}

fn case(gpu: &Gpu, rng: &mut Rng, m: usize, n: usize, k: usize) {
    for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
        let a = round_bf16(&rng.normals(m * k, 1.0));
        let b = round_bf16(&rng.normals(k * n, 1.0));
        let c0 = rng.normals(m * n, 1.0);
        let mut want = c0.clone();
        ops::gemm(Gemm::new(m, n, k).transposed(a_t, b_t).beta(1.0), &a, &b, &mut want);
        let (ad, bd) = (gpu.upload_bf16(&a).unwrap(), gpu.upload_bf16(&b).unwrap());
        let mut cd = gpu.upload(&c0).unwrap();
        gpu.gemm(Gemm::new(m, n, k).transposed(a_t, b_t).beta(1.0), &ad, &bd, &mut cd).unwrap();
        let tol = 1e-5 * (k as f32).sqrt() * max_abs(&want);
        check(&format!("gemm f32 {m}x{n}x{k} a_t {a_t} b_t {b_t}"), &gpu.download(&cd).unwrap(), &want, tol, 1e-5, 1e-5);
        let mut want = vec![0f32; m * n];
        ops::gemm(Gemm::new(m, n, k).transposed(a_t, b_t), &a, &b, &mut want);
        let mut cb = poison_bf16(gpu, m * n);
        gpu.gemm(Gemm::new(m, n, k).transposed(a_t, b_t), &ad, &bd, &mut cb).unwrap();
        check(&format!("gemm bf16 {m}x{n}x{k} a_t {a_t} b_t {b_t}"), &gpu.download_bf16(&cb).unwrap(), &want, tol, BF16_ULP, 1e-2);
    }
}
