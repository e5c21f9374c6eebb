//! The decode loop: the sequences in flight on a policy's slots ([`Batch`], continuous batching),
//! what goes in and comes out ([`Job`], [`Sample`], [`GenStats`]), and [`generate`], which runs a
//! list of jobs through it.

use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use coa_format::Tag;
use coa_tools::crawl::Goal;

use super::env::{tool_call, Codec, Environment};
use super::model::Policy;
use super::sampler::{sample_token, Rng, SampleConfig};

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
