//! Fused softmax cross-entropy and the head's statistics (`kernels/cross_entropy.cu`). CPU
//! reference: `coa_model::ops::masked_cross_entropy`, `logsoftmax_forward` (with its entropy),
//! `logsoftmax_backward_inplace`. Test: `tests/gpu_kernels/cross_entropy.rs`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::Result;
use crate::gpu::{check_len, i32_of, Gpu};
use crate::sources::KernelSource;

/// `kernels/cross_entropy.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "cross_entropy",
    text: include_str!("../../cross_entropy.cu"),
    entry_points: &["xent_fwd_bwd", "xent_weights_from_mask", "xent_loss_sum", "xent_entropy"],
};

impl Gpu {
    /// Fused softmax cross-entropy over `logits [N, V]` (see cross_entropy.cu): `logp [N]` (and
    /// `lse [N]`) written; with `write_grad` the logits are overwritten by
    /// `g_i * (softmax - onehot)`. `g` None means 1 for every row.
    #[allow(clippy::too_many_arguments)]
    pub fn xent_fwd_bwd(
        &self,
        logits: &mut impl DevicePtrMut<bf16>,
        targets: &impl DevicePtr<i32>,
        g: Option<&CudaSlice<f32>>,
        logp: &mut impl DevicePtrMut<f32>,
        lse: Option<&mut CudaSlice<f32>>,
        n: usize,
        v: usize,
        write_grad: bool,
    ) -> Result<()> {
        check_len("xent logits", logits.len(), n * v)?;
        check_len("xent targets", targets.len(), n)?;
        check_len("xent logp", logp.len(), n)?;
        if let Some(g) = g {
            check_len("xent g", g.len(), n)?;
        }
        if let Some(l) = &lse {
            check_len("xent lse", l.len(), n)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (xp, _g1) = logits.device_ptr_mut(&self.stream);
        let (tp, _g2) = targets.device_ptr(&self.stream);
        let gg = g.map(|x| x.device_ptr(&self.stream));
        let (lpp, _g3) = logp.device_ptr_mut(&self.stream);
        let ll = lse.map(|x| x.device_ptr_mut(&self.stream));
        let gp = gg.as_ref().map(|x| x.0).unwrap_or(0);
        let lsp = ll.as_ref().map(|x| x.0).unwrap_or(0);
        let (ni, vi) = (i32_of("rows", n)?, i32_of("vocab", v)?);
        let wg = write_grad as i32;
        // Keep as much of a row in shared memory as fits (one pass over DRAM); a multiple of 8.
        let cap = ((self.max_smem_optin as usize).saturating_sub(1024) / 2) & !7;
        let cache = if v % 8 == 0 && write_grad { v.min(cap) } else { 0 };
        let cache_i = cache as i32;
        let threads = ((v / 8).next_multiple_of(32)).clamp(32, 1024) as u32;
        let f = self.func(&SOURCE, "xent_fwd_bwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&tp).arg(&gp).arg(&lpp).arg(&lsp).arg(&ni).arg(&vi).arg(&wg).arg(&cache_i);
        // SAFETY: lengths checked; grid = one block per row.
        unsafe { b.launch(Self::cfg1(n as u32, threads, (cache * 2) as u32)) }?;
        Ok(())
    }

    /// `g = mask / Σ mask` (zeros when Σ mask = 0): the SFT weights.
    pub fn xent_weights_from_mask(&self, mask: &impl DevicePtr<f32>, g: &mut impl DevicePtrMut<f32>, n: usize) -> Result<()> {
        check_len("mask", mask.len(), n)?;
        check_len("g", g.len(), n)?;
        let (mp, _g1) = mask.device_ptr(&self.stream);
        let (gp, _g2) = g.device_ptr_mut(&self.stream);
        let ni = i32_of("rows", n)?;
        let f = self.func(&SOURCE, "xent_weights_from_mask")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mp).arg(&gp).arg(&ni);
        // SAFETY: lengths checked; one block.
        unsafe { b.launch(Self::cfg1(1, 1024, 0)) }?;
        Ok(())
    }

    /// `out[0] = Σ g_i * (-logp_i)`.
    pub fn xent_loss_sum(&self, logp: &impl DevicePtr<f32>, g: Option<&CudaSlice<f32>>, out: &mut impl DevicePtrMut<f32>, n: usize) -> Result<()> {
        check_len("logp", logp.len(), n)?;
        check_len("loss", out.len(), 1)?;
        let (lp, _g1) = logp.device_ptr(&self.stream);
        let gg = g.map(|x| x.device_ptr(&self.stream));
        let gp = gg.as_ref().map(|x| x.0).unwrap_or(0);
        let (op, _g2) = out.device_ptr_mut(&self.stream);
        let ni = i32_of("rows", n)?;
        let f = self.func(&SOURCE, "xent_loss_sum")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&lp).arg(&gp).arg(&op).arg(&ni);
        // SAFETY: lengths checked; one block.
        unsafe { b.launch(Self::cfg1(1, 1024, 0)) }?;
        Ok(())
    }

    /// `entropy [N]` of each row's softmax over `logits [N, V]` (read only), from the `lse [N]` of a
    /// forward-only [`Gpu::xent_fwd_bwd`]; 0 for rows whose target is < 0 (see cross_entropy.cu).
    pub fn xent_entropy(
        &self,
        logits: &impl DevicePtr<bf16>,
        targets: &impl DevicePtr<i32>,
        lse: &impl DevicePtr<f32>,
        entropy: &mut impl DevicePtrMut<f32>,
        n: usize,
        v: usize,
    ) -> Result<()> {
        check_len("entropy logits", logits.len(), n * v)?;
        check_len("entropy targets", targets.len(), n)?;
        check_len("entropy lse", lse.len(), n)?;
        check_len("entropy out", entropy.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let (xp, _g1) = logits.device_ptr(&self.stream);
        let (tp, _g2) = targets.device_ptr(&self.stream);
        let (lp, _g3) = lse.device_ptr(&self.stream);
        let (ep, _g4) = entropy.device_ptr_mut(&self.stream);
        let (ni, vi) = (i32_of("rows", n)?, i32_of("vocab", v)?);
        let f = self.func(&SOURCE, "xent_entropy")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&tp).arg(&lp).arg(&ep).arg(&ni).arg(&vi);
        let grid = n.min(self.info.multiprocessors as usize * 32) as u32;
        // SAFETY: lengths checked; rows are grid-strided.
        unsafe { b.launch(Self::cfg1(grid, 256, 0)) }?;
        Ok(())
    }

    /// `coa_model::ops::masked_cross_entropy` on the GPU: returns the loss (synchronises) and
    /// leaves d loss / d logits in `logits`.
    pub fn masked_cross_entropy(
        &self,
        logits: &mut impl DevicePtrMut<bf16>,
        targets: &impl DevicePtr<i32>,
        mask: &impl DevicePtr<f32>,
        n: usize,
        v: usize,
    ) -> Result<f32> {
        let mut g: CudaSlice<f32> = self.zeros(n.max(1))?;
        let mut logp: CudaSlice<f32> = self.zeros(n.max(1))?;
        let mut loss: CudaSlice<f32> = self.zeros(1)?;
        self.xent_weights_from_mask(mask, &mut g, n)?;
        self.xent_fwd_bwd(logits, targets, Some(&g), &mut logp, None, n, v, true)?;
        self.xent_loss_sum(&logp, Some(&g), &mut loss, n)?;
        Ok(self.download(&loss)?[0])
    }
}
