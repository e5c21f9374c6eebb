//! `kernels/rmsnorm.cu` (launchers: `src/ops/rmsnorm.rs`) against the CPU reference
//! `coa_model::ops::rmsnorm_forward` / `rmsnorm_backward`.

use super::*;

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
    gpu.rmsnorm_bwd(&dyd, &xd, &wd, &rd, &mut dxd, &mut dwd, n, d, true).unwrap();
    check(&format!("rmsnorm dx ({n}x{d})"), &gpu.download_bf16(&dxd).unwrap(), &dx_ref, 1e-3 * max_abs(&dx_ref), BF16_ULP, 1e-2);
    check(&format!("rmsnorm dw ({n}x{d})"), &gpu.download(&dwd).unwrap(), &dw_ref, 1e-4 * max_abs(&dw_ref), 1e-4, 1e-4);
}
