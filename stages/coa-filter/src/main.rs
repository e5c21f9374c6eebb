//! `coa-filter`: keep the rows of a table that pass named rules, with per-rule counts.
//!
//! Reads any table; for trajectories it applies the Chain-of-Agents distillation rules by default.
//! Writes the same table (same schema and metadata, new provenance) with the kept rows. The logic
//! lives in `coa_filter::run` ([`FilterArgs`] and [`run`]); this binary holds the help text.

use std::process::ExitCode;

use clap::Parser;
use coa_filter::run::{run, FilterArgs};
use coa_schemas::flags;
use coa_schemas::stage;

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
    #[command(flatten)]
    args: FilterArgs,
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = flags::parse();
    stage::main("coa-filter", env!("CARGO_PKG_VERSION"), cli.args.io.stats.clone(), |s| run(s, &cli.args))
}
