//! The body of the `coa-filter` stage: read the input (restoring the task order of sharded
//! outputs first if asked), run the [`Filter`] batch by batch or over the whole table, write the
//! kept rows (and the dropped ones), and report the per-rule counts. [`FilterArgs`] are the
//! stage's flags; the binary parses them and hands over to [`run`].

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use arrow::record_batch::RecordBatch;
use coa_schemas::io::TableWriter;
use coa_schemas::flags;
use coa_schemas::shard::{self, ShardArgs, ShardSpec, SHARD_COLUMN};
use coa_schemas::stage::{IoArgs, Stage};

use crate::engine::{render_stats, BatchOutput, Filter, Options, RuleSet};

/// Decoded bytes a merge of shard parts holds across its parts' current batches (each part's
/// batch gets an equal share, at least one row): the merge's memory bound, whatever the row count
/// (measured: 0.55 GB peak for 25k and for 100k rows of 10 KB in 50 parts, where holding every
/// row took 0.89 and 3.4 GB; docs/cluster.md).
const MERGE_BYTES: i64 = 128 << 20;
/// Rows per output batch of a merge (a few MB of teacher runs).
const MERGE_BATCH_ROWS: usize = 256;

/// The flags of `coa-filter`.
#[derive(clap::Args, Debug, Clone)]
pub struct FilterArgs {
    /// Built-in rule set: `auto` runs the distillation rules on a trajectories table and none on
    /// other tables; `distill` requires trajectories; `none` runs only --where, --dedup and
    /// --dynamic-sampling.
    #[arg(long, value_enum, default_value = "auto")]
    pub rules: RuleSet,
    /// Do not run this rule (repeatable): dedup, complexity, wrong_answer, format,
    /// repeated_tool_input, reflection, error_correction, or quality (= the three quality rules).
    #[arg(long = "no-rule", value_name = "NAME")]
    pub no_rule: Vec<String>,
    /// complexity: trajectories with fewer agent/tool interactions (`hops`) are dropped.
    #[arg(long, default_value_t = 5, value_name = "N", value_parser = flags::whole::<i64>)]
    pub min_hops: i64,
    /// reflection: fraction of reflection-less trajectories kept (outside the required suites).
    #[arg(long, default_value_t = 0.3, value_name = "FRACTION", value_parser = flags::fraction)]
    pub no_reflection_keep: f64,
    /// reflection: suites where a trajectory without reflection is always dropped (comma-separated;
    /// empty for none).
    #[arg(long, default_value = "math,code", value_name = "SUITES", value_delimiter = ',')]
    pub reflection_required_suites: Vec<String>,
    /// error_correction: how many times a trajectory that doubted its answer (first double_check
    /// score <= 2) and ended correct appears in the output.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = flags::at_least_one::<u32>)]
    pub error_correction_copies: u32,
    /// Seed of the reflection down-sampling: same input + seed = same output.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep only rows where this polars SQL condition holds (repeatable; each is its own rule
    /// `where[i]`), e.g. "hops <= 20 AND suite = 'multihop'". Evaluated on the whole table.
    #[arg(long = "where", value_name = "EXPR")]
    pub wheres: Vec<String>,
    /// Exact dedup on any table (it is on by default for trajectories).
    #[arg(long)]
    pub dedup: bool,
    /// Dedup key columns (comma-separated; implies --dedup). Default: task_id,steps for
    /// trajectories, every column otherwise.
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    pub dedup_key: Vec<String>,
    /// DAPO dynamic sampling: drop every --group-by group whose --value is the same in all its rows.
    #[arg(long)]
    pub dynamic_sampling: bool,
    /// dynamic sampling: the group column.
    #[arg(long, default_value = "task_id", value_name = "COL", requires = "dynamic_sampling")]
    pub group_by: String,
    /// dynamic sampling: the value that must vary within a group.
    #[arg(long, default_value = "reward", value_name = "COL", requires = "dynamic_sampling")]
    pub value: String,
    /// Also write the dropped rows, with a `drop_reason` column naming the rule, to this file.
    #[arg(long, value_name = "FILE")]
    pub keep_dropped: Option<PathBuf>,
    /// Reorder the input's rows (stably) to the order of the task_id column of FILE (a tasks table,
    /// or any table with task_id) before the rules run: the merge step of a sharded run, which
    /// gives back the unsharded row order (`-i 'shards/*.parquet' --rules none --task-order tasks.parquet`).
    #[arg(long, value_name = "FILE")]
    pub task_order: Option<PathBuf>,
    #[command(flatten)]
    pub shard: ShardArgs,
    #[command(flatten)]
    pub io: IoArgs,
}

/// The stage's files and sharding (the rules are in [`Options`]).
pub struct Files<'a> {
    pub io: &'a IoArgs,
    pub shard: Option<ShardSpec>,
    /// `--keep-dropped`: where the dropped rows go, with `drop_reason`.
    pub keep_dropped: Option<&'a Path>,
    /// `--task-order`: a table whose task_id order the input is restored to.
    pub task_order: Option<&'a Path>,
}

/// `coa-filter`: the kept rows of the input under the rules of `args`.
pub fn run(stage: &mut Stage, args: &FilterArgs) -> Result<()> {
    let files = Files {
        io: &args.io,
        shard: args.shard.shard,
        keep_dropped: args.keep_dropped.as_deref(),
        task_order: args.task_order.as_deref(),
    };
    filter(stage, options(args), &files)
}

/// The kept rows of the input under `opts` (whose `source` is set here, from the input).
pub fn filter(stage: &mut Stage, mut opts: Options, files: &Files<'_>) -> Result<()> {
    let [out, stats] = files.io.outputs();
    stage.outputs(&[out, stats, ("--keep-dropped", files.keep_dropped)])?;
    stage.set_seed(opts.seed);
    if let Some(spec) = files.shard {
        check_shard_rules(&opts, spec)?;
    }
    let task_order = match files.task_order {
        Some(path) => Some((read_task_order(stage, path)?, path)),
        None => None,
    };
    // Shard parts (a directory or glob) with --task-order stream through a k-way merge.
    let parts = match (&task_order, files.io.input.as_deref(), files.shard) {
        (Some(_), Some(path), None) => coa_schemas::io::table_files(path)?,
        _ => None,
    };
    if let Some(parts) = &parts {
        coa_schemas::io::read_many_files_at_once(MERGE_BYTES / parts.len().max(1) as i64);
    }
    let reader = stage.open_any(files.io.input.as_deref())?;
    let reader = stage.shard(reader, files.shard)?;
    let schema = reader.schema();
    let source = reader.source().to_string();
    let reader: Box<dyn Iterator<Item = Result<RecordBatch>>> = match (&task_order, parts) {
        (Some((order, order_path)), Some(parts)) => {
            shard::check_shardable(&schema, &source)?;
            let mut opened = Vec::with_capacity(parts.len());
            for path in &parts {
                let part = coa_schemas::io::open_any(Some(path))?;
                if part.schema().fields() != schema.fields() {
                    bail!("{}: its columns differ from those of {source}; the parts of a merge must hold one table", path.display());
                }
                let name = part.source().to_string();
                opened.push((Box::new(part) as Box<dyn Iterator<Item = Result<RecordBatch>>>, name));
            }
            Box::new(shard::TaskOrderMerge::new(opened, order, &order_path.display().to_string(), MERGE_BATCH_ROWS)?)
        }
        (Some((order, order_path)), None) => {
            shard::check_shardable(&schema, &source)?;
            let batches = reader.collect::<Result<Vec<_>>>()?;
            let order_source = order_path.display().to_string();
            let merged = shard::restore_task_order(&schema, &batches, order, &source, &order_source)?;
            let n = merged.num_rows();
            let step = coa_schemas::io::BATCH_ROWS;
            Box::new((0..n).step_by(step).map(move |at| Ok(merged.slice(at, step.min(n - at)))))
        }
        (None, _) => Box::new(reader),
    };
    // Every flag is checked against the schema before anything is written.
    opts.source = source;
    let mut filter = Filter::new(schema.clone(), &opts)?;
    filter.keep_dropped(files.keep_dropped.is_some());

    let mut out = stage.create(files.io.output.as_deref(), files.io.format, &schema)?;
    let mut dropped = match files.keep_dropped {
        Some(path) => Some(stage.create(Some(path), None, &filter.dropped_schema())?),
        None => None,
    };

    let bar = stage.progress(None, "filtering");
    let mut rows_in = 0u64;
    // For trajectories, the kept rows' mean hops and reflections go into the summary (make distill's table).
    let mut kept = KeptShape::default();
    if filter.needs_whole_table() {
        let mut batches = Vec::new();
        for b in reader {
            let b = b?;
            rows_in += b.num_rows() as u64;
            bar.inc(b.num_rows() as u64);
            batches.push(b);
        }
        let outputs = filter.process(&batches)?;
        write_outputs(outputs, &mut out, dropped.as_mut(), &mut kept)?;
    } else {
        for b in reader {
            let b = b?;
            rows_in += b.num_rows() as u64;
            bar.inc(b.num_rows() as u64);
            let outputs = filter.process(std::slice::from_ref(&b))?;
            write_outputs(outputs, &mut out, dropped.as_mut(), &mut kept)?;
        }
    }
    bar.finish_and_clear();
    let rows_out = out.finish()?;
    let rows_dropped = match dropped {
        Some(w) => Some(w.finish()?),
        None => None,
    };

    stage.add_rows_in(rows_in);
    stage.add_rows_out(rows_out);
    if let Some(t) = filter.table() {
        stage.note("table", t);
    }
    stage.note("mode", if filter.distill() { "distill" } else { "none" });
    if filter.table() == Some("trajectories") && kept.rows > 0 {
        stage.note("kept_mean_hops", kept.hops as f64 / kept.rows as f64);
        stage.note("kept_mean_reflections", kept.reflections as f64 / kept.rows as f64);
    }
    for n in filter.notes() {
        eprintln!("coa-filter: note: {n}");
    }
    if !filter.notes().is_empty() {
        stage.note("notes", filter.notes().to_vec());
    }
    if let Some(n) = rows_dropped {
        stage.note("rows_dropped_written", n);
    }
    stage.note("rules", serde_json::to_value(filter.stats())?);
    if !filter.stats().is_empty() {
        eprint!("coa-filter: {rows_in} rows in, {rows_out} out\n{}", render_stats(filter.stats()));
    } else {
        eprintln!("coa-filter: {rows_in} rows in, {rows_out} out; no rule ran");
    }
    Ok(())
}

/// Writes the kept rows of a window's batches (noting their shape) and, with --keep-dropped, the
/// dropped ones.
fn write_outputs(
    outputs: Vec<BatchOutput>,
    out: &mut TableWriter,
    mut dropped: Option<&mut TableWriter>,
    kept: &mut KeptShape,
) -> Result<()> {
    for o in outputs {
        if o.kept.num_rows() > 0 {
            kept.add(&o.kept);
            out.write(&o.kept)?;
        }
        if let (Some(w), Some(d)) = (dropped.as_mut(), o.dropped) {
            w.write(&d)?;
        }
    }
    Ok(())
}

/// Refuses cross-row rules that a shard cannot apply alone: groups and dedup keys must hold whole
/// tasks (include task_id) for the shards' outputs to add up to the unsharded output.
fn check_shard_rules(opts: &Options, spec: ShardSpec) -> Result<()> {
    if let Some((group_by, _)) = &opts.dynamic_sampling {
        if group_by != SHARD_COLUMN {
            anyhow::bail!(
                "--shard {spec} with --dynamic-sampling --group-by {group_by}: shards split rows by task_id, so a group must be \
                 a task (--group-by task_id); otherwise merge the shards and filter unsharded"
            );
        }
    }
    let key = &opts.dedup_key;
    if !key.is_empty() && !key.iter().any(|k| k == SHARD_COLUMN) {
        anyhow::bail!(
            "--shard {spec} with --dedup-key {}: duplicates could sit in two shards; add task_id to the key, or merge the \
             shards and dedup unsharded",
            key.join(",")
        );
    }
    Ok(())
}

/// The task ids of `path`, in order (for --task-order).
fn read_task_order(stage: &mut Stage, path: &Path) -> Result<Vec<String>> {
    use arrow::array::Array;
    let reader = stage.open_any(Some(path))?;
    let source = format!("--task-order {}", reader.source());
    shard::check_shardable(&reader.schema(), &source)?;
    let mut ids = Vec::new();
    for batch in reader {
        let batch = batch?;
        let col = arrow::compute::cast(
            batch.column_by_name(SHARD_COLUMN).expect("checked"),
            &arrow::datatypes::DataType::Utf8,
        )?;
        let col = col.as_any().downcast_ref::<arrow::array::StringArray>().expect("cast to Utf8");
        ids.extend(col.iter().map(|id| id.unwrap_or_default().to_string()));
    }
    Ok(ids)
}

/// Sums of `hops` and `reflections` over the kept rows of a trajectories table.
#[derive(Default)]
struct KeptShape {
    rows: u64,
    hops: i64,
    reflections: i64,
}

impl KeptShape {
    fn add(&mut self, batch: &RecordBatch) {
        use arrow::array::{Array, Int32Array};
        let sum = |name: &str| -> Option<i64> {
            let col = batch.column_by_name(name)?.as_any().downcast_ref::<Int32Array>()?;
            Some(col.iter().flatten().map(i64::from).sum())
        };
        if let (Some(h), Some(r)) = (sum("hops"), sum("reflections")) {
            self.rows += batch.num_rows() as u64;
            self.hops += h;
            self.reflections += r;
        }
    }
}

/// The rules as the flags give them (`source` is set by [`run::run`] from the input).
fn options(cli: &FilterArgs) -> Options {
    Options {
        rules: cli.rules,
        disabled: cli.no_rule.clone(),
        min_hops: cli.min_hops,
        no_reflection_keep: cli.no_reflection_keep,
        reflection_required_suites: trimmed(&cli.reflection_required_suites),
        error_correction_copies: cli.error_correction_copies,
        seed: cli.seed,
        wheres: cli.wheres.clone(),
        dedup: cli.dedup,
        dedup_key: trimmed(&cli.dedup_key),
        dynamic_sampling: cli.dynamic_sampling.then(|| (cli.group_by.clone(), cli.value.clone())),
        source: String::new(),
    }
}

/// The non-empty items of a comma-separated list, trimmed.
fn trimmed(items: &[String]) -> Vec<String> {
    items.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: FilterArgs,
    }

    /// The flags' defaults are the library's: a run without flags applies `Options::default()`.
    #[test]
    fn flag_defaults_are_the_option_defaults() {
        let cli: Cli = flags::try_parse_from(["coa-filter"]).unwrap();
        let (from_flags, default) = (options(&cli.args), Options::default());
        assert_eq!(from_flags.reflection_required_suites, default.reflection_required_suites);
        assert_eq!(from_flags.min_hops, default.min_hops);
        assert_eq!(from_flags.no_reflection_keep, default.no_reflection_keep);
        assert_eq!(from_flags.error_correction_copies, default.error_correction_copies);
        assert_eq!(from_flags.rules, default.rules);
    }
}
