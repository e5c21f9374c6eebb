//! Runs the real `coa-convert` binary on small `trajectories` tables built here and reads its
//! outputs back: coa_text, alpaca JSON, verl Parquet (re-imported with the coa-tasks importer),
//! and every unhappy path.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int32Type;
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
            step("plan", "Compute 6*7."),
            step("think", "Run it."),
            tool("code", "print(6 * 7)", CODE_OBS),
            step("reflection", "42 is plausible."),
            step("think", "Answer."),
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
            step("plan", "Write and test."),
            step("think", "Test."),
            tool("code", "def double(x):\n    return 2 * x\nprint(double(2))", "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n4\n[STDOUT:END]"),
            step("reflection", "Tests pass."),
            step("think", "Works."),
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
            "<plan>Compute 6*7.</plan>\n<think>Run it.</think>\n<code>\n```py\nprint(6 * 7)\n```\n</code>\n\
             <observation>{CODE_OBS}</observation>\n<reflection>42 is plausible.</reflection>\n<think>Answer.</think>\n<answer>\\boxed{{42}}</answer>"
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
    unknown.steps[3].role = "critique".into();
    let mut unrenderable = math("unrenderable");
    unrenderable.steps[2].observation = Some("a </observation> b".into());
    let cases: Vec<(Traj, &str)> = vec![
        (flagged, "format_ok is false (step 10: <answer> cannot follow <suggested_answer>; expected <think>)"),
        (lying, "steps break the CoA grammar: step 0: <plan> after the start is not preceded by <think>; expected <think>"),
        (unknown, "step 3: unknown role `critique`"),
        (unrenderable, "cannot render: step 2 (<code>): <observation> body holds its closing tag </observation>"),
    ];
    for (t, want) in &cases {
        for to in ["coa-text", "alpaca-json", "sharegpt", "verl"] {
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

/// The `coa_text` rows of `input` (prompts, texts, observation spans as character ranges).
fn coa_rows(dir: &Path, input: &Path) -> Vec<(String, String, Vec<(usize, usize)>)> {
    let coa = dir.join("coa-rows.parquet");
    assert!(convert(&["-i", s(input), "-o", s(&coa)]).status.success());
    let b = read_coa(&coa);
    let spans = b.column_by_name("observation_spans").unwrap().as_list::<i32>();
    (0..b.num_rows())
        .map(|row| {
            let sp = spans.value(row);
            let sp = sp.as_struct();
            let (st, en) = (sp.column(0).as_primitive::<Int32Type>(), sp.column(1).as_primitive::<Int32Type>());
            let ranges = (0..sp.len()).map(|k| (st.value(k) as usize, en.value(k) as usize)).collect();
            (strings(&b, "prompt")[row].clone(), strings(&b, "text")[row].clone(), ranges)
        })
        .collect()
}

fn char_slice(text: &str, (a, b): (usize, usize)) -> String {
    text.chars().skip(a).take(b - a).collect()
}

fn dataset_info(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("dataset_info.json")).unwrap()).unwrap()
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
    for (r, (prompt, text, spans)) in recs.iter().zip(coa_rows(dir.path(), &input)) {
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["instruction", "input", "output"]);
        assert_eq!(r["instruction"], prompt);
        assert_eq!(r["input"], "");
        // The CoA text, a blank line before and after each observation block.
        let mut want = text.clone();
        for &span in spans.iter().rev() {
            let block = char_slice(&text, span);
            want = want.replacen(&format!("\n{block}\n"), &format!("\n\n{block}\n\n"), 1);
        }
        assert_eq!(r["output"], want);
        assert_eq!(r["output"].as_str().unwrap().matches("</observation>\n\n<").count(), spans.len());
    }
    // dataset_info.json beside it, in LLaMA-Factory's alpaca layout.
    assert_eq!(
        dataset_info(&dir.path().join("sft"))["data"],
        serde_json::json!({"file_name": "data.json", "columns": {"prompt": "instruction", "query": "input", "response": "output"}})
    );
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
    assert!(!Path::new("/dev/dataset_info.json").exists());
}

/// Qwen2's pre-tokenizer split (its tokenizer.json): what AFM trains on.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A byte-level BPE with Qwen2's pre-tokenizer and no CoA special tokens (as in Qwen2.5's
/// vocabulary), trained on `texts`.
fn qwen_like_tokenizer(texts: &[String]) -> tokenizers::Tokenizer {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::SplitDelimiterBehavior;
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    let split = Split::new(SplitPattern::Regex(QWEN2_SPLIT.into()), SplitDelimiterBehavior::Isolated, false).unwrap();
    tok.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ]))));
    tok.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    let trainer = BpeTrainerBuilder::new().vocab_size(1500).show_progress(false).initial_alphabet(ByteLevel::alphabet().into_iter().collect()).build();
    tok.train(&mut TrainerWrapper::BpeTrainer(trainer), texts.iter().map(String::as_str)).unwrap();
    tok
}

/// What AFM's LLaMA-Factory fork does with `--ignore_observation true` (its
/// `_mask_search_result_tokens`): the token ids of `<observation` open a masked region, those of
/// `observation>\n\n` close it. Returns the masked regions as decoded text and whether every
/// region closed (the fork drops an example with an unclosed one).
fn afm_fork_masks(tok: &tokenizers::Tokenizer, response: &str) -> (Vec<String>, bool) {
    let ids = |t: &str| tok.encode(t, false).unwrap().get_ids().to_vec();
    let (tokens, start, end) = (ids(response), ids("<observation"), ids("observation>\n\n"));
    let (mut regions, mut inside, mut region_start, mut i) = (Vec::new(), false, 0, 0);
    while i < tokens.len() {
        if !inside && tokens[i..].starts_with(&start) {
            inside = true;
            region_start = i;
            i += start.len();
        } else if inside && tokens[i..].starts_with(&end) {
            inside = false;
            i += end.len();
            regions.push(tok.decode(&tokens[region_start..i], false).unwrap());
        } else {
            i += 1;
        }
    }
    (regions, !inside)
}

#[test]
fn alpaca_export_is_masked_by_afms_llama_factory_fork() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<Traj> = (0..6).map(|i| if i % 2 == 0 { multihop(&format!("mh{i}")) } else { math(&format!("m{i}")) }).collect();
    let input = write(dir.path(), "traj.parquet", &rows);
    let json_path = dir.path().join("sft.json");
    assert!(convert(&["-i", s(&input), "--to", "alpaca-json", "-o", s(&json_path)]).status.success());
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let outputs: Vec<String> = v.as_array().unwrap().iter().map(|r| r["output"].as_str().unwrap().to_string()).collect();
    let coa = coa_rows(dir.path(), &input);
    let mut training: Vec<String> = outputs.clone();
    training.extend(coa.iter().map(|(_, t, _)| t.clone()));
    let tok = qwen_like_tokenizer(&training);
    let mut masked = 0;
    for (out, (_, text, spans)) in outputs.iter().zip(&coa) {
        let (regions, closed) = afm_fork_masks(&tok, out);
        assert!(closed, "an observation region never closes: the fork would drop the example");
        let want: Vec<String> = spans.iter().map(|&sp| format!("{}\n\n", char_slice(text, sp))).collect();
        assert_eq!(regions, want, "exactly the observation blocks are masked");
        masked += regions.len();
        // The same text with one newline after each block (the coa_text layout) is not masked.
        let (regions, closed) = afm_fork_masks(&tok, text);
        assert!(regions.is_empty() && !closed);
    }
    assert_eq!(masked, 9, "3 + 3 + 3 multihop observations, 1 each for the three math rows");
}

/// What upstream LLaMA-Factory's sharegpt converter accepts (its `SharegptDatasetConverter`):
/// the dataset_info.json entry maps the columns and role tags; turns alternate human/observation
/// (odd positions) with gpt/function (even positions), and an example ends with a gpt turn.
#[test]
fn sharegpt_export_reads_as_llama_factory_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "traj.parquet", &[multihop("mh"), math("m"), code("c")]);
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("dataset_info.json"), r#"{"identity": {"file_name": "identity.json"}}"#).unwrap();
    let out = data.join("coa_sft.json");
    let o = convert(&["-i", s(&input), "--to", "sharegpt", "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));

    let info = dataset_info(&data);
    assert_eq!(info["identity"]["file_name"], "identity.json", "existing entries are kept");
    let entry = &info["coa_sft"];
    assert_eq!(entry["formatting"], "sharegpt");
    let file = data.join(entry["file_name"].as_str().unwrap());
    let column = entry["columns"]["messages"].as_str().unwrap();
    let tag = |k: &str| entry["tags"][k].as_str().unwrap().to_string();
    let (role, content) = (tag("role_tag"), tag("content_tag"));
    let (user, assistant, observation) = (tag("user_tag"), tag("assistant_tag"), tag("observation_tag"));

    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let examples = v.as_array().unwrap();
    assert_eq!(examples.len(), 3);
    for (ex, (prompt, text, spans)) in examples.iter().zip(coa_rows(dir.path(), &input)) {
        let turns = ex[column].as_array().unwrap();
        assert_eq!(turns.len() % 2, 0, "an even number of turns, ending with the assistant");
        let mut trained = Vec::new();
        let mut masked = Vec::new();
        for (i, t) in turns.iter().enumerate() {
            let (r, c) = (t[&role].as_str().unwrap(), t[&content].as_str().unwrap());
            if i % 2 == 0 {
                assert!(r == user || r == observation, "turn {i}: {r}");
                if i > 0 {
                    assert_eq!(r, observation);
                    masked.push(c.to_string());
                }
            } else {
                assert_eq!(r, assistant, "turn {i}");
                trained.push(c.to_string());
            }
        }
        assert_eq!(turns[0][&content], prompt);
        // The observation turns are the observation blocks; everything else is trained on, and
        // the turns joined back give the CoA text.
        let blocks: Vec<String> = spans.iter().map(|&sp| char_slice(&text, sp)).collect();
        assert_eq!(masked, blocks);
        let joined: Vec<String> = turns[1..].iter().map(|t| t[&content].as_str().unwrap().to_string()).collect();
        assert_eq!(joined.join("\n"), text);
        assert!(trained.iter().all(|t| !t.contains("<observation>")));
        assert!(trained.last().unwrap().ends_with("</answer>"));
    }
    // A broken dataset_info.json is refused before anything is written.
    std::fs::write(data.join("dataset_info.json"), "{oops").unwrap();
    std::fs::remove_file(&out).unwrap();
    let o = convert(&["-i", s(&input), "--to", "sharegpt", "-o", s(&out)]);
    assert!(!o.status.success() && stderr(&o).contains("dataset_info.json: not valid JSON"), "{}", stderr(&o));
    assert!(!out.exists());
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

/// A verl Parquet file as verl reads it (pandas rows: nested structs and lists as JSON).
fn verl_rows(path: &Path) -> Vec<serde_json::Value> {
    let reader = io::open_any(Some(path)).unwrap();
    let schema = reader.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["data_source", "prompt", "ability", "reward_model", "extra_info"]);
    reader.flat_map(|b| serde_arrow::from_record_batch::<Vec<serde_json::Value>>(&b.unwrap()).unwrap()).collect()
}

/// What verl and AFM's reward and tools take from a row: the user prompt, every gold answer in
/// the QA ground truth, the tools' create_kwargs.
fn check_as_verl_reads(row: &serde_json::Value, suite: &str, question: &str, answers: &[String]) {
    assert_eq!(row["prompt"], serde_json::json!([{"content": coa_format::build_prompt(suite, question), "role": "user"}]));
    assert_eq!(row["ability"], suite);
    // our own tasks: the names AFM's reward manager dispatches on for their kind of answer
    let data_source = match suite {
        "math" => "math_dapo",
        "code" => "skywork",
        "multihop" => "hotpotqa",
        _ => "nq",
    };
    assert_eq!(row["data_source"], data_source);
    assert_eq!(row["reward_model"]["style"], "rule");
    let gt = row["reward_model"]["ground_truth"].as_str().unwrap();
    match suite {
        "math" => assert_eq!(gt, answers[0]),
        "code" => assert!(gt.contains("\"functional\"") || gt.contains("\"stdin\""), "{gt}"),
        _ => assert_eq!(serde_json::from_str::<serde_json::Value>(gt).unwrap(), serde_json::json!({"target": answers, "question": question})),
    }
    let ei = &row["extra_info"];
    assert_eq!(ei["need_tools_kwargs"], true);
    assert_eq!(ei["question"], question);
    for tool in ["web_search", "crawl_page", "code"] {
        let kw = &ei["tools_kwargs"][tool]["create_kwargs"];
        assert_eq!((kw["question"].as_str(), kw["data_source"].as_str()), (Some(question), Some(data_source)), "{tool}");
        if suite != "code" {
            assert_eq!(kw["ground_truth"], serde_json::json!(answers), "{tool}");
        }
    }
}

/// The verl export in AFM's layout, as verl reads it, and back through our importer.
#[test]
fn verl_export_reads_as_verl_reads_it_and_reimports() {
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
    assert!(stderr(&o).contains("row 2, task `c-fn`: code task `c-fn` has no tests for its verl ground truth (pass the tasks table with --tasks)"), "{}", stderr(&o));
    assert!(!out.exists());

    let o = convert(&["-i", s(&input), "--to", "verl", "--tasks", s(&tasks), "--split", "train", "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(&std::fs::read(&out).unwrap()[..4], b"PAR1");
    let read = verl_rows(&out);
    assert_eq!(read.len(), rows.len());
    for (k, (row, r)) in read.iter().zip(&rows).enumerate() {
        check_as_verl_reads(row, &r.suite, &r.question, &r.answers);
        assert_eq!((row["extra_info"]["index"].as_str(), row["extra_info"]["split"].as_str()), (Some(k.to_string().as_str()), Some("train")));
        assert_eq!(row["extra_info"]["task_id"], r.task_id);
    }
    assert_eq!(read[0]["extra_info"]["answer"], serde_json::json!(["Ardena Varos", "A. Varos"]), "every gold answer, not the first");

    // And the importer of real task files reads it back: count, questions, answers, tests.
    let imported = coa_tasks::import::import_file(&out, Some("train")).unwrap();
    assert_eq!(imported.len(), rows.len());
    for (t, r) in imported.iter().zip(&rows) {
        assert_eq!(t.question, r.question, "{}: our instruction is split off again", r.task_id);
        assert_eq!(t.system_prompt.as_deref(), Some(coa_format::instruction(&r.suite)));
        assert_eq!(t.split, "train");
        let want_suite = if r.suite == "multihop" { "qa" } else { r.suite.as_str() };
        assert_eq!(t.suite, want_suite, "{}", r.task_id);
        if r.suite == "code" {
            assert!(t.answers.is_empty());
        } else {
            assert_eq!(t.answers, r.answers, "{}", r.task_id);
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

/// `tasks` written as a tasks table in `dir`, exported `--to verl`: (the table, the export, its
/// rows as verl reads them, one per task).
fn tasks_to_verl(dir: &Path, tasks: &[Task]) -> (PathBuf, PathBuf, Vec<serde_json::Value>) {
    let path = dir.join("tasks.parquet");
    io::write_all(Some(&path), None, &TASKS.schema(), &[rows::to_batch(tasks).unwrap()], &Provenance::default()).unwrap();
    let out = dir.join("rl.parquet");
    let o = convert(&["-i", s(&path), "--to", "verl", "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let read = verl_rows(&out);
    assert_eq!(read.len(), tasks.len());
    (path, out, read)
}

/// Tasks go to RL directly, the ones the teacher failed included.
#[test]
fn verl_export_straight_from_a_tasks_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut math_task = Task { task_id: "m-9".into(), suite: "math".into(), split: "train".into(), question: "What is 6 × 7?".into(), answers: vec!["42".into()], ..Default::default() };
    let qa_task = Task { task_id: "q-9".into(), suite: "qa".into(), split: "train".into(), question: "Who founded Këlmo Labs?".into(), answers: vec!["Ardena Varos".into(), "A. Varos".into()], ..Default::default() };
    let tasks = vec![math_task.clone(), qa_task.clone(), code_task("c-9", true)];
    let (path, out, read) = tasks_to_verl(dir.path(), &tasks);
    for (row, t) in read.iter().zip(&tasks) {
        check_as_verl_reads(row, &t.suite, &t.question, &t.answers);
    }
    assert_eq!(read[2]["reward_model"]["ground_truth"], r#"{"stdin":["2\n"],"expected_output":["4\n"],"question_id":"c-9"}"#);
    // Several math golds go as AFM's `{"target": [...]}`.
    math_task.answers.push("42.0".into());
    io::write_all(Some(&path), None, &TASKS.schema(), &[rows::to_batch(&[math_task]).unwrap()], &Provenance::default()).unwrap();
    assert!(convert(&["-i", s(&path), "--to", "verl", "-o", s(&out)]).status.success());
    assert_eq!(verl_rows(&out)[0]["reward_model"]["ground_truth"], r#"{"target":["42","42.0"]}"#);
    assert_eq!(coa_tasks::import::import_file(&out, None).unwrap()[0].answers, vec!["42", "42.0"]);
    // A task without a ground truth is named.
    let bad = Task { task_id: "q-0".into(), suite: "qa".into(), question: "?".into(), ..Default::default() };
    io::write_all(Some(&path), None, &TASKS.schema(), &[rows::to_batch(&[qa_task, bad]).unwrap()], &Provenance::default()).unwrap();
    let o = convert(&["-i", s(&path), "--to", "verl", "-o", s(&out)]);
    assert!(!o.status.success() && stderr(&o).contains("row 1, task `q-0`: no gold answer"), "{}", stderr(&o));
    // Another table is refused with the tables --to verl reads.
    let coa = dir.path().join("coa.parquet");
    assert!(convert(&["-i", s(&write(dir.path(), "t.parquet", &[math("x")])), "-o", s(&coa)]).status.success());
    let o = convert(&["-i", s(&coa), "--to", "verl", "-o", s(&out)]);
    assert!(!o.status.success() && stderr(&o).contains("holds the `coa_text` table; --to verl reads `trajectories`"), "{}", stderr(&o));
}

/// Real task files (where present) and our own suites, imported, exported to verl straight from
/// the tasks table, then loaded as AFM's RL training loads them: each row keeps the data source
/// AFM's reward manager dispatches on, LiveCodeBench's ground truth keeps its `question_id`, and
/// `extra_info.index` is the file's own index as a string. `tests/afm/load_verl.py` then reads the
/// Parquet the way AFM's RLHFDataset and reward manager do (with pyarrow: `COA_BENCH_PYTHON`, else
/// the bench venv `.venv`), or the test prints why it skipped that part.
#[test]
fn verl_export_loads_as_afm_training_loads_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut tasks: Vec<Task> = Vec::new();
    // (file, its data_source, how many rows to take)
    let files = [("math500.parquet", "MATH500"), ("aime24.parquet", "aime24"), ("livecodebench_v4.parquet", "skywork_livecodebench_v4"), ("nq_full.jsonl", "nq")];
    let mut real = Vec::new();
    for (file, source) in files {
        let Some(path) = coa_tasks::external::file_or_skip("verl_export_loads_as_afm_training_loads_it", file) else { continue };
        let imported = coa_tasks::import::import_file(&path, Some("train")).unwrap();
        // LiveCodeBench: both test layouts (stdio first in the file, functional later)
        let picked: Vec<Task> = if source.contains("livecodebench") {
            let io = imported.iter().filter(|t| !t.stdio_tests.is_empty()).take(2);
            io.chain(imported.iter().filter(|t| t.test_code.is_some()).take(2)).cloned().collect()
        } else {
            imported.into_iter().take(3).collect()
        };
        real.extend(picked.iter().map(|t| (t.task_id.clone(), source)));
        tasks.extend(picked);
    }
    for suite in [coa_tasks::Suite::Math, coa_tasks::Suite::Code, coa_tasks::Suite::Multihop] {
        tasks.extend(coa_tasks::generate(suite, 2, 5, coa_tasks::Split::Train).unwrap().tasks);
    }
    tasks.push(Task { task_id: "q-1".into(), suite: "qa".into(), split: "train".into(), source: "synthetic".into(), question: "Who founded Këlmo Labs?".into(), answers: vec!["Ardena Varos".into()], ..Default::default() });
    let (_, out, read) = tasks_to_verl(dir.path(), &tasks);
    for (row, t) in read.iter().zip(&tasks) {
        let ei = &row["extra_info"];
        assert_eq!(ei["task_id"], t.task_id);
        assert_eq!(ei["source"], t.source);
        assert!(ei["index"].is_string(), "{}: index {}", t.task_id, ei["index"]);
        match real.iter().find(|(id, _)| *id == t.task_id) {
            Some((_, source)) => {
                assert_eq!(row["data_source"], *source, "{}: the file's own data_source", t.task_id);
                // the file's own index: LiveCodeBench's is the question id
                let own: serde_json::Value = t.extra.as_deref().map_or(serde_json::Value::Null, |e| serde_json::from_str(e).unwrap());
                if own.get("index").is_some() {
                    assert_eq!(ei["index"], own["index"], "{}", t.task_id);
                }
            }
            None => check_as_verl_reads(row, &t.suite, &t.question, &t.answers),
        }
        if t.suite == "code" {
            let gt: serde_json::Value = serde_json::from_str(row["reward_model"]["ground_truth"].as_str().unwrap()).unwrap();
            let want = if t.source.contains("livecodebench") { ei["index"].as_str().unwrap().to_string() } else { t.task_id.clone() };
            assert_eq!(gt["question_id"], want, "{}: {gt}", t.task_id);
        }
    }
    // Back through our importer, the LiveCodeBench ground truth's question id is still there.
    let again = coa_tasks::import::import_file(&out, Some("train")).unwrap();
    assert_eq!(again.len(), tasks.len());

    let python = std::env::var_os("COA_BENCH_PYTHON").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"));
    let has_pyarrow = Command::new(&python).args(["-c", "import pyarrow"]).output().is_ok_and(|o| o.status.success());
    if !has_pyarrow {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "verl_export_loads_as_afm_training_loads_it: AFM loader skipped: no Python with pyarrow at {} (make bench-io builds .venv, or set COA_BENCH_PYTHON)", python.display());
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/afm/load_verl.py");
    let o = Command::new(&python).arg(&script).arg(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    eprintln!("{stdout}");
    assert!(o.status.success(), "AFM's loader refuses the export:\n{stdout}{}", String::from_utf8_lossy(&o.stderr));
    for name in ["math_dapo", "skywork", "nq", "hotpotqa"] {
        assert!(stdout.contains(&format!("{name}: ")), "{name} rows: {stdout}");
    }

    // The loader fails where AFM's code would: on the old `coa-math` data_source.
    let old = dir.path().join("old.parquet");
    let script_old = format!(
        "import pyarrow as pa, pyarrow.parquet as pq\nt = pq.read_table({out:?})\n\
         t = t.set_column(0, 'data_source', pa.array(['coa-math'] * t.num_rows))\npq.write_table(t, {old:?})\n",
        out = out.display().to_string(),
        old = old.display().to_string()
    );
    assert!(Command::new(&python).args(["-c", &script_old]).status().unwrap().success());
    let o = Command::new(&python).arg(&script).arg(&old).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stdout).contains("NotImplementedError"), "{}", String::from_utf8_lossy(&o.stdout));
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
