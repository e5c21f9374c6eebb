//! `coa-extract`: teacher multi-agent runs (`mas_runs`) → linear Chain-of-Agents trajectories
//! (`trajectories`). The logic lives in the `coa_extract` library ([`coa_extract::run`]); this
//! binary parses flags.

use std::process::ExitCode;

use clap::Parser;
use coa_extract::{run, ExtractArgs};
use coa_schemas::flags;
use coa_schemas::stage;

#[derive(Parser)]
#[command(
    name = "coa-extract",
    version,
    about = "Linearize teacher multi-agent runs (mas_runs) into Chain-of-Agents trajectories (trajectories)",
    long_about = "Linearize teacher multi-agent runs (mas_runs) into Chain-of-Agents trajectories (trajectories).\n\n\
Every non-manager event becomes a <think> step (if its output thought) and one action step (plan, web_search, \
crawl_page, code, reflection, suggested_answer, double_check, answer) with the event's agent, the block's content and, \
for tool calls, the tool input and observation. Manager (routing) events are skipped. Each trajectory gets its hop \
count, reflections, double_check scores, final answer, correctness, teacher token cost, and format_ok/format_error from \
the CoA grammar (coa-format; docs/ARCHITECTURE.md).\n\n\
A malformed event (output that does not parse, a role/tag mismatch, an unknown tool, a tag never closed, seq out of \
order) is an error naming the row, task and event seq, and nothing is written; with --skip-bad FILE such runs go to \
FILE (the mas_runs row plus a `reject_reason` column) and the rest is extracted.",
    after_help = "Examples:\n  coa-extract -i mas_runs.parquet -o trajectories.parquet\n  \
coa-generate mas -i tasks.parquet | coa-extract | coa-filter | coa-convert -o coa_text.parquet\n  \
coa-extract -i mas_runs.parquet --skip-bad rejected.parquet -o trajectories.parquet --stats extract.json"
)]
struct Cli {
    #[command(flatten)]
    args: ExtractArgs,
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = flags::parse();
    stage::main("coa-extract", env!("CARGO_PKG_VERSION"), cli.args.io.stats.clone(), |s| run(s, &cli.args))
}
