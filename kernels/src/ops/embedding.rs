//! Token embedding, forward and the deterministic sorted scatter-add backward
//! (`kernels/embedding.cu`). CPU reference: `coa_model::ops::embedding_forward` /
//! `embedding_backward`. Test: `tests/gpu_kernels/embedding.rs`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::{Error, Result};
use crate::gpu::{check_len, i32_of, Gpu};
use crate::sources::KernelSource;

/// `kernels/embedding.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "embedding",
    text: include_str!("../../embedding.cu"),
    entry_points: &["embedding_fwd", "embedding_bwd_sorted"],
};

/// Token positions grouped by token id, on the device, for the deterministic embedding backward.
pub struct EmbeddingGradPlan {
    pub order: CudaSlice<i32>,
    pub start: CudaSlice<i32>,
    pub uniq: CudaSlice<i32>,
    pub n_tokens: usize,
    pub n_unique: usize,
}

impl Gpu {
    /// `out[N, D] = W[tok[n]]`. Token ids must be < vocab (clamped on the device, never read OOB).
    pub fn embedding_fwd(
        &self,
        tok: &impl DevicePtr<i32>,
        w: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<bf16>,
        n: usize,
        d: usize,
        vocab: usize,
    ) -> Result<()> {
        check_len("embedding tokens", tok.len(), n)?;
        check_len("embedding table", w.len(), vocab * d)?;
        check_len("embedding out", out.len(), n * d)?;
        if n == 0 || vocab == 0 {
            return Ok(());
        }
        let (tp, _g1) = tok.device_ptr(&self.stream);
        let (wp, _g2) = w.device_ptr(&self.stream);
        let (op, _g3) = out.device_ptr_mut(&self.stream);
        let (ni, di, vi) = (i32_of("rows", n)?, i32_of("dim", d)?, i32_of("vocab", vocab)?);
        let f = self.func(&SOURCE, "embedding_fwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&tp).arg(&wp).arg(&op).arg(&ni).arg(&di).arg(&vi);
        let grid = n.min(self.info.multiprocessors as usize * 32) as u32;
        // SAFETY: lengths checked.
        unsafe { b.launch(Self::cfg1(grid, 128, 0)) }?;
        Ok(())
    }

    /// Groups token positions by id on the host (they are host data anyway) and uploads the plan.
    pub fn embedding_grad_plan(&self, tokens: &[u32], vocab: usize) -> Result<EmbeddingGradPlan> {
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error(format!("token id {bad} >= vocab {vocab}")));
        }
        let mut order: Vec<i32> = (0..tokens.len() as i32).collect();
        order.sort_by_key(|&i| (tokens[i as usize], i)); // stable: positions ascending per token
        let mut start = Vec::new();
        let mut uniq = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let t = tokens[i as usize] as i32;
            if uniq.last() != Some(&t) {
                uniq.push(t);
                start.push(k as i32);
            }
        }
        start.push(order.len() as i32);
        Ok(EmbeddingGradPlan {
            n_tokens: tokens.len(),
            n_unique: uniq.len(),
            order: self.upload(&order)?,
            start: self.upload(&start)?,
            uniq: self.upload(&if uniq.is_empty() { vec![0] } else { uniq })?,
        })
    }

    /// `dW[V, D] += Σ` of `dout [N, D]` rows per token id (deterministic order).
    pub fn embedding_bwd(&self, plan: &EmbeddingGradPlan, dout: &impl DevicePtr<bf16>, dw: &mut impl DevicePtrMut<f32>, d: usize) -> Result<()> {
        check_len("embedding dout", dout.len(), plan.n_tokens * d)?;
        if plan.n_unique == 0 {
            return Ok(());
        }
        let (op, _g1) = dout.device_ptr(&self.stream);
        let (dwp, _g2) = dw.device_ptr_mut(&self.stream);
        let (ui, di) = (i32_of("unique", plan.n_unique)?, i32_of("dim", d)?);
        let f = self.func(&SOURCE, "embedding_bwd_sorted")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&op).arg(&plan.order).arg(&plan.start).arg(&plan.uniq).arg(&dwp).arg(&ui).arg(&di);
        let grid = plan.n_unique.min(self.info.multiprocessors as usize * 32) as u32;
        let threads = d.next_multiple_of(32).min(256) as u32;
        // SAFETY: the plan was built from validated ids (< vocab); dw must hold vocab * d, which
        // the caller sized from the same vocab.
        unsafe { b.launch(Self::cfg1(grid, threads, 0)) }?;
        Ok(())
    }
}
