//! AdamW on fp32 master weights, writing the bf16 copy (`kernels/adamw.cu`). CPU reference:
//! coa-train-step's `optim::adamw_update` (written out in the test). Test:
//! `tests/gpu_kernels/adamw.rs`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::Result;
use crate::gpu::{check_len, Gpu};
use crate::sources::KernelSource;

/// `kernels/adamw.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "adamw",
    text: include_str!("../../adamw.cu"),
    entry_points: &["adamw_step"],
};

/// AdamW scalars, computed exactly as coa-train-step's CPU `optim::adamw_update` does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWArgs {
    pub b1: f32,
    pub b2: f32,
    pub eps: f32,
    pub keep: f32,
    pub step_size: f32,
    pub bc2_sqrt: f32,
    pub grad_scale: f32,
}

impl AdamWArgs {
    /// `t` is the 1-based step; `decay` whether this tensor gets weight decay; `grad_scale` the
    /// clipping factor (1 = none).
    #[allow(clippy::too_many_arguments)]
    pub fn new(lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64, t: u64, decay: bool, grad_scale: f32) -> Self {
        let bc1 = 1.0 - beta1.powi(t as i32);
        let bc2 = 1.0 - beta2.powi(t as i32);
        AdamWArgs {
            b1: beta1 as f32,
            b2: beta2 as f32,
            eps: eps as f32,
            keep: if decay { (1.0 - lr * weight_decay) as f32 } else { 1.0 },
            step_size: (lr / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            grad_scale,
        }
    }
}

impl Gpu {
    /// One AdamW step on `n` elements (see adamw.cu); `p_bf16` receives the bf16 copy.
    #[allow(clippy::too_many_arguments)]
    pub fn adamw(
        &self,
        p: &mut impl DevicePtrMut<f32>,
        g: &impl DevicePtr<f32>,
        m: &mut impl DevicePtrMut<f32>,
        v: &mut impl DevicePtrMut<f32>,
        p_bf16: Option<&mut CudaSlice<bf16>>,
        n: usize,
        a: &AdamWArgs,
    ) -> Result<()> {
        for (what, len) in [("p", p.len()), ("g", g.len()), ("m", m.len()), ("v", v.len())] {
            check_len(&format!("adamw {what}"), len, n)?;
        }
        if let Some(pb) = &p_bf16 {
            check_len("adamw p_bf16", pb.len(), n)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (pp, _g1) = p.device_ptr_mut(&self.stream);
        let (gp, _g2) = g.device_ptr(&self.stream);
        let (mp, _g3) = m.device_ptr_mut(&self.stream);
        let (vp, _g4) = v.device_ptr_mut(&self.stream);
        let pb = p_bf16.map(|x| x.device_ptr_mut(&self.stream));
        let pbp = pb.as_ref().map(|x| x.0).unwrap_or(0);
        let ni = n as i64;
        let f = self.func(&SOURCE, "adamw_step")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&pp).arg(&gp).arg(&mp).arg(&vp).arg(&pbp).arg(&ni);
        b.arg(&a.b1).arg(&a.b2).arg(&a.eps).arg(&a.keep).arg(&a.step_size).arg(&a.bc2_sqrt).arg(&a.grad_scale);
        // SAFETY: lengths checked.
        unsafe { b.launch(Self::cfg1(self.grid_for(n, 256), 256, 0)) }?;
        Ok(())
    }
}
