//! The emulated CUDA device (`--device emu`): a correctness device, not a fast one. The very same
//! `kernels/*.cu`, compiled for the CPU at build time (`build.rs`, `emu/`), behind the CUDA driver
//! API and cuBLAS: two shared libraries embedded in this crate and loaded under the sonames
//! `libcuda.so` and `libcublas.so`, so cudarc, [`Gpu`](crate::Gpu), `GpuModel` and `GpuDecoder`
//! run on it unchanged (every launch, copy and cuBLAS call goes through the same host code as on
//! a GPU).
//!
//! Each GPU thread runs as a fiber; `__syncthreads` is a barrier over the block's live threads;
//! warp collectives (`__shfl*_sync`, `__syncwarp`, ldmatrix, `mma.sync`) exchange through a
//! per-warp buffer; `cp.async` completes at its wait; shared memory is poisoned with NaN before
//! every block. What a GPU would refuse is an error naming the kernel, block and thread: more than
//! 1024 threads or more than `__launch_bounds__`, shared memory over the limit, misaligned or
//! non-shared ldmatrix / cp.async addresses, a warp collective some lanes skip, a deadlock; and
//! a copy, memset or cuBLAS operand outside its allocation. With the memory checks on (the
//! default, [`set_checks`]) also every load and store of kernel code outside device allocations
//! and shared memory, races between the blocks of a launch, shared-memory accesses a missing
//! barrier leaves unordered, and a `__syncthreads` only some threads of a block reach.
//!
//! The driver is process-wide: once the emulated device is loaded, the process has no real GPU
//! (and a process whose cudarc already uses a real driver cannot load it). The order in which a
//! block's threads run is chosen per launch ([`Order`]; `COA_EMU_ORDER`, or [`set_order`] for the
//! calling thread); `COA_EMU_THREADS` sets the worker threads that run blocks in parallel.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::gpu_info::GpuInfo;

static CUDA_LIBRARY: &[u8] = include_bytes!(env!("COA_EMU_CUDA_SO"));
static CUBLAS_LIBRARY: &[u8] = include_bytes!(env!("COA_EMU_CUBLAS_SO"));

/// The order in which a block's runnable threads run (and a grid's blocks are started), and when
/// `cp.async` copies land: at their wait in forward and reverse order, at their issue in max-drift
/// order, either (at random) in random order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Index order, round robin: a thread runs until it waits; released threads queue behind the
    /// others, so the warps of a block stay close together.
    Forward,
    /// The same from the last thread and block.
    Reverse,
    /// A seeded random pick at every switch; blocks in a seeded random order.
    Random(u64),
    /// Always the lowest runnable thread: warp 0 runs as far as it can (up to the next block
    /// barrier) before warp 1 starts, so warps drift as far apart as a GPU would allow.
    MaxDrift,
}

impl Order {
    /// One of each kind (the random one with `seed`).
    pub fn all(seed: u64) -> [Order; 4] {
        [Order::Forward, Order::Reverse, Order::Random(seed), Order::MaxDrift]
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Order::Forward => f.write_str("forward"),
            Order::Reverse => f.write_str("reverse"),
            Order::Random(s) => write!(f, "random:{s}"),
            Order::MaxDrift => f.write_str("max-drift"),
        }
    }
}

impl FromStr for Order {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "forward" => Ok(Order::Forward),
            "reverse" => Ok(Order::Reverse),
            "max-drift" => Ok(Order::MaxDrift),
            "random" => Ok(Order::Random(0x9e37_79b9_7f4a_7c15)),
            _ => match s.strip_prefix("random:").map(str::parse::<u64>) {
                Some(Ok(seed)) => Ok(Order::Random(seed)),
                _ => Err(format!("unknown schedule order {s:?}: expected forward, reverse, random, random:SEED or max-drift")),
            },
        }
    }
}

/// The loaded emulator: the two libraries and the entry points of its own API.
struct Emulator {
    set_order: unsafe extern "C" fn(*const c_char) -> c_int,
    order: unsafe extern "C" fn() -> *const c_char,
    set_checks: unsafe extern "C" fn(c_int) -> c_int,
    worker_threads: unsafe extern "C" fn() -> u32,
    struct_field: unsafe extern "C" fn(*const c_char, c_int, *mut *const c_char, *mut usize, *mut usize, *mut usize) -> c_int,
    blas_last_error: unsafe extern "C" fn() -> *const c_char,
}

static EMULATOR: OnceLock<Result<Emulator, String>> = OnceLock::new();

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: checked non-null above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Loads `bytes` (a shared library): from a file in the kernel cache directory (written once per
/// content, to a temporary name then renamed; debuggers and profilers can read it there), else
/// from an anonymous in-memory file. The loader then answers dlopen of its soname with it.
fn load_library(what: &str, bytes: &[u8]) -> Result<*mut c_void, String> {
    if bytes.is_empty() {
        return Err("the emulated CUDA device is built on Linux only".into());
    }
    if let Some(path) = cached_file(what, bytes) {
        let c = CString::new(path.to_string_lossy().into_owned()).unwrap();
        // SAFETY: dlopen of a valid path; the handle is kept for the life of the process.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            return Ok(handle);
        }
    }
    load_from_memory(what, bytes)
}

/// `<cache>/emu/<stem>-<xxh3 of the bytes>.so`, written if missing; None when there is no
/// writable cache directory (`COA_CACHE_DIR=off`, no home).
fn cached_file(what: &str, bytes: &[u8]) -> Option<std::path::PathBuf> {
    let dir = crate::compile::cache_dir()?.join("emu");
    let stem = what.trim_end_matches(".so");
    let path = dir.join(format!("{stem}-{:032x}.so", xxhash_rust::xxh3::xxh3_128(bytes)));
    if std::fs::read(&path).is_ok_and(|b| b == bytes) {
        return Some(path);
    }
    coa_schemas::output::write_cache_entry(&path, bytes).ok()?;
    Some(path)
}

fn load_from_memory(what: &str, bytes: &[u8]) -> Result<*mut c_void, String> {
    let name = CString::new(what).unwrap();
    // SAFETY: memfd_create with a valid name.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create for {what}: {}", std::io::Error::last_os_error()));
    }
    let mut written = 0;
    while written < bytes.len() {
        // SAFETY: fd is open; the pointer and length lie within `bytes`.
        let n = unsafe { libc::write(fd, bytes[written..].as_ptr() as *const c_void, bytes.len() - written) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: fd is open.
            unsafe { libc::close(fd) };
            return Err(format!("writing {what} to memory: {e}"));
        }
        written += n as usize;
    }
    // The descriptor stays open for the life of the process: the loader knows a library by its
    // path, and a reused descriptor number would make the next library's path look loaded.
    let path = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
    // SAFETY: dlopen of a valid path; the handle is kept for the life of the process.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        let e = dlerror();
        // SAFETY: fd is open and nothing refers to it.
        unsafe { libc::close(fd) };
        return Err(format!("loading {what}: {e}"));
    }
    Ok(handle)
}

fn symbol<T: Copy>(handle: *mut c_void, name: &str) -> Result<T, String> {
    let c = CString::new(name).unwrap();
    // SAFETY: dlsym on a live handle; the caller gives the symbol's real type.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if p.is_null() {
        return Err(format!("the emulated device library has no {name}"));
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is a function pointer type of the symbol (same size checked above).
    Ok(unsafe { std::mem::transmute_copy(&p) })
}

fn load() -> Result<&'static Emulator, Error> {
    EMULATOR
        .get_or_init(|| {
            let cuda = load_library("libcuda.so", CUDA_LIBRARY)?;
            load_library("libcublas.so", CUBLAS_LIBRARY)?;
            // cudarc opens the driver by name once per process: it must find this one.
            // SAFETY: a by-name dlopen probe, then a symbol lookup in the library cudarc bound.
            let bound_to_emulator = unsafe {
                cudarc::driver::sys::is_culib_present()
                    && cudarc::driver::sys::culib().get::<unsafe extern "C" fn() -> *const c_char>(b"coa_emu_version\0").is_ok()
            };
            if !bound_to_emulator {
                return Err("this process already uses a real CUDA driver; the emulated device replaces the driver and needs a process of its own".into());
            }
            Ok(Emulator {
                set_order: symbol(cuda, "coa_emu_set_order")?,
                order: symbol(cuda, "coa_emu_order")?,
                set_checks: symbol(cuda, "coa_emu_set_checks")?,
                worker_threads: symbol(cuda, "coa_emu_worker_threads")?,
                struct_field: symbol(cuda, "coa_emu_struct_field")?,
                blas_last_error: {
                    let blas = CString::new("libcublas.so").unwrap();
                    // SAFETY: the library was loaded above under this soname.
                    let h = unsafe { libc::dlopen(blas.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
                    if h.is_null() {
                        return Err(format!("the emulated cuBLAS is not loaded: {}", dlerror()));
                    }
                    symbol(h, "coa_emu_blas_last_error")?
                },
            })
        })
        .as_ref()
        .map_err(|e| Error(format!("the emulated CUDA device: {e}")))
}

/// Whether this process runs on the emulated device (it has been loaded).
pub fn is_loaded() -> bool {
    matches!(EMULATOR.get(), Some(Ok(_)))
}

/// Loads the emulated device (once per process) and describes it as [`probe`](crate::probe)
/// describes a GPU.
pub fn info() -> Result<GpuInfo> {
    let emu = load()?;
    use cudarc::driver::{result, sys::CUdevice_attribute as A};
    let err = |what: &str, e: cudarc::driver::DriverError| Error(format!("the emulated CUDA device: {what}: {}", Error::from(e)));
    result::init().map_err(|e| err("cuInit", e))?;
    let dev = result::device::get(0).map_err(|e| err("cuDeviceGet", e))?;
    // SAFETY: dev is the device handle cuDeviceGet returned.
    let attr = |a: A| unsafe { result::device::get_attribute(dev, a) }.map_err(|e| err("cuDeviceGetAttribute", e));
    Ok(GpuInfo {
        ordinal: 0,
        name: result::device::get_name(dev).map_err(|e| err("cuDeviceGetName", e))?,
        compute_capability: (attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?, attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?),
        // SAFETY: as above.
        total_mem_bytes: unsafe { result::device::total_mem(dev) }.map_err(|e| err("cuDeviceTotalMem", e))?,
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        driver_version: 13000,
        nvrtc_version: (0, 0),
        // SAFETY: a plain query of the loaded library.
        emulated: Some(unsafe { (emu.worker_threads)() } as usize),
    })
}

/// Sets the schedule order of the launches made from the calling thread (None: back to
/// `COA_EMU_ORDER`'s, forward by default). Loads the emulator if needed.
pub fn set_order(order: Option<Order>) -> Result<()> {
    let emu = load()?;
    let text = order.map(|o| CString::new(o.to_string()).unwrap());
    // SAFETY: a valid C string or NULL.
    let r = unsafe { (emu.set_order)(text.as_ref().map_or(std::ptr::null(), |t| t.as_ptr())) };
    if r != 0 {
        return Err(Error(format!("the emulated device refused schedule order {order:?}")));
    }
    Ok(())
}

/// Turns the memory checks (emu/runtime.h: accesses outside allocations and shared memory, races
/// between blocks, missing barriers, barriers only some threads reach; each an error naming the
/// kernel, block and thread) on or off for the launches made from the calling thread (None: back
/// to `COA_EMU_CHECKS`'s choice, on unless it is `0` or `off`). Returns whether they are on now.
pub fn set_checks(on: Option<bool>) -> Result<bool> {
    let emu = load()?;
    // SAFETY: a plain call; -1, 0 and 1 are its arguments.
    Ok(unsafe { (emu.set_checks)(on.map_or(-1, c_int::from)) } == 1)
}

/// The schedule order of the calling thread's launches, as `COA_EMU_ORDER` spells it (`random`
/// without its seed).
pub fn order() -> Result<String> {
    let emu = load()?;
    // SAFETY: returns a static C string.
    Ok(unsafe { CStr::from_ptr((emu.order)()) }.to_string_lossy().into_owned())
}

/// A struct of `kernels/*.cu` as the C++ compiler laid it out for the kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StructLayout {
    pub size: usize,
    /// (name, offset, size) in declaration order.
    pub fields: Vec<(String, usize, usize)>,
}

/// The layout of `strct` (a struct declared in `kernels/*.cu`); no fields if there is none.
pub fn struct_layout(strct: &str) -> Result<StructLayout> {
    let emu = load()?;
    let s = CString::new(strct).unwrap();
    let mut out = StructLayout { size: 0, fields: Vec::new() };
    loop {
        let (mut name, mut offset, mut size) = (std::ptr::null(), 0usize, 0usize);
        // SAFETY: valid out pointers; `name` points at a static string of the library.
        let found = unsafe { (emu.struct_field)(s.as_ptr(), out.fields.len() as c_int, &mut name, &mut offset, &mut size, &mut out.size) };
        if found == 0 {
            return Ok(out);
        }
        // SAFETY: non-null static C string (returned with 1).
        out.fields.push((unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned(), offset, size));
    }
}

// In this module rather than beside `Error`: a failed call's message comes from the emulated
// cuBLAS where it runs.
impl From<cudarc::cublas::result::CublasError> for Error {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        match last_blas_error() {
            Some(detail) => Error(format!("cuBLAS error: {e:?}: {detail}")),
            None => Error(format!("cuBLAS error: {e:?}")),
        }
    }
}

/// The emulated cuBLAS's message for the calling thread's last failed call, if any.
pub(crate) fn last_blas_error() -> Option<String> {
    let emu = EMULATOR.get()?.as_ref().ok()?;
    // SAFETY: returns a C string owned by the library (valid until this thread's next error).
    let s = unsafe { CStr::from_ptr((emu.blas_last_error)()) }.to_string_lossy().into_owned();
    (!s.is_empty()).then_some(s)
}
