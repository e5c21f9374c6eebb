//! `coa-convert`: Chain-of-Agents trajectories → CoA text (`coa_text`), or exports for
//! LLaMA-Factory (alpaca JSON for AFM's fork, sharegpt JSON upstream) and verl (RL Parquet, also
//! straight from a tasks table). The logic lives in the `coa_convert` library ([`coa_convert::run`]);
//! this binary parses flags.

use std::process::ExitCode;

use clap::Parser;
use coa_convert::{run, ConvertArgs};
use coa_schemas::flags;
use coa_schemas::stage;

#[derive(Parser)]
#[command(
    name = "coa-convert",
    version,
    about = "Render Chain-of-Agents trajectories as CoA text (coa_text), or export LLaMA-Factory JSON (alpaca, sharegpt) / verl Parquet",
    long_about = "Render Chain-of-Agents trajectories as CoA text (coa_text), or export alpaca JSON / verl Parquet.\n\n\
The prompt is the suite's AFM-style instruction (tags and order rules) followed by the question; the text is the \
trajectory in AFM tags (<think>, <plan>, <web_search>, <crawl_page>, <code>, <observation>, <reflection>, \
<suggested_answer>, <double_check>, <answer>), one block per line. observation_spans are character (Unicode scalar) \
offsets [start, end) of every <observation>...</observation> block in the text, tags included: the tokenizer masks \
them from the loss.\n\n\
--to alpaca-json and --to sharegpt write LLaMA-Factory JSON; with -o FILE they also add FILE's entry (named after it) \
to dataset_info.json in the same folder, keeping the entries already there. --to verl writes AFM's RL layout, which AFM's \
training code takes unchanged: each row's data_source is one AFM's reward manager dispatches on (the task file's own, \
e.g. MATH500 or skywork_livecodebench_v4, else math_dapo, skywork, nq or hotpotqa), extra_info.index is a string; \
given a tasks table instead of trajectories it writes one row per task (tasks the teacher failed included).\n\n\
A trajectory with format_ok = false, or whose steps break the CoA grammar, is an error naming the row and task, and \
nothing is written; with --skip-bad FILE such rows go to FILE (the trajectories row plus a `reject_reason` column).",
    after_help = "Examples:\n  coa-convert -i trajectories.parquet -o coa_text.parquet\n  \
coa-convert -i trajectories.parquet --to alpaca-json -o sft.json\n  \
coa-convert -i trajectories.parquet --to sharegpt -o LLaMA-Factory/data/coa_sft.json\n  \
coa-convert -i trajectories.parquet --to verl --tasks tasks.parquet --split train -o rl.parquet\n  \
coa-convert -i tasks.parquet --to verl --split train -o rl_all_tasks.parquet\n  \
coa-extract -i mas_runs.parquet | coa-filter | coa-convert --skip-bad bad.parquet | coa-tokenize -o tokens.parquet"
)]
struct Cli {
    #[command(flatten)]
    args: ConvertArgs,
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = flags::parse();
    stage::main("coa-convert", env!("CARGO_PKG_VERSION"), cli.args.io.stats.clone(), |s| run(s, &cli.args))
}
