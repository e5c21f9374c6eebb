//! The README's examples run as written, in order: every `sh` block in one shell in a fresh
//! directory, on the test build's binaries, so the page cannot drift from the stages again. A
//! block that needs what a test cannot give (a finished `make pipeline`, Python with polars) is
//! marked on the line before it with `<!-- readme-test: skip, REASON -->` and reported as skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// One fenced example: its language, first line number (1-based) and text, and why it is not
/// run, if it is marked so.
struct Block {
    lang: String,
    line: usize,
    text: String,
    skip: Option<String>,
}

/// The fenced blocks of a Markdown page that carry a language (a diagram's bare fence is not an
/// example).
fn blocks(page: &str) -> Vec<Block> {
    let lines: Vec<&str> = page.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        i += 1;
        let mut text = String::new();
        while i < lines.len() && !lines[i].starts_with("```") {
            text.push_str(lines[i]);
            text.push('\n');
            i += 1;
        }
        i += 1;
        if lang.trim().is_empty() {
            continue;
        }
        let marker = lines[..start].iter().rev().find(|l| !l.trim().is_empty()).and_then(|l| {
            l.trim().strip_prefix("<!-- readme-test: skip,").and_then(|r| r.strip_suffix("-->")).map(|r| r.trim().to_string())
        });
        out.push(Block { lang: lang.trim().to_string(), line: start + 1, text, skip: marker });
    }
    out
}

#[test]
fn the_readmes_examples_run_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let page = std::fs::read_to_string(root.join("README.md")).unwrap();
    let examples = blocks(&page);
    assert!(examples.iter().any(|b| b.skip.is_none()), "the README has no example left to run");
    let work = tempfile::tempdir().unwrap();
    // `make build` is the one command a block may run that the test replaces: its binaries are
    // the test build's, already on PATH.
    let mut script = String::from("set -euo pipefail\nmake() { echo \"readme test: 'make $*' not run (the test build's binaries are on PATH)\"; }\n");
    for b in &examples {
        match (&b.skip, b.lang.as_str()) {
            (Some(why), _) => eprintln!("the_readmes_examples_run_as_written: README line {}: {} block skipped: {why}", b.line, b.lang),
            (None, "sh" | "bash") => {
                script.push_str(&format!("echo '--- README line {}'\n", b.line));
                script.push_str(&b.text);
            }
            (None, lang) => panic!("README line {}: a {lang} block is neither run nor marked `<!-- readme-test: skip, REASON -->`", b.line),
        }
    }
    let path = format!("{}:{}", bin_dir().display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash").arg("-c").arg(&script).current_dir(work.path()).env("PATH", path).output().unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the README's examples failed (the last '--- README line' says which block):\n{log}");
    // What the hand pipe promises to leave behind.
    for file in ["tasks.parquet", "corpus.parquet", "kept.parquet", "tokens.parquet", "ckpt/model.safetensors", "scores.arrows", "ckpt_rl/config.json", "eval.json", "eval.parquet"] {
        assert!(work.path().join(file).exists(), "the README's hand pipe wrote no {file}:\n{log}");
    }
}

#[test]
fn skip_markers_are_read_and_bare_fences_are_not_examples() {
    let page = "text\n\n```\ndiagram\n```\n\n<!-- readme-test: skip, needs a run -->\n```sh\nmake pipeline\n```\n```sh\necho hi\n```\n";
    let b = blocks(page);
    assert_eq!(b.len(), 2);
    assert_eq!((b[0].line, b[0].skip.as_deref(), b[0].text.as_str()), (8, Some("needs a run"), "make pipeline\n"));
    assert_eq!((b[1].line, b[1].skip.as_deref()), (11, None));
}
