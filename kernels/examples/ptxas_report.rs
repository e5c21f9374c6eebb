//! Resource report without a GPU: compiles every kernel to SASS for a real architecture with
//! NVRTC (`-arch=sm_90 --ptxas-options=-v`) and prints ptxas's registers / shared memory / spill
//! lines per kernel. Usage: `cargo run --release -p coa-kernels --example ptxas_report [sm_90]`.

use coa_kernels::compile::Compiler;
use coa_kernels::ops;
use cudarc::nvrtc::result;
use std::ffi::{CStr, CString};

fn main() {
    let arch = std::env::args().nth(1).unwrap_or_else(|| "sm_90".into());
    let c = match Compiler::new() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("NVRTC not available: {e}");
            std::process::exit(2);
        }
    };
    let mut opts = c.options(&arch);
    opts.retain(|o| !o.starts_with("--gpu-architecture"));
    opts.push(format!("--gpu-architecture={arch}"));
    opts.push("--ptxas-options=-v".into());
    let mut bad = false;
    for s in ops::SOURCES {
        let src = CString::new(s.expanded()).unwrap();
        let name = CString::new(format!("{}.cu", s.name)).unwrap();
        let prog = result::create_program(&src, Some(&name)).expect("nvrtcCreateProgram");
        // SAFETY: prog is a live program; the log is read before it is destroyed.
        let status = unsafe { result::compile_program(prog, &opts) };
        let log = unsafe { result::get_program_log(prog) }.unwrap_or_default();
        let log = unsafe { CStr::from_ptr(log.as_ptr()) }.to_string_lossy().into_owned();
        println!("== kernels/{}.cu ({arch}) {}", s.name, if status.is_ok() { "ok" } else { "FAILED" });
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            println!("  {line}");
        }
        bad |= status.is_err();
        unsafe { result::destroy_program(prog) }.ok();
    }
    if bad {
        std::process::exit(1);
    }
}
