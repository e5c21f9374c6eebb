//! Typed rows for the tables that library code builds row by row.
//!
//! Field names and types mirror [`crate::tables`] exactly; conversion goes through serde_arrow
//! with the canonical schema, so the table is still defined in one place (a test round-trips).

use anyhow::{Context, Result};
use arrow::record_batch::RecordBatch;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::tables::{Table, CORPUS, TASKS};

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
