//! The `coa-filter` binary end to end: files, pipes, stats, dropped rows and failures.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Float32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use coa_schemas::io::{self, Format, Provenance};
use coa_schemas::tables::{META_PROVENANCE, META_TABLE, TASKS, TRAJECTORIES};
use serde_json::Value;
use coa_schemas::rows::{Step, Trajectory as Traj};

fn traj(id: &str, suite: &str, hops: i32, reflections: i32, correct: bool, dcs: Vec<i32>) -> Traj {
    let s = |role: &str, tool: Option<&str>, input: Option<String>| Step {
        role: role.into(),
        agent: role.into(),
        content: format!("{role} of {id}"),
        tool: tool.map(Into::into),
        tool_input: input,
        observation: tool.map(|_| "Found 1 results:".to_string()),
    };
    Traj {
        task_id: id.into(),
        suite: suite.into(),
        question: format!("q {id}"),
        answers: vec!["a".into()],
        steps: vec![s("think", None, None), s("tool", Some("web_search"), Some(format!("{id} query"))), s("answer", None, None)],
        hops,
        reflections,
        double_check_scores: dcs,
        final_answer: Some("a".into()),
        correct,
        format_ok: true,
        format_error: None,
        teacher_tokens: 100,
    }
}

/// 10 trajectories: 4 kept (one of them twice), the rest dropped for known reasons.
fn sample() -> Vec<Traj> {
    let mut v = vec![
        traj("t0", "multihop", 6, 1, true, vec![4]),
        traj("t1", "multihop", 3, 1, true, vec![4]),  // complexity
        traj("t2", "multihop", 7, 1, false, vec![4]), // wrong_answer
        traj("t3", "math", 6, 0, true, vec![4]),      // reflection (math)
        traj("t4", "multihop", 9, 2, true, vec![2, 4]), // error_correction x2
        traj("t5", "code", 5, 1, true, vec![]),
        traj("t6", "multihop", 8, 1, true, vec![3]),
    ];
    v.push(v[0].clone()); // dedup
    let mut f = traj("t8", "multihop", 6, 1, true, vec![4]);
    f.format_ok = false; // format
    v.push(f);
    let mut r = traj("t9", "multihop", 6, 1, true, vec![4]);
    r.steps.push(r.steps[1].clone()); // repeated_tool_input
    v.push(r);
    v
}

fn batch(rows: &[Traj]) -> RecordBatch {
    serde_arrow::to_record_batch(TRAJECTORIES.schema().fields(), &rows).unwrap().with_schema(TRAJECTORIES.schema()).unwrap()
}

fn upstream() -> Provenance {
    Provenance { stage: "coa-extract".into(), version: "test".into(), ..Default::default() }
}

fn write_table(path: &Path, schema: &Schema, batches: &[RecordBatch]) {
    io::write_all(Some(path), None, schema, batches, &upstream()).unwrap();
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coa-filter"))
}

fn run(args: &[&str], stdin: Option<Vec<u8>>) -> Output {
    let mut child = bin().args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut pipe = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        if let Some(bytes) = stdin {
            let _ = pipe.write_all(&bytes);
        }
    });
    // A hang (e.g. a deadlock reading stdin) fails the test instead of blocking it.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("coa-filter {args:?} did not finish in 60 s");
        }
    };
    waiter.join().unwrap();
    writer.join().unwrap();
    out
}

fn ids(batches: &[RecordBatch]) -> Vec<String> {
    batches.iter().flat_map(|b| b.column_by_name("task_id").unwrap().as_string::<i32>().iter().map(|s| s.unwrap().to_string()).collect::<Vec<_>>()).collect()
}

fn read(path: &Path) -> (Arc<Schema>, Vec<RecordBatch>) {
    let r = io::open_any(Some(path)).unwrap();
    let schema = r.schema();
    (schema, r.collect::<anyhow::Result<Vec<_>>>().unwrap())
}

fn summary(stderr: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no summary in {text}"));
    serde_json::from_str(line).unwrap()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

#[test]
fn filters_a_trajectories_file_with_stats_and_dropped_rows() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("traj.parquet");
    write_table(&input, &TRAJECTORIES.schema(), &[batch(&sample())]);
    let (out, stats, dropped) = (dir.path().join("kept.parquet"), dir.path().join("s.json"), dir.path().join("dropped.arrow"));
    let o = run(
        &[
            "-i",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--stats",
            stats.to_str().unwrap(),
            "--keep-dropped",
            dropped.to_str().unwrap(),
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{stderr}");
    assert!(o.stdout.is_empty());

    // The output is a valid trajectories table with the kept rows.
    let (schema, batches) = read(&out);
    assert_eq!(ids(&batches), vec!["t0", "t4", "t4", "t5", "t6"]);
    let checked = io::read_all(Some(&out), &TRAJECTORIES).unwrap();
    assert_eq!(checked.0.fields(), TRAJECTORIES.schema().fields());
    assert_eq!(schema.metadata().get(META_TABLE).map(String::as_str), Some("trajectories"));
    let prov: Provenance = serde_json::from_str(&schema.metadata()[META_PROVENANCE]).unwrap();
    assert_eq!(prov.stage, "coa-filter");
    assert_eq!(prov.seed, Some(0));
    assert_eq!(prov.inputs.len(), 1);
    assert_eq!(prov.inputs[0].table.as_deref(), Some("trajectories"));
    assert_eq!(prov.inputs[0].provenance.as_ref().unwrap().stage, "coa-extract");

    // Stats: the file holds the summary line, every drop accounted for.
    let s: Value = serde_json::from_str(std::fs::read_to_string(&stats).unwrap().trim()).unwrap();
    assert_eq!(s, summary(&o.stderr));
    assert_eq!((s["rows_in"].as_u64(), s["rows_out"].as_u64()), (Some(10), Some(5)));
    assert_eq!(s["mode"], "distill");
    let rules = s["rules"].as_array().unwrap();
    let got: Vec<(String, u64, u64, u64, u64)> = rules
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (r["name"].as_str().unwrap().to_string(), n("rows_in"), n("kept"), n("dropped"), n("duplicated"))
        })
        .collect();
    let want = [
        ("dedup", 10, 9, 1, 0),
        ("complexity", 9, 8, 1, 0),
        ("wrong_answer", 8, 7, 1, 0),
        ("format", 7, 6, 1, 0),
        ("repeated_tool_input", 6, 5, 1, 0),
        ("reflection", 5, 4, 1, 0),
        ("error_correction", 4, 4, 0, 1),
    ];
    assert_eq!(got, want.iter().map(|w| (w.0.to_string(), w.1, w.2, w.3, w.4)).collect::<Vec<_>>());
    assert_eq!(s["rows_dropped_written"], 6);
    // The human table on stderr.
    assert!(stderr.contains("repeated_tool_input") && stderr.contains("rows_in"), "{stderr}");

    // Dropped rows with their reasons.
    let (dschema, dbatches) = read(&dropped);
    assert_eq!(dschema.fields().last().unwrap().name(), "drop_reason");
    assert_eq!(ids(&dbatches), vec!["t1", "t2", "t3", "t0", "t8", "t9"]);
    let reasons: Vec<String> =
        dbatches.iter().flat_map(|b| b.column_by_name("drop_reason").unwrap().as_string::<i32>().iter().map(|s| s.unwrap().to_string()).collect::<Vec<_>>()).collect();
    assert_eq!(reasons, vec!["complexity", "wrong_answer", "reflection", "dedup", "format", "repeated_tool_input"]);
    // No temporary files left behind.
    assert_eq!(files_in(dir.path()).len(), 4);
}

#[test]
fn pipes_stdin_to_stdout_with_where_rules() {
    let mut bytes = Vec::new();
    {
        let provenance = upstream();
        let schema = io::with_provenance(&TRAJECTORIES.schema(), &provenance).unwrap();
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut bytes, &schema).unwrap();
        let rows = sample();
        w.write(&batch(&rows[..4]).with_schema(schema.clone()).unwrap()).unwrap();
        w.write(&batch(&rows[4..]).with_schema(schema.clone()).unwrap()).unwrap();
        w.finish().unwrap();
    }
    let o = run(&["--where", "suite = 'multihop'", "--where", "hops < 9", "--no-rule", "error_correction"], Some(bytes.clone()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(&o.stdout[..4], &[0xFF, 0xFF, 0xFF, 0xFF], "an IPC stream on stdout");
    let r = io::open_bytes("stdout", o.stdout.into(), Some(&TRAJECTORIES)).unwrap();
    let batches: Vec<RecordBatch> = r.collect::<anyhow::Result<_>>().unwrap();
    assert_eq!(ids(&batches), vec!["t0", "t6"]);
    let s = summary(&o.stderr);
    let names: Vec<&str> = s["rules"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["dedup", "complexity", "wrong_answer", "format", "repeated_tool_input", "where[0]", "where[1]", "reflection"]);
    // where[0] drops t3 (math) and t5 (code), where[1] drops t4 (hops 9).
    assert_eq!(s["rules"][5]["dropped"], 2);
    assert_eq!(s["rules"][6]["dropped"], 1);

    // Parquet piped in works too (buffered), and the output is the same.
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("t.parquet");
    write_table(&pq, &TRAJECTORIES.schema(), &[batch(&sample())]);
    let o2 = run(&["--where", "suite = 'multihop'", "--where", "hops < 9", "--no-rule", "error_correction"], Some(std::fs::read(&pq).unwrap()));
    assert!(o2.status.success());
    let r = io::open_bytes("stdout", o2.stdout.into(), None).unwrap();
    assert_eq!(ids(&r.collect::<anyhow::Result<Vec<_>>>().unwrap()), vec!["t0", "t6"]);
}

#[test]
fn wrong_table_fails_clearly_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks.arrow");
    let schema = Arc::new(TASKS.schema().project(&[0, 1]).unwrap());
    let b = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef, Arc::new(StringArray::from(vec!["math", "code"]))],
    )
    .unwrap();
    io::write_all(Some(&tasks), Some(Format::IpcFile), &schema, &[b], &upstream()).unwrap();
    let out = dir.path().join("out.parquet");
    let dropped = dir.path().join("dropped.parquet");
    let o = run(&["--rules", "distill", "-i", tasks.to_str().unwrap(), "-o", out.to_str().unwrap(), "--keep-dropped", dropped.to_str().unwrap()], None);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("coa-filter: error:") && stderr.contains("the `tasks` table, expected the `trajectories` table"), "{stderr}");
    assert!(stderr.contains("coa-extract") && stderr.contains("tasks.arrow: --rules distill"), "{stderr}");
    assert_eq!(files_in(dir.path()), vec![tasks.clone()], "no output, no temp files");

    // A malformed --where fails before anything is written, naming the expression.
    let o = run(&["-i", tasks.to_str().unwrap(), "-o", out.to_str().unwrap(), "--where", "suite = = 'x'"], None);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--where `suite = = 'x'`"), "{stderr}");
    let o = run(&["-i", tasks.to_str().unwrap(), "-o", out.to_str().unwrap(), "--where", "hops > 3"], None);
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown column `hops`"));
    assert_eq!(files_in(dir.path()), vec![tasks.clone()]);

    // Not a table at all.
    let o = run(&["-o", out.to_str().unwrap()], Some(b"task_id,suite\na,math\n".to_vec()));
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not Arrow or Parquet"));
    assert!(!out.exists());

    // The same table under the default rules passes through, saying why nothing ran.
    let o = run(&["-i", tasks.to_str().unwrap(), "-o", out.to_str().unwrap()], None);
    assert!(o.status.success());
    let s = summary(&o.stderr);
    assert_eq!(s["rows_out"], 2);
    assert_eq!(s["mode"], "none");
    assert!(s["notes"][0].as_str().unwrap().contains("distillation rules not applied"), "{s}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("note: distillation rules not applied"));
}

#[test]
fn dynamic_sampling_on_a_scores_like_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("scores.parquet");
    let schema = Arc::new(
        Schema::new(vec![Field::new("task_id", DataType::Utf8, false), Field::new("reward", DataType::Float32, false)])
            .with_metadata(std::collections::HashMap::from([(META_TABLE.to_string(), "scores".to_string())])),
    );
    let b = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["a", "a", "b", "b", "c", "c", "c"])) as ArrayRef,
            Arc::new(Float32Array::from(vec![1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.5])),
        ],
    )
    .unwrap();
    write_table(&input, &schema, &[b]);
    let out = dir.path().join("kept.arrow");
    let o = run(&["-i", input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--dynamic-sampling"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (schema_out, batches) = read(&out);
    assert_eq!(ids(&batches), vec!["b", "b", "c", "c", "c"]);
    assert_eq!(schema_out.metadata().get(META_TABLE).map(String::as_str), Some("scores"));
    let s = summary(&o.stderr);
    let r = &s["rules"][0];
    assert_eq!((r["name"].as_str(), r["groups_in"].as_u64(), r["groups_kept"].as_u64(), r["groups_dropped"].as_u64()), (Some("dynamic_sampling"), Some(3), Some(2), Some(1)));
    // The flags it depends on are checked.
    let o = run(&["-i", input.to_str().unwrap(), "--dynamic-sampling", "--value", "score"], None);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--value: no column `score`"));
    let o = run(&["-i", input.to_str().unwrap(), "--value", "reward"], None);
    assert!(!o.status.success(), "--value needs --dynamic-sampling");
}

#[test]
fn same_input_and_seed_give_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("traj.arrow");
    let rows: Vec<Traj> = (0..300).map(|i| traj(&format!("t{i}"), "multihop", 6, i % 2, true, vec![1 + i % 4])).collect();
    write_table(&input, &TRAJECTORIES.schema(), &[batch(&rows[..150]), batch(&rows[150..])]);
    let out = dir.path().join("out.parquet");
    let args = ["-i", input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--seed", "3"];
    assert!(run(&args, None).status.success());
    let first = std::fs::read(&out).unwrap();
    assert!(run(&args, None).status.success());
    assert_eq!(first, std::fs::read(&out).unwrap());
    let (_, batches) = read(&out);
    let n = ids(&batches).len();
    // 150 with a reflection (75 of them doubted -> x2), and about 30% of the other 150 (half of
    // those doubted -> x2).
    assert!((225 + 20..225 + 120).contains(&n), "{n}");
}

#[test]
fn help_lists_rules_and_examples() {
    let o = bin().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    for want in ["--where", "--dynamic-sampling", "--keep-dropped", "error_correction", "Examples:", "--no-rule"] {
        assert!(text.contains(want), "help lacks {want}");
    }
}
