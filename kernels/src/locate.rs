//! Finding the CUDA user-space libraries (NVRTC, cuBLAS) and the headers NVRTC needs, without
//! relying on the process having been started with the right `LD_LIBRARY_PATH`.
//!
//! cudarc opens its libraries with `dlopen("libnvrtc.so.13")` by name and panics when that fails.
//! Before cudarc is touched we look for the library ourselves and, when it is not on the default
//! search path, `dlopen` it by full path with `RTLD_GLOBAL`: the dynamic loader then answers the
//! later by-name open from the already loaded object (matched by its SONAME).
//!
//! Search order for a library directory:
//!   1. `$COA_CUDA_LIB` (a directory);
//!   2. `$COA_CUDA_HOME/nvidia/cu13/lib` (`COA_CUDA_HOME` = the `pip install --target` root);
//!   3. `.cuda/nvidia/cu13/lib` in the current directory or any parent (what `pipelines/cuda.mk`
//!      installs), and in this repository (`CARGO_MANIFEST_DIR/..`, for tests and dev builds);
//!   4. `nvidia/cu13/lib` under Python's site-packages listed in `$COA_PYTHON_SITE` (the bench
//!      script sets it to torch's environment on the GPU machine);
//!   5. `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`, `/usr/local/cuda/targets/x86_64-linux/lib`.
//! The by-name search (`LD_LIBRARY_PATH`, ldconfig) is always tried first.
//!
//! Include directory (`cuda_bf16.h`): `$COA_CUDA_INCLUDE`, else `../include` beside each library
//! directory above (the pip wheel layout `nvidia/cu13/{lib,include}`), else
//! `/usr/local/cuda/include`.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// SONAMEs of the CUDA 13 libraries we load.
pub const NVRTC_SONAME: &str = "libnvrtc.so.13";
/// NVRTC opens its builtins library by name at compile time; preloaded beside libnvrtc.
pub const NVRTC_BUILTINS_SONAME: &str = "libnvrtc-builtins.so.13.0";
pub const CUBLAS_SONAME: &str = "libcublas.so.13";
pub const CUBLASLT_SONAME: &str = "libcublasLt.so.13";
pub const DRIVER_SONAME: &str = "libcuda.so.1";

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Candidate library directories, in search order (existing directories only, no duplicates).
pub fn lib_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = env_path("COA_CUDA_LIB") {
        dirs.push(d);
    }
    if let Some(d) = env_path("COA_CUDA_HOME") {
        dirs.push(d.join("nvidia/cu13/lib"));
    }
    if let Ok(cwd) = std::env::current_dir() {
        for anc in cwd.ancestors() {
            dirs.push(anc.join(".cuda/nvidia/cu13/lib"));
        }
    }
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cuda/nvidia/cu13/lib"));
    if let Some(sites) = std::env::var_os("COA_PYTHON_SITE") {
        for s in std::env::split_paths(&sites) {
            dirs.push(s.join("nvidia/cu13/lib"));
        }
    }
    if let Some(d) = env_path("CUDA_HOME") {
        dirs.push(d.join("lib64"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if let Ok(c) = d.canonicalize() {
            if c.is_dir() && !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// Candidate include directories holding `cuda_bf16.h`, in search order.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = env_path("COA_CUDA_INCLUDE") {
        dirs.push(d);
    }
    for l in lib_dirs() {
        if let Some(p) = l.parent() {
            dirs.push(p.join("include"));
        }
    }
    if let Some(d) = env_path("CUDA_HOME") {
        dirs.push(d.join("include"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if d.join("cuda_bf16.h").is_file() {
            let c = d.canonicalize().unwrap_or(d);
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// The first include directory holding `cuda_bf16.h`.
pub fn find_include_dir() -> Option<PathBuf> {
    include_dirs().into_iter().next()
}

struct Handle(#[allow(dead_code)] *mut libc::c_void);
// SAFETY: the handles are never used again (no call through them from any thread), only kept
// so the libraries stay loaded.
unsafe impl Send for Handle {}
static LOADED: Mutex<Vec<(String, Handle)>> = Mutex::new(Vec::new());

fn dlopen(name: &str) -> Option<*mut libc::c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlopen with a valid C string; the handle is kept for the life of the process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    (!h.is_null()).then_some(h)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a thread-local C string.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// Makes `soname` loadable by name: returns where it was found (`"<by name>"` when the loader's own
/// search found it), or a message naming every place searched.
pub fn ensure_loaded(soname: &str) -> Result<String, String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((w, _)) = loaded.iter().find(|(n, _)| n.starts_with(&format!("{soname}@"))) {
        return Ok(w[soname.len() + 1..].to_string());
    }
    if let Some(h) = dlopen(soname) {
        loaded.push((format!("{soname}@<by name>"), Handle(h)));
        return Ok("<by name>".into());
    }
    let mut tried = vec![format!("{soname} (LD_LIBRARY_PATH / system)")];
    let mut errors = Vec::new();
    for d in lib_dirs() {
        let p = d.join(soname);
        if p.is_file() {
            let ps = p.to_string_lossy().into_owned();
            match dlopen(&ps) {
                Some(h) => {
                    loaded.push((format!("{soname}@{ps}"), Handle(h)));
                    return Ok(ps);
                }
                None => errors.push(format!("{ps}: {}", dlerror())),
            }
        } else {
            tried.push(p.to_string_lossy().into_owned());
        }
    }
    let mut msg = format!("{soname} not found; searched: {}", tried.join(", "));
    if !errors.is_empty() {
        msg.push_str(&format!("; failed to load: {}", errors.join("; ")));
    }
    if soname == DRIVER_SONAME {
        msg.push_str(" (the NVIDIA driver is not installed, or this machine has no GPU)");
    } else {
        msg.push_str(
            ". Install the pinned wheels with `make cuda-deps` (pipelines/cuda.mk) or point \
             COA_CUDA_LIB / LD_LIBRARY_PATH at the directory holding it",
        );
    }
    Err(msg)
}
