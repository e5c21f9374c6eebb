//! Rows of the `mas_runs` table: one [`MasRun`] per task, with every agent activation as an
//! [`Event`]. The row types live in `coa_schemas::rows`, beside the table definition.

use anyhow::Result;
use arrow::record_batch::RecordBatch;
use coa_schemas::rows;

pub use coa_schemas::rows::{ChatMessage, Event, MasRun};

/// One `mas_runs` record batch (canonical schema and metadata).
pub fn to_batch(runs: &[MasRun]) -> Result<RecordBatch> {
    rows::to_batch(runs)
}

/// Reads `mas_runs` rows back (tests, downstream tools).
pub fn from_batch(batch: &RecordBatch) -> Result<Vec<MasRun>> {
    rows::from_batch(batch)
}
