//! Casts, the residual add, bf16 -> f32 gradient accumulation, Σx² for clipping and LoRA's
//! dropout mask (`kernels/elementwise.cu`). Test: `tests/gpu_kernels/elementwise.rs`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::Result;
use crate::gpu::{check_len, Gpu};
use crate::sources::KernelSource;

/// `kernels/elementwise.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "elementwise",
    text: include_str!("../../elementwise.cu"),
    entry_points: &["cast_f32_bf16", "cast_bf16_f32", "add_bf16", "accum_bf16_f32", "sumsq_f32", "lora_dropout"],
};

/// Which dropout mask LoRA applies to a batch of rows: row r belongs to a sequence of mask seed
/// `seeds[r]` and is row `local_row[r]` of it; `key_hi` is `dropout_key(layer, target, 0)` and
/// `p` the dropout probability.
#[derive(Clone, Copy)]
pub struct DropoutMask<'a> {
    pub seeds: &'a CudaSlice<u64>,
    pub local_row: &'a CudaSlice<i32>,
    pub key_hi: u64,
    pub p: f64,
}

impl Gpu {
    fn unary<A, B>(&self, name: &'static str, x: &impl DevicePtr<A>, y: &mut impl DevicePtrMut<B>, n: usize) -> Result<()> {
        check_len(name, x.len(), n)?;
        check_len(name, y.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let (xp, _g1) = x.device_ptr(&self.stream);
        let (yp, _g2) = y.device_ptr_mut(&self.stream);
        let ni = n as i64;
        let f = self.func(&SOURCE, name)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&yp).arg(&ni);
        // SAFETY: lengths checked.
        unsafe { b.launch(Self::cfg1(self.grid_for(n, 256), 256, 0)) }?;
        Ok(())
    }

    /// `y = bf16(x)`.
    pub fn cast_f32_bf16(&self, x: &impl DevicePtr<f32>, y: &mut impl DevicePtrMut<bf16>, n: usize) -> Result<()> {
        self.unary("cast_f32_bf16", x, y, n)
    }
    /// `y = f32(x)`.
    pub fn cast_bf16_f32(&self, x: &impl DevicePtr<bf16>, y: &mut impl DevicePtrMut<f32>, n: usize) -> Result<()> {
        self.unary("cast_bf16_f32", x, y, n)
    }
    /// `acc += f32(x)`.
    pub fn accum_bf16_f32(&self, x: &impl DevicePtr<bf16>, acc: &mut impl DevicePtrMut<f32>, n: usize) -> Result<()> {
        self.unary("accum_bf16_f32", x, acc, n)
    }

    /// `y = a + b` (bf16; `y` distinct from the inputs under Rust's borrow rules — for an in-place
    /// residual add pass the residual as `y` and use [`Gpu::add_bf16_inplace`]).
    pub fn add_bf16(&self, a: &impl DevicePtr<bf16>, b: &impl DevicePtr<bf16>, y: &mut impl DevicePtrMut<bf16>, n: usize) -> Result<()> {
        check_len("add a", a.len(), n)?;
        check_len("add b", b.len(), n)?;
        check_len("add y", y.len(), n)?;
        let (ap, _g1) = a.device_ptr(&self.stream);
        let (bp, _g2) = b.device_ptr(&self.stream);
        let (yp, _g3) = y.device_ptr_mut(&self.stream);
        self.launch_add(ap, bp, yp, n)
    }
    /// `y += b` (residual stream).
    pub fn add_bf16_inplace(&self, y: &mut impl DevicePtrMut<bf16>, b: &impl DevicePtr<bf16>, n: usize) -> Result<()> {
        check_len("add b", b.len(), n)?;
        check_len("add y", y.len(), n)?;
        let (bp, _g2) = b.device_ptr(&self.stream);
        let (yp, _g3) = y.device_ptr_mut(&self.stream);
        self.launch_add(yp, bp, yp, n)
    }
    fn launch_add(&self, ap: u64, bp: u64, yp: u64, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let ni = n as i64;
        let f = self.func(&SOURCE, "add_bf16")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&ap).arg(&bp).arg(&yp).arg(&ni);
        // SAFETY: lengths checked by the callers.
        unsafe { b.launch(Self::cfg1(self.grid_for(n, 256), 256, 0)) }?;
        Ok(())
    }

    /// LoRA's inverted dropout on `x` `[rows, cols]` (`coa_model::lora::dropout_factor` per
    /// element, as `mask` draws it): `y = x · f`, or `y += x · f` with `accumulate`.
    pub fn lora_dropout(
        &self,
        x: &impl DevicePtr<bf16>,
        y: &mut impl DevicePtrMut<bf16>,
        (rows, cols): (usize, usize),
        mask: &DropoutMask,
        accumulate: bool,
    ) -> Result<()> {
        let DropoutMask { seeds, local_row, key_hi, p } = *mask;
        let n = rows * cols;
        check_len("lora_dropout x", x.len(), n)?;
        check_len("lora_dropout y", y.len(), n)?;
        check_len("lora_dropout seeds", seeds.len(), rows)?;
        check_len("lora_dropout local_row", local_row.len(), rows)?;
        if n == 0 {
            return Ok(());
        }
        let (xp, _g1) = x.device_ptr(&self.stream);
        let (yp, _g2) = y.device_ptr_mut(&self.stream);
        let (sp, _g3) = seeds.device_ptr(&self.stream);
        let (rp, _g4) = local_row.device_ptr(&self.stream);
        let (ni, ci, acc) = (n as i64, crate::gpu::i32_of("lora_dropout cols", cols)?, accumulate as i32);
        let keep = coa_model::lora::dropout_keep_scale(p);
        let f = self.func(&SOURCE, "lora_dropout")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&yp).arg(&sp).arg(&rp).arg(&ni).arg(&ci).arg(&key_hi).arg(&p).arg(&keep).arg(&acc);
        // SAFETY: lengths checked.
        unsafe { b.launch(Self::cfg1(self.grid_for(n, 256), 256, 0)) }?;
        Ok(())
    }

    /// Σ x² over `n` f32 elements (f32 per block, f64 across blocks; synchronises): the squared
    /// global gradient norm for clipping.
    pub fn sumsq(&self, x: &impl DevicePtr<f32>, n: usize) -> Result<f64> {
        check_len("sumsq", x.len(), n)?;
        if n == 0 {
            return Ok(0.0);
        }
        let grid = self.grid_for(n, 256);
        let mut part: CudaSlice<f32> = self.zeros(grid as usize)?;
        let (xp, _g1) = x.device_ptr(&self.stream);
        let (pp, _g2) = part.device_ptr_mut(&self.stream);
        let ni = n as i64;
        let f = self.func(&SOURCE, "sumsq_f32")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&pp).arg(&ni);
        // SAFETY: lengths checked; part has grid elements.
        unsafe { b.launch(Self::cfg1(grid, 256, 0)) }?;
        drop((_g1, _g2));
        Ok(self.download(&part)?.iter().map(|&v| v as f64).sum())
    }
}
