//! RMSNorm forward and backward (`kernels/rmsnorm.cu`). CPU reference:
//! `coa_model::ops::rmsnorm_forward` / `rmsnorm_backward`. Test: `tests/gpu_kernels/rmsnorm.rs`.

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::{Error, Result};
use crate::gpu::{check_len, i32_of, Gpu};
use crate::ops::rope::HeadRows;
use crate::sources::KernelSource;

/// `kernels/rmsnorm.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "rmsnorm",
    text: include_str!("../../rmsnorm.cu"),
    entry_points: &["rmsnorm_fwd", "rmsnorm_bwd", "sum_rows_f32_add"],
};

/// The rows one RMSNorm launch normalises: `n` rows of `d`, `per` of them per token row `ld`
/// elements apart (1 and d: plain rows; see rmsnorm.cu), `threads` per block.
#[derive(Clone, Copy)]
struct Rows {
    n: usize,
    d: usize,
    per: usize,
    ld: usize,
    threads: u32,
}

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
        // SAFETY: lengths checked.
        unsafe { self.launch_rmsnorm_fwd([xp, wp, yp, rp, 0], Rows { n, d, per: 1, ld: d, threads: 256 }, eps) }
    }

    /// Qwen3's q or k norm: RMSNorm of each head of `rows` in `x` (a column block of the fused
    /// q|k|v rows), in place; `rstd [tokens·heads]` written, and the input kept in
    /// `xsave [tokens·heads, hd]` when given (what [`Gpu::head_rmsnorm_bwd`] reads). CPU
    /// reference: `rmsnorm_forward` over rows of hd.
    pub fn head_rmsnorm_fwd<S: DevicePtrMut<bf16>>(
        &self,
        x: &mut impl DevicePtrMut<bf16>,
        rows: HeadRows,
        w: &impl DevicePtr<bf16>,
        rstd: &mut impl DevicePtrMut<f32>,
        xsave: Option<&mut S>,
        eps: f32,
    ) -> Result<()> {
        let (n, hd) = check_heads(&rows)?;
        if n == 0 {
            return Ok(());
        }
        check_len("head rmsnorm x", x.len(), rows.extent())?;
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
        // x and y are the same buffer: the kernel reads each row before writing it.
        // SAFETY: extents checked (the last token's heads end at (tokens - 1)·ld + heads·hd).
        unsafe { self.launch_rmsnorm_fwd([xp, wp, xp, rp, sp], Rows { n, d: hd, per: rows.heads, ld: rows.ld, threads: 64 }, eps) }
    }

    /// `rmsnorm_fwd` on device pointers x, w, y, rstd, xsave (0: none).
    ///
    /// # Safety
    /// The pointers address what `r` reads and writes (see rmsnorm.cu).
    unsafe fn launch_rmsnorm_fwd(&self, [x, w, y, rstd, xsave]: [CUdeviceptr; 5], r: Rows, eps: f32) -> Result<()> {
        let (ni, di, per, ld) = (i32_of("rows", r.n)?, i32_of("dim", r.d)?, i32_of("heads", r.per)?, r.ld as i64);
        let f = self.func(&SOURCE, "rmsnorm_fwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x).arg(&w).arg(&y).arg(&rstd).arg(&xsave).arg(&ni).arg(&di).arg(&eps).arg(&per).arg(&ld);
        let grid = r.n.min(self.info.multiprocessors as usize * 16) as u32;
        // SAFETY: the caller's.
        unsafe { b.launch(Self::cfg1(grid, r.threads, 0)) }?;
        Ok(())
    }

    /// Backward of [`Gpu::head_rmsnorm_fwd`], in place: `dx` holds d loss / d (the norm's output)
    /// on entry (heads as there) and d loss / d (its input) on exit; `x` is the kept input
    /// `[tokens·heads, hd]`; `dw [hd]` ACCUMULATED.
    pub fn head_rmsnorm_bwd(
        &self,
        dx: &mut impl DevicePtrMut<bf16>,
        rows: HeadRows,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        rstd: &impl DevicePtr<f32>,
        dw: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let (n, hd) = check_heads(&rows)?;
        if n == 0 {
            return Ok(());
        }
        check_len("head rmsnorm_bwd dx", dx.len(), rows.extent())?;
        for (what, len, need) in [("x", x.len(), n * hd), ("w", w.len(), hd), ("rstd", rstd.len(), n), ("dw", dw.len(), hd)] {
            check_len(&format!("head rmsnorm_bwd {what}"), len, need)?;
        }
        let (dxp, _g1) = dx.device_ptr_mut(&self.stream);
        let (xp, _g2) = x.device_ptr(&self.stream);
        let (wp, _g3) = w.device_ptr(&self.stream);
        let (rp, _g4) = rstd.device_ptr(&self.stream);
        let (dwp, _g5) = dw.device_ptr_mut(&self.stream);
        // dy and dx are the same buffer: each thread reads its columns before writing them.
        // SAFETY: extents checked.
        unsafe { self.launch_rmsnorm_bwd([dxp, xp, wp, rp, dxp, dwp], Rows { n, d: hd, per: rows.heads, ld: rows.ld, threads: 64 }, false) }
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
        (n, d): (usize, usize),
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
        let (dyp, _g1) = dy.device_ptr(&self.stream);
        let (xp, _g2) = x.device_ptr(&self.stream);
        let (wp, _g3) = w.device_ptr(&self.stream);
        let (rp, _g4) = rstd.device_ptr(&self.stream);
        let (dxp, _g5) = dx.device_ptr_mut(&self.stream);
        let (dwp, _g6) = dw.device_ptr_mut(&self.stream);
        // SAFETY: lengths checked.
        unsafe { self.launch_rmsnorm_bwd([dyp, xp, wp, rp, dxp, dwp], Rows { n, d, per: 1, ld: d, threads: 256 }, accumulate) }
    }

    /// `rmsnorm_bwd` on device pointers dy, x, w, rstd, dx, dw, then the sum of the blocks' dw
    /// partials into dw (fixed order).
    ///
    /// # Safety
    /// The pointers address what `r` reads and writes (see rmsnorm.cu); `r.n` > 0.
    unsafe fn launch_rmsnorm_bwd(&self, [dy, x, w, rstd, dx, dw]: [CUdeviceptr; 6], r: Rows, accumulate: bool) -> Result<()> {
        let d = r.d;
        if d * 4 + 1024 > self.max_smem_optin as usize {
            return Err(Error(format!("rmsnorm_bwd: row size {d} too large for one block's dw partial")));
        }
        let grid = r.n.min(self.info.multiprocessors as usize * 2);
        let mut part: CudaSlice<f32> = unsafe { self.stream.alloc(grid * d) }?;
        let (pp, _g) = part.device_ptr_mut(&self.stream);
        let (ni, di, acc, per, ld) = (i32_of("rows", r.n)?, i32_of("dim", d)?, accumulate as i32, i32_of("heads", r.per)?, r.ld as i64);
        let f = self.func(&SOURCE, "rmsnorm_bwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&dy).arg(&x).arg(&w).arg(&rstd).arg(&dx).arg(&pp).arg(&ni).arg(&di).arg(&acc).arg(&per).arg(&ld);
        // SAFETY: the caller's; part has grid * d elements; smem d floats.
        unsafe { b.launch(Self::cfg1(grid as u32, r.threads, (d * 4) as u32)) }?;
        let gi = grid as i32;
        let f = self.func(&SOURCE, "sum_rows_f32_add")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&pp).arg(&dw).arg(&gi).arg(&di);
        // SAFETY: part [grid, d], dw [d].
        unsafe { b.launch(Self::cfg1(d.div_ceil(256) as u32, 256, 0)) }?;
        Ok(())
    }
}

/// Head norms: the checks of [`HeadRows::check`]. Returns the rows normalised (tokens × heads) and
/// the head dimension.
fn check_heads(r: &HeadRows) -> Result<(usize, usize)> {
    r.check("head rmsnorm")?;
    Ok((r.tokens * r.heads, r.head_dim))
}
