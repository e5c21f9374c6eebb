//! Causal flash attention, forward and backward (`kernels/attention.cu`): shapes, strides, the
//! kernels' argument struct [`AttnParams`] and the launchers. CPU reference:
//! `coa_model::ops::attention_forward` / `attention_backward`. Test: `tests/gpu_kernels/attention.rs`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use half::bf16;

use crate::error::{Error, Result};
use crate::gpu::{check_len, i32_of, Gpu};
use crate::sources::KernelSource;

/// `kernels/attention.cu` and the kernels it must export.
pub const SOURCE: KernelSource = KernelSource {
    name: "attention",
    text: include_str!("../../attention.cu"),
    entry_points: &["flash_attn_fwd_d64", "flash_attn_fwd_d128", "flash_attn_bwd_pre", "flash_attn_bwd_d64", "flash_attn_bwd_d128", "flash_attn_dq_convert"],
};

/// Shape of one attention call: q [B, T, Hq, hd], k/v [B, T, Hkv, hd].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: usize,
    pub seq: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Sliding window (0: none): query i sees key j only while i − j < window.
    pub window: usize,
}

/// Element strides of one [B, T, H, hd] tensor (hd contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strides {
    pub b: i64,
    pub t: i64,
    pub h: i64,
}

impl Strides {
    pub fn contiguous(seq: usize, heads: usize, head_dim: usize) -> Self {
        Strides { b: (seq * heads * head_dim) as i64, t: (heads * head_dim) as i64, h: head_dim as i64 }
    }
    /// One past the largest element offset a [B, T, H, hd] view with these strides reads.
    fn extent(&self, b: usize, t: usize, h: usize, hd: usize) -> usize {
        if b == 0 || t == 0 || h == 0 {
            return 0;
        }
        (self.b * (b as i64 - 1) + self.t * (t as i64 - 1) + self.h * (h as i64 - 1)) as usize + hd
    }
}

/// Where q, k, v and o (= dout, and the gradients dq/dk/dv use their input's strides) live.
/// `contiguous` is the CPU reference's layout: q/o [T, Hq*hd], k/v [T, Hkv*hd] per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnLayout {
    pub q: Strides,
    pub k: Strides,
    pub v: Strides,
    pub o: Strides,
}

impl AttnLayout {
    pub fn contiguous(s: &AttnShape) -> Self {
        let q = Strides::contiguous(s.seq, s.q_heads, s.head_dim);
        let k = Strides::contiguous(s.seq, s.kv_heads, s.head_dim);
        AttnLayout { q, k, v: k, o: q }
    }
}

/// The q, k and v an attention call reads, each with its layout's strides (the CPU reference's
/// `coa_model::Qkv`, on the device).
pub struct Qkv<'a, P: DevicePtr<bf16>> {
    pub q: &'a P,
    pub k: &'a P,
    pub v: &'a P,
}

/// The gradients an attention backward WRITES, with q's, k's and v's strides (the CPU
/// reference's `coa_model::QkvGrads`, on the device).
pub struct QkvGrads<'a, P: DevicePtrMut<bf16>> {
    pub dq: &'a mut P,
    pub dk: &'a mut P,
    pub dv: &'a mut P,
}

/// The kernels' `AttnParams` (attention.cu), mirrored field for field: same names, order and
/// types. The test below holds it against the struct as the C++ compiler lays it out for the
/// emulated device (the same layout rules as the GPU's for these types).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_snake_case)]
struct AttnParams {
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    lse: u64,
    seg: u64,
    dout: u64,
    dq_acc: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    delta: u64,
    q_sb: i64,
    q_st: i64,
    q_sh: i64,
    k_sb: i64,
    k_st: i64,
    k_sh: i64,
    v_sb: i64,
    v_st: i64,
    v_sh: i64,
    o_sb: i64,
    o_st: i64,
    o_sh: i64,
    B: i32,
    T: i32,
    Hq: i32,
    Hkv: i32,
    scale: f32,
    window: i32,
}
// SAFETY: plain-old-data, #[repr(C)], mirrored field for field by the CUDA struct.
unsafe impl DeviceRepr for AttnParams {}

/// Dynamic shared memory of the attention kernels (bytes), mirroring the carve-up in attention.cu.
pub fn attn_fwd_smem(head_dim: usize) -> u32 {
    let ld = head_dim + 8;
    (5 * 64 * ld * 2) as u32
}
/// See [`attn_fwd_smem`]. Backward query block: 64 rows for hd 64, 32 for hd 128.
pub fn attn_bwd_smem(head_dim: usize) -> u32 {
    let (bm, bn) = if head_dim == 64 { (64, 64) } else { (32, 64) };
    let ld = head_dim + 8;
    let lds = bm + 8;
    ((2 * bn * ld + 4 * bm * ld + bn * lds) * 2 + 6 * bm * 4) as u32
}

impl Gpu {
    fn attn_params(&self, s: &AttnShape, l: &AttnLayout) -> Result<AttnParams> {
        if s.head_dim != 64 && s.head_dim != 128 {
            return Err(Error(format!("flash attention supports head_dim 64 and 128, got {}", s.head_dim)));
        }
        if s.kv_heads == 0 || s.q_heads % s.kv_heads != 0 {
            return Err(Error(format!("q_heads {} is not a multiple of kv_heads {}", s.q_heads, s.kv_heads)));
        }
        for (name, st) in [("q", l.q), ("k", l.k), ("v", l.v), ("o", l.o)] {
            if st.b % 8 != 0 || st.t % 8 != 0 || st.h % 8 != 0 {
                return Err(Error(format!("attention {name} strides {st:?} must be multiples of 8 elements (16-byte loads)")));
            }
        }
        Ok(AttnParams {
            q_sb: l.q.b,
            q_st: l.q.t,
            q_sh: l.q.h,
            k_sb: l.k.b,
            k_st: l.k.t,
            k_sh: l.k.h,
            v_sb: l.v.b,
            v_st: l.v.t,
            v_sh: l.v.h,
            o_sb: l.o.b,
            o_st: l.o.t,
            o_sh: l.o.h,
            B: i32_of("batch", s.batch)?,
            T: i32_of("seq", s.seq)?,
            Hq: i32_of("q_heads", s.q_heads)?,
            Hkv: i32_of("kv_heads", s.kv_heads)?,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            window: i32_of("window", s.window)?,
            ..Default::default()
        })
    }

    fn attn_check_inputs(
        s: &AttnShape,
        l: &AttnLayout,
        q: usize,
        k: usize,
        v: usize,
        seg: Option<usize>,
    ) -> Result<()> {
        check_len("attention q", q, l.q.extent(s.batch, s.seq, s.q_heads, s.head_dim))?;
        check_len("attention k", k, l.k.extent(s.batch, s.seq, s.kv_heads, s.head_dim))?;
        check_len("attention v", v, l.v.extent(s.batch, s.seq, s.kv_heads, s.head_dim))?;
        if let Some(n) = seg {
            check_len("attention seg_start", n, s.batch * s.seq)?;
        }
        Ok(())
    }

    /// Causal flash attention forward: `o` and `lse` [B, T, Hq] written. `seg_start` [B, T]: the
    /// first token of each token's packed segment (`coa_model::ops::segment_layout`), or None.
    pub fn attention_fwd<P: DevicePtr<bf16>>(
        &self,
        s: &AttnShape,
        l: &AttnLayout,
        x: Qkv<P>,
        seg_start: Option<&CudaSlice<i32>>,
        o: &mut impl DevicePtrMut<bf16>,
        lse: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let Qkv { q, k, v } = x;
        let mut p = self.attn_params(s, l)?;
        Self::attn_check_inputs(s, l, q.len(), k.len(), v.len(), seg_start.map(|x| x.len()))?;
        check_len("attention o", o.len(), l.o.extent(s.batch, s.seq, s.q_heads, s.head_dim))?;
        check_len("attention lse", lse.len(), s.batch * s.seq * s.q_heads)?;
        if s.batch * s.seq == 0 {
            return Ok(());
        }
        let (qp, _g1) = q.device_ptr(&self.stream);
        let (kp, _g2) = k.device_ptr(&self.stream);
        let (vp, _g3) = v.device_ptr(&self.stream);
        let seg = seg_start.map(|x| x.device_ptr(&self.stream));
        let (op, _g4) = o.device_ptr_mut(&self.stream);
        let (lp, _g5) = lse.device_ptr_mut(&self.stream);
        p.q = qp;
        p.k = kp;
        p.v = vp;
        p.seg = seg.as_ref().map(|x| x.0).unwrap_or(0);
        p.o = op;
        p.lse = lp;
        let name = if s.head_dim == 64 { "flash_attn_fwd_d64" } else { "flash_attn_fwd_d128" };
        let f = self.func(&SOURCE, name)?;
        let cfg = LaunchConfig {
            grid_dim: (s.seq.div_ceil(64) as u32, s.q_heads as u32, s.batch as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: attn_fwd_smem(s.head_dim),
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&p);
        // SAFETY: every pointer's extent was checked against the shape and strides.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Causal flash attention backward: dq, dk, dv WRITTEN (with q's, k's, v's strides; dk/dv
    /// summed over the query heads of each kv group), from the forward's o and lse and `dout`
    /// (o's strides). Allocates an f32 dq accumulator and the delta buffer for the call.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_bwd<P: DevicePtr<bf16>, G: DevicePtrMut<bf16>>(
        &self,
        s: &AttnShape,
        l: &AttnLayout,
        x: Qkv<P>,
        o: &impl DevicePtr<bf16>,
        lse: &impl DevicePtr<f32>,
        seg_start: Option<&CudaSlice<i32>>,
        dout: &impl DevicePtr<bf16>,
        grads: QkvGrads<G>,
    ) -> Result<()> {
        let (Qkv { q, k, v }, QkvGrads { dq, dk, dv }) = (x, grads);
        let mut p = self.attn_params(s, l)?;
        Self::attn_check_inputs(s, l, q.len(), k.len(), v.len(), seg_start.map(|x| x.len()))?;
        let oe = l.o.extent(s.batch, s.seq, s.q_heads, s.head_dim);
        check_len("attention o", o.len(), oe)?;
        check_len("attention dout", dout.len(), oe)?;
        check_len("attention lse", lse.len(), s.batch * s.seq * s.q_heads)?;
        check_len("attention dq", dq.len(), l.q.extent(s.batch, s.seq, s.q_heads, s.head_dim))?;
        check_len("attention dk", dk.len(), l.k.extent(s.batch, s.seq, s.kv_heads, s.head_dim))?;
        check_len("attention dv", dv.len(), l.v.extent(s.batch, s.seq, s.kv_heads, s.head_dim))?;
        let (qp, _g1) = q.device_ptr(&self.stream);
        let (kp, _g2) = k.device_ptr(&self.stream);
        let (vp, _g3) = v.device_ptr(&self.stream);
        let (op, _g4) = o.device_ptr(&self.stream);
        let (lp, _g5) = lse.device_ptr(&self.stream);
        let seg = seg_start.map(|x| x.device_ptr(&self.stream));
        let (dop, _g6) = dout.device_ptr(&self.stream);
        let (dqp, _g7) = dq.device_ptr_mut(&self.stream);
        let (dkp, _g8) = dk.device_ptr_mut(&self.stream);
        let (dvp, _g9) = dv.device_ptr_mut(&self.stream);
        p.q = qp;
        p.k = kp;
        p.v = vp;
        p.o = op;
        p.lse = lp;
        p.seg = seg.as_ref().map(|x| x.0).unwrap_or(0);
        p.dout = dop;
        p.dq = dqp;
        p.dk = dkp;
        p.dv = dvp;
        self.launch_attn_bwd(s, p)
    }

    /// [`Gpu::attention_bwd`] for q, k, v packed in one buffer, as a fused QKV projection writes
    /// them: `qkv [B, T, (Hq + 2 Hkv) * hd]` holds q | k | v per token, and `dqkv` (same layout)
    /// receives dq | dk | dv (WRITTEN). `l` gives the q/k/v strides within `qkv` (k starts at
    /// element Hq*hd, v at (Hq + Hkv)*hd) and o's.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_bwd_qkv(
        &self,
        s: &AttnShape,
        l: &AttnLayout,
        qkv: &impl DevicePtr<bf16>,
        o: &impl DevicePtr<bf16>,
        lse: &impl DevicePtr<f32>,
        seg_start: Option<&CudaSlice<i32>>,
        dout: &impl DevicePtr<bf16>,
        dqkv: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        let mut p = self.attn_params(s, l)?;
        let (k_off, v_off) = (s.q_heads * s.head_dim, (s.q_heads + s.kv_heads) * s.head_dim);
        let extent = |len: usize| -> Result<()> {
            check_len("attention qkv (q)", len, l.q.extent(s.batch, s.seq, s.q_heads, s.head_dim))?;
            check_len("attention qkv (k)", len, k_off + l.k.extent(s.batch, s.seq, s.kv_heads, s.head_dim))?;
            check_len("attention qkv (v)", len, v_off + l.v.extent(s.batch, s.seq, s.kv_heads, s.head_dim))
        };
        extent(qkv.len())?;
        extent(dqkv.len())?;
        if let Some(x) = seg_start {
            check_len("attention seg_start", x.len(), s.batch * s.seq)?;
        }
        let oe = l.o.extent(s.batch, s.seq, s.q_heads, s.head_dim);
        check_len("attention o", o.len(), oe)?;
        check_len("attention dout", dout.len(), oe)?;
        check_len("attention lse", lse.len(), s.batch * s.seq * s.q_heads)?;
        let bytes = |elems: usize| (elems * std::mem::size_of::<bf16>()) as u64;
        let (qp, _g1) = qkv.device_ptr(&self.stream);
        let (op, _g4) = o.device_ptr(&self.stream);
        let (lp, _g5) = lse.device_ptr(&self.stream);
        let seg = seg_start.map(|x| x.device_ptr(&self.stream));
        let (dop, _g6) = dout.device_ptr(&self.stream);
        let (dqp, _g7) = dqkv.device_ptr_mut(&self.stream);
        p.q = qp;
        p.k = qp + bytes(k_off);
        p.v = qp + bytes(v_off);
        p.o = op;
        p.lse = lp;
        p.seg = seg.as_ref().map(|x| x.0).unwrap_or(0);
        p.dout = dop;
        p.dq = dqp;
        p.dk = dqp + bytes(k_off);
        p.dv = dqp + bytes(v_off);
        self.launch_attn_bwd(s, p)
    }

    /// The three backward kernels on pointers the callers checked: delta, dK/dV (and dQ in f32),
    /// dQ conversion. Allocates the f32 dQ accumulator and delta for the call.
    fn launch_attn_bwd(&self, s: &AttnShape, mut p: AttnParams) -> Result<()> {
        let rows = s.batch * s.seq * s.q_heads;
        if rows == 0 {
            return Ok(());
        }
        let mut dq_acc: CudaSlice<f32> = self.zeros(rows * s.head_dim)?;
        // SAFETY: delta is fully written by flash_attn_bwd_pre before it is read.
        let mut delta: CudaSlice<f32> = unsafe { self.stream.alloc(rows) }?;
        let (accp, _g10) = dq_acc.device_ptr_mut(&self.stream);
        let (delp, _g11) = delta.device_ptr_mut(&self.stream);
        p.dq_acc = accp;
        p.delta = delp;
        let d = s.head_dim as i32;

        let f = self.func(&SOURCE, "flash_attn_bwd_pre")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&p).arg(&d);
        // SAFETY: o/dout extents checked by the callers; delta has `rows` elements.
        unsafe { b.launch(Self::cfg1(rows.div_ceil(4) as u32, 128, 0)) }?;

        let name = if s.head_dim == 64 { "flash_attn_bwd_d64" } else { "flash_attn_bwd_d128" };
        let f = self.func(&SOURCE, name)?;
        let cfg = LaunchConfig {
            grid_dim: (s.seq.div_ceil(64) as u32, s.kv_heads as u32, s.batch as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: attn_bwd_smem(s.head_dim),
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&p);
        // SAFETY: all extents checked by the callers.
        unsafe { b.launch(cfg) }?;

        let f = self.func(&SOURCE, "flash_attn_dq_convert")?;
        let n = rows * s.head_dim;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&p).arg(&d);
        // SAFETY: dq extent checked; dq_acc has rows * hd elements.
        unsafe { b.launch(Self::cfg1(self.grid_for(n, 256), 256, 0)) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, offset, size) of each field of the Rust mirror, in declaration order.
    macro_rules! layout {
        ($t:ty; $($f:ident),* $(,)?) => {{
            let v: $t = Default::default();
            vec![$((stringify!($f).to_string(), std::mem::offset_of!($t, $f), std::mem::size_of_val(&v.$f))),*]
        }};
    }

    #[test]
    fn attn_params_matches_the_kernels_struct() {
        let rust = layout!(AttnParams; q, k, v, o, lse, seg, dout, dq_acc, dq, dk, dv, delta,
            q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, o_sb, o_st, o_sh, B, T, Hq, Hkv, scale, window);
        let cuda = crate::emu::struct_layout("AttnParams").expect("the emulated device");
        assert_eq!(cuda.fields, rust, "AttnParams: the kernels' struct (attention.cu, left) and its Rust mirror (right) differ");
        assert_eq!(cuda.size, std::mem::size_of::<AttnParams>(), "AttnParams: size");
    }
}
