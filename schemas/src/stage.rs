//! The command-line harness every stage binary shares: common IO flags, the provenance of what it
//! writes, the one-line JSON summary on stderr (and `--stats FILE`), progress bars only on a
//! terminal, error reporting, and a quiet exit on a closed stdout pipe.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use arrow::datatypes::Schema;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Map, Value};

use crate::io::{self, Format, InputProvenance, Provenance, TableReader, TableWriter};
use crate::output;
use crate::shard::ShardSpec;
use crate::tables::Table;

/// The global allocator every stage binary installs (`#[global_allocator] static ALLOC: Allocator =
/// Allocator;`): batches are allocated and freed at a high rate, where mimalloc's reuse saves
/// ~10% of a pipe's time over the system allocator (measured on the IO benchmark).
pub use mimalloc::MiMalloc as Allocator;

/// Stages are short batch processes that free and re-allocate batch-sized buffers at a high rate:
/// by default mimalloc returns freed pages to the OS after a delay and then faults them in again,
/// zeroed (a third of coa-extract's time went to the kernel). Keep them instead. A delay the user
/// set (`MIMALLOC_PURGE_DELAY`) is respected: the option is changed only while it holds the
/// default of the mimalloc version we build (v3: 1000 ms).
pub fn tune_allocator() {
    // `mi_option_purge_delay` in mimalloc v3's option enum (libmimalloc-sys has no constant for it).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    const V3_DEFAULT_MS: std::os::raw::c_long = 1000;
    // SAFETY: plain option getters/setters of the linked allocator; no pointers involved.
    unsafe {
        if libmimalloc_sys::mi_option_get(PURGE_DELAY) == V3_DEFAULT_MS {
            libmimalloc_sys::mi_option_set(PURGE_DELAY, -1);
        }
    }
}

/// Flags shared by every stage that reads and writes one table.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct IoArgs {
    /// Input table (Arrow IPC stream, IPC file or Parquet; sniffed). Default: stdin.
    #[arg(short = 'i', long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Output table. Default: stdout as an Arrow IPC stream; `*.parquet` writes Parquet.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Output encoding, overriding the one implied by the output path.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Also write the one-line JSON summary to this file.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
}

impl IoArgs {
    /// The output flags, for [`Stage::outputs`].
    pub fn outputs(&self) -> [(&'static str, Option<&Path>); 2] {
        [("-o", self.output.as_deref()), ("--stats", self.stats.as_deref())]
    }
}

/// A running stage: what it read, what it wrote, and its summary.
pub struct Stage {
    name: String,
    version: String,
    seed: Option<u64>,
    inputs: Vec<InputProvenance>,
    started: Instant,
    rows_in: u64,
    rows_out: u64,
    summary: Map<String, Value>,
    stats_path: Option<PathBuf>,
    /// Flags (with a value) left out of the provenance: outputs (where a table went is not what
    /// it is) and flags that do not change the data.
    unrecorded_flags: Vec<&'static str>,
    /// Switches (no value) that do not change the data, also left out of the provenance.
    unrecorded_switches: Vec<&'static str>,
    /// Phrases for the summary a person reads on a terminal (rows dropped and why).
    headline: Vec<String>,
}

impl Stage {
    pub fn new(name: &str, version: &str) -> Stage {
        tune_allocator();
        Stage {
            name: name.to_string(),
            version: version.to_string(),
            seed: None,
            inputs: Vec::new(),
            started: Instant::now(),
            rows_in: 0,
            rows_out: 0,
            summary: Map::new(),
            stats_path: None,
            unrecorded_flags: vec!["-o", "--stats"],
            unrecorded_switches: Vec::new(),
            headline: Vec::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Records the seed in the provenance of every output.
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = Some(seed);
    }

    /// Where to also write the summary line.
    pub fn set_stats_path(&mut self, path: Option<PathBuf>) {
        self.stats_path = path;
    }

    /// Checks every output path before any work (see [`output::check_outputs`]): a path that is
    /// a directory, or two outputs naming one file, fail here rather than after the work. The
    /// flags are also left out of the provenance. Call it first thing with every output flag.
    ///
    /// With no `-o` the table goes to stdout as binary Arrow: refused when stdout is a terminal
    /// (as `zstd` does), where it would only garble the screen; `-o -` still writes it there.
    pub fn outputs(&mut self, outputs: &[(&'static str, Option<&Path>)]) -> Result<()> {
        let flags: Vec<&'static str> = outputs.iter().map(|&(flag, _)| flag).collect();
        self.not_recorded(&flags);
        if outputs.iter().any(|&(flag, path)| flag == "-o" && path.is_none()) && std::io::stdout().is_terminal() {
            anyhow::bail!(
                "stdout is a terminal, and {} writes its table there as binary Arrow: give -o FILE (.parquet), pipe it into the next stage, \
                 or look at it with `| coa-show` (-o - writes it anyway)",
                self.name
            );
        }
        output::check_outputs(outputs)
    }

    /// Leaves flags that take a value out of the provenance: those that change how the work is
    /// done or what else is written, not the table (worker threads, log cadence, a checkpoint
    /// directory). Output paths are left out by [`Stage::outputs`] already.
    pub fn not_recorded(&mut self, flags: &[&'static str]) {
        for &flag in flags {
            if !self.unrecorded_flags.contains(&flag) {
                self.unrecorded_flags.push(flag);
            }
        }
    }

    /// Like [`Stage::not_recorded`], for switches that take no value.
    pub fn not_recorded_switches(&mut self, switches: &[&'static str]) {
        for &switch in switches {
            if !self.unrecorded_switches.contains(&switch) {
                self.unrecorded_switches.push(switch);
            }
        }
    }

    /// The provenance written into outputs: this stage, the arguments that determine the data
    /// (every argument but the output paths and the flags of [`Stage::not_recorded`]), seed and
    /// inputs. The same run written to two file names, or on another thread count, gives the
    /// same provenance.
    pub fn provenance(&self) -> Provenance {
        Provenance {
            stage: self.name.clone(),
            version: self.version.clone(),
            args: without_flags(std::env::args().skip(1), &self.unrecorded_flags, &self.unrecorded_switches),
            seed: self.seed,
            inputs: self.inputs.clone(),
        }
    }

    /// Opens an input table, checked against `table`, and records it in the provenance.
    pub fn open(&mut self, path: Option<&Path>, table: &'static Table) -> Result<TableReader> {
        let reader = io::open(path, table)?;
        self.inputs.push(reader.input_provenance());
        Ok(reader)
    }

    /// Like [`Stage::open`], without the nested fields in `omit` (see [`io::open_without`]).
    pub fn open_without(&mut self, path: Option<&Path>, table: &'static Table, omit: &[&'static str]) -> Result<TableReader> {
        let reader = io::open_without(path, table, omit)?;
        self.inputs.push(reader.input_provenance());
        Ok(reader)
    }

    /// The rows of `shard` of an opened input (all rows for `None`), noted in the summary line.
    /// The input must have a `task_id` column (see [`crate::shard`]).
    pub fn shard(&mut self, reader: TableReader, shard: Option<ShardSpec>) -> Result<TableReader> {
        if let Some(spec) = shard {
            self.note("shard", spec.to_string());
        }
        reader.sharded(shard)
    }

    /// Opens an input holding any table (no schema check), and records it in the provenance.
    pub fn open_any(&mut self, path: Option<&Path>) -> Result<TableReader> {
        let reader = io::open_any(path)?;
        self.inputs.push(reader.input_provenance());
        Ok(reader)
    }

    /// Records an input that is not a table (a task file being imported).
    pub fn add_input_file(&mut self, path: &Path) {
        self.inputs.push(InputProvenance { source: path.display().to_string(), table: None, provenance: None });
    }

    /// Creates an output writer carrying this stage's provenance.
    pub fn create(&self, path: Option<&Path>, format: Option<Format>, schema: &Schema) -> Result<TableWriter> {
        io::create(path, format, schema, &self.provenance())
    }

    pub fn add_rows_in(&mut self, n: u64) {
        self.rows_in += n;
    }
    pub fn add_rows_out(&mut self, n: u64) {
        self.rows_out += n;
    }

    /// Adds a field to the summary line.
    pub fn note(&mut self, key: &str, value: impl Into<Value>) {
        self.summary.insert(key.to_string(), value.into());
    }

    /// Adds a phrase to the one-line summary printed when stderr is a terminal ("dropped 226 of
    /// 604 rows longer than --max-len 2048"): what a person must not miss in the JSON.
    pub fn headline(&mut self, phrase: impl Into<String>) {
        self.headline.push(phrase.into());
    }

    /// The summary for a terminal: stage, rows in and out, seconds, the headline phrases.
    pub fn human_summary(&self) -> String {
        let mut line = format!("{}: {} rows in, {} out, {:.1} s", self.name, self.rows_in, self.rows_out, self.started.elapsed().as_secs_f64());
        for phrase in &self.headline {
            line.push_str("; ");
            line.push_str(phrase);
        }
        if self.stats_path.is_none() {
            line.push_str(" (--stats FILE keeps the JSON summary)");
        }
        line
    }

    /// A progress bar drawn on stderr only when stderr is a terminal.
    pub fn progress(&self, len: Option<u64>, what: &str) -> ProgressBar {
        if !std::io::stderr().is_terminal() {
            return ProgressBar::hidden();
        }
        let bar = match len {
            Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
        };
        let template = if len.is_some() {
            "{prefix} {bar:30} {pos}/{len} {msg} [{elapsed_precise}, eta {eta}]"
        } else {
            "{prefix} {spinner} {pos} {msg} [{elapsed_precise}]"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.set_prefix(format!("{} {what}", self.name));
        // The clock and spinner move between updates (a teacher's task can take seconds).
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
        bar
    }

    /// Prints a log line on stderr: above `bar` while it is drawn (a terminal), plainly where it
    /// is hidden, so logs in CI and make stay free of control characters.
    pub fn log_line(bar: &ProgressBar, line: &str) {
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
    }

    /// The summary line: stage, rows in/out, seconds, plus notes.
    pub fn summary(&self) -> Value {
        let mut m = Map::new();
        m.insert("stage".into(), json!(self.name));
        m.insert("rows_in".into(), json!(self.rows_in));
        m.insert("rows_out".into(), json!(self.rows_out));
        m.insert("seconds".into(), json!((self.started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0));
        for (k, v) in &self.summary {
            m.insert(k.clone(), v.clone());
        }
        Value::Object(m)
    }

    /// The summary line, also written to `--stats` (printed once the outputs are in place).
    fn finish(&self) -> Result<String> {
        let line = serde_json::to_string(&self.summary())?;
        if let Some(path) = &self.stats_path {
            write_atomically(path, format!("{line}\n").as_bytes())?;
        }
        Ok(line)
    }
}

pub use crate::output::write_atomically;

/// `args` without the given flags and their values (`-o X`, `-oX`, `--output X`, `--output=X`;
/// `-o` also stands for `--output`) and without the given switches.
fn without_flags(args: impl Iterator<Item = String>, flags: &[&str], switches: &[&str]) -> Vec<String> {
    let spellings: Vec<&str> = flags.iter().flat_map(|&f| if f == "-o" { vec!["-o", "--output"] } else { vec![f] }).collect();
    let mut kept = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        if switches.contains(&arg.as_str()) {
            continue;
        }
        if spellings.contains(&arg.as_str()) {
            skip_value = true;
        } else if !spellings.iter().any(|f| (f.starts_with("--") && arg.starts_with(&format!("{f}="))) || (f.len() == 2 && !f.starts_with("--") && arg.starts_with(f) && arg.len() > 2)) {
            kept.push(arg);
        }
    }
    kept
}

/// A stage binary's `main` after flag parsing: the stage `name` (version `version`, the binary's
/// `CARGO_PKG_VERSION`) with its `--stats` path, running `body` under [`run`]. Every stage binary
/// ends in this call, so each starts, summarises and fails the same way.
pub fn main(name: &str, version: &str, stats: Option<PathBuf>, body: impl FnOnce(&mut Stage) -> Result<()>) -> ExitCode {
    let mut stage = Stage::new(name, version);
    stage.set_stats_path(stats);
    run(&mut stage, body)
}

/// Runs a stage body and turns its result into an exit code: the summary on success, one clear
/// error line (with its chain of causes) on failure, and a quiet exit 0 when stdout was closed.
///
/// File outputs are all-or-none: each waits under its temporary name until the body (and the
/// `--stats` summary) succeeded, then all are renamed into place; on failure all are removed.
pub fn run(stage: &mut Stage, body: impl FnOnce(&mut Stage) -> Result<()>) -> ExitCode {
    output::defer_commits();
    // A panic is a bug, but it must not leave finished outputs waiting under temporary names.
    let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(stage))) {
        Ok(result) => result,
        Err(panic) => {
            output::discard_deferred();
            std::panic::resume_unwind(panic);
        }
    };
    let result = result.and_then(|_| stage.finish()).and_then(|line| output::commit_deferred().map(|_| line));
    match result {
        Ok(line) => {
            // A person reads one short line; logs and scripts get the JSON.
            if std::io::stderr().is_terminal() {
                eprintln!("{}", stage.human_summary());
            } else {
                eprintln!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) if io::is_broken_pipe(&e) => {
            // The reader went away: whatever was piped is what it wanted; files still commit.
            match output::commit_deferred() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{}: error: {e:#}", stage.name());
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            output::discard_deferred();
            eprintln!("{}: error: {e:#}", stage.name());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::without_flags;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn unrecorded_flags_and_switches_are_dropped_in_every_spelling() {
        let args = strings(&["-i", "in.parquet", "-o", "a", "-ob", "--output=c", "--output", "d", "--threads", "4", "--threads=2", "--save-every", "1", "--verify-joined", "--lr", "3e-4", "--save", "ck"]);
        let kept = without_flags(args.into_iter(), &["-o", "--threads", "--save"], &["--verify-joined"]);
        // --save-every is another flag than --save: it stays.
        assert_eq!(kept, strings(&["-i", "in.parquet", "--save-every", "1", "--lr", "3e-4"]));
    }
}
