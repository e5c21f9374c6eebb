//! [`Gpu`]: one CUDA context with its stream, cuBLAS handle and compiled-module cache, and a
//! launcher for every kernel of `kernels/*.cu`.
//!
//! Everything is asynchronous on `gpu.stream` unless a function says it synchronises (downloads,
//! [`Gpu::sumsq`], [`Gpu::masked_cross_entropy`]). Tensors are row-major; shapes are written as in
//! `coa_model::ops`. Launchers accept any cudarc device buffer (`CudaSlice`, `CudaView`,
//! `CudaViewMut`), check lengths against the shapes they are given and return an [`Error`] rather
//! than launch out of bounds.

use crate::compile::Compiler;
use crate::device::{probe_ordinal, GpuInfo};
use crate::error::{Error, Result};
use crate::sources::{self, KernelSource};
use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use half::bf16;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The GPU: context, stream, cuBLAS, NVRTC and the modules compiled so far. On the emulated device
/// (`info.emulated`) the same, without NVRTC: its modules are compiled into it (see [`crate::emu`]).
pub struct Gpu {
    pub info: GpuInfo,
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    /// NVRTC; `None` on the emulated device.
    pub compiler: Option<Compiler>,
    arch: String,
    max_smem_optin: i32,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    funcs: Mutex<HashMap<&'static str, CudaFunction>>,
}

/// Shape of one attention call: q [B, T, Hq, hd], k/v [B, T, Hkv, hd].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: usize,
    pub seq: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
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

/// The kernels' `AttnParams` (attention.cu); field order and types must stay identical.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
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
    b: i32,
    t: i32,
    hq: i32,
    hkv: i32,
    scale: f32,
    pad: i32,
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

/// Token positions grouped by token id, on the device, for the deterministic embedding backward.
pub struct EmbeddingGradPlan {
    pub order: CudaSlice<i32>,
    pub start: CudaSlice<i32>,
    pub uniq: CudaSlice<i32>,
    pub n_tokens: usize,
    pub n_unique: usize,
}

/// Output element types of [`Gpu::gemm`]: bf16 activations or f32 gradient accumulators.
pub trait GemmOut: DeviceRepr {
    const DTYPE: blas_sys::cudaDataType;
}
impl GemmOut for bf16 {
    const DTYPE: blas_sys::cudaDataType = blas_sys::cudaDataType::CUDA_R_16BF;
}
impl GemmOut for f32 {
    const DTYPE: blas_sys::cudaDataType = blas_sys::cudaDataType::CUDA_R_32F;
}

pub(crate) fn check_len(what: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(Error(format!("{what}: buffer has {have} elements, the shape needs {need}")));
    }
    Ok(())
}

pub(crate) fn i32_of(what: &str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error(format!("{what} = {n} does not fit the kernel's int")))
}

impl Gpu {
    /// Opens GPU `ordinal`: probes (never panics), creates the context, a stream and cuBLAS.
    pub fn new(ordinal: usize) -> Result<Self> {
        let info = probe_ordinal(ordinal).map_err(|e| Error(e.0))?;
        let compiler = Compiler::new()?;
        Self::with_context(info, Some(compiler))
    }

    /// Opens the emulated CUDA device ([`crate::emu`]): the same host code on the CPU.
    pub fn emulated() -> Result<Self> {
        Self::with_context(crate::emu::info()?, None)
    }

    /// Opens the device `info` describes (as [`crate::select_device`] found it): a GPU or the
    /// emulated device.
    pub fn open(info: &GpuInfo) -> Result<Self> {
        match info.emulated {
            Some(_) => Self::emulated(),
            None => Self::new(info.ordinal),
        }
    }

    /// Whether this is the emulated device.
    pub fn is_emulated(&self) -> bool {
        self.info.emulated.is_some()
    }

    fn with_context(info: GpuInfo, compiler: Option<Compiler>) -> Result<Self> {
        let ordinal = info.ordinal;
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.new_stream()?;
        let blas = CudaBlas::new(stream.clone())?;
        let max_smem_optin =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let arch = if compiler.is_some() { info.arch() } else { "emu".to_string() };
        Ok(Gpu {
            info,
            ctx,
            stream,
            blas,
            compiler,
            arch,
            max_smem_optin,
            modules: Mutex::new(HashMap::new()),
            funcs: Mutex::new(HashMap::new()),
        })
    }

    /// Compiles (or loads from the PTX cache) and loads every kernel module now, so that the first
    /// training step or timed region does not pay for it.
    pub fn warm_up(&self) -> Result<()> {
        for s in sources::ALL {
            for e in s.entry_points {
                self.func(s, e)?;
            }
        }
        Ok(())
    }

    fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>> {
        let mut mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = mods.get(src.name) {
            return Ok(m.clone());
        }
        let Some(compiler) = &self.compiler else {
            // The emulated device: the module is compiled into it, named by its file stem.
            let m = self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(format!("coa-emu:{}", src.name)))?;
            mods.insert(src.name, m.clone());
            return Ok(m);
        };
        let ptx = compiler.compile(src, &self.arch)?;
        let m = self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx.ptx)).map_err(|e| {
            let mut err = Error::from(e);
            err.0.push_str(&format!(
                " (loading kernels/{}.cu PTX from NVRTC {}.{} for {}; a driver older than the NVRTC rejects its PTX: pin nvidia-cuda-nvrtc to the driver's CUDA version)",
                src.name, compiler.nvrtc_version.0, compiler.nvrtc_version.1, self.arch
            ));
            err
        })?;
        mods.insert(src.name, m.clone());
        Ok(m)
    }

    /// The kernel `name` of `src`, loaded, with its dynamic shared-memory limit raised to the
    /// device's opt-in maximum.
    pub fn func(&self, src: &KernelSource, name: &'static str) -> Result<CudaFunction> {
        if let Some(f) = self.funcs.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Ok(f.clone());
        }
        let m = self.module(src)?;
        let f = m.load_function(name)?;
        let static_smem = f.get_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
        f.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            self.max_smem_optin - static_smem,
        )?;
        self.funcs.lock().unwrap_or_else(|e| e.into_inner()).insert(name, f.clone());
        Ok(f)
    }

    /// Blocks of `threads` for a grid-stride loop over `n` elements: enough to fill the GPU,
    /// capped by the work.
    pub(crate) fn grid_for(&self, n: usize, threads: u32) -> u32 {
        let blocks = n.div_ceil(threads as usize).max(1);
        blocks.min(self.info.multiprocessors as usize * 32) as u32
    }

    pub(crate) fn cfg1(grid: u32, block: u32, smem: u32) -> LaunchConfig {
        LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: smem }
    }

    // ---- memory ---------------------------------------------------------------------------------

    pub fn upload<T: DeviceRepr + Clone>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        Ok(self.stream.clone_htod(host)?)
    }
    pub fn upload_bf16(&self, host: &[f32]) -> Result<CudaSlice<bf16>> {
        let v: Vec<bf16> = host.iter().map(|&x| bf16::from_f32(x)).collect();
        self.upload(&v)
    }
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        Ok(self.stream.alloc_zeros(n)?)
    }
    /// Synchronises.
    pub fn download<T: DeviceRepr + Clone + Default>(&self, dev: &impl DevicePtr<T>) -> Result<Vec<T>> {
        let mut out = vec![T::default(); dev.len()];
        self.stream.memcpy_dtoh(dev, &mut out)?;
        self.stream.synchronize()?;
        Ok(out)
    }
    /// Synchronises.
    pub fn download_bf16(&self, dev: &impl DevicePtr<bf16>) -> Result<Vec<f32>> {
        Ok(self.download(dev)?.into_iter().map(|x| x.to_f32()).collect())
    }
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// Milliseconds of each of `iters` calls of `f`, timed with device events on the stream
    /// (after one untimed warm-up call).
    pub fn time_ms(&self, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f32>> {
        f()?;
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            let a = self.stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            f()?;
            let b = self.stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            b.synchronize()?;
            out.push(a.elapsed_ms(&b)?);
        }
        Ok(out)
    }

    // ---- matmul (cuBLAS) ------------------------------------------------------------------------

    /// `c[m,n] = alpha * a' @ b' + beta * c` in row-major terms, the convention of
    /// `coa_model::ops::gemm`: a' = a (stored [m,k]) or aᵀ (a stored [k,m], `a_t`); b' = b (stored
    /// [k,n]) or bᵀ (b stored [n,k], `b_t`). a, b bf16; c bf16 or f32; fp32 accumulation.
    /// Linear forward `y = x @ wᵀ` is `gemm(T, O, I, x, false, w, true, y, 1, 0)`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<C: GemmOut>(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &impl DevicePtr<bf16>,
        a_t: bool,
        b: &impl DevicePtr<bf16>,
        b_t: bool,
        c: &mut impl DevicePtrMut<C>,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        check_len("gemm a", a.len(), m * k)?;
        check_len("gemm b", b.len(), k * n)?;
        check_len("gemm c", c.len(), m * n)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        // Row-major C = A' B'  <=>  column-major Cᵀ = B'ᵀ A'ᵀ: cuBLAS's "A" is our b, its "B" our a.
        use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let (op_b, ldb_) = if b_t { (CUBLAS_OP_T, k) } else { (CUBLAS_OP_N, n) };
        let (op_a, lda_) = if a_t { (CUBLAS_OP_T, m) } else { (CUBLAS_OP_N, k) };
        let (ap, _ga) = a.device_ptr(&self.stream);
        let (bp, _gb) = b.device_ptr(&self.stream);
        let (cp, _gc) = c.device_ptr_mut(&self.stream);
        // SAFETY: lengths checked above against the m, n, k the call describes.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op_b,
                op_a,
                i32_of("n", n)?,
                i32_of("m", m)?,
                i32_of("k", k)?,
                (&alpha) as *const f32 as *const _,
                bp as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                i32_of("ldb", ldb_)?,
                ap as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                i32_of("lda", lda_)?,
                (&beta) as *const f32 as *const _,
                cp as *mut _,
                C::DTYPE,
                i32_of("n", n)?,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        Ok(())
    }

    // ---- attention ------------------------------------------------------------------------------

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
            b: i32_of("batch", s.batch)?,
            t: i32_of("seq", s.seq)?,
            hq: i32_of("q_heads", s.q_heads)?,
            hkv: i32_of("kv_heads", s.kv_heads)?,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
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
    #[allow(clippy::too_many_arguments)]
    pub fn attention_fwd(
        &self,
        s: &AttnShape,
        l: &AttnLayout,
        q: &impl DevicePtr<bf16>,
        k: &impl DevicePtr<bf16>,
        v: &impl DevicePtr<bf16>,
        seg_start: Option<&CudaSlice<i32>>,
        o: &mut impl DevicePtrMut<bf16>,
        lse: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
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
        let f = self.func(&sources::ATTENTION, name)?;
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
    pub fn attention_bwd(
        &self,
        s: &AttnShape,
        l: &AttnLayout,
        q: &impl DevicePtr<bf16>,
        k: &impl DevicePtr<bf16>,
        v: &impl DevicePtr<bf16>,
        o: &impl DevicePtr<bf16>,
        lse: &impl DevicePtr<f32>,
        seg_start: Option<&CudaSlice<i32>>,
        dout: &impl DevicePtr<bf16>,
        dq: &mut impl DevicePtrMut<bf16>,
        dk: &mut impl DevicePtrMut<bf16>,
        dv: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
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

        let f = self.func(&sources::ATTENTION, "flash_attn_bwd_pre")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&p).arg(&d);
        // SAFETY: o/dout extents checked by the callers; delta has `rows` elements.
        unsafe { b.launch(Self::cfg1(rows.div_ceil(4) as u32, 128, 0)) }?;

        let name = if s.head_dim == 64 { "flash_attn_bwd_d64" } else { "flash_attn_bwd_d128" };
        let f = self.func(&sources::ATTENTION, name)?;
        let cfg = LaunchConfig {
            grid_dim: (s.seq.div_ceil(64) as u32, s.kv_heads as u32, s.batch as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: attn_bwd_smem(s.head_dim),
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&p);
        // SAFETY: all extents checked by the callers.
        unsafe { b.launch(cfg) }?;

        let f = self.func(&sources::ATTENTION, "flash_attn_dq_convert")?;
        let n = rows * s.head_dim;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&p).arg(&d);
        // SAFETY: dq extent checked; dq_acc has rows * hd elements.
        unsafe { b.launch(Self::cfg1(self.grid_for(n, 256), 256, 0)) }?;
        Ok(())
    }

    // ---- cross-entropy --------------------------------------------------------------------------

    /// Fused softmax cross-entropy over `logits [N, V]` (see cross_entropy.cu): `logp [N]` (and
    /// `lse [N]`) written; with `write_grad` the logits are overwritten by
    /// `g_i * (softmax - onehot)`. `g` None means 1 for every row.
    #[allow(clippy::too_many_arguments)]
    pub fn xent_fwd_bwd(
        &self,
        logits: &mut impl DevicePtrMut<bf16>,
        targets: &impl DevicePtr<i32>,
        g: Option<&CudaSlice<f32>>,
        logp: &mut impl DevicePtrMut<f32>,
        lse: Option<&mut CudaSlice<f32>>,
        n: usize,
        v: usize,
        write_grad: bool,
    ) -> Result<()> {
        check_len("xent logits", logits.len(), n * v)?;
        check_len("xent targets", targets.len(), n)?;
        check_len("xent logp", logp.len(), n)?;
        if let Some(g) = g {
            check_len("xent g", g.len(), n)?;
        }
        if let Some(l) = &lse {
            check_len("xent lse", l.len(), n)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (xp, _g1) = logits.device_ptr_mut(&self.stream);
        let (tp, _g2) = targets.device_ptr(&self.stream);
        let gg = g.map(|x| x.device_ptr(&self.stream));
        let (lpp, _g3) = logp.device_ptr_mut(&self.stream);
        let ll = lse.map(|x| x.device_ptr_mut(&self.stream));
        let gp = gg.as_ref().map(|x| x.0).unwrap_or(0);
        let lsp = ll.as_ref().map(|x| x.0).unwrap_or(0);
        let (ni, vi) = (i32_of("rows", n)?, i32_of("vocab", v)?);
        let wg = write_grad as i32;
        // Keep as much of a row in shared memory as fits (one pass over DRAM); a multiple of 8.
        let cap = ((self.max_smem_optin as usize).saturating_sub(1024) / 2) & !7;
        let cache = if v % 8 == 0 && write_grad { v.min(cap) } else { 0 };
        let cache_i = cache as i32;
        let threads = ((v / 8).next_multiple_of(32)).clamp(32, 1024) as u32;
        let f = self.func(&sources::CROSS_ENTROPY, "xent_fwd_bwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&tp).arg(&gp).arg(&lpp).arg(&lsp).arg(&ni).arg(&vi).arg(&wg).arg(&cache_i);
        // SAFETY: lengths checked; grid = one block per row.
        unsafe { b.launch(Self::cfg1(n as u32, threads, (cache * 2) as u32)) }?;
        Ok(())
    }

    /// `g = mask / Σ mask` (zeros when Σ mask = 0): the SFT weights.
    pub fn xent_weights_from_mask(&self, mask: &impl DevicePtr<f32>, g: &mut impl DevicePtrMut<f32>, n: usize) -> Result<()> {
        check_len("mask", mask.len(), n)?;
        check_len("g", g.len(), n)?;
        let (mp, _g1) = mask.device_ptr(&self.stream);
        let (gp, _g2) = g.device_ptr_mut(&self.stream);
        let ni = i32_of("rows", n)?;
        let f = self.func(&sources::CROSS_ENTROPY, "xent_weights_from_mask")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mp).arg(&gp).arg(&ni);
        // SAFETY: lengths checked; one block.
        unsafe { b.launch(Self::cfg1(1, 1024, 0)) }?;
        Ok(())
    }

    /// `out[0] = Σ g_i * (-logp_i)`.
    pub fn xent_loss_sum(&self, logp: &impl DevicePtr<f32>, g: Option<&CudaSlice<f32>>, out: &mut impl DevicePtrMut<f32>, n: usize) -> Result<()> {
        check_len("logp", logp.len(), n)?;
        check_len("loss", out.len(), 1)?;
        let (lp, _g1) = logp.device_ptr(&self.stream);
        let gg = g.map(|x| x.device_ptr(&self.stream));
        let gp = gg.as_ref().map(|x| x.0).unwrap_or(0);
        let (op, _g2) = out.device_ptr_mut(&self.stream);
        let ni = i32_of("rows", n)?;
        let f = self.func(&sources::CROSS_ENTROPY, "xent_loss_sum")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&lp).arg(&gp).arg(&op).arg(&ni);
        // SAFETY: lengths checked; one block.
        unsafe { b.launch(Self::cfg1(1, 1024, 0)) }?;
        Ok(())
    }

    /// `entropy [N]` of each row's softmax over `logits [N, V]` (read only), from the `lse [N]` of a
    /// forward-only [`Gpu::xent_fwd_bwd`]; 0 for rows whose target is < 0 (see cross_entropy.cu).
    pub fn xent_entropy(
        &self,
        logits: &impl DevicePtr<bf16>,
        targets: &impl DevicePtr<i32>,
        lse: &impl DevicePtr<f32>,
        entropy: &mut impl DevicePtrMut<f32>,
        n: usize,
        v: usize,
    ) -> Result<()> {
        check_len("entropy logits", logits.len(), n * v)?;
        check_len("entropy targets", targets.len(), n)?;
        check_len("entropy lse", lse.len(), n)?;
        check_len("entropy out", entropy.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let (xp, _g1) = logits.device_ptr(&self.stream);
        let (tp, _g2) = targets.device_ptr(&self.stream);
        let (lp, _g3) = lse.device_ptr(&self.stream);
        let (ep, _g4) = entropy.device_ptr_mut(&self.stream);
        let (ni, vi) = (i32_of("rows", n)?, i32_of("vocab", v)?);
        let f = self.func(&sources::CROSS_ENTROPY, "xent_entropy")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&tp).arg(&lp).arg(&ep).arg(&ni).arg(&vi);
        let grid = n.min(self.info.multiprocessors as usize * 32) as u32;
        // SAFETY: lengths checked; rows are grid-strided.
        unsafe { b.launch(Self::cfg1(grid, 256, 0)) }?;
        Ok(())
    }

    /// `coa_model::ops::masked_cross_entropy` on the GPU: returns the loss (synchronises) and
    /// leaves d loss / d logits in `logits`.
    pub fn masked_cross_entropy(
        &self,
        logits: &mut impl DevicePtrMut<bf16>,
        targets: &impl DevicePtr<i32>,
        mask: &impl DevicePtr<f32>,
        n: usize,
        v: usize,
    ) -> Result<f32> {
        let mut g: CudaSlice<f32> = self.zeros(n.max(1))?;
        let mut logp: CudaSlice<f32> = self.zeros(n.max(1))?;
        let mut loss: CudaSlice<f32> = self.zeros(1)?;
        self.xent_weights_from_mask(mask, &mut g, n)?;
        self.xent_fwd_bwd(logits, targets, Some(&g), &mut logp, None, n, v, true)?;
        self.xent_loss_sum(&logp, Some(&g), &mut loss, n)?;
        Ok(self.download(&loss)?[0])
    }

    // ---- RMSNorm --------------------------------------------------------------------------------

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
        let f = self.func(&sources::RMSNORM, "rmsnorm_fwd")?;
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
        let f = self.func(&sources::RMSNORM, "rmsnorm_bwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&dyp).arg(&xp).arg(&wp).arg(&rp).arg(&dxp).arg(&pp).arg(&ni).arg(&di).arg(&acc);
        // SAFETY: lengths checked; part has grid * d elements; smem d floats.
        unsafe { b.launch(Self::cfg1(grid as u32, 256, (d * 4) as u32)) }?;
        let gi = grid as i32;
        let f = self.func(&sources::RMSNORM, "sum_rows_f32_add")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&pp).arg(&dwp).arg(&gi).arg(&di);
        // SAFETY: part [grid, d], dw [d].
        unsafe { b.launch(Self::cfg1(d.div_ceil(256) as u32, 256, 0)) }?;
        Ok(())
    }

    // ---- RoPE -----------------------------------------------------------------------------------

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
        let f = self.func(&sources::ROPE, "rope_apply")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&posp).arg(&cp).arg(&sp).arg(&ni).arg(&hi).arg(&di).arg(&sti).arg(&shi).arg(&inv);
        // SAFETY: x extent checked; positions must index the tables (the caller builds both).
        unsafe { b.launch(Self::cfg1(self.grid_for(n * heads * hd / 2, 256), 256, 0)) }?;
        Ok(())
    }

    // ---- SwiGLU ---------------------------------------------------------------------------------

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
        let func = self.func(&sources::SWIGLU, "swiglu_fwd")?;
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
        let func = self.func(&sources::SWIGLU, "swiglu_bwd")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&dhp).arg(&gp).arg(&upp).arg(&dgp).arg(&dup_).arg(&ni).arg(&fi);
        b.arg(&st[0]).arg(&st[1]).arg(&st[2]).arg(&st[3]).arg(&st[4]);
        // SAFETY: extents checked by the callers.
        unsafe { b.launch(Self::cfg1(self.grid_for(n * f, 256), 256, 0)) }?;
        Ok(())
    }

    // ---- embedding ------------------------------------------------------------------------------

    /// `out[N, D] = W[tok[n]]`. Token ids must be < vocab (clamped on the device, never read OOB).
    pub fn embedding_fwd(
        &self,
        tok: &impl DevicePtr<i32>,
        w: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<bf16>,
        n: usize,
        d: usize,
        vocab: usize,
    ) -> Result<()> {
        check_len("embedding tokens", tok.len(), n)?;
        check_len("embedding table", w.len(), vocab * d)?;
        check_len("embedding out", out.len(), n * d)?;
        if n == 0 || vocab == 0 {
            return Ok(());
        }
        let (tp, _g1) = tok.device_ptr(&self.stream);
        let (wp, _g2) = w.device_ptr(&self.stream);
        let (op, _g3) = out.device_ptr_mut(&self.stream);
        let (ni, di, vi) = (i32_of("rows", n)?, i32_of("dim", d)?, i32_of("vocab", vocab)?);
        let f = self.func(&sources::EMBEDDING, "embedding_fwd")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&tp).arg(&wp).arg(&op).arg(&ni).arg(&di).arg(&vi);
        let grid = n.min(self.info.multiprocessors as usize * 32) as u32;
        // SAFETY: lengths checked.
        unsafe { b.launch(Self::cfg1(grid, 128, 0)) }?;
        Ok(())
    }

    /// Groups token positions by id on the host (they are host data anyway) and uploads the plan.
    pub fn embedding_grad_plan(&self, tokens: &[u32], vocab: usize) -> Result<EmbeddingGradPlan> {
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error(format!("token id {bad} >= vocab {vocab}")));
        }
        let mut order: Vec<i32> = (0..tokens.len() as i32).collect();
        order.sort_by_key(|&i| (tokens[i as usize], i)); // stable: positions ascending per token
        let mut start = Vec::new();
        let mut uniq = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let t = tokens[i as usize] as i32;
            if uniq.last() != Some(&t) {
                uniq.push(t);
                start.push(k as i32);
            }
        }
        start.push(order.len() as i32);
        Ok(EmbeddingGradPlan {
            n_tokens: tokens.len(),
            n_unique: uniq.len(),
            order: self.upload(&order)?,
            start: self.upload(&start)?,
            uniq: self.upload(&if uniq.is_empty() { vec![0] } else { uniq })?,
        })
    }

    /// `dW[V, D] += Σ` of `dout [N, D]` rows per token id (deterministic order).
    pub fn embedding_bwd(&self, plan: &EmbeddingGradPlan, dout: &impl DevicePtr<bf16>, dw: &mut impl DevicePtrMut<f32>, d: usize) -> Result<()> {
        check_len("embedding dout", dout.len(), plan.n_tokens * d)?;
        if plan.n_unique == 0 {
            return Ok(());
        }
        let (op, _g1) = dout.device_ptr(&self.stream);
        let (dwp, _g2) = dw.device_ptr_mut(&self.stream);
        let (ui, di) = (i32_of("unique", plan.n_unique)?, i32_of("dim", d)?);
        let f = self.func(&sources::EMBEDDING, "embedding_bwd_sorted")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&op).arg(&plan.order).arg(&plan.start).arg(&plan.uniq).arg(&dwp).arg(&ui).arg(&di);
        let grid = plan.n_unique.min(self.info.multiprocessors as usize * 32) as u32;
        let threads = d.next_multiple_of(32).min(256) as u32;
        // SAFETY: the plan was built from validated ids (< vocab); dw must hold vocab * d, which
        // the caller sized from the same vocab.
        unsafe { b.launch(Self::cfg1(grid, threads, 0)) }?;
        Ok(())
    }

    // ---- AdamW and elementwise ------------------------------------------------------------------

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
        let f = self.func(&sources::ADAMW, "adamw_step")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&pp).arg(&gp).arg(&mp).arg(&vp).arg(&pbp).arg(&ni);
        b.arg(&a.b1).arg(&a.b2).arg(&a.eps).arg(&a.keep).arg(&a.step_size).arg(&a.bc2_sqrt).arg(&a.grad_scale);
        // SAFETY: lengths checked.
        unsafe { b.launch(Self::cfg1(self.grid_for(n, 256), 256, 0)) }?;
        Ok(())
    }

    fn unary<A, B>(&self, name: &'static str, x: &impl DevicePtr<A>, y: &mut impl DevicePtrMut<B>, n: usize) -> Result<()> {
        check_len(name, x.len(), n)?;
        check_len(name, y.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let (xp, _g1) = x.device_ptr(&self.stream);
        let (yp, _g2) = y.device_ptr_mut(&self.stream);
        let ni = n as i64;
        let f = self.func(&sources::ELEMENTWISE, name)?;
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
        let f = self.func(&sources::ELEMENTWISE, "add_bf16")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&ap).arg(&bp).arg(&yp).arg(&ni);
        // SAFETY: lengths checked by the callers.
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
        let f = self.func(&sources::ELEMENTWISE, "sumsq_f32")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&xp).arg(&pp).arg(&ni);
        // SAFETY: lengths checked; part has grid elements.
        unsafe { b.launch(Self::cfg1(grid, 256, 0)) }?;
        drop((_g1, _g2));
        Ok(self.download(&part)?.iter().map(|&v| v as f64).sum())
    }
}
