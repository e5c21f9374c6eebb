//! `kernels/embedding.cu` (launchers: `src/ops/embedding.rs`) against the CPU reference
//! `coa_model::ops::embedding_forward` / `embedding_backward`.

use super::*;

#[test]
fn embedding_matches_cpu() {
    let test = "embedding_matches_cpu";
    let gpu = test_gpu(test);
    let mut rng = seeded(test);
    for (n, vocab, d) in [(1usize, 10usize, 8usize), (500, 97, 768), (64, 5000, 36)] {
        case(&gpu, &mut rng, n, vocab, d);
    }
    assert!(gpu.embedding_grad_plan(&[3, 10], 10).is_err(), "id >= vocab must be refused");
}

/// For the schedule-order test.
pub fn small(gpu: &Gpu, rng: &mut Rng) {
    case(gpu, rng, 40, 13, 72);
}

fn case(gpu: &Gpu, rng: &mut Rng, n: usize, vocab: usize, d: usize) {

    let table = round_bf16(&rng.normals(vocab * d, 1.0));
    // Few distinct ids so that rows repeat (the scatter-add must sum them).
    let ids: Vec<u32> = (0..n).map(|_| rng.below(vocab.min(1 + n / 3)) as u32).collect();
    let mut out_ref = vec![0f32; n * d];
    ops::embedding_forward(&mut out_ref, &ids, &table, d);
    let dout = round_bf16(&rng.normals(n * d, 1.0));
    let dw0 = rng.normals(vocab * d, 1.0);
    let mut dw_ref = dw0.clone();
    ops::embedding_backward(&mut dw_ref, &dout, &ids, d);

    let td = gpu.upload_bf16(&table).unwrap();
    let idd = gpu.upload(&ids.iter().map(|&x| x as i32).collect::<Vec<_>>()).unwrap();
    let mut od = poison_bf16(gpu, n * d);
    gpu.embedding_fwd(&idd, &td, &mut od, n, d, vocab).unwrap();
    check(&format!("embedding out ({n} ids, D {d})"), &gpu.download_bf16(&od).unwrap(), &out_ref, 0.0, 0.0, 0.0);
    let plan = gpu.embedding_grad_plan(&ids, vocab).unwrap();
    let dod = gpu.upload_bf16(&dout).unwrap();
    let mut dwd = gpu.upload(&dw0).unwrap();
    gpu.embedding_bwd(&plan, &dod, &mut dwd, d).unwrap();
    check(&format!("embedding dW ({n} ids, D {d})"), &gpu.download(&dwd).unwrap(), &dw_ref, 1e-5, 1e-5, 1e-6);
}
