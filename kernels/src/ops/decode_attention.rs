//! Decoding attention over a slot KV cache (`kernels/decode_attention.cu`): appending new rows'
//! keys and values to the cache, and those rows' causal attention over their slot. CPU reference:
//! `coa_model::ops::attention_forward` (row p of a whole sequence = the decode output at
//! position p). Test: `tests/gpu_kernels/decode_attention.rs`.
//!
//! The cache of one layer is `[S, L, Hkv, D]` bf16 (S slots of L positions); row r of a call
//! belongs to slot `slot[r]` at absolute position `pos[r]`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::error::{Error, Result};
use crate::gpu::{check_len, i32_of, Gpu};
use crate::sources::KernelSource;

/// `kernels/decode_attention.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "decode_attention",
    text: include_str!("../../decode_attention.cu"),
    entry_points: &["kv_append", "attn_extend"],
};

/// Shape of one decode-attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    /// New rows in the call.
    pub rows: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Slots of the cache.
    pub slots: usize,
    /// Positions per slot.
    pub max_len: usize,
}

impl CacheShape {
    /// Elements of one layer's key (or value) cache.
    pub fn layer_len(&self) -> usize {
        self.slots * self.max_len * self.kv_heads * self.head_dim
    }

    fn check(&self) -> Result<()> {
        if self.kv_heads == 0 || self.q_heads % self.kv_heads != 0 {
            return Err(Error(format!("decode attention: {} query heads are not a multiple of {} kv heads", self.q_heads, self.kv_heads)));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 || self.head_dim > 256 {
            return Err(Error(format!("decode attention: head_dim {} must be even and at most 256", self.head_dim)));
        }
        Ok(())
    }
}

/// One layer's key and value caches and, for each new row, the slot and position it reads up to:
/// what [`Gpu::attn_extend`] attends over.
#[derive(Clone, Copy)]
pub struct KvCacheRows<'a> {
    pub k_cache: &'a CudaSlice<bf16>,
    pub v_cache: &'a CudaSlice<bf16>,
    pub slot: &'a CudaSlice<i32>,
    pub pos: &'a CudaSlice<i32>,
}

impl Gpu {
    /// Writes `k_new`/`v_new [R, Hkv*D]` (row stride `kv_stride`) into the caches at
    /// (`slot[r]`, `pos[r]`). The caller guarantees `pos[r] < max_len` and `slot[r] < slots`
    /// (the host decoder checks them before uploading).
    #[allow(clippy::too_many_arguments)]
    pub fn kv_append(
        &self,
        s: &CacheShape,
        k_new: &impl DevicePtr<bf16>,
        v_new: &impl DevicePtr<bf16>,
        kv_stride: usize,
        k_cache: &mut impl DevicePtrMut<bf16>,
        v_cache: &mut impl DevicePtrMut<bf16>,
        slot: &impl DevicePtr<i32>,
        pos: &impl DevicePtr<i32>,
    ) -> Result<()> {
        s.check()?;
        let kvd = s.kv_heads * s.head_dim;
        if kv_stride < kvd {
            return Err(Error(format!("kv_append: row stride {kv_stride} is shorter than a row ({kvd})")));
        }
        if s.rows == 0 {
            return Ok(());
        }
        let need = (s.rows - 1) * kv_stride + kvd;
        check_len("kv_append k_new", k_new.len(), need)?;
        check_len("kv_append v_new", v_new.len(), need)?;
        check_len("kv_append k_cache", k_cache.len(), s.layer_len())?;
        check_len("kv_append v_cache", v_cache.len(), s.layer_len())?;
        check_len("kv_append slot", slot.len(), s.rows)?;
        check_len("kv_append pos", pos.len(), s.rows)?;
        let (kp, _g1) = k_new.device_ptr(&self.stream);
        let (vp, _g2) = v_new.device_ptr(&self.stream);
        let (kc, _g3) = k_cache.device_ptr_mut(&self.stream);
        let (vc, _g4) = v_cache.device_ptr_mut(&self.stream);
        let (sp, _g5) = slot.device_ptr(&self.stream);
        let (pp, _g6) = pos.device_ptr(&self.stream);
        let (r, hkvd, l) = (i32_of("rows", s.rows)?, i32_of("kv row", kvd)?, i32_of("max_len", s.max_len)?);
        let st = kv_stride as i64;
        let f = self.func(&SOURCE, "kv_append")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&kp).arg(&vp).arg(&st).arg(&kc).arg(&vc).arg(&sp).arg(&pp).arg(&r).arg(&hkvd).arg(&l);
        // SAFETY: buffer extents checked; slot/pos ranges are the caller's contract (see above).
        unsafe { b.launch(Self::cfg1(self.grid_for(s.rows * kvd, 256), 256, 0)) }?;
        Ok(())
    }

    /// `o [R, Hq, D]` = causal attention of `q [R, Hq, D]` (row stride `q_stride`) over positions
    /// `0..=pos[r]` of slot `slot[r]` (with a sliding `window` > 0, only the last `window` of
    /// them: `pos[r] − window < j`), softmax scale `1/sqrt(D)`.
    pub fn attn_extend(
        &self,
        s: &CacheShape,
        q: &impl DevicePtr<bf16>,
        q_stride: usize,
        cache: KvCacheRows,
        o: &mut impl DevicePtrMut<bf16>,
        window: usize,
    ) -> Result<()> {
        let KvCacheRows { k_cache, v_cache, slot, pos } = cache;
        s.check()?;
        let qd = s.q_heads * s.head_dim;
        if q_stride < qd {
            return Err(Error(format!("attn_extend: q row stride {q_stride} is shorter than a row ({qd})")));
        }
        if s.rows == 0 {
            return Ok(());
        }
        check_len("attn_extend q", q.len(), (s.rows - 1) * q_stride + qd)?;
        check_len("attn_extend k_cache", k_cache.len(), s.layer_len())?;
        check_len("attn_extend v_cache", v_cache.len(), s.layer_len())?;
        check_len("attn_extend slot", slot.len(), s.rows)?;
        check_len("attn_extend pos", pos.len(), s.rows)?;
        check_len("attn_extend o", o.len(), s.rows * qd)?;
        let (qp, _g1) = q.device_ptr(&self.stream);
        let (kc, _g2) = k_cache.device_ptr(&self.stream);
        let (vc, _g3) = v_cache.device_ptr(&self.stream);
        let (sp, _g4) = slot.device_ptr(&self.stream);
        let (pp, _g5) = pos.device_ptr(&self.stream);
        let (op, _g6) = o.device_ptr_mut(&self.stream);
        let (r, hq, hkv) = (i32_of("rows", s.rows)?, i32_of("q heads", s.q_heads)?, i32_of("kv heads", s.kv_heads)?);
        let (d, l) = (i32_of("head_dim", s.head_dim)?, i32_of("max_len", s.max_len)?);
        let st = q_stride as i64;
        let scale = 1.0f32 / (s.head_dim as f32).sqrt();
        let window = i32_of("window", window)?;
        const WARPS: usize = 4; // DEC_WARPS in decode_attention.cu
        let blocks = u32::try_from((s.rows * s.q_heads).div_ceil(WARPS))
            .map_err(|_| Error(format!("attn_extend: {} rows x {} heads is too many blocks", s.rows, s.q_heads)))?;
        let f = self.func(&SOURCE, "attn_extend")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&qp).arg(&st).arg(&kc).arg(&vc).arg(&sp).arg(&pp).arg(&op).arg(&r).arg(&hq).arg(&hkv).arg(&d).arg(&l).arg(&scale).arg(&window);
        // SAFETY: extents checked; every row's keys 0..=pos[r] lie inside its slot (pos < max_len).
        unsafe { b.launch(Self::cfg1(blocks, (32 * WARPS) as u32, 0)) }?;
        Ok(())
    }
}
