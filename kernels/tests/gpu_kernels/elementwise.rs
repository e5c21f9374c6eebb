//! `kernels/elementwise.cu` (launchers: `src/ops/elementwise.rs`): casts, the residual add, the
//! bf16 -> f32 gradient accumulation (all exact), Σx² (f32 per block, f64 across blocks) and
//! LoRA's dropout mask (exactly `coa_model::lora::dropout_factor`'s).

use super::*;
use coa_kernels::ops::elementwise::DropoutMask;

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
    lora_dropout_case(gpu, rng, n);
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

/// LoRA dropout over a pass of three packed sequences (each with its own seed, rows counted from
/// its start): every element's factor is the CPU's `dropout_factor` (the mask bit for bit), the
/// forward `y = x f` exact, the backward's `y += x f` within one bf16 rounding.
fn lora_dropout_case(gpu: &Gpu, rng: &mut Rng, n: usize) {
    use coa_model::lora::{dropout_factor, dropout_key, Target};
    let cols = 1 + rng.below(97);
    let lens = [1 + rng.below(n / cols / 3 + 1), 1 + rng.below(n / cols / 3 + 1), 1 + rng.below(n / cols / 3 + 1)];
    let seq_seeds = [rng.next_u64(), rng.next_u64(), rng.next_u64()];
    let (l, tg, p) = (rng.below(4), Target::ALL[rng.below(7)], [0.05, 0.1, 0.5][rng.below(3)]);
    let (mut seeds, mut rows) = (vec![], vec![]);
    for (&len, &s) in lens.iter().zip(&seq_seeds) {
        seeds.extend(std::iter::repeat_n(s, len));
        rows.extend(0..len as i32);
    }
    let r = seeds.len();
    let x = round_bf16(&rng.normals(r * cols, 1.0));
    let mut factors = Vec::with_capacity(r * cols);
    for (&s, &row) in seeds.iter().zip(&rows) {
        factors.extend((0..cols).map(|c| dropout_factor(s, p, l, tg, row as usize * cols + c)));
    }
    let (xd, sd, rd) = (gpu.upload_bf16(&x).unwrap(), gpu.upload(&seeds).unwrap(), gpu.upload(&rows).unwrap());
    let mut yd = poison_bf16(gpu, r * cols);
    let mask = DropoutMask { seeds: &sd, local_row: &rd, key_hi: dropout_key(l, tg, 0), p };
    gpu.lora_dropout(&xd, &mut yd, (r, cols), &mask, false).unwrap();
    let want: Vec<f32> = round_bf16(&x.iter().zip(&factors).map(|(a, f)| a * f).collect::<Vec<_>>());
    let what = format!("lora_dropout {r}x{cols} p {p} layer {l} {}", tg.name());
    check(&what, &gpu.download_bf16(&yd).unwrap(), &want, 0.0, 0.0, 0.0);
    let dropped = factors.iter().filter(|&&f| f == 0.0).count() as f64 / factors.len() as f64;
    assert!(factors.len() < 200 || (dropped - p).abs() < 0.1, "{what}: {dropped} of the elements dropped");
    let y0 = round_bf16(&rng.normals(r * cols, 1.0));
    let mut yd = gpu.upload_bf16(&y0).unwrap();
    gpu.lora_dropout(&xd, &mut yd, (r, cols), &mask, true).unwrap();
    let want: Vec<f32> = round_bf16(&x.iter().zip(&factors).zip(&y0).map(|((a, f), y)| y + a * f).collect::<Vec<_>>());
    check(&format!("{what} accumulate"), &gpu.download_bf16(&yd).unwrap(), &want, 1e-6, BF16_ULP, 1e-2);
}
