//! `--device auto|cpu|cuda|emu`: probing for a usable GPU without ever panicking, and the emulated
//! CUDA device ([`crate::emu`]) on request.
//!
//! cudarc panics when a CUDA library cannot be opened, so every library is probed first
//! ([`crate::locate::ensure_loaded`] / `is_culib_present`) and the driver is initialised through the
//! `Result`-returning calls only. `probe` additionally runs under `catch_unwind`, so an unexpected
//! panic inside a library binding still becomes a [`NoGpu`].

use crate::compile;
pub use crate::gpu_info::GpuInfo;
use crate::locate;
use std::fmt;
use std::str::FromStr;

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The GPU when one is usable, else the CPU (with a one-line note on stderr).
    #[default]
    Auto,
    Cpu,
    /// GPU `ordinal` (`cuda` = `cuda:0`); an error when none is usable.
    Cuda(usize),
    /// The emulated CUDA device: the GPU path (kernels, cuBLAS calls, host code) run on the CPU,
    /// for checking it, not for speed (see [`crate::emu`]).
    Emu,
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda(0)),
            "emu" => Ok(DeviceChoice::Emu),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceChoice::Cuda(n)),
                _ => Err(format!("unknown device {s:?}: expected auto, cpu, cuda or cuda:N, or emu (the CUDA device emulated on the CPU)")),
            },
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(0) => f.write_str("cuda"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceChoice::Emu => f.write_str("emu"),
        }
    }
}

/// `--device`, defined once for the stages that run the model (coa-train-step, coa-generate
/// policy, coa-serve).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct DeviceArg {
    /// Where the model runs: `cpu`; `cuda` or `cuda:N` (the GPU: an error when none is usable or
    /// the GPU path cannot run this model); `auto` (the GPU when it can, else the CPU with a note on
    /// stderr); `emu` (the GPU path on the CPU's emulated CUDA device: a correctness check of the
    /// GPU code, not a fast device). The CPU is deterministic for any batch and thread count. On
    /// the GPU, training keeps bf16 weights and activations with fp32 masters, gradients and
    /// optimizer state (close to the CPU's f32 run, not bit-identical; the checkpoint format is
    /// the same, so a run can resume on either device), and decoding bf16 weights and KV cache
    /// with fp32 accumulation. Sampling and tools run on the CPU either way.
    #[arg(long, value_name = "auto|cpu|cuda[:N]|emu", default_value = "cpu")]
    pub device: DeviceChoice,
}

/// Why no GPU can be used: a sentence for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoGpu(pub String);

impl fmt::Display for NoGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for NoGpu {}

/// The device a stage runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// A CUDA device: a GPU, or the emulated one (`info.emulated`); the host code is the same.
    Cuda(GpuInfo),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(g) => g.fmt(f),
        }
    }
}

/// Whether the CUDA driver library can be opened at all (cheap; no initialisation).
pub fn driver_present() -> bool {
    locate::ensure_loaded(locate::DRIVER_SONAME).is_ok()
        // SAFETY: a dlopen probe only.
        && unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Finds GPU 0. Never panics.
pub fn probe() -> Result<GpuInfo, NoGpu> {
    probe_ordinal(0)
}

/// Finds GPU `ordinal` and checks that everything the GPU path needs can be loaded: the driver
/// (libcuda), a device, NVRTC and cuBLAS. Never panics.
pub fn probe_ordinal(ordinal: usize) -> Result<GpuInfo, NoGpu> {
    match std::panic::catch_unwind(|| probe_inner(ordinal)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(NoGpu(format!("CUDA probe failed: {msg}")))
        }
    }
}

fn probe_inner(ordinal: usize) -> Result<GpuInfo, NoGpu> {
    use cudarc::driver::{result, sys};
    let driver = match locate::ensure_loaded(locate::DRIVER_SONAME) {
        Ok(path) => path,
        Err(e) => return Err(NoGpu(format!("no NVIDIA driver: {e}"))),
    };
    if crate::emu::is_loaded() {
        return Err(NoGpu("this process runs on the emulated CUDA device (loaded in place of the driver)".into()));
    }
    // SAFETY: a dlopen probe only.
    if !unsafe { sys::is_culib_present() } {
        return Err(NoGpu("no NVIDIA driver: libcuda cannot be opened".into()));
    }
    // cudarc binds the first driver it opens for the whole process; count the devices through the
    // library directly first, so that a driver without a GPU leaves cudarc unbound (the emulated
    // device can then still be loaded).
    let driver = if driver == "<by name>" { locate::DRIVER_SONAME.to_string() } else { driver };
    match devices_visible(&driver) {
        Ok(0) => return Err(NoGpu("the NVIDIA driver sees no GPU".into())),
        Ok(_) => {}
        Err(e) => return Err(NoGpu(format!("the NVIDIA driver is installed but {e} (no GPU visible?)"))),
    }
    let err = |what: &str, e: cudarc::driver::DriverError| {
        NoGpu(format!("{what}: {}", crate::error::Error::from(e)))
    };
    result::init().map_err(|e| err("the NVIDIA driver is installed but cuInit failed (no GPU visible?)", e))?;
    let count = result::device::get_count().map_err(|e| err("cuDeviceGetCount failed", e))?;
    if count <= 0 {
        return Err(NoGpu("the NVIDIA driver sees no GPU".into()));
    }
    if ordinal >= count as usize {
        return Err(NoGpu(format!("cuda:{ordinal} requested but only {count} GPU(s) visible")));
    }
    let dev = result::device::get(ordinal as i32).map_err(|e| err("cuDeviceGet failed", e))?;
    let name = result::device::get_name(dev).map_err(|e| err("cuDeviceGetName failed", e))?;
    let attr = |a: sys::CUdevice_attribute| {
        // SAFETY: dev is a valid device handle from cuDeviceGet.
        unsafe { result::device::get_attribute(dev, a) }.map_err(|e| err("cuDeviceGetAttribute failed", e))
    };
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    // SAFETY: valid device handle.
    let mem = unsafe { result::device::total_mem(dev) }.map_err(|e| err("cuDeviceTotalMem failed", e))?;
    let mut driver_version = 0i32;
    // SAFETY: valid out pointer; the driver library is loaded.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(|e| err("cuDriverGetVersion failed", e))?;
    if major < 8 {
        return Err(NoGpu(format!(
            "{name} is sm_{major}{minor}; the bf16 tensor-core kernels need sm_80 or newer"
        )));
    }
    let (_, nvrtc_version) = compile::load_nvrtc().map_err(|e| NoGpu(format!("GPU found but NVRTC is missing: {e}")))?;
    locate::ensure_loaded(locate::CUBLASLT_SONAME)
        .and_then(|_| locate::ensure_loaded(locate::CUBLAS_SONAME))
        .map_err(|e| NoGpu(format!("GPU found but cuBLAS is missing: {e}")))?;
    // SAFETY: a dlopen probe only.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(NoGpu("GPU found but cudarc cannot open libcublas".into()));
    }
    Ok(GpuInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        total_mem_bytes: mem,
        multiprocessors: sms,
        driver_version,
        nvrtc_version,
        emulated: None,
    })
}

/// `cuInit` and `cuDeviceGetCount` through the driver at `path` (already loaded), without cudarc.
fn devices_visible(path: &str) -> Result<i32, String> {
    let c = std::ffi::CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: the library is loaded (ensure_loaded); NOLOAD only returns its handle.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return Err(format!("{path} is not loaded"));
    }
    // SAFETY: symbol lookups in a live handle; the driver API's C signatures.
    unsafe {
        let init = libc::dlsym(h, c"cuInit".as_ptr());
        let count = libc::dlsym(h, c"cuDeviceGetCount".as_ptr());
        if init.is_null() || count.is_null() {
            return Err(format!("{path} lacks cuInit or cuDeviceGetCount"));
        }
        let init: unsafe extern "C" fn(u32) -> i32 = std::mem::transmute(init);
        let count: unsafe extern "C" fn(*mut i32) -> i32 = std::mem::transmute(count);
        let r = init(0);
        if r != 0 {
            return Err(format!("cuInit failed (CUresult {r})"));
        }
        let mut n = 0;
        let r = count(&mut n);
        if r != 0 {
            return Err(format!("cuDeviceGetCount failed (CUresult {r})"));
        }
        Ok(n)
    }
}

/// Resolves `--device`. `cuda` without a usable GPU is an error naming the reason; `auto` falls
/// back to the CPU with a one-line note on stderr (never to the emulated device: `emu` is asked
/// for by name).
pub fn select_device(choice: DeviceChoice) -> Result<Device, NoGpu> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Emu => crate::emu::info().map(Device::Cuda).map_err(|e| NoGpu(format!("--device emu: {e}"))),
        DeviceChoice::Cuda(n) => probe_ordinal(n)
            .map(Device::Cuda)
            .map_err(|e| NoGpu(format!("--device {choice}: {e}"))),
        DeviceChoice::Auto => match probe() {
            Ok(g) => Ok(Device::Cuda(g)),
            Err(e) => {
                eprintln!("note: --device auto: no usable CUDA GPU ({e}); running on the CPU");
                Ok(Device::Cpu)
            }
        },
    }
}

/// [`select_device`]'s answer settled against the model: `Some(gpu)` when the GPU path supports
/// the model (`supported`: `model::check_supported` for training, `decode::check_decodable` for
/// decoding). When it does not, `cuda` is an error that names what `--device cpu` does instead
/// (`cpu_does`, e.g. "trains this model"), and `auto` falls back to the CPU with one line on stderr.
pub fn gpu_for_model(
    device: Device,
    choice: DeviceChoice,
    supported: crate::Result<()>,
    cpu_does: &str,
) -> Result<Option<GpuInfo>, NoGpu> {
    let Device::Cuda(info) = device else { return Ok(None) };
    match supported {
        Ok(()) => Ok(Some(info)),
        Err(e) if choice == DeviceChoice::Auto => {
            eprintln!("note: --device auto: {e}; running on the CPU");
            Ok(None)
        }
        Err(e) => Err(NoGpu(format!("--device {choice}: {e} (--device cpu {cpu_does})"))),
    }
}
