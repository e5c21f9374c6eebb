//! End to end: tasks -> teacher MAS -> extract -> filter -> convert, every stage a real binary,
//! all piped, then the CoA text read back with polars as a user would.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use polars::prelude::*;

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn sh(dir: &Path, script: &str) -> (bool, String) {
    for b in ["coa-generate", "coa-extract", "coa-filter", "coa-convert"] {
        assert!(bin_dir().join(b).exists(), "{b} is missing: run `make test` (it builds the stage binaries first)");
    }
    let path = format!("{}:{}", bin_dir().display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash")
        .args(["-c", &format!("set -euo pipefail\n{script}")])
        .current_dir(dir)
        .env("PATH", path)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn the_distillation_stages_pipe_into_coa_text() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ok, stderr) = sh(
        d,
        "coa-generate tasks --suite multihop --n 120 --seed 4 --corpus-out corpus.parquet \
         | coa-generate mas --corpus corpus.parquet --seed 4 \
         | coa-extract \
         | coa-filter --keep-dropped dropped.parquet --stats filter.json \
         | coa-convert -o coa_text.parquet",
    );
    assert!(ok, "pipeline failed:\n{stderr}");

    let text = ParquetReader::new(File::open(d.join("coa_text.parquet")).unwrap()).finish().unwrap();
    let dropped = ParquetReader::new(File::open(d.join("dropped.parquet")).unwrap()).finish().unwrap();
    let stats: serde_json::Value = serde_json::from_str(std::fs::read_to_string(d.join("filter.json")).unwrap().trim()).unwrap();
    // Every input row is accounted for: kept (plus up-sampled copies) or dropped with a reason.
    let dup: u64 = stats["rules"].as_array().unwrap().iter().map(|r| r["duplicated"].as_u64().unwrap()).sum();
    assert_eq!(stats["rows_in"], 120);
    assert_eq!(text.height() as u64 + dropped.height() as u64, 120 + dup, "{stats}");
    assert!(text.height() > 0 && dropped.height() > 0, "{stats}");
    assert!(dropped.column("drop_reason").unwrap().str().unwrap().into_iter().all(|r| r.is_some_and(|r| !r.is_empty())));

    // The CoA text is in AFM tags, and each observation span slices exactly one observation block.
    let texts = text.column("text").unwrap().str().unwrap();
    let spans = text.column("observation_spans").unwrap().list().unwrap();
    for (t, s) in texts.into_iter().zip(spans.into_iter()) {
        let t = t.unwrap();
        assert!(t.contains("<plan>") && t.contains("<web_search>") && t.contains("</answer>"), "{t}");
        let chars: Vec<char> = t.chars().collect();
        let s = s.unwrap();
        let s = s.struct_().unwrap();
        let starts = s.field_by_name("start").unwrap();
        let ends = s.field_by_name("end").unwrap();
        let (starts, ends) = (starts.i32().unwrap(), ends.i32().unwrap());
        assert!(starts.len() > 0);
        for (a, b) in starts.into_iter().zip(ends.into_iter()) {
            let block: String = chars[a.unwrap() as usize..b.unwrap() as usize].iter().collect();
            assert!(block.starts_with("<observation>") && block.ends_with("</observation>"), "{block}");
        }
    }
}
