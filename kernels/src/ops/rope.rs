//! Rotary position embedding, forward and inverse (`kernels/rope.cu`). CPU reference:
//! `coa_model::ops::rope_forward` / `rope_backward` (tables from `rope_tables`). Test:
//! `tests/gpu_kernels/rope.rs`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::{Error, Result};
use crate::gpu::{check_len, i32_of, Gpu};
use crate::sources::KernelSource;

/// `kernels/rope.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "rope",
    text: include_str!("../../rope.cu"),
    entry_points: &["rope_apply"],
};

impl Gpu {
    /// In-place rotary embedding on `x` (token n, head h at `n*st + h*sh`, `hd` values), with
    /// `cos`/`sin` [P, hd/2] from `coa_model::ops::rope_tables`; `pos` [N] picks the table row
    /// (None: row n). `inverse` applies the backward (rotation by −angle) to a gradient.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut impl DevicePtrMut<bf16>,
        pos: Option<&CudaSlice<i32>>,
        cos: &impl DevicePtr<f32>,
        sin: &impl DevicePtr<f32>,
        n: usize,
        heads: usize,
        hd: usize,
        st: usize,
        sh: usize,
        inverse: bool,
    ) -> Result<()> {
        if hd % 2 != 0 {
            return Err(Error(format!("rope needs an even head_dim, got {hd}")));
        }
        if n == 0 || heads == 0 {
            return Ok(());
        }
        check_len("rope x", x.len(), (n - 1) * st + (heads - 1) * sh + hd)?;
        match pos {
            Some(p) => check_len("rope pos", p.len(), n)?,
            None => check_len("rope tables (per token)", cos.len().min(sin.len()), n * hd / 2)?,
        }
        let (xp, _g1) = x.device_ptr_mut(&self.stream);
        let pp = pos.map(|p| p.device_ptr(&self.stream));
        let posp = pp.as_ref().map(|x| x.0).unwrap_or(0);
        let (cp, _g2) = cos.device_ptr(&self.stream);
        let (sp, _g3) = sin.device_ptr(&self.stream);
        let (ni, hi, di) = (i32_of("rows", n)?, i32_of("heads", heads)?, i32_of("head_dim", hd)?);
        let (sti, shi, inv) = (st as i64, sh as i64, inverse as i32);
        let f = self.func(&SOURCE, "rope_apply")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&posp).arg(&cp).arg(&sp).arg(&ni).arg(&hi).arg(&di).arg(&sti).arg(&shi).arg(&inv);
        // SAFETY: x extent checked; positions must index the tables (the caller builds both).
        unsafe { b.launch(Self::cfg1(self.grid_for(n * heads * hd / 2, 256), 256, 0)) }?;
        Ok(())
    }
}
