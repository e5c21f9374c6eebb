//! `coa-show`: a quick look at a table of the pipeline without Python.
//!
//! One pass over the input: the header (source, format, table name, rows, the provenance chain
//! from the schema metadata), a summary line per column, then the first rows, one field per line.
//! The summaries are exact over the whole table; only the distinct count of a string column stops
//! counting at [`MAX_DISTINCT`] values (printed as "over N").

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Result};
use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use clap::Parser;
use coa_schemas::io::{self, Format, Provenance};
use coa_schemas::text::{group_digits, shorten};

/// Distinct values of a string column counted at most (memory stays bounded on huge tables).
pub const MAX_DISTINCT: usize = 1_000_000;

/// Characters of a cell printed before it is cut (its full length is given).
const CELL_CHARS: usize = 96;

#[derive(Parser, Debug)]
#[command(
    name = "coa-show",
    version,
    about = "A quick look at a table: format, rows, provenance, a summary per column, the first rows",
    long_about = "A quick look at any table the stages write, without Python: the format, the table name and row count, \
the provenance chain (which stage wrote it, with which flags, from which inputs), one summary line per column \
(nulls; min, mean and max of numbers; true count of booleans; distinct values and lengths of strings; lengths of \
lists) and the first rows, one field per line (long cells cut, with their length). Reads Parquet, Arrow IPC files \
and streams, a directory or glob of shards, or stdin.",
    after_help = "Examples:\n  coa-show runs/default/tasks.parquet\n  \
coa-show runs/default/eval/sft/scores.parquet --columns suite,correct,reward --head 3\n  \
coa-generate tasks --suite math --n 5 | coa-show --no-summary"
)]
pub struct Args {
    /// The table to show (Parquet, Arrow IPC file or stream, a directory or glob of shards); stdin when absent or `-`.
    #[arg(value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Rows to print (0: none).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 5)]
    pub head: usize,
    /// Only these columns (comma-separated names), in this order.
    #[arg(long, value_name = "A,B,..", value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// Skip the per-column summary: read only as far as the first rows.
    #[arg(long)]
    pub no_summary: bool,
    /// Print each cell whole, its lines as they are (indented), instead of one line cut at 96 characters.
    #[arg(long)]
    pub full: bool,
}

/// Reads the input and returns what `coa-show` prints.
pub fn run(args: &Args) -> Result<String> {
    let path = args.input.as_deref().filter(|p| p.as_os_str() != "-");
    let reader = io::open_any(path)?;
    let source = reader.source().to_string();
    let format = reader.format();
    let table = reader.table_name();
    let provenance = reader.provenance();
    let full = reader.schema();
    let picks = pick_columns(&full, args.columns.as_deref(), &source)?;
    let fields: Vec<Field> = picks.iter().map(|&i| full.field(i).clone()).collect();

    let mut summaries: Vec<Summary> = fields.iter().map(|f| Summary::new(f.data_type())).collect();
    let mut head: Vec<RecordBatch> = Vec::new();
    let mut head_rows = 0usize;
    let mut rows = 0u64;
    let mut complete = true;
    for batch in reader {
        let batch = batch?.project(&picks)?;
        if head_rows < args.head {
            let take = (args.head - head_rows).min(batch.num_rows());
            head.push(batch.slice(0, take));
            head_rows += take;
        }
        rows += batch.num_rows() as u64;
        if args.no_summary {
            if head_rows >= args.head {
                complete = false;
                break;
            }
            continue;
        }
        for (s, col) in summaries.iter_mut().zip(batch.columns()) {
            s.add(col)?;
        }
    }

    let mut out = String::new();
    let _ = writeln!(out, "{source}");
    let _ = writeln!(out, "  format   {}", format_name(format));
    let _ = writeln!(out, "  table    {}", table.as_deref().unwrap_or("(not named: not written by a stage)"));
    if complete {
        let _ = writeln!(out, "  rows     {}", group_digits(rows));
    } else {
        let _ = writeln!(out, "  rows     {}+ (counting stopped with --no-summary)", group_digits(rows));
    }
    match &provenance {
        Some(p) => write_provenance(&mut out, p, 0),
        None => {
            let _ = writeln!(out, "  written by  (no provenance recorded)");
        }
    }

    let _ = writeln!(out, "\ncolumns ({} of {})", fields.len(), full.fields().len());
    let name_w = fields.iter().map(|f| f.name().chars().count()).max().unwrap_or(4).max(6);
    let types: Vec<String> = fields.iter().map(|f| type_label(f.data_type())).collect();
    let type_w = types.iter().map(|t| t.chars().count()).max().unwrap_or(4).clamp(4, 40);
    for ((f, t), s) in fields.iter().zip(&types).zip(&summaries) {
        let t = shorten(t, 40);
        if args.no_summary {
            let _ = writeln!(out, "  {:name_w$}  {t}", f.name());
        } else {
            let _ = writeln!(out, "  {:name_w$}  {t:type_w$}  {}", f.name(), s.describe(rows));
        }
    }

    if args.head > 0 {
        let _ = writeln!(out, "\nfirst {} of {} rows", head_rows, if complete { group_digits(rows) } else { format!("{}+", group_digits(rows)) });
        let options = FormatOptions::default().with_null("null");
        let mut index = 0usize;
        for batch in &head {
            let formatters = batch.columns().iter().map(|c| ArrayFormatter::try_new(c.as_ref(), &options)).collect::<Result<Vec<_>, _>>()?;
            for r in 0..batch.num_rows() {
                let _ = writeln!(out, "  [{index}]");
                for (f, fmt) in fields.iter().zip(&formatters) {
                    let text = fmt.value(r).to_string();
                    let shown = if args.full { text.replace('\n', &format!("\n    {:name_w$}  ", "")) } else { cell(&text) };
                    let _ = writeln!(out, "    {:name_w$}  {shown}", f.name());
                }
                index += 1;
            }
        }
    }
    Ok(out)
}

/// The indices of the columns to show: all, or `wanted` in its order (each must exist).
fn pick_columns(schema: &Schema, wanted: Option<&[String]>, source: &str) -> Result<Vec<usize>> {
    let Some(wanted) = wanted else {
        return Ok((0..schema.fields().len()).collect());
    };
    let mut picks = Vec::new();
    for name in wanted {
        let name = name.trim();
        match schema.index_of(name) {
            Ok(i) => picks.push(i),
            Err(_) => {
                let have: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                bail!("--columns: {source} has no column `{name}` (it has: {})", have.join(", "));
            }
        }
    }
    if picks.is_empty() {
        bail!("--columns: give at least one column name");
    }
    Ok(picks)
}

fn format_name(format: Format) -> &'static str {
    match format {
        Format::Parquet => "Parquet",
        Format::IpcFile => "Arrow IPC file",
        Format::Ipc => "Arrow IPC stream",
    }
}

/// The provenance chain, one stage a line, inputs indented under the stage that read them.
fn write_provenance(out: &mut String, p: &Provenance, depth: usize) {
    let pad = "  ".repeat(depth + 1);
    let seed = p.seed.map(|s| format!(" (seed {s})")).unwrap_or_default();
    let args = p.args.iter().map(|a| shell_word(a)).collect::<Vec<_>>().join(" ");
    let label = if depth == 0 { "written by  " } else { "" };
    let args = if args.is_empty() { String::new() } else { format!(": {}", shorten(&args, 240)) };
    let _ = writeln!(out, "{pad}{label}{} {}{args}{seed}", p.stage, p.version);
    for input in &p.inputs {
        let table = input.table.as_deref().map(|t| format!(" ({t})")).unwrap_or_default();
        let _ = writeln!(out, "{pad}  <- {}{table}", input.source);
        if let Some(inner) = &input.provenance {
            write_provenance(out, inner, depth + 2);
        }
    }
}

/// An argument as a shell would need it written.
fn shell_word(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,%+@".contains(c)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// A data type as people write it: `list<string>`, `struct{name, ...}`.
fn type_label(t: &DataType) -> String {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::Boolean => "bool".into(),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => format!("list<{}>", type_label(f.data_type())),
        DataType::Struct(fs) => {
            let names: Vec<&str> = fs.iter().map(|f| f.name().as_str()).collect();
            format!("struct{{{}}}", names.join(", "))
        }
        DataType::Dictionary(_, v) => format!("dict<{}>", type_label(v)),
        other => other.to_string().to_lowercase(),
    }
}

/// A cell on one line: newlines and tabs shown as escapes, cut after [`CELL_CHARS`] characters.
fn cell(text: &str) -> String {
    let flat = text.replace('\\', "\\\\").replace('\n', "\\n").replace('\r', "\\r").replace('\t', "\\t");
    let n = text.chars().count();
    if flat.chars().count() <= CELL_CHARS {
        flat
    } else {
        format!("{}... ({} chars)", flat.chars().take(CELL_CHARS).collect::<String>(), group_digits(n as u64))
    }
}

/// A number in a summary line: integers as integers, others with 4 significant digits.
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else if x != 0.0 && (x.abs() >= 1e6 || x.abs() < 1e-3) {
        format!("{x:.3e}")
    } else {
        let digits = (3 - x.abs().log10().floor() as i32).clamp(0, 6) as usize;
        format!("{x:.digits$}")
    }
}

/// min / sum / max over a stream of values.
#[derive(Default)]
struct Range {
    n: u64,
    min: f64,
    max: f64,
    sum: f64,
}

impl Range {
    fn add(&mut self, x: f64) {
        if self.n == 0 {
            self.min = x;
            self.max = x;
        } else {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
        self.sum += x;
        self.n += 1;
    }
    fn describe(&self) -> String {
        if self.n == 0 {
            return "-".into();
        }
        format!("min {}  mean {}  max {}", num(self.min), num(self.sum / self.n as f64), num(self.max))
    }
}

/// What one column's summary line counts.
enum Kind {
    Number { range: Range, nan: u64 },
    Bool { trues: u64 },
    Text { distinct: HashSet<String>, over: bool, chars: Range },
    Lengths(Range),
    Other,
}

struct Summary {
    nulls: u64,
    kind: Kind,
}

impl Summary {
    fn new(t: &DataType) -> Summary {
        let kind = match t {
            t if t.is_numeric() => Kind::Number { range: Range::default(), nan: 0 },
            DataType::Boolean => Kind::Bool { trues: 0 },
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Kind::Text { distinct: HashSet::new(), over: false, chars: Range::default() },
            DataType::Dictionary(_, v) if matches!(v.as_ref(), DataType::Utf8 | DataType::LargeUtf8) => {
                Kind::Text { distinct: HashSet::new(), over: false, chars: Range::default() }
            }
            DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) | DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                Kind::Lengths(Range::default())
            }
            _ => Kind::Other,
        };
        Summary { nulls: 0, kind }
    }

    fn add(&mut self, col: &ArrayRef) -> Result<()> {
        self.nulls += col.null_count() as u64;
        match &mut self.kind {
            Kind::Number { range, nan } => {
                let values = cast(col, &DataType::Float64)?;
                for x in values.as_primitive::<arrow::datatypes::Float64Type>().iter().flatten() {
                    if x.is_nan() {
                        *nan += 1;
                    } else {
                        range.add(x);
                    }
                }
            }
            Kind::Bool { trues } => *trues += col.as_boolean().true_count() as u64,
            Kind::Text { distinct, over, chars } => {
                let values = cast(col, &DataType::Utf8)?;
                for s in values.as_string::<i32>().iter().flatten() {
                    chars.add(s.chars().count() as f64);
                    if !*over && !distinct.contains(s) {
                        if distinct.len() >= MAX_DISTINCT {
                            *over = true;
                        } else {
                            distinct.insert(s.to_string());
                        }
                    }
                }
            }
            Kind::Lengths(range) => {
                for i in 0..col.len() {
                    if col.is_valid(i) {
                        range.add(value_len(col.as_ref(), i) as f64);
                    }
                }
            }
            Kind::Other => {}
        }
        Ok(())
    }

    fn describe(&self, rows: u64) -> String {
        if rows > 0 && self.nulls == rows {
            return "all null".into();
        }
        let nulls = if self.nulls == 0 { String::new() } else { format!("{} null; ", group_digits(self.nulls)) };
        let body = match &self.kind {
            Kind::Number { range, nan } => {
                let nan = if *nan == 0 { String::new() } else { format!("; {} NaN", group_digits(*nan)) };
                format!("{}{nan}", range.describe())
            }
            Kind::Bool { trues } => {
                let valid = rows - self.nulls;
                let pct = if valid == 0 { 0.0 } else { 100.0 * *trues as f64 / valid as f64 };
                format!("{} true ({pct:.1}%)", group_digits(*trues))
            }
            Kind::Text { distinct, over, chars } => {
                let count = if *over { format!("over {}", group_digits(MAX_DISTINCT as u64)) } else { group_digits(distinct.len() as u64) };
                format!("{count} distinct; chars {}", chars.describe())
            }
            Kind::Lengths(range) => format!("length {}", range.describe()),
            Kind::Other => String::new(),
        };
        format!("{nulls}{body}").trim_end_matches("; ").to_string()
    }
}

/// Elements of a list, or bytes of a binary value, at row `i`.
fn value_len(col: &dyn Array, i: usize) -> usize {
    match col.data_type() {
        DataType::List(_) => col.as_list::<i32>().value_length(i) as usize,
        DataType::LargeList(_) => col.as_list::<i64>().value_length(i) as usize,
        DataType::FixedSizeList(_, n) => *n as usize,
        DataType::Binary => col.as_binary::<i32>().value(i).len(),
        DataType::LargeBinary => col.as_binary::<i64>().value(i).len(),
        DataType::BinaryView => col.as_binary_view().value(i).len(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_stay_on_one_line_and_long_ones_say_their_length() {
        assert_eq!(cell("a\nb\tc"), "a\\nb\\tc");
        let long = "x".repeat(500);
        let shown = cell(&long);
        assert!(shown.ends_with("... (500 chars)"), "{shown}");
        assert_eq!(shown.chars().filter(|&c| c == 'x').count(), CELL_CHARS);
    }

    #[test]
    fn numbers_read_as_people_write_them() {
        assert_eq!(num(3.0), "3");
        assert_eq!(num(0.6875), "0.6875");
        assert_eq!(num(12.3456), "12.35");
        assert_eq!(num(2.5e-5), "2.500e-5");
    }

    #[test]
    fn arguments_are_quoted_only_where_a_shell_needs_it() {
        assert_eq!(shell_word("--where"), "--where");
        assert_eq!(shell_word("suite = 'math'"), r"'suite = '\''math'\'''");
    }
}
