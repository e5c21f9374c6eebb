//! Runs the real `coa-convert` binary on small `trajectories` tables built here and reads its
//! outputs back: coa_text, alpaca JSON, verl Parquet (re-imported with the coa-tasks importer),
//! and every unhappy path.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Int32Type, Int64Type};
use arrow::record_batch::RecordBatch;
use coa_schemas::io::{self, Provenance};
use coa_schemas::rows::{self, StdioTest, Task};
use coa_schemas::tables::{COA_TEXT, TASKS, TRAJECTORIES};
use coa_schemas::rows::{Step as StepRow, Trajectory as Traj};

fn step(role: &str, content: &str) -> StepRow {
    StepRow { role: role.into(), agent: "agent".into(), content: content.into(), tool: None, tool_input: None, observation: None }
}

fn tool(role: &str, content: &str, observation: &str) -> StepRow {
    StepRow { tool: Some(role.into()), tool_input: Some(content.into()), observation: Some(observation.into()), ..step(role, content) }
}

const SEARCH_OBS: &str = "Found 1 results:\n1. [Ardena Varos](https://wiki.local/Ardena_Varos)\nFounder of Këlmo Labs in Zürich 🙂";
const CRAWL_OBS: &str = "Page 1 [https://wiki.local/Ardena_Varos] Summary:\nArdena Varos (born 1961) founded Këlmo Labs.";
const GRADES: &str = "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Fair";

fn traj(id: &str, suite: &str, question: &str, answers: &[&str], steps: Vec<StepRow>) -> Traj {
    Traj {
        task_id: id.into(),
        suite: suite.into(),
        question: question.into(),
        answers: answers.iter().map(|a| a.to_string()).collect(),
        hops: steps.iter().filter(|s| s.role != "think").count() as i32,
        reflections: steps.iter().filter(|s| s.role == "reflection").count() as i32,
        double_check_scores: vec![],
        final_answer: steps.last().map(|s| s.content.clone()),
        correct: true,
        format_ok: true,
        format_error: None,
        teacher_tokens: 1000,
        steps,
    }
}

fn multihop(id: &str) -> Traj {
    traj(
        id,
        "multihop",
        "Who founded Këlmo Labs?",
        &["Ardena Varos", "A. Varos"],
        vec![
            step("think", "Find the lab's founder."),
            step("plan", "1. Search.\n2. Crawl."),
            step("think", "Search ü."),
            tool("web_search", "Këlmo Labs founder", SEARCH_OBS),
            step("think", "Read it."),
            tool("crawl_page", "https://wiki.local/Ardena_Varos", CRAWL_OBS),
            step("think", "Check."),
            step("reflection", GRADES),
            step("think", "Suggest."),
            step("suggested_answer", "Ardena Varos"),
            step("think", "Verify."),
            step("double_check", "Confirmed by the page.\nscore: 4"),
            step("answer", "Ardena Varos"),
        ],
    )
}

const CODE_OBS: &str = "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n42\n[STDOUT:END]";

fn math(id: &str) -> Traj {
    traj(
        id,
        "math",
        "What is 6 × 7?",
        &["42"],
        vec![
            step("think", "Multiply."),
            step("plan", "Compute 6*7."),
            step("think", "Run it."),
            tool("code", "print(6 * 7)", CODE_OBS),
            step("think", "Check."),
            step("reflection", "42 is plausible."),
            step("answer", "\\boxed{42}"),
        ],
    )
}

fn code(id: &str) -> Traj {
    traj(
        id,
        "code",
        "Write `double(x)` returning 2*x.",
        &[],
        vec![
            step("think", "Easy."),
            step("plan", "Write and test."),
            step("think", "Test."),
            tool("code", "def double(x):\n    return 2 * x\nprint(double(2))", "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n4\n[STDOUT:END]"),
            step("think", "Works."),
            step("reflection", "Tests pass."),
            step("answer", "```python\ndef double(x):\n    return 2 * x\n```"),
        ],
    )
}

fn batch(rows: &[Traj]) -> RecordBatch {
    let schema = TRAJECTORIES.schema();
    serde_arrow::to_record_batch(schema.fields(), &rows).unwrap().with_schema(schema).unwrap()
}

fn write(dir: &Path, name: &str, rows: &[Traj]) -> PathBuf {
    let path = dir.join(name);
    io::write_all(Some(&path), None, &TRAJECTORIES.schema(), &[batch(rows)], &Provenance::default()).unwrap();
    path
}

fn convert(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coa-convert")).args(args).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn strings(b: &RecordBatch, col: &str) -> Vec<String> {
    let a = b.column_by_name(col).unwrap().as_string::<i32>();
    (0..a.len()).map(|i| a.value(i).to_string()).collect()
}

fn read_coa(path: &Path) -> RecordBatch {
    let (schema, batches) = io::read_all(Some(path), &COA_TEXT).unwrap();
    arrow::compute::concat_batches(&schema, &batches).unwrap()
}

#[test]
fn renders_prompts_text_and_character_spans() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "traj.parquet", &[multihop("mh"), math("m")]);
    let out = dir.path().join("coa.parquet");
    let o = convert(&["-i", s(&input), "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!((summary["rows_in"].as_u64(), summary["rows_out"].as_u64(), summary["observation_spans"].as_u64()), (Some(2), Some(2), Some(3)));

    let b = read_coa(&out);
    assert_eq!(strings(&b, "task_id"), ["mh", "m"]);
    assert_eq!(strings(&b, "suite"), ["multihop", "math"]);
    let prompts = strings(&b, "prompt");
    assert_eq!(prompts[0], coa_format::build_prompt("multihop", "Who founded Këlmo Labs?"));
    assert!(prompts[0].starts_with(coa_format::prompt::WEB_INSTRUCTION) && prompts[0].ends_with("\n\nQuestion: Who founded Këlmo Labs?"));
    assert!(prompts[1].starts_with(coa_format::prompt::MATH_INSTRUCTION));
    let texts = strings(&b, "text");
    assert_eq!(
        texts[1],
        format!(
            "<think>Multiply.</think>\n<plan>Compute 6*7.</plan>\n<think>Run it.</think>\n<code>\n```py\nprint(6 * 7)\n```\n</code>\n\
             <observation>{CODE_OBS}</observation>\n<think>Check.</think>\n<reflection>42 is plausible.</reflection>\n<answer>\\boxed{{42}}</answer>"
        )
    );
    assert!(texts[0].starts_with("<think>Find the lab's founder.</think>\n<plan>1. Search.\n2. Crawl.</plan>\n"));
    assert!(texts[0].ends_with("<double_check>Confirmed by the page.\nscore: 4</double_check>\n<answer>Ardena Varos</answer>"));
    // Every text is valid CoA and parses back to the input steps.
    assert_eq!(coa_format::validate_text(&texts[0], coa_format::Flavor::Web), Ok(()));
    assert_eq!(coa_format::validate_text(&texts[1], coa_format::Flavor::Code), Ok(()));

    // Spans: character offsets of the whole observation blocks (text has multi-byte characters
    // before and inside them, so byte offsets would differ).
    let spans = b.column_by_name("observation_spans").unwrap().as_list::<i32>();
    let want = [vec![SEARCH_OBS, CRAWL_OBS], vec![CODE_OBS]];
    for (row, obs) in want.iter().enumerate() {
        let sp = spans.value(row);
        let sp = sp.as_struct();
        let starts = sp.column(0).as_primitive::<Int32Type>();
        let ends = sp.column(1).as_primitive::<Int32Type>();
        assert_eq!(sp.len(), obs.len());
        let chars: Vec<char> = texts[row].chars().collect();
        for k in 0..sp.len() {
            let block: String = chars[starts.value(k) as usize..ends.value(k) as usize].iter().collect();
            assert_eq!(block, format!("<observation>{}</observation>", obs[k]));
        }
    }
    assert_ne!(texts[0].len(), texts[0].chars().count(), "the test needs multi-byte text");
}

#[test]
fn bad_trajectories_fail_clearly_or_go_to_the_reject_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut flagged = multihop("flagged");
    flagged.format_ok = false;
    flagged.format_error = Some("step 10: <answer> cannot follow <suggested_answer>; expected <think>".into());
    let mut lying = multihop("lying");
    lying.steps.remove(0); // no think before the plan, but format_ok says true
    let mut unknown = math("unknown-role");
    unknown.steps[5].role = "critique".into();
    let mut unrenderable = math("unrenderable");
    unrenderable.steps[3].observation = Some("a </observation> b".into());
    let cases: Vec<(Traj, &str)> = vec![
        (flagged, "format_ok is false (step 10: <answer> cannot follow <suggested_answer>; expected <think>)"),
        (lying, "steps break the CoA grammar: step 0: <plan> after the start is not preceded by <think>; expected <think>"),
        (unknown, "step 5: unknown role `critique`"),
        (unrenderable, "cannot render: step 3 (<code>): <observation> body holds its closing tag </observation>"),
    ];
    for (t, want) in &cases {
        for to in ["coa-text", "alpaca-json", "verl"] {
            let input = write(dir.path(), "bad.parquet", &[math("ok"), t.clone()]);
            let out = dir.path().join(format!("out-{to}"));
            let o = convert(&["-i", s(&input), "--to", to, "-o", s(&out)]);
            let err = stderr(&o);
            assert!(!o.status.success(), "{}: succeeded", t.task_id);
            assert!(err.contains(&format!("row 1, task `{}`: {want}", t.task_id)), "{to}: {err}");
            assert!(!out.exists(), "{to}: output left behind");
        }
    }
    // --skip-bad.
    let mut all: Vec<Traj> = cases.iter().map(|(t, _)| t.clone()).collect();
    all.insert(2, multihop("good-1"));
    all.push(math("good-2"));
    let input = write(dir.path(), "all.parquet", &all);
    let out = dir.path().join("good.parquet");
    let rejects = dir.path().join("rejects.arrow");
    let o = convert(&["-i", s(&input), "-o", s(&out), "--skip-bad", s(&rejects)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(summary["rejected"], 4);
    assert_eq!(strings(&read_coa(&out), "task_id"), ["good-1", "good-2"]);
    let (schema, batches) = io::read_all(Some(&rejects), &TRAJECTORIES).unwrap();
    let rb = arrow::compute::concat_batches(&schema, &batches).unwrap();
    assert_eq!(strings(&rb, "task_id"), ["flagged", "lying", "unknown-role", "unrenderable"]);
    for (reason, (_, want)) in strings(&rb, "reject_reason").iter().zip(&cases) {
        assert_eq!(reason, want);
    }
    for c in &TRAJECTORIES.columns {
        assert!(rb.column_by_name(c.name).is_some());
    }
}

#[test]
fn alpaca_json_export() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "traj.parquet", &[multihop("mh"), math("m")]);
    let json_path = dir.path().join("sft").join("data.json");
    let o = convert(&["-i", s(&input), "--to", "alpaca-json", "-o", s(&json_path)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let recs = v.as_array().unwrap();
    assert_eq!(recs.len(), 2);
    let coa = dir.path().join("coa.parquet");
    assert!(convert(&["-i", s(&input), "-o", s(&coa)]).status.success());
    let b = read_coa(&coa);
    for (k, r) in recs.iter().enumerate() {
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["instruction", "input", "output"]);
        assert_eq!(r["instruction"], strings(&b, "prompt")[k]);
        assert_eq!(r["input"], "");
        assert_eq!(r["output"], strings(&b, "text")[k]);
    }
    // To stdout, and an empty input gives an empty array.
    let o = convert(&["-i", s(&input), "--to", "alpaca-json"]);
    assert!(o.status.success());
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap(), v);
    let empty = dir.path().join("empty.parquet");
    io::write_all(Some(&empty), None, &TRAJECTORIES.schema(), &[], &Provenance::default()).unwrap();
    let o = convert(&["-i", s(&empty), "--to", "alpaca-json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8(o.stdout).unwrap(), "[\n]\n");
    assert!(!convert(&["-i", s(&input), "--to", "alpaca-json", "--format", "parquet"]).status.success());
    // A device is written in place, never replaced by a renamed temporary file.
    let o = convert(&["-i", s(&input), "--to", "alpaca-json", "-o", "/dev/null"]);
    assert!(o.status.success(), "{}", stderr(&o));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
}

fn code_task(id: &str, stdio: bool) -> Task {
    Task {
        task_id: id.into(),
        suite: "code".into(),
        split: "train".into(),
        source: "synthetic".into(),
        question: "Write `double(x)` returning 2*x.".into(),
        tools: vec!["code".into()],
        entry_point: Some("double".into()),
        test_code: (!stdio).then(|| "assert double(2) == 4\n".into()),
        stdio_tests: if stdio { vec![StdioTest { stdin: "2\n".into(), expected_stdout: "4\n".into() }] } else { vec![] },
        ..Default::default()
    }
}

/// The verl export reads back through the verl importer of `coa-generate tasks --import`.
#[test]
fn verl_export_reimports() {
    let dir = tempfile::tempdir().unwrap();
    let mut qa = multihop("qa-1");
    qa.suite = "qa".into();
    let rows = vec![multihop("mh-1"), math("m-1"), code("c-fn"), qa, code("c-io"), math("m-2")];
    let input = write(dir.path(), "traj.parquet", &rows);
    let tasks = dir.path().join("tasks.parquet");
    let batch = rows::to_batch(&[code_task("c-fn", false), code_task("c-io", true)]).unwrap();
    io::write_all(Some(&tasks), None, &TASKS.schema(), &[batch], &Provenance::default()).unwrap();

    // Code tasks need the tasks table for their test spec.
    let out = dir.path().join("rl.parquet");
    let o = convert(&["-i", s(&input), "--to", "verl", "-o", s(&out)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("row 2, task `c-fn`: code task: its verl ground truth is the test spec"), "{}", stderr(&o));
    assert!(!out.exists());

    let o = convert(&["-i", s(&input), "--to", "verl", "--tasks", s(&tasks), "--split", "train", "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(&std::fs::read(&out).unwrap()[..4], b"PAR1");

    // Our own reader sees the verl layout.
    let reader = io::open_any(Some(&out)).unwrap();
    let schema = reader.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["data_source", "prompt", "ability", "reward_model", "extra_info"]);
    let b = arrow::compute::concat_batches(&schema, &reader.map(Result::unwrap).collect::<Vec<_>>()).unwrap();
    assert_eq!(strings(&b, "data_source"), ["coa-multihop", "coa-math", "coa-code", "coa-qa", "coa-code", "coa-math"]);
    assert_eq!(strings(&b, "ability"), ["multihop", "math", "code", "qa", "code", "math"]);
    let ei = b.column_by_name("extra_info").unwrap().as_struct();
    assert_eq!(ei.column_by_name("index").unwrap().as_primitive::<Int64Type>().values(), &[0, 1, 2, 3, 4, 5]);
    let rm = b.column_by_name("reward_model").unwrap().as_struct();
    assert!(rm.column_by_name("style").unwrap().as_string::<i32>().iter().all(|s| s == Some("rule")));

    // And the importer of real task files reads it back: count, questions, answers, tests.
    let imported = coa_tasks::import::import_file(&out, None).unwrap();
    assert_eq!(imported.len(), rows.len());
    for (t, r) in imported.iter().zip(&rows) {
        assert_eq!(t.question, coa_format::build_prompt(&r.suite, &r.question), "{}", r.task_id);
        assert_eq!(t.split, "train");
        let want_suite = if r.suite == "multihop" { "qa" } else { r.suite.as_str() };
        assert_eq!(t.suite, want_suite, "{}", r.task_id);
        if r.suite == "code" {
            assert!(t.answers.is_empty());
        } else {
            assert_eq!(t.answers, vec![r.answers[0].clone()], "{}", r.task_id);
        }
        assert!(t.extra.as_deref().unwrap().contains(&format!("\"task_id\":\"{}\"", r.task_id)), "{:?}", t.extra);
    }
    assert_eq!(imported[2].test_code.as_deref(), Some("assert double(2) == 4\n"));
    assert_eq!(imported[4].stdio_tests, vec![StdioTest { stdin: "2\n".into(), expected_stdout: "4\n".into() }]);

    // A non-code trajectory without a gold answer cannot be a verl row.
    let mut no_gold = math("no-gold");
    no_gold.answers.clear();
    let input = write(dir.path(), "nogold.parquet", &[no_gold]);
    let o = convert(&["-i", s(&input), "--to", "verl", "-o", s(&out)]);
    assert!(stderr(&o).contains("row 0, task `no-gold`: no gold answer for the verl ground truth"), "{}", stderr(&o));
    assert!(!convert(&["-i", s(&input), "--to", "verl", "--format", "ipc"]).status.success());
    assert!(!convert(&["-i", s(&input), "--tasks", s(&tasks)]).status.success());
}

#[test]
fn wrong_input_table_and_many_rows() {
    let dir = tempfile::tempdir().unwrap();
    // A coa_text table is not a trajectories table.
    let input = write(dir.path(), "traj.parquet", &[math("a")]);
    let coa = dir.path().join("coa.parquet");
    assert!(convert(&["-i", s(&input), "-o", s(&coa)]).status.success());
    let o = convert(&["-i", s(&coa)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("holds the `coa_text` table, expected the `trajectories` table"), "{}", stderr(&o));

    // Thousands of rows over several units keep their order; output is deterministic.
    let rows: Vec<Traj> = (0..5000).map(|i| if i % 3 == 0 { multihop(&format!("t{i:05}")) } else { math(&format!("t{i:05}")) }).collect();
    let input = write(dir.path(), "many.parquet", &rows);
    let a = convert(&["-i", s(&input)]);
    assert!(a.status.success(), "{}", stderr(&a));
    let b = convert(&["-i", s(&input)]);
    assert_eq!(a.stdout, b.stdout);
    let reader = io::open_bytes("stdout", a.stdout.into(), Some(&COA_TEXT)).unwrap();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let ids = strings(&all, "task_id");
    assert_eq!(ids, (0..5000).map(|i| format!("t{i:05}")).collect::<Vec<_>>());
}
