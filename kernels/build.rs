//! Builds the emulated CUDA device (`--device emu`, see kernels/emu/): the very same
//! `kernels/*.cu` compiled for the CPU by the C++ compiler (the `cc` crate), with
//! `emu/cuda_shim.h` force-included, into two shared libraries that stand in for the CUDA driver
//! (`libcuda.so`: driver API, scheduler, kernels) and cuBLAS (`libcublas.so`: `cublasGemmEx`).
//! The crate embeds both (`src/emu.rs` loads them at run time). The CUDA path (NVRTC at run
//! time) does not use anything built here.
//!
//! For each `<stem>.cu` a small C++ file is generated that includes it and registers its
//! `extern "C" __global__` functions (name and `__launch_bounds__`) and the fields of its structs
//! (offset and size, so a test can hold `AttnParams` against its Rust mirror).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let emu = manifest.join("emu");
    // Rebuilt when the emulator (a directory: cargo scans all of it), the common header, a kernel
    // source (each `.cu` below) or the list of sources changes. Not on all of kernels/: cargo's
    // scan of a directory is recursive, so every edit under src/ and tests/ would recompile the
    // emulator. A new `.cu` file must be added to `ops::SOURCES` (the NVRTC test holds the list
    // against the directory), and that edit reruns this script.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=emu");
    println!("cargo:rerun-if-changed=coa_common.cuh");
    println!("cargo:rerun-if-changed=src/sources.rs");
    println!("cargo:rerun-if-env-changed=COA_EMU_KERNELS_DIR");
    let (cuda_so, blas_so) = (out.join("libcoa_emu_cuda.so"), out.join("libcoa_emu_cublas.so"));
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        // The emulator is ELF/Linux only (fibers, the loader's soname lookup).
        std::fs::write(&cuda_so, b"").unwrap();
        std::fs::write(&blas_so, b"").unwrap();
        println!("cargo:rustc-env=COA_EMU_CUDA_SO={}", cuda_so.display());
        println!("cargo:rustc-env=COA_EMU_CUBLAS_SO={}", blas_so.display());
        return;
    }
    // The kernel sources: kernels/*.cu, or a copy of them (the planted-bug check builds mutants).
    let src_dir = std::env::var_os("COA_EMU_KERNELS_DIR").map(PathBuf::from).unwrap_or_else(|| manifest.clone());
    if src_dir != manifest {
        println!("cargo:rerun-if-changed={}", src_dir.display()); // a copy holds only the sources
    }
    let mut units = Vec::new();
    let mut cu: Vec<PathBuf> = std::fs::read_dir(&src_dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", src_dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    cu.sort();
    for path in &cu {
        println!("cargo:rerun-if-changed={}", path.display());
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        units.push(module_unit(&out, path, &stem));
    }
    // Kernels that do what a GPU refuses, for the emulator's own tests.
    units.push(module_unit(&out, &emu.join("hazards.cu"), "emu_hazards"));

    let base = || {
        let mut b = cc::Build::new();
        b.cpp(true).std("c++17").opt_level(2).debug(false).pic(true).warnings(false);
        b.flag("-fvisibility=hidden").flag("-fno-strict-aliasing").flag("-Wno-unknown-pragmas");
        b
    };
    let mut kernels = base();
    kernels.include(emu.join("include")).include(&emu).include(&src_dir).include(&manifest);
    kernels.define("COA_EMU", "1");
    kernels.flag("-include").flag(emu.join("cuda_shim.h").to_str().unwrap());
    // Every load and store of kernel code calls a hook the runtime defines (__tsan_read4, ...):
    // the memory checks of emu/runtime.h. No libtsan is linked; function entry/exit hooks are off.
    kernels.flag("-fsanitize=thread").flag("--param=tsan-instrument-func-entry-exit=0");
    kernels.files(&units);
    let mut objects = kernels.compile_intermediates();
    let mut runtime = base();
    runtime.include(emu.join("include")).include(&emu);
    runtime.files([emu.join("runtime.cpp"), emu.join("driver.cpp")]);
    objects.extend(runtime.compile_intermediates());
    link(&base(), &objects, &cuda_so, "libcuda.so");

    let mut blas = base();
    blas.opt_level(3).include(emu.join("include")).file(emu.join("cublas.cpp"));
    let blas_objects = blas.compile_intermediates();
    link(&base(), &blas_objects, &blas_so, "libcublas.so");

    println!("cargo:rustc-env=COA_EMU_CUDA_SO={}", cuda_so.display());
    println!("cargo:rustc-env=COA_EMU_CUBLAS_SO={}", blas_so.display());
}

/// Writes `<out>/<module>_emu.cpp`: the kernel source plus its registrations.
fn module_unit(out: &Path, source: &Path, module: &str) -> PathBuf {
    let text = std::fs::read_to_string(source).unwrap_or_else(|e| panic!("reading {}: {e}", source.display()));
    let mut unit = format!("// Generated by kernels/build.rs from {}.\n", source.display());
    unit.push_str(&format!("#include \"{}\"\n#include \"emu.h\"\n#include <cstddef>\n", source.display()));
    let kernels = entry_points(&text);
    if kernels.is_empty() {
        panic!("{}: no extern \"C\" __global__ function found", source.display());
    }
    // Static shared memory is counted over the kernel's own function and every function it
    // reaches, the common header's included.
    let header = source.with_file_name("coa_common.cuh");
    let mut program = std::fs::read_to_string(&header).unwrap_or_default();
    program.push_str(&text);
    let functions = functions(&program);
    for (name, bound) in kernels {
        let (shared, owners) = static_shared(&functions, &name);
        let size = if shared.is_empty() { "0".to_string() } else { shared.join(" + ") };
        let bound = bound.unwrap_or_else(|| "1024".into());
        unit.push_str(&format!("COA_EMU_KERNEL(\"{module}\", {name}, {bound}, {size}, \"{}\")\n", owners.join(" ")));
    }
    for (strct, fields) in structs(&text) {
        for f in fields {
            unit.push_str(&format!("COA_EMU_FIELD({strct}, {f})\n"));
        }
    }
    let path = out.join(format!("{module}_emu.cpp"));
    std::fs::write(&path, unit).unwrap();
    path
}

/// Text without `//` and `/* */` comments (string literals in kernels hold no comment markers).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// `extern "C" __global__ void [__launch_bounds__(N[, M])] name(`: (name, N).
fn entry_points(text: &str) -> Vec<(String, Option<String>)> {
    let text = strip_comments(text);
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find("__global__") {
        let start = at + i;
        at = start + "__global__".len();
        let before = &text[text[..start].rfind([';', '}']).map_or(0, |j| j + 1)..start];
        if !before.contains("extern \"C\"") {
            continue; // not loadable by name (a template or C++-linkage kernel)
        }
        let mut rest = text[at..].trim_start();
        rest = rest.strip_prefix("void").unwrap_or(rest).trim_start();
        let mut bound = None;
        if let Some(r) = rest.strip_prefix("__launch_bounds__") {
            let r = r.trim_start().strip_prefix('(').expect("__launch_bounds__(");
            let (mut depth, mut end) = (1, 0);
            for (j, c) in r.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = j;
                    break;
                }
            }
            let args = &r[..end];
            bound = Some(args.split(',').next().unwrap().trim().to_string());
            rest = r[end + 1..].trim_start();
        }
        let name = ident_at(rest);
        if !name.is_empty() {
            found.push((name.to_string(), bound));
        }
    }
    found
}

/// A function defined in a kernel source: its name, body, and the sizes of its static
/// `__shared__` variables as C++ expressions (`sizeof(float[32])`).
struct Function {
    name: String,
    body: String,
    shared: Vec<String>,
}

/// The functions defined in `text` (at file scope or inside namespaces, `extern "C"` blocks and
/// structs): a `{` that follows a parameter list `name(...)` opens a body.
fn functions(text: &str) -> Vec<Function> {
    let text = strip_comments(text);
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        let before = text[..i].trim_end();
        let close = matching(bytes, i, b'{', b'}');
        if before.ends_with(')') {
            let open = opening(bytes, before.len() - 1);
            let name = open.map(|j| {
                let head = text[..j].trim_end();
                let start = head.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |k| k + 1);
                head[start..].to_string()
            });
            if let Some(name) = name.filter(|n| !n.is_empty() && !["if", "for", "while", "switch"].contains(&n.as_str())) {
                let body = text[i + 1..close].to_string();
                let shared = shared_declarations(&body);
                found.push(Function { name, body, shared });
                i = close + 1;
                continue;
            }
        }
        i += 1; // a namespace, extern "C" block or struct: look inside
    }
    found
}

/// The index of the bracket closing the one at `at` (the text's end if unbalanced).
fn matching(bytes: &[u8], at: usize, open: u8, close: u8) -> usize {
    if bytes[at] != open {
        return usize::MAX;
    }
    let mut depth = 0;
    for (j, &c) in bytes.iter().enumerate().skip(at) {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    bytes.len()
}

/// The index of the `(` that the `)` at `at` closes.
fn opening(bytes: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0;
    for j in (0..=at).rev() {
        match bytes[j] {
            b')' => depth += 1,
            b'(' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// `__shared__ T a[N][M], b;` (not `extern __shared__`, which is the dynamic part): the size of
/// each variable declared, as `sizeof(T[N][M])`, `sizeof(T)`.
fn shared_declarations(body: &str) -> Vec<String> {
    let mut sizes = Vec::new();
    let mut at = 0;
    while let Some(i) = body[at..].find("__shared__") {
        let start = at + i;
        at = start + "__shared__".len();
        let statement = &body[body[..start].rfind([';', '{', '}']).map_or(0, |j| j + 1)..start];
        if statement.contains("extern") {
            continue;
        }
        let end = body[at..].find(';').map_or(body.len(), |j| at + j);
        let mut decl = body[at..end].to_string();
        while let Some(a) = decl.find("__align__") {
            let close = decl[a..].find(')').map_or(decl.len(), |j| a + j + 1);
            decl.replace_range(a..close, "");
        }
        // `T a[N], *b`: the base type, then declarators (pointer stars, name, array bounds).
        let decl = decl.trim();
        let first = decl.split(',').next().unwrap();
        let name_end = first.find('[').unwrap_or(first.len());
        let name_start = first[..name_end].trim_end().rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |k| k + 1);
        let base = first[..name_start].trim_end_matches(|c: char| c == '*' || c.is_whitespace());
        for declarator in decl[base.len()..].split(',') {
            let declarator = declarator.split('=').next().unwrap().trim();
            let stars = declarator.chars().take_while(|&c| c == '*' || c.is_whitespace()).filter(|&c| c == '*').count();
            let dims = declarator.find('[').map_or("", |j| &declarator[j..]);
            sizes.push(format!("sizeof({base}{}{dims})", "*".repeat(stars)));
        }
    }
    sizes
}

/// The static shared memory of kernel `name`: the sizes declared in it and in every function it
/// reaches by name (a call graph by mention, so an overload or an uncalled mention counts too),
/// and the names of the functions that declare them (the emulator's bounds check allows a kernel
/// the static `__shared__` variables of these functions only).
fn static_shared(functions: &[Function], name: &str) -> (Vec<String>, Vec<String>) {
    let mentions = |body: &str, f: &str| {
        body.match_indices(f).any(|(j, _)| {
            let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
            !body[..j].ends_with(ident) && !body[j + f.len()..].starts_with(ident)
        })
    };
    let mut reached = vec![name.to_string()];
    let mut k = 0;
    while k < reached.len() {
        let caller = reached[k].clone();
        for f in functions.iter().filter(|f| f.name == caller) {
            for g in functions {
                if !reached.contains(&g.name) && mentions(&f.body, &g.name) {
                    reached.push(g.name.clone());
                }
            }
        }
        k += 1;
    }
    let (mut sizes, mut owners) = (Vec::new(), Vec::new());
    for f in functions.iter().filter(|f| reached.contains(&f.name)) {
        sizes.extend(f.shared.iter().cloned());
        if !f.shared.is_empty() && !owners.contains(&f.name) {
            owners.push(f.name.clone());
        }
    }
    (sizes, owners)
}

/// `struct Name { type a; type b, c; ... };` at file scope: (Name, field names).
fn structs(text: &str) -> Vec<(String, Vec<String>)> {
    let text = strip_comments(text);
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find("struct ") {
        let start = at + i;
        at = start + 7;
        if start > 0 && !text[..start].ends_with(['\n', ' ', '\t']) {
            continue;
        }
        let rest = &text[at..];
        let name = ident_at(rest);
        let after = rest[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let Some(close) = after.find('}') else { continue };
        let body = &after[1..close];
        if body.contains('(') || body.contains('{') {
            continue; // methods or nested types: not a plain parameter struct
        }
        // `type a;`, `type *a, b[4];`: each name is the last identifier of its piece.
        let fields = body
            .split(';')
            .filter(|d| !d.trim().is_empty())
            .flat_map(|d| d.split(','))
            .map(|piece| {
                let piece = piece.split('[').next().unwrap().trim_end();
                let start = piece.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
                piece[start..].to_string()
            })
            .collect();
        found.push((name.to_string(), fields));
    }
    found
}

fn link(build: &cc::Build, objects: &[PathBuf], output: &Path, soname: &str) {
    let compiler = build.get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.arg("-shared").arg("-o").arg(output).arg(format!("-Wl,-soname,{soname}"));
    cmd.args(objects);
    cmd.args(["-lpthread", "-ldl"]);
    let status = cmd.status().unwrap_or_else(|e| panic!("running the C++ linker {:?}: {e}", compiler.path()));
    assert!(status.success(), "linking {} failed: {cmd:?}", output.display());
}
