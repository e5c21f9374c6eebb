//! [`Gpu`]: one CUDA context (a GPU, or the emulated device) with its stream, cuBLAS handle and
//! compiled-module cache; memory transfers; the launch helpers the ops share. The launchers of the
//! kernels are methods of `Gpu` declared beside each kernel's concept in `ops`.

use crate::compile::Compiler;
use crate::device::{probe_ordinal, GpuInfo};
use crate::error::{Error, Result};
use crate::sources::KernelSource;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DeviceRepr, LaunchConfig, ValidAsZeroBits,
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
    pub(crate) max_smem_optin: i32,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    funcs: Mutex<HashMap<&'static str, CudaFunction>>,
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
}

/// Zeroed device buffers, allocated once by the constructors of [`crate::GpuModel`] and
/// `decode::GpuDecoder`, with their bytes counted; a failure names what was being
/// allocated and what to lower.
pub(crate) struct Alloc<'a> {
    gpu: &'a Gpu,
    what: String,
    hint: &'static str,
    pub(crate) bytes: usize,
}

impl<'a> Alloc<'a> {
    pub(crate) fn new(gpu: &'a Gpu, what: String, hint: &'static str) -> Self {
        Alloc { gpu, what, hint, bytes: 0 }
    }

    fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(&mut self, n: usize) -> Result<CudaSlice<T>> {
        self.bytes += std::mem::size_of::<T>() * n;
        self.gpu.zeros(n.max(1)).map_err(|e| Error(format!("{}: {e} ({})", self.what, self.hint)))
    }

    pub(crate) fn bf16(&mut self, n: usize) -> Result<CudaSlice<bf16>> {
        self.zeros(n)
    }

    pub(crate) fn f32(&mut self, n: usize) -> Result<CudaSlice<f32>> {
        self.zeros(n)
    }

    pub(crate) fn i32(&mut self, n: usize) -> Result<CudaSlice<i32>> {
        self.zeros(n)
    }

    pub(crate) fn u64(&mut self, n: usize) -> Result<CudaSlice<u64>> {
        self.zeros(n)
    }

    /// Counts memory allocated elsewhere (an upload).
    pub(crate) fn count(&mut self, bytes: usize) {
        self.bytes += bytes;
    }
}
