//! The decode thread: one thread owns the model, its KV cache and the tools, and runs the rollout
//! engine's continuous batch ([`coa_generate::policy::Batch`]: the decoder and sampler of
//! `coa-generate policy`). Requests arrive over a bounded channel as [`Work`] (one sequence per
//! choice); a sequence joins the batch at the next step when a slot is free, and leaves it when it
//! finishes (EOS, a stop string, `max_tokens`, or its client gone), freeing the slot for the next.
//!
//! Text is detokenized as tokens arrive: the sequence's tokens are decoded whole at each step and
//! the new text after what was already sent is the delta, except a trailing incomplete character
//! (U+FFFD) and any ending that could be the start of a stop string, which are held back until the
//! next token decides them. So a stop string is never sent, and the streamed deltas add up to the
//! text of the non-streamed answer.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use coa_agents::Tools;
use coa_format::{find_last_block, steps_from_text, Tag};
use coa_generate::policy::{Batch, Codec, DecodeFlags, Environment, Job, Mode, Policy, Sample, SampleConfig, ToolEnv};
use coa_kernels::Device;
use coa_model::Model;
use coa_tokenize::Vocab;
use coa_tools::crawl::Goal;
use coa_tools::Corpus;
use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

/// One sequence of a request: its choice index, prompt and random stream.
#[derive(Debug, Clone)]
pub struct Seq {
    pub index: usize,
    pub prompt_ids: Vec<u32>,
    pub seed: u64,
}

/// A request for the decode thread: its sequences and how to sample and end them, and where the
/// results go.
#[derive(Debug)]
pub struct Work {
    pub seqs: Vec<Seq>,
    pub cfg: SampleConfig,
    pub mode: Mode,
    pub stop: Vec<String>,
    /// `Some(k)`: each token is sent with its log-prob and its `k` most likely alternatives.
    pub top_logprobs: Option<usize>,
    pub reply: UnboundedSender<Event>,
}

/// A sampled token with its log-prob and the most likely alternatives (each `(text, log-prob)`).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// A step of an agent's trajectory (`--tools`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TrajectoryStep {
    pub tag: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observation: Option<String>,
}

/// What the agent did to answer (`--tools`): the whole CoA text, its steps, and its token counts.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Trajectory {
    pub text: String,
    pub steps: Vec<TrajectoryStep>,
    pub turns: u32,
    pub tool_calls: u32,
    /// Tokens the model sampled.
    pub sampled_tokens: usize,
    /// Tokens of the observations the tools returned.
    pub observation_tokens: usize,
    /// How the CoA loop ended: `answer`, `eos`, `budget` or `max_turns`.
    pub finish_reason: String,
}

/// What the decode thread sends back about a request's sequences.
#[derive(Debug, Clone)]
pub enum Event {
    /// New text of choice `index` (possibly empty while text is held back), with the token's
    /// log-probs when they were asked for.
    Token { index: usize, delta: String, token: Option<TokenInfo> },
    /// Choice `index` is finished: `tail` is the text not yet sent, `text` the whole text.
    Done { index: usize, finish_reason: &'static str, tail: String, text: String, completion_tokens: usize, trajectory: Option<Box<Trajectory>> },
    /// The decoder failed; the request's sequences are dropped.
    Failed(String),
}

/// The decode thread's counters (`GET /stats`).
#[derive(Debug, Default)]
pub struct Stats {
    /// Sequences in the batch now.
    pub active: AtomicUsize,
    /// Sequences taken from the queue that wait for a slot.
    pub waiting: AtomicUsize,
    pub sequences_finished: AtomicU64,
    /// Sequences dropped because their client went away.
    pub sequences_cancelled: AtomicU64,
    pub tokens_sampled: AtomicU64,
    pub forwards: AtomicU64,
}

impl Stats {
    pub fn json(&self) -> serde_json::Value {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "active": self.active.load(Ordering::Relaxed),
            "waiting": self.waiting.load(Ordering::Relaxed),
            "sequences_finished": get(&self.sequences_finished),
            "sequences_cancelled": get(&self.sequences_cancelled),
            "tokens_sampled": get(&self.tokens_sampled),
            "forwards": get(&self.forwards),
        })
    }
}

/// The tools of `--tools`: the corpus (when one was given) and the tools' settings.
pub struct ToolSetup {
    pub corpus: Option<Corpus>,
    pub config: coa_agents::ToolConfig,
}

/// The environment when tools are off: text completions never call it.
struct NoTools;

impl Environment for NoTools {
    fn observe(&self, tool: Tag, _input: &str, _goal: &Goal) -> Result<String> {
        Err(anyhow!("{} called with tools off (start coa-serve with --tools)", tool.name()))
    }
}

/// The decoder the decode thread runs: opened in that thread (a CUDA context belongs to the
/// thread that made it) and lent to `serve` for as long as the server runs.
pub trait Decoding: Send {
    /// Opens the decoder with `slots` sequences of up to `context` tokens and runs `serve` with it
    /// and the device's name.
    fn run(self: Box<Self>, slots: usize, context: usize, serve: &mut dyn FnMut(&mut dyn Policy, String) -> Result<()>) -> Result<()>;
}

/// The checkpoint's model, decoded as `--device`, `--decode-weights` and `--kv-cache` say.
pub struct ModelDecoding {
    pub model: Model,
    pub flags: DecodeFlags,
    pub device: Device,
}

impl Decoding for ModelDecoding {
    fn run(self: Box<Self>, slots: usize, context: usize, serve: &mut dyn FnMut(&mut dyn Policy, String) -> Result<()>) -> Result<()> {
        let (mut decoder, device) = self.flags.open(self.device.clone(), &self.model, slots, context, "coa-serve")?;
        serve(decoder.policy(), device)
    }
}

/// What the decode thread serves with.
pub struct EngineConfig {
    pub slots: usize,
    pub context: usize,
    pub tools: Option<ToolSetup>,
    pub stats: Arc<Stats>,
}

/// Starts the decode thread; returns once the decoder is open (or failed to open), with the
/// device's name. Requests are sent on the returned channel, which holds at most `queue` waiting
/// requests; the thread ends when every sender is dropped and its last sequence is finished.
pub fn spawn(decoding: Box<dyn Decoding>, vocab: Arc<Vocab>, cfg: EngineConfig, queue: usize) -> Result<(SyncSender<Work>, String)> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Work>(queue);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<String>>();
    std::thread::Builder::new()
        .name("coa-serve-decode".into())
        .spawn(move || {
            let mut rx = Some(rx);
            let (slots, context) = (cfg.slots, cfg.context);
            let served = decoding.run(slots, context, &mut |policy, device| {
                let _ = ready_tx.send(Ok(device));
                decode_loop(policy, &vocab, &cfg, rx.take().expect("run once"))
            });
            if let Err(e) = served {
                // The decoder did not open (then `ready` hands the error to `spawn`) or the
                // thread's own state broke: nothing more can be served.
                let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                eprintln!("coa-serve: error: the decode thread stopped: {e:#}");
            }
        })
        .context("starting the decode thread")?;
    match ready_rx.recv() {
        Ok(Ok(device)) => Ok((tx, device)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(anyhow!("the decode thread stopped while opening the decoder")),
    }
}

/// A sequence in flight.
struct Live {
    work: Arc<Shared>,
    index: usize,
    /// Sampled tokens of a text completion (the EOS that ends it not included).
    ids: Vec<u32>,
    /// Their text (cut at a stop string) and how many of its bytes were sent.
    text: String,
    sent: usize,
    sampled: usize,
}

/// What a request's sequences share.
struct Shared {
    mode: Mode,
    temperature: f32,
    stop: Vec<String>,
    top_logprobs: Option<usize>,
    reply: UnboundedSender<Event>,
}

fn decode_loop(policy: &mut dyn Policy, vocab: &Vocab, cfg: &EngineConfig, rx: Receiver<Work>) -> Result<()> {
    let codec = Codec::new(vocab)?;
    let tool_env = cfg.tools.as_ref().map(|t| ToolEnv { tools: Tools { corpus: t.corpus.as_ref(), config: &t.config } });
    let env: &dyn Environment = match &tool_env {
        Some(e) => e,
        None => &NoTools,
    };
    let mut batch = Batch::new(policy);
    let mut waiting: VecDeque<(Arc<Shared>, Job, SampleConfig, usize)> = VecDeque::new();
    let mut live: HashMap<usize, Live> = HashMap::new();
    let mut next_key = 0usize;
    let mut open = true;
    loop {
        // Admit waiting sequences, then new requests, while slots are free.
        while let Some(slot) = batch.free_slot() {
            if waiting.is_empty() {
                let work = if batch.active() == 0 && open {
                    match rx.recv() {
                        Ok(w) => w,
                        Err(_) => return Ok(()),
                    }
                } else {
                    match rx.try_recv() {
                        Ok(w) => w,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            open = false;
                            break;
                        }
                    }
                };
                let shared = Arc::new(Shared {
                    mode: work.mode,
                    temperature: work.cfg.temperature,
                    stop: work.stop.into_iter().filter(|s| !s.is_empty()).collect(),
                    top_logprobs: work.top_logprobs,
                    reply: work.reply,
                });
                for seq in work.seqs {
                    let job = Job { key: next_key, prompt_ids: seq.prompt_ids, seed: seq.seed };
                    next_key += 1;
                    waiting.push_back((shared.clone(), job, work.cfg.clone(), seq.index));
                }
                continue;
            }
            let (shared, job, scfg, index) = waiting.front().expect("not empty");
            if shared.reply.is_closed() {
                waiting.pop_front();
                continue;
            }
            match batch.admit(policy, slot, job, scfg, shared.mode) {
                Ok(true) => {
                    let (shared, job, _, index) = waiting.pop_front().expect("not empty");
                    live.insert(job.key, Live { work: shared, index, ids: Vec::new(), text: String::new(), sent: 0, sampled: 0 });
                }
                Ok(false) => break,
                Err(e) => {
                    let _ = shared.reply.send(Event::Failed(format!("choice {index}: {e:#}")));
                    waiting.pop_front();
                }
            }
        }
        cfg.stats.active.store(batch.active(), Ordering::Relaxed);
        cfg.stats.waiting.store(waiting.len(), Ordering::Relaxed);
        if batch.active() == 0 {
            if !open && waiting.is_empty() {
                return Ok(());
            }
            continue;
        }
        let mut on_token = |key: usize, tok: u32, lp: f32, logits: &[f32]| on_token(&mut live, &codec, vocab, key, tok, lp, logits);
        let stepped = batch.step(policy, env, &codec, &mut on_token);
        let stats = &cfg.stats;
        stats.forwards.store(batch.stats.forwards, Ordering::Relaxed);
        stats.tokens_sampled.store(batch.stats.tokens_sampled, Ordering::Relaxed);
        match stepped {
            Ok(finished) => {
                for (key, sample) in finished {
                    let counter = if sample.finish_reason == "cancelled" { &stats.sequences_cancelled } else { &stats.sequences_finished };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if let Some(l) = live.remove(&key) {
                        finish(l, sample);
                    }
                }
            }
            Err(e) => {
                // The sequences in flight are lost; the server goes on with new ones.
                let msg = format!("decoding: {e:#}");
                eprintln!("coa-serve: error: {msg}");
                for (_, l) in live.drain() {
                    let _ = l.work.reply.send(Event::Failed(msg.clone()));
                }
                batch.clear(policy);
            }
        }
        stats.active.store(batch.active(), Ordering::Relaxed);
    }
}

/// Handles one sampled token of sequence `key`; `Some(reason)` ends it.
fn on_token(live: &mut HashMap<usize, Live>, codec: &Codec, vocab: &Vocab, key: usize, tok: u32, lp: f32, logits: &[f32]) -> Option<&'static str> {
    let Some(l) = live.get_mut(&key) else { return Some("cancelled") };
    let w = l.work.clone();
    if w.reply.is_closed() {
        return Some("cancelled");
    }
    if w.mode == Mode::Agent || Some(tok) == vocab.eos {
        l.sampled += usize::from(w.mode == Mode::Agent);
        return None;
    }
    l.sampled += 1;
    l.ids.push(tok);
    let token = w.top_logprobs.map(|k| TokenInfo { id: tok, text: token_text(codec, tok), logprob: lp, top: top_logprobs(codec, logits, w.temperature, k) });
    let text = match codec.decode(&l.ids) {
        Ok(t) => t,
        Err(e) => {
            let _ = w.reply.send(Event::Failed(format!("{e:#}")));
            return Some("cancelled");
        }
    };
    let from = floor_boundary(&text, l.sent);
    let (safe, stopped) = match find_stop(&text, &w.stop, from) {
        Some(at) => (at, true),
        None => (held_back(&text, &w.stop).max(from), false),
    };
    let delta = text[from..safe].to_string();
    l.sent = safe;
    l.text = if stopped { text[..safe].to_string() } else { text };
    // Nothing to say (text held back, no log-probs asked for): no event.
    if (!delta.is_empty() || token.is_some()) && w.reply.send(Event::Token { index: l.index, delta, token }).is_err() {
        return Some("cancelled");
    }
    stopped.then_some("stop")
}

/// Sends the end of a finished sequence.
fn finish(l: Live, s: Sample) {
    if s.finish_reason == "cancelled" {
        return;
    }
    let finish_reason = match s.finish_reason {
        "budget" | "max_turns" => "length",
        _ => "stop",
    };
    let done = match l.work.mode {
        Mode::Text => {
            let from = floor_boundary(&l.text, l.sent);
            Event::Done { index: l.index, finish_reason, tail: l.text[from..].to_string(), text: l.text, completion_tokens: l.sampled, trajectory: None }
        }
        Mode::Agent => {
            let text = s.response_text.clone();
            let answer = find_last_block(&text, Tag::Answer).map_or_else(|| text.clone(), |a| a.trim().to_string());
            let steps = match steps_from_text(&text) {
                Ok(steps) => steps
                    .iter()
                    .map(|st| TrajectoryStep { tag: st.tag.name().to_string(), content: st.content.to_string(), observation: st.observation.map(str::to_string) })
                    .collect(),
                // Text the parser refuses (cut by the budget mid-tag): the whole text is still in `text`.
                Err(_) => Vec::new(),
            };
            let sampled = s.loss_mask.iter().filter(|&&m| m == 1).count();
            let trajectory = Trajectory {
                text,
                steps,
                turns: s.turns,
                tool_calls: s.tool_calls,
                sampled_tokens: sampled,
                observation_tokens: s.response_ids.len() - sampled,
                finish_reason: s.finish_reason.to_string(),
            };
            Event::Done { index: l.index, finish_reason, tail: answer.clone(), text: answer, completion_tokens: sampled, trajectory: Some(Box::new(trajectory)) }
        }
    };
    let _ = l.work.reply.send(done);
}

/// The largest char boundary of `s` at or before `i`.
fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Where the first stop string in `text` at or after `from` begins.
pub fn find_stop(text: &str, stops: &[String], from: usize) -> Option<usize> {
    stops.iter().filter_map(|s| text[from..].find(s.as_str()).map(|p| from + p)).min()
}

/// How much of `text` can be sent: all but a trailing incomplete character (decoded as U+FFFD)
/// and the longest ending that is the start of a stop string.
pub fn held_back(text: &str, stops: &[String]) -> usize {
    let body = text.trim_end_matches('\u{FFFD}');
    let mut safe = body.len();
    for s in stops {
        for k in (1..s.len()).rev() {
            if s.is_char_boundary(k) && body.ends_with(&s[..k]) {
                safe = safe.min(body.len() - k);
                break;
            }
        }
    }
    safe
}

fn token_text(codec: &Codec, tok: u32) -> String {
    codec.decode(&[tok]).unwrap_or_default()
}

/// The `k` most likely tokens of `logits` (ties by id) with their log-probs under
/// softmax(logits / T), the distribution the sampler reports log-probs of (T = 0: T = 1).
pub fn top_logprobs(codec: &Codec, logits: &[f32], temperature: f32, k: usize) -> Vec<(String, f32)> {
    top_k(logits, temperature, k).into_iter().map(|(id, lp)| (token_text(codec, id), lp)).collect()
}

/// [`top_logprobs`] as token ids.
pub fn top_k(logits: &[f32], temperature: f32, k: usize) -> Vec<(u32, f32)> {
    if k == 0 || logits.is_empty() {
        return Vec::new();
    }
    let t = if temperature > 0.0 { temperature as f64 } else { 1.0 };
    let mx = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = logits.iter().map(|&z| ((z as f64 - mx) / t).exp()).sum::<f64>().ln();
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let by = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let k = k.min(idx.len());
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by);
        idx.truncate(k);
    }
    idx.sort_by(by);
    idx.into_iter().map(|i| (i, ((logits[i as usize] as f64 - mx) / t - lse) as f32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_possible_stop_string_is_held_back() {
        let stops = vec!["</answer>".to_string(), "END".to_string()];
        assert_eq!(held_back("hello </ans", &stops), 6);
        assert_eq!(held_back("hello EN", &stops), 6);
        assert_eq!(held_back("hello", &stops), 5);
        assert_eq!(held_back("caf\u{FFFD}", &stops), 3);
        assert_eq!(find_stop("a END b </answer>", &stops, 0), Some(2));
        assert_eq!(find_stop("a END b", &stops, 3), None);
    }

    #[test]
    fn top_k_orders_by_logit_with_real_log_probs() {
        let z = [0.0f32, 2.0, 1.0, 2.0];
        let top = top_k(&z, 1.0, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let total: f64 = z.iter().map(|&x| (x as f64).exp()).sum();
        assert!((top[0].1 as f64 - (2.0 - total.ln())).abs() < 1e-6);
        assert_eq!(top_k(&z, 0.0, 9).len(), 4);
    }
}
