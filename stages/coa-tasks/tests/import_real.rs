//! The importers against the real task files (`$COA_EXTERNAL_DATA`, default
//! `../shared/data/external`; each test that needs one prints a `skipped:` line without it), plus
//! the unhappy paths and AFM's other layouts on small files built in a temp dir.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Int64Array, ListArray, StringArray, StructArray};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Fields};
use arrow::record_batch::RecordBatch;
use coa_schemas::rows::Task;
use coa_tasks::external::file_or_skip;
use coa_tasks::import::{import_file, import_file_with_layout, split_instruction, Layout};

/// The real file `name` imported, or `None` after the test's skip line.
fn import(test: &str, name: &str) -> Option<(Layout, Vec<Task>)> {
    let path = file_or_skip(test, name)?;
    Some(import_file_with_layout(&path, None).unwrap_or_else(|e| panic!("importing {}: {e:#}", path.display())))
}

fn assert_unique_ids(tasks: &[Task]) {
    let ids: HashSet<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids.len(), tasks.len(), "task ids must be unique");
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("coa-import-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn aime24_parquet() {
    let Some((layout, tasks)) = import("aime24_parquet", "aime24.parquet") else { return };
    assert_eq!(layout, Layout::Verl);
    assert_eq!(tasks.len(), 30);
    assert_unique_ids(&tasks);
    let t = &tasks[0];
    assert_eq!(t.task_id, "aime24-0");
    assert_eq!(t.suite, "math");
    assert_eq!(t.source, "aime24");
    assert_eq!(t.answers, vec!["204"]);
    assert_eq!(t.tools, vec!["code"]);
    assert_eq!(t.split, "test", "a benchmark is test data, whatever extra_info.split says");
    // AFM's 3,954-character instruction block is separated from the question.
    assert!(t.question.starts_with("Every morning Aya goes for a $9$-kilometer-long walk"), "{}", &t.question[..200]);
    assert!(t.question.ends_with("including the $t$ minutes spent in the coffee shop."), "{}", t.question);
    let block = t.system_prompt.as_deref().expect("the instruction block");
    assert!(block.starts_with("Solve the given task step by step.") && block.contains("Always follow 'plan'"), "{block}");
    assert!(!t.question.contains("'plan'") && !t.question.contains("Task:"));
    assert!(tasks.iter().all(|t| t.system_prompt.as_deref() == Some(block) && !t.question.contains("structured functions")));
    let extra: serde_json::Value = serde_json::from_str(t.extra.as_deref().unwrap()).unwrap();
    assert_eq!(extra["index"], "0");
    assert_eq!(extra["split"], "train", "the file's own label is kept in extra");
    assert_eq!(extra["need_tools_kwargs"], true);
    assert_eq!(extra["tools_kwargs"]["code"]["TODO"], "create_kwargs");
    assert!(tasks.iter().all(|t| t.suite == "math" && t.answers.len() == 1 && t.stdio_tests.is_empty()));

    let told = import_file(&file_or_skip("aime24_parquet", "aime24.parquet").unwrap(), Some("train")).unwrap();
    assert!(told.iter().all(|t| t.split == "train"));
}

#[test]
fn math500_parquet() {
    let Some((_, tasks)) = import("math500_parquet", "math500.parquet") else { return };
    assert_eq!(tasks.len(), 500);
    assert_unique_ids(&tasks);
    assert!(tasks.iter().all(|t| t.suite == "math" && t.source == "MATH500" && t.split == "test"));
    assert_eq!(tasks[0].answers, vec![r"\left( 3, \frac{\pi}{2} \right)"]);
    assert!(tasks[0].question.starts_with("Convert the point $(0,3)$"), "{}", tasks[0].question);
    let answers: HashSet<&str> = tasks.iter().map(|t| t.answers[0].as_str()).collect();
    assert!(answers.contains(r"\frac{14}{3}"));
}

#[test]
fn livecodebench_parquet() {
    let Some((_, tasks)) = import("livecodebench_parquet", "livecodebench_v4.parquet") else { return };
    assert_eq!(tasks.len(), 100);
    assert_unique_ids(&tasks);
    assert!(tasks.iter().all(|t| t.suite == "code" && t.answers.is_empty() && t.tools == ["code"] && t.split == "test"));
    assert!(tasks.iter().all(|t| t.difficulty.is_some()));
    // AtCoder rows carry stdin/expected-output pairs, LeetCode rows a functional test program.
    let stdio = tasks.iter().filter(|t| !t.stdio_tests.is_empty()).count();
    let functional = tasks.iter().filter(|t| t.test_code.is_some()).count();
    assert_eq!((stdio, functional), (65, 35));
    assert!(tasks.iter().all(|t| t.stdio_tests.is_empty() != t.test_code.is_none()));

    let b = tasks.iter().find(|t| t.task_id == "skywork_livecodebench_v4-abc366_b").expect("abc366_b");
    assert_eq!(b.stdio_tests.len(), 2);
    assert_eq!(b.stdio_tests[0].stdin, "3\nabc\nde\nfghi\n");
    assert_eq!(b.stdio_tests[0].expected_stdout, "fda\ngeb\nh*c\ni\n");
    assert_eq!(b.difficulty.as_deref(), Some("easy"));

    let lc = tasks.iter().find(|t| t.task_id == "skywork_livecodebench_v4-3543").expect("leetcode 3543");
    assert!(lc.test_code.as_deref().unwrap().contains("Solution().countKConstraintSubstrings('11111', 1)"));
    // The question is the task with its starter code; AFM's instructions and answer format are apart.
    assert!(lc.question.starts_with("You are given a binary string s and an integer k."), "{}", lc.question);
    assert!(lc.question.ends_with("def countKConstraintSubstrings(self, s: str, k: int) -> int:\n        \n```"), "{:?}", lc.question);
    let block = lc.system_prompt.as_deref().unwrap();
    assert!(block.starts_with("You are an expert python code programmer.") && block.ends_with("return math.add(x,y)\n```"), "{block}");
    // AtCoder rows keep their stdin note (it tells how the program reads its input).
    assert!(b.question.contains("read the inputs from stdin"), "{}", b.question);
}

#[test]
fn nq_jsonl() {
    let Some((layout, tasks)) = import("nq_jsonl", "nq_full.jsonl") else { return };
    assert_eq!(layout, Layout::QaJson);
    assert_eq!(tasks.len(), 3610);
    assert_unique_ids(&tasks);
    let t = &tasks[0];
    assert_eq!(t.task_id, "nq-0", "named after the records' data_source");
    assert_eq!(t.question, "who got the first nobel prize in physics");
    assert_eq!(t.answers, vec!["Wilhelm Conrad Röntgen"]);
    assert_eq!((t.suite.as_str(), t.source.as_str(), t.split.as_str()), ("qa", "nq", "test"));
    assert_eq!(t.tools, vec!["web_search", "crawl_page"]);
    assert_eq!(tasks[2].answers, vec!["Olivia", "MFSK"]);
}

#[test]
fn humaneval_gzipped_runs_with_python() {
    let Some((layout, tasks)) = import("humaneval_gzipped_runs_with_python", "HumanEval.jsonl.gz") else { return };
    assert_eq!(layout, Layout::HumanEvalJsonl);
    assert_eq!(tasks.len(), 164);
    assert_unique_ids(&tasks);
    let t = &tasks[0];
    assert_eq!(t.task_id, "humaneval-0");
    assert_eq!((t.suite.as_str(), t.source.as_str()), ("code", "humaneval"));
    assert_eq!(t.entry_point.as_deref(), Some("has_close_elements"));
    assert!(t.answers.is_empty());
    assert!(t.question.contains("def has_close_elements(numbers: List[float], threshold: float) -> bool:"));
    assert!(t.question.contains("complete function"));
    let test_code = t.test_code.as_deref().unwrap();
    assert!(test_code.ends_with("\ncheck(has_close_elements)\n"));
    let solution: serde_json::Value = serde_json::from_str(t.solution.as_deref().unwrap()).unwrap();
    let code = solution["code"].as_str().unwrap();

    // The scripted teacher's solution passes the task's own tests; a wrong one fails them.
    let dir = TempDir::new("humaneval");
    let run = |name: &str, program: String| {
        let p = dir.write(name, program.as_bytes());
        Command::new("python3").arg(&p).output().unwrap_or_else(|e| panic!("python3 is needed for this test: {e}"))
    };
    let ok = run("ok.py", format!("{code}\n{test_code}"));
    assert!(ok.status.success(), "canonical solution failed: {}", String::from_utf8_lossy(&ok.stderr));
    let wrong = code.replace("return True", "return False");
    let bad = run("bad.py", format!("{wrong}\n{test_code}"));
    assert!(!bad.status.success(), "a wrong solution must fail the tests");
}

#[test]
fn gzipped_nq_and_blank_lines_are_fine() {
    let dir = TempDir::new("gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"\n{\"question\": \"q1\", \"answer\": \"a\", \"id\": 7, \"data_source\": \"tq\"}\n\r\n{\"question\": \"q2\", \"answer\": [\"b\", 3]}\n").unwrap();
    let p = dir.write("whatever.txt", &gz.finish().unwrap());
    let tasks = import_file(&p, Some("train")).unwrap();
    assert_eq!(tasks.len(), 2);
    assert_eq!((tasks[0].task_id.as_str(), tasks[0].source.as_str(), tasks[0].split.as_str()), ("tq-7", "tq", "train"));
    assert_eq!(tasks[1].task_id, "whatever-1");
    assert_eq!(tasks[1].answers, vec!["b", "3"]);
}

/// AFM's web benchmarks (GAIA, BrowseComp, HLE, WebWalker) are JSON arrays of objects with
/// `question`, `answer` and other fields (kept in `extra`).
#[test]
fn json_arrays_of_question_answer_records() {
    let dir = TempDir::new("array");
    let hle = br#"[
    {"id": 0, "question": "Compute the simplicial volume.", "answer": "11520", "answer_type": "exactMatch", "category": "Math"},
    {"id": 1, "question": "Which diagnosis?\n\nAnswer Choices:\nA. Aspiration pneumonitis\nB. Achalasia", "answer": "A", "answer_type": "multipleChoice"}
]"#;
    let (layout, tasks) = import_file_with_layout(&dir.write("hle_test.json", hle), None).unwrap();
    assert_eq!(layout, Layout::QaJson);
    assert_eq!(tasks.iter().map(|t| t.task_id.as_str()).collect::<Vec<_>>(), ["hle_test-0", "hle_test-1"]);
    let t = &tasks[1];
    assert_eq!((t.suite.as_str(), t.source.as_str(), t.split.as_str()), ("qa", "hle_test", "test"));
    assert_eq!(t.answers, vec!["A"]);
    let extra: serde_json::Value = serde_json::from_str(t.extra.as_deref().unwrap()).unwrap();
    assert_eq!(extra, serde_json::json!({"answer_type": "multipleChoice"}));
    // WebWalker: nested fields, no id; GAIA spells `Question` / `Final answer`.
    let walker = br#"[{"question": "Which program funded SUPPLY?", "answer": "EU4Health", "root_url": "https://ehaweb.org/", "info": {"domain": "conference", "Level": "medium"}}]"#;
    let tasks = import_file(&dir.write("webwalker_main.json", walker), Some("train")).unwrap();
    assert_eq!((tasks[0].task_id.as_str(), tasks[0].split.as_str()), ("webwalker_main-0", "train"));
    assert!(tasks[0].extra.as_deref().unwrap().contains("\"Level\":\"medium\""));
    let gaia = br#" [ {"task_id": "c61d", "Question": "How many studio albums?", "Final answer": "3", "Level": 1} ] "#;
    let tasks = import_file(&dir.write("gaia.json", gaia), None).unwrap();
    assert_eq!((tasks[0].question.as_str(), tasks[0].answers.clone()), ("How many studio albums?", vec!["3".to_string()]));

    // Unhappy paths name the record.
    let err = format!("{:#}", import_file(&dir.write("bad.json", b"[{\"question\": \"q\", \"answer\": \"a\"}, 7]"), None).unwrap_err());
    assert!(err.contains("bad.json") && err.contains("record 1") && err.contains("found a number"), "{err}");
    let err = format!("{:#}", import_file(&dir.write("cut.json", b"[{\"question\": \"q\", \"answer\": \"a\"},"), None).unwrap_err());
    assert!(err.contains("cut.json") && err.contains("malformed JSON at line 1") && err.contains("JSON array"), "{err}");
    let err = format!("{:#}", import_file(&dir.write("empty.json", b"[]"), None).unwrap_err());
    assert!(err.contains("no JSON records"), "{err}");
    let err = format!("{:#}", import_file(&dir.write("odd.json", br#"[{"q": 1}]"#), None).unwrap_err());
    assert!(err.contains("record 0") && err.contains("keys found") && err.contains("q"), "{err}");
}

#[test]
fn afm_instruction_blocks_are_separated_from_the_question() {
    let math = "Solve the given task step by step. \nYou must take structured functions, including 'think', 'plan', 'code', \
                'reflection', and 'answer' to solve the task.\nRequirements:\n1. Always follow 'plan', ('think', 'code', \
                'observation', 'reflection')*N, 'think', 'answer' sequences\n\nTask:\nFind $x$ if $2x = 4$.";
    let (block, question) = split_instruction(math);
    assert_eq!(question, "Find $x$ if $2x = 4$.");
    assert!(block.unwrap().ends_with("'answer' sequences"));
    // A question that merely mentions a task is left alone.
    let plain = "Task: name the capital of France.";
    assert_eq!(split_instruction(plain), (None, plain.to_string()));
}

#[test]
fn unknown_jsonl_layout_lists_keys_and_layouts() {
    let dir = TempDir::new("unknown");
    let p = dir.write("odd.jsonl", b"{\"b\": 1, \"a\": 2}\n");
    let err = format!("{:#}", import_file(&p, None).unwrap_err());
    assert!(err.contains("odd.jsonl"), "{err}");
    assert!(err.contains("a, b"), "{err}");
    for layout in ["verl", "question/answer JSON", "JSON array", "HumanEval", "`question`", "`entry_point`", "`reward_model`"] {
        assert!(err.contains(layout), "missing {layout}: {err}");
    }
}

#[test]
fn malformed_and_incomplete_lines_name_the_line() {
    let dir = TempDir::new("malformed");
    let p = dir.write("bad.jsonl", b"{\"question\": \"q\", \"answer\": [\"a\"]}\n\n{\"question\": \"q\", \"answer\": [\"a\"\n");
    let err = format!("{:#}", import_file(&p, None).unwrap_err());
    assert!(err.contains("bad.jsonl") && err.contains("line 3") && err.contains("malformed JSON at column") && !err.contains("line 1"), "{err}");

    let p = dir.write("missing.jsonl", b"{\"question\": \"q\", \"answer\": \"a\"}\n{\"question\": \"q2\"}\n");
    let err = format!("{:#}", import_file(&p, None).unwrap_err());
    assert!(err.contains("line 2") && err.contains("`answer`"), "{err}");

    let p = dir.write("type.jsonl", b"{\"question\": \"q\", \"answer\": {\"x\": 1}}\n");
    let err = format!("{:#}", import_file(&p, None).unwrap_err());
    assert!(err.contains("line 1") && err.contains("string or a list of strings"), "{err}");
}

#[test]
fn empty_and_foreign_files_are_refused() {
    let dir = TempDir::new("empty");
    let p = dir.write("empty.parquet", b"");
    let err = format!("{:#}", import_file(&p, None).unwrap_err());
    assert!(err.contains("empty.parquet") && err.contains("empty") && err.contains("HumanEval"), "{err}");

    let p = dir.write("blank.jsonl", b"\n  \n");
    assert!(format!("{:#}", import_file(&p, None).unwrap_err()).contains("only whitespace"));

    let p = dir.write("data.csv", b"question,answer\nq,a\n");
    let err = format!("{:#}", import_file(&p, None).unwrap_err());
    assert!(err.contains("not a supported task file") && err.contains("verl"), "{err}");
}

// ---- verl tables built here ----------------------------------------------------------------

fn utf8(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

/// A verl table: one row per `(data_source, ability, ground_truth)`, each prompt a system and a
/// user message; optionally an `extra_info` struct and an extra column.
fn verl_batch(rows: &[(&str, &str, &str)], extra_info: bool) -> RecordBatch {
    let n = rows.len();
    let msg_fields = Fields::from(vec![Field::new("content", DataType::Utf8, true), Field::new("role", DataType::Utf8, true)]);
    let mut contents = Vec::new();
    let mut roles = Vec::new();
    for (k, _) in rows.iter().enumerate() {
        contents.push(Some("You are careful.".to_string()));
        roles.push(Some("system"));
        contents.push(Some(format!("question {k}?")));
        roles.push(Some("user"));
    }
    let messages = StructArray::new(
        msg_fields.clone(),
        vec![Arc::new(StringArray::from(contents)) as ArrayRef, utf8(&roles)],
        None,
    );
    let item = Arc::new(Field::new("item", DataType::Struct(msg_fields), true));
    let prompt = ListArray::new(item, OffsetBuffer::from_lengths(vec![2; n]), Arc::new(messages), None);
    let rm_fields = Fields::from(vec![Field::new("ground_truth", DataType::Utf8, true), Field::new("style", DataType::Utf8, true)]);
    let reward_model = StructArray::new(
        rm_fields,
        vec![utf8(&rows.iter().map(|r| Some(r.2)).collect::<Vec<_>>()), utf8(&vec![Some("rule"); n])],
        None,
    );
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("data_source", utf8(&rows.iter().map(|r| Some(r.0)).collect::<Vec<_>>())),
        ("prompt", Arc::new(prompt)),
        ("ability", utf8(&rows.iter().map(|r| Some(r.1)).collect::<Vec<_>>())),
        ("reward_model", Arc::new(reward_model)),
        ("our_own_column", Arc::new(Int64Array::from(vec![1i64; n]))),
    ];
    if extra_info {
        // index: "7" for every row (ids must still come out unique); a list, a bool, a null.
        let list_item = Arc::new(Field::new("item", DataType::Int64, true));
        let scores =
            ListArray::new(list_item, OffsetBuffer::from_lengths(vec![2; n]), Arc::new(Int64Array::from([Some(1), None].repeat(n))), None);
        let fields = Fields::from(vec![
            Field::new("index", DataType::Utf8, true),
            Field::new("split", DataType::Utf8, true),
            Field::new("difficulty", DataType::Utf8, true),
            Field::new("flag", DataType::Boolean, true),
            Field::new("scores", scores.data_type().clone(), true),
        ]);
        let info = StructArray::new(
            fields,
            vec![
                utf8(&vec![Some("7"); n]),
                utf8(&vec![Some("train"); n]),
                utf8(&vec![None; n]),
                Arc::new(BooleanArray::from(vec![true; n])),
                Arc::new(scores),
            ],
            None,
        );
        columns.push(("extra_info", Arc::new(info)));
    }
    RecordBatch::try_from_iter(columns).unwrap()
}

fn write_parquet(dir: &TempDir, name: &str, batch: &RecordBatch) -> PathBuf {
    let p = dir.0.join(name);
    coa_schemas::io::write_all(Some(&p), None, &batch.schema(), std::slice::from_ref(batch), &Default::default()).unwrap();
    p
}

#[test]
fn verl_suites_ids_and_extra_info() {
    let dir = TempDir::new("verl");
    let stdio = r#"{"stdin": ["1\n"], "expected_output": ["2\n"]}"#;
    let batch = verl_batch(
        &[
            ("gsm8k", "arith", "42"),
            ("hotpotqa", "fact-reasoning", r#"["Paris", "paris, France"]"#),
            ("nq", "qa", "[1, 2]"),
            ("my/code", "coding", stdio),
        ],
        true,
    );
    let tasks = import_file(&write_parquet(&dir, "mixed.parquet", &batch), None).unwrap();
    let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids, ["gsm8k-7", "hotpotqa-7", "nq-7", "my-code-7"]);
    assert_eq!((tasks[0].suite.as_str(), tasks[0].answers.clone()), ("math", vec!["42".to_string()]));
    assert_eq!(tasks[1].suite, "qa");
    assert_eq!(tasks[1].answers, vec!["Paris", "paris, France"]);
    assert_eq!(tasks[1].tools, vec!["web_search", "crawl_page"]);
    assert_eq!(tasks[2].answers, vec!["[1, 2]"], "a list of non-strings is one answer");
    assert_eq!(tasks[3].suite, "code");
    assert_eq!(tasks[3].stdio_tests[0].expected_stdout, "2\n");
    let t = &tasks[0];
    assert_eq!(t.question, "question 0?");
    assert_eq!(t.system_prompt.as_deref(), Some("You are careful."));
    assert_eq!(t.split, "test");
    assert_eq!(t.difficulty, None);
    let extra: serde_json::Value = serde_json::from_str(t.extra.as_deref().unwrap()).unwrap();
    assert_eq!(extra, serde_json::json!({"index": "7", "split": "train", "difficulty": null, "flag": true, "scores": [1, null]}));

    // Our own export may lack extra_info: row numbers, split `test`, no extra.
    let batch = verl_batch(&[("nq", "qa", "x"), ("nq", "qa", "y")], false);
    let tasks = import_file(&write_parquet(&dir, "plain.parquet", &batch), None).unwrap();
    assert_eq!(tasks.iter().map(|t| t.task_id.as_str()).collect::<Vec<_>>(), ["nq-0", "nq-1"]);
    assert!(tasks.iter().all(|t| t.split == "test" && t.extra.is_none()));
}

#[test]
fn verl_unhappy_paths_name_the_row() {
    let dir = TempDir::new("verl-bad");
    let uneven = r#"{"stdin": ["1\n", "2\n"], "expected_output": ["2\n"]}"#;
    let batch = verl_batch(&[("lcb", "coding", r#"{"stdin": ["1\n"], "expected_output": ["2\n"]}"#), ("lcb", "coding", uneven)], true);
    let err = format!("{:#}", import_file(&write_parquet(&dir, "uneven.parquet", &batch), None).unwrap_err());
    assert!(err.contains("uneven.parquet") && err.contains("row 1") && err.contains("lcb-7-2") && err.contains("2 `stdin` entries but 1"), "{err}");

    let batch = verl_batch(&[("livecodebench", "coding", "print(1)")], true);
    let err = format!("{:#}", import_file(&write_parquet(&dir, "notests.parquet", &batch), None).unwrap_err());
    assert!(err.contains("row 0") && err.contains("looks like code"), "{err}");

    let batch = RecordBatch::try_from_iter(vec![("x", utf8(&[Some("1")])), ("y", utf8(&[Some("2")]))]).unwrap();
    let err = format!("{:#}", import_file(&write_parquet(&dir, "other.parquet", &batch), None).unwrap_err());
    assert!(err.contains("other.parquet") && err.contains("x: utf8, y: utf8"), "{err}");
    assert!(err.contains("`data_source`, `prompt`, `reward_model`") && err.contains("HumanEval"), "{err}");
}
