//! Helpers of the GPU tests (this crate's and coa-train-step's): a visible skip where there is no
//! GPU, and seeded randomness that a failing run can replay.

use crate::rng::Rng;
use crate::Gpu;

/// The GPU, or `None` after printing `<test>: skipped: no CUDA device (<why>)` to stdout and to the
/// real stderr (the test harness captures `eprintln!`). A GPU that probes fine but cannot be
/// opened is a failure, not a skip.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match crate::probe() {
        Err(e) => {
            let line = format!("{test}: skipped: no CUDA device ({e})");
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
            println!("{line}");
            None
        }
        Ok(_) => Some(Gpu::new(0).unwrap_or_else(|e| panic!("{test}: GPU found but unusable: {e}"))),
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
