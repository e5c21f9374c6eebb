//! Runs the real `coa-extract` binary on small `mas_runs` tables built here, following the event
//! contract of `coa-generate mas`, and reads its outputs back.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Int32Type, Int64Type};
use arrow::record_batch::RecordBatch;
use coa_schemas::io::{self, Provenance};
use coa_schemas::tables::{MAS_RUNS, TRAJECTORIES};
use coa_schemas::rows::{ChatMessage as Message, Event, MasRun as Run};

fn ev(seq: i32, agent: &str, role: &str, output: &str) -> Event {
    Event {
        seq,
        agent: agent.into(),
        role: role.into(),
        input_messages: vec![Message { role: "user".into(), content: "context".into() }],
        output: output.into(),
        tool: None,
        tool_input: None,
        observation: None,
        tokens_in: 100,
        tokens_out: 20,
        latency_ms: 1.5,
    }
}

fn tool_ev(seq: i32, agent: &str, role: &str, output: &str, input: &str, observation: &str) -> Event {
    Event { tool: Some(role.into()), tool_input: Some(input.into()), observation: Some(observation.into()), ..ev(seq, agent, role, output) }
}

const GRADES_GOOD: &str = "The crawl confirmed the founder.\ninformation_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good";
const SEARCH_OBS: &str = "Found 2 results:\n1. [Ardena Varos](https://wiki.local/Ardena_Varos)\nArdena Varos founded Këlmo Labs…\n2. [Këlmo Labs](https://wiki.local/K%C3%ABlmo_Labs)\nA lab in Zürich 🙂";
const CRAWL_OBS: &str = "Page 1 [https://wiki.local/Ardena_Varos] Summary:\nArdena Varos (born 1961) founded Këlmo Labs in Zürich.";

fn multihop_run(id: &str) -> Run {
    let events = vec![
        ev(0, "manager", "manager", "next: planner"),
        ev(1, "planner", "plan", "<think>Who founded Këlmo Labs?</think>\n<plan>1. Search the lab.\n2. Read its page.</plan>"),
        ev(2, "manager", "manager", "next: search"),
        tool_ev(3, "search_agent", "web_search", "<think>Search the lab.</think>\n<web_search>Këlmo Labs founder</web_search>", "Këlmo Labs founder", SEARCH_OBS),
        tool_ev(4, "crawl_agent", "crawl_page", "<think>Read the top page.</think>\n<crawl_page>https://wiki.local/Ardena_Varos</crawl_page>", "https://wiki.local/Ardena_Varos", CRAWL_OBS),
        ev(5, "reflector", "reflection", &format!("<think>Check the trajectory.</think>\n<reflection>{GRADES_GOOD}</reflection>")),
        ev(6, "planner", "suggested_answer", "<think>The page names her.</think>\n<suggested_answer>Ardena Varos</suggested_answer>"),
        ev(7, "verifier", "double_check", "<think>Verify against the page.</think>\n<double_check>The page says so.\nscore: 4</double_check>"),
        ev(8, "planner", "answer", "<answer>Ardena Varos</answer>"),
    ];
    Run {
        task_id: id.into(),
        suite: "multihop".into(),
        question: "Who founded Këlmo Labs?".into(),
        answers: vec!["Ardena Varos".into(), "A. Varos".into()],
        backend: "scripted".into(),
        simulator: true,
        events,
        final_answer: Some("Ardena Varos".into()),
        success: true,
        tokens_in: 1234,
        tokens_out: 321,
        latency_ms: 12.0,
    }
}

const CODE_OUTPUT: &str = "<think>Compute it.</think>\n<code>\n```py\nprint(6 * 7)\n```\n</code>";
const CODE_OBS: &str = "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n42\n[STDOUT:END]";

fn math_run(id: &str) -> Run {
    let events = vec![
        ev(1, "planner", "plan", "<plan>Compute 6*7 with code.</plan>"),
        tool_ev(2, "code_agent", "code", CODE_OUTPUT, "print(6 * 7)", CODE_OBS),
        ev(3, "reflector", "reflection", "<reflection>The output 42 is plausible.</reflection>"),
        ev(4, "planner", "answer", "<think>Done.</think>\n<answer>\\boxed{42}</answer>"),
    ];
    Run {
        task_id: id.into(),
        suite: "math".into(),
        question: "What is 6 × 7?".into(),
        answers: vec!["42".into()],
        backend: "scripted".into(),
        simulator: true,
        events,
        final_answer: Some("42".into()),
        success: false,
        tokens_in: 500,
        tokens_out: 50,
        latency_ms: 3.0,
    }
}

fn batch(runs: &[Run]) -> RecordBatch {
    let schema = MAS_RUNS.schema();
    serde_arrow::to_record_batch(schema.fields(), &runs).unwrap().with_schema(schema).unwrap()
}

fn write_runs(dir: &Path, name: &str, runs: &[Run]) -> PathBuf {
    let path = dir.join(name);
    io::write_all(Some(&path), None, &MAS_RUNS.schema(), &[batch(runs)], &Provenance::default()).unwrap();
    path
}

fn extract(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coa-extract")).args(args).output().unwrap()
}

fn read(path: &Path) -> RecordBatch {
    let (schema, batches) = io::read_all(Some(path), &TRAJECTORIES).unwrap();
    arrow::compute::concat_batches(&schema, &batches).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn strings(b: &RecordBatch, col: &str) -> Vec<Option<String>> {
    let a = b.column_by_name(col).unwrap().as_string::<i32>();
    (0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i).to_string())).collect()
}

#[test]
fn extracts_steps_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_runs(dir.path(), "runs.parquet", &[multihop_run("mh-1"), math_run("m-1")]);
    let out = dir.path().join("traj.parquet");
    let o = extract(&["-i", s(&input), "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(summary["stage"], "coa-extract");
    assert_eq!(summary["rows_in"], 2);
    assert_eq!(summary["rows_out"], 2);
    assert_eq!(summary["format_errors"], 0);

    let b = read(&out);
    assert_eq!(strings(&b, "task_id"), vec![Some("mh-1".into()), Some("m-1".into())]);
    assert_eq!(b.column_by_name("hops").unwrap().as_primitive::<Int32Type>().values(), &[7, 4]);
    assert_eq!(b.column_by_name("reflections").unwrap().as_primitive::<Int32Type>().values(), &[1, 1]);
    assert_eq!(b.column_by_name("teacher_tokens").unwrap().as_primitive::<Int64Type>().values(), &[1555, 550]);
    let scores = b.column_by_name("double_check_scores").unwrap().as_list::<i32>();
    assert_eq!(scores.value(0).as_primitive::<Int32Type>().values(), &[4]);
    assert_eq!(scores.value(1).len(), 0);
    assert_eq!(strings(&b, "final_answer"), vec![Some("Ardena Varos".into()), Some("\\boxed{42}".into())]);
    let correct = b.column_by_name("correct").unwrap().as_boolean();
    assert!(correct.value(0) && !correct.value(1));
    let ok = b.column_by_name("format_ok").unwrap().as_boolean();
    assert!(ok.value(0) && ok.value(1), "{:?}", strings(&b, "format_error"));
    assert_eq!(strings(&b, "format_error"), vec![None, None]);
    let answers = b.column_by_name("answers").unwrap().as_list::<i32>();
    assert_eq!(answers.value(0).as_string::<i32>().iter().flatten().collect::<Vec<_>>(), vec!["Ardena Varos", "A. Varos"]);

    // Steps: think + action per activation, manager events skipped.
    let steps = b.column_by_name("steps").unwrap().as_list::<i32>();
    let st = steps.value(0);
    let st = st.as_struct();
    let col = |name: &str| -> Vec<Option<String>> {
        let a = st.column_by_name(name).unwrap().as_string::<i32>();
        (0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i).to_string())).collect()
    };
    let roles: Vec<String> = col("role").into_iter().flatten().collect();
    assert_eq!(
        roles,
        [
            "think", "plan", "think", "web_search", "think", "crawl_page", "think", "reflection", "think", "suggested_answer", "think",
            "double_check", "answer"
        ]
    );
    let agents = col("agent");
    assert_eq!(agents[0].as_deref(), Some("planner"));
    assert_eq!(agents[3].as_deref(), Some("search_agent"));
    let content = col("content");
    assert_eq!(content[0].as_deref(), Some("Who founded Këlmo Labs?"));
    assert_eq!(content[3].as_deref(), Some("Këlmo Labs founder"));
    assert_eq!(col("tool")[3].as_deref(), Some("web_search"));
    assert_eq!(col("tool_input")[5].as_deref(), Some("https://wiki.local/Ardena_Varos"));
    assert_eq!(col("observation")[3].as_deref(), Some(SEARCH_OBS));
    assert_eq!(col("observation")[1], None);
    assert_eq!(col("tool")[1], None);

    // Code content is the source without its fence.
    let st = steps.value(1);
    let code = st.as_struct().column_by_name("content").unwrap().as_string::<i32>();
    assert_eq!(code.value(2), "print(6 * 7)", "AFM's order: plan, think, code");

    // Provenance names the stage and its input.
    let prov = io::open(Some(&out), &TRAJECTORIES).unwrap().provenance().unwrap();
    assert_eq!(prov.stage, "coa-extract");
    assert_eq!(prov.inputs[0].table.as_deref(), Some("mas_runs"));
}

#[test]
fn grammar_violations_are_flagged_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    // Answer straight after the suggested answer: no double_check.
    let mut r = multihop_run("skip-check");
    r.events.retain(|e| e.role != "double_check");
    // A double_check that doubts (score 2) but answers anyway.
    let mut r2 = multihop_run("ignored-doubt");
    r2.events[7].output = "<think>Hmm.</think>\n<double_check>Not confirmed.\nscore: 2</double_check>".into();
    // No think before the answer (the code agent's order needs one).
    let mut r3 = math_run("no-think");
    r3.events[3].output = "<answer>\\boxed{42}</answer>".into();
    let input = write_runs(dir.path(), "runs.arrow", &[r, r2, r3]);
    let out = dir.path().join("traj.arrow");
    let o = extract(&["-i", s(&input), "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let b = read(&out);
    let ok = b.column_by_name("format_ok").unwrap().as_boolean();
    assert!((0..3).all(|i| !ok.value(i)));
    let errs: Vec<String> = strings(&b, "format_error").into_iter().map(Option::unwrap).collect();
    assert_eq!(errs[0], "step 10: <answer> cannot follow <suggested_answer>; expected <think>");
    assert!(errs[1].contains("score 2") && errs[1].starts_with("step 12: <answer>"), "{}", errs[1]);
    assert_eq!(errs[2], "step 4: <answer> after <reflection> is not preceded by <think>; expected <think>");
    let scores = b.column_by_name("double_check_scores").unwrap().as_list::<i32>();
    assert_eq!(scores.value(1).as_primitive::<Int32Type>().values(), &[2]);
    let summary: serde_json::Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(summary["format_errors"], 3);
}

/// Each kind of malformed event: a clear error naming the task, the event seq and the problem;
/// non-zero exit; no output file. Then all together with --skip-bad.
#[test]
fn malformed_events_fail_clearly_or_go_to_the_reject_table() {
    let dir = tempfile::tempdir().unwrap();
    type Mutation = Box<dyn Fn(&mut Run)>;
    let cases: Vec<(&str, Mutation, &str)> = vec![
        ("unparseable", Box::new(|r| r.events[1].output = "I will plan: <plan>1. x</plan>".into()), "event seq 1: output does not parse: text outside any tag: \"I will plan: \" at line 1, column 1"),
        ("unknown-tag", Box::new(|r| r.events[1].output = "<think>a</think><tool_call>x</tool_call>".into()), "event seq 1: output does not parse: unknown tag `<tool_call>` at line 1, column 17"),
        ("never-closed", Box::new(|r| r.events[5].output = "<think>check</think>\n<reflection>information_conflict: Good".into()), "event seq 5: output does not parse: <reflection> is never closed (expected </reflection>) at line 2, column 1"),
        ("nested", Box::new(|r| r.events[1].output = "<think>a <plan>b</plan></think>".into()), "event seq 1: output does not parse: <plan> nested inside <think>"),
        ("role-mismatch", Box::new(|r| r.events[6].role = "answer".into()), "event seq 6: output's action block is <suggested_answer> but the event role is `answer`"),
        ("unknown-tool", Box::new(|r| r.events[3].tool = Some("google".into())), "event seq 3: unknown tool name `google` (known tools: web_search, wiki_search, crawl_page, code)"),
        ("tool-mismatch", Box::new(|r| r.events[3].tool = Some("crawl_page".into())), "event seq 3: tool `crawl_page` does not match the event role `web_search`"),
        ("no-tool", Box::new(|r| r.events[3].tool = None), "event seq 3: tool call <web_search> has no `tool` name"),
        ("seq-order", Box::new(|r| r.events[4].seq = 2), "event seq 2: out of order: seq 2 comes after seq 3"),
        ("unknown-role", Box::new(|r| r.events[1].role = "critic".into()), "event seq 1: unknown role `critic`"),
        ("two-actions", Box::new(|r| r.events[1].output = "<think>a</think><plan>b</plan><plan>c</plan>".into()), "event seq 1: output must be an optional <think> block then exactly one <plan> block; found <think> <plan> <plan>"),
        ("think-only", Box::new(|r| r.events[1].output = "<think>a</think>".into()), "found <think>"),
        ("think-role", Box::new(|r| r.events[1].role = "think".into()), "event seq 1: role `think` is not an action"),
    ];
    let mut all = vec![multihop_run("good-0")];
    for (name, mutate, want) in &cases {
        let mut r = multihop_run(&format!("bad-{name}"));
        mutate(&mut r);
        all.push(r.clone());
        let input = write_runs(dir.path(), &format!("{name}.parquet"), &[multihop_run("good-1"), r]);
        let out = dir.path().join(format!("{name}-out.parquet"));
        let o = extract(&["-i", s(&input), "-o", s(&out)]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{name}: succeeded");
        assert!(err.contains(&format!("row 1, task `bad-{name}`: ")), "{name}: {err}");
        assert!(err.contains(want), "{name}: expected {want:?} in\n{err}");
        assert!(err.starts_with("coa-extract: error: "), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(!out.exists(), "{name}: output left behind");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp")).count(), 0);
    }
    all.push(math_run("good-2"));

    // --skip-bad: the bad runs go to the reject table, the good ones are extracted.
    let input = write_runs(dir.path(), "all.parquet", &all);
    let out = dir.path().join("good.parquet");
    let rejects = dir.path().join("rejects.parquet");
    let o = extract(&["-i", s(&input), "-o", s(&out), "--skip-bad", s(&rejects)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(summary["rejected"], cases.len());
    assert_eq!(summary["rows_out"], 2);
    assert_eq!(strings(&read(&out), "task_id"), vec![Some("good-0".into()), Some("good-2".into())]);
    let (schema, batches) = io::read_all(Some(&rejects), &MAS_RUNS).unwrap();
    let rb = arrow::compute::concat_batches(&schema, &batches).unwrap();
    assert_eq!(rb.num_rows(), cases.len());
    // Every mas_runs column is kept, plus the reason.
    for c in &MAS_RUNS.columns {
        assert!(rb.column_by_name(c.name).is_some(), "{}", c.name);
    }
    let ids = strings(&rb, "task_id");
    let reasons = strings(&rb, "reject_reason");
    for ((name, _, want), (id, reason)) in cases.iter().zip(ids.iter().zip(&reasons)) {
        assert_eq!(id.as_deref(), Some(format!("bad-{name}").as_str()));
        assert!(reason.as_deref().unwrap().contains(want), "{name}: {reason:?}");
    }
    let events = rb.column_by_name("events").unwrap().as_list::<i32>();
    assert_eq!(events.value(0).len(), 9);
}

#[test]
fn missing_columns_and_wrong_tables_are_reported_by_the_io_layer() {
    let dir = tempfile::tempdir().unwrap();
    let full = batch(&[multihop_run("a")]);
    let idx: Vec<usize> = (0..full.num_columns()).filter(|&i| full.schema().field(i).name() != "events").collect();
    let partial = full.project(&idx).unwrap();
    let path = dir.path().join("partial.parquet");
    io::write_all(Some(&path), None, &partial.schema(), &[partial], &Provenance::default()).unwrap();
    let o = extract(&["-i", s(&path)]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("column `events` is missing") && err.contains("coa-generate mas"), "{err}");

    let o = extract(&["-i", s(&dir.path().join("nope.parquet"))]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot open input"));
}

#[test]
fn pipes_empty_inputs_and_determinism() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_runs(dir.path(), "runs.parquet", &[multihop_run("a"), math_run("b")]);
    // stdin -> stdout (IPC stream).
    let child = Command::new(env!("CARGO_BIN_EXE_coa-extract"))
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(&o.stdout[..4], &[0xFF, 0xFF, 0xFF, 0xFF]);
    let reader = io::open_bytes("stdout", o.stdout.clone().into(), Some(&TRAJECTORIES)).unwrap();
    let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows, 2);
    // The same input and arguments give byte-identical output.
    let o2 = Command::new(env!("CARGO_BIN_EXE_coa-extract")).stdin(std::fs::File::open(&input).unwrap()).output().unwrap();
    assert_eq!(o.stdout, o2.stdout);

    // An empty mas_runs table gives an empty trajectories table.
    let empty = dir.path().join("empty.parquet");
    io::write_all(Some(&empty), None, &MAS_RUNS.schema(), &[], &Provenance::default()).unwrap();
    let out = dir.path().join("empty-out.parquet");
    let o = extract(&["-i", s(&empty), "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(read(&out).num_rows(), 0);

    // --stats writes the summary line.
    let stats = dir.path().join("stats.json");
    let o = extract(&["-i", s(&input), "-o", s(&out), "--stats", s(&stats)]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(v["rows_out"], 2);
}

/// Many rows over several work units and input batches: order is kept, and a bad row deep in
/// the input is reported with its global row number.
#[test]
fn many_rows_keep_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let n = 10_000;
    let runs: Vec<Run> = (0..n).map(|i| if i % 2 == 0 { multihop_run(&format!("t{i:05}")) } else { math_run(&format!("t{i:05}")) }).collect();
    let path = dir.path().join("many.arrow");
    let batches: Vec<RecordBatch> = runs.chunks(1500).map(batch).collect();
    io::write_all(Some(&path), None, &MAS_RUNS.schema(), &batches, &Provenance::default()).unwrap();
    let out = dir.path().join("many-out.parquet");
    let o = extract(&["-i", s(&path), "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let b = read(&out);
    let ids: Vec<String> = strings(&b, "task_id").into_iter().map(Option::unwrap).collect();
    let want: Vec<String> = (0..n).map(|i| format!("t{i:05}")).collect();
    assert_eq!(ids, want);
    let hops = b.column_by_name("hops").unwrap().as_primitive::<Int32Type>();
    assert!((0..n).all(|i| hops.value(i) == if i % 2 == 0 { 7 } else { 4 }));

    // A bad row in the second group: the output already opened is removed, nothing is left behind.
    let mut bad = runs.clone();
    bad[9321].events[2].seq = 0;
    let batches: Vec<RecordBatch> = bad.chunks(1500).map(batch).collect();
    io::write_all(Some(&path), None, &MAS_RUNS.schema(), &batches, &Provenance::default()).unwrap();
    let fresh = dir.path().join("fresh-out.parquet");
    let o = extract(&["-i", s(&path), "-o", s(&fresh)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("many.arrow: row 9321, task `t09321`: event seq 0: out of order"), "{}", stderr(&o));
    assert!(!fresh.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n.to_string_lossy().ends_with(".tmp")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// An Arrow IPC stream on stdin through a real pipe (what `coa-generate mas | coa-extract` does).
/// Guarded by a deadline so a hang in the reader fails the test instead of stalling the suite.
#[test]
fn reads_an_ipc_stream_from_a_pipe() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.arrows");
    io::write_all(Some(&path), Some(io::Format::Ipc), &MAS_RUNS.schema(), &[batch(&[multihop_run("a"), math_run("b")])], &Provenance::default()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_coa-extract"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&bytes);
    });
    let mut out = child.stdout.take().unwrap();
    let drain = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut v).map(|_| v)
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("coa-extract hung reading an IPC stream from a stdin pipe");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    feeder.join().unwrap();
    let stdout = drain.join().unwrap().unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let reader = io::open_bytes("stdout", stdout.into(), Some(&TRAJECTORIES)).unwrap();
    assert_eq!(reader.map(|b| b.unwrap().num_rows()).sum::<usize>(), 2);
}
