//! `coa-filter`: keep the rows of a table that pass named rules, with per-rule counts.
//!
//! Reads any table; for trajectories it applies the Chain-of-Agents distillation rules by default.
//! Writes the same table (same schema and metadata, new provenance) with the kept rows. The logic
//! lives in `coa_filter::run`; this binary parses flags.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use coa_filter::run::{self, Files};
use coa_filter::{Options, RuleSet};
use coa_schemas::flags;
use coa_schemas::shard::ShardArgs;
use coa_schemas::stage::{self, IoArgs};

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
  coa-extract < runs.arrow | coa-filter --min-hops 3 --keep-dropped dropped.parquet | coa-convert > text.arrows
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
    let files = Files {
        io: &cli.io,
        shard: cli.shard.shard,
        keep_dropped: cli.keep_dropped.as_deref(),
        task_order: cli.task_order.as_deref(),
    };
    stage::main("coa-filter", env!("CARGO_PKG_VERSION"), cli.io.stats.clone(), |s| run::run(s, options(&cli), &files))
}

/// The rules as the flags give them (`source` is set by [`run::run`] from the input).
fn options(cli: &Cli) -> Options {
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
