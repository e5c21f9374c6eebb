//! End to end, as a user would: run the real `coa-generate` binary through bash pipes, then read
//! what it wrote with polars.
//!
//! The binaries are found next to this test's build directory (`target/<profile>/`); `make test`
//! builds them before running the tests.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use polars::prelude::*;

fn bin_dir() -> PathBuf {
    // target/<profile>/deps/e2e_tasks-<hash> -> target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Runs a bash pipeline with the stage binaries on PATH and `pipefail` set.
fn sh(dir: &Path, script: &str) -> Output {
    let bins = bin_dir();
    assert!(
        bins.join("coa-generate").exists(),
        "{} is missing: run `make test` (it builds the stage binaries before the tests)",
        bins.join("coa-generate").display()
    );
    let path = format!("{}:{}", bins.display(), std::env::var("PATH").unwrap_or_default());
    Command::new("bash")
        .args(["-c", &format!("set -euo pipefail\n{script}")])
        .current_dir(dir)
        .env("PATH", path)
        .output()
        .expect("bash runs")
}

fn ok(dir: &Path, script: &str) -> String {
    let out = sh(dir, script);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "`{script}` failed:\n{stderr}");
    stderr
}

fn fails(dir: &Path, script: &str) -> String {
    let out = sh(dir, script);
    assert!(!out.status.success(), "`{script}` should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read_parquet(path: &Path) -> DataFrame {
    ParquetReader::new(File::open(path).unwrap()).finish().unwrap()
}

fn strings(df: &DataFrame, col: &str) -> Vec<String> {
    df.column(col).unwrap().str().unwrap().into_iter().map(|s| s.unwrap_or_default().to_string()).collect()
}

#[test]
fn generated_suites_pipe_through_and_read_back_with_polars() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A pipe in the middle: the first process writes an IPC stream, the second re-imports it
    // (a `tasks` table imports as itself) and writes Parquet.
    let stderr = ok(
        d,
        "coa-generate tasks --suite multihop --n 60 --suite math --n 30 --suite code --n 30 --seed 5 \
           --corpus-out corpus.parquet --stats gen.json \
         | coa-generate tasks --import - -o tasks.parquet",
    );
    // The summary line of each stage is on stderr, and in --stats.
    let summary: serde_json::Value = serde_json::from_str(std::fs::read_to_string(d.join("gen.json")).unwrap().trim()).unwrap();
    assert_eq!(summary["rows_out"], 120);
    assert!(stderr.lines().filter(|l| l.starts_with("{\"stage\":\"coa-generate tasks\"")).count() == 2, "{stderr}");

    let tasks = read_parquet(&d.join("tasks.parquet"));
    assert_eq!(tasks.height(), 120);
    let suites = strings(&tasks, "suite");
    for (suite, n) in [("multihop", 60), ("math", 30), ("code", 30)] {
        assert_eq!(suites.iter().filter(|s| *s == suite).count(), n, "{suite}");
    }
    let ids = strings(&tasks, "task_id");
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "task ids are unique");

    // Multihop: 2-5 hops, a gold answer that is the title of a corpus page.
    let corpus = read_parquet(&d.join("corpus.parquet"));
    let titles: std::collections::HashSet<String> = strings(&corpus, "title").into_iter().collect();
    let kinds = strings(&corpus, "kind");
    assert!(kinds.iter().any(|k| k == "distractor") && kinds.iter().any(|k| k == "entity"));
    let multihop = tasks.clone().lazy_free_filter("multihop");
    let hops = multihop.column("hops").unwrap().i32().unwrap();
    assert!(hops.into_iter().all(|h| matches!(h, Some(2..=5))));
    let answers = multihop.column("answers").unwrap().list().unwrap();
    for a in answers.into_iter() {
        let a = a.expect("answers present");
        let first = a.str().unwrap().get(0).expect("at least one gold answer").to_string();
        assert!(titles.contains(&first), "answer {first} has no page");
    }
    // Code: tests to run; math: numeric answers.
    let code = tasks.clone().lazy_free_filter("code");
    assert!(code.column("test_code").unwrap().str().unwrap().into_iter().all(|t| t.is_some_and(|t| t.contains("assert"))));
    let math = tasks.lazy_free_filter("math");
    for a in math.column("answers").unwrap().list().unwrap().into_iter() {
        let first = a.unwrap().str().unwrap().get(0).unwrap().to_string();
        assert!(first.replace(['.', '-'], "").chars().all(|c| c.is_ascii_digit()), "math answer {first} is numeric");
    }
}

/// Rows of one suite (polars' lazy API is not compiled in; a mask does the job).
trait SuiteFilter {
    fn lazy_free_filter(self, suite: &str) -> DataFrame;
}
impl SuiteFilter for DataFrame {
    fn lazy_free_filter(self, suite: &str) -> DataFrame {
        let mask = self.column("suite").unwrap().str().unwrap().equal(suite);
        self.filter(&mask).unwrap()
    }
}

#[test]
fn same_seed_gives_byte_identical_files_and_provenance_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The same command twice: byte-identical tasks and corpus. Another seed: other tasks.
    let run = "coa-generate tasks --suite multihop --n 40 --suite code --n 10 --seed 9 --corpus-out c.parquet -o a.parquet 2>/dev/null";
    ok(d, &format!("mkdir r1 r2 && (cd r1 && {run}) && (cd r2 && {run})"));
    for f in ["a.parquet", "c.parquet"] {
        let (x, y) = (std::fs::read(d.join("r1").join(f)).unwrap(), std::fs::read(d.join("r2").join(f)).unwrap());
        assert!(!x.is_empty() && x == y, "{f} differs between two runs with the same seed");
    }
    // Where it went is not what it is: the same run under other file names, same bytes.
    ok(d, "mkdir r3 && cd r3 && coa-generate tasks --suite multihop --n 40 --suite code --n 10 --seed 9 --corpus-out corpus.parquet --output=tasks.parquet --stats s.json 2>/dev/null");
    assert_eq!(std::fs::read(d.join("r1/a.parquet")).unwrap(), std::fs::read(d.join("r3/tasks.parquet")).unwrap(), "the output path changed the bytes");
    assert_eq!(std::fs::read(d.join("r1/c.parquet")).unwrap(), std::fs::read(d.join("r3/corpus.parquet")).unwrap());
    ok(d, "coa-generate tasks --suite multihop --n 40 --suite code --n 10 --seed 10 -o other.parquet 2>/dev/null");
    assert_ne!(read_parquet(&d.join("r1/a.parquet")), read_parquet(&d.join("other.parquet")));
    ok(d, "coa-generate tasks --suite math --n 50 --seed 3 > x.ipc && coa-generate tasks --suite math --n 50 --seed 3 > y.ipc");
    assert_eq!(std::fs::read(d.join("x.ipc")).unwrap(), std::fs::read(d.join("y.ipc")).unwrap());

    // Provenance: stage, arguments and seed, in Parquet's key-value metadata.
    let mut reader = ParquetReader::new(File::open(d.join("r1/a.parquet")).unwrap());
    let meta = reader.get_metadata().unwrap().clone();
    let kv = meta.key_value_metadata().as_ref().expect("key-value metadata");
    let prov = kv.iter().find(|k| k.key == "coa.provenance").and_then(|k| k.value.clone()).expect("coa.provenance");
    let prov: serde_json::Value = serde_json::from_str(&prov).unwrap();
    assert_eq!(prov["stage"], "coa-generate tasks");
    assert_eq!(prov["seed"], 9);
    assert!(prov["args"].as_array().unwrap().iter().any(|a| a == "--suite"));
}

#[test]
fn importing_the_real_files_gives_the_expected_counts() {
    let dir = tempfile::tempdir().unwrap();
    for (file, n) in [("aime24.parquet", 30), ("math500.parquet", 500), ("livecodebench_v4.parquet", 100), ("nq_full.jsonl", 3610), ("HumanEval.jsonl.gz", 164)] {
        let Some(path) = coa_tasks::external::file_or_skip("importing_the_real_files_gives_the_expected_counts", file) else { continue };
        let out = dir.path().join(format!("{file}.out.parquet"));
        ok(dir.path(), &format!("coa-generate tasks --import {} -o {}", path.display(), out.display()));
        let all = read_parquet(&out);
        assert_eq!(all.height(), n, "{file}");
        // --first N: the file's first N tasks, in its order (make eval-benchmarks bounds itself so).
        let first = dir.path().join(format!("{file}.first.parquet"));
        ok(dir.path(), &format!("coa-generate tasks --import {} --first 7 -o {}", path.display(), first.display()));
        let first = read_parquet(&first);
        assert_eq!(first.height(), 7, "{file}");
        assert!(first.column("task_id").unwrap().equals(&all.head(Some(7)).column("task_id").unwrap().clone()), "{file}");
    }
}

#[test]
fn a_closed_pipe_ends_the_stage_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = ok(dir.path(), "coa-generate tasks --suite math --n 20000 --seed 1 | head -c 100 > /dev/null");
    assert!(!stderr.contains("error") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_input_gets_a_clear_error_and_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("weird.jsonl"), "{\"a\": 1, \"b\": 2}\n").unwrap();
    let e = fails(d, "coa-generate tasks --import weird.jsonl -o out.parquet");
    assert!(e.contains("weird.jsonl") && e.contains("a, b"), "{e}");
    assert!(!d.join("out.parquet").exists());
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 1, "a temporary file was left behind");

    let e = fails(d, "coa-generate tasks --import missing.parquet -o out.parquet");
    assert!(e.contains("missing.parquet"), "{e}");

    // A corpus table is not a tasks table: the error says which stage writes tasks.
    ok(d, "coa-generate tasks --suite multihop --n 5 --corpus-out corpus.parquet > /dev/null");
    let e = fails(d, "coa-generate tasks --import - < corpus.parquet");
    assert!(e.contains("corpus"), "{e}");

    let e = fails(d, "coa-generate tasks --suite poetry");
    assert!(e.contains("poetry") && e.contains("multihop"), "{e}");
    let e = fails(d, "coa-generate tasks --suite math --n 3 --n 4 --n 5");
    assert!(e.contains("--n"), "{e}");
    let e = fails(d, "coa-generate tasks --suite math --corpus-out c.parquet > /dev/null");
    assert!(e.contains("--corpus-out"), "{e}");
    let e = fails(d, "coa-generate tasks --suite math --first 3 > /dev/null");
    assert!(e.contains("--first") && e.contains("--import"), "{e}");
    let e = fails(d, "coa-generate tasks --suite math --import-split dev > /dev/null");
    assert!(e.contains("--import-split") && e.contains("--import"), "{e}");
    let e = fails(d, "coa-generate tasks --import x.parquet --first 0 > /dev/null");
    assert!(e.contains("--first"), "{e}");
}
