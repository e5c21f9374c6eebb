//! What a sandboxed run costs over starting python directly: `print(1)` N times each way.
//!
//! `cargo run --release -p coa-tools --example sandbox_overhead [N]`; prefix
//! `COA_SANDBOX_NAMESPACES=0` to measure the fallback without namespaces.

use std::time::Instant;

use coa_tools::{find_python, isolation, run_python, SandboxLimits};

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(50);
    let python = find_python()?;
    let limits = SandboxLimits::default();
    run_python("print(1)", None, &limits)?; // warm up: probe, page cache
    let t = Instant::now();
    for _ in 0..n {
        let out = std::process::Command::new(&python).args(["-s", "-B", "-c", "print(1)"]).output()?;
        assert!(out.status.success());
    }
    let bare = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    let t = Instant::now();
    for _ in 0..n {
        let r = run_python("print(1)", None, &limits)?;
        assert!(r.passed(), "{r:?}");
    }
    let sandboxed = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!("{}", isolation().describe());
    println!("python -c 'print(1)': {bare:.1} ms per run; sandboxed: {sandboxed:.1} ms per run ({n} runs each)");
    Ok(())
}
