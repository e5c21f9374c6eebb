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
//! Lmax = `--max-response-tokens`, Lcache = `--overlong-cache` (default Lmax / 8) and the default
//! format penalty); a group is
//! informative when its rewards are not all equal. Tasks are taken in order until N informative
//! groups exist; every group up to and including the N-th informative one is written (dropping
//! the uninformative ones is `coa-filter --dynamic-sampling`'s job).
//!
//! **Oversampling in shards.** With `--shard I/N` too, `--groups G` stays the whole run's count and
//! shard I wants its share of it ([`groups_share`]: G/N, one more for the first G mod N shards),
//! taking its own tasks in order. A group is keyed by its task and a task lives in one shard, so
//! no group straddles shards, and a task's samples are the same in any shard (its random streams
//! are keyed by task, not position). What can differ from the unsharded run is which tasks are
//! drawn: each shard stops at its own share, so the union is not the unsharded run's prefix of
//! the task list, and a shard that runs out of tasks leaves its share short (the others do not
//! make it up).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use coa_agents::{Action, Tools};
use coa_format::{build_plain_prompt, build_prompt, code_source, find_last_block, render, Step, Tag};
use coa_kernels::decode::{check_decodable, GpuDecoder};
use coa_kernels::{gpu_for_model, select_device, Device, DeviceChoice, Gpu};
use coa_model::{KvCache, Model};
use coa_rewards::RewardConfig;
use coa_schemas::rows::{self, Rollout, Shown};
use coa_schemas::shard::{ShardArgs, ShardSpec};
use coa_schemas::stage::{IoArgs, Stage};
use coa_schemas::tables::ROLLOUTS;
use coa_tokenize::{encode_row, fit_model, SpecialChoice, TemplateChoice, Vocab};
use coa_tools::crawl::Goal;
use coa_tools::flags::ToolFlags;

use crate::{corpus_for, positive, tool_config};

/// What joins a tool call and its observation block in the rendered CoA text (`coa_format::render`
/// separates blocks with one newline; a test holds the two together).
pub const OBSERVATION_PREFIX: &str = "\n";

fn temperature(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}`: expected a temperature >= 0 (0 = greedy)")),
    }
}

fn top_p(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}`: expected a probability in (0, 1]")),
    }
}

/// `--kv-cache`: f32 or bf16.
fn kv_format(s: &str) -> Result<coa_model::DecodeDtype, String> {
    match s.parse::<coa_model::DecodeDtype>() {
        Ok(d @ (coa_model::DecodeDtype::F32 | coa_model::DecodeDtype::Bf16)) => Ok(d),
        Ok(d) => Err(format!("`{d}`: the KV cache holds f32 or bf16")),
        Err(_) => Err(format!("`{s}`: expected f32 or bf16")),
    }
}

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  coa-generate policy --checkpoint ckpt -i tasks.parquet --corpus corpus.parquet --n 8 -o rollouts.parquet\n  \
coa-generate policy --checkpoint ckpt -i tasks.parquet --corpus corpus.parquet --n 8 --oversample --groups 32 | coa-score --tasks tasks.parquet")]
pub struct PolicyArgs {
    #[command(flatten)]
    pub model: CheckpointFlags,
    /// The offline web (written by `coa-generate tasks --corpus-out`); needed when the tasks
    /// include multihop or other web tasks.
    #[arg(long, value_name = "FILE")]
    corpus: Option<PathBuf>,
    /// Samples per task (the group size G).
    #[arg(long, value_parser = positive, default_value = "8", value_name = "G")]
    n: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, value_parser = temperature, default_value = "1.0", value_name = "T")]
    temperature: f32,
    /// Nucleus sampling: sample among the most likely tokens whose probabilities sum to P.
    #[arg(long, value_parser = top_p, default_value = "1.0", value_name = "P")]
    top_p: f32,
    /// Seed: the same seed gives byte-identical output (whatever --threads and --batch).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Response budget in tokens, counting every turn, observations included.
    #[arg(long, value_parser = positive, default_value = "1024", value_name = "N")]
    max_response_tokens: usize,
    /// Generation turns per sample (a turn ends at a tool call).
    #[arg(long, value_parser = positive, default_value = "16", value_name = "N")]
    max_turns: usize,
    /// Keep only the first N tokens of each observation's body (tags not counted).
    #[arg(long, value_parser = positive, value_name = "N")]
    max_observation_tokens: Option<usize>,
    /// Sequences decoded together (KV-cache slots).
    #[arg(long, value_parser = positive, default_value = "16", value_name = "N")]
    batch: usize,
    #[command(flatten)]
    pub decode: DecodeFlags,
    /// Keep taking tasks until --groups informative groups (rewards not all equal) exist.
    #[arg(long, requires = "groups")]
    oversample: bool,
    /// Plain answers: the model answers on its own, without CoA tags or tools (a base model
    /// measured beside the students): math and short answers in \boxed{}, code in a fenced
    /// block, one turn. Grade the rollouts with `coa-score --plain`.
    #[arg(long, conflicts_with = "oversample")]
    plain: bool,
    /// With --oversample: informative groups wanted (with --shard I/N: over all N shards; this
    /// shard wants G/N, one more for the first G mod N shards).
    #[arg(long, value_parser = positive, value_name = "N", requires = "oversample")]
    groups: Option<usize>,
    /// With --oversample: Lcache of the overlong shaping the groups are judged with (default:
    /// an eighth of --max-response-tokens, as coa-score's 512 of 4096); Lmax is
    /// --max-response-tokens. Match coa-score's --max-response-len / --overlong-cache.
    #[arg(long, value_name = "N", requires = "oversample")]
    overlong_cache: Option<usize>,
    /// The `model` column (default: the checkpoint directory's name).
    #[arg(long, value_name = "NAME")]
    model_name: Option<String>,
    #[command(flatten)]
    tools: ToolFlags,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = positive, value_name = "N")]
    threads: Option<usize>,
    #[command(flatten)]
    pub shard: ShardArgs,
    #[command(flatten)]
    pub io: IoArgs,
}

/// The checkpoint and how its vocabulary lays out a sequence (`coa-generate policy`, `coa-serve`).
#[derive(clap::Args, Debug, Clone)]
pub struct CheckpointFlags {
    /// Checkpoint: an HF directory (config.json + model.safetensors + tokenizer.json, as
    /// coa-train-step saves it) or a GGUF file (e.g. a pretrained model, the CoA tags then added).
    #[arg(long, value_name = "DIR|GGUF")]
    pub checkpoint: PathBuf,
    /// Token(s) before the prompt, as given to coa-tokenize: auto, none or a token.
    #[arg(long, value_name = "auto|none|TOKEN", default_value = "auto")]
    pub bos: SpecialChoice,
    /// The EOS token, as given to coa-tokenize: auto, none or a token.
    #[arg(long, value_name = "auto|none|TOKEN", default_value = "auto")]
    pub eos: SpecialChoice,
    /// The chat template, as given to coa-tokenize: auto (the checkpoint's: the layout it was
    /// trained with), none or a FILE.
    #[arg(long, value_name = "auto|none|FILE", default_value = "auto")]
    pub chat_template: TemplateChoice,
}

impl CheckpointFlags {
    /// The model's name: `given`, else the checkpoint directory's (or file's) name.
    pub fn name(&self, given: Option<&str>) -> String {
        match given {
            Some(n) => n.to_string(),
            None => std::fs::canonicalize(&self.checkpoint)
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| self.checkpoint.display().to_string()),
        }
    }

    /// The checkpoint's model and vocabulary ([`load_checkpoint`]).
    pub fn load(&self) -> Result<(Model, Vocab)> {
        load_checkpoint(&self.checkpoint, &self.bos, &self.eos, &self.chat_template)
    }
}

/// Where and how sequences are decoded (`coa-generate policy`, `coa-serve`).
#[derive(clap::Args, Debug, Clone)]
pub struct DecodeFlags {
    /// Prefill every prompt whole on the CPU, instead of copying the keys and values of the prefix
    /// it shares with a recent prompt (the same bits either way; the copy saves about two thirds
    /// of a prompt's prefill, and all but two tokens of it for a task's later samples).
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Where to decode: `cpu` (f32, deterministic for any --batch and thread count); `cuda` or
    /// `cuda:N` (bf16 weights and KV cache with fp32 accumulation: an error when no GPU is
    /// usable); `auto` (the GPU when one is usable, else the CPU with a note on stderr). Sampling
    /// and tools run on the CPU either way. `emu`: the GPU decoder on the CPU's emulated CUDA
    /// device (a correctness check of the GPU code, not a fast device).
    #[arg(long, value_name = "auto|cpu|cuda[:N]|emu", default_value = "cpu")]
    pub device: DeviceChoice,
    /// The format the CPU decoder holds the weights in: `f32` (as trained; the trainer's
    /// log-probs bit for bit), `bf16`, or `int8` (symmetric, one scale per 32 inputs of an
    /// output). A decode step reads every weight once, so on AVX-512 CPUs bf16 and int8 read a
    /// half and about a quarter of the bytes and decode faster (with AVX2 alone the rounded
    /// values are kept as f32: the rounding without the speed); the logits move by the rounding
    /// (RL then sees a non-zero sampling-vs-trainer log-prob mismatch). `bf16-matmul`: bf16
    /// weights and each product's activations rounded to bf16 too (f32 sums; the arithmetic of
    /// bf16 inference in llama.cpp and PyTorch), which runs on AMX tiles on CPUs that have them
    /// (Intel Xeon since Sapphire Rapids) and makes prompts several times faster there.
    #[arg(long, value_name = "f32|bf16|int8|bf16-matmul", default_value = "f32")]
    pub decode_weights: coa_model::DecodeDtype,
    /// The format the CPU decoder's KV cache holds keys and values in: `f32`, or `bf16` (half
    /// the bytes each step's attention reads, which grow with the context; each key and value
    /// rounded once when stored).
    #[arg(long, value_name = "f32|bf16", default_value = "f32", value_parser = kv_format)]
    pub kv_cache: coa_model::DecodeDtype,
}

/// A decoder opened by [`DecodeFlags::open`]: the model on the CPU or on a CUDA device.
pub enum Decoder<'a> {
    Cpu(ModelPolicy<'a>),
    Gpu(GpuPolicy),
}

impl Decoder<'_> {
    pub fn policy(&mut self) -> &mut dyn Policy {
        match self {
            Decoder::Cpu(p) => p,
            Decoder::Gpu(p) => p,
        }
    }
}

impl DecodeFlags {
    /// The device of `--device` (first, so that `--device cuda` without a GPU fails before
    /// anything is read).
    pub fn select(&self) -> Result<Device> {
        select_device(self.device).map_err(|e| anyhow!("{e}"))
    }

    /// Opens `model` for decoding on `device` (from [`DecodeFlags::select`]): `slots` sequences
    /// of up to `max_len` tokens. Returns the decoder and the device's name; `who` prefixes the
    /// note printed when a GPU is used.
    pub fn open<'a>(&self, device: Device, model: &'a Model, slots: usize, max_len: usize, who: &str) -> Result<(Decoder<'a>, String)> {
        let supported = check_decodable(&model.config);
        match gpu_for_model(device, self.device, supported, "decodes this model").map_err(|e| anyhow!("{e}"))? {
            Some(info) => {
                if self.decode_weights != coa_model::DecodeDtype::F32 || self.kv_cache != coa_model::DecodeDtype::F32 {
                    bail!(
                        "--decode-weights {} --kv-cache {}: the CPU decoder's options; the GPU decoder (--device {}) holds bf16 weights and KV cache",
                        self.decode_weights,
                        self.kv_cache,
                        self.device
                    );
                }
                let at = |e: coa_kernels::Error| anyhow!("--device {}: {e}", self.device);
                let gpu = Gpu::open(&info).map_err(at)?;
                gpu.warm_up().map_err(at)?;
                let decoder = GpuDecoder::new(std::sync::Arc::new(gpu), &model.config, &model.params, slots, max_len, GPU_PASS_ROWS).map_err(at)?;
                eprintln!(
                    "{who}: decoding on {info}: {slots} sequences of up to {max_len} tokens, {:.2} GiB of weights, cache and buffers",
                    decoder.device_bytes() as f64 / (1u64 << 30) as f64
                );
                Ok((Decoder::Gpu(GpuPolicy { decoder }), info.to_string()))
            }
            None => {
                model.prepare_decoding_as(self.decode_weights).context("--decode-weights")?;
                let mut cpu = ModelPolicy::with_cache(model, slots, max_len, self.kv_cache)?;
                if self.no_prefix_reuse {
                    cpu = cpu.without_prefix_reuse();
                }
                let exact = self.decode_weights == coa_model::DecodeDtype::F32 && self.kv_cache == coa_model::DecodeDtype::F32;
                let name = if exact { "cpu".to_string() } else { format!("cpu ({} weights, {} KV cache)", self.decode_weights, self.kv_cache) };
                Ok((Decoder::Cpu(cpu), name))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the policy and the environment

/// A language model that appends tokens to sequences held in slots and returns next-token logits.
pub trait Policy {
    fn vocab_size(&self) -> usize;
    fn n_slots(&self) -> usize;
    /// Empties a slot for a new sequence.
    fn reset(&mut self, slot: usize);
    /// Empties a slot for a new sequence that begins with `prompt`, and returns how many of the
    /// prompt's first tokens the slot already holds (a cached prefix the caller does not feed), or
    /// `None`: start it after the next forward, when a prompt being prefilled now, which shares
    /// more with it, can be reused.
    fn start(&mut self, slot: usize, prompt: &[u32]) -> Result<Option<usize>> {
        let _ = prompt;
        self.reset(slot);
        Ok(Some(0))
    }
    /// Appends `ids` to each slot of `items` (distinct slots) and returns the logits
    /// `[items, vocab]` of the last new position of each.
    fn extend(&mut self, items: &[(usize, &[u32])]) -> Result<Vec<f32>>;
}

/// The real model on CPU with a KV cache.
///
/// **Prompt prefixes are computed once.** Prompts share long prefixes: the suite's instructions
/// (about two thirds of a prompt), and the whole prompt for the G samples of one task. After a
/// prompt is prefilled, its keys and values are copied into one of [`PREFIX_ENTRIES`] spare cache
/// slots (the one already holding a prompt that shares at least [`MIN_SHARED`] tokens with it, else
/// the least recently used); a new sequence starts from a copy of the longest prefix it shares
/// with a kept prompt and feeds only the rest. A sequence that shares more with a prompt being
/// prefilled in this very forward waits one forward for it (the first of a wave of same-suite
/// prompts, a task's first sample, goes alone). The rest is at least two tokens, so it runs the
/// multi-token attention path a whole prompt runs, and the result is the same bits as prefilling
/// the whole prompt (keys and values of a position depend only on the tokens up to it; test
/// `a_shared_prefix_prefills_to_the_same_bits`).
pub struct ModelPolicy<'a> {
    pub model: &'a Model,
    /// `slots` sequence slots, then the `PREFIX_ENTRIES` slots that keep prompts.
    pub cache: KvCache,
    slots: usize,
    reuse_prefixes: bool,
    /// Per spare slot: the prompt it holds and when it was last used or stored.
    kept: Vec<(Vec<u32>, u64)>,
    /// Per sequence slot: its prompt, from `start` until the forward that prefills it.
    prefilling: Vec<Option<Vec<u32>>>,
    clock: u64,
}

/// Tokens `a` and `b` start with in common.
fn shared_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Spare cache slots that keep recent prompts for reuse (one per suite of a mixed run, and then some).
pub const PREFIX_ENTRIES: usize = 4;
/// Shortest shared prefix worth copying, and the least a kept prompt must share with a new one to
/// be replaced by it.
pub const MIN_SHARED: usize = 16;

impl<'a> ModelPolicy<'a> {
    pub fn new(model: &'a Model, slots: usize, max_len: usize) -> Result<Self> {
        ModelPolicy::with_cache(model, slots, max_len, coa_model::DecodeDtype::F32)
    }

    /// [`ModelPolicy::new`] with the KV cache stored as `kv` (f32 or bf16).
    pub fn with_cache(model: &'a Model, slots: usize, max_len: usize, kv: coa_model::DecodeDtype) -> Result<Self> {
        model.prepare_decoding();
        Ok(ModelPolicy {
            model,
            cache: KvCache::new_as(&model.config, slots + PREFIX_ENTRIES, max_len, kv)?,
            slots,
            reuse_prefixes: true,
            kept: vec![(Vec::new(), 0); PREFIX_ENTRIES],
            prefilling: vec![None; slots],
            clock: 0,
        })
    }

    /// Prefills every prompt whole (`--no-prefix-reuse`).
    pub fn without_prefix_reuse(mut self) -> Self {
        self.reuse_prefixes = false;
        self
    }

    /// The kept prompt sharing the longest prefix with `prompt`: (spare index, shared tokens).
    fn best_kept(&self, prompt: &[u32]) -> (usize, usize) {
        let shared = self.kept.iter().map(|(k, _)| shared_prefix(k, prompt));
        shared.enumerate().max_by_key(|&(e, n)| (n, std::cmp::Reverse(e))).unwrap_or((0, 0))
    }

    /// Marks kept prompt `e` as just used.
    fn touch(&mut self, e: usize) {
        self.clock += 1;
        self.kept[e].1 = self.clock;
    }

    /// Keeps the prompt that `slot` has just prefilled.
    fn keep(&mut self, slot: usize, prompt: Vec<u32>) -> Result<()> {
        let e = match self.best_kept(&prompt) {
            (e, n) if n >= MIN_SHARED => e,
            _ => (0..PREFIX_ENTRIES).min_by_key(|&e| self.kept[e].1).unwrap_or(0),
        };
        if self.kept[e].0 != prompt {
            self.cache.copy_prefix(slot, self.slots + e, prompt.len())?;
            self.kept[e].0 = prompt;
        }
        self.touch(e);
        Ok(())
    }
}

/// The model on a GPU with a bf16 KV cache (`--device cuda`).
pub struct GpuPolicy {
    pub decoder: GpuDecoder,
}

impl Policy for GpuPolicy {
    fn vocab_size(&self) -> usize {
        self.decoder.config.vocab_size
    }
    fn n_slots(&self) -> usize {
        self.decoder.n_slots()
    }
    fn reset(&mut self, slot: usize) {
        self.decoder.reset(slot);
    }
    fn extend(&mut self, items: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        self.decoder.extend(items).map_err(|e| anyhow!("GPU decoding: {e}"))
    }
}

/// New tokens one GPU pass holds (longer appends run in several passes): activations of a few
/// hundred MB even for 7B-sized layers.
const GPU_PASS_ROWS: usize = 2048;

impl Policy for ModelPolicy<'_> {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }
    fn n_slots(&self) -> usize {
        self.slots
    }
    fn reset(&mut self, slot: usize) {
        self.cache.reset(slot);
        self.prefilling[slot] = None;
    }
    fn start(&mut self, slot: usize, prompt: &[u32]) -> Result<Option<usize>> {
        self.reset(slot);
        if !self.reuse_prefixes {
            return Ok(Some(0));
        }
        // At least two tokens are fed: the multi-token path, the one a whole prompt takes.
        let most = prompt.len().saturating_sub(2);
        let (e, from_kept) = match self.best_kept(prompt) {
            (e, n) if n.min(most) >= MIN_SHARED => (e, n.min(most)),
            _ => (0, 0),
        };
        let in_flight = self.prefilling.iter().flatten().map(|p| shared_prefix(p, prompt)).max().unwrap_or(0).min(most);
        if in_flight >= from_kept + MIN_SHARED {
            return Ok(None);
        }
        self.prefilling[slot] = Some(prompt.to_vec());
        if from_kept > 0 {
            self.cache.copy_prefix(self.slots + e, slot, from_kept)?;
            self.touch(e);
        }
        Ok(Some(from_kept))
    }
    fn extend(&mut self, items: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        if let Some(&(slot, _)) = items.iter().find(|&&(slot, _)| slot >= self.slots) {
            bail!("slot {slot} is out of range (the policy has {} slots)", self.slots);
        }
        let logits = self.model.extend(&mut self.cache, items)?;
        for &(slot, _) in items {
            if let Some(prompt) = self.prefilling[slot].take() {
                if self.cache.len(slot) == prompt.len() {
                    self.keep(slot, prompt)?;
                }
            }
        }
        Ok(logits)
    }
}

/// Runs a tool call and returns its observation text (the body of `<observation>`). `goal` is
/// what a crawl summarizes its pages for (the response's last think and web search; empty for
/// other tools).
pub trait Environment: Sync {
    fn observe(&self, tool: Tag, input: &str, goal: &Goal) -> Result<String>;
}

/// The teacher's tools (`coa_agents::Tools`).
pub struct ToolEnv<'a> {
    pub tools: Tools<'a>,
}

impl Environment for ToolEnv<'_> {
    fn observe(&self, tool: Tag, input: &str, goal: &Goal) -> Result<String> {
        let action = match tool {
            Tag::WebSearch | Tag::WikiSearch => Action::WebSearch,
            Tag::CrawlPage => Action::CrawlPage,
            Tag::Code => Action::Code,
            other => bail!("{} is not a tool", other.open()),
        };
        if action != Action::Code && self.tools.corpus.is_none() {
            // A web tool called on a task without a corpus (a math or code task): the model
            // learns from the answer, the run goes on.
            return Ok(format!("[ERROR] {} is not available for this task.", tool.name()));
        }
        Ok(self.tools.run(action, input, goal)?.observation)
    }
}

// ---------------------------------------------------------------------------------------------
// tokens

/// The ids the loop watches for, and the vocabulary to encode observations and decode turns.
pub struct Codec<'a> {
    pub vocab: &'a Vocab,
    eos: Option<u32>,
    /// `</answer>`; none for plain answers.
    answer_close: Option<u32>,
    /// (opening id, closing id, tag) of every tool; none for plain answers.
    tools: Vec<(u32, u32, Tag)>,
    obs_head: Vec<u32>,
    obs_tail: Vec<u32>,
    /// Plain answers: the plain prompt, and these ids (the CoA tags) are never sampled.
    plain: bool,
    never_sampled: Vec<u32>,
}

impl<'a> Codec<'a> {
    pub fn new(vocab: &'a Vocab) -> Result<Self> {
        let id = |s: &str| -> Result<u32> {
            vocab.tokenizer.token_to_id(s).ok_or_else(|| anyhow!("{}: the CoA tag {s} is not in the vocabulary", vocab.source))
        };
        let tools = [Tag::WebSearch, Tag::WikiSearch, Tag::CrawlPage, Tag::Code]
            .into_iter()
            .map(|t| Ok((id(t.open())?, id(t.close())?, t)))
            .collect::<Result<Vec<_>>>()?;
        let mut obs_head = Vec::new();
        vocab.encode_into(&format!("{OBSERVATION_PREFIX}{}", Tag::Observation.open()), &mut obs_head)?;
        let mut obs_tail = Vec::new();
        vocab.encode_into(Tag::Observation.close(), &mut obs_tail)?;
        let answer_close = Some(id(Tag::Answer.close())?);
        Ok(Codec { vocab, eos: vocab.eos, answer_close, tools, obs_head, obs_tail, plain: false, never_sampled: Vec::new() })
    }

    /// Plain answers (`--plain`): no tools, no `</answer>`; the sample ends at EOS or the budget.
    /// The CoA tags the vocabulary holds are never sampled: a pretrained model's vocabulary is
    /// grown by them, with rows it was never trained on.
    pub fn plain(vocab: &'a Vocab) -> Codec<'a> {
        let tok = &vocab.tokenizer;
        let mut never_sampled: Vec<u32> = Tag::ALL.iter().flat_map(|t| [t.open(), t.close()]).filter_map(|s| tok.token_to_id(s)).collect();
        never_sampled.sort_unstable();
        never_sampled.dedup();
        Codec { vocab, eos: vocab.eos, answer_close: None, tools: Vec::new(), obs_head: Vec::new(), obs_tail: Vec::new(), plain: true, never_sampled }
    }

    /// The prompt ids of a task: the conditioning prefix of the training layout.
    pub fn prompt_ids(&self, suite: &str, question: &str) -> Result<Vec<u32>> {
        let prompt = if self.plain { build_plain_prompt(suite, question) } else { build_prompt(suite, question) };
        let enc = encode_row(self.vocab, &prompt, "", &[], &[]).map_err(|e| anyhow!("{e}"))?;
        Ok(enc.ids[..enc.prompt_len as usize].to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.vocab.tokenizer.decode(ids, false).map_err(|e| anyhow!("decoding tokens: {e}"))
    }

    /// The ids of the observation block for `body` (prefix, tags, body cut to `max_body` tokens).
    fn observation_ids(&self, body: &str, max_body: Option<usize>) -> Result<Vec<u32>> {
        // Text a tool returns may hold `</observation>`, which would end the block early and
        // could not be rendered; it is removed.
        let body = body.replace(Tag::Observation.close(), "");
        // The block as training renders it (a check: an error here is a bug, not bad input).
        let block = render(&[Step::new(Tag::Observation, &body)]).map_err(|e| anyhow!("rendering an observation: {e}"))?;
        debug_assert!(block.text.starts_with(Tag::Observation.open()));
        let mut body_ids = Vec::new();
        self.vocab.encode_into(&body, &mut body_ids)?;
        if let Some(n) = max_body {
            body_ids.truncate(n);
        }
        let mut ids = self.obs_head.clone();
        ids.extend(body_ids);
        ids.extend_from_slice(&self.obs_tail);
        Ok(ids)
    }
}

// ---------------------------------------------------------------------------------------------
// sampling

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

/// The sampler's generator (per-sample streams from [`sample_seed`]).
pub use coa_schemas::rng::SplitMix64 as Rng;
use coa_schemas::rng::fnv1a;

/// The random stream of one sample.
pub fn sample_seed(seed: u64, task_id: &str, sample_idx: usize) -> u64 {
    let mut r = Rng::new(seed ^ fnv1a(task_id).rotate_left(21) ^ (sample_idx as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    r.next_u64()
}

/// Samples one token from `logits` and returns it with its log-prob under softmax(logits / T)
/// (T = 0: greedy, log-prob at T = 1). Top-p keeps the most likely tokens (ties by id) whose
/// probabilities reach `top_p`.
pub fn sample_token(logits: &[f32], temperature: f32, top_p: f32, rng: &mut Rng) -> Result<(u32, f32)> {
    // -inf marks a token that is never sampled (weight 0); NaN and +inf are a broken model.
    if let Some(i) = logits.iter().position(|x| x.is_nan() || *x == f32::INFINITY) {
        bail!("the model produced a non-finite logit ({}) for token {i}", logits[i]);
    }
    let t = if temperature > 0.0 { temperature as f64 } else { 1.0 };
    let mx = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    if mx == f64::NEG_INFINITY {
        bail!("every token of the vocabulary is excluded from sampling");
    }
    let w: Vec<f64> = logits.iter().map(|&z| ((z as f64 - mx) / t).exp()).collect();
    let sum: f64 = w.iter().sum();
    let logp = |i: usize| ((logits[i] as f64 - mx) / t - sum.ln()) as f32;
    if temperature == 0.0 {
        let best = logits.iter().enumerate().fold(0, |b, (i, &z)| if z > logits[b] { i } else { b });
        return Ok((best as u32, logp(best)));
    }
    let pick = |order: &mut dyn Iterator<Item = usize>, total: f64, rng: &mut Rng| -> Option<usize> {
        let u = rng.unit() * total;
        let mut acc = 0.0;
        let mut last = None;
        for i in order {
            acc += w[i];
            last = Some(i);
            if acc > u {
                return Some(i);
            }
        }
        last
    };
    let tok = if top_p >= 1.0 {
        pick(&mut (0..w.len()), sum, rng)
    } else {
        let mut idx: Vec<usize> = (0..w.len()).collect();
        idx.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(a.cmp(&b)));
        let target = top_p as f64 * sum;
        let mut acc = 0.0;
        let mut keep = 0;
        for &i in &idx {
            acc += w[i];
            keep += 1;
            if acc >= target {
                break;
            }
        }
        pick(&mut idx[..keep].iter().copied(), acc, rng)
    };
    let tok = tok.ok_or_else(|| anyhow!("empty vocabulary"))?;
    Ok((tok as u32, logp(tok)))
}

// ---------------------------------------------------------------------------------------------
// the loop

/// Sampling settings.
#[derive(Debug, Clone)]
pub struct SampleConfig {
    pub temperature: f32,
    pub top_p: f32,
    pub max_response_tokens: usize,
    pub max_turns: usize,
    pub max_observation_tokens: Option<usize>,
}

/// One sample to generate.
#[derive(Debug, Clone)]
pub struct Job {
    /// The caller's key (returned with the sample).
    pub key: usize,
    pub prompt_ids: Vec<u32>,
    pub seed: u64,
}

/// A finished sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub loss_mask: Vec<u8>,
    pub logprobs: Vec<f32>,
    pub response_text: String,
    pub turns: u32,
    pub tool_calls: u32,
    pub finish_reason: &'static str,
}

/// How a sequence's special tokens end it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The CoA loop: a tool's closing tag runs the tool and appends its observation, `</answer>`
    /// ends the sample (`finish_reason` "answer"), EOS ends it ("eos").
    Agent,
    /// Plain text generation (a served completion without tools): tags are ordinary tokens and only
    /// EOS ends the sample before its budget.
    Text,
}

struct Active {
    key: usize,
    rng: Rng,
    s: Sample,
    cfg: SampleConfig,
    mode: Mode,
    /// Tokens to feed at the next forward.
    pending: Vec<u32>,
    /// Where the current turn starts in `response_ids`.
    turn_start: usize,
}

/// Counters of a generation run.
#[derive(Debug, Clone, Default)]
pub struct GenStats {
    pub forwards: u64,
    /// Tokens fed to the model (prompts, sampled tokens, observations).
    pub tokens_fed: u64,
    /// Prompt tokens the policy already held (kept prefixes), not fed.
    pub prompt_tokens_reused: u64,
    pub tokens_sampled: u64,
    pub tool_calls: u64,
    pub decode_secs: f64,
    pub tool_secs: f64,
}

/// What the caller of [`Batch::step`] sees of each sampled token: `(key, token, log-prob, the
/// logits it was sampled from)`. Returning `Some(reason)` ends that sample now with that
/// `finish_reason` (a stop string, a client that went away).
pub type OnToken<'f> = dyn FnMut(usize, u32, f32, &[f32]) -> Option<&'static str> + 'f;

/// The sequences in flight on a policy's slots: continuous batching. Sequences join at any step
/// ([`Batch::admit`] on a free slot), every active one advances by one token per [`Batch::step`]
/// (one batched forward), and a finished one leaves at once, freeing its slot for the next.
/// [`generate`] drives it from a list of jobs; `coa-serve` from requests arriving over a channel.
pub struct Batch {
    slots: Vec<Option<Active>>,
    pub stats: GenStats,
}

impl Batch {
    /// An empty batch over every slot of `policy` (each slot emptied, whatever an earlier run left).
    pub fn new(policy: &mut dyn Policy) -> Batch {
        for slot in 0..policy.n_slots() {
            policy.reset(slot);
        }
        Batch { slots: (0..policy.n_slots()).map(|_| None).collect(), stats: GenStats::default() }
    }

    /// The first free slot.
    pub fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(Option::is_none)
    }

    /// Sequences in flight.
    pub fn active(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Starts `job` on free slot `slot`; `false`: the policy deferred it to after the next forward
    /// (a prompt being prefilled now shares more with it; see [`Policy::start`]), try again then.
    pub fn admit(&mut self, policy: &mut dyn Policy, slot: usize, job: &Job, cfg: &SampleConfig, mode: Mode) -> Result<bool> {
        if self.slots.get(slot).is_none_or(Option::is_some) {
            bail!("job {}: slot {slot} is not a free slot of the batch", job.key);
        }
        if job.prompt_ids.is_empty() {
            bail!("job {}: empty prompt", job.key);
        }
        let Some(held) = policy.start(slot, &job.prompt_ids)? else { return Ok(false) };
        self.stats.prompt_tokens_reused += held as u64;
        self.slots[slot] = Some(Active {
            key: job.key,
            rng: Rng::new(job.seed),
            pending: job.prompt_ids[held..].to_vec(),
            s: Sample { prompt_ids: job.prompt_ids.clone(), turns: 1, ..Sample::default() },
            cfg: cfg.clone(),
            mode,
            turn_start: 0,
        });
        Ok(true)
    }

    /// Drops every sequence in flight (after an error, so that the slots serve new ones).
    pub fn clear(&mut self, policy: &mut dyn Policy) {
        for (slot, a) in self.slots.iter_mut().enumerate() {
            if a.take().is_some() {
                policy.reset(slot);
            }
        }
    }

    /// One batched forward of every active sequence, a token sampled for each (and its tool call
    /// run, in agent mode); returns the samples that finished, in slot order, their slots freed.
    pub fn step(&mut self, policy: &mut dyn Policy, env: &dyn Environment, codec: &Codec, on_token: &mut OnToken) -> Result<Vec<(usize, Sample)>> {
        let stats = &mut self.stats;
        let slots = &mut self.slots;
        let active: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].is_some()).collect();
        if active.is_empty() {
            return Ok(Vec::new());
        }
        // One batched forward.
        let t0 = Instant::now();
        let mut logits = {
            let items: Vec<(usize, &[u32])> =
                active.iter().map(|&i| (i, slots[i].as_ref().expect("active").pending.as_slice())).collect();
            stats.tokens_fed += items.iter().map(|(_, p)| p.len() as u64).sum::<u64>();
            policy.extend(&items)?
        };
        stats.forwards += 1;
        stats.decode_secs += t0.elapsed().as_secs_f64();
        let v = policy.vocab_size();
        if logits.len() != active.len() * v {
            bail!("the policy returned {} logits for {} sequences of a {v}-token vocabulary", logits.len(), active.len());
        }
        for row in logits.chunks_mut(v) {
            for &id in &codec.never_sampled {
                if let Some(z) = row.get_mut(id as usize) {
                    *z = f32::NEG_INFINITY;
                }
            }
        }
        // Sample every row in parallel (a softmax over the vocabulary each; every row draws from
        // its own generator, so the threads change no result); then collect tool calls in order.
        let picks: Vec<Result<(u32, f32)>> = {
            use rayon::prelude::*;
            let mut rows: Vec<(&[f32], &mut Rng, &SampleConfig)> = Vec::with_capacity(active.len());
            let mut it = slots.iter_mut().enumerate();
            for (row, &slot) in active.iter().enumerate() {
                let a = it.find(|(i, _)| *i == slot).and_then(|(_, a)| a.as_mut()).expect("active");
                rows.push((&logits[row * v..(row + 1) * v], &mut a.rng, &a.cfg));
            }
            rows.into_par_iter().map(|(z, rng, cfg)| sample_token(z, cfg.temperature, cfg.top_p, rng)).collect()
        };
        // (slot, tool, input, goal)
        let mut calls: Vec<(usize, Tag, String, Goal)> = Vec::new();
        let mut finished: Vec<usize> = Vec::new();
        for ((row, &slot), pick) in active.iter().enumerate().zip(picks) {
            let a = slots[slot].as_mut().expect("active");
            let (tok, lp) = pick?;
            stats.tokens_sampled += 1;
            a.s.response_ids.push(tok);
            a.s.loss_mask.push(1);
            a.s.logprobs.push(lp);
            a.pending.clear();
            a.pending.push(tok);
            let agent = a.mode == Mode::Agent;
            let tool = codec.tools.iter().find(|t| agent && t.1 == tok).copied();
            if let Some(reason) = on_token(a.key, tok, lp, &logits[row * v..(row + 1) * v]) {
                a.s.finish_reason = reason;
            } else if Some(tok) == codec.eos {
                a.s.finish_reason = "eos";
            } else if agent && Some(tok) == codec.answer_close {
                a.s.finish_reason = "answer";
            } else if let Some((open, _, tag)) = tool {
                if a.s.turns as usize >= a.cfg.max_turns {
                    a.s.finish_reason = "max_turns";
                } else if a.s.response_ids.len() >= a.cfg.max_response_tokens {
                    a.s.finish_reason = "budget";
                } else {
                    let (input, goal) = tool_call(codec, &a.s.response_ids, a.turn_start, open, tag)?;
                    calls.push((slot, tag, input, goal));
                    continue;
                }
            } else if a.s.response_ids.len() >= a.cfg.max_response_tokens {
                a.s.finish_reason = "budget";
            } else {
                continue;
            }
            finished.push(slot);
        }
        // Run this step's tool calls concurrently (code runs wait on a subprocess).
        if !calls.is_empty() {
            let t0 = Instant::now();
            let outs: Vec<Result<String>> = std::thread::scope(|sc| {
                let handles: Vec<_> = calls.iter().map(|(_, tag, input, goal)| sc.spawn(move || env.observe(*tag, input, goal))).collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a tool call panicked")))).collect()
            });
            stats.tool_secs += t0.elapsed().as_secs_f64();
            for ((slot, tag, _, _), out) in calls.iter().zip(outs) {
                let obs = out.with_context(|| format!("running {}", tag.name()))?;
                let a = slots[*slot].as_mut().expect("active");
                let mut ids = codec.observation_ids(&obs, a.cfg.max_observation_tokens)?;
                let room = a.cfg.max_response_tokens - a.s.response_ids.len();
                let cut = ids.len() > room;
                ids.truncate(room);
                a.s.response_ids.extend_from_slice(&ids);
                a.s.loss_mask.resize(a.s.response_ids.len(), 0);
                a.s.logprobs.resize(a.s.response_ids.len(), 0.0);
                a.s.tool_calls += 1;
                stats.tool_calls += 1;
                if cut || a.s.response_ids.len() >= a.cfg.max_response_tokens {
                    a.s.finish_reason = "budget";
                    finished.push(*slot);
                } else {
                    a.pending.extend_from_slice(&ids);
                    a.s.turns += 1;
                    a.turn_start = a.s.response_ids.len();
                }
            }
        }
        finished.sort_unstable();
        let mut out = Vec::with_capacity(finished.len());
        for slot in finished {
            let mut a = slots[slot].take().expect("active");
            a.s.response_text = codec.decode(&a.s.response_ids)?;
            out.push((a.key, a.s));
        }
        Ok(out)
    }
}

/// The input of the tool call whose closing tag ends `response` (that tool's `open` id is the
/// opening tag): this turn's tokens only, after the last opening tag of that tool (for `<code>`,
/// the fenced source); and, for a crawl, the goal it summarizes its pages for.
fn tool_call(codec: &Codec, response: &[u32], turn_start: usize, open: u32, tag: Tag) -> Result<(String, Goal)> {
    let turn = &response[turn_start..response.len() - 1];
    let from = turn.iter().rposition(|&t| t == open).map_or(0, |p| p + 1);
    let content = codec.decode(&turn[from..])?;
    let input = if tag == Tag::Code { code_source(&content).to_string() } else { content.trim().to_string() };
    let goal = match tag {
        Tag::CrawlPage => {
            let text = codec.decode(response)?;
            Goal::new(find_last_block(&text, Tag::Think), find_last_block(&text, Tag::WebSearch))
        }
        _ => Goal::default(),
    };
    Ok((input, goal))
}

/// Generates every job, `policy.n_slots()` at a time, calling `done(key, sample)` as each
/// finishes; `done` returning `false` stops the run (samples in flight are dropped).
pub fn generate(
    policy: &mut dyn Policy,
    env: &dyn Environment,
    codec: &Codec,
    cfg: &SampleConfig,
    jobs: impl IntoIterator<Item = Job>,
    done: &mut dyn FnMut(usize, Sample) -> Result<bool>,
) -> Result<GenStats> {
    let mut jobs = jobs.into_iter().peekable();
    let mut batch = Batch::new(policy);
    loop {
        // Fill free slots. Jobs start in order: one that waits for a prompt being prefilled holds
        // back the rest until the next forward.
        while let (Some(slot), Some(job)) = (batch.free_slot(), jobs.peek()) {
            if !batch.admit(policy, slot, job, cfg, Mode::Agent)? {
                break;
            }
            jobs.next();
        }
        if batch.active() == 0 {
            if jobs.peek().is_some() {
                bail!("the policy deferred a job while no sequence was in flight");
            }
            return Ok(batch.stats);
        }
        for (key, s) in batch.step(policy, env, codec, &mut |_, _, _, _| None)? {
            if !done(key, s)? {
                return Ok(batch.stats);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the stage

/// The checkpoint's model and vocabulary, fitted to each other: `path` is an HF checkpoint
/// directory (config.json, model.safetensors, tokenizer.json, as coa-train-step saves them) or
/// a GGUF file. A pretrained model whose tokenizer lacks the CoA tags gets them, its vocabulary
/// grown as coa-train-step grows it.
pub fn load_checkpoint(path: &Path, bos: &SpecialChoice, eos: &SpecialChoice, chat: &TemplateChoice) -> Result<(Model, Vocab)> {
    if path.is_dir() {
        for f in ["config.json", "tokenizer.json"] {
            if !path.join(f).is_file() {
                bail!("--checkpoint {}: {f} is missing (coa-train-step writes it when given --tokenizer)", path.display());
            }
        }
    } else if !path.is_file() {
        bail!("--checkpoint {}: no such checkpoint directory or GGUF file", path.display());
    }
    let vocab = Vocab::load(path, bos, eos, chat).with_context(|| format!("--checkpoint {}", path.display()))?;
    let mut model = Model::load(path).with_context(|| format!("--checkpoint {}", path.display()))?;
    fit_model(&mut model, &vocab, true).with_context(|| format!("--checkpoint {}", path.display()))?;
    Ok((model, vocab))
}

/// Samples the checkpoint on every task of the input and writes `rollouts`.
pub fn run(stage: &mut Stage, args: &PolicyArgs) -> Result<()> {
    // The device first: `--device cuda` without a GPU fails before anything is read.
    let device = args.decode.select()?;
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global().map_err(|e| anyhow!("--threads: {e}"))?;
    }
    stage.set_seed(args.seed);
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

    let reward_config = RewardConfig {
        max_len: args.max_response_tokens,
        cache_len: args.overlong_cache.unwrap_or(args.max_response_tokens / 8),
        ..RewardConfig::default()
    };
    if reward_config.cache_len > reward_config.max_len {
        bail!("--overlong-cache {} is larger than --max-response-tokens {}", reward_config.cache_len, reward_config.max_len);
    }
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
#[path = "policy_tests.rs"]
mod tests;
