//! `kernels/rmsnorm.cu` (launchers: `src/ops/rmsnorm.rs`) against the CPU reference
//! `coa_model::ops::rmsnorm_forward` / `rmsnorm_backward`.

use super::*;
use coa_kernels::ops::rope::HeadRows;

#[test]
fn rmsnorm_matches_cpu() {
    let test = "rmsnorm_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (n, d) in [(1usize, 64usize), (77, 768), (300, 1024), (5, 4098)] {
        case(&gpu, &mut rng, n, d);
    }
}

/// For the schedule-order test: more rows than blocks (grid-stride rows, block partials of dw).
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, 40, 256);
}

fn case(gpu: &Gpu, rng: &mut Rng, n: usize, d: usize) {

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
    let (mut yd, mut rd) = (poison_bf16(gpu, n * d), poison_f32(gpu, n));
    gpu.rmsnorm_fwd(&xd, &wd, &mut yd, &mut rd, n, d, eps).unwrap();
    check(&format!("rmsnorm y ({n}x{d})"), &gpu.download_bf16(&yd).unwrap(), &y_ref, 1e-6, BF16_ULP, 1e-2);
    check(&format!("rmsnorm rstd ({n}x{d})"), &gpu.download(&rd).unwrap(), &rstd_ref, 0.0, 1e-5, 1e-5);
    let mut dxd = gpu.upload_bf16(&dx0).unwrap();
    let mut dwd = gpu.upload(&dw0).unwrap();
    gpu.rmsnorm_bwd(&dyd, &xd, &wd, &rd, &mut dxd, &mut dwd, (n, d), true).unwrap();
    check(&format!("rmsnorm dx ({n}x{d})"), &gpu.download_bf16(&dxd).unwrap(), &dx_ref, 1e-3 * max_abs(&dx_ref), BF16_ULP, 1e-2);
    check(&format!("rmsnorm dw ({n}x{d})"), &gpu.download(&dwd).unwrap(), &dw_ref, 1e-4 * max_abs(&dw_ref), 1e-4, 1e-4);
}

/// Qwen3's q/k norm (`head_rmsnorm_fwd` / `_bwd`): the heads of fused q|k|v rows normalised in
/// place, each head a row of hd for the CPU reference; the input kept for the backward; columns
/// outside the heads untouched; the backward in place on the same columns, dw accumulated.
#[test]
fn head_rmsnorm_matches_cpu() {
    let test = "head_rmsnorm_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    // (tokens, q heads, kv heads, hd): the k block starts hq·hd into each row
    for (n, hq, hkv, hd) in [(1usize, 2usize, 1usize, 64usize), (37, 4, 2, 128), (70, 2, 2, 64)] {
        let eps = 1e-6f32;
        let ld = (hq + 2 * hkv) * hd;
        let rows = round_bf16(&rng.normals(n * ld, 1.5));
        let dy = round_bf16(&rng.normals(n * ld, 1.0));
        for (heads, col0) in [(hq, 0), (hkv, hq * hd)] {
            let w = round_bf16(&(0..hd).map(|_| rng.range(0.5, 1.5)).collect::<Vec<_>>());
            // the heads as rows of hd, as the CPU model sees them
            let gather = |src: &[f32]| -> Vec<f32> { (0..n).flat_map(|t| src[t * ld + col0..t * ld + col0 + heads * hd].to_vec()).collect() };
            let (x, dyh) = (gather(&rows), gather(&dy));
            let m = n * heads;
            let (mut y_ref, mut rstd_ref) = (vec![0f32; m * hd], vec![0f32; m]);
            ops::rmsnorm_forward(&mut y_ref, &mut rstd_ref, &x, &w, eps, hd);
            let dw0: Vec<f32> = rng.normals(hd, 1.0);
            let (mut dx_ref, mut dw_ref) = (vec![0f32; m * hd], dw0.clone());
            ops::rmsnorm_backward(&mut dx_ref, &mut dw_ref, &dyh, &x, &w, &rstd_ref, hd);

            let label = format!("{n} tokens, {heads} heads of {hd} at column {col0}");
            let wd = gpu.upload_bf16(&w).unwrap();
            let mut xd = gpu.upload_bf16(&rows).unwrap();
            let (mut saved, mut rd) = (poison_bf16(&gpu, m * hd), poison_f32(&gpu, m));
            let at = HeadRows { tokens: n, heads, head_dim: hd, ld };
            gpu.head_rmsnorm_fwd(&mut xd.slice_mut(col0..), at, &wd, &mut rd, Some(&mut saved), eps).unwrap();
            let after = gpu.download_bf16(&xd).unwrap();
            check(&format!("head rmsnorm y ({label})"), &gather(&after), &y_ref, 1e-6, BF16_ULP, 1e-2);
            check(&format!("head rmsnorm rstd ({label})"), &gpu.download(&rd).unwrap(), &rstd_ref, 0.0, 1e-5, 1e-5);
            assert_eq!(gpu.download_bf16(&saved).unwrap(), x, "{label}: the kept input is the input");
            for t in 0..n {
                for c in (0..ld).filter(|c| !(col0..col0 + heads * hd).contains(c)) {
                    assert_eq!(after[t * ld + c], rows[t * ld + c], "{label}: column {c} of token {t} is not a head of this norm");
                }
            }
            let mut dd = gpu.upload_bf16(&dy).unwrap();
            let mut dwd = gpu.upload(&dw0).unwrap();
            gpu.head_rmsnorm_bwd(&mut dd.slice_mut(col0..), at, &saved, &wd, &rd, &mut dwd).unwrap();
            let dx = gpu.download_bf16(&dd).unwrap();
            check(&format!("head rmsnorm dx ({label})"), &gather(&dx), &dx_ref, 1e-3 * max_abs(&dx_ref), BF16_ULP, 1e-2);
            check(&format!("head rmsnorm dw ({label})"), &gpu.download(&dwd).unwrap(), &dw_ref, 1e-4 * max_abs(&dw_ref), 1e-4, 1e-4);
            assert!(gpu.head_rmsnorm_fwd(&mut xd, HeadRows { tokens: n, heads, head_dim: hd, ld: heads * hd - 2 }, &wd, &mut rd, None::<&mut coa_kernels::cudarc::driver::CudaSlice<bf16>>, eps).is_err(), "heads wider than the row");
        }
    }
}
