//! `coa-generate policy`: sample a checkpoint G times per task, with real tool calls, into
//! `rollouts` (docs/ARCHITECTURE.md, "RL").
//!
//! **Prompt.** Exactly the training layout (`coa-tokenize`): `[BOS…] prompt "\n"`, the prompt built
//! by `coa_format::build_prompt(suite, question)`, its ids taken from `coa_tokenize::encode_row`
//! (the conditioning prefix of the row `(prompt, "")`), so rollouts condition on the very tokens the
//! model was fine-tuned on.
//!
//! **Loop** (per sample): the prompt is prefilled into a KV-cache slot; tokens are sampled one at
//! a time (every active sample of the batch decodes in one batched forward) until a tool's closing
//! tag token (`</web_search>`, `</wiki_search>`, `</crawl_page>`, `</code>`), `</answer>`, EOS, the
//! budget or the turn limit. At a tool's closing tag only this turn's tokens are decoded: the ids
//! between the last opening tag of that tool and the closing tag are the tool input (for `<code>`,
//! the fenced source via `coa_format::code_source`). The tool runs (`coa_agents::Tools`: the same
//! tools and observation rendering the teacher used), and the environment appends the block the
//! training text has after a tool call: `"\n<observation>…</observation>"` (the step separator and
//! the observation rendered by `coa_format::render`). The block is encoded on its own and appended
//! as tokens (token-in/token-out: the history is never decoded and re-tokenized), with loss mask 0
//! and log-prob 0; its ids equal those of the training text because every CoA tag is one added
//! token, which the tokenizer splits the text at (an HF non-special added token). The separator `"\n"` is a target in the SFT data; here the
//! environment writes it (mask 0), so the policy is never trained on text it did not sample.
//!
//! **Budget and turns.** `--max-response-tokens` counts every response token, observations
//! included; an observation that does not fit is cut at the budget and the sample ends with
//! `budget`. A turn is one stretch of generated tokens; a tool call that ends turn
//! `--max-turns` is not executed and the sample ends with `max_turns`. `--max-observation-tokens`
//! keeps the first N tokens of an observation's body (the tags and separator are not counted).
//!
//! **Log-probs** (`logprobs` column): the log-probability of the sampled token under the
//! distribution it was sampled from before top-p truncation, softmax(logits / T), as verl's
//! trainer recomputes it (logits divided by the rollout temperature); at the default T = 1 this is
//! the model's own distribution. With T = 0 (greedy) the model's distribution at T = 1.
//!
//! **Determinism.** Each sample has its own random stream, keyed by (seed, task_id, sample index);
//! the decoder's results do not depend on the thread count or on which samples share a batch, so
//! the output is the same for any `--threads` and `--batch`.
//!
//! **Plain answers** (`--plain`): a model answering on its own, as a base model is measured beside
//! the students: the prompt is `coa_format::build_plain_prompt` (answer in `\boxed{}`, or a
//! program in a fenced block), one turn until EOS or the budget, no tools; the CoA tag tokens (added
//! to a pretrained vocabulary) are never sampled. `coa-score --plain` grades such rollouts.
//!
//! **Oversampling.** With `--oversample --groups N`, each finished group (in task order) is judged
//! with `coa_score::judge` against its task's gold (reward as coa-score computes it, with
//! Lmax = `--max-response-tokens`, Lcache = `--overlong-cache` (`coa_rewards::OverlongCacheArg`:
//! default Lmax / 8) and the default format penalty); a group is informative when its rewards
//! are not all equal. Tasks are taken in order until N informative groups exist; every group up
//! to and including the N-th informative one is written (dropping the uninformative ones is
//! `coa-filter --dynamic-sampling`'s job).
//!
//! **Oversampling in shards.** With `--shard I/N` too, `--groups G` stays the whole run's count and
//! shard I wants its share of it ([`groups_share`]: G/N, one more for the first G mod N shards),
//! taking its own tasks in order. A group is keyed by its task and a task lives in one shard, so
//! no group straddles shards, and a task's samples are the same in any shard (its random streams
//! are keyed by task, not position). What can differ from the unsharded run is which tasks are
//! drawn: each shard stops at its own share, so the union is not the unsharded run's prefix of
//! the task list, and a shard that runs out of tasks leaves its share short (the others do not
//! make it up).
//!
//! **Layout.** `flags`: the flags and what opens them (checkpoint, decoder); `model`: the policy
//! on the CPU or a GPU, and the checkpoint it loads; `env`: the tools and the token ids the loop
//! watches for; `sampler`: one token from the logits; `batch`: the decode loop. This file is the
//! stage body; every public item is re-exported here.

mod batch;
mod env;
mod flags;
mod model;
mod sampler;

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use coa_agents::Tools;
use coa_rewards::RewardConfig;
use coa_schemas::rows::{self, Rollout, Shown};
use coa_schemas::shard::ShardSpec;
use coa_schemas::stage::Stage;
use coa_schemas::tables::ROLLOUTS;

pub use self::batch::{generate, Batch, GenStats, Job, Mode, OnToken, Sample};
pub use self::env::{Codec, Environment, ToolEnv, OBSERVATION_PREFIX};
pub use self::flags::{CheckpointFlags, DecodeFlags, PolicyArgs};
pub use self::model::{load_checkpoint, Decoder, GpuPolicy, ModelPolicy, Policy, MIN_SHARED, PREFIX_ENTRIES};
pub use self::sampler::{sample_seed, sample_token, Rng, SampleConfig};
use crate::{corpus_for, tool_config};

/// The informative groups shard `shard` of an `--oversample --groups total` run wants: `total / N`,
/// one more for the first `total mod N` shards, so the N shares add up to `total`.
pub fn groups_share(total: usize, shard: Option<ShardSpec>) -> usize {
    match shard {
        None => total,
        Some(s) => {
            let (n, i) = (s.count as usize, s.index as usize);
            total / n + usize::from(i < total % n)
        }
    }
}

/// Samples the checkpoint on every task of the input and writes `rollouts`.
pub fn run(stage: &mut Stage, args: &PolicyArgs) -> Result<()> {
    // The device first: `--device cuda` without a GPU fails before anything is read.
    let device = args.decode.select()?;
    args.threads.install()?;
    stage.set_seed(args.seed);
    if args.overlong.overlong_cache.is_some() && !args.oversample {
        bail!("--overlong-cache shapes the rewards --oversample judges groups with: give --oversample too, or drop it");
    }
    let reward_config = RewardConfig {
        max_len: args.max_response_tokens,
        cache_len: args.overlong.cache_len(args.max_response_tokens, "--max-response-tokens")?,
        ..RewardConfig::default()
    };
    let (model, vocab) = args.model.load()?;
    if args.model.checkpoint.is_file() {
        stage.add_input_file(&args.model.checkpoint);
    }
    if args.model.checkpoint.is_dir() {
        // config.json, the weights (model.safetensors, or the shards its index names), the tokenizer.
        let dir = &args.model.checkpoint;
        let mut files = vec![dir.join("config.json")];
        files.extend(coa_model::io::weight_files(dir)?);
        files.extend(["tokenizer.json", coa_tokenize::CONFIG_FILE].map(|f| dir.join(f)));
        for p in files.iter().filter(|p| p.exists()) {
            stage.add_input_file(p);
        }
    }
    let codec = if args.plain { Codec::plain(&vocab) } else { Codec::new(&vocab)? };
    if args.plain && args.oversample {
        bail!("--plain with --oversample: the groups are judged as CoA answers; drop one of the two");
    }
    let model_name = args.model.name(args.model_name.as_deref());

    let (source, tasks) = crate::read_tasks(stage, args.io.input.as_deref(), args.shard.shard)?;
    let mut seen = HashMap::new();
    for (row, t) in tasks.iter().enumerate() {
        if let Some(first) = seen.insert(t.task_id.as_str(), row) {
            bail!("{source}: task_id {} appears in rows {first} and {row}; a group is keyed by task_id", Shown(&t.task_id));
        }
    }

    let corpus = corpus_for(stage, args.corpus.as_deref(), &tasks)?;
    let tool_config = tool_config(&args.tools);
    let limits = &tool_config.limits;
    let env = ToolEnv { tools: Tools { corpus: corpus.as_ref(), config: &tool_config } };

    let prompts: Vec<Vec<u32>> = tasks
        .iter()
        .map(|t| codec.prompt_ids(&t.suite, &t.question).with_context(|| format!("task {}: encoding the prompt", t.task_id)))
        .collect::<Result<_>>()?;
    let (longest_at, longest) = prompts.iter().map(Vec::len).enumerate().max_by_key(|&(_, n)| n).unwrap_or((0, 0));
    let slots = args.batch.min(tasks.len() * args.n).max(1);
    let max_len = longest + args.max_response_tokens;
    // Positions past the ones the model was configured (and trained) for are refused, as HF and
    // vLLM refuse a generation length over max_position_embeddings.
    let positions = model.config.max_position_embeddings;
    if !prompts.is_empty() && max_len > positions {
        bail!(
            "--max-response-tokens {}: the longest prompt (task {}, {longest} tokens) plus the budget needs {max_len} positions, \
             more than the model's max_position_embeddings {positions} (--checkpoint {}); use --max-response-tokens {} or less",
            args.max_response_tokens,
            tasks[longest_at].task_id,
            args.model.checkpoint.display(),
            positions.saturating_sub(longest)
        );
    }
    let (mut decoder, device_name) = args.decode.open(device, &model, slots, max_len, "coa-generate policy")?;
    let policy = decoder.policy();
    let cfg = SampleConfig {
        temperature: args.temperature,
        top_p: args.top_p,
        max_response_tokens: args.max_response_tokens,
        max_turns: args.max_turns,
        max_observation_tokens: args.max_observation_tokens,
    };
    let g = args.n;
    let want = if args.oversample { args.groups.map(|n| groups_share(n, args.shard.shard)) } else { None };
    // A shard whose share is no group draws no task.
    let drawn = if want == Some(0) { 0 } else { tasks.len() };
    let jobs = tasks[..drawn].iter().enumerate().flat_map(|(ti, t)| {
        let p = &prompts[ti];
        (0..g).map(move |k| Job { key: ti * g + k, prompt_ids: p.clone(), seed: sample_seed(args.seed, &t.task_id, k) })
    });

    let mut writer = stage.create(args.io.output.as_deref(), args.io.format, &ROLLOUTS.schema())?;
    let bar = stage.progress(Some((tasks.len() * g) as u64), "sampling the policy");
    // Finished samples wait here until their whole group and every earlier group are done; groups
    // are then written (and judged, with --oversample) in task order.
    let mut waiting: HashMap<usize, Rollout> = HashMap::new();
    let mut next_task = 0usize;
    let (mut groups_written, mut informative, mut written) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    let mut done = |key: usize, s: Sample| -> Result<bool> {
        let (ti, k) = (key / g, key % g);
        let t = &tasks[ti];
        waiting.insert(
            key,
            Rollout {
                task_id: t.task_id.clone(),
                suite: t.suite.clone(),
                sample_idx: k as i32,
                model: model_name.clone(),
                prompt_ids: s.prompt_ids.iter().map(|&x| x as i32).collect(),
                response_ids: s.response_ids.iter().map(|&x| x as i32).collect(),
                loss_mask: s.loss_mask,
                logprobs: s.logprobs,
                response_text: s.response_text,
                turns: s.turns as i32,
                tool_calls: s.tool_calls as i32,
                finish_reason: s.finish_reason.to_string(),
            },
        );
        bar.inc(1);
        while next_task < tasks.len() && (0..g).all(|k| waiting.contains_key(&(next_task * g + k))) {
            let group: Vec<Rollout> = (0..g).map(|k| waiting.remove(&(next_task * g + k)).expect("checked")).collect();
            let task = &tasks[next_task];
            next_task += 1;
            if want.is_some() {
                let rewards = std::thread::scope(|sc| {
                    let hs: Vec<_> = group.iter().map(|r| sc.spawn(|| coa_score::judge(task, r, &reward_config, limits))).collect();
                    hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("judging panicked")))).collect::<Result<Vec<_>>>()
                })
                .with_context(|| format!("judging the group of task {}", task.task_id))?;
                if rewards.iter().any(|v| v.reward != rewards[0].reward) {
                    informative += 1;
                }
            }
            writer.write(&rows::to_batch(&group)?)?;
            written += group.len() as u64;
            groups_written += 1;
            if want.is_some_and(|n| informative >= n as u64) {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let gen = generate(policy, &env, &codec, &cfg, jobs, &mut done)?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let n = writer.finish()?;
    debug_assert_eq!(n, written);
    stage.add_rows_out(n);
    stage.note("model", model_name.as_str());
    stage.note("answers", if args.plain { "plain" } else { "coa" });
    stage.note("device", device_name);
    stage.note("groups", groups_written);
    if let Some(want) = want {
        stage.note("groups_wanted", want);
        stage.note("informative_groups", informative);
        if informative < want as u64 {
            let wanted = match args.shard.shard {
                Some(spec) => format!("--groups {} (shard {spec}'s share: {want})", args.groups.unwrap_or(want)),
                None => format!("--groups {want}"),
            };
            eprintln!("coa-generate policy: warning: {wanted}: only {informative} informative group(s) among all {} tasks", tasks.len());
        }
    }
    stage.note("tokens_sampled", gen.tokens_sampled);
    stage.note("tokens_fed", gen.tokens_fed);
    stage.note("prompt_tokens_reused", gen.prompt_tokens_reused);
    stage.note("tool_calls", gen.tool_calls);
    stage.note("forwards", gen.forwards);
    stage.note("decode_secs", (gen.decode_secs * 1000.0).round() / 1000.0);
    stage.note("tool_secs", (gen.tool_secs * 1000.0).round() / 1000.0);
    stage.note("sampled_tokens_per_s", if secs > 0.0 { (gen.tokens_sampled as f64 / secs).round() } else { 0.0 });
    Ok(())
}

#[cfg(test)]
mod tests;
