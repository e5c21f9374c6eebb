//! f32 GEMM throughput of `ops::gemm` (the matmul of every training step) on given shapes:
//!
//!     cargo run --release -p coa-model --example gemm_bench -- [--threads N] [--reps R] MxNxK[:tt] ...
//!
//! `:tt` suffixes say which operand is stored transposed (`:nt` = b transposed, the linear
//! forward; `:tn` = a transposed, the weight gradient). Prints one JSON line per shape: the
//! shape, the register kernel (`avx512`, `avx2`; `COA_CPU_KERNEL=avx2` compares the two on one
//! CPU), the best of R repetitions in seconds and GFLOP/s (2·M·N·K per product).
//! `--matrixmultiply`: the `matrixmultiply` crate's sgemm instead, single-threaded (what
//! `ops::gemm` ran on before its own kernel; compare with `--threads 1`).
//! `bench/train_bench.py` runs it beside `torch.mm` for the machine's f32 peak.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use coa_model::ops;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    let (mut threads, mut reps, mut shapes, mut mm) = (None, 5usize, Vec::new(), false);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => threads = Some(args.next().context("--threads needs a number")?.parse::<usize>().context("--threads")?),
            "--matrixmultiply" => mm = true,
            "--reps" => reps = args.next().context("--reps needs a number")?.parse().context("--reps")?,
            s => shapes.push(parse_shape(s)?),
        }
    }
    if shapes.is_empty() {
        bail!("give at least one shape MxNxK[:nn|nt|tn|tt]");
    }
    if let Some(t) = threads {
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global()?;
    }
    for (m, n, k, a_t, b_t, name) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5).collect();
        let mut c = vec![0f32; m * n];
        let product = |c: &mut [f32]| {
            if mm {
                let (rsa, csa) = if a_t { (1, m as isize) } else { (k as isize, 1) };
                let (rsb, csb) = if b_t { (1, k as isize) } else { (n as isize, 1) };
                // SAFETY: the strides address a [m,k], b [k,n], c [m,n] in bounds.
                unsafe { matrixmultiply::sgemm(m, k, n, 1.0, a.as_ptr(), rsa, csa, b.as_ptr(), rsb, csb, 0.0, c.as_mut_ptr(), n as isize, 1) };
            } else {
                ops::gemm(ops::Gemm::new(m, n, k).transposed(a_t, b_t), &a, &b, c);
            }
        };
        product(&mut c); // warm-up
        let best = (0..reps)
            .map(|_| {
                let t0 = Instant::now();
                product(&mut c);
                t0.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        let gflops = 2.0 * (m * n * k) as f64 / best / 1e9;
        println!(
            "{{\"shape\": \"{name}\", \"engine\": \"{}\", \"kernel\": \"{}\", \"threads\": {}, \"seconds\": {best:.6}, \"gflops\": {gflops:.2}}}",
            if mm { "matrixmultiply" } else { "ops::gemm" },
            if mm { "matrixmultiply" } else { ops::gemm_kernel() },
            if mm { 1 } else { rayon::current_num_threads() }
        );
    }
    Ok(())
}

fn parse_shape(s: &str) -> Result<(usize, usize, usize, bool, bool, String)> {
    let (dims, layout) = s.split_once(':').unwrap_or((s, "nn"));
    let d: Vec<usize> = dims.split('x').map(|x| x.parse::<usize>()).collect::<Result<_, _>>().with_context(|| format!("shape {s}: expected MxNxK"))?;
    let (a_t, b_t) = match layout {
        "nn" => (false, false),
        "nt" => (false, true),
        "tn" => (true, false),
        "tt" => (true, true),
        _ => bail!("shape {s}: layout must be nn, nt, tn or tt"),
    };
    match d[..] {
        [m, n, k] if m > 0 && n > 0 && k > 0 => Ok((m, n, k, a_t, b_t, s.to_string())),
        _ => bail!("shape {s}: expected three positive sizes MxNxK"),
    }
}
