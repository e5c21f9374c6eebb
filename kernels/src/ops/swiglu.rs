//! SwiGLU forward and backward (`kernels/swiglu.cu`). CPU reference:
//! `coa_model::ops::swiglu_forward` / `swiglu_backward`. Test: `tests/gpu_kernels/swiglu.rs`.

use cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::Result;
use crate::gpu::{check_len, i32_of, Gpu};
use crate::sources::KernelSource;

/// `kernels/swiglu.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "swiglu",
    text: include_str!("../../swiglu.cu"),
    entry_points: &["swiglu_fwd", "swiglu_bwd"],
};

impl Gpu {
    /// `h = silu(gate) * up` over [N, F] (row strides `gate_st`, `up_st`, `h_st`).
    #[allow(clippy::too_many_arguments)]
    pub fn swiglu_fwd(
        &self,
        gate: &impl DevicePtr<bf16>,
        up: &impl DevicePtr<bf16>,
        h: &mut impl DevicePtrMut<bf16>,
        n: usize,
        f: usize,
        gate_st: usize,
        up_st: usize,
        h_st: usize,
    ) -> Result<()> {
        if n == 0 || f == 0 {
            return Ok(());
        }
        check_len("swiglu gate", gate.len(), (n - 1) * gate_st + f)?;
        check_len("swiglu up", up.len(), (n - 1) * up_st + f)?;
        check_len("swiglu h", h.len(), (n - 1) * h_st + f)?;
        let (gp, _g1) = gate.device_ptr(&self.stream);
        let (upp, _g2) = up.device_ptr(&self.stream);
        let (hp, _g3) = h.device_ptr_mut(&self.stream);
        let (ni, fi) = (i32_of("rows", n)?, i32_of("width", f)?);
        let (a, b_, c) = (gate_st as i64, up_st as i64, h_st as i64);
        let func = self.func(&SOURCE, "swiglu_fwd")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&gp).arg(&upp).arg(&hp).arg(&ni).arg(&fi).arg(&a).arg(&b_).arg(&c);
        // SAFETY: extents checked.
        unsafe { b.launch(Self::cfg1(self.grid_for(n * f, 256), 256, 0)) }?;
        Ok(())
    }

    /// dgate, dup WRITTEN (the CPU reference accumulates into zeroed buffers) from dh; each
    /// tensor has its own row stride.
    #[allow(clippy::too_many_arguments)]
    pub fn swiglu_bwd(
        &self,
        dh: &impl DevicePtr<bf16>,
        gate: &impl DevicePtr<bf16>,
        up: &impl DevicePtr<bf16>,
        dgate: &mut impl DevicePtrMut<bf16>,
        dup: &mut impl DevicePtrMut<bf16>,
        n: usize,
        f: usize,
        strides: [usize; 5],
    ) -> Result<()> {
        if n == 0 || f == 0 {
            return Ok(());
        }
        let [gate_st, up_st, h_st, dg_st, du_st] = strides;
        check_len("swiglu dh", dh.len(), (n - 1) * h_st + f)?;
        check_len("swiglu gate", gate.len(), (n - 1) * gate_st + f)?;
        check_len("swiglu up", up.len(), (n - 1) * up_st + f)?;
        check_len("swiglu dgate", dgate.len(), (n - 1) * dg_st + f)?;
        check_len("swiglu dup", dup.len(), (n - 1) * du_st + f)?;
        let (dhp, _g0) = dh.device_ptr(&self.stream);
        let (gp, _g1) = gate.device_ptr(&self.stream);
        let (upp, _g2) = up.device_ptr(&self.stream);
        let (dgp, _g3) = dgate.device_ptr_mut(&self.stream);
        let (dup_, _g4) = dup.device_ptr_mut(&self.stream);
        self.launch_swiglu_bwd(dhp, gp, upp, dgp, dup_, n, f, [gate_st, up_st, h_st, dg_st, du_st])
    }

    /// SwiGLU backward on the fused layout: `gu [N, 2F]` holds gate | up per row, `dgu [N, 2F]`
    /// receives dgate | dup, `dh [N, F]`.
    pub fn swiglu_bwd_fused(
        &self,
        dh: &impl DevicePtr<bf16>,
        gu: &impl DevicePtr<bf16>,
        dgu: &mut impl DevicePtrMut<bf16>,
        n: usize,
        f: usize,
    ) -> Result<()> {
        if n == 0 || f == 0 {
            return Ok(());
        }
        check_len("swiglu dh", dh.len(), n * f)?;
        check_len("swiglu gate|up", gu.len(), n * 2 * f)?;
        check_len("swiglu dgate|dup", dgu.len(), n * 2 * f)?;
        let (dhp, _g0) = dh.device_ptr(&self.stream);
        let (gp, _g1) = gu.device_ptr(&self.stream);
        let (dgp, _g3) = dgu.device_ptr_mut(&self.stream);
        let off = (f * std::mem::size_of::<bf16>()) as u64;
        self.launch_swiglu_bwd(dhp, gp, gp + off, dgp, dgp + off, n, f, [2 * f, 2 * f, f, 2 * f, 2 * f])
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_swiglu_bwd(&self, dhp: u64, gp: u64, upp: u64, dgp: u64, dup_: u64, n: usize, f: usize, st: [usize; 5]) -> Result<()> {
        let (ni, fi) = (i32_of("rows", n)?, i32_of("width", f)?);
        let st: Vec<i64> = st.iter().map(|&x| x as i64).collect();
        let func = self.func(&SOURCE, "swiglu_bwd")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&dhp).arg(&gp).arg(&upp).arg(&dgp).arg(&dup_).arg(&ni).arg(&fi);
        b.arg(&st[0]).arg(&st[1]).arg(&st[2]).arg(&st[3]).arg(&st[4]);
        // SAFETY: extents checked by the callers.
        unsafe { b.launch(Self::cfg1(self.grid_for(n * f, 256), 256, 0)) }?;
        Ok(())
    }
}
