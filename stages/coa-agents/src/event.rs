//! Rows of the `mas_runs` table: one [`MasRun`] per task, with every agent activation as an
//! [`Event`]. Field names and types mirror `coa_schemas::tables::MAS_RUNS` exactly; batches are
//! built through serde_arrow with that schema, so the table is still defined in one place.

use anyhow::Result;
use arrow::record_batch::RecordBatch;
use coa_schemas::rows::{self, Row};
use coa_schemas::tables::{Table, MAS_RUNS};
use serde::{Deserialize, Serialize};

/// One chat message `{role, content}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// One agent activation (see the crate docs for the event contract).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

impl Row for MasRun {
    fn table() -> &'static Table {
        &MAS_RUNS
    }
}

/// One `mas_runs` record batch (canonical schema and metadata).
pub fn to_batch(runs: &[MasRun]) -> Result<RecordBatch> {
    rows::to_batch(runs)
}

/// Reads `mas_runs` rows back (tests, downstream tools).
pub fn from_batch(batch: &RecordBatch) -> Result<Vec<MasRun>> {
    rows::from_batch(batch)
}
