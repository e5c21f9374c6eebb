//! `coa-convert`: Chain-of-Agents trajectories → CoA text (`coa_text`), or exports for
//! LLaMA-Factory (alpaca JSON for AFM's fork, sharegpt JSON upstream) and verl (RL Parquet, also
//! straight from a tasks table). The logic lives in `coa_distill::convert` and `coa_distill::verl`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use coa_schemas::flags;
use coa_distill::Target;
use coa_schemas::shard::ShardArgs;
use coa_schemas::stage::{self, IoArgs};

#[derive(Clone, Copy, ValueEnum)]
enum To {
    /// The `coa_text` table (task_id, suite, prompt, text, observation_spans): what coa-tokenize reads.
    CoaText,
    /// AFM's LLaMA-Factory fork (--ignore_observation true): a JSON array of {instruction, input, output}, one
    /// trajectory per record, a blank line around every observation block; dataset_info.json beside it.
    AlpacaJson,
    /// Upstream LLaMA-Factory: a JSON array of {conversations: [human, gpt, observation, gpt, ...]}, tool results as
    /// observation turns (masked by LLaMA-Factory); dataset_info.json beside it.
    Sharegpt,
    /// verl RL Parquet in AFM's layout (data_source, prompt, ability, reward_model, extra_info with tools_kwargs),
    /// from trajectories (kept runs) or from a tasks table (every task).
    Verl,
}

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
    /// What to write.
    #[arg(long, value_enum, default_value = "coa-text")]
    to: To,
    /// Write bad trajectories here (trajectories rows + `reject_reason`) instead of failing.
    #[arg(long, value_name = "FILE")]
    skip_bad: Option<PathBuf>,
    /// The tasks table, for --to verl: code tasks' ground truth is their test spec, read from here,
    /// and each row keeps its task's data source and index (without it: our suites' names).
    #[arg(long, value_name = "FILE")]
    tasks: Option<PathBuf>,
    /// extra_info.split of the verl rows.
    #[arg(long, default_value = "train")]
    split: String,
    #[command(flatten)]
    shard: ShardArgs,
    #[command(flatten)]
    io: IoArgs,
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = flags::parse();
    let target = match cli.to {
        To::CoaText => Target::CoaText,
        To::AlpacaJson => Target::AlpacaJson,
        To::Sharegpt => Target::ShareGpt,
        To::Verl => Target::Verl,
    };
    let args = coa_distill::stages::ConvertArgs {
        target,
        skip_bad: cli.skip_bad.as_deref(),
        tasks: cli.tasks.as_deref(),
        split: &cli.split,
        shard: cli.shard.shard,
    };
    stage::main("coa-convert", env!("CARGO_PKG_VERSION"), cli.io.stats.clone(), |s| {
        let [out, stats] = cli.io.outputs();
        s.outputs(&[out, stats, ("--skip-bad", cli.skip_bad.as_deref())])?;
        coa_distill::stages::run_convert(s, &cli.io, &args)
    })
}
