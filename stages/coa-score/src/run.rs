//! The `coa-score` stage: its flags ([`ScoreArgs`]) and [`run`], which reads the tasks and the
//! rollouts, judges them, writes `scores` and the eval report.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use coa_rewards::{OverlongCacheArg, RewardConfig};
use coa_schemas::flags;
use coa_schemas::rows::{self, Rollout, Task};
use coa_schemas::shard::ShardArgs;
use coa_schemas::stage::{self, IoArgs, Stage};
use coa_schemas::suite::{answer_kind, AnswerKind};
use coa_schemas::tables::{ROLLOUTS, SCORES, TASKS};
use coa_tools::CodeTimeout;

use crate::report::{self, Sample};

/// The flags of `coa-score` (the binary adds its name and help).
#[derive(clap::Args)]
pub struct ScoreArgs {
    /// The tasks the rollouts were generated from (gold answers, unit tests).
    #[arg(long, value_name = "FILE")]
    pub tasks: PathBuf,
    /// Lmax of the overlong shaping: responses longer than this many tokens get -1.
    #[arg(long, default_value_t = RewardConfig::default().max_len, value_parser = flags::at_least_one::<usize>)]
    pub max_response_len: usize,
    #[command(flatten)]
    pub overlong: OverlongCacheArg,
    /// Subtracted from the reward of a response that breaks the CoA grammar.
    #[arg(long, default_value_t = RewardConfig::default().format_penalty, value_parser = flags::finite::<f32>)]
    pub format_penalty: f32,
    #[command(flatten)]
    pub code: CodeTimeout,
    /// Grade code tasks even where this machine withholds a protection of the code sandbox
    /// (namespaces, a minimal root, the seccomp filter; a uid per run where there are no namespaces;
    /// the stats list them). Without it the stage
    /// refuses: a program that escapes a weaker sandbox could find its task's answers.
    #[arg(long)]
    pub weaker_sandbox: bool,
    /// The rollouts answer in plain text (`coa-generate policy --plain`): the final answer is the
    /// last \boxed{} (math, short answers) or the last fenced code block (code); no CoA grammar
    /// is checked (format_ok is true).
    #[arg(long)]
    pub plain: bool,
    /// Also write the eval table (per suite and model) here: markdown, or JSON for *.json. It is
    /// printed on stderr either way.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    #[command(flatten)]
    pub shard: ShardArgs,
    #[command(flatten)]
    pub io: IoArgs,
}

/// Scores the rollouts of the input against `--tasks`, writes `scores` and prints (and with
/// `--report` writes) the eval table.
pub fn run(stage: &mut Stage, args: &ScoreArgs) -> Result<()> {
    let [out, stats] = args.io.outputs();
    stage.outputs(&[out, stats, ("--report", args.report.as_deref())])?;
    let config = RewardConfig {
        max_len: args.max_response_len,
        cache_len: args.overlong.cache_len(args.max_response_len, "--max-response-len")?,
        format_penalty: args.format_penalty,
    };
    if let (Some(spec), Some(_)) = (args.shard.shard, &args.report) {
        anyhow::bail!(
            "--shard {spec} with --report: the report summarizes the whole table (pass@k per suite and model); \
             merge the shards' rollouts first (coa-filter --rules none -i 'DIR/*.parquet' --task-order TASKS) and score them unsharded"
        );
    }
    let limits = args.code.limits();

    let mut tasks: HashMap<String, Task> = HashMap::new();
    for batch in stage.open(Some(&args.tasks), &TASKS)? {
        for t in rows::from_batch::<Task>(&batch?).with_context(|| format!("reading {}", args.tasks.display()))? {
            tasks.insert(t.task_id.clone(), t);
        }
    }
    if tasks.values().any(|t| answer_kind(&t.suite) == Some(AnswerKind::Program)) {
        // What the code sandbox enforces on this machine, in the stats; what it cannot, on stderr.
        let iso = coa_tools::isolation();
        stage.note("sandbox", iso.describe());
        let missing = iso.missing();
        stage.note("sandbox_missing", missing.join(", "));
        if !missing.is_empty() {
            if !args.weaker_sandbox {
                anyhow::bail!(
                    "the code sandbox runs without {} on this machine ({}): a program that escapes it could find its task's answers; \
                     pass --weaker-sandbox to grade code here anyway",
                    missing.join(", "),
                    iso.describe()
                );
            }
            eprintln!("coa-score: --weaker-sandbox: the code sandbox runs without {} on this machine ({})", missing.join(", "), iso.describe());
        }
    }
    let reader = stage.open(args.io.input.as_deref(), &ROLLOUTS)?;
    let reader = stage.shard(reader, args.shard.shard)?;
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
    let answers = if args.plain { crate::Answers::Plain } else { crate::Answers::Coa };
    stage.note("answers", if args.plain { "plain" } else { "coa" });
    let bar = stage.progress(Some(all.len() as u64), "judging");
    let verdicts = crate::score(&all, &tasks, &config, &limits, answers, &|| bar.inc(1)).with_context(|| source.clone())?;
    bar.finish_and_clear();

    let mut out = stage.create(args.io.output.as_deref(), args.io.format, &SCORES.schema())?;
    let mut at = 0;
    for b in &batches {
        let n = b.num_rows();
        out.write(&crate::scores_batch(b, &verdicts[at..at + n])?)?;
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
            hops: tasks.get(&r.task_id).and_then(|t| t.hops),
        })
        .collect();
    let lines = report::summarize(&samples);
    eprint!("{}", report::markdown(&lines));
    if let Some(path) = &args.report {
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
