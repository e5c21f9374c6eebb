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

/// Where heads lie in a `[tokens, ld]` bf16 buffer: `heads` vectors of `head_dim` side by side
/// from the start of each token's row (q and k within a fused q|k|v row: ld is its width). RoPE
/// and the per-head RMSNorm (Qwen3's q/k norms) work on such rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadRows {
    pub tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Elements between consecutive tokens' rows.
    pub ld: usize,
}

impl HeadRows {
    /// What every op on heads needs: at least one head, an even head dimension (the kernels rotate
    /// and read bf16 pairs), and heads that fit their token's row.
    pub fn check(&self, op: &str) -> Result<()> {
        let HeadRows { heads, head_dim: hd, ld, .. } = *self;
        if hd % 2 != 0 || hd == 0 || heads == 0 || heads * hd > ld {
            return Err(Error(format!("{op}: {heads} heads of {hd} (even, > 0) must fit rows of {ld} elements")));
        }
        Ok(())
    }
    /// One past the last element the rows cover (0 without tokens or heads).
    pub fn extent(&self) -> usize {
        if self.tokens == 0 || self.heads == 0 {
            return 0;
        }
        (self.tokens - 1) * self.ld + self.heads * self.head_dim
    }
}

impl Gpu {
    /// In-place rotary embedding on the heads of `x`, with `cos`/`sin` [P, hd/2] from
    /// `coa_model::ops::rope_tables`; `pos` [tokens] picks the table row (None: row n).
    /// `inverse` applies the backward (rotation by −angle) to a gradient.
    pub fn rope(
        &self,
        x: &mut impl DevicePtrMut<bf16>,
        rows: HeadRows,
        pos: Option<&CudaSlice<i32>>,
        cos: &impl DevicePtr<f32>,
        sin: &impl DevicePtr<f32>,
        inverse: bool,
    ) -> Result<()> {
        rows.check("rope")?;
        let HeadRows { tokens: n, heads, head_dim: hd, ld } = rows;
        if n == 0 {
            return Ok(());
        }
        check_len("rope x", x.len(), rows.extent())?;
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
        // heads are contiguous within a row: head stride hd
        let (sti, shi, inv) = (ld as i64, hd as i64, inverse as i32);
        let f = self.func(&SOURCE, "rope_apply")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&posp).arg(&cp).arg(&sp).arg(&ni).arg(&hi).arg(&di).arg(&sti).arg(&shi).arg(&inv);
        // SAFETY: x extent checked; positions must index the tables (the caller builds both).
        unsafe { b.launch(Self::cfg1(self.grid_for(n * heads * hd / 2, 256), 256, 0)) }?;
        Ok(())
    }
}
