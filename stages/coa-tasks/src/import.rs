//! Importers for real task files: verl RL Parquet, question/answer JSON (lines or one array: NQ,
//! and AFM's web benchmarks GAIA, BrowseComp, HLE, WebWalker) and HumanEval JSON lines (plain or
//! gzipped), converted to rows of the `tasks` table.
//!
//! `-` reads stdin. Our own `tasks` table (e.g. edited with polars) imports as itself.
//!
//! The layout is detected from the bytes, never from the file name: `PAR1` / Arrow magic is a
//! table (read through [`coa_schemas::io::open_any`]), `1f 8b` is gzip (decompressed, then sniffed
//! again), a first non-blank byte `{` is JSON lines and `[` one JSON array of records. A table or
//! JSON object that matches no supported layout gets one error naming the file, the columns (or
//! keys) found and the layouts this module supports ([`SUPPORTED_LAYOUTS`]).
//!
//! **Split.** A benchmark file is test data: imported tasks are `test` unless `split_override`
//! says otherwise (AFM's benchmark files mark every row `split=train`; the file's own label stays
//! in `extra`). Our own `tasks` table keeps its split.
//!
//! **Instructions.** A verl prompt that carries AFM's whole instruction block (the structured
//! functions `think`, `plan`, `code`, … then `Task:` and the question, then an `Answer format:`
//! paragraph) is separated: `question` is the task alone (what our prompts wrap), the block goes
//! to `system_prompt` (after the file's own system message, if any).
//!
//! Suite mapping for verl rows, first match wins:
//! 1. `reward_model.ground_truth` is a JSON object with `stdin` and `expected_output` lists ->
//!    `code` with `stdio_tests` (LiveCodeBench AtCoder rows); with a `functional` string instead ->
//!    `code` with that program as `test_code` (LiveCodeBench LeetCode rows, which assert on
//!    `Solution().method(...)`).
//! 2. `data_source` or `ability` mentions math (math, aime, amc, gsm, olympiad, ...) -> `math`,
//!    `answers = [ground_truth]` verbatim (never split: `[-2, 7]` is an interval, not a list).
//! 3. `data_source` or `ability` mentions code but the ground truth is no test spec -> error
//!    (a code task without tests would score nothing, silently).
//! 4. otherwise `qa`: the ground truth's items when it is a JSON list of strings (or a
//!    `{target: [...]}` object, as AFM's and Search-R1's files store it), else the string itself.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    DataType, Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
    UInt32Type, UInt64Type, UInt8Type,
};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use bytes::Bytes;
use coa_schemas::io::{open_bytes, source_name, Format};
use coa_schemas::rows::{self, Shown, StdioTest, Task};
use coa_schemas::suite::Suite;
use coa_schemas::tables::{type_name, META_TABLE, TASKS};
use serde_json::{Map, Value};

/// The layouts [`import_file`] understands, with their required columns / keys.
pub const SUPPORTED_LAYOUTS: &str = "  - a coa `tasks` table (Parquet or Arrow IPC, as `coa-generate tasks` writes it)
  - verl RL table (Parquet or Arrow IPC): columns `data_source` (utf8), `prompt` (list<struct<role, content>>), \
`reward_model` (struct<ground_truth, ...>); optional `ability`, `extra_info` (struct: index, split, difficulty, ...); other columns are ignored
  - question/answer JSON: one object per line, or one JSON array of objects (AFM's GAIA, BrowseComp, HLE, WebWalker files), \
with keys `question` (string) and `answer` (string, number or list of strings); optional `data_source`, `id`; other keys are kept in `extra`
  - HumanEval JSON lines, plain or gzip-compressed: keys `task_id`, `prompt`, `entry_point`, `test`; optional `canonical_solution`";

const VERL_REQUIRED: [&str; 3] = ["data_source", "prompt", "reward_model"];
/// Keys of a question/answer record (AFM's files and GAIA's spellings).
const QUESTION_KEYS: [&str; 2] = ["question", "Question"];
const ANSWER_KEYS: [&str; 3] = ["answer", "Answer", "Final answer"];
const HUMANEVAL_REQUIRED: [&str; 4] = ["task_id", "prompt", "entry_point", "test"];
const MATH_WORDS: [&str; 10] =
    ["math", "aime", "amc", "gsm", "olympiad", "hmmt", "minerva", "numina", "deepscaler", "aops"];
const CODE_WORDS: [&str; 6] = ["code", "coding", "livecodebench", "humaneval", "mbpp", "codeforces"];

/// A task file layout recognised by [`import_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Our own `tasks` table (written by `coa-generate tasks`, perhaps edited with polars).
    Tasks,
    /// verl RL table: `data_source, prompt, ability, reward_model, extra_info`.
    Verl,
    /// Question/answer JSON (lines or an array): `question, answer`.
    QaJson,
    /// HumanEval JSON lines: `task_id, prompt, entry_point, canonical_solution, test`.
    HumanEvalJsonl,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Tasks => "coa tasks table",
            Layout::Verl => "verl RL table",
            Layout::QaJson => "question/answer JSON",
            Layout::HumanEvalJsonl => "HumanEval JSON lines",
        })
    }
}

/// Reads one real task file, detecting its layout from its bytes, and converts every row to a
/// [`Task`]. Tasks are `test` unless `split_override` names their split (module docs). Task ids
/// are unique within the file.
pub fn import_file(path: &Path, split_override: Option<&str>) -> Result<Vec<Task>> {
    import_file_with_layout(path, split_override).map(|(_, tasks)| tasks)
}

/// [`import_file`], also telling which layout was detected.
pub fn import_file_with_layout(path: &Path, split_override: Option<&str>) -> Result<(Layout, Vec<Task>)> {
    let shown = source_name(Some(path));
    let mut bytes = Vec::new();
    if shown == "stdin" {
        std::io::stdin().lock().read_to_end(&mut bytes).context("stdin: reading")?;
    } else {
        let mut file = File::open(path).with_context(|| format!("cannot open task file {shown}"))?;
        file.read_to_end(&mut bytes).with_context(|| format!("{shown}: reading"))?;
    }
    if bytes.is_empty() {
        bail!("{shown}: file is empty; expected a task file in one of the supported layouts:\n{SUPPORTED_LAYOUTS}");
    }
    if Format::sniff(&bytes).is_some() {
        return import_table(Bytes::from(bytes), &shown, split_override);
    }
    let mut gzipped = false;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut plain)
            .with_context(|| format!("{shown}: gzip data is truncated or corrupt"))?;
        if plain.is_empty() {
            bail!("{shown}: gzip content is empty; expected a task file in one of the supported layouts:\n{SUPPORTED_LAYOUTS}");
        }
        if Format::sniff(&plain).is_some() {
            bail!("{shown}: gzip-compressed Parquet/Arrow is not supported; decompress it first (gunzip)");
        }
        bytes = plain;
        gzipped = true;
    }
    let body = bytes.strip_prefix(b"\xef\xbb\xbf".as_slice()).unwrap_or(&bytes);
    // Records without a `data_source` are named after the file (`hle_test.json` -> `hle_test`).
    let stem = path.file_name().and_then(|n| n.to_str()).map(|n| n.split('.').next().unwrap_or(n)).filter(|n| !n.is_empty() && shown != "stdin");
    let default_source = id_part(stem.unwrap_or("qa")).to_lowercase();
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | Some(b'[') => import_json(&shown, body, split_override, &default_source),
        Some(_) => bail!(
            "{shown}: not a supported task file ({}first bytes {}); expected one of the supported layouts:\n{SUPPORTED_LAYOUTS}",
            if gzipped { "after gunzip, " } else { "" },
            describe_head(body)
        ),
        None => bail!("{shown}: file holds only whitespace; expected a task file in one of the supported layouts:\n{SUPPORTED_LAYOUTS}"),
    }
}

fn describe_head(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(8)];
    let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
    let text: String = head.iter().map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '.' }).collect();
    format!("{} ({text:?})", hex.join(" "))
}

/// Hands out task ids, suffixing `-2`, `-3`, ... on collisions.
#[derive(Default)]
struct Ids(HashSet<String>);

impl Ids {
    fn unique(&mut self, base: String) -> String {
        if self.0.insert(base.clone()) {
            return base;
        }
        (2..).map(|k| format!("{base}-{k}")).find(|c| self.0.insert(c.clone())).expect("unbounded")
    }
}

/// Keeps ids to one token: path separators and whitespace become `-`.
fn id_part(s: &str) -> String {
    s.trim().chars().map(|c| if c == '/' || c == '\\' || c.is_whitespace() { '-' } else { c }).collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn mentions(haystacks: &[&str], words: &[&str]) -> bool {
    haystacks.iter().any(|h| {
        let h = h.to_lowercase();
        words.iter().any(|w| h.contains(w))
    })
}

/// A string, or a number spelled as JSON spells it; `None` for anything else.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

// ---------------------------------------------------------------------------------------------
// verl RL tables

fn import_table(bytes: Bytes, shown: &str, split_override: Option<&str>) -> Result<(Layout, Vec<Task>)> {
    let reader = open_bytes(shown, bytes.clone(), None)?;
    let schema = reader.schema();
    if schema.metadata().get(META_TABLE).is_some() || TASKS.columns.iter().all(|c| schema.index_of(c.name).is_ok()) {
        return import_tasks_table(bytes, shown, split_override).map(|t| (Layout::Tasks, t));
    }
    let missing: Vec<&str> = VERL_REQUIRED.iter().copied().filter(|c| schema.index_of(c).is_err()).collect();
    if !missing.is_empty() {
        let found: Vec<String> =
            schema.fields().iter().map(|f| format!("{}: {}", f.name(), type_name(f.data_type()))).collect();
        bail!(
            "{shown}: unknown table layout: columns found: {}; a verl table also needs {}.\nSupported layouts:\n{SUPPORTED_LAYOUTS}",
            if found.is_empty() { "(none)".to_string() } else { found.join(", ") },
            missing.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
        );
    }
    let mut ids = Ids::default();
    let mut tasks = Vec::new();
    let mut row = 0usize;
    for batch in reader {
        let batch = batch?;
        let col = |name: &str| -> Option<ArrayRef> { batch.column_by_name(name).cloned() };
        let cols = VerlColumns {
            data_source: col("data_source").expect("checked"),
            prompt: col("prompt").expect("checked"),
            reward_model: col("reward_model").expect("checked"),
            ability: col("ability"),
            extra_info: col("extra_info"),
        };
        for i in 0..batch.num_rows() {
            let task = verl_row(&cols, i, split_override, &mut ids).map_err(|e| anyhow!("{shown}: row {row}: {e:#}"))?;
            tasks.push(task);
            row += 1;
        }
    }
    if tasks.is_empty() {
        bail!("{shown}: the verl table has no rows");
    }
    Ok((Layout::Verl, tasks))
}

/// Our own `tasks` table comes back as itself (checked against the schema; ids must be unique).
fn import_tasks_table(bytes: Bytes, shown: &str, split_override: Option<&str>) -> Result<Vec<Task>> {
    let mut tasks = Vec::new();
    for batch in open_bytes(shown, bytes, Some(&TASKS))? {
        tasks.extend(rows::from_batch::<Task>(&batch?)?);
    }
    let mut seen = HashSet::new();
    for t in &mut tasks {
        if !seen.insert(t.task_id.clone()) {
            bail!("{shown}: task_id {} appears more than once", Shown(&t.task_id));
        }
        if let Some(split) = split_override {
            t.split = split.to_string();
        }
    }
    if tasks.is_empty() {
        bail!("{shown}: the tasks table has no rows");
    }
    Ok(tasks)
}

struct VerlColumns {
    data_source: ArrayRef,
    prompt: ArrayRef,
    reward_model: ArrayRef,
    ability: Option<ArrayRef>,
    extra_info: Option<ArrayRef>,
}

/// What a verl ground truth says about code tests, if it is a code test spec.
#[derive(Debug)]
enum CodeSpec {
    Stdio(Vec<StdioTest>),
    Functional(String),
}

fn verl_row(cols: &VerlColumns, i: usize, split_override: Option<&str>, ids: &mut Ids) -> Result<Task> {
    let data_source = match arrow_value(cols.data_source.as_ref(), i)? {
        Value::String(s) if !s.trim().is_empty() => s,
        other => bail!("`data_source` must be a non-empty string, found {}", json_kind(&other)),
    };
    let ability = match &cols.ability {
        Some(c) => scalar_text(&arrow_value(c.as_ref(), i)?),
        None => None,
    };

    let prompt = arrow_value(cols.prompt.as_ref(), i)?;
    let Value::Array(messages) = prompt else {
        bail!("`prompt` must be a list of {{role, content}} messages, found {}", json_kind(&prompt));
    };
    let (mut system, mut user) = (None, None);
    for m in &messages {
        let role = m.get("role").and_then(Value::as_str).map(|r| r.trim().to_ascii_lowercase());
        let content = m.get("content").and_then(Value::as_str);
        match (role.as_deref(), content) {
            (Some("system"), Some(c)) if system.is_none() => system = Some(c.to_string()),
            (Some("user"), Some(c)) => user = Some(c.to_string()),
            _ => {}
        }
    }
    let Some(user) = user else {
        bail!("`prompt` has no `user` message with string content ({} messages)", messages.len());
    };
    let (instruction, question) = split_instruction(&user);
    let system = match (system, instruction) {
        (Some(s), Some(i)) => Some(format!("{s}\n\n{i}")),
        (s, i) => s.or(i),
    };

    let reward_model = arrow_value(cols.reward_model.as_ref(), i)?;
    let ground_truth = match reward_model.get("ground_truth") {
        Some(v) if !v.is_null() => v.clone(),
        _ => bail!("`reward_model.ground_truth` is missing or null"),
    };

    let extra_info = match &cols.extra_info {
        Some(c) => Some(arrow_value(c.as_ref(), i)?).filter(|v| !v.is_null()),
        None => None,
    };
    let info = |key: &str| extra_info.as_ref().and_then(|e| e.get(key)).and_then(scalar_text);
    let index = info("index").unwrap_or_else(|| i.to_string());
    let split = split_override.unwrap_or("test").to_string();
    let difficulty = info("difficulty").filter(|d| !d.is_empty());
    let task_id = ids.unique(format!("{}-{}", id_part(&data_source), id_part(&index)));

    // A LiveCodeBench ground truth names its question beside the tests; `extra` keeps it, for
    // the verl export (AFM's scorer reads it there).
    let mut extra = extra_info.clone();
    if let Some(q) = question_id(&ground_truth) {
        if let Value::Object(o) = extra.get_or_insert_with(|| Value::Object(Map::new())) {
            o.entry("question_id").or_insert(Value::String(q));
        }
    }
    let mut task = Task {
        task_id,
        split,
        source: data_source.clone(),
        question,
        system_prompt: system,
        difficulty,
        extra: extra.as_ref().map(Value::to_string),
        ..Default::default()
    };
    let labels = [data_source.as_str(), ability.as_deref().unwrap_or("")];
    let task_id = task.task_id.clone();
    classify(&mut task, &ground_truth, &labels).with_context(|| format!("task `{task_id}`"))?;
    Ok(task)
}

/// A prompt carrying AFM's instruction block (or our own prompt's instruction), split into (the
/// block, the task): the block
/// describes the structured functions (`'think'`, `'plan'`, …, `'answer'`) and ends at the last
/// line starting `Task:`; a trailing `Answer format:` paragraph belongs to the block too (our own
/// prompts say how to answer). Any other prompt is the question as it is.
pub fn split_instruction(content: &str) -> (Option<String>, String) {
    // Our own prompt (a verl file `coa-convert` wrote): the suite's instruction, then the question.
    if let Some(q) = coa_format::prompt::question_of(content) {
        return (Some(content[..content.len() - q.len()].trim_end().trim_end_matches("Question:").trim_end().to_string()), q.to_string());
    }
    let describes_functions = ["'think'", "'plan'", "'answer'"].iter().all(|w| content.contains(w))
        && (content.contains("structured functions") || content.contains("Always follow"));
    let task_line = content.match_indices("Task:").map(|(i, _)| i).filter(|&i| i == 0 || content[..i].ends_with('\n')).last();
    let (true, Some(at)) = (describes_functions, task_line) else { return (None, content.to_string()) };
    let mut question = content[at + "Task:".len()..].trim();
    let mut tail = "";
    if let Some(k) = question.rfind("\nAnswer format:") {
        tail = question[k..].trim();
        question = question[..k].trim_end();
    }
    if question.is_empty() {
        return (None, content.to_string());
    }
    let mut block = content[..at].trim_end().to_string();
    if !tail.is_empty() {
        block.push_str("\n\n");
        block.push_str(tail);
    }
    (Some(block), question.to_string())
}

/// Sets suite, tools, answers and tests of a verl task from its ground truth (module docs).
fn classify(task: &mut Task, ground_truth: &Value, labels: &[&str]) -> Result<()> {
    let data_source = labels[0];
    if let Some(spec) = code_spec(ground_truth)? {
        task.suite = "code".into();
        task.tools = strings(Suite::Code.tools());
        match spec {
            CodeSpec::Stdio(tests) => task.stdio_tests = tests,
            CodeSpec::Functional(code) => task.test_code = Some(code),
        }
    } else if mentions(labels, &MATH_WORDS) {
        task.suite = "math".into();
        task.tools = strings(Suite::Code.tools());
        task.answers = match ground_truth {
            Value::Array(_) | Value::Object(_) => answer_items(ground_truth)?,
            // several golds as AFM writes them: `{"target": [...]}` in the string
            Value::String(s) if s.trim_start().starts_with("{\"target\"") => match serde_json::from_str::<Value>(s) {
                Ok(obj @ Value::Object(_)) => answer_items(&obj)?,
                _ => vec![s.clone()],
            },
            other => vec![scalar_text(other)
                .ok_or_else(|| anyhow!("`ground_truth` must be a string, found {}", json_kind(other)))?],
        };
    } else if mentions(labels, &CODE_WORDS) {
        bail!(
            "data source `{data_source}` looks like code but `reward_model.ground_truth` is no test spec \
             (expected a JSON object with `stdin` and `expected_output` lists, or a `functional` test program)"
        );
    } else {
        task.suite = "qa".into();
        task.tools = strings(Suite::Qa.tools());
        task.answers = match ground_truth {
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(list @ Value::Array(_)) if list.as_array().is_some_and(|a| a.iter().all(Value::is_string)) => {
                    answer_items(&list)?
                }
                // AFM's QA layout: `{"target": [...], "question": ...}`
                Ok(obj @ Value::Object(_)) if obj.get("target").is_some() => answer_items(&obj)?,
                _ => vec![s.clone()],
            },
            other => answer_items(other)?,
        };
    }
    if task.suite != "code" && task.answers.iter().all(|a| a.trim().is_empty()) {
        bail!("`reward_model.ground_truth` gives no answer");
    }
    Ok(())
}

/// Answers from a JSON list (strings or numbers) or a `{target: [...]}` object.
fn answer_items(v: &Value) -> Result<Vec<String>> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|x| scalar_text(x).ok_or_else(|| anyhow!("gold answers must be strings, found {}", json_kind(x))))
            .collect(),
        Value::Object(o) if o.contains_key("target") => answer_items(&o["target"]),
        Value::Object(o) => {
            let keys: Vec<&str> = o.keys().map(String::as_str).collect();
            bail!("`ground_truth` is an object with keys {} (expected a string, a list, or an object with `target`)", keys.join(", "))
        }
        other => Ok(vec![scalar_text(other).ok_or_else(|| anyhow!("unusable `ground_truth`: {}", json_kind(other)))?]),
    }
}

/// The `question_id` of a ground truth that is a JSON object (or a string holding one).
fn question_id(ground_truth: &Value) -> Option<String> {
    let parsed;
    let obj = match ground_truth {
        Value::String(s) if s.trim_start().starts_with('{') => {
            parsed = serde_json::from_str::<Value>(s).ok()?;
            &parsed
        }
        other => other,
    };
    obj.get("question_id").and_then(scalar_text).filter(|q| !q.is_empty())
}

/// Recognises a code test spec: a JSON object (or a string holding one) with `stdin` +
/// `expected_output` lists, or a `functional` test program.
fn code_spec(ground_truth: &Value) -> Result<Option<CodeSpec>> {
    let parsed;
    let obj = match ground_truth {
        Value::Object(o) => o,
        Value::String(s) if s.trim_start().starts_with('{') => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(o)) => {
                parsed = o;
                &parsed
            }
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    if obj.contains_key("stdin") || obj.contains_key("expected_output") {
        let list = |key: &str| -> Result<Vec<String>> {
            match obj.get(key) {
                Some(Value::Array(items)) => items
                    .iter()
                    .enumerate()
                    .map(|(k, x)| match x {
                        Value::String(s) => Ok(s.clone()),
                        other => bail!("ground_truth `{key}[{k}]` must be a string, found {}", json_kind(other)),
                    })
                    .collect(),
                Some(other) => bail!("ground_truth `{key}` must be a list of strings, found {}", json_kind(other)),
                None => bail!("ground_truth has `stdin`/`expected_output` but no `{key}` list"),
            }
        };
        let (stdin, expected) = (list("stdin")?, list("expected_output")?);
        if stdin.len() != expected.len() {
            bail!(
                "ground_truth has {} `stdin` entries but {} `expected_output` entries; they must pair up",
                stdin.len(),
                expected.len()
            );
        }
        if stdin.is_empty() {
            bail!("ground_truth has no stdin/expected_output tests");
        }
        let tests = stdin.into_iter().zip(expected).map(|(stdin, expected_stdout)| StdioTest { stdin, expected_stdout });
        return Ok(Some(CodeSpec::Stdio(tests.collect())));
    }
    match obj.get("functional") {
        Some(Value::String(code)) if !code.trim().is_empty() => Ok(Some(CodeSpec::Functional(code.clone()))),
        Some(other) if !other.is_null() => bail!("ground_truth `functional` must be a test program string, found {}", json_kind(other)),
        _ => Ok(None),
    }
}

/// One cell of any Arrow array as JSON: strings, bools, numbers, nested structs, lists and maps;
/// nulls become `null`; other types (dates, decimals, ...) their display string.
fn arrow_value(array: &dyn Array, i: usize) -> Result<Value> {
    if array.is_null(i) {
        return Ok(Value::Null);
    }
    let float = |x: f64| serde_json::Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null);
    Ok(match array.data_type() {
        DataType::Null => Value::Null,
        DataType::Boolean => Value::Bool(array.as_boolean().value(i)),
        DataType::Int8 => array.as_primitive::<Int8Type>().value(i).into(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(i).into(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(i).into(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(i).into(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(i).into(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(i).into(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(i).into(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(i).into(),
        DataType::Float16 => float(array.as_primitive::<Float16Type>().value(i).to_f64()),
        DataType::Float32 => float(array.as_primitive::<Float32Type>().value(i) as f64),
        DataType::Float64 => float(array.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => array.as_string::<i32>().value(i).into(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(i).into(),
        DataType::Utf8View => array.as_string_view().value(i).into(),
        DataType::Binary => String::from_utf8_lossy(array.as_binary::<i32>().value(i)).into(),
        DataType::LargeBinary => String::from_utf8_lossy(array.as_binary::<i64>().value(i)).into(),
        DataType::BinaryView => String::from_utf8_lossy(array.as_binary_view().value(i)).into(),
        DataType::List(_) => list_value(array.as_list::<i32>().value(i).as_ref())?,
        DataType::LargeList(_) => list_value(array.as_list::<i64>().value(i).as_ref())?,
        DataType::FixedSizeList(..) => list_value(array.as_fixed_size_list().value(i).as_ref())?,
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let mut obj = Map::new();
            for (field, column) in fields.iter().zip(s.columns()) {
                obj.insert(field.name().clone(), arrow_value(column.as_ref(), i)?);
            }
            Value::Object(obj)
        }
        DataType::Map(..) => {
            let entries = array.as_map().value(i);
            let (keys, values) = (entries.column(0), entries.column(1));
            let mut pairs = Vec::with_capacity(entries.len());
            for k in 0..entries.len() {
                pairs.push((arrow_value(keys.as_ref(), k)?, arrow_value(values.as_ref(), k)?));
            }
            if pairs.iter().all(|(k, _)| k.is_string()) {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.as_str().unwrap().to_string(), v)).collect())
            } else {
                Value::Array(pairs.into_iter().map(|(k, v)| Value::Array(vec![k, v])).collect())
            }
        }
        DataType::Dictionary(_, value_type) => {
            let one = arrow::compute::cast(&array.slice(i, 1), value_type)?;
            arrow_value(one.as_ref(), 0)?
        }
        _ => {
            let formatter = ArrayFormatter::try_new(array, &FormatOptions::default())?;
            Value::String(formatter.value(i).to_string())
        }
    })
}

fn list_value(items: &dyn Array) -> Result<Value> {
    (0..items.len()).map(|k| arrow_value(items, k)).collect::<Result<Vec<_>>>().map(Value::Array)
}

// ---------------------------------------------------------------------------------------------
// JSON lines

/// JSON records: one object per line (JSON lines) or one array of objects.
fn import_json(shown: &str, bytes: &[u8], split_override: Option<&str>, default_source: &str) -> Result<(Layout, Vec<Task>)> {
    let records = json_records(shown, bytes)?;
    let mut layout = None;
    let mut ids = Ids::default();
    let mut tasks = Vec::new();
    for (place, value) in records {
        let expected = match layout {
            None => "a JSON object".to_string(),
            Some(l) => format!("a JSON object ({l}, as detected from the first record)"),
        };
        let Value::Object(obj) = value else {
            bail!("{shown}: {place}: found {}, expected {expected}", json_kind(&value));
        };
        let l = match layout {
            Some(l) => l,
            None => {
                let has = |keys: &[&str]| keys.iter().all(|key| obj.contains_key(*key));
                let has_any = |keys: &[&str]| keys.iter().any(|key| obj.contains_key(*key));
                let detected = if has(&HUMANEVAL_REQUIRED) {
                    Layout::HumanEvalJsonl
                } else if has_any(&QUESTION_KEYS) && has_any(&ANSWER_KEYS) {
                    Layout::QaJson
                } else {
                    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
                    keys.sort_unstable();
                    bail!(
                        "{shown}: unknown JSON layout: keys found in {place}: {}.\nSupported layouts:\n{SUPPORTED_LAYOUTS}",
                        if keys.is_empty() { "(none)".to_string() } else { keys.join(", ") }
                    );
                };
                *layout.insert(detected)
            }
        };
        let record = tasks.len();
        let task = match l {
            Layout::QaJson => qa_record(obj, record, split_override, default_source, &mut ids),
            Layout::HumanEvalJsonl => humaneval_record(obj, split_override, &mut ids),
            Layout::Verl | Layout::Tasks => unreachable!("tables are read by import_table"),
        }
        .map_err(|e| anyhow!("{shown}: {place}: {e:#} ({l} layout)"))?;
        tasks.push(task);
    }
    match layout {
        Some(l) => Ok((l, tasks)),
        None => bail!("{shown}: no JSON records found; expected a task file in one of the supported layouts:\n{SUPPORTED_LAYOUTS}"),
    }
}

/// The records of a JSON-lines file (`line N`) or of a JSON array (`record N`, from 0).
fn json_records(shown: &str, bytes: &[u8]) -> Result<Vec<(String, Value)>> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            anyhow!("{shown}: malformed JSON at line {}, column {} ({}); expected a JSON array of task objects", e.line(), e.column(), serde_message(&e))
        })?;
        let Value::Array(items) = value else { unreachable!("starts with [") };
        return Ok(items.into_iter().enumerate().map(|(k, v)| (format!("record {k}"), v)).collect());
    }
    let mut out = Vec::new();
    for (k, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let lineno = k + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let text = std::str::from_utf8(line).map_err(|e| anyhow!("{shown}: line {lineno}: not valid UTF-8 ({e}); expected one JSON object per line"))?;
        let value: Value = serde_json::from_str(text).map_err(|e| {
            anyhow!("{shown}: line {lineno}: malformed JSON at column {} ({}); expected one JSON object per line", e.column(), serde_message(&e))
        })?;
        out.push((format!("line {lineno}"), value));
    }
    Ok(out)
}

/// serde's message without its own "at line 1 column N" (which would contradict the file's).
fn serde_message(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    msg.rfind(" at line ").map_or(msg.as_str(), |k| &msg[..k]).to_string()
}

fn take_string(obj: &mut Map<String, Value>, key: &str, required: bool) -> Result<Option<String>> {
    match obj.remove(key) {
        Some(Value::String(s)) => Ok(Some(s)),
        None | Some(Value::Null) if !required => Ok(None),
        None => bail!("missing key `{key}` (keys found: {})", obj.keys().cloned().collect::<Vec<_>>().join(", ")),
        Some(other) => bail!("`{key}` must be a string, found {}", json_kind(&other)),
    }
}

fn leftovers(obj: Map<String, Value>) -> Option<String> {
    (!obj.is_empty()).then(|| Value::Object(obj).to_string())
}

/// The value of the first of `keys` present, removed (AFM's files spell `question` / `Question`).
fn take_any(obj: &mut Map<String, Value>, keys: &[&str]) -> Option<Value> {
    keys.iter().find_map(|k| obj.remove(*k))
}

fn qa_record(mut obj: Map<String, Value>, record: usize, split_override: Option<&str>, default_source: &str, ids: &mut Ids) -> Result<Task> {
    let question = match take_any(&mut obj, &QUESTION_KEYS) {
        Some(Value::String(q)) => q,
        Some(other) => bail!("`question` must be a string, found {}", json_kind(&other)),
        None => bail!("missing key `question` (keys found: {})", obj.keys().cloned().collect::<Vec<_>>().join(", ")),
    };
    if question.trim().is_empty() {
        bail!("`question` is empty");
    }
    let answers = match take_any(&mut obj, &ANSWER_KEYS) {
        Some(Value::String(s)) => vec![s],
        Some(Value::Number(n)) => vec![n.to_string()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| scalar_text(x).ok_or_else(|| anyhow!("`answer` items must be strings, found {}", json_kind(x))))
            .collect::<Result<Vec<_>>>()?,
        Some(other) => bail!("`answer` must be a string or a list of strings, found {}", json_kind(&other)),
        None => bail!("missing key `answer`"),
    };
    if answers.iter().all(|a| a.trim().is_empty()) {
        bail!("`answer` holds no non-empty answer");
    }
    let source = take_string(&mut obj, "data_source", false)?.filter(|s| !s.trim().is_empty()).unwrap_or_else(|| default_source.to_string());
    let id = match obj.remove("id") {
        None | Some(Value::Null) => record.to_string(),
        Some(v) => scalar_text(&v).ok_or_else(|| anyhow!("`id` must be a string or a number, found {}", json_kind(&v)))?,
    };
    Ok(Task {
        task_id: ids.unique(format!("{}-{}", id_part(&source), id_part(&id))),
        suite: "qa".into(),
        split: split_override.unwrap_or("test").to_string(),
        source,
        question,
        answers,
        tools: strings(Suite::Qa.tools()),
        extra: leftovers(obj),
        ..Default::default()
    })
}

fn humaneval_record(mut obj: Map<String, Value>, split_override: Option<&str>, ids: &mut Ids) -> Result<Task> {
    let original_id = take_string(&mut obj, "task_id", true)?.unwrap_or_default();
    let prompt = take_string(&mut obj, "prompt", true)?.unwrap_or_default();
    let entry_point = take_string(&mut obj, "entry_point", true)?.unwrap_or_default();
    let test = take_string(&mut obj, "test", true)?.unwrap_or_default();
    let canonical = take_string(&mut obj, "canonical_solution", false)?;
    if original_id.trim().is_empty() || entry_point.trim().is_empty() || prompt.trim().is_empty() {
        bail!("`task_id`, `prompt` and `entry_point` must be non-empty");
    }
    // `HumanEval/0` -> source `humaneval`, id `humaneval-0`.
    let source = match original_id.split_once('/') {
        Some((prefix, _)) if !prefix.trim().is_empty() => prefix.trim().to_lowercase(),
        _ => "humaneval".to_string(),
    };
    let task_id = ids.unique(id_part(&original_id.to_lowercase()));
    let fence_end = if prompt.ends_with('\n') { "" } else { "\n" };
    let question = format!(
        "Complete the following Python function `{entry_point}`. Your answer must be the complete function: \
         its signature, docstring and body, together with the imports and any helper functions shown below, \
         so that the code runs on its own.\n\n```python\n{prompt}{fence_end}```\n"
    );
    let solution = canonical.map(|body| serde_json::json!({ "code": format!("{prompt}{body}") }).to_string());
    let mut extra = Map::new();
    extra.insert("task_id".into(), Value::String(original_id));
    extra.extend(obj);
    Ok(Task {
        task_id,
        suite: "code".into(),
        split: split_override.unwrap_or("test").to_string(),
        source,
        question,
        tools: strings(Suite::Code.tools()),
        entry_point: Some(entry_point.clone()),
        test_code: Some(format!("{}{test}\ncheck({entry_point})\n", trusted_helpers(&prompt, &entry_point, &test))),
        solution,
        extra: Some(Value::Object(extra).to_string()),
        ..Default::default()
    })
}

/// The prompt's code before the entry point's `def` when it defines a helper the tests call
/// (HumanEval/32's `poly`, /38's `encode_cyclic`, /50's `encode_shift`), else nothing. The
/// tests get these definitions from the task file: taken from the program, as HumanEval's own
/// harness takes them, a program could redefine `encode_cyclic` as the identity next to an
/// identity `decode_cyclic` and pass.
fn trusted_helpers<'a>(prompt: &'a str, entry_point: &str, test: &str) -> &'a str {
    let def = format!("def {entry_point}(");
    let at = prompt.match_indices(&def).map(|(i, _)| i).filter(|&i| i == 0 || prompt[..i].ends_with('\n')).last();
    let Some(at) = at else { return "" };
    let before = &prompt[..at];
    let used = before.lines().filter_map(|l| l.strip_prefix("def ").or_else(|| l.strip_prefix("class "))).any(|rest| {
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        !name.is_empty() && test.match_indices(name.as_str()).any(|(i, _)| {
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            !word(test[..i].chars().last()) && !word(test[i + name.len()..].chars().next())
        })
    });
    if used { before } else { "" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompts_helpers_that_the_tests_call_come_from_the_task_file() {
        let prompt = "import math\n\n\ndef shift(s: str):\n    return s[1:] + s[:1]\n\n\ndef unshift(s: str):\n    \"\"\"Undo shift.\"\"\"\n";
        let test = "def check(candidate):\n    assert candidate(shift('abc')) == 'abc'\n";
        assert_eq!(trusted_helpers(prompt, "unshift", test), "import math\n\n\ndef shift(s: str):\n    return s[1:] + s[:1]\n\n\n");
        // A helper the tests do not call (HumanEval/10's is_palindrome), a name only inside
        // another word, or no helper at all: nothing.
        assert_eq!(trusted_helpers(prompt, "unshift", "def check(candidate):\n    assert candidate('bca') == 'abc'\n"), "");
        assert_eq!(trusted_helpers(prompt, "unshift", "def check(candidate):\n    assert candidate(unshifted) == 1\n"), "");
        assert_eq!(trusted_helpers("from typing import List\n\n\ndef f(x: List[int]):\n", "f", test), "");
        let mut ids = Ids::default();
        let obj = serde_json::json!({"task_id": "Demo/1", "prompt": prompt, "entry_point": "unshift", "test": test});
        let Value::Object(obj) = obj else { unreachable!() };
        let task = humaneval_record(obj, None, &mut ids).unwrap();
        assert_eq!(task.test_code.unwrap(), format!("{}{test}\ncheck(unshift)\n", &prompt[..prompt.find("def unshift").unwrap()]));
    }

    #[test]
    fn ids_are_made_unique() {
        let mut ids = Ids::default();
        assert_eq!(ids.unique("a-1".into()), "a-1");
        assert_eq!(ids.unique("a-1".into()), "a-1-2");
        assert_eq!(ids.unique("a-1".into()), "a-1-3");
        assert_eq!(id_part("openai/gsm8k"), "openai-gsm8k");
    }

    #[test]
    fn code_spec_recognises_stdio_and_functional() {
        let gt = Value::String(r#"{"stdin": ["1\n"], "expected_output": ["2\n"]}"#.into());
        assert!(matches!(code_spec(&gt).unwrap(), Some(CodeSpec::Stdio(t)) if t[0].expected_stdout == "2\n"));
        let gt = Value::String(r#"{"functional": "assert f() == 1"}"#.into());
        assert!(matches!(code_spec(&gt).unwrap(), Some(CodeSpec::Functional(_))));
        assert!(code_spec(&Value::String("204".into())).unwrap().is_none());
        assert!(code_spec(&Value::String("{1, 2}".into())).unwrap().is_none());
        let bad = Value::String(r#"{"stdin": ["1\n", "2\n"], "expected_output": ["2\n"]}"#.into());
        assert!(code_spec(&bad).unwrap_err().to_string().contains("2 `stdin` entries but 1"));
    }

    #[test]
    fn qa_answers_from_lists_and_targets() {
        assert_eq!(answer_items(&serde_json::json!(["a", "b"])).unwrap(), vec!["a", "b"]);
        assert_eq!(answer_items(&serde_json::json!({"target": ["x"]})).unwrap(), vec!["x"]);
        assert_eq!(answer_items(&serde_json::json!(7)).unwrap(), vec!["7"]);
    }
}
