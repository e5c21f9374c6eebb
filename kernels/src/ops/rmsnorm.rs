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
        let (per, ld, xsave) = (1i32, d as i64, 0u64);
        let f = self.func(&SOURCE, "rmsnorm_fwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&wp).arg(&yp).arg(&rp).arg(&xsave).arg(&ni).arg(&di).arg(&eps).arg(&per).arg(&ld);
        let grid = n.min(self.info.multiprocessors as usize * 16) as u32;
        // SAFETY: lengths checked.
        unsafe { b.launch(Self::cfg1(grid, 256, 0)) }?;
        Ok(())
    }

    /// Qwen3's q or k norm: RMSNorm of each of the `heads` heads (`hd` wide) of `tokens` rows
    /// `ld` elements apart in `x` (a column block of the fused q|k|v rows), in place; `rstd
    /// [tokens·heads]` written, and the input kept in `xsave [tokens·heads, hd]` when given (what
    /// [`Gpu::head_rmsnorm_bwd`] reads). CPU reference: `rmsnorm_forward` over rows of hd.
    #[allow(clippy::too_many_arguments)]
    pub fn head_rmsnorm_fwd<S: DevicePtrMut<bf16>>(
        &self,
        x: &mut impl DevicePtrMut<bf16>,
        w: &impl DevicePtr<bf16>,
        rstd: &mut impl DevicePtrMut<f32>,
        xsave: Option<&mut S>,
        tokens: usize,
        heads: usize,
        hd: usize,
        ld: usize,
        eps: f32,
    ) -> Result<()> {
        let n = tokens * heads;
        check_heads(hd, heads, ld)?;
        if n == 0 {
            return Ok(());
        }
        check_len("head rmsnorm x", x.len(), (tokens - 1) * ld + heads * hd)?;
        check_len("head rmsnorm w", w.len(), hd)?;
        check_len("head rmsnorm rstd", rstd.len(), n)?;
        if let Some(xs) = &xsave {
            check_len("head rmsnorm xsave", xs.len(), n * hd)?;
        }
        let (xp, _g1) = x.device_ptr_mut(&self.stream);
        let (wp, _g2) = w.device_ptr(&self.stream);
        let (rp, _g3) = rstd.device_ptr_mut(&self.stream);
        let (sp, _g4) = match xsave {
            Some(xs) => {
                let (p, g) = xs.device_ptr_mut(&self.stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let (ni, di, per, ld) = (i32_of("rows", n)?, i32_of("dim", hd)?, i32_of("heads", heads)?, ld as i64);
        let f = self.func(&SOURCE, "rmsnorm_fwd")?;
        let mut b = self.stream.launch_builder(&f);
        // x and y are the same buffer: the kernel reads each row before writing it.
        b.arg(&xp).arg(&wp).arg(&xp).arg(&rp).arg(&sp).arg(&ni).arg(&di).arg(&eps).arg(&per).arg(&ld);
        let grid = n.min(self.info.multiprocessors as usize * 16) as u32;
        // SAFETY: extents checked (the last token's heads end at (tokens - 1)·ld + heads·hd).
        unsafe { b.launch(Self::cfg1(grid, 64, 0)) }?;
        Ok(())
    }

    /// Backward of [`Gpu::head_rmsnorm_fwd`], in place: `dx` holds d loss / d (the norm's output)
    /// on entry (heads as there) and d loss / d (its input) on exit; `x` is the kept input
    /// `[tokens·heads, hd]`; `dw [hd]` ACCUMULATED.
    #[allow(clippy::too_many_arguments)]
    pub fn head_rmsnorm_bwd(
        &self,
        dx: &mut impl DevicePtrMut<bf16>,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        rstd: &impl DevicePtr<f32>,
        dw: &mut impl DevicePtrMut<f32>,
        tokens: usize,
        heads: usize,
        hd: usize,
        ld: usize,
    ) -> Result<()> {
        let n = tokens * heads;
        check_heads(hd, heads, ld)?;
        if n == 0 {
            return Ok(());
        }
        check_len("head rmsnorm_bwd dx", dx.len(), (tokens - 1) * ld + heads * hd)?;
        for (what, len, need) in [("x", x.len(), n * hd), ("w", w.len(), hd), ("rstd", rstd.len(), n), ("dw", dw.len(), hd)] {
            check_len(&format!("head rmsnorm_bwd {what}"), len, need)?;
        }
        let grid = n.min(self.info.multiprocessors as usize * 2);
        let mut part: CudaSlice<f32> = unsafe { self.stream.alloc(grid * hd) }?;
        let (dxp, _g1) = dx.device_ptr_mut(&self.stream);
        let (xp, _g2) = x.device_ptr(&self.stream);
        let (wp, _g3) = w.device_ptr(&self.stream);
        let (rp, _g4) = rstd.device_ptr(&self.stream);
        let (pp, _g5) = part.device_ptr_mut(&self.stream);
        let (dwp, _g6) = dw.device_ptr_mut(&self.stream);
        let (ni, di, acc, per, ld) = (i32_of("rows", n)?, i32_of("dim", hd)?, 0i32, i32_of("heads", heads)?, ld as i64);
        let f = self.func(&SOURCE, "rmsnorm_bwd")?;
        let mut b = self.stream.launch_builder(&f);
        // dy and dx are the same buffer: each thread reads its columns before writing them.
        b.arg(&dxp).arg(&xp).arg(&wp).arg(&rp).arg(&dxp).arg(&pp).arg(&ni).arg(&di).arg(&acc).arg(&per).arg(&ld);
        // SAFETY: extents checked; part has grid * hd elements; smem hd floats.
        unsafe { b.launch(Self::cfg1(grid as u32, 64, (hd * 4) as u32)) }?;
        let gi = grid as i32;
        let f = self.func(&SOURCE, "sum_rows_f32_add")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&pp).arg(&dwp).arg(&gi).arg(&di);
        // SAFETY: part [grid, hd], dw [hd].
        unsafe { b.launch(Self::cfg1(hd.div_ceil(256) as u32, 256, 0)) }?;
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
        let (ni, di, acc, per, ld) = (i32_of("rows", n)?, i32_of("dim", d)?, accumulate as i32, 1i32, d as i64);
        let f = self.func(&SOURCE, "rmsnorm_bwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&dyp).arg(&xp).arg(&wp).arg(&rp).arg(&dxp).arg(&pp).arg(&ni).arg(&di).arg(&acc).arg(&per).arg(&ld);
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

/// Head norms: an even head dimension, and heads that fit their token's row.
fn check_heads(hd: usize, heads: usize, ld: usize) -> Result<()> {
    if hd % 2 != 0 || hd == 0 || heads == 0 || heads * hd > ld {
        return Err(Error(format!("head rmsnorm: {heads} heads of {hd} (even, > 0) must fit rows of {ld} elements")));
    }
    Ok(())
}
