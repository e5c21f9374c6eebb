//! Run-time compilation of `kernels/*.cu` to PTX with NVRTC, cached on disk.
//!
//! The cache key is xxh3-128 of (expanded source, NVRTC options, target architecture, NVRTC
//! version); the file is `<cache>/<stem>-<arch>-<key>.ptx`, written to a temporary name in the same
//! directory and renamed, so concurrent processes never read a partial file. Cache directory:
//! `$COA_CACHE_DIR`, else `$XDG_CACHE_HOME/coa/ptx`, else `~/.cache/coa/ptx`; `COA_CACHE_DIR=off`
//! disables it. A cache that cannot be written is not an error (the PTX is just not kept).

use crate::error::{Error, Result};
use crate::locate;
use crate::sources::KernelSource;
use std::path::PathBuf;

/// NVRTC, loaded and ready, plus where it found the headers.
#[derive(Debug, Clone)]
pub struct Compiler {
    pub include_dir: PathBuf,
    pub cache_dir: Option<PathBuf>,
    /// (major, minor) of the loaded NVRTC.
    pub nvrtc_version: (i32, i32),
    /// Where libnvrtc was loaded from.
    pub nvrtc_path: String,
}

/// A compiled module.
#[derive(Debug, Clone)]
pub struct CompiledPtx {
    pub ptx: String,
    pub from_cache: bool,
    pub cache_file: Option<PathBuf>,
}

/// The PTX cache directory this process uses (None = disabled or no home directory).
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("COA_CACHE_DIR") {
        Some(v) if v == "off" || v == "0" => return None,
        Some(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("coa/ptx"));
    }
    std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache/coa/ptx"))
}

/// Loads NVRTC (see [`locate`]) and reports its version: the probe that never panics.
pub fn load_nvrtc() -> Result<(String, (i32, i32))> {
    let path = locate::ensure_loaded(locate::NVRTC_SONAME).map_err(Error)?;
    // libnvrtc dlopens its builtins by name when it compiles; a by-path load of libnvrtc does not
    // make them findable, so load them from the same place first.
    locate::ensure_loaded(locate::NVRTC_BUILTINS_SONAME).map_err(Error)?;
    // SAFETY: only probes whether cudarc's own by-name open succeeds now.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error(format!(
            "libnvrtc was loaded from {path} but cudarc cannot open it by name ({})",
            locate::NVRTC_SONAME
        )));
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: the library is present (checked above); two valid out pointers.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error(format!("nvrtcVersion failed: {r:?}")));
    }
    Ok((path, (major, minor)))
}

impl Compiler {
    /// Finds and loads NVRTC and the CUDA headers. Never panics; the error says what is missing.
    pub fn new() -> Result<Self> {
        let (nvrtc_path, nvrtc_version) = load_nvrtc()?;
        let include_dir = locate::find_include_dir().ok_or_else(|| {
            Error::new(
                "cuda_bf16.h not found: set COA_CUDA_INCLUDE, or install the pinned \
                 nvidia-cuda-runtime wheel (`make cuda-deps`), or a CUDA toolkit in /usr/local/cuda",
            )
        })?;
        Ok(Compiler { include_dir, cache_dir: cache_dir(), nvrtc_version, nvrtc_path })
    }

    /// The NVRTC options for `arch` (a virtual architecture, e.g. `compute_90`).
    pub fn options(&self, arch: &str) -> Vec<String> {
        vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".into(),
            format!("--include-path={}", self.include_dir.display()),
            "--fmad=true".into(),
            "-lineinfo".into(),
            "-DCOA_NVRTC=1".into(),
        ]
    }

    fn key(&self, program: &str, options: &[String], arch: &str) -> u128 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(program.as_bytes());
        h.update(b"\0");
        for o in options {
            h.update(o.as_bytes());
            h.update(b"\0");
        }
        h.update(arch.as_bytes());
        h.update(format!("\0nvrtc {}.{}", self.nvrtc_version.0, self.nvrtc_version.1).as_bytes());
        h.digest128()
    }

    /// Compiles `src` for `arch` (`compute_90`, or `sm_90` which is taken as `compute_90`), from the
    /// disk cache when an identical compilation is there.
    pub fn compile(&self, src: &KernelSource, arch: &str) -> Result<CompiledPtx> {
        let arch = virtual_arch(arch);
        let program = src.expanded();
        let options = self.options(&arch);
        let key = self.key(&program, &options, &arch);
        let file = self.cache_dir.as_ref().map(|d| d.join(format!("{}-{arch}-{key:032x}.ptx", src.name)));
        if let Some(f) = &file {
            if let Ok(ptx) = std::fs::read_to_string(f) {
                if looks_like_ptx(&ptx) {
                    return Ok(CompiledPtx { ptx, from_cache: true, cache_file: file });
                }
            }
        }
        let opts = cudarc::nvrtc::CompileOptions {
            options: options.clone(),
            name: Some(format!("{}.cu", src.name)),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(&program, opts).map_err(|e| match e {
            cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => Error(format!(
                "NVRTC {}.{} failed to compile kernels/{}.cu for {arch} ({nvrtc:?}):\n{}",
                self.nvrtc_version.0,
                self.nvrtc_version.1,
                src.name,
                log.to_string_lossy()
            )),
            other => Error(format!("NVRTC error on kernels/{}.cu: {other:?}", src.name)),
        })?;
        let ptx = ptx.to_src();
        let mut cache_file = None;
        if let Some(f) = file {
            if coa_schemas::output::write_cache_entry(&f, ptx.as_bytes()).is_ok() {
                cache_file = Some(f);
            }
        }
        Ok(CompiledPtx { ptx, from_cache: false, cache_file })
    }
}

/// `sm_90` -> `compute_90`; anything else unchanged. PTX is produced for virtual architectures.
pub fn virtual_arch(arch: &str) -> String {
    match arch.strip_prefix("sm_") {
        Some(rest) => format!("compute_{rest}"),
        None => arch.to_string(),
    }
}

fn looks_like_ptx(s: &str) -> bool {
    s.contains(".version") && s.contains(".target")
}

