//! The verl RL layout, as AFM's own RL files have it (one row per task; verl reads the Parquet
//! with pandas / `datasets` and hands `reward_model` and `extra_info` to the reward and the tools):
//!
//! - `data_source`: what AFM's reward manager picks its scorer by ([`afm_data_source`]): the task
//!   file's own (`MATH500`, `aime24`, `skywork_livecodebench_v4`, `nq`, …) when AFM dispatches on
//!   it to the scorer of the task's suite, else that scorer's name for our suites (`math_dapo`,
//!   `skywork`, `nq`, `hotpotqa` for multihop); `ability`: the suite;
//! - `prompt`: `[{content, role: "user"}]`, the content being our prompt (the suite's instruction
//!   then the question, `coa_format::build_prompt`);
//! - `reward_model`: `{ground_truth, style: "rule"}`. The ground truth is, as AFM writes it: for
//!   QA suites (`qa`, `multihop`) the JSON `{"target": [every gold answer], "question": …}`;
//!   for math the gold answer itself (or `{"target": [...]}` when a task has several); for code
//!   the test spec JSON as LiveCodeBench's rows hold it (`{"stdin": [...], "expected_output":
//!   [...], "question_id"}` or `{"functional": test program, "question_id"}`; the task file's
//!   question id, else the task id);
//! - `extra_info`: `index` (a string, as AFM's files have it: the task file's own index, else the
//!   row's number), `split`, `task_id`, `source` (the task's own source, whatever `data_source`
//!   says), `question`, `answer` (every gold answer),
//!   `need_tools_kwargs: true` and `tools_kwargs`: for every tool (`web_search`, `crawl_page`,
//!   `code`) `{create_kwargs: {ground_truth: [golds or the test spec], question, data_source}}`,
//!   so that verl's tool-agent loop finds the arguments of whichever tool it creates.
//!
//! `coa-generate tasks --import` reads the layout back.

use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use coa_schemas::rows::Task;
use coa_schemas::suite::{answer_kind, tool, AnswerKind};
use serde::Serialize;
use serde_json::json;

/// The `data_source` names AFM's reward manager dispatches on, by the kind of answer its scorer
/// grades (`_select_rm_score_fn` in AFM's verl fork; the names whose scorer module it imports).
/// The first of each list is the name our own tasks of that kind get.
const AFM_MATH_SOURCES: [&str; 8] = ["math_dapo", "aime24", "aime25", "MATH", "MATH500", "gms8k", "amc23", "OlympiadBench"];
const AFM_CODE_SOURCES: [&str; 10] = [
    "skywork",
    "skywork_livecodebench_v4",
    "skywork_livecodebench_v5",
    "skywork_livecodebench_v6",
    "skywork_livecodebench_v1_to_v3",
    "skywork_math",
    "codeforces_areal_test",
    "codecontests_hf_test",
    "codecontests_hf_train",
    "codecontests_areal_test",
];
const AFM_QA_SOURCES: [&str; 8] = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "mercury"];

/// The `data_source` of a verl row (module docs): `source` itself when AFM's reward manager
/// dispatches on it to the scorer of the suite's answers, else that scorer's name for our tasks.
pub fn afm_data_source(suite: &str, source: Option<&str>) -> String {
    let names: &[&str] = match answer_kind(suite) {
        Some(AnswerKind::Math) => &AFM_MATH_SOURCES,
        Some(AnswerKind::Program) => &AFM_CODE_SOURCES,
        _ => &AFM_QA_SOURCES,
    };
    match source {
        Some(s) if names.contains(&s) => s.to_string(),
        // a multi-hop question: the multi-hop QA set AFM scores the same way
        _ if suite == "multihop" => "hotpotqa".to_string(),
        _ => names[0].to_string(),
    }
}

/// What one verl row is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct VerlTask {
    pub task_id: String,
    pub suite: String,
    pub question: String,
    pub answers: Vec<String>,
    /// The test spec JSON of a code task.
    pub code_spec: Option<String>,
    /// The task's `source` (`synthetic`, `MATH500`, …); unknown for a trajectory exported without
    /// its tasks table.
    pub source: Option<String>,
    /// The task file's own `extra_info.index`, when it had one.
    pub source_index: Option<String>,
}

impl VerlTask {
    /// A task of the `tasks` table (its code spec from its own tests).
    pub fn from_task(t: &Task) -> VerlTask {
        VerlTask {
            task_id: t.task_id.clone(),
            suite: t.suite.clone(),
            question: t.question.clone(),
            answers: t.answers.clone(),
            code_spec: code_spec(t),
            source: Some(t.source.clone()),
            source_index: extra_str(t, "index"),
        }
    }

    fn data_source(&self) -> String {
        afm_data_source(&self.suite, self.source.as_deref())
    }

    /// `reward_model.ground_truth` (module docs), or why there is none.
    pub fn ground_truth(&self) -> Result<String, String> {
        let kind = answer_kind(&self.suite);
        if kind == Some(AnswerKind::Program) {
            return self
                .code_spec
                .clone()
                .ok_or_else(|| format!("code task `{}` has no tests for its verl ground truth (pass the tasks table with --tasks)", self.task_id));
        }
        let golds: Vec<&str> = self.answers.iter().map(String::as_str).filter(|a| !a.trim().is_empty()).collect();
        match (kind, golds.as_slice()) {
            (_, []) => Err("no gold answer for the verl ground truth".into()),
            (Some(AnswerKind::Math), [one]) => Ok(one.to_string()),
            (Some(AnswerKind::Math), many) => Ok(json!({ "target": many }).to_string()),
            (_, many) => Ok(json!({ "target": many, "question": self.question }).to_string()),
        }
    }
}

/// A string field of a task's `extra` (the task file's own fields, JSON), if it has one.
fn extra_str(t: &Task, key: &str) -> Option<String> {
    let extra: serde_json::Value = serde_json::from_str(t.extra.as_deref()?).ok()?;
    match &extra[key] {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A code task's test spec, as LiveCodeBench's rows hold it: `{"stdin", "expected_output",
/// "question_id"}` for stdio tests, else `{"functional": test_code, "question_id"}` (the layouts
/// the importer reads). The question id is the task file's (kept in `extra` on import), else the
/// task id.
pub fn code_spec(t: &Task) -> Option<String> {
    if answer_kind(&t.suite) != Some(AnswerKind::Program) {
        return None;
    }
    let question_id = extra_str(t, "question_id").unwrap_or_else(|| t.task_id.clone());
    if !t.stdio_tests.is_empty() {
        let ins: Vec<&str> = t.stdio_tests.iter().map(|s| s.stdin.as_str()).collect();
        let outs: Vec<&str> = t.stdio_tests.iter().map(|s| s.expected_stdout.as_str()).collect();
        return Some(json!({ "stdin": ins, "expected_output": outs, "question_id": question_id }).to_string());
    }
    t.test_code.as_deref().filter(|c| !c.trim().is_empty()).map(|c| json!({ "functional": c, "question_id": question_id }).to_string())
}

#[derive(Serialize)]
struct Message {
    content: String,
    role: &'static str,
}

#[derive(Serialize)]
struct RewardModel {
    ground_truth: String,
    style: &'static str,
}

#[derive(Serialize, Clone)]
struct CreateKwargs {
    ground_truth: Vec<String>,
    question: String,
    data_source: String,
}

#[derive(Serialize, Clone)]
struct ToolKwargs {
    create_kwargs: CreateKwargs,
}

#[derive(Serialize)]
struct ToolsKwargs {
    web_search: ToolKwargs,
    crawl_page: ToolKwargs,
    code: ToolKwargs,
}

#[derive(Serialize)]
struct ExtraInfo {
    index: String,
    split: String,
    task_id: String,
    source: String,
    question: String,
    answer: Vec<String>,
    need_tools_kwargs: bool,
    tools_kwargs: ToolsKwargs,
}

#[derive(Serialize)]
struct Row {
    data_source: String,
    prompt: Vec<Message>,
    ability: String,
    reward_model: RewardModel,
    extra_info: ExtraInfo,
}

fn utf8(name: &str) -> Field {
    Field::new(name, DataType::Utf8, false)
}

fn list_of(name: &str, item: Field) -> Field {
    Field::new(name, DataType::List(Arc::new(item)), false)
}

fn structure(name: &str, fields: Vec<Field>) -> Field {
    Field::new(name, DataType::Struct(Fields::from(fields)), false)
}

/// The schema of the verl export.
pub fn verl_schema() -> SchemaRef {
    let create = structure("create_kwargs", vec![list_of("ground_truth", utf8("item")), utf8("question"), utf8("data_source")]);
    let tool_kwargs = |name: &str| structure(name, vec![create.clone()]);
    Arc::new(Schema::new(vec![
        utf8("data_source"),
        list_of("prompt", structure("item", vec![utf8("content"), utf8("role")])),
        utf8("ability"),
        structure("reward_model", vec![utf8("ground_truth"), utf8("style")]),
        structure(
            "extra_info",
            vec![
                utf8("index"),
                utf8("split"),
                utf8("task_id"),
                utf8("source"),
                utf8("question"),
                list_of("answer", utf8("item")),
                Field::new("need_tools_kwargs", DataType::Boolean, false),
                structure("tools_kwargs", vec![tool_kwargs(tool::WEB_SEARCH), tool_kwargs(tool::CRAWL_PAGE), tool_kwargs(tool::CODE)]),
            ],
        ),
    ]))
}

/// The verl rows of `tasks`, `extra_info.index` counting from `first_index` where a task has no
/// index of its own. Every task must have
/// a ground truth (callers check [`VerlTask::ground_truth`] first, to name the bad row).
pub fn verl_batch(tasks: &[VerlTask], first_index: i64, split: &str) -> Result<RecordBatch> {
    let mut rows = Vec::with_capacity(tasks.len());
    for (k, t) in tasks.iter().enumerate() {
        let ground_truth = t.ground_truth().map_err(anyhow::Error::msg).with_context(|| format!("task `{}`", t.task_id))?;
        let data_source = t.data_source();
        let kwargs = ToolKwargs {
            create_kwargs: CreateKwargs {
                ground_truth: if answer_kind(&t.suite) == Some(AnswerKind::Program) { vec![ground_truth.clone()] } else { t.answers.clone() },
                question: t.question.clone(),
                data_source: data_source.clone(),
            },
        };
        rows.push(Row {
            data_source,
            prompt: vec![Message { content: coa_format::build_prompt(&t.suite, &t.question), role: "user" }],
            ability: t.suite.clone(),
            reward_model: RewardModel { ground_truth, style: "rule" },
            extra_info: ExtraInfo {
                index: t.source_index.clone().unwrap_or_else(|| (first_index + k as i64).to_string()),
                split: split.to_string(),
                task_id: t.task_id.clone(),
                source: t.source.clone().unwrap_or_default(),
                question: t.question.clone(),
                answer: t.answers.clone(),
                need_tools_kwargs: true,
                tools_kwargs: ToolsKwargs { web_search: kwargs.clone(), crawl_page: kwargs.clone(), code: kwargs },
            },
        });
    }
    let schema = verl_schema();
    let batch = serde_arrow::to_record_batch(schema.fields(), &rows).context("building the verl rows")?;
    Ok(batch.with_schema(schema)?)
}
