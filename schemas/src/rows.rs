//! Typed rows for the tables that library code builds row by row.
//!
//! Field names and types mirror [`crate::tables`] exactly; conversion goes through serde_arrow
//! with the canonical schema, so the table is still defined in one place (a test round-trips).

use anyhow::{Context, Result};
use arrow::record_batch::RecordBatch;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::tables::{Table, CORPUS, MAS_RUNS, ROLLOUTS, TASKS, TRAJECTORIES};

/// A string value (a task_id, an answer) as one line of an error message shows it: quoted, and
/// when longer than [`Shown::MAX_CHARS`] characters its start and its length in bytes (a
/// malformed table's id can be megabytes; the error should still be one readable line).
pub struct Shown<'a>(pub &'a str);

impl Shown<'_> {
    pub const MAX_CHARS: usize = 80;
}

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(Self::MAX_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((end, _)) => write!(f, "{:?}... ({} bytes)", &self.0[..end], self.0.len()),
        }
    }
}

/// A row of the `tasks` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Task {
    pub task_id: String,
    pub suite: String,
    pub split: String,
    pub source: String,
    pub question: String,
    pub system_prompt: Option<String>,
    pub answers: Vec<String>,
    pub tools: Vec<String>,
    pub hops: Option<i32>,
    pub difficulty: Option<String>,
    pub entry_point: Option<String>,
    pub test_code: Option<String>,
    pub stdio_tests: Vec<StdioTest>,
    pub solution: Option<String>,
    pub extra: Option<String>,
}

/// One stdin / expected-stdout pair of a program-style code task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct StdioTest {
    pub stdin: String,
    pub expected_stdout: String,
}

/// A row of the `corpus` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CorpusPage {
    pub url: String,
    pub title: String,
    pub text: String,
    pub kind: String,
}

/// One chat message `{role, content}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.to_string(), content: content.into() }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// One agent activation of a teacher run (an element of `mas_runs.events`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Event {
    /// Position in the run, from 0.
    pub seq: i32,
    /// The agent that was activated (`manager`, `planner`, `search_agent`, ...).
    pub agent: String,
    /// `manager` for routing (and rejected outputs), else the CoA action tag produced.
    pub role: String,
    /// What the agent read: its whole history plus the new message.
    pub input_messages: Vec<ChatMessage>,
    pub output: String,
    pub tool: Option<String>,
    pub tool_input: Option<String>,
    pub observation: Option<String>,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub latency_ms: f64,
}

/// A row of the `mas_runs` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct MasRun {
    pub task_id: String,
    pub suite: String,
    pub question: String,
    pub answers: Vec<String>,
    pub backend: String,
    pub simulator: bool,
    pub events: Vec<Event>,
    pub final_answer: Option<String>,
    pub success: bool,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub latency_ms: f64,
}

/// One CoA step (an element of `trajectories.steps`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Step {
    pub role: String,
    pub agent: String,
    pub content: String,
    pub tool: Option<String>,
    pub tool_input: Option<String>,
    pub observation: Option<String>,
}

/// A row of the `trajectories` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Trajectory {
    pub task_id: String,
    pub suite: String,
    pub question: String,
    pub answers: Vec<String>,
    pub steps: Vec<Step>,
    pub hops: i32,
    pub reflections: i32,
    pub double_check_scores: Vec<i32>,
    pub final_answer: Option<String>,
    pub correct: bool,
    pub format_ok: bool,
    pub format_error: Option<String>,
    pub teacher_tokens: i64,
}

/// A row of the `rollouts` table: one policy sample with its tool turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Rollout {
    pub task_id: String,
    pub suite: String,
    pub sample_idx: i32,
    pub model: String,
    pub prompt_ids: Vec<i32>,
    pub response_ids: Vec<i32>,
    pub loss_mask: Vec<u8>,
    pub logprobs: Vec<f32>,
    pub response_text: String,
    pub turns: i32,
    pub tool_calls: i32,
    pub finish_reason: String,
}

/// Rows that belong to one table.
pub trait Row: Serialize + DeserializeOwned {
    fn table() -> &'static Table;
}

impl Row for Task {
    fn table() -> &'static Table {
        &TASKS
    }
}

impl Row for CorpusPage {
    fn table() -> &'static Table {
        &CORPUS
    }
}

impl Row for MasRun {
    fn table() -> &'static Table {
        &MAS_RUNS
    }
}

impl Row for Trajectory {
    fn table() -> &'static Table {
        &TRAJECTORIES
    }
}

impl Row for Rollout {
    fn table() -> &'static Table {
        &ROLLOUTS
    }
}

/// Builds one record batch of the row's table (canonical schema, metadata included).
pub fn to_batch<R: Row>(rows: &[R]) -> Result<RecordBatch> {
    let table = R::table();
    let schema = table.schema();
    let batch = serde_arrow::to_record_batch(schema.fields(), &rows)
        .with_context(|| format!("building a `{}` batch", table.name))?;
    Ok(batch.with_schema(schema)?)
}

/// Reads rows out of a batch of the row's table (already validated and cast by the reader).
pub fn from_batch<R: Row>(batch: &RecordBatch) -> Result<Vec<R>> {
    let table = R::table();
    // Project onto the canonical columns so extra user columns do not confuse deserialisation.
    let idx: Vec<usize> = table
        .columns
        .iter()
        .map(|c| batch.schema().index_of(c.name).with_context(|| format!("`{}` table has no column `{}`", table.name, c.name)))
        .collect::<Result<_>>()?;
    let projected = batch.project(&idx)?;
    serde_arrow::from_record_batch(&projected).with_context(|| format!("reading `{}` rows", table.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_rows_round_trip_through_the_canonical_schema() {
        let t = Task {
            task_id: "t1".into(),
            suite: "code".into(),
            split: "train".into(),
            source: "synthetic".into(),
            question: "Write f".into(),
            answers: vec![],
            tools: vec!["code".into()],
            entry_point: Some("f".into()),
            stdio_tests: vec![StdioTest { stdin: "1\n".into(), expected_stdout: "2\n".into() }],
            ..Default::default()
        };
        let batch = to_batch(&[t.clone(), Task { task_id: "t2".into(), ..t.clone() }]).unwrap();
        assert_eq!(batch.schema(), TASKS.schema());
        let back: Vec<Task> = from_batch(&batch).unwrap();
        assert_eq!(back[0], t);
        assert_eq!(back[1].task_id, "t2");
    }

    #[test]
    fn corpus_rows_round_trip() {
        let p = CorpusPage { url: "u".into(), title: "T".into(), text: "x".into(), kind: "entity".into() };
        let batch = to_batch(&[p.clone()]).unwrap();
        assert_eq!(from_batch::<CorpusPage>(&batch).unwrap(), vec![p]);
    }
}
