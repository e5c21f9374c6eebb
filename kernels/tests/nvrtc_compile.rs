//! CI check without a GPU: every `kernels/*.cu` compiles to PTX for sm_90 with NVRTC, and every
//! expected entry point is in the PTX.
//!
//! NVRTC comes from the pinned pip wheels (`make cuda-deps`, pipelines/cuda.mk). When it cannot be
//! found the test FAILS under `CI=true` (CI installs it, so a missing NVRTC there is a broken
//! setup) and under `COA_TEST_DEVICE=cuda` (a GPU run), and elsewhere prints a visible `skipped:`
//! line and returns.

use coa_kernels::compile::Compiler;
use coa_kernels::ops;
use coa_kernels::testing::TestDevice;

fn compiler_or_skip(test: &str) -> Option<Compiler> {
    match Compiler::new() {
        Ok(c) => Some(c),
        Err(e) => {
            let ci = std::env::var("CI").map(|v| v == "true" || v == "1").unwrap_or(false);
            if ci {
                panic!("{test}: NVRTC is required in CI (run `make cuda-deps`): {e}");
            }
            if TestDevice::from_env() == TestDevice::Cuda {
                panic!("{test}: NVRTC is required with COA_TEST_DEVICE=cuda: {e}");
            }
            let line = format!("{test}: skipped: NVRTC not found ({e})");
            // Written to the real stderr (the test harness captures eprintln!), and to stdout.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
            println!("{line}");
            None
        }
    }
}

#[test]
fn every_cu_file_is_listed() {
    // The build-time path, or `kernels/` under the current directory (a binary carried to the
    // GPU machine runs from the repository root there).
    let built = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = if built.join("attention.cu").is_file() { built } else { std::path::PathBuf::from("kernels") };
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "cu").then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = ops::SOURCES.iter().map(|s| s.name.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "kernels/*.cu and ops::SOURCES differ");
    for s in ops::SOURCES {
        assert!(s.expanded().contains("typedef __nv_bfloat16 bf16;"), "{} does not include coa_common.cuh", s.name);
        for e in s.entry_points {
            assert!(s.text.contains(&format!("void {e}(")) || s.text.contains(&format!("void __launch_bounds__(128) {e}(")) || s.text.contains(&format!("{e}(")),
                "{}: entry point {e} not in the source", s.name);
        }
    }
}

#[test]
fn all_kernels_compile_to_ptx_for_sm90() {
    let Some(c) = compiler_or_skip("all_kernels_compile_to_ptx_for_sm90") else { return };
    eprintln!("NVRTC {}.{} from {}; headers from {}", c.nvrtc_version.0, c.nvrtc_version.1, c.nvrtc_path, c.include_dir.display());
    // The cu13 bindings need NVRTC 13.x. The minor version is reported, not asserted: a driver
    // older than the NVRTC refuses its PTX at module load, which the kernel tests then show with
    // both versions (the pinned wheel here is 13.0, for the GPU machines' driver 580).
    println!("NVRTC {}.{}", c.nvrtc_version.0, c.nvrtc_version.1);
    assert_eq!(c.nvrtc_version.0, 13, "NVRTC {}.{} loaded; the cu13 bindings need NVRTC 13.x (pip nvidia-cuda-nvrtc==13.0.*)", c.nvrtc_version.0, c.nvrtc_version.1);
    // Compile without the disk cache so this really runs NVRTC.
    let c = Compiler { cache_dir: None, ..c };
    let mut failures = Vec::new();
    for s in ops::SOURCES {
        match c.compile(s, "sm_90") {
            Ok(out) => {
                assert!(!out.from_cache);
                assert!(out.ptx.contains(".target sm_90"), "{}: PTX not for sm_90", s.name);
                for e in s.entry_points {
                    assert!(out.ptx.contains(&format!(".entry {e}(")), "{}: entry point {e} missing from the PTX", s.name);
                }
                eprintln!("compiled kernels/{}.cu: {} bytes of PTX, {} entry points", s.name, out.ptx.len(), s.entry_points.len());
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "NVRTC failures:\n{}", failures.join("\n\n"));
}

#[test]
fn ptx_cache_round_trip() {
    let Some(c) = compiler_or_skip("ptx_cache_round_trip") else { return };
    let dir = std::env::temp_dir().join(format!("coa-ptx-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let c = Compiler { cache_dir: Some(dir.clone()), ..c };
    let first = c.compile(&coa_kernels::ops::adamw::SOURCE, "sm_90").unwrap();
    assert!(!first.from_cache);
    let file = first.cache_file.clone().expect("cache file written");
    assert!(file.starts_with(&dir));
    let second = c.compile(&coa_kernels::ops::adamw::SOURCE, "sm_90").unwrap();
    assert!(second.from_cache, "second compile did not hit the cache");
    assert_eq!(first.ptx, second.ptx);
    // Another architecture is another key.
    let other = c.compile(&coa_kernels::ops::adamw::SOURCE, "sm_80").unwrap();
    assert!(!other.from_cache);
    assert_ne!(other.cache_file, first.cache_file);
    // A corrupted cache file is recompiled, not used.
    std::fs::write(&file, "garbage").unwrap();
    let third = c.compile(&coa_kernels::ops::adamw::SOURCE, "sm_90").unwrap();
    assert!(!third.from_cache);
    assert_eq!(third.ptx, first.ptx);
    // No temporary files are left behind.
    for e in std::fs::read_dir(&dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(n.ends_with(".ptx") && !n.starts_with('.'), "leftover {n}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
