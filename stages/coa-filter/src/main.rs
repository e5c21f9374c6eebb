//! `coa-filter`: keep the rows of a table that pass named rules, with per-rule counts.
//!
//! Reads any table; for trajectories it applies the Chain-of-Agents distillation rules by default.
//! Writes the same table (same schema and metadata, new provenance) with the kept rows.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use coa_schemas::flags;
use coa_filter::{render_stats, Filter, Options, RuleSet};
use coa_schemas::io::TableWriter;
use coa_schemas::shard::{self, ShardArgs, SHARD_COLUMN};
use coa_schemas::stage::{self, IoArgs, Stage};

const AFTER_HELP: &str = "\
Rules (in order; each sees only the rows the previous ones kept):
  dedup                 exact duplicates: same task_id + steps (trajectories) or same values in
                        every column / the --dedup-key columns; the first occurrence is kept
  complexity            hops < --min-hops
  wrong_answer          correct = false
  format                format_ok = false
  repeated_tool_input   two steps with the same (tool, tool_input)
  where[i]              the i-th --where expression is false or null
  dynamic_sampling      --group-by groups whose --value is the same in every row (DAPO)
  reflection            reflections = 0: dropped in --reflection-required-suites, elsewhere kept
                        with probability --no-reflection-keep (deterministic in task_id and --seed)
  error_correction      correct and first double_check score <= 2: the row appears
                        --error-correction-copies times
The distillation rules (all but where/dynamic_sampling) run on a trajectories table (by its
`coa.table` metadata, or by its columns when it has none); `--no-rule quality` disables the three
quality rules. Counts go to stderr as a table and into the summary line (and --stats FILE) as
`rules`: name, rule, rows_in, kept, dropped, duplicated.

Examples:
  coa-filter -i trajectories.parquet -o kept.parquet --stats filter.json
  coa-extract < runs.arrow | coa-filter --min-hops 3 --keep-dropped dropped.parquet | coa-convert > text.arrow
  coa-filter -i trajectories.parquet --where \"hops <= 20 AND suite = 'multihop'\" -o hard.parquet
  coa-filter -i trajectories.parquet --no-rule reflection --no-rule quality -o some.parquet
  coa-filter -i scores.parquet --dynamic-sampling --group-by task_id --value reward -o batch.parquet
  coa-filter -i tasks.parquet --rules none --dedup --dedup-key question --where \"suite = 'math'\"
  coa-filter -i trajectories.parquet --shard 2/4 -o kept-2.parquet           # shard 2 of 4 (0-based), by task_id
  coa-filter --rules none -i 'shards/*.parquet' --task-order tasks.parquet -o merged.parquet   # merge shards

Sharding (--shard I/N): the rows of the tasks whose task_id hashes to I. Every rule is per row or
per task (dedup keys and dynamic-sampling groups that include task_id), so the N outputs together
are the unsharded output; a --dedup-key or --group-by without task_id is refused (run it on the
merged table). --where conditions must then be per row (no aggregates over the table).";

#[derive(Parser)]
#[command(
    name = "coa-filter",
    version,
    about = "Filter any table by named rules with per-rule counts: CoA distillation rules for trajectories, \
             --where SQL conditions, exact dedup, DAPO dynamic sampling",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Built-in rule set: `auto` runs the distillation rules on a trajectories table and none on
    /// other tables; `distill` requires trajectories; `none` runs only --where, --dedup and
    /// --dynamic-sampling.
    #[arg(long, value_enum, default_value = "auto")]
    rules: RuleSet,
    /// Do not run this rule (repeatable): dedup, complexity, wrong_answer, format,
    /// repeated_tool_input, reflection, error_correction, or quality (= the three quality rules).
    #[arg(long = "no-rule", value_name = "NAME")]
    no_rule: Vec<String>,
    /// complexity: trajectories with fewer agent/tool interactions (`hops`) are dropped.
    #[arg(long, default_value_t = 5, value_name = "N", value_parser = flags::whole::<i64>)]
    min_hops: i64,
    /// reflection: fraction of reflection-less trajectories kept (outside the required suites).
    #[arg(long, default_value_t = 0.3, value_name = "FRACTION", value_parser = flags::fraction)]
    no_reflection_keep: f64,
    /// reflection: suites where a trajectory without reflection is always dropped (comma-separated;
    /// empty for none).
    #[arg(long, default_value = "math,code", value_name = "SUITES", value_delimiter = ',')]
    reflection_required_suites: Vec<String>,
    /// error_correction: how many times a trajectory that doubted its answer (first double_check
    /// score <= 2) and ended correct appears in the output.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = flags::at_least_one::<u32>)]
    error_correction_copies: u32,
    /// Seed of the reflection down-sampling: same input + seed = same output.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep only rows where this polars SQL condition holds (repeatable; each is its own rule
    /// `where[i]`), e.g. "hops <= 20 AND suite = 'multihop'". Evaluated on the whole table.
    #[arg(long = "where", value_name = "EXPR")]
    wheres: Vec<String>,
    /// Exact dedup on any table (it is on by default for trajectories).
    #[arg(long)]
    dedup: bool,
    /// Dedup key columns (comma-separated; implies --dedup). Default: task_id,steps for
    /// trajectories, every column otherwise.
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    dedup_key: Vec<String>,
    /// DAPO dynamic sampling: drop every --group-by group whose --value is the same in all its rows.
    #[arg(long)]
    dynamic_sampling: bool,
    /// dynamic sampling: the group column.
    #[arg(long, default_value = "task_id", value_name = "COL", requires = "dynamic_sampling")]
    group_by: String,
    /// dynamic sampling: the value that must vary within a group.
    #[arg(long, default_value = "reward", value_name = "COL", requires = "dynamic_sampling")]
    value: String,
    /// Also write the dropped rows, with a `drop_reason` column naming the rule, to this file.
    #[arg(long, value_name = "FILE")]
    keep_dropped: Option<PathBuf>,
    /// Reorder the input's rows (stably) to the order of the task_id column of FILE (a tasks table,
    /// or any table with task_id) before the rules run: the merge step of a sharded run, which
    /// gives back the unsharded row order (`-i 'shards/*.parquet' --rules none --task-order tasks.parquet`).
    #[arg(long, value_name = "FILE")]
    task_order: Option<PathBuf>,
    #[command(flatten)]
    shard: ShardArgs,
    #[command(flatten)]
    io: IoArgs,
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = flags::parse();
    let mut stage = Stage::new("coa-filter", env!("CARGO_PKG_VERSION"));
    stage.set_stats_path(cli.io.stats.clone());
    stage::run(&mut stage, |s| filter(s, &cli))
}

fn options(cli: &Cli, source: &str) -> Options {
    Options {
        rules: cli.rules,
        disabled: cli.no_rule.clone(),
        min_hops: cli.min_hops,
        no_reflection_keep: cli.no_reflection_keep,
        reflection_required_suites: cli.reflection_required_suites.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        error_correction_copies: cli.error_correction_copies,
        seed: cli.seed,
        wheres: cli.wheres.clone(),
        dedup: cli.dedup,
        dedup_key: cli.dedup_key.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        dynamic_sampling: cli.dynamic_sampling.then(|| (cli.group_by.clone(), cli.value.clone())),
        source: source.to_string(),
    }
}


fn filter(stage: &mut Stage, cli: &Cli) -> Result<()> {
    let [out, stats] = cli.io.outputs();
    stage.outputs(&[out, stats, ("--keep-dropped", cli.keep_dropped.as_deref())])?;
    stage.set_seed(cli.seed);
    if let Some(spec) = cli.shard.shard {
        check_shard_rules(cli, spec)?;
    }
    let task_order = match &cli.task_order {
        Some(path) => Some(read_task_order(stage, path)?),
        None => None,
    };
    let reader = stage.open_any(cli.io.input.as_deref())?;
    let reader = stage.shard(reader, cli.shard.shard)?;
    let schema = reader.schema();
    let source = reader.source().to_string();
    let reader: Box<dyn Iterator<Item = Result<arrow::record_batch::RecordBatch>>> = match (&task_order, &cli.task_order) {
        (Some(order), Some(order_path)) => {
            shard::check_shardable(&schema, &source)?;
            let batches = reader.collect::<Result<Vec<_>>>()?;
            let merged = shard::restore_task_order(&schema, &batches, order, &source, &order_path.display().to_string())?;
            let n = merged.num_rows();
            let step = coa_schemas::io::BATCH_ROWS;
            Box::new((0..n).step_by(step).map(move |at| Ok(merged.slice(at, step.min(n - at)))))
        }
        _ => Box::new(reader),
    };
    // Every flag is checked against the schema before anything is written.
    let mut filter = Filter::new(schema.clone(), &options(cli, &source))?;
    filter.keep_dropped(cli.keep_dropped.is_some());

    let mut out = stage.create(cli.io.output.as_deref(), cli.io.format, &schema)?;
    let mut dropped = match &cli.keep_dropped {
        Some(path) => Some(stage.create(Some(path), None, &filter.dropped_schema())?),
        None => None,
    };

    let bar = stage.progress(None, "filtering");
    let mut rows_in = 0u64;
    // For trajectories, the kept rows' mean hops and reflections go into the summary (make distill's table).
    let mut kept = KeptShape::default();
    let write = |outputs: Vec<coa_filter::BatchOutput>, out: &mut TableWriter, dropped: &mut Option<TableWriter>, kept: &mut KeptShape| -> Result<()> {
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
    };
    if filter.needs_whole_table() {
        let mut batches = Vec::new();
        for b in reader {
            let b = b?;
            rows_in += b.num_rows() as u64;
            bar.inc(b.num_rows() as u64);
            batches.push(b);
        }
        let outputs = filter.process(&batches)?;
        write(outputs, &mut out, &mut dropped, &mut kept)?;
    } else {
        for b in reader {
            let b = b?;
            rows_in += b.num_rows() as u64;
            bar.inc(b.num_rows() as u64);
            let outputs = filter.process(std::slice::from_ref(&b))?;
            write(outputs, &mut out, &mut dropped, &mut kept)?;
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

/// Refuses cross-row rules that a shard cannot apply alone: groups and dedup keys must hold whole
/// tasks (include task_id) for the shards' outputs to add up to the unsharded output.
fn check_shard_rules(cli: &Cli, spec: shard::ShardSpec) -> Result<()> {
    if cli.dynamic_sampling && cli.group_by != SHARD_COLUMN {
        anyhow::bail!(
            "--shard {spec} with --dynamic-sampling --group-by {}: shards split rows by task_id, so a group must be a task \
             (--group-by task_id); otherwise merge the shards and filter unsharded",
            cli.group_by
        );
    }
    let key: Vec<&str> = cli.dedup_key.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
    if !key.is_empty() && !key.contains(&SHARD_COLUMN) {
        anyhow::bail!(
            "--shard {spec} with --dedup-key {}: duplicates could sit in two shards; add task_id to the key, or merge the \
             shards and dedup unsharded",
            key.join(",")
        );
    }
    Ok(())
}

/// The task ids of `path`, in order (for --task-order).
fn read_task_order(stage: &mut Stage, path: &std::path::Path) -> Result<Vec<String>> {
    use arrow::array::Array;
    let reader = stage.open_any(Some(path))?;
    let source = format!("--task-order {}", reader.source());
    shard::check_shardable(&reader.schema(), &source)?;
    let mut ids = Vec::new();
    for batch in reader {
        let batch = batch?;
        let col = arrow::compute::cast(batch.column_by_name(SHARD_COLUMN).expect("checked"), &arrow::datatypes::DataType::Utf8)?;
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
    fn add(&mut self, batch: &arrow::record_batch::RecordBatch) {
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
