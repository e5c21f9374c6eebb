//! Helpers of the GPU tests (this crate's and coa-train-step's): the device to run on (the GPU, or
//! the emulated CUDA device where there is none), and seeded randomness that a failing run can
//! replay.

use crate::rng::Rng;
use crate::Gpu;

/// The device the GPU tests run on: the GPU where one is usable, else the emulated CUDA device
/// (the same kernels and host code on the CPU; a line says which and why). `COA_TEST_DEVICE=emu`
/// picks the emulated device even where a GPU exists, `COA_TEST_DEVICE=cuda` requires the GPU.
/// Returns `None` (after printing `<test>: skipped: ...`) only with `COA_TEST_DEVICE=cuda` and no
/// GPU. A device that is found but cannot be opened is a failure, not a skip.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    let say = |line: String| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
        println!("{line}");
    };
    let wanted = std::env::var("COA_TEST_DEVICE").unwrap_or_default();
    let emulated = |why: &str| {
        say(format!("{test}: on the emulated CUDA device ({why})"));
        Some(Gpu::emulated().unwrap_or_else(|e| panic!("{test}: the emulated CUDA device cannot be opened: {e}")))
    };
    match wanted.as_str() {
        "emu" => return emulated("COA_TEST_DEVICE=emu"),
        "" | "auto" | "cuda" => {}
        other => panic!("{test}: COA_TEST_DEVICE={other}: expected emu, cuda or auto"),
    }
    match crate::probe() {
        Ok(_) => Some(Gpu::new(0).unwrap_or_else(|e| panic!("{test}: GPU found but unusable: {e}"))),
        Err(e) if wanted == "cuda" => {
            say(format!("{test}: skipped: no CUDA device ({e})"));
            None
        }
        Err(e) => emulated(&format!("no CUDA device: {e}")),
    }
}

/// A generator seeded from `COA_TEST_SEED` if set, else fresh; the seed is printed so a failure
/// can be replayed.
pub fn seeded(test: &str) -> Rng {
    let seed = std::env::var("COA_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(Rng::fresh_seed);
    eprintln!("{test}: seed {seed} (replay with COA_TEST_SEED={seed})");
    println!("{test}: seed {seed}");
    Rng::new(seed)
}
