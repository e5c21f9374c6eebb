//! RMSNorm forward and backward (`kernels/rmsnorm.cu`). CPU reference:
//! `coa_model::ops::rmsnorm_forward` / `rmsnorm_backward`. Test: `tests/gpu_kernels/rmsnorm.rs`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::{Error, Result};
use crate::gpu::{check_len, i32_of, Gpu};
use crate::sources::KernelSource;

/// `kernels/rmsnorm.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "rmsnorm",
    text: include_str!("../../rmsnorm.cu"),
    entry_points: &["rmsnorm_fwd", "rmsnorm_bwd", "sum_rows_f32_add"],
};

impl Gpu {
    /// `y [N, D]`, `rstd [N]` written (see rmsnorm.cu).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_fwd(
        &self,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        y: &mut impl DevicePtrMut<bf16>,
        rstd: &mut impl DevicePtrMut<f32>,
        n: usize,
        d: usize,
        eps: f32,
    ) -> Result<()> {
        if d % 2 != 0 {
            return Err(Error(format!("rmsnorm needs an even hidden size, got {d}")));
        }
        check_len("rmsnorm x", x.len(), n * d)?;
        check_len("rmsnorm w", w.len(), d)?;
        check_len("rmsnorm y", y.len(), n * d)?;
        check_len("rmsnorm rstd", rstd.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let (xp, _g1) = x.device_ptr(&self.stream);
        let (wp, _g2) = w.device_ptr(&self.stream);
        let (yp, _g3) = y.device_ptr_mut(&self.stream);
        let (rp, _g4) = rstd.device_ptr_mut(&self.stream);
        let (ni, di) = (i32_of("rows", n)?, i32_of("dim", d)?);
        let f = self.func(&SOURCE, "rmsnorm_fwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&wp).arg(&yp).arg(&rp).arg(&ni).arg(&di).arg(&eps);
        let grid = n.min(self.info.multiprocessors as usize * 16) as u32;
        // SAFETY: lengths checked.
        unsafe { b.launch(Self::cfg1(grid, 256, 0)) }?;
        Ok(())
    }

    /// dx [N, D] written (`accumulate`: added to), dw [D] f32 ACCUMULATED (+=), as
    /// `coa_model::ops::rmsnorm_backward` (which accumulates both).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_bwd(
        &self,
        dy: &impl DevicePtr<bf16>,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        rstd: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<bf16>,
        dw: &mut impl DevicePtrMut<f32>,
        n: usize,
        d: usize,
        accumulate: bool,
    ) -> Result<()> {
        if d % 2 != 0 {
            return Err(Error(format!("rmsnorm needs an even hidden size, got {d}")));
        }
        for (what, len, need) in [("dy", dy.len(), n * d), ("x", x.len(), n * d), ("w", w.len(), d), ("rstd", rstd.len(), n), ("dx", dx.len(), n * d), ("dw", dw.len(), d)] {
            check_len(&format!("rmsnorm_bwd {what}"), len, need)?;
        }
        if n == 0 {
            return Ok(());
        }
        if d * 4 + 1024 > self.max_smem_optin as usize {
            return Err(Error(format!("rmsnorm_bwd: hidden size {d} too large for one block's dw partial")));
        }
        let grid = n.min(self.info.multiprocessors as usize * 2);
        let mut part: CudaSlice<f32> = unsafe { self.stream.alloc(grid * d) }?;
        let (dyp, _g1) = dy.device_ptr(&self.stream);
        let (xp, _g2) = x.device_ptr(&self.stream);
        let (wp, _g3) = w.device_ptr(&self.stream);
        let (rp, _g4) = rstd.device_ptr(&self.stream);
        let (dxp, _g5) = dx.device_ptr_mut(&self.stream);
        let (pp, _g6) = part.device_ptr_mut(&self.stream);
        let (dwp, _g7) = dw.device_ptr_mut(&self.stream);
        let (ni, di, acc) = (i32_of("rows", n)?, i32_of("dim", d)?, accumulate as i32);
        let f = self.func(&SOURCE, "rmsnorm_bwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&dyp).arg(&xp).arg(&wp).arg(&rp).arg(&dxp).arg(&pp).arg(&ni).arg(&di).arg(&acc);
        // SAFETY: lengths checked; part has grid * d elements; smem d floats.
        unsafe { b.launch(Self::cfg1(grid as u32, 256, (d * 4) as u32)) }?;
        let gi = grid as i32;
        let f = self.func(&SOURCE, "sum_rows_f32_add")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&pp).arg(&dwp).arg(&gi).arg(&di);
        // SAFETY: part [grid, d], dw [d].
        unsafe { b.launch(Self::cfg1(d.div_ceil(256) as u32, 256, 0)) }?;
        Ok(())
    }
}
