//! `coa-generate mas`: run the teacher multi-agent system on a `tasks` table and write `mas_runs`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use coa_agents::{Backend, FailureBudget, Noise, OpenAiBackend, OpenAiClient, OpenAiConfig, RunConfig, RunStats, Runner, ScriptedBackend, Tools};
use coa_schemas::shard::ShardArgs;
use coa_schemas::stage::{IoArgs, Stage};
use coa_schemas::tables::MAS_RUNS;
use coa_tools::flags::{seconds, ToolFlags};
use serde_json::json;

use crate::{corpus_for, positive, tool_config};

/// The variable the API key is read from without --api-key-env (OpenAI's clients read it too).
const DEFAULT_API_KEY_ENV: &str = "OPENAI_API_KEY";

/// Tasks run in parallel per written batch: bounds memory (every event keeps the messages its
/// agent read) while keeping every thread busy.
const CHUNK_PER_THREAD: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The offline expert that acts out each synthetic task's solution path (a simulator).
    Scripted,
    /// Any OpenAI-compatible /v1/chat/completions endpoint.
    Openai,
}

fn probability(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a probability (expected 0 to 1)"))
    }
}

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  coa-generate mas -i tasks.parquet --corpus corpus.parquet -o mas_runs.parquet\n  \
coa-generate mas -i tasks.parquet --corpus corpus.parquet --noise-wrong-pick 0.3 --seed 7 --concurrency 4\n  \
OPENAI_API_KEY=... coa-generate mas -i tasks.parquet --corpus corpus.parquet --backend openai \\\n      \
--base-url https://api.openai.com/v1 --model gpt-4o-mini --cache-dir .cache/mas -o mas_runs.parquet")]
pub struct MasArgs {
    /// The offline web (written by `coa-generate tasks --corpus-out`); needed when the tasks
    /// include multihop or qa tasks.
    #[arg(long, value_name = "FILE")]
    corpus: Option<PathBuf>,
    /// The LLM the agents think with.
    #[arg(long, value_enum, default_value = "scripted")]
    backend: BackendKind,
    /// Seed of the scripted expert (per task: seed ^ hash(task_id)). Same seed, same output.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Tasks run in parallel (default: twice the number of CPUs, since runs mostly wait on python
    /// subprocesses or on the endpoint). The output does not depend on it.
    #[arg(long, value_parser = positive, value_name = "N")]
    concurrency: Option<usize>,
    /// Agent activations per task before the run ends without an answer.
    #[arg(long, value_parser = positive, default_value = "40", value_name = "N")]
    max_activations: usize,
    /// Skip (and count) tasks the backend cannot run, such as imported tasks without a solution
    /// path under the scripted expert, instead of failing.
    #[arg(long)]
    skip_unsolvable: bool,
    /// Tasks that may fail (the endpoint gives up after its retries, a tool cannot start): each is
    /// reported on stderr and in the summary (`failed_tasks`) and left out of the output; one more
    /// failure, or every task failing, stops the stage (no task starts after it; those under way
    /// finish).
    #[arg(long, default_value_t = 10, value_name = "N")]
    max_failed: usize,
    #[command(flatten)]
    tools: ToolFlags,

    /// scripted: probability, per hop, of crawling a wrong search hit first (then reflect, re-plan, recover).
    #[arg(long, value_parser = probability, default_value_t = Noise::default().wrong_pick, value_name = "P", help_heading = "Scripted expert")]
    noise_wrong_pick: f64,
    /// scripted: probability, per math/code run, of running the buggy program first (then fix it).
    #[arg(long, value_parser = probability, default_value_t = Noise::default().buggy_code, value_name = "P", help_heading = "Scripted expert")]
    noise_buggy_code: f64,
    /// scripted: probability, per multihop run, of suggesting an intermediate answer (the double check rejects it).
    #[arg(long, value_parser = probability, default_value_t = Noise::default().premature, value_name = "P", help_heading = "Scripted expert")]
    noise_premature: f64,
    /// scripted: probability, per run, of committing an unverified wrong answer (the run ends wrong).
    #[arg(long, value_parser = probability, default_value_t = Noise::default().give_up, value_name = "P", help_heading = "Scripted expert")]
    noise_give_up: f64,
    /// scripted: probability, per multihop run, of a routine (Good/Fair) reflection between hops.
    #[arg(long, value_parser = probability, default_value_t = Noise::default().routine_reflection, value_name = "P", help_heading = "Scripted expert")]
    routine_reflection: f64,

    /// openai: endpoint base URL, e.g. https://api.openai.com/v1 (`/chat/completions` is appended).
    #[arg(long, value_name = "URL", help_heading = "OpenAI-compatible backend")]
    base_url: Option<String>,
    /// openai: model name.
    #[arg(long, value_name = "NAME", help_heading = "OpenAI-compatible backend")]
    model: Option<String>,
    /// openai: environment variable holding the API key (it must be set). Without the flag,
    /// `OPENAI_API_KEY` is used when it is set, as OpenAI's own clients do; otherwise no key is sent.
    #[arg(long, value_name = "NAME", help_heading = "OpenAI-compatible backend")]
    api_key_env: Option<String>,
    /// openai: send no API key, even when `OPENAI_API_KEY` is set (a local endpoint that needs
    /// none should not be handed a real key).
    #[arg(long, conflicts_with = "api_key_env", help_heading = "OpenAI-compatible backend")]
    no_api_key: bool,
    /// openai: response cache directory (keyed by a hash of the request body): a rerun resumes for free.
    #[arg(long, value_name = "DIR", help_heading = "OpenAI-compatible backend")]
    cache_dir: Option<PathBuf>,
    /// openai: requests in flight at once (default: --concurrency).
    #[arg(long, value_parser = positive, value_name = "N", help_heading = "OpenAI-compatible backend")]
    max_inflight: Option<usize>,
    /// openai: per-request timeout.
    #[arg(long, value_parser = seconds, default_value = "120", value_name = "SECS", help_heading = "OpenAI-compatible backend")]
    timeout: f64,
    /// openai: retries after a 429, a 5xx, a timeout, a connection error or a malformed reply.
    #[arg(long, default_value_t = 6, value_name = "N", help_heading = "OpenAI-compatible backend")]
    max_retries: u32,
    /// openai: sampling temperature.
    #[arg(long, default_value_t = 0.0, value_name = "T", help_heading = "OpenAI-compatible backend")]
    temperature: f64,
    /// openai: max_tokens of each reply (default: the endpoint's).
    #[arg(long, value_name = "N", help_heading = "OpenAI-compatible backend")]
    max_tokens: Option<u32>,

    #[command(flatten)]
    pub shard: ShardArgs,
    #[command(flatten)]
    pub io: IoArgs,
}

fn noise(args: &MasArgs) -> Noise {
    Noise {
        wrong_pick: args.noise_wrong_pick,
        buggy_code: args.noise_buggy_code,
        premature: args.noise_premature,
        give_up: args.noise_give_up,
        routine_reflection: args.routine_reflection,
    }
}

fn openai_backend(args: &MasArgs, concurrency: usize) -> Result<OpenAiBackend> {
    let Some(base_url) = args.base_url.as_deref() else { bail!("--backend openai needs --base-url URL (e.g. https://api.openai.com/v1)") };
    let Some(model) = args.model.as_deref() else { bail!("--backend openai needs --model NAME") };
    let mut cfg = OpenAiConfig::new(base_url, model);
    let from_env = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    cfg.api_key = match &args.api_key_env {
        Some(name) => Some(from_env(name).ok_or_else(|| anyhow!("--api-key-env {name}: the environment variable {name} is not set (or empty)"))?),
        None if args.no_api_key => None,
        None => from_env(DEFAULT_API_KEY_ENV),
    };
    cfg.timeout = Duration::from_secs_f64(args.timeout);
    cfg.max_retries = args.max_retries;
    cfg.jitter_seed = args.seed;
    cfg.max_inflight = args.max_inflight.unwrap_or(concurrency);
    cfg.cache_dir = args.cache_dir.clone();
    cfg.temperature = args.temperature;
    cfg.max_tokens = args.max_tokens;
    Ok(OpenAiBackend::new(OpenAiClient::new(cfg)?))
}

fn scripted_args_given(args: &MasArgs) -> Option<&'static str> {
    let d = Noise::default();
    [
        (args.noise_wrong_pick != d.wrong_pick, "--noise-wrong-pick"),
        (args.noise_buggy_code != d.buggy_code, "--noise-buggy-code"),
        (args.noise_premature != d.premature, "--noise-premature"),
        (args.noise_give_up != d.give_up, "--noise-give-up"),
        (args.routine_reflection != d.routine_reflection, "--routine-reflection"),
    ]
    .into_iter()
    .find(|(given, _)| *given)
    .map(|(_, name)| name)
}

/// Runs the teacher on every task of the input and writes `mas_runs`.
pub fn run(stage: &mut Stage, args: &MasArgs) -> Result<()> {
    stage.set_seed(args.seed);
    let concurrency = args.concurrency.unwrap_or_else(|| 2 * std::thread::available_parallelism().map_or(1, |n| n.get()));
    let openai: Option<OpenAiBackend>;
    let scripted;
    let backend: &dyn Backend = match args.backend {
        BackendKind::Scripted => {
            for (flag, given) in [("--base-url", args.base_url.is_some()), ("--model", args.model.is_some()), ("--cache-dir", args.cache_dir.is_some())] {
                if given {
                    bail!("{flag} is an option of --backend openai; the scripted expert needs no endpoint");
                }
            }
            openai = None;
            scripted = ScriptedBackend::new(args.seed, noise(args))?;
            &scripted
        }
        BackendKind::Openai => {
            if let Some(flag) = scripted_args_given(args) {
                bail!("{flag} is an option of the scripted expert (--backend scripted), not of --backend openai");
            }
            openai = Some(openai_backend(args, concurrency)?);
            openai.as_ref().expect("just set")
        }
    };

    // The tasks, whole (a few thousand rows; each run then holds its own messages).
    let (source, tasks) = crate::read_tasks(stage, args.io.input.as_deref(), args.shard.shard)?;

    // Tasks the backend cannot run.
    let mut runnable = Vec::with_capacity(tasks.len());
    let mut skipped = 0u64;
    let mut first_refusal = None;
    for (row, task) in tasks.into_iter().enumerate() {
        match backend.check_task(&task) {
            Ok(()) => runnable.push(task),
            Err(e) => {
                skipped += 1;
                first_refusal.get_or_insert_with(|| format!("row {row}: {e:#}"));
            }
        }
    }
    if let Some(first) = &first_refusal {
        if !args.skip_unsolvable {
            bail!(
                "{source}: {skipped} task(s) cannot be run by the {} backend; the first: {first}. Pass --skip-unsolvable to skip and count them{}",
                backend.label(),
                if args.backend == BackendKind::Scripted { ", or use --backend openai" } else { "" }
            );
        }
        eprintln!("coa-generate mas: skipping {skipped} task(s) the {} backend cannot run (first: {first})", backend.label());
    }

    // The corpus, when web tasks need it.
    let corpus = corpus_for(stage, args.corpus.as_deref(), &runnable)?;

    let tool_config = tool_config(&args.tools);
    let tools = Tools { corpus: corpus.as_ref(), config: &tool_config };
    let run_config = RunConfig { max_activations: args.max_activations, ..RunConfig::default() };
    let runner = Runner::new(concurrency)?;

    let mut writer = stage.create(args.io.output.as_deref(), args.io.format, &MAS_RUNS.schema())?;
    let bar = stage.progress(Some(runnable.len() as u64), "running the teacher");
    let mut stats = RunStats::default();
    let mut failed: Vec<(String, String)> = Vec::new();
    // Failures are counted as tasks end, so the stage stops after the (N+1)th, not a batch later.
    let budget = FailureBudget::new(args.max_failed);
    for chunk in runnable.chunks(CHUNK_PER_THREAD * concurrency) {
        let mut runs = Vec::with_capacity(chunk.len());
        for (task, outcome) in chunk.iter().zip(runner.run_each_within(chunk, backend, tools, &run_config, &budget, &|| bar.inc(1))) {
            match outcome {
                Some(Ok(run)) => runs.push((run, task.hops)),
                Some(Err(e)) => {
                    let why = format!("{e:#}");
                    Stage::log_line(&bar, &format!("coa-generate mas: task {} failed and is left out: {why}", task.task_id));
                    failed.push((task.task_id.clone(), why));
                }
                None => {} // not started: the budget was spent
            }
        }
        if budget.spent() {
            bail!(
                "{} task(s) failed, more than --max-failed {}; the first: task {}: {}",
                failed.len(),
                args.max_failed,
                failed[0].0,
                failed[0].1
            );
        }
        for (r, hops) in &runs {
            stats.add(r, *hops);
        }
        let runs: Vec<_> = runs.into_iter().map(|(r, _)| r).collect();
        writer.write(&coa_agents::event::to_batch(&runs)?)?;
    }
    bar.finish_and_clear();
    if !failed.is_empty() && failed.len() == runnable.len() {
        bail!("every task failed ({}); the first: task {}: {}", failed.len(), failed[0].0, failed[0].1);
    }
    let n = writer.finish()?;
    stage.add_rows_out(n);
    stage.note("backend", backend.label());
    stage.note("simulator", backend.simulator());
    stage.note("skipped_unsolvable", skipped);
    stage.note("failed", failed.len());
    stage.note("failed_tasks", json!(failed.iter().map(|(id, why)| json!({"task_id": id, "error": why})).collect::<Vec<_>>()));
    if let serde_json::Value::Object(fields) = stats.to_json() {
        for (k, v) in fields {
            stage.note(&k, v);
        }
    }
    if let Some(openai) = &openai {
        let s = openai.client().stats();
        stage.note("requests", json!(s.requests));
        stage.note("cache_hits", json!(s.cache_hits));
        stage.note("retries", json!(s.retries));
    }
    Ok(())
}
