//! `coa-score`: rollouts → scores (rewards and group advantages), with an optional eval report.
//! The logic lives in the `coa_score` library ([`coa_score::run`]); this binary parses flags.

use std::process::ExitCode;

use clap::Parser;
use coa_schemas::flags;
use coa_schemas::stage;
use coa_score::run::{run, ScoreArgs};

#[derive(Parser)]
#[command(
    name = "coa-score",
    version,
    about = "Score policy rollouts: verifiable rewards, CoA format, overlong shaping, group advantages (rollouts -> scores)",
    long_about = "Score policy rollouts (rollouts -> scores).\n\n\
Each rollout's final <answer> is checked against its task in --tasks: SQuAD-normalised exact match and F1 \
(multihop, qa; several answers may be given separated by `|`), \\boxed{} math equivalence (math), the task's unit \
tests in the sandbox (code). The response is checked against the CoA tag grammar. The reward is 1 (correct) or 0 \
(wrong) when the format is valid and -format_penalty when it is not, plus DAPO overlong shaping over the response \
length |y| (all turns, observations included): 0 if |y| <= Lmax - Lcache, ((Lmax - Lcache) - |y|) / Lcache in \
between, -1 beyond Lmax. Advantages are GRPO's (R - mean) / (std + 1e-6) per group (the samples of one task and \
model), with the sample std (n - 1).",
    after_help = "Examples:\n  coa-score -i rollouts.parquet --tasks tasks.parquet -o scores.parquet --report eval.md\n  \
coa-generate policy ... | coa-score --tasks tasks.parquet | coa-filter --rules none --dynamic-sampling --group-by task_id --value reward"
)]
struct Cli {
    #[command(flatten)]
    args: ScoreArgs,
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = flags::parse();
    stage::main("coa-score", env!("CARGO_PKG_VERSION"), cli.args.io.stats.clone(), |s| run(s, &cli.args))
}

