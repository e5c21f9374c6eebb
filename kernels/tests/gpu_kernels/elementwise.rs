//! `kernels/elementwise.cu` (launchers: `src/ops/elementwise.rs`): casts, the residual add, the
//! bf16 -> f32 gradient accumulation (all exact) and Σx² (f32 per block, f64 across blocks).

use super::*;

#[test]
fn elementwise_matches_cpu() {
    let test = "elementwise_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    case(&gpu, &mut rng, 70_001);
}

/// For the schedule-order test.
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, 3_001);
}

fn case(gpu: &Gpu, rng: &mut Rng, n: usize) {
    let x = rng.normals(n, 3.0);
    let xd = gpu.upload(&x).unwrap();
    let mut bd = poison_bf16(gpu, n);
    gpu.cast_f32_bf16(&xd, &mut bd, n).unwrap();
    check("cast f32->bf16", &gpu.download_bf16(&bd).unwrap(), &round_bf16(&x), 0.0, 0.0, 0.0);
    let mut fd = poison_f32(gpu, n);
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
