//! `kernels/rope.cu` (launcher: `src/ops/rope.rs`) against the CPU reference
//! `coa_model::ops::rope_forward` / `rope_backward`, tables by token and by position.

use super::*;
use coa_kernels::ops::rope::HeadRows;

#[test]
fn rope_matches_cpu() {
    let test = "rope_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (t, h, hd, theta) in [(50usize, 4usize, 64usize, 10_000.0f64), (129, 2, 128, 1_000_000.0), (3, 8, 32, 500_000.0)] {
        case(&gpu, &mut rng, t, h, hd, theta);
    }
}

/// For the schedule-order test.
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, 9, 2, 64, 10_000.0);
}

fn case(gpu: &Gpu, rng: &mut Rng, t: usize, h: usize, hd: usize, theta: f64) {
    let rows = HeadRows { tokens: t, heads: h, head_dim: hd, ld: h * hd };
    let segs = random_segments(rng, t);
    let (pos, _) = ops::segment_layout(t, segs.as_deref());
    let (cos, sin) = ops::rope_tables(&pos, hd, theta);
    let x = round_bf16(&rng.normals(t * h * hd, 1.0));
    let mut want = x.clone();
    ops::rope_forward(&mut want, &cos, &sin, h, hd);
    let (cd, sd) = (gpu.upload(&cos).unwrap(), gpu.upload(&sin).unwrap());
    let mut xd = gpu.upload_bf16(&x).unwrap();
    gpu.rope(&mut xd, rows, None, &cd, &sd, false).unwrap();
    check(&format!("rope fwd (T {t} hd {hd})"), &gpu.download_bf16(&xd).unwrap(), &want, 1e-3 * max_abs(&want), BF16_ULP, 1e-2);
    // Position-indexed tables (rows = positions 0..max) give the same result.
    let maxp = *pos.iter().max().unwrap() as usize + 1;
    let (cos_p, sin_p) = ops::rope_tables(&(0..maxp as u32).collect::<Vec<_>>(), hd, theta);
    let posd = gpu.upload(&pos.iter().map(|&p| p as i32).collect::<Vec<_>>()).unwrap();
    let (cpd, spd) = (gpu.upload(&cos_p).unwrap(), gpu.upload(&sin_p).unwrap());
    let mut xd = gpu.upload_bf16(&x).unwrap();
    gpu.rope(&mut xd, rows, Some(&posd), &cpd, &spd, false).unwrap();
    check(&format!("rope fwd by position (T {t} hd {hd})"), &gpu.download_bf16(&xd).unwrap(), &want, 1e-3 * max_abs(&want), BF16_ULP, 1e-2);
    // Backward.
    let dy = round_bf16(&rng.normals(t * h * hd, 1.0));
    let mut want = dy.clone();
    ops::rope_backward(&mut want, &cos, &sin, h, hd);
    let mut dd = gpu.upload_bf16(&dy).unwrap();
    gpu.rope(&mut dd, rows, None, &cd, &sd, true).unwrap();
    check(&format!("rope bwd (T {t} hd {hd})"), &gpu.download_bf16(&dd).unwrap(), &want, 1e-3 * max_abs(&want), BF16_ULP, 1e-2);
}
