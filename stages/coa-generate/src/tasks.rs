//! `coa-generate tasks`: synthesize an offline task suite (with its document corpus for multihop)
//! or import a real task file, and write the `tasks` table.

use std::path::PathBuf;

use anyhow::{bail, Result};
use coa_schemas::io::BATCH_ROWS;
use coa_schemas::rows::{self, Row, Task};
use coa_schemas::stage::{IoArgs, Stage};
use coa_schemas::tables::CORPUS;
use coa_tasks::{Split, Suite};

use crate::positive;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  coa-generate tasks --suite multihop --n 1000 --seed 1 -o tasks.parquet --corpus-out corpus.parquet\n  \
coa-generate tasks --import aime24.parquet -o aime.parquet\n  coa-generate tasks --import HumanEval.jsonl.gz | python3 -c 'import sys, pyarrow as pa; print(pa.ipc.open_stream(sys.stdin.buffer).read_all().num_rows)'")]
pub struct TasksArgs {
    /// Synthetic suite to generate: multihop, math or code. Repeat for several suites in one table.
    #[arg(long, value_parser = parse_suite, required_unless_present = "import", conflicts_with = "import")]
    suite: Vec<Suite>,
    /// Number of tasks: one value for every suite, or one per --suite, in order.
    #[arg(long, default_value = "100", value_parser = task_count)]
    n: Vec<usize>,
    /// Seed: the same seed gives byte-identical output.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// `train`, or `test` for held-out entities and numbers never seen in train.
    #[arg(long, value_parser = parse_split, default_value = "train")]
    split: Split,
    /// Real task file to import: verl RL Parquet, question/answer JSON lines or one JSON array
    /// (NQ, GAIA, BrowseComp, HLE, WebWalker), HumanEval JSONL (gzipped or not).
    #[arg(long, value_name = "FILE")]
    import: Option<PathBuf>,
    /// Split label for imported tasks (default: test; a benchmark file is test data whatever split
    /// it records).
    #[arg(long, value_name = "SPLIT", requires = "import")]
    import_split: Option<String>,
    /// Keep only the first N imported tasks, in the file's order (a bounded evaluation).
    #[arg(long, value_name = "N", requires = "import", value_parser = task_count)]
    first: Option<usize>,
    /// Where to write the multihop document corpus (the offline web the tools search).
    #[arg(long, value_name = "FILE")]
    corpus_out: Option<PathBuf>,
    #[command(flatten)]
    pub io: IoArgs,
}

/// The most tasks `--n` asks of one suite. A suite is built in memory before it is written
/// (MEASURE per multihop task with its corpus), so a count past this is a typo that would
/// grow until the kernel kills the stage.
pub const MAX_TASKS: usize = 1_000_000;

fn task_count(s: &str) -> Result<usize, String> {
    match positive(s)? {
        n if n <= MAX_TASKS => Ok(n),
        _ => Err(format!("`{s}`: expected at most {MAX_TASKS} tasks a suite (a suite is built in memory; make several tables with different --seed)")),
    }
}

fn parse_suite(s: &str) -> Result<Suite, String> {
    coa_tasks::parse_synthesised(s).map_err(|_| format!("unknown suite `{s}`: expected multihop, math or code"))
}

/// Pairs each --suite with its --n (one --n applies to every suite).
fn suite_counts(suites: &[Suite], n: &[usize]) -> Result<Vec<usize>> {
    let counts = match n.len() {
        1 => vec![n[0]; suites.len()],
        k if k == suites.len() => n.to_vec(),
        k => bail!("--n: given {k} times for {} suites; give it once, or once per --suite", suites.len()),
    };
    if let Some(i) = counts.iter().position(|&c| c == 0) {
        bail!("--n: expected at least 1 task for suite {}", suites[i]);
    }
    Ok(counts)
}

fn parse_split(s: &str) -> Result<Split, String> {
    s.parse().map_err(|_| format!("unknown split `{s}`: expected train or test"))
}

/// Writes the tasks (and the corpus, with `--corpus-out`) of `coa-generate tasks`.
pub fn run(stage: &mut Stage, args: &TasksArgs) -> Result<()> {
    let [out, stats] = args.io.outputs();
    stage.outputs(&[out, stats, ("--corpus-out", args.corpus_out.as_deref())])?;
    if args.io.input.is_some() {
        bail!("`coa-generate tasks` reads no table: use --import FILE for a task file, or --suite to synthesize");
    }
    let (tasks, corpus) = match (&args.import, args.suite.is_empty()) {
        (Some(path), _) => {
            stage.add_input_file(path);
            if args.corpus_out.is_some() {
                bail!("--corpus-out: imported tasks come without a corpus; it is written only with --suite multihop");
            }
            let (layout, mut tasks) = coa_tasks::import::import_file_with_layout(path, args.import_split.as_deref())?;
            stage.add_rows_in(tasks.len() as u64);
            if let Some(n) = args.first {
                tasks.truncate(n);
            }
            stage.note("layout", layout.to_string());
            (tasks, Vec::new())
        }
        (None, false) => {
            // clap's `requires` does not hold these inside the subcommand: refused here.
            if args.first.is_some() {
                bail!("--first N keeps the first N tasks of an imported file: give --import FILE (synthetic suites take --n)");
            }
            if args.import_split.is_some() {
                bail!("--import-split labels imported tasks: give --import FILE (synthetic suites take --split)");
            }
            stage.set_seed(args.seed);
            let counts = suite_counts(&args.suite, &args.n)?;
            let (mut tasks, mut corpus) = (Vec::new(), Vec::new());
            for (&suite, &n) in args.suite.iter().zip(&counts) {
                let generated = coa_tasks::generate(suite, n, args.seed, args.split)?;
                tasks.extend(generated.tasks);
                corpus.extend(generated.corpus);
            }
            let names: Vec<String> = args.suite.iter().map(|s| s.to_string()).collect();
            stage.note("suites", names.join(","));
            stage.note("split", args.split.to_string());
            (tasks, corpus)
        }
        (None, true) => bail!("give --suite to synthesize tasks or --import FILE to import them"),
    };
    if corpus.is_empty() && args.corpus_out.is_some() {
        bail!("--corpus-out: only the multihop suite has a document corpus");
    }
    if !corpus.is_empty() && args.corpus_out.is_none() {
        eprintln!("coa-generate tasks: note: --corpus-out not given; the multihop corpus ({} pages) is not written", corpus.len());
    }

    // The corpus is written before the tasks, so a reader that sees the tasks finds their corpus.
    if let Some(path) = &args.corpus_out {
        let mut w = stage.create(Some(path), None, &CORPUS.schema())?;
        for chunk in corpus.chunks(BATCH_ROWS) {
            w.write(&rows::to_batch(chunk)?)?;
        }
        let n = w.finish()?;
        stage.note("corpus_pages", n);
    }
    let mut w = stage.create(args.io.output.as_deref(), args.io.format, &Task::table().schema())?;
    let bar = stage.progress(Some(tasks.len() as u64), "writing tasks");
    for chunk in tasks.chunks(BATCH_ROWS) {
        w.write(&rows::to_batch(chunk)?)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let n = w.finish()?;
    stage.add_rows_out(n);
    Ok(())
}
