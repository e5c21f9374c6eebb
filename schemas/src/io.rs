//! The one IO layer: every stage reads and writes tables through here.
//!
//! Reading: stdin or a file; the format is sniffed from the first bytes (`FF FF FF FF` = Arrow IPC
//! stream, `ARROW1` = IPC file, `PAR1` = Parquet), the schema is checked against the expected table
//! and compatible encodings are cast. IPC streams are read batch by batch (bounded memory);
//! Parquet and IPC files need random access, so from a pipe they are buffered whole.
//!
//! Writing: IPC stream (zstd) by default (the only Arrow format a pipe can carry; `*.arrows` names
//! one), Parquet (zstd) for `*.parquet`, IPC file for `*.arrow`/`*.feather` ([`Format::for_path`]). A file is written under a temporary name
//! ([`crate::output::TempFile`]) and committed on finish (inside a stage, with its other outputs
//! when it succeeds); if the writer is dropped unfinished, the temporary file is removed.
//!
//! An input whose metadata names one of our tables is checked against that table even when any
//! table is accepted: nulls in a non-nullable column are refused naming the stage that writes it.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Cursor, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::array::{Array, ArrayRef, AsArray, Int32Array};
use arrow::datatypes::UInt8Type;
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::reader::{FileReader, StreamReader};
use arrow::ipc::writer::{write_message, DictionaryTracker, EncodedData, FileWriter, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow::ipc::CompressionType;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};

use crate::output::{self, TempFile};
use crate::shard::ShardSpec;
use crate::tables::{compatible, type_name, Derived, Table, META_PROVENANCE, META_TABLE};

/// Rows per batch when reading Parquet and when stages build batches.
pub const BATCH_ROWS: usize = 8192;

/// Decoded bytes per batch when reading Parquet: tables with very large rows (a teacher run's
/// `events` re-read contexts run to tens of kilobytes) get fewer rows per batch, so each batch
/// stays a few MB and its buffers are reused instead of faulted in fresh (3x less system time).
const PARQUET_BATCH_BYTES: i64 = 4 << 20;
/// [`PARQUET_BATCH_BYTES`], or less for a process that holds many files open at once (a merge).
static BATCH_BYTES: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(PARQUET_BATCH_BYTES);
/// Whether readers decode ahead on a thread of their own ([`prefetch`]).
static PREFETCH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// For a process that reads many files at once (a merge of shard parts, one batch of each held at
/// a time): the files opened from now on decode batches of about `bytes` (down to one row) on the
/// caller's thread, without a reader thread decoding ahead (which would hold more batches, and
/// start a thread per file).
pub fn read_many_files_at_once(bytes: i64) {
    BATCH_BYTES.store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
    PREFETCH.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// Rows per Parquet batch: [`BATCH_ROWS`], fewer when rows are large (from row-group metadata).
fn parquet_batch_rows(meta: &parquet::file::metadata::ParquetMetaData) -> usize {
    let (rows, bytes) = meta.row_groups().iter().fold((0i64, 0i64), |(r, b), g| (r + g.num_rows(), b + g.total_byte_size()));
    if rows == 0 || bytes == 0 {
        return BATCH_ROWS;
    }
    let per_row = (bytes / rows).max(1);
    let budget = BATCH_BYTES.load(std::sync::atomic::Ordering::Relaxed);
    let fewest = if budget < PARQUET_BATCH_BYTES { 1 } else { 64 };
    ((budget / per_row) as usize).clamp(fewest, BATCH_ROWS)
}

/// zstd level of IPC stream buffers.
const IPC_ZSTD_LEVEL: i32 = 1;

/// Batches decoded ahead of the consumer by the reader's background thread.
const PREFETCH_BATCHES: usize = 8;

/// On-disk / on-pipe encoding of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// Arrow IPC stream (zstd-compressed buffers): the pipe format.
    Ipc,
    /// Arrow IPC file (random access; `.arrow`, `.feather`).
    IpcFile,
    /// Parquet with zstd.
    Parquet,
}

impl Format {
    /// Recognises a table encoding from its first bytes.
    pub fn sniff(head: &[u8]) -> Option<Format> {
        if head.starts_with(&[0xFF, 0xFF, 0xFF, 0xFF]) {
            Some(Format::Ipc)
        } else if head.starts_with(b"ARROW1") {
            Some(Format::IpcFile)
        } else if head.starts_with(b"PAR1") {
            Some(Format::Parquet)
        } else {
            None
        }
    }

    /// The default encoding for an output path (`None` = stdout). One rule for file names: a
    /// stream is `*.arrows` (Arrow's own extension for it), `*.arrow` is always an IPC file. Stdout
    /// is always a stream, since a stage cannot know the name `tee` or `>` gives it: a file made
    /// from a pipe is named `*.arrows` (`pl.read_ipc_stream` reads it; `pl.read_ipc` refuses it).
    pub fn for_path(path: Option<&Path>) -> Format {
        match path.and_then(|p| p.extension()).and_then(|e| e.to_str()) {
            Some("parquet") => Format::Parquet,
            Some("arrow") | Some("feather") => Format::IpcFile,
            Some("arrows") => Format::Ipc,
            _ => Format::Ipc,
        }
    }
}

/// Where a table came from: written into every output's schema metadata (`coa.provenance`), with
/// the provenance of each input nested, so any file can be traced back to its first stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub stage: String,
    pub version: String,
    pub args: Vec<String>,
    pub seed: Option<u64>,
    pub inputs: Vec<InputProvenance>,
}

/// One input of a stage: its name, the table it held and that table's own provenance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InputProvenance {
    pub source: String,
    pub table: Option<String>,
    pub provenance: Option<Box<Provenance>>,
}

/// Human name of an input: `stdin` or the path.
pub fn source_name(path: Option<&Path>) -> String {
    match path {
        None => "stdin".to_string(),
        Some(p) if p == Path::new("-") => "stdin".to_string(),
        Some(p) => p.display().to_string(),
    }
}

type BatchIter = Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send>;

/// Batches of one input table, validated against (and cast to) the expected table.
pub struct TableReader {
    source: String,
    format: Format,
    expected: Option<&'static Table>,
    found: SchemaRef,
    schema: SchemaRef,
    needs_cast: bool,
    /// Nested fields to drop from each decoded batch (formats that cannot skip them while reading).
    prune: Vec<Vec<&'static str>>,
    inner: BatchIter,
    batches: usize,
    rows: u64,
    /// Only this shard's rows are yielded (see [`crate::shard`]).
    shard: Option<ShardSpec>,
    /// A directory or glob read as one table: the file being read, then the files still to open.
    files: Option<Files>,
    /// How to read the input again from its start, to name the column of a bad value.
    reread: Option<Reread>,
}

/// An input that can be read again: a file, or a pipe buffered whole. A stream from a pipe
/// cannot.
enum Reread {
    Path(PathBuf),
    Bytes(Bytes),
}

/// The files of a directory or glob read as one table, opened one after another.
struct Files {
    current: Box<TableReader>,
    rest: std::collections::VecDeque<PathBuf>,
    expected: Option<&'static Table>,
    omit: Vec<Vec<&'static str>>,
    /// The first file, whose columns every other file must have.
    first: String,
}

impl TableReader {
    /// The schema of the batches this reader yields.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
    /// `stdin` or the input path.
    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn format(&self) -> Format {
        self.format
    }
    /// Rows yielded so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }
    /// The table name recorded in the input's metadata, if any.
    pub fn table_name(&self) -> Option<String> {
        self.found.metadata().get(META_TABLE).cloned()
    }
    /// The provenance recorded in the input's metadata, if it was written by a stage.
    pub fn provenance(&self) -> Option<Provenance> {
        self.found.metadata().get(META_PROVENANCE).and_then(|s| serde_json::from_str(s).ok())
    }
    /// Yields only the rows of `shard` (by `task_id`; see [`crate::shard`]); `None` yields all.
    /// Fails at once when the table has no string `task_id` column.
    pub fn sharded(mut self, shard: Option<ShardSpec>) -> Result<TableReader> {
        if shard.is_some() {
            crate::shard::check_shardable(&self.schema, &self.source)?;
        }
        self.shard = shard;
        Ok(self)
    }

    /// This input as recorded in a downstream output's provenance.
    pub fn input_provenance(&self) -> InputProvenance {
        InputProvenance {
            source: self.source.clone(),
            table: self.table_name().or_else(|| self.expected.map(|t| t.name.to_string())),
            provenance: self.provenance().map(Box::new),
        }
    }

    fn conform(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let batch = if self.prune.is_empty() { batch } else { prune_batch(&batch, &self.prune, &self.found)? };
        if !self.needs_cast {
            // Same columns and types: only the schema (metadata, nullability) is swapped.
            self.check_nulls(batch.columns())?;
            return RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec()).map_err(|e| anyhow!("{}: {e}", self.source));
        }
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        // Checked casts: a value that does not fit the canonical type is an error, not a null.
        let options = CastOptions { safe: false, ..Default::default() };
        for field in self.schema.fields() {
            let Ok(idx) = batch.schema().index_of(field.name()) else {
                let how = self.expected.and_then(|t| t.column(field.name())).and_then(|c| c.derived);
                let how = how.with_context(|| format!("{}: column `{}` is missing", self.source, field.name()))?;
                columns.push(derive_column(how, &columns, &self.schema).with_context(|| format!("{}: deriving column `{}`", self.source, field.name()))?);
                continue;
            };
            let column = batch.column(idx);
            if column.data_type() == field.data_type() {
                columns.push(column.clone());
            } else {
                columns.push(cast_with_options(column, field.data_type(), &options).with_context(|| {
                    format!("{}: casting column `{}` to {}", self.source, field.name(), type_name(field.data_type()))
                })?);
            }
        }
        self.check_nulls(&columns)?;
        RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| anyhow!("{}: {e}", self.source))
    }

    /// Refuses nulls in a column the table declares non-nullable, naming the column, the row and
    /// the stage that writes the table (arrow's own check says none of that).
    fn check_nulls(&self, columns: &[ArrayRef]) -> Result<()> {
        for (field, column) in self.schema.fields().iter().zip(columns) {
            if field.is_nullable() || column.null_count() == 0 {
                continue;
            }
            let first = (0..column.len()).find(|&i| column.is_null(i)).unwrap_or(0);
            let row = self.rows - column.len() as u64 + first as u64;
            let whose = match self.expected {
                Some(t) => format!("the `{}` table does not allow nulls there; it is written by `{}`", t.name, t.produced_by),
                None => "the input's own schema declares it non-nullable".to_string(),
            };
            bail!("{}: column `{}` holds {} null value(s), the first in row {row} ({whose})", self.source, field.name(), column.null_count());
        }
        Ok(())
    }
}

impl Iterator for TableReader {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        loop {
            let batch = match self.files.is_some() {
                true => self.next_of_files()?,
                false => self.next_batch()?,
            };
            let Some(shard) = self.shard else { return Some(batch) };
            match batch.and_then(|b| shard.select(&b, &self.source)) {
                Ok(b) if b.num_rows() == 0 => continue,
                other => return Some(other),
            }
        }
    }
}

impl TableReader {
    /// The next batch of the file being read, opening the next file when it ends.
    fn next_of_files(&mut self) -> Option<Result<RecordBatch>> {
        let files = self.files.as_mut()?;
        loop {
            if let Some(batch) = files.current.next() {
                if let Ok(b) = &batch {
                    self.batches += 1;
                    self.rows += b.num_rows() as u64;
                }
                return Some(batch);
            }
            let path = files.rest.pop_front()?;
            let opened = open_inner(Some(&path), files.expected, files.omit.clone()).and_then(|r| {
                if r.schema.fields() != self.schema.fields() {
                    bail!(
                        "{}: its columns ({}) differ from those of {} ({}); the files of a directory or glob must hold one table",
                        r.source,
                        describe_fields(&r.schema),
                        files.first,
                        describe_fields(&self.schema)
                    );
                }
                Ok(r)
            });
            match opened {
                Ok(r) => files.current = Box::new(r),
                Err(e) => {
                    files.rest.clear();
                    return Some(Err(e));
                }
            }
        }
    }

    fn next_batch(&mut self) -> Option<Result<RecordBatch>> {
        let next = self.inner.next()?;
        let batch = match next {
            Ok(b) => b,
            Err(e) if is_invalid_utf8(&e) => {
                let column = match self.reread.as_ref().and_then(|r| column_with_invalid_utf8(r, self.format)) {
                    Some(name) => format!("column `{name}`"),
                    None => format!("a text column ({})", text_columns(&self.found)),
                };
                return Some(Err(anyhow!(
                    "{}: {column} holds a string that is not valid UTF-8, after {} batches ({} rows); every text column must be UTF-8: {e}",
                    self.source,
                    self.batches,
                    self.rows
                )));
            }
            Err(e) => {
                return Some(Err(anyhow!(
                    "{}: input is truncated or corrupt after {} batches ({} rows): {e}",
                    self.source,
                    self.batches,
                    self.rows
                )))
            }
        };
        self.batches += 1;
        self.rows += batch.num_rows() as u64;
        Some(self.conform(batch))
    }
}

/// Whether a decoding error is arrow's or parquet's check of a string's UTF-8.
fn is_invalid_utf8(e: &ArrowError) -> bool {
    let m = e.to_string();
    m.contains("UTF8") || m.contains("UTF-8")
}

/// The names of the string columns (top level or nested) of `schema`, for an error that cannot
/// say which of them holds the bad value.
fn text_columns(schema: &Schema) -> String {
    fn has_text(t: &DataType) -> bool {
        match t {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) | DataType::Map(f, _) => has_text(f.data_type()),
            DataType::Struct(fs) => fs.iter().any(|f| has_text(f.data_type())),
            DataType::Dictionary(_, v) => has_text(v),
            _ => false,
        }
    }
    let names: Vec<String> = schema.fields().iter().filter(|f| has_text(f.data_type())).map(|f| format!("`{}`", f.name())).collect();
    format!("one of {}", names.join(", "))
}

/// The first column whose values, read alone from the input's start, fail arrow's or parquet's
/// UTF-8 check; `None` if none does (or the input cannot be read again). Only on the error path.
fn column_with_invalid_utf8(reread: &Reread, format: Format) -> Option<String> {
    let bytes = match reread {
        Reread::Bytes(b) => b.clone(),
        Reread::Path(p) => map_file(&File::open(p).ok()?, "").ok()?,
    };
    let (names, columns): (Vec<String>, Vec<BatchIter>) = match format {
        Format::Parquet => {
            let b = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).ok()?;
            let names = b.schema().fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
            let readers = (0..names.len())
                .filter_map(|i| {
                    let b = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).ok()?;
                    let mask = ProjectionMask::roots(b.parquet_schema(), [i]);
                    Some(Box::new(b.with_projection(mask).build().ok()?) as BatchIter)
                })
                .collect();
            (names, readers)
        }
        Format::IpcFile => {
            let names = FileReader::try_new(Cursor::new(bytes.clone()), None).ok()?.schema().fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
            let readers = (0..names.len()).filter_map(|i| Some(Box::new(FileReader::try_new(Cursor::new(bytes.clone()), Some(vec![i])).ok()?) as BatchIter)).collect();
            (names, readers)
        }
        Format::Ipc => {
            let names = StreamReader::try_new(Cursor::new(bytes.clone()), None).ok()?.schema().fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
            let readers = (0..names.len()).filter_map(|i| Some(Box::new(StreamReader::try_new(Cursor::new(bytes.clone()), Some(vec![i])).ok()?) as BatchIter)).collect();
            (names, readers)
        }
    };
    if columns.len() != names.len() {
        return None;
    }
    names.into_iter().zip(columns).find_map(|(name, mut batches)| batches.any(|b| b.is_err_and(|e| is_invalid_utf8(&e))).then_some(name))
}

/// Opens an input holding the `expected` table; `None` or `-` reads stdin.
pub fn open(path: Option<&Path>, expected: &'static Table) -> Result<TableReader> {
    open_inner(path, Some(expected), Vec::new())
}

/// Opens an input holding the `expected` table without the nested fields in `omit` (dotted paths
/// through structs and lists, e.g. `events.input_messages`): a stage that never looks at a large
/// field does not pay for decoding it. Parquet inputs skip those column chunks entirely (never
/// read, never decompressed); IPC inputs drop them after decoding. The schema check expects the
/// table minus these fields, and the batches come without them.
pub fn open_without(path: Option<&Path>, expected: &'static Table, omit: &[&'static str]) -> Result<TableReader> {
    let omit: Vec<Vec<&'static str>> = omit.iter().map(|p| p.split('.').collect()).collect();
    for path in &omit {
        let Some(col) = expected.column(path[0]) else {
            bail!("internal: cannot omit `{}`: the `{}` table has no column `{}`", path.join("."), expected.name, path[0]);
        };
        if path.len() < 2 || prune_type(&col.dtype, &path[1..]).is_none() {
            bail!("internal: cannot omit `{}`: not a nested field of the `{}` table", path.join("."), expected.name);
        }
    }
    open_inner(path, Some(expected), omit)
}

/// Opens an input holding any table (no schema check).
pub fn open_any(path: Option<&Path>) -> Result<TableReader> {
    open_inner(path, None, Vec::new())
}

/// Opens a table already in memory (e.g. a file read whole to sniff it); `expected` as in [`open`].
pub fn open_bytes(source: &str, bytes: Bytes, expected: Option<&'static Table>) -> Result<TableReader> {
    let format = sniff_or_fail(source, &bytes[..bytes.len().min(8)], expected)?;
    let (format, inner, found) = match format {
        Format::Ipc => stream_reader(source, Cursor::new(bytes.clone()))?,
        _ => random_access_reader(source, format, bytes.clone(), &[])?,
    };
    let mut reader = finish_open(source.to_string(), format, inner, found, expected, Vec::new())?;
    reader.reread = Some(Reread::Bytes(bytes));
    Ok(reader)
}

/// Reads a whole input into memory.
pub fn read_all(path: Option<&Path>, expected: &'static Table) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let reader = open(path, expected)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>>>()?;
    Ok((schema, batches))
}

fn expected_line(expected: Option<&'static Table>) -> String {
    match expected {
        Some(t) => format!("an Arrow IPC stream, Arrow IPC file or Parquet file holding the `{}` table (written by `{}`)", t.name, t.produced_by),
        None => "an Arrow IPC stream, Arrow IPC file or Parquet file".to_string(),
    }
}

fn read_head(r: &mut impl Read, n: usize) -> io::Result<Vec<u8>> {
    let mut head = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match r.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    head.truncate(got);
    Ok(head)
}

fn describe_head(head: &[u8]) -> String {
    let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
    let text: String = head.iter().map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '.' }).collect();
    format!("{} ({text:?})", hex.join(" "))
}

fn open_inner(path: Option<&Path>, expected: Option<&'static Table>, omit: Vec<Vec<&'static str>>) -> Result<TableReader> {
    if let Some(files) = path.map(table_files).transpose()?.flatten() {
        return open_files(path.unwrap(), files, expected, omit);
    }
    let source = source_name(path);
    let stdin = path.is_none() || path == Some(Path::new("-"));
    let mut reread = None;
    let (format, inner, found): (Format, BatchIter, SchemaRef) = if stdin {
        let mut input = io::stdin().lock();
        let head = read_head(&mut input, 8).with_context(|| format!("{source}: reading"))?;
        let format = sniff_or_fail(&source, &head, expected)?;
        match format {
            Format::Ipc => {
                // Release the lock first: the reader thread reads stdin through its own handle,
                // and std's stdin lock is not reentrant.
                drop(input);
                let chained = Cursor::new(head).chain(io::stdin());
                stream_reader(&source, BufReader::with_capacity(1 << 20, chained))?
            }
            Format::IpcFile | Format::Parquet => {
                // Both need random access: a pipe is buffered whole.
                let mut all = head;
                input.read_to_end(&mut all).with_context(|| format!("{source}: reading"))?;
                let all = Bytes::from(all);
                reread = Some(Reread::Bytes(all.clone()));
                random_access_reader(&source, format, all, &omit)?
            }
        }
    } else {
        let p = path.unwrap();
        // Only a regular file: opening a named pipe again would wait for a writer that is gone.
        reread = std::fs::metadata(p).is_ok_and(|m| m.is_file()).then(|| Reread::Path(p.to_path_buf()));
        let mut file = File::open(p).with_context(|| format!("cannot open input {source}"))?;
        let head = read_head(&mut file, 8).with_context(|| format!("{source}: reading"))?;
        let format = sniff_or_fail(&source, &head, expected)?;
        file.seek(SeekFrom::Start(0))?;
        match format {
            Format::Ipc => stream_reader(&source, BufReader::with_capacity(1 << 20, file))?,
            Format::IpcFile | Format::Parquet => random_access_reader(&source, format, map_file(&file, &source)?, &omit)?,
        }
    };
    let mut reader = finish_open(source, format, inner, found, expected, omit)?;
    reader.reread = reread;
    Ok(reader)
}

/// The files an input names when it is a directory (its `*.parquet` files) or a glob pattern
/// (`shards/part-*.parquet`; any of the three formats), sorted by name; `None` for one file.
/// Hidden files (a writer's `.NAME.PID.tmp`) and `_`-prefixed ones (`_SUCCESS`) are never read.
pub fn table_files(path: &Path) -> Result<Option<Vec<PathBuf>>> {
    let shown = |p: &Path| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| !n.starts_with('.') && !n.starts_with('_'));
    let mut files: Vec<PathBuf> = if path.is_dir() {
        let entries = std::fs::read_dir(path).with_context(|| format!("cannot list input directory {}", path.display()))?;
        let mut files = Vec::new();
        for entry in entries {
            let p = entry.with_context(|| format!("listing input directory {}", path.display()))?.path();
            if p.is_file() && shown(&p) && p.extension().is_some_and(|e| e == "parquet") {
                files.push(p);
            }
        }
        if files.is_empty() {
            bail!("input directory {} holds no *.parquet file; expected the Parquet files of one table", path.display());
        }
        files
    } else {
        let pattern = path.to_string_lossy();
        if path.exists() || !pattern.contains(['*', '?', '[']) {
            return Ok(None);
        }
        let options = glob::MatchOptions { require_literal_leading_dot: true, ..Default::default() };
        let matches = glob::glob_with(&pattern, options).map_err(|e| anyhow!("input {pattern}: not a valid glob pattern: {e}"))?;
        let files: Vec<PathBuf> = matches.filter_map(|m| m.ok()).filter(|p| p.is_file() && shown(p)).collect();
        if files.is_empty() {
            bail!("input {pattern}: no file matches this pattern");
        }
        files
    };
    files.sort();
    Ok(Some(files))
}

/// Opens the files of a directory or glob as one table: the first now (its schema is the table's),
/// the others as the reading reaches them, each checked to hold the same columns.
fn open_files(path: &Path, files: Vec<PathBuf>, expected: Option<&'static Table>, omit: Vec<Vec<&'static str>>) -> Result<TableReader> {
    let mut rest: std::collections::VecDeque<PathBuf> = files.into();
    let first_path = rest.pop_front().expect("table_files returns at least one file");
    let first = open_inner(Some(&first_path), expected, omit.clone())?;
    let count = rest.len() + 1;
    let source = format!("{} ({count} file{})", path.display(), if count == 1 { "" } else { "s" });
    Ok(TableReader {
        source,
        format: first.format,
        expected: first.expected,
        found: first.found.clone(),
        schema: first.schema.clone(),
        needs_cast: false,
        prune: Vec::new(),
        inner: Box::new(std::iter::empty()),
        batches: 0,
        rows: 0,
        shard: None,
        files: Some(Files { first: first.source.clone(), current: Box::new(first), rest, expected, omit }),
        reread: None,
    })
}

fn describe_fields(schema: &Schema) -> String {
    schema.fields().iter().map(|f| format!("{}: {}", f.name(), type_name(f.data_type()))).collect::<Vec<_>>().join(", ")
}

fn finish_open(
    source: String,
    format: Format,
    inner: BatchIter,
    found: SchemaRef,
    expected: Option<&'static Table>,
    omit: Vec<Vec<&'static str>>,
) -> Result<TableReader> {
    // Parquet skipped the omitted fields while reading; other formats drop them from each batch.
    let (found, prune) = if format == Format::Parquet || omit.is_empty() {
        (found, Vec::new())
    } else {
        (prune_schema(&found, &omit), omit.clone())
    };
    // An input of any table (coa-filter passes tables on unchanged) that names one of ours in its
    // metadata keeps its own columns, but no nulls where that table allows none.
    let (schema, needs_cast, expected) = match expected {
        Some(t) => {
            let (schema, needs_cast) = check_schema(&source, &found, t, &omit)?;
            (schema, needs_cast, Some(t))
        }
        None => match found.metadata().get(META_TABLE).and_then(|name| crate::tables::by_name(name)) {
            Some(t) => (with_nullability_of(&found, t), false, Some(t)),
            None => (found.clone(), false, None),
        },
    };
    let inner = if PREFETCH.load(std::sync::atomic::Ordering::Relaxed) { prefetch(inner) } else { inner };
    Ok(TableReader { source, format, expected, found, schema, needs_cast, prune, inner, batches: 0, rows: 0, shard: None, files: None, reread: None })
}

/// `found` with the nullability `table` declares for the columns they share (the rest as found).
fn with_nullability_of(found: &SchemaRef, table: &Table) -> SchemaRef {
    let declared = table.schema();
    let fields: Vec<Field> = found
        .fields()
        .iter()
        .map(|f| match declared.field_with_name(f.name()) {
            Ok(d) if !d.is_nullable() => f.as_ref().clone().with_nullable(false),
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new(fields).with_metadata(found.metadata().clone()))
}

/// A Parquet reader without the leaves under the omitted fields; batches sized by [`parquet_batch_rows`].
fn parquet_reader<T: parquet::file::reader::ChunkReader + 'static>(
    b: ParquetRecordBatchReaderBuilder<T>,
    omit: &[Vec<&'static str>],
) -> Result<(Format, BatchIter, SchemaRef)> {
    let rows = parquet_batch_rows(b.metadata());
    // The table name and provenance live in the file's schema metadata; the built reader's
    // (projected) schema does not carry them.
    let metadata = b.schema().metadata().clone();
    let b = b.with_batch_size(rows);
    let b = if omit.is_empty() {
        b
    } else {
        let leaves = b.parquet_schema();
        let keep: Vec<usize> = (0..leaves.num_columns())
            .filter(|&i| !omit.iter().any(|o| leaf_under(leaves.column(i).path().parts(), o)))
            .collect();
        let mask = ProjectionMask::leaves(leaves, keep);
        b.with_projection(mask)
    };
    let r = b.build()?;
    let fields = arrow::record_batch::RecordBatchReader::schema(&r).fields().clone();
    let schema = Arc::new(Schema::new(fields).with_metadata(metadata));
    Ok((Format::Parquet, Box::new(r), schema))
}

/// Whether a Parquet leaf (its column path) lies under the field `chain`, skipping the
/// repeated-group wrappers Parquet writers put around list items.
fn leaf_under(parts: &[String], chain: &[&str]) -> bool {
    let mut k = 0;
    for part in parts {
        if part == chain[k] {
            k += 1;
            if k == chain.len() {
                return true;
            }
        } else if k == 0 || !matches!(part.as_str(), "list" | "element" | "item" | "array" | "bag") {
            return false;
        }
    }
    false
}

/// `dt` without the nested field at `path` (through structs and lists); `None` if there is none.
fn prune_type(dt: &DataType, path: &[&str]) -> Option<DataType> {
    use DataType::*;
    match dt {
        Struct(fields) => {
            let idx = fields.iter().position(|f| f.name() == path[0])?;
            let mut kept: Vec<FieldRef> = fields.iter().cloned().collect();
            if path.len() == 1 {
                kept.remove(idx);
            } else {
                let inner = prune_type(kept[idx].data_type(), &path[1..])?;
                kept[idx] = Arc::new(kept[idx].as_ref().clone().with_data_type(inner));
            }
            Some(Struct(Fields::from(kept)))
        }
        List(item) => Some(List(Arc::new(item.as_ref().clone().with_data_type(prune_type(item.data_type(), path)?)))),
        LargeList(item) => Some(LargeList(Arc::new(item.as_ref().clone().with_data_type(prune_type(item.data_type(), path)?)))),
        _ => None,
    }
}

fn prune_schema(schema: &Schema, omit: &[Vec<&'static str>]) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let mut dt = f.data_type().clone();
            for path in omit.iter().filter(|p| p[0] == f.name()) {
                dt = prune_type(&dt, &path[1..]).unwrap_or(dt);
            }
            f.as_ref().clone().with_data_type(dt)
        })
        .collect();
    Arc::new(Schema::new(fields).with_metadata(schema.metadata().clone()))
}

/// `array` without the nested field at `path` (the array counterpart of [`prune_type`]).
fn prune_array(array: &ArrayRef, path: &[&str]) -> Result<ArrayRef> {
    use arrow::array::{Array, AsArray, GenericListArray, StructArray};
    Ok(match array.data_type() {
        DataType::Struct(_) => {
            let s = array.as_struct();
            let Some(idx) = s.fields().iter().position(|f| f.name() == path[0]) else { return Ok(array.clone()) };
            let mut fields: Vec<FieldRef> = s.fields().iter().cloned().collect();
            let mut columns = s.columns().to_vec();
            if path.len() == 1 {
                fields.remove(idx);
                columns.remove(idx);
            } else {
                columns[idx] = prune_array(&columns[idx], &path[1..])?;
                fields[idx] = Arc::new(fields[idx].as_ref().clone().with_data_type(columns[idx].data_type().clone()));
            }
            Arc::new(StructArray::try_new(Fields::from(fields), columns, s.nulls().cloned())?)
        }
        DataType::List(item) => {
            let l = array.as_list::<i32>();
            let values = prune_array(l.values(), path)?;
            let item = Arc::new(item.as_ref().clone().with_data_type(values.data_type().clone()));
            Arc::new(GenericListArray::<i32>::try_new(item, l.offsets().clone(), values, l.nulls().cloned())?)
        }
        DataType::LargeList(item) => {
            let l = array.as_list::<i64>();
            let values = prune_array(l.values(), path)?;
            let item = Arc::new(item.as_ref().clone().with_data_type(values.data_type().clone()));
            Arc::new(GenericListArray::<i64>::try_new(item, l.offsets().clone(), values, l.nulls().cloned())?)
        }
        _ => array.clone(),
    })
}

/// `batch` without the omitted fields; `pruned` is the input schema without them (computed once).
fn prune_batch(batch: &RecordBatch, omit: &[Vec<&'static str>], pruned: &SchemaRef) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    for path in omit {
        if let Ok(idx) = batch.schema().index_of(path[0]) {
            columns[idx] = prune_array(&columns[idx], &path[1..])?;
        }
    }
    Ok(RecordBatch::try_new(pruned.clone(), columns)?)
}

/// Decodes batches on a background thread, a few ahead of the consumer, so decompression overlaps
/// the stage's own work and its output encoding. Memory stays bounded by the channel capacity.
fn prefetch(inner: BatchIter) -> BatchIter {
    let (tx, rx) = std::sync::mpsc::sync_channel(PREFETCH_BATCHES);
    let handle = std::thread::Builder::new()
        .name("coa-read".into())
        .spawn(move || {
            for item in inner {
                if tx.send(item).is_err() {
                    break; // the consumer stopped reading
                }
            }
        })
        .expect("spawning the reader thread");
    Box::new(Prefetched { rx, handle: Some(handle) })
}

struct Prefetched {
    rx: std::sync::mpsc::Receiver<std::result::Result<RecordBatch, ArrowError>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Iterator for Prefetched {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.rx.recv() {
            Ok(item) => Some(item),
            Err(_) => {
                // The channel closed: a clean end, unless the decoder thread panicked, which must
                // not read as a shorter table.
                let handle = self.handle.take()?;
                match handle.join() {
                    Ok(()) => None,
                    Err(_) => Some(Err(ArrowError::ExternalError("the reader thread panicked while decoding".into()))),
                }
            }
        }
    }
}

fn sniff_or_fail(source: &str, head: &[u8], expected: Option<&'static Table>) -> Result<Format> {
    if head.is_empty() {
        bail!("{source}: input is empty; expected {}", expected_line(expected));
    }
    Format::sniff(head).ok_or_else(|| {
        anyhow!(
            "{source}: input is not Arrow or Parquet (first bytes {}); expected {}",
            describe_head(head),
            expected_line(expected)
        )
    })
}

fn stream_reader<R: Read + Send + 'static>(source: &str, r: R) -> Result<(Format, BatchIter, SchemaRef)> {
    let reader = StreamReader::try_new(r, None)
        .map_err(|e| anyhow!("{source}: Arrow IPC stream is truncated or corrupt before its schema: {e}"))?;
    let schema = reader.schema();
    Ok((Format::Ipc, Box::new(reader), schema))
}

/// The whole file as `Bytes`, memory-mapped: the decoders read the page cache directly instead of
/// copying every page through a read buffer, and the pages of columns a projected read skips are
/// never touched (so the mapping is not pre-faulted: that touched them too, and measured slower).
/// A file truncated by another process while we read it would fault, as with any mapped reader
/// (ripgrep's trade-off too); the stages never rewrite a file in place.
fn map_file(file: &File, source: &str) -> Result<Bytes> {
    // SAFETY: read-only private mapping; see above for concurrent truncation.
    let map = unsafe { memmap2::MmapOptions::new().map(file) }.with_context(|| format!("{source}: cannot map the file for reading"))?;
    Ok(Bytes::from_owner(map))
}

fn random_access_reader(source: &str, format: Format, bytes: Bytes, omit: &[Vec<&'static str>]) -> Result<(Format, BatchIter, SchemaRef)> {
    match format {
        Format::IpcFile => {
            let r = FileReader::try_new(Cursor::new(bytes), None)
                .map_err(|e| anyhow!("{source}: not a readable Arrow IPC file (truncated or corrupt?): {e}"))?;
            let schema = r.schema();
            Ok((format, Box::new(r), schema))
        }
        Format::Parquet => {
            let b = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .map_err(|e| anyhow!("{source}: not a readable Parquet file (truncated or corrupt?): {e}"))?;
            parquet_reader(b, omit)
        }
        Format::Ipc => unreachable!("streams are read incrementally"),
    }
}

/// Computes a [`Derived`] column from the already conformed columns before it (`schema` order).
fn derive_column(how: Derived, columns: &[ArrayRef], schema: &Schema) -> Result<ArrayRef> {
    let (Derived::ListLen(from) | Derived::ListOnes(from)) = how;
    let idx = schema.index_of(from)?;
    let list = columns
        .get(idx)
        .and_then(|c| c.as_list_opt::<i32>())
        .with_context(|| format!("`{from}` must be a list column that precedes it"))?;
    let values: Int32Array = (0..list.len())
        .map(|i| {
            if list.is_null(i) {
                return None;
            }
            let v = list.value(i);
            Some(match how {
                Derived::ListLen(_) => v.len() as i32,
                Derived::ListOnes(_) => v.as_primitive_opt::<UInt8Type>().map_or(0, |m| m.values().iter().filter(|&&x| x == 1).count() as i32),
            })
        })
        .collect();
    Ok(Arc::new(values))
}

/// Checks `found` against the expected table (minus the `omit`ted nested fields). Returns the
/// schema batches will be cast to: the canonical columns first, then any extra columns the input
/// carries, unchanged.
fn check_schema(source: &str, found: &Schema, table: &'static Table, omit: &[Vec<&'static str>]) -> Result<(SchemaRef, bool)> {
    let written_by = format!("the `{}` table is written by `{}`", table.name, table.produced_by);
    if let Some(name) = found.metadata().get(META_TABLE) {
        if name != table.name {
            bail!("{source}: input holds the `{name}` table, expected the `{}` table ({written_by})", table.name);
        }
    }
    let canonical = table.schema();
    let mut fields = Vec::with_capacity(found.fields().len());
    let mut needs_cast = false;
    for (i, col) in table.columns.iter().enumerate() {
        let Ok(idx) = found.index_of(col.name) else {
            if col.derived.is_some() {
                // computed from the row in `conform`
                fields.push(canonical.field(i).clone());
                needs_cast = true;
                continue;
            }
            let names: Vec<&str> = found.fields().iter().map(|f| f.name().as_str()).collect();
            bail!(
                "{source}: column `{}` is missing: expected {} ({written_by}; columns found: {})",
                col.name,
                type_name(&col.dtype),
                names.join(", ")
            );
        };
        let got = found.field(idx).data_type();
        let mut want = col.dtype.clone();
        for path in omit.iter().filter(|p| p[0] == col.name) {
            want = prune_type(&want, &path[1..]).unwrap_or(want);
        }
        if !compatible(&want, got) {
            bail!(
                "{source}: column `{}` has type {}, expected {} ({written_by})",
                col.name,
                type_name(got),
                type_name(&want)
            );
        }
        needs_cast |= idx != i || got != &want;
        fields.push(canonical.field(i).clone().with_data_type(want));
    }
    for f in found.fields() {
        if table.column(f.name()).is_none() {
            fields.push(f.as_ref().clone());
            needs_cast = true;
        }
    }
    let schema = Schema::new(fields).with_metadata(canonical.metadata().clone());
    Ok((Arc::new(schema), needs_cast))
}

/// An Arrow IPC stream writer that compresses several batches at once on rayon's threads and
/// writes them in order: zstd encoding is the expensive part of writing a pipe, and arrow's
/// `StreamWriter` does it on one thread. Schemas with dictionary columns (whose dictionaries must
/// be tracked across batches) are encoded one batch at a time.
struct ParallelStreamWriter {
    out: Box<dyn Write + Send>,
    options: IpcWriteOptions,
    generator: IpcDataGenerator,
    tracker: DictionaryTracker,
    context: IpcWriteContext,
    sequential: bool,
    pending: Vec<RecordBatch>,
}

/// Batches encoded together; bounded so memory stays a few batches deep.
const ENCODE_AHEAD: usize = 4;

impl ParallelStreamWriter {
    fn try_new(mut out: Box<dyn Write + Send>, schema: &Schema, options: IpcWriteOptions) -> Result<Self> {
        let generator = IpcDataGenerator::default();
        let mut tracker = DictionaryTracker::new(false);
        let encoded = generator.schema_to_bytes_with_dictionary_tracker(schema, &mut tracker, &options);
        write_message(&mut out, encoded, &options)?;
        let sequential = schema.fields().iter().any(|f| has_dictionary(f.data_type()));
        Ok(ParallelStreamWriter { out, options, generator, tracker, context: IpcWriteContext::default(), sequential, pending: Vec::new() })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.sequential {
            let (dictionaries, encoded) = self.generator.encode(batch, &mut self.tracker, &self.options, &mut self.context)?;
            for d in dictionaries {
                write_message(&mut self.out, d, &self.options)?;
            }
            write_message(&mut self.out, encoded, &self.options)?;
            return Ok(());
        }
        self.pending.push(batch.clone());
        if self.pending.len() >= ENCODE_AHEAD {
            self.flush_pending()?;
        }
        Ok(())
    }

    fn flush_pending(&mut self) -> Result<()> {
        use rayon::prelude::*;
        let (generator, options) = (&self.generator, &self.options);
        let encoded: Vec<std::result::Result<EncodedData, ArrowError>> = self
            .pending
            .par_iter()
            .map_init(IpcWriteContext::default, |context, batch| {
                let mut tracker = DictionaryTracker::new(false);
                generator.encode(batch, &mut tracker, options, context).map(|(_, data)| data)
            })
            .collect();
        self.pending.clear();
        for data in encoded {
            write_message(&mut self.out, data?, &self.options)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Box<dyn Write + Send>> {
        self.flush_pending()?;
        // End-of-stream: continuation marker and a zero-length message.
        self.out.write_all(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0])?;
        Ok(self.out)
    }
}

fn has_dictionary(dt: &arrow::datatypes::DataType) -> bool {
    use arrow::datatypes::DataType::*;
    match dt {
        Dictionary(..) => true,
        List(f) | LargeList(f) | FixedSizeList(f, _) | ListView(f) | LargeListView(f) | Map(f, _) => has_dictionary(f.data_type()),
        Struct(fs) => fs.iter().any(|f| has_dictionary(f.data_type())),
        Union(fs, _) => fs.iter().any(|(_, f)| has_dictionary(f.data_type())),
        RunEndEncoded(_, v) => has_dictionary(v.data_type()),
        _ => false,
    }
}

enum Sink {
    Ipc(ParallelStreamWriter),
    IpcFile(FileWriter<Box<dyn Write + Send>>),
    Parquet(ArrowWriter<Box<dyn Write + Send>>),
}

/// The buffer compression of an Arrow IPC output. A file is stored, so it gets zstd (level 1, as
/// Arrow C++/pyarrow use); a pipe between two stages is read at once and never stored, so it is
/// not compressed: compressing cost more CPU on both ends than moving the bytes (zstd was a third
/// of coa-extract's time, LZ4 a quarter). `COA_IPC_COMPRESSION=zstd|lz4|none` overrides both.
fn ipc_compression(path: Option<&Path>) -> Result<Option<CompressionType>> {
    if let Ok(v) = std::env::var("COA_IPC_COMPRESSION") {
        return match v.as_str() {
            "zstd" => Ok(Some(CompressionType::ZSTD)),
            "lz4" => Ok(Some(CompressionType::LZ4_FRAME)),
            "none" => Ok(None),
            other => bail!("COA_IPC_COMPRESSION={other:?}: expected zstd, lz4 or none"),
        };
    }
    let regular_file = match path {
        Some(p) => !std::fs::metadata(p).is_ok_and(|m| !m.file_type().is_file()),
        None => stdout_is_regular_file(),
    };
    Ok(if regular_file { Some(CompressionType::ZSTD) } else { None })
}

/// A pipe holds 64 KiB by default: the two stages on its ends then take turns every 64 KiB. Ask
/// for 1 MiB (best effort: the kernel caps it, and it fails harmlessly when stdout is no pipe).
fn widen_stdout_pipe() {
    // SAFETY: fcntl on fd 1 with an integer argument.
    unsafe {
        libc::fcntl(1, libc::F_SETPIPE_SZ, 1 << 20);
    }
}

fn stdout_is_regular_file() -> bool {
    // SAFETY: fstat on fd 1 into a zeroed stat buffer.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(1, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
    }
}

/// Writes one table to stdout or a file (a [`TempFile`] committed by [`TableWriter::finish`]).
pub struct TableWriter {
    sink: Option<Sink>,
    target: String,
    tmp: Option<TempFile>,
    rows: u64,
}

/// Adds `coa.provenance` to a table schema.
pub fn with_provenance(schema: &Schema, provenance: &Provenance) -> Result<SchemaRef> {
    let mut meta = schema.metadata().clone();
    meta.insert(META_PROVENANCE.to_string(), serde_json::to_string(provenance)?);
    Ok(Arc::new(schema.clone().with_metadata(meta)))
}

/// Creates a writer; `path` `None` or `-` means stdout. `format` overrides the path's default.
pub fn create(path: Option<&Path>, format: Option<Format>, schema: &Schema, provenance: &Provenance) -> Result<TableWriter> {
    let stdout = path.is_none() || path == Some(Path::new("-"));
    let path = if stdout { None } else { path };
    let format = format.unwrap_or_else(|| Format::for_path(path));
    let schema = with_provenance(schema, provenance)?;
    let target = path.map(|p| p.display().to_string()).unwrap_or_else(|| "stdout".into());
    let (out, tmp): (Box<dyn Write + Send>, _) = match path {
        None => {
            widen_stdout_pipe();
            (Box::new(BufWriter::with_capacity(1 << 20, io::stdout())), None)
        }
        // A device or FIFO (`-o /dev/null`, `-o /dev/stdout`, a named pipe) is written in place:
        // renaming a temporary file onto it would replace the device with a regular file.
        Some(p) if output::is_written_in_place(p) => {
            let f = std::fs::OpenOptions::new().write(true).open(p).with_context(|| format!("opening {}", p.display()))?;
            (Box::new(BufWriter::with_capacity(1 << 20, f)), None)
        }
        Some(p) => {
            let (tmp, f) = TempFile::create(p)?;
            (Box::new(BufWriter::with_capacity(1 << 20, f)), Some(tmp))
        }
    };
    let mut writer = TableWriter { sink: None, target, tmp, rows: 0 };
    let compression = ipc_compression(path)?;
    let ipc_options = || -> Result<IpcWriteOptions> {
        let o = IpcWriteOptions::default().try_with_compression(compression)?;
        Ok(if compression == Some(CompressionType::ZSTD) { o.try_with_compression_level(Some(IPC_ZSTD_LEVEL))? } else { o })
    };
    let sink = match format {
        Format::Ipc => Sink::Ipc(ParallelStreamWriter::try_new(out, &schema, ipc_options()?)?),
        Format::IpcFile => Sink::IpcFile(FileWriter::try_new_with_options(out, &schema, ipc_options()?)?),
        Format::Parquet => {
            // The coa.* keys also go into Parquet's own key-value metadata, so tools that do not
            // decode the embedded Arrow schema (polars' read_parquet_metadata, duckdb) see them.
            let kv: Vec<KeyValue> = schema
                .metadata()
                .iter()
                .filter(|(k, _)| k.starts_with("coa."))
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
                .collect();
            let props = WriterProperties::builder()
                .set_key_value_metadata(Some(kv))
                // zstd level 1, as pyarrow writes zstd Parquet: level 3 cost a third of coa-convert's time.
                .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
                .set_max_row_group_row_count(Some(128 * 1024))
                .build();
            Sink::Parquet(ArrowWriter::try_new(out, schema, Some(props))?)
        }
    };
    writer.sink = Some(sink);
    Ok(writer)
}

impl TableWriter {
    /// Appends one batch.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let target = &self.target;
        match self.sink.as_mut().expect("writer used after finish") {
            Sink::Ipc(w) => w.write(batch).map_err(|e| io_context(e, target))?,
            Sink::IpcFile(w) => w.write(batch).map_err(|e| io_context(e.into(), target))?,
            Sink::Parquet(w) => w.write(batch).map_err(|e| io_context(e.into(), target))?,
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Closes the table, flushes, and commits a file output (renamed into place now, or with the
    /// stage's other outputs when it succeeds: see [`crate::output`]). Returns rows written.
    pub fn finish(mut self) -> Result<u64> {
        let target = self.target.clone();
        let flushed: Result<()> = match self.sink.take().expect("finish called twice") {
            Sink::Ipc(w) => w.finish().and_then(flush),
            Sink::IpcFile(mut w) => w.finish().map_err(Into::into).and_then(|_| w.into_inner().map_err(Into::into)).and_then(flush),
            Sink::Parquet(w) => w.into_inner().map_err(Into::into).and_then(flush),
        };
        flushed.map_err(|e| io_context(e, &target))?;
        if let Some(tmp) = self.tmp.take() {
            tmp.commit()?;
        }
        Ok(self.rows)
    }
}

fn flush(mut w: Box<dyn Write + Send>) -> Result<()> {
    w.flush()?;
    Ok(())
}

fn io_context(e: anyhow::Error, target: &str) -> anyhow::Error {
    if is_broken_pipe(&e) {
        return e;
    }
    e.context(format!("writing {target}"))
}

impl Drop for TableWriter {
    fn drop(&mut self) {
        // An unfinished output is never left behind under its final (or temporary) name: the
        // sink (which holds the file open) goes first, then the temporary file.
        drop(self.sink.take());
        drop(self.tmp.take());
    }
}

/// Whether an error is (caused by) a closed stdout pipe, which ends a stage quietly.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            return io.kind() == io::ErrorKind::BrokenPipe;
        }
        if let Some(ArrowError::IoError(_, io)) = cause.downcast_ref::<ArrowError>() {
            return io.kind() == io::ErrorKind::BrokenPipe;
        }
        cause.to_string().contains("Broken pipe")
    })
}

/// Writes a whole table in one go: convenience for small outputs built in memory.
pub fn write_all(path: Option<&Path>, format: Option<Format>, schema: &Schema, batches: &[RecordBatch], provenance: &Provenance) -> Result<u64> {
    let mut w = create(path, format, schema, provenance)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()
}
