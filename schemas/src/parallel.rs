//! Stages that read a table group by group and process each group in parallel (coa-extract,
//! coa-convert): work units for rayon, column access with clear errors, the reject table of
//! `--skip-bad`, and a writer on its own thread so writing overlaps the next group's work.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int32Array, Int64Array, ListArray, StringArray, StructArray, UInt32Array};
use arrow::compute::{take, take_record_batch};
use arrow::datatypes::{Int32Type, Int64Type};
use arrow::record_batch::RecordBatch;

use crate::io::{TableReader, TableWriter, BATCH_ROWS};
use crate::reasons::ReasonTable;
use crate::stage::Stage;

/// Rows per work unit: the grain of parallelism and the size of the output batches. Fixed (not
/// derived from the thread count) so that output is byte-identical on any machine.
pub const UNIT_ROWS: usize = 1024;

/// Rows gathered from the input before one parallel pass.
pub const GROUP_ROWS: usize = BATCH_ROWS;

/// Decoded input bytes gathered before one parallel pass. Teacher runs weigh kilobytes each: by
/// rows alone a group of 100k-row input held ~60 MB in and as much out, and every pass faulted
/// fresh zeroed pages for it (a fifth of coa-extract's time in the kernel). A few MB per group
/// stays in memory the allocator reuses, and still gives every core many batches.
pub const GROUP_BYTES: usize = 8 << 20;

/// The column added to rejected rows (see [`crate::reasons`]).
pub const REJECT_REASON: &str = "reject_reason";

/// A slice of one input batch processed by one task.
#[derive(Debug, Clone, Copy)]
pub struct Unit {
    pub batch: usize,
    pub lo: usize,
    pub hi: usize,
    /// Row number of `lo` in the whole input (for error messages).
    pub global: u64,
}

/// Cuts batches into units of at most [`UNIT_ROWS`] rows; `first_row` is the global row number of
/// the first batch's first row.
pub fn units(batches: &[RecordBatch], first_row: u64) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut global = first_row;
    for (b, batch) in batches.iter().enumerate() {
        let n = batch.num_rows();
        let mut lo = 0;
        while lo < n {
            let hi = (lo + UNIT_ROWS).min(n);
            out.push(Unit { batch: b, lo, hi, global: global + lo as u64 });
            lo = hi;
        }
        global += n as u64;
    }
    out
}

/// Reads batches until [`GROUP_ROWS`] rows or [`GROUP_BYTES`] bytes are gathered (or the input
/// ends).
pub fn next_group(reader: &mut TableReader) -> Result<Vec<RecordBatch>> {
    let mut group = Vec::new();
    let (mut rows, mut bytes) = (0, 0);
    while rows < GROUP_ROWS && bytes < GROUP_BYTES {
        match reader.next() {
            Some(b) => {
                let b = b?;
                rows += b.num_rows();
                bytes += b.get_array_memory_size();
                if b.num_rows() > 0 {
                    group.push(b);
                }
            }
            None => break,
        }
    }
    Ok(group)
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch.column_by_name(name).ok_or_else(|| anyhow!("column `{name}` is missing"))
}

pub fn utf8<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a StringArray> {
    column(batch, name)?.as_string_opt::<i32>().ok_or_else(|| anyhow!("column `{name}` is not utf8"))
}

pub fn list<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ListArray> {
    column(batch, name)?.as_list_opt::<i32>().ok_or_else(|| anyhow!("column `{name}` is not a list"))
}

pub fn boolean<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a BooleanArray> {
    column(batch, name)?.as_boolean_opt().ok_or_else(|| anyhow!("column `{name}` is not bool"))
}

pub fn int64<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a Int64Array> {
    column(batch, name)?.as_primitive_opt::<Int64Type>().ok_or_else(|| anyhow!("column `{name}` is not int64"))
}

pub fn struct_field<'a>(s: &'a StructArray, name: &str, what: &str) -> Result<&'a ArrayRef> {
    s.column_by_name(name).ok_or_else(|| anyhow!("{what} has no field `{name}`"))
}

pub fn struct_utf8<'a>(s: &'a StructArray, name: &str, what: &str) -> Result<&'a StringArray> {
    struct_field(s, name, what)?.as_string_opt::<i32>().ok_or_else(|| anyhow!("{what} field `{name}` is not utf8"))
}

pub fn struct_i32<'a>(s: &'a StructArray, name: &str, what: &str) -> Result<&'a Int32Array> {
    struct_field(s, name, what)?.as_primitive_opt::<Int32Type>().ok_or_else(|| anyhow!("{what} field `{name}` is not int32"))
}

/// A nullable string cell.
#[inline]
pub fn opt_str(a: &StringArray, i: usize) -> Option<&str> {
    if a.is_null(i) {
        None
    } else {
        Some(a.value(i))
    }
}

/// The rows `kept` of a column: a zero-copy slice when they are all of `lo..hi`, else a take.
pub fn select(col: &ArrayRef, lo: usize, hi: usize, kept: &[u32]) -> Result<ArrayRef> {
    if kept.len() == hi - lo {
        Ok(col.slice(lo, hi - lo))
    } else {
        Ok(take(col.as_ref(), &UInt32Array::from(kept.to_vec()), None)?)
    }
}

/// Writes rejected rows, if `--skip-bad` was given.
pub struct Rejects {
    writer: Option<(TableWriter, ReasonTable)>,
    count: u64,
}

impl Rejects {
    pub fn new(stage: &Stage, path: Option<&Path>, input_schema: &arrow::datatypes::Schema) -> Result<Rejects> {
        let writer = match path {
            Some(p) => {
                let table = ReasonTable::new(input_schema, REJECT_REASON);
                Some((stage.create(Some(p), None, table.schema())?, table))
            }
            None => None,
        };
        Ok(Rejects { writer, count: 0 })
    }

    pub fn write(&mut self, group: &[RecordBatch], rejected: &[Vec<(u32, String)>]) -> Result<()> {
        for (batch, rows) in group.iter().zip(rejected) {
            if rows.is_empty() {
                continue;
            }
            self.count += rows.len() as u64;
            if let Some((w, table)) = &mut self.writer {
                let idx = UInt32Array::from(rows.iter().map(|(r, _)| *r).collect::<Vec<_>>());
                let reasons = StringArray::from_iter_values(rows.iter().map(|(_, why)| why.as_str()));
                let taken = take_record_batch(batch, &idx)?;
                w.write(&table.batch(&taken, reasons).context("building the reject table")?)?;
            }
        }
        Ok(())
    }

    pub fn finish(self, stage: &mut Stage) -> Result<()> {
        if let Some((w, _)) = self.writer {
            w.finish()?;
            stage.note("rejected", self.count);
        }
        Ok(())
    }
}

/// A table writer on its own thread: encoding and compressing one group's batches overlaps the
/// next group's compute. Dropped unfinished, it still joins the thread, so the writer's own drop
/// removes its temporary file before the process exits.
pub struct BackgroundWriter {
    tx: Option<std::sync::mpsc::SyncSender<RecordBatch>>,
    handle: Option<std::thread::JoinHandle<Result<TableWriter>>>,
}

impl BackgroundWriter {
    pub fn new(mut w: TableWriter) -> Result<BackgroundWriter> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<RecordBatch>(4);
        let handle = std::thread::Builder::new().name("coa-write".into()).spawn(move || {
            for b in rx {
                w.write(&b)?;
            }
            Ok(w)
        })?;
        Ok(BackgroundWriter { tx: Some(tx), handle: Some(handle) })
    }

    /// The writer thread's error, once it has stopped.
    fn failure(&mut self) -> anyhow::Error {
        self.tx = None;
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => anyhow::anyhow!("the writer thread panicked"),
            _ => anyhow::anyhow!("the writer thread stopped"),
        }
    }

    pub fn write(&mut self, batch: RecordBatch) -> Result<()> {
        match &self.tx {
            Some(tx) if tx.send(batch).is_ok() => Ok(()),
            _ => Err(self.failure()),
        }
    }

    /// Waits for every batch to be written, then closes the table. Returns rows written.
    pub fn finish(mut self) -> Result<u64> {
        self.tx = None;
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(Ok(w))) => w.finish(),
            Some(Ok(Err(e))) => Err(e),
            _ => bail!("the writer thread panicked"),
        }
    }
}

impl Drop for BackgroundWriter {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
