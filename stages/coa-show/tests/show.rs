//! `coa-show` on tables written as the stages write them, and on inputs it must refuse.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Float32Array, Int32Array, ListBuilder, StringArray, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use coa_schemas::io::{self, InputProvenance, Provenance};

fn show(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coa-show")).args(args).stdin(Stdio::null()).output().unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "coa-show failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Three rows: numbers with a null, booleans, strings (one long, one with a newline), lists.
fn write_table(path: &Path) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("task_id", DataType::Utf8, false),
        Field::new("hops", DataType::Int32, true),
        Field::new("reward", DataType::Float32, false),
        Field::new("correct", DataType::Boolean, false),
        Field::new("answers", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), false),
    ]));
    let mut answers = ListBuilder::new(StringBuilder::new());
    for row in [&["a", "b"][..], &[], &["c"]] {
        for a in row {
            answers.values().append_value(a);
        }
        answers.append(true);
    }
    let long = "x".repeat(300);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec!["t-1", "t-2\nsecond line", long.as_str()])),
        Arc::new(Int32Array::from(vec![Some(2), None, Some(5)])),
        Arc::new(Float32Array::from(vec![1.0, -1.0, 0.5])),
        Arc::new(BooleanArray::from(vec![true, false, true])),
        Arc::new(answers.finish()),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    let provenance = Provenance {
        stage: "coa-score".into(),
        version: "0.1.0".into(),
        args: vec!["--tasks".into(), "tasks.parquet".into(), "--where".into(), "suite = 'math'".into()],
        seed: Some(7),
        inputs: vec![InputProvenance { source: "tasks.parquet".into(), table: Some("tasks".into()), provenance: None }],
    };
    io::write_all(Some(path), None, &schema, &[batch], &provenance).unwrap();
}

#[test]
fn shows_header_provenance_summaries_and_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_table(&path);
    let out = stdout(&show(&[path.to_str().unwrap()]));
    assert!(out.contains("  format   Parquet\n"), "{out}");
    assert!(out.contains("  rows     3\n"), "{out}");
    assert!(out.contains("written by  coa-score 0.1.0: --tasks tasks.parquet --where 'suite = '\\''math'\\''' (seed 7)"), "{out}");
    assert!(out.contains("<- tasks.parquet (tasks)"), "{out}");
    let line = |name: &str| out.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_else(|| panic!("no {name} line in {out}")).to_string();
    assert!(line("hops").ends_with("1 null; min 2  mean 3.500  max 5"), "{}", line("hops"));
    assert!(line("reward").ends_with("min -1  mean 0.1667  max 1"), "{}", line("reward"));
    assert!(line("correct").ends_with("2 true (66.7%)"), "{}", line("correct"));
    assert!(line("task_id").contains("3 distinct; chars min 3"), "{}", line("task_id"));
    assert!(line("answers").ends_with("length min 0  mean 1  max 2"), "{}", line("answers"));
    // Rows: one field a line, newlines escaped, a long cell cut with its length.
    assert!(out.contains("first 3 of 3 rows\n  [0]\n"), "{out}");
    assert!(out.contains("t-2\\nsecond line"), "{out}");
    assert!(out.contains("... (300 chars)"), "{out}");
    assert!(out.contains("    hops     null\n"), "{out}");

    // --full: whole cells, their lines kept and indented under the value column.
    let out = stdout(&show(&[path.to_str().unwrap(), "--full", "--columns", "task_id", "--no-summary"]));
    assert!(out.contains("    task_id  t-2\n             second line\n"), "{out}");
    assert!(out.contains(&"x".repeat(300)), "{out}");
}

#[test]
fn picks_columns_and_reads_a_stream_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("t.parquet");
    write_table(&parquet);
    // The same table as an Arrow IPC stream (what a pipe carries), fed on stdin.
    let stream = dir.path().join("t.arrows");
    let (schema, batches) = {
        let reader = io::open_any(Some(&parquet)).unwrap();
        let schema = reader.schema();
        (schema, reader.collect::<anyhow::Result<Vec<_>>>().unwrap())
    };
    io::write_all(Some(&stream), None, &schema, &batches, &Provenance::default()).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_coa-show"))
        .args(["--columns", "correct,task_id", "-n", "1"])
        .stdin(std::fs::File::open(&stream).unwrap())
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(out.starts_with("stdin\n  format   Arrow IPC stream\n"), "{out}");
    assert!(out.contains("columns (2 of 5)\n  correct"), "{out}");
    assert!(out.contains("first 1 of 3 rows"), "{out}");
    assert!(!out.contains("hops"), "{out}");
}

#[test]
fn refuses_what_is_not_a_table_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello").unwrap();
    let o = show(&[text.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("notes.txt") && err.contains("not Arrow or Parquet"), "{err}");
    assert!(o.stdout.is_empty());

    let o = show(&[dir.path().join("missing.parquet").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.parquet"));

    let table = dir.path().join("t.parquet");
    write_table(&table);
    let o = show(&[table.to_str().unwrap(), "--columns", "hops,nope"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--columns") && err.contains("`nope`") && err.contains("task_id, hops"), "{err}");

    let o = show(&[table.to_str().unwrap(), "--head", "many"]);
    assert_eq!(o.status.code(), Some(2), "clap refuses a bad number");
}
