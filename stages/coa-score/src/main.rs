//! `coa-score`: rollouts → scores (rewards and group advantages), with an optional eval report.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use coa_schemas::flags;
use coa_rewards::RewardConfig;
use coa_schemas::rows::{self, Rollout, Task};
use coa_schemas::shard::ShardArgs;
use coa_schemas::stage::{self, IoArgs, Stage};
use coa_schemas::tables::{ROLLOUTS, SCORES, TASKS};
use coa_score::report::{self, Sample};
use coa_tools::SandboxLimits;

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
    /// The tasks the rollouts were generated from (gold answers, unit tests).
    #[arg(long, value_name = "FILE")]
    tasks: PathBuf,
    /// Lmax of the overlong shaping: responses longer than this many tokens get -1.
    #[arg(long, default_value_t = RewardConfig::default().max_len, value_parser = flags::at_least_one::<usize>)]
    max_response_len: usize,
    /// Lcache: the band before Lmax where the length penalty grows from 0 to -1 (0: none).
    #[arg(long, default_value_t = RewardConfig::default().cache_len, value_parser = flags::whole::<usize>)]
    overlong_cache: usize,
    /// Subtracted from the reward of a response that breaks the CoA grammar.
    #[arg(long, default_value_t = RewardConfig::default().format_penalty, value_parser = flags::finite::<f32>)]
    format_penalty: f32,
    /// Wall-clock limit of one code test run, in seconds (at least 1).
    #[arg(long, default_value_t = 10, value_parser = flags::at_least_one::<u64>)]
    code_timeout: u64,
    /// Also write the eval table (per suite and model) here: markdown, or JSON for *.json. It is
    /// printed on stderr either way.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    #[command(flatten)]
    shard: ShardArgs,
    #[command(flatten)]
    io: IoArgs,
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = flags::parse();
    let mut stage = Stage::new("coa-score", env!("CARGO_PKG_VERSION"));
    stage.set_stats_path(cli.io.stats.clone());
    stage::run(&mut stage, |s| run(s, &cli))
}

fn run(stage: &mut Stage, cli: &Cli) -> Result<()> {
    let [out, stats] = cli.io.outputs();
    stage.outputs(&[out, stats, ("--report", cli.report.as_deref())])?;
    let config = RewardConfig { max_len: cli.max_response_len, cache_len: cli.overlong_cache, format_penalty: cli.format_penalty };
    if config.cache_len > config.max_len {
        anyhow::bail!("--overlong-cache {} is larger than --max-response-len {}", config.cache_len, config.max_len);
    }
    if let (Some(spec), Some(_)) = (cli.shard.shard, &cli.report) {
        anyhow::bail!(
            "--shard {spec} with --report: the report summarizes the whole table (pass@k per suite and model); \
             merge the shards' rollouts first (coa-filter --rules none -i 'DIR/*.parquet' --task-order TASKS) and score them unsharded"
        );
    }
    let limits = SandboxLimits { wall: std::time::Duration::from_secs(cli.code_timeout), cpu_secs: cli.code_timeout.max(1), ..Default::default() };

    let mut tasks: HashMap<String, Task> = HashMap::new();
    for batch in stage.open(Some(&cli.tasks), &TASKS)? {
        for t in rows::from_batch::<Task>(&batch?).with_context(|| format!("reading {}", cli.tasks.display()))? {
            tasks.insert(t.task_id.clone(), t);
        }
    }
    let reader = stage.open(cli.io.input.as_deref(), &ROLLOUTS)?;
    let reader = stage.shard(reader, cli.shard.shard)?;
    let source = reader.source().to_string();
    let batches: Vec<_> = reader.collect::<Result<_>>()?;
    let mut all: Vec<Rollout> = Vec::new();
    for b in &batches {
        all.extend(rows::from_batch::<Rollout>(b).with_context(|| format!("reading {source}"))?);
    }
    for (row, r) in all.iter().enumerate() {
        if r.loss_mask.len() != r.response_ids.len() || r.logprobs.len() != r.response_ids.len() {
            anyhow::bail!(
                "{source}: row {row} (task {}): response_ids has {} tokens but loss_mask {} and logprobs {}",
                r.task_id,
                r.response_ids.len(),
                r.loss_mask.len(),
                r.logprobs.len()
            );
        }
    }
    let bar = stage.progress(Some(all.len() as u64), "judging");
    let verdicts = coa_score::score(&all, &tasks, &config, &limits, &|| bar.inc(1)).with_context(|| source.clone())?;
    bar.finish_and_clear();

    let mut out = stage.create(cli.io.output.as_deref(), cli.io.format, &SCORES.schema())?;
    let mut at = 0;
    for b in &batches {
        let n = b.num_rows();
        out.write(&coa_score::scores_batch(b, &verdicts[at..at + n])?)?;
        at += n;
    }
    let rows_out = out.finish()?;

    let samples: Vec<Sample<'_>> = all
        .iter()
        .zip(&verdicts)
        .map(|(r, v)| Sample {
            suite: &r.suite,
            model: &r.model,
            task_id: &r.task_id,
            correct: v.correct,
            format_ok: v.format_ok,
            tokens: r.prompt_ids.len() + r.response_ids.len(),
            tool_calls: r.tool_calls,
        })
        .collect();
    let lines = report::summarize(&samples);
    eprint!("{}", report::markdown(&lines));
    if let Some(path) = &cli.report {
        let body = if path.extension().is_some_and(|e| e == "json") {
            serde_json::to_string_pretty(&lines)? + "\n"
        } else {
            report::markdown(&lines)
        };
        stage::write_atomically(path, body.as_bytes())?;
    }
    stage.add_rows_in(all.len() as u64);
    stage.add_rows_out(rows_out);
    stage.note("correct", verdicts.iter().filter(|v| v.correct).count() as u64);
    stage.note("format_errors", verdicts.iter().filter(|v| !v.format_ok).count() as u64);
    stage.note("reward_mean", if verdicts.is_empty() { 0.0 } else { verdicts.iter().map(|v| v.reward as f64).sum::<f64>() / verdicts.len() as f64 });
    Ok(())
}
