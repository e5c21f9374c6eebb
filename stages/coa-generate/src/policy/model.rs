//! The policy: a language model that extends sequences held in slots ([`Policy`]), on the CPU with
//! a KV cache that keeps recent prompt prefixes ([`ModelPolicy`]) or on a GPU ([`GpuPolicy`]);
//! the [`Decoder`] holding either; and the checkpoint it loads from ([`load_checkpoint`]).

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use coa_kernels::decode::GpuDecoder;
use coa_model::{KvCache, Model};
use coa_tokenize::{fit_model, SpecialChoice, TemplateChoice, Vocab};

/// A decoder opened by [`DecodeFlags::open`](super::DecodeFlags::open): the model on the CPU or on a CUDA device.
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
pub(super) const GPU_PASS_ROWS: usize = 2048;

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
