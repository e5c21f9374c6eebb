//! Every kernel against the f32 CPU reference (`coa_model::ops`), one module per op (beside
//! `kernels/<op>.cu` and its launchers in `src/ops/<op>.rs`), on fresh random inputs each run (the
//! seed is printed; `COA_TEST_SEED=N` replays one), with shapes drawn at random too (tails, GQA
//! ratios, packed segments). Every output element is checked, outputs are poisoned with NaN
//! before each launch so an unwritten element fails.
//!
//! Inputs are rounded to bf16 first and the CPU reference runs on the rounded values, so the
//! differences measured are the kernel's own: fp32 accumulation order, bf16 intermediates
//! (attention's P and dS), and the final bf16 rounding of the outputs. Tolerances, per output:
//! `|got - want| <= atol + rtol * |want|` for every element, and for the matmul-like outputs also
//! `||got - want|| / ||want|| <= rel_l2` (values in each check's call).
//!
//! Runs on the GPU where one exists, else on the emulated CUDA device (`coa_kernels::emu`; a line
//! says which). On the emulated device, `every_op_passes_in_every_schedule_order` also runs each
//! op's small cases with the block's threads scheduled forward, in reverse, at random and with
//! warps drifting as far apart as they may (or only in `COA_EMU_ORDER`'s order, if set): a missing
//! barrier shows up as a wrong element.

use coa_kernels::emu::{self, Order};
use coa_kernels::rng::Rng;
use coa_kernels::testing::{seeded, test_gpu};
use coa_kernels::{bf16, Gpu};
use coa_model::ops;

mod adamw;
mod attention;
mod cross_entropy;
mod decode_attention;
mod elementwise;
mod embedding;
mod gemm;
mod rmsnorm;
mod rope;
mod swiglu;

pub const BF16_ULP: f32 = 1.0 / 128.0; // relative spacing of bf16 (8 significant bits): 2^-7

pub fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

pub fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |a, &b| a.max(b.abs()))
}

/// Every element within `atol + rtol*|want|`, no NaN; and relative L2 error <= `rel_l2`.
#[track_caller]
pub fn check(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32, rel_l2: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f32);
    let mut bad = 0usize;
    let (mut num, mut den) = (0f64, 0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let tol = atol + rtol * w.abs();
        if !(err <= tol) {
            bad += 1;
            if bad == 1 || !(err <= worst.1) {
                worst = (i, err);
            }
        }
        num += ((g - w) as f64).powi(2);
        den += (w as f64).powi(2);
    }
    let rel = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    eprintln!("  {what}: {} elements, max |want| {:.3e}, rel L2 err {rel:.2e}, {bad} outside tolerance", got.len(), max_abs(want));
    assert!(
        bad == 0,
        "{what}: {bad} of {} elements outside atol {atol:e} + rtol {rtol:e}; worst at {}: got {} want {}",
        got.len(),
        worst.0,
        got[worst.0],
        want[worst.0]
    );
    assert!(rel <= rel_l2, "{what}: relative L2 error {rel:e} > {rel_l2:e}");
}

pub fn poison_bf16(gpu: &Gpu, n: usize) -> coa_kernels::cudarc::driver::CudaSlice<bf16> {
    gpu.upload(&vec![bf16::NAN; n]).unwrap()
}
pub fn poison_f32(gpu: &Gpu, n: usize) -> coa_kernels::cudarc::driver::CudaSlice<f32> {
    gpu.upload(&vec![f32::NAN; n]).unwrap()
}

/// Random segment ids for a packed sequence of `t` tokens (None half the time).
pub fn random_segments(rng: &mut Rng, t: usize) -> Option<Vec<i32>> {
    if rng.uniform() < 0.5 {
        return None;
    }
    let mut ids = Vec::with_capacity(t);
    let mut id = 0;
    while ids.len() < t {
        let len = 1 + rng.below(t.max(2) / 2 + 1);
        for _ in 0..len.min(t - ids.len()) {
            ids.push(id);
        }
        id += 1;
    }
    Some(ids)
}

#[test]
fn every_op_passes_in_every_schedule_order() {
    let test = "every_op_passes_in_every_schedule_order";
    let gpu = test_gpu(test);
    if !gpu.is_emulated() {
        println!("{test}: skipped: schedule orders are the emulated device's (this run has a GPU)");
        return;
    }
    let mut rng = seeded(test);
    // COA_EMU_ORDER picks one order (the planted-bug check runs them one by one).
    let orders: Vec<Order> = match std::env::var("COA_EMU_ORDER") {
        Ok(o) if !o.is_empty() => vec![o.parse().unwrap_or_else(|e| panic!("COA_EMU_ORDER: {e}"))],
        _ => Order::all(rng.next_u64()).to_vec(),
    };
    for order in orders {
        emu::set_order(Some(order)).unwrap();
        eprintln!(" schedule order {order}");
        attention::small(&gpu, &mut rng);
        cross_entropy::small(&gpu, &mut rng);
        rmsnorm::small(&gpu, &mut rng);
        rope::small(&gpu, &mut rng);
        swiglu::small(&gpu, &mut rng);
        embedding::small(&gpu, &mut rng);
        adamw::small(&gpu, &mut rng);
        elementwise::small(&gpu, &mut rng);
        decode_attention::small(&gpu, &mut rng);
    }
    emu::set_order(None).unwrap();
}
