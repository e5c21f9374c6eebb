//! `kernels/swiglu.cu` (launchers: `src/ops/swiglu.rs`) against the CPU reference
//! `coa_model::ops::swiglu_forward` / `swiglu_backward`, fused and separate layouts.

use super::*;

#[test]
fn swiglu_matches_cpu() {
    let test = "swiglu_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (n, f) in [(1usize, 8usize), (93, 2048), (16, 3001)] {
        case(&gpu, &mut rng, n, f);
    }
}

/// For the schedule-order test.
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, 5, 300);
}

fn case(gpu: &Gpu, rng: &mut Rng, n: usize, f: usize) {

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
    let mut hd = poison_bf16(gpu, n * f);
    gpu.swiglu_fwd(&gate, &up, &mut hd, n, f, 2 * f, 2 * f, f).unwrap();
    check(&format!("swiglu h ({n}x{f})"), &gpu.download_bf16(&hd).unwrap(), &h_ref, 1e-3 * max_abs(&h_ref), BF16_ULP, 1e-2);
    let dhd = gpu.upload_bf16(&dh).unwrap();
    let mut dfused = poison_bf16(gpu, n * 2 * f);
    gpu.swiglu_bwd_fused(&dhd, &fd, &mut dfused, n, f).unwrap();
    let dfu = gpu.download_bf16(&dfused).unwrap();
    let dg: Vec<f32> = (0..n).flat_map(|r| dfu[r * 2 * f..r * 2 * f + f].to_vec()).collect();
    let du: Vec<f32> = (0..n).flat_map(|r| dfu[r * 2 * f + f..(r + 1) * 2 * f].to_vec()).collect();
    check(&format!("swiglu dgate ({n}x{f})"), &dg, &dg_ref, 1e-3 * max_abs(&dg_ref), BF16_ULP, 1e-2);
    check(&format!("swiglu dup ({n}x{f})"), &du, &du_ref, 1e-3 * max_abs(&du_ref), BF16_ULP, 1e-2);
    // Separate contiguous buffers through the general entry point.
    let (gd, ud) = (gpu.upload_bf16(&g).unwrap(), gpu.upload_bf16(&u).unwrap());
    let (mut dgd, mut dud) = (poison_bf16(gpu, n * f), poison_bf16(gpu, n * f));
    gpu.swiglu_bwd(&dhd, &gd, &ud, &mut dgd, &mut dud, n, f, [f; 5]).unwrap();
    check(&format!("swiglu dgate contiguous ({n}x{f})"), &gpu.download_bf16(&dgd).unwrap(), &dg_ref, 1e-3 * max_abs(&dg_ref), BF16_ULP, 1e-2);
    check(&format!("swiglu dup contiguous ({n}x{f})"), &gpu.download_bf16(&dud).unwrap(), &du_ref, 1e-3 * max_abs(&du_ref), BF16_ULP, 1e-2);
}
