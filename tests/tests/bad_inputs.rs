//! The bad-input matrix: every stage command × every kind of bad input (empty, truncated,
//! random bytes, the wrong table, a column of the wrong type, a missing column, nulls where the
//! table allows none, an output path that is a directory, invalid flag values). Each case must
//! exit non-zero, print one clear error naming what is wrong, never panic, and leave no file
//! anywhere: not in its working directory, not beside its inputs, not in `/tmp` or `/`.
//!
//! The valid inputs are made once by the real pipeline (tiny sizes); the bad ones are derived
//! from them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use arrow::array::{new_null_array, Array, ArrayRef, AsArray, Int64Array, ListArray, StringArray, UInt32Array, UInt8Array};
use arrow::compute::take;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use coa_schemas::io::{self, Provenance};
use coa_schemas::tables::{self, Table};

fn bin_dir() -> PathBuf {
    // target/<profile>/deps/bad_inputs-<hash> -> target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Runs a stage binary (`coa-generate tasks ...` as separate words) in `dir`; with its pid.
fn stage(dir: &Path, args: &[&str]) -> (std::process::Output, u32) {
    let bin = bin_dir().join(args[0]);
    assert!(bin.exists(), "{} is missing: run `make test` (it builds the stage binaries before the tests)", bin.display());
    let child = Command::new(bin)
        .args(&args[1..])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the stage runs");
    let pid = child.id();
    (child.wait_with_output().unwrap(), pid)
}

/// The valid inputs of every stage, made once by the pipeline.
struct Fixtures {
    _dir: tempfile::TempDir,
    dir: PathBuf,
}

fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        let steps = coa_e2e::fixture_steps("3");
        for args in &steps {
            let (out, _) = stage(&d, args);
            assert!(out.status.success(), "{args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        Fixtures { _dir: tmp, dir: d }
    })
}

impl Fixtures {
    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn read(&self, name: &str) -> (Arc<Schema>, Vec<RecordBatch>) {
        let r = io::open_any(Some(&self.dir.join(name))).unwrap();
        let schema = r.schema();
        (schema, r.collect::<anyhow::Result<Vec<_>>>().unwrap())
    }
}

fn provenance() -> Provenance {
    Provenance { stage: "bad-input matrix".into(), version: "0".into(), ..Default::default() }
}

/// Writes `batches` with `schema` (its metadata kept: the file still names its table).
fn write(path: &Path, schema: Arc<Schema>, batches: &[RecordBatch]) {
    io::write_all(Some(path), None, &schema, batches, &provenance()).unwrap();
}

/// `batches` with column `name` transformed by `f` (which also gives the new field).
fn map_column(schema: &Schema, batches: &[RecordBatch], name: &str, f: impl Fn(&ArrayRef, &Field) -> Option<(ArrayRef, Field)>) -> (Arc<Schema>, Vec<RecordBatch>) {
    let idx = schema.index_of(name).unwrap();
    let mut fields: Vec<Option<Field>> = schema.fields().iter().map(|f| Some(f.as_ref().clone())).collect();
    let out: Vec<RecordBatch> = batches
        .iter()
        .map(|b| {
            let mut cols: Vec<Option<ArrayRef>> = b.columns().iter().cloned().map(Some).collect();
            match f(b.column(idx), schema.field(idx)) {
                Some((col, field)) => {
                    cols[idx] = Some(col);
                    fields[idx] = Some(field);
                }
                None => {
                    cols[idx] = None;
                    fields[idx] = None;
                }
            }
            let schema = Schema::new(fields.iter().flatten().cloned().collect::<Vec<_>>()).with_metadata(schema.metadata().clone());
            RecordBatch::try_new(Arc::new(schema), cols.into_iter().flatten().collect()).unwrap()
        })
        .collect();
    let schema = out.first().map(|b| b.schema()).unwrap();
    (schema, out)
}

/// The bad variants of one table file, written into `dir`, with the column each one breaks.
struct Variants {
    wrong_type: (String, String),
    missing: (String, String),
    nulls: (String, String),
    truncated: String,
}

fn variants(fx: &Fixtures, file: &str, table: &'static Table, dir: &Path) -> Variants {
    let (schema, batches) = fx.read(file);
    // The first column that may not be null is the one each variant breaks.
    let col = table.columns.iter().find(|c| !c.nullable).unwrap().name;
    let (s, b) = map_column(&schema, &batches, col, |a, f| {
        let (array, dtype): (ArrayRef, DataType) = if *a.data_type() == DataType::Utf8 {
            (Arc::new(Int64Array::from(vec![7i64; a.len()])), DataType::Int64)
        } else {
            (Arc::new(StringArray::from(vec!["seven"; a.len()])), DataType::Utf8)
        };
        Some((array, Field::new(f.name(), dtype, f.is_nullable())))
    });
    let wrong_type = dir.join(format!("wrong_type.{file}"));
    write(&wrong_type, s, &b);
    let (s, b) = map_column(&schema, &batches, col, |_, _| None);
    let missing = dir.join(format!("missing.{file}"));
    write(&missing, s, &b);
    let (s, b) = map_column(&schema, &batches, col, |a, f| {
        // The first row null, the others as they were.
        let idx = UInt32Array::from((0..a.len() as u32).map(|i| (i > 0).then_some(i)).collect::<Vec<_>>());
        let nulled = if a.is_empty() { new_null_array(a.data_type(), 0) } else { take(a.as_ref(), &idx, None).unwrap() };
        Some((nulled, f.clone().with_nullable(true)))
    });
    let nulls = dir.join(format!("nulls.{file}"));
    write(&nulls, s, &b);
    let bytes = std::fs::read(fx.dir.join(file)).unwrap();
    let truncated = dir.join(format!("truncated.{file}"));
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let show = |p: PathBuf| p.display().to_string();
    Variants { wrong_type: (show(wrong_type), col.into()), missing: (show(missing), col.into()), nulls: (show(nulls), col.into()), truncated: show(truncated) }
}

/// Entries of `dir` that are temporary outputs of process `pid`: `.NAME.PID.tmp`,
/// `.NAME.PID.tmp.png`, a checkpoint's `.NAME.tmp-PID` (other processes on the machine may
/// have their own).
fn leftovers(dir: &Path, pid: u32) -> Vec<String> {
    let (a, b) = (format!(".{pid}.tmp"), format!(".tmp-{pid}"));
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.contains(&a) || n.ends_with(&b)).collect())
        .unwrap_or_default()
}

/// Every file under `dir`, recursively.
fn all_files(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            out.insert(e.path());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}

/// One bad case: `args` (with `{WORK}` standing for a fresh working directory) must fail with
/// a message containing every one of `expect`, and leave nothing behind.
fn refuses(case: &str, args: &[String], expect: &[&str]) {
    let fx = fixtures();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    std::fs::create_dir(w.join("a_dir")).unwrap();
    let args: Vec<String> = args.iter().map(|a| a.replace("{WORK}", &w.display().to_string())).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let fixtures_before = all_files(&fx.dir);
    let work_before = all_files(w);
    let (out, pid) = stage(w, &words);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown = format!("{case}: `{}`", words.join(" "));
    assert!(!out.status.success(), "{shown} succeeded:\n{stderr}");
    // 1: the stage refused; 2: the command line did (clap). Never a signal.
    assert!(matches!(out.status.code(), Some(1 | 2)), "{shown}: exit status {:?}:\n{stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{shown} panicked:\n{stderr}");
    for e in expect {
        assert!(stderr.contains(e), "{shown}: the error does not say `{e}`:\n{stderr}");
    }
    assert_eq!(all_files(w), work_before, "{shown} left files in its working directory");
    assert_eq!(all_files(&fx.dir), fixtures_before, "{shown} left files beside its inputs");
    for dir in [Path::new("/"), &std::env::temp_dir()] {
        assert_eq!(leftovers(dir, pid), Vec::<String>::new(), "{shown} left files in {}", dir.display());
    }
}

fn s(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// The table-input cases of a stage whose table input is the flag `input_flag` (`-i` or another):
/// `command` holds `{IN}` where the input goes.
fn table_cases(command: &[&str], file: &str, table: &'static Table, wrong_table_file: &str) {
    let fx = fixtures();
    let vdir = tempfile::tempdir().unwrap();
    let v = variants(fx, file, table, vdir.path());
    std::fs::write(vdir.path().join("empty"), b"").unwrap();
    let random: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(vdir.path().join("random"), &random).unwrap();
    let with = |input: &str| -> Vec<String> { command.iter().map(|w| w.replace("{IN}", input)).collect() };
    let p = |n: &str| vdir.path().join(n).display().to_string();
    let wrong = fx.path(wrong_table_file);
    let wrong_name = wrong_table_file.trim_end_matches(".parquet");
    refuses("empty input", &with(&p("empty")), &["input is empty", "written by"]);
    refuses("truncated input", &with(&v.truncated), &["truncated or corrupt"]);
    refuses("random bytes", &with(&p("random")), &["is not Arrow or Parquet"]);
    refuses("the wrong table", &with(&wrong), &[&format!("holds the `{wrong_name}` table, expected the `{}` table", table.name), table.produced_by]);
    refuses("a column of the wrong type", &with(&v.wrong_type.0), &[&format!("column `{}` has type", v.wrong_type.1), table.produced_by]);
    refuses("a missing column", &with(&v.missing.0), &[&format!("column `{}` is missing", v.missing.1), table.produced_by]);
    refuses("nulls in a non-nullable column", &with(&v.nulls.0), &[&format!("column `{}` holds 1 null value(s)", v.nulls.1), &format!("written by `{}`", table.produced_by)]);
}

/// Output paths that are directories: `command` holds `{OUT}` for each output flag in turn.
fn directory_outputs(command: &[&str], flags: &[&str]) {
    for flag in flags {
        let mut args = s(command);
        args.push(flag.to_string());
        args.push("{WORK}/a_dir".into());
        refuses(&format!("{flag} names a directory"), &args, &[flag, "is a directory"]);
    }
}

#[test]
fn coa_generate_tasks() {
    let fx = fixtures();
    let cmd = ["coa-generate", "tasks", "--suite", "multihop", "--n", "2"];
    directory_outputs(&cmd, &["-o", "--corpus-out", "--stats"]);
    refuses("--corpus-out and -o the same file", &s(&["coa-generate", "tasks", "--suite", "multihop", "--n", "2", "-o", "x.parquet", "--corpus-out", "./x.parquet"]), &["same file as -o"]);
    refuses("a negative count", &s(&["coa-generate", "tasks", "--suite", "math", "--n", "-5"]), &["--n", "`-5`: expected a whole number of at least 1"]);
    refuses("a zero count", &s(&["coa-generate", "tasks", "--suite", "math", "--n", "0"]), &["--n", "at least 1"]);
    refuses("four billion tasks", &s(&["coa-generate", "tasks", "--suite", "math", "--n", "4000000000"]), &["--n", "`4000000000`: expected at most 1000000 tasks a suite"]);
    let vdir = tempfile::tempdir().unwrap();
    let empty = vdir.path().join("empty.jsonl");
    std::fs::write(&empty, b"").unwrap();
    let random = vdir.path().join("random.parquet");
    std::fs::write(&random, b"PAR1\x00\x01garbage").unwrap();
    for (case, file) in [("an empty task file", empty.display().to_string()), ("a corrupt Parquet task file", random.display().to_string()), ("the wrong table", fx.path("corpus.parquet"))] {
        refuses(case, &s(&["coa-generate", "tasks", "--import", &file, "-o", "out.parquet"]), &[&file]);
    }
}

#[test]
fn coa_generate_mas() {
    let fx = fixtures();
    let corpus = fx.path("corpus.parquet");
    table_cases(&["coa-generate", "mas", "-i", "{IN}", "--corpus", &corpus, "-o", "out.parquet"], "tasks.parquet", &tables::TASKS, "corpus.parquet");
    directory_outputs(&["coa-generate", "mas", "-i", &fx.path("tasks.parquet"), "--corpus", &corpus], &["-o", "--stats"]);
    refuses("--code-timeout 0", &s(&["coa-generate", "mas", "-i", &fx.path("tasks.parquet"), "--code-timeout", "0"]), &["--code-timeout", "expected a positive number of seconds"]);
    refuses("--code-timeout 1e300", &s(&["coa-generate", "mas", "-i", &fx.path("tasks.parquet"), "--code-timeout", "1e300"]), &["--code-timeout", "at most 86400"]);
    refuses("--timeout 1e300", &s(&["coa-generate", "mas", "-i", &fx.path("tasks.parquet"), "--backend", "openai", "--timeout", "1e300"]), &["--timeout", "at most 86400"]);
    refuses("a negative concurrency", &s(&["coa-generate", "mas", "-i", &fx.path("tasks.parquet"), "--concurrency", "-2"]), &["--concurrency", "`-2`"]);
}

#[test]
fn coa_generate_policy() {
    let fx = fixtures();
    let (ckpt, corpus) = (fx.path("ckpt"), fx.path("corpus.parquet"));
    let cmd = ["coa-generate", "policy", "--checkpoint", &ckpt, "--corpus", &corpus, "--n", "1", "--max-response-tokens", "8", "-i", "{IN}", "-o", "out.parquet"];
    table_cases(&cmd, "tasks.parquet", &tables::TASKS, "tokens.parquet");
    directory_outputs(&["coa-generate", "policy", "--checkpoint", &ckpt, "--corpus", &corpus, "-i", &fx.path("tasks.parquet")], &["-o", "--stats"]);
    refuses("a negative sample count", &s(&["coa-generate", "policy", "--checkpoint", &ckpt, "-i", &fx.path("tasks.parquet"), "--n", "-5"]), &["--n", "`-5`: expected a whole number of at least 1"]);
    refuses("a checkpoint that is not one", &s(&["coa-generate", "policy", "--checkpoint", &fx.path("tok.json"), "-i", &fx.path("tasks.parquet")]), &["tok.json"]);
    refuses("an unknown weight format", &s(&["coa-generate", "policy", "--checkpoint", &ckpt, "-i", &fx.path("tasks.parquet"), "--decode-weights", "fp8"]), &["--decode-weights", "fp8", "bf16"]);
    refuses("an int8 KV cache", &s(&["coa-generate", "policy", "--checkpoint", &ckpt, "-i", &fx.path("tasks.parquet"), "--kv-cache", "int8"]), &["--kv-cache", "int8", "f32 or bf16"]);
}

#[test]
fn coa_extract() {
    let fx = fixtures();
    table_cases(&["coa-extract", "-i", "{IN}", "-o", "out.parquet"], "mas_runs.parquet", &tables::MAS_RUNS, "tasks.parquet");
    directory_outputs(&["coa-extract", "-i", &fx.path("mas_runs.parquet")], &["-o", "--skip-bad", "--stats"]);
}

#[test]
fn coa_filter() {
    let fx = fixtures();
    // coa-filter reads any table, and holds a table named in the file to that table's schema.
    let vdir = tempfile::tempdir().unwrap();
    let v = variants(fx, "trajectories.parquet", &tables::TRAJECTORIES, vdir.path());
    let t = &tables::TRAJECTORIES;
    std::fs::write(vdir.path().join("empty"), b"").unwrap();
    let empty = vdir.path().join("empty").display().to_string();
    refuses("empty input", &s(&["coa-filter", "-i", &empty, "-o", "out.parquet"]), &["input is empty"]);
    refuses("truncated input", &s(&["coa-filter", "-i", &v.truncated, "-o", "out.parquet"]), &["truncated or corrupt"]);
    refuses("random bytes", &s(&["coa-filter", "-i", "/bin/sh", "-o", "out.parquet"]), &["is not Arrow or Parquet"]);
    refuses("a column of the wrong type", &s(&["coa-filter", "-i", &v.wrong_type.0, "-o", "out.parquet"]), &["has type", t.produced_by]);
    refuses("a missing column", &s(&["coa-filter", "-i", &v.missing.0, "-o", "out.parquet"]), &["is missing", t.produced_by]);
    for rules in ["auto", "none"] {
        refuses("nulls in a non-nullable column", &s(&["coa-filter", "--rules", rules, "-i", &v.nulls.0, "-o", "out.parquet"]), &["holds 1 null value(s)", "written by `coa-extract`"]);
    }
    refuses("distillation rules on another table", &s(&["coa-filter", "--rules", "distill", "-i", &fx.path("tasks.parquet"), "-o", "out.parquet"]), &["trajectories"]);
    directory_outputs(&["coa-filter", "-i", &fx.path("trajectories.parquet")], &["-o", "--keep-dropped", "--stats"]);
    let input = fx.path("trajectories.parquet");
    refuses("--where with trailing text", &s(&["coa-filter", "-i", &input, "--where", "hops > 100; garbage", "-o", "out.parquet"]), &["--where `hops > 100; garbage`", "unexpected `;`"]);
    refuses("--where with a trailing word", &s(&["coa-filter", "-i", &input, "--where", "hops > 100 garbage", "-o", "out.parquet"]), &["unexpected `garbage`"]);
    refuses("a fraction above 1", &s(&["coa-filter", "-i", &input, "--no-reflection-keep", "1.5"]), &["--no-reflection-keep", "expected a fraction between 0 and 1"]);
    refuses("a negative hop count", &s(&["coa-filter", "-i", &input, "--min-hops", "-3"]), &["--min-hops", "`-3`: expected a whole number (0 or more)"]);
}

#[test]
fn coa_convert() {
    let fx = fixtures();
    table_cases(&["coa-convert", "-i", "{IN}", "-o", "out.parquet"], "trajectories.parquet", &tables::TRAJECTORIES, "mas_runs.parquet");
    directory_outputs(&["coa-convert", "-i", &fx.path("trajectories.parquet")], &["-o", "--skip-bad", "--stats"]);
    directory_outputs(&["coa-convert", "--to", "alpaca-json", "-i", &fx.path("trajectories.parquet")], &["-o"]);
}

#[test]
fn coa_tokenize() {
    let fx = fixtures();
    let tok = fx.path("tok.json");
    table_cases(&["coa-tokenize", "--tokenizer", &tok, "-i", "{IN}", "-o", "out.parquet"], "coa_text.parquet", &tables::COA_TEXT, "trajectories.parquet");
    let input = fx.path("coa_text.parquet");
    directory_outputs(&["coa-tokenize", "--tokenizer", &tok, "-i", &input], &["-o", "--stats"]);
    directory_outputs(&["coa-tokenize", "--train-bpe", "--vocab-size", "300", "-i", &input, "-o", "x.parquet"], &["--save-tokenizer"]);
    refuses("--max-len 0", &s(&["coa-tokenize", "--tokenizer", &tok, "-i", &input, "--max-len", "0"]), &["--max-len"]);
    refuses("a negative vocabulary", &s(&["coa-tokenize", "--train-bpe", "-i", &input, "--vocab-size", "-5", "--save-tokenizer", "t.json"]), &["--vocab-size", "-5"]);
    refuses("a tokenizer that is not one", &s(&["coa-tokenize", "--tokenizer", &fx.path("tasks.parquet"), "-i", &input]), &["tasks.parquet"]);
}

#[test]
fn coa_score() {
    let fx = fixtures();
    let tasks = fx.path("tasks.parquet");
    table_cases(&["coa-score", "--tasks", &tasks, "-i", "{IN}", "-o", "out.parquet"], "rollouts.parquet", &tables::ROLLOUTS, "tasks.parquet");
    // The tasks side: a bad --tasks file too.
    let vdir = tempfile::tempdir().unwrap();
    let v = variants(fx, "tasks.parquet", &tables::TASKS, vdir.path());
    refuses("nulls in --tasks", &s(&["coa-score", "--tasks", &v.nulls.0, "-i", &fx.path("rollouts.parquet"), "-o", "out.parquet"]), &["holds 1 null value(s)", "written by `coa-generate tasks`"]);
    let input = fx.path("rollouts.parquet");
    directory_outputs(&["coa-score", "--tasks", &tasks, "-i", &input], &["-o", "--report", "--stats"]);
    refuses("--code-timeout 0", &s(&["coa-score", "--tasks", &tasks, "-i", &input, "--code-timeout", "0"]), &["--code-timeout", "`0`: expected a positive number of seconds"]);
    refuses("--code-timeout 1e300", &s(&["coa-score", "--tasks", &tasks, "-i", &input, "--code-timeout", "1e300"]), &["--code-timeout", "`1e300`: expected a positive number of seconds, at most 86400"]);
    refuses("--format-penalty NaN", &s(&["coa-score", "--tasks", &tasks, "-i", &input, "--format-penalty", "NaN"]), &["--format-penalty", "`NaN`: expected a finite number"]);
    refuses("a negative length", &s(&["coa-score", "--tasks", &tasks, "-i", &input, "--max-response-len", "-1"]), &["--max-response-len", "`-1`"]);
}

#[test]
fn coa_train_step() {
    let fx = fixtures();
    let tok = fx.path("tok.json");
    let cmd = ["coa-train-step", "--init-config", "tiny", "--tokenizer", &tok, "--steps", "1", "-i", "{IN}", "-o", "out.parquet"];
    table_cases(&cmd, "tokens.parquet", &tables::TOKENS, "coa_text.parquet");
    let input = fx.path("tokens.parquet");
    let base = ["coa-train-step", "--init-config", "tiny", "--tokenizer", &tok, "--steps", "1", "-i", &input];
    directory_outputs(&base, &["-o", "--plot", "--stats"]);
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|w| w.to_string()).collect() };
    refuses("--save naming a file", &with(&["--save", &tok]), &["--save", "not a directory"]);
    refuses("--save over a directory that is not a checkpoint", &with(&["--save", &fx.dir.display().to_string()]), &["--save", "not a checkpoint"]);
    refuses("a negative learning rate", &with(&["--lr", "-1"]), &["--lr", "`-1`: expected a number greater than 0"]);
    refuses("--stop-at-step 0", &with(&["--stop-at-step", "0"]), &["--stop-at-step", "`0`: expected a whole number of at least 1"]);
    refuses("a run already past --stop-at-step", &s(&["coa-train-step", "-i", &input, "--resume", &fx.path("ckpt"), "--stop-at-step", "1"]), &["nothing to train", "at step 1"]);
    refuses("NaN epochs", &s(&["coa-train-step", "--init-config", "tiny", "--tokenizer", &tok, "--epochs", "NaN", "-i", &input]), &["--epochs", "`NaN`: expected a number greater than 0"]);
    let vdir = tempfile::tempdir().unwrap();
    let empty = vdir.path().join("empty.parquet");
    let (schema, batches) = fx.read("tokens.parquet");
    write(&empty, schema.clone(), &[]);
    let empty = empty.display().to_string();
    refuses("a table with no rows", &s(&["coa-train-step", "--init-config", "tiny", "--tokenizer", &tok, "-i", &empty]), &[&format!("{empty}: no row has a target token")]);
    // A row's 10 MB task_id in an error: its start and its length, one short line.
    let huge = "x".repeat(10 << 20);
    let one_row = [batches[0].slice(0, 1)];
    let (schema, batches) = map_column(&schema, &one_row, "task_id", |a, f| Some((Arc::new(StringArray::from(vec![huge.as_str(); a.len()])) as ArrayRef, f.clone())));
    let (schema, batches) = map_column(&schema, &batches, "loss_mask", |a, f| {
        let DataType::List(item) = f.data_type() else { unreachable!("loss_mask is a list") };
        let lists = a.as_list::<i32>();
        let twos = Arc::new(UInt8Array::from(vec![2u8; lists.values().len()]));
        Some((Arc::new(ListArray::new(item.clone(), lists.offsets().clone(), twos, lists.nulls().cloned())) as ArrayRef, f.clone()))
    });
    let long_id = vdir.path().join("long_id.parquet");
    write(&long_id, schema, &batches);
    let cmd = s(&["coa-train-step", "--init-config", "tiny", "--tokenizer", &tok, "-i", &long_id.display().to_string()]);
    refuses("a 10 MB task_id", &cmd, &["only 0 and 1 are allowed", &format!("(task_id \"{}\"... (10485760 bytes))", "x".repeat(80))]);
    let (out, _) = stage(vdir.path(), &cmd.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.stderr.len() < 1000, "the error is {} bytes long", out.stderr.len());
}

#[test]
fn coa_train_step_plot() {
    let fx = fixtures();
    table_cases(&["coa-train-step", "plot", "-i", "{IN}", "-o", "out.png"], "metrics.parquet", &tables::METRICS, "tokens.parquet");
    let metrics = fx.path("metrics.parquet");
    directory_outputs(&["coa-train-step", "plot", "-i", &metrics], &["-o"]);
    refuses("--column naming no float column", &s(&["coa-train-step", "plot", "-i", &metrics, "--column", "objective", "-o", "out.png"]), &["--column objective", "not a float32 column"]);
}

/// Runs a stage with its stdout or its stderr (`which`) on a pseudo-terminal (python3's `pty`):
/// its exit status, what the terminal showed, and the other stream; `None` without python3.
fn on_a_terminal(which: &str, dir: &Path, args: &[&str]) -> Option<(i32, String, String)> {
    let script = r#"
import os, pty, subprocess, sys
master, slave = pty.openpty()
tty = {"stdin": subprocess.DEVNULL, sys.argv[1]: slave}
other = "stderr" if sys.argv[1] == "stdout" else "stdout"
tty[other] = subprocess.PIPE
p = subprocess.run(sys.argv[2:], **tty)
os.close(slave)
os.set_blocking(master, False)
try:
    shown = os.read(master, 1 << 16)
except OSError:
    shown = b""
sys.stdout.buffer.write(b"%d\n%d\n" % (p.returncode, len(shown)) + shown + getattr(p, other))
"#;
    let bin = bin_dir().join(args[0]);
    let out = Command::new("python3").current_dir(dir).args(["-c", script, which]).arg(&bin).args(&args[1..]).output().ok()?;
    assert!(out.status.success(), "python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (status, rest) = text.split_once('\n').unwrap();
    let (len, rest) = rest.split_once('\n').unwrap();
    let len: usize = len.parse().unwrap();
    let (shown, other) = rest.split_at(len);
    Some((status.parse().unwrap(), shown.replace("\r\n", "\n"), other.to_string()))
}

/// A stage whose stdout is a terminal and that has no `-o` refuses to write binary Arrow there,
/// and says what to do instead; on a terminal stderr its summary is one short line, not JSON.
#[test]
fn a_terminal_gets_no_binary_and_a_short_summary() {
    let work = tempfile::tempdir().unwrap();
    let Some((status, shown, stderr)) = on_a_terminal("stdout", work.path(), &["coa-generate", "tasks", "--suite", "math", "--n", "2"]) else {
        println!("skipped: python3 is not installed (it makes the pseudo-terminal)");
        return;
    };
    assert_eq!((status, shown.as_str()), (1, ""), "exit status 1 and nothing on the terminal; stderr:\n{stderr}");
    assert!(stderr.contains("stdout is a terminal") && stderr.contains("give -o FILE"), "{stderr}");
    assert!(work.path().read_dir().unwrap().next().is_none(), "it left files");

    let (status, shown, _) = on_a_terminal("stderr", work.path(), &["coa-generate", "tasks", "--suite", "math", "--n", "2", "-o", "t.parquet"]).unwrap();
    assert_eq!(status, 0, "{shown}");
    // (after the progress bar, which the terminal also shows)
    assert!(shown.contains("coa-generate tasks: 0 rows in, 2 out, ") && !shown.contains("{\"stage\""), "{shown}");
}
