//! The vocabulary: a HF tokenizer loaded from disk (a `tokenizer.json`, a directory holding one
//! with its `tokenizer_config.json`, or a GGUF file) or a byte-level BPE trained offline on the
//! input, with every CoA tag registered as an added token (one id each), the BOS/EOS ids the
//! sequence layout uses, and the chat template, if any.
//!
//! Tags are HF *non-special* added tokens (`special: false`, `normalized: false`): one id each,
//! never split or merged, yet kept by `decode(skip_special_tokens=True)`, which verl's reward
//! managers and vLLM use: a tag that vanished there would break every reward parser downstream.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;

use crate::chat::{ChatTemplate, PLAIN_TEMPLATE};
use coa_format::Tag;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{
    AddedToken, Model, ModelWrapper, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior, Tokenizer,
};

/// The end-of-text token a trained vocabulary carries (id 0), appended after every text.
pub const ENDOFTEXT: &str = "<|endoftext|>";

/// EOS names tried, in order, when `--eos auto` finds no `tokenizer_config.json`: the trained
/// default and Qwen2 base (`<|endoftext|>`), Llama 3 (`<|end_of_text|>`), Llama 2 / Mistral (`</s>`).
pub const EOS_CANDIDATES: [&str; 3] = [ENDOFTEXT, "<|end_of_text|>", "</s>"];

/// The pre-tokenizer split of a trained vocabulary (the Qwen2 / GPT-4 style word regex: letters
/// with one leading non-letter, digits one at a time, punctuation runs with trailing newlines,
/// newline runs, spaces), then the byte-level mapping without a second regex.
pub const TRAIN_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Longest pre-tokenized word of a trained vocabulary, in characters. Longer runs (a line of one
/// letter, a base64 blob) are cut into pieces of this length, as byte-level BPE trainers bound
/// their words: each merge costs time linear in the length of every word it touches, so one huge
/// word made training quadratic (100 KB took 7 s, 0.5 MB over a minute).
pub const MAX_WORD_CHARS: usize = 64;

/// The split that bounds words to [`MAX_WORD_CHARS`]: any character, newlines included. Written
/// `[\s\S]` because the file must load in HF tokenizers' Python build, whose Oniguruma refuses the
/// `(?s)` flag (`(?s).{1,64}` worked here, in fancy-regex, and nowhere else).
fn word_bound_regex() -> String {
    format!(r"[\s\S]{{1,{MAX_WORD_CHARS}}}")
}

/// Every CoA tag string (`<think>`, `</think>`, …), from the shared grammar, in documentation order.
pub fn tag_strings() -> Vec<&'static str> {
    Tag::ALL.iter().flat_map(|t| [t.open(), t.close()]).collect()
}

/// How to choose the BOS / EOS token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecialChoice {
    /// Decide from the tokenizer (see [`Vocab::load`]).
    Auto,
    /// No such token.
    None,
    /// This token (must be in the vocabulary).
    Token(String),
}

impl std::str::FromStr for SpecialChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "auto" => SpecialChoice::Auto,
            "none" => SpecialChoice::None,
            "" => return Err("empty token (use `none` for no token)".into()),
            t => SpecialChoice::Token(t.to_string()),
        })
    }
}

/// A tokenizer plus what the sequence layout needs from it.
pub struct Vocab {
    pub tokenizer: Tokenizer,
    /// Ids put before the prompt (mask 0): what the tokenizer's post-processor prepends (Llama's
    /// `<s>` / `<|begin_of_text|>`), or none (Qwen2, trained vocabularies).
    pub bos: Vec<u32>,
    /// Appended after the text as a target (mask 1) so the model learns to stop.
    pub eos: Option<u32>,
    /// Id of each tag string of [`tag_strings`], in that order.
    pub tag_ids: Vec<u32>,
    /// Contents of every added token (tags, EOS, chat markers, …): used to tell whether a segment
    /// boundary falls on a token boundary of the joined text.
    pub specials: Vec<String>,
    /// Tags that were not added tokens of the loaded file and were added.
    pub tags_added: usize,
    /// Ids below this are the loaded model vocabulary's (`get_vocab_size(false)`); added tokens
    /// at or above it are new to a checkpoint of that size.
    pub base_size: usize,
    /// The chat template the sequence layout renders the prompt with (None: the plain layout).
    pub chat: Option<ChatTemplate>,
    /// The file's `tokenizer_config.json` (kept and written back, updated), or empty.
    pub config: serde_json::Map<String, serde_json::Value>,
    /// Where the vocabulary came from, for the summary.
    pub source: String,
    /// Whether [`Vocab::encode_into`] may take the cached fast path (see there).
    pub fast: bool,
    /// Special token contents, longest first (leftmost-longest matching), and their ids.
    by_length: Vec<(String, u32)>,
    /// Bytes that start some special token.
    first_bytes: [bool; 256],
    /// Distinguishes this vocabulary's entries in the per-thread word cache.
    generation: u64,
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Per-thread cache: pre-tokenized word (byte-level form) → ids, for one vocabulary generation.
struct WordCache {
    generation: u64,
    map: HashMap<String, Vec<u32>>,
}

/// Bound on cached words per thread (the cache is cleared when full).
const WORD_CACHE_MAX: usize = 1 << 20;

thread_local! {
    static WORDS: RefCell<WordCache> = RefCell::new(WordCache { generation: 0, map: HashMap::new() });
}

impl Vocab {
    /// Loads a tokenizer: `path` is a `tokenizer.json`, a directory holding one (an HF checkpoint
    /// or a saved tokenizer), or a GGUF file. Adds the CoA tags where missing and resolves BOS,
    /// EOS and the chat template. `auto` BOS = what the post-processor puts before a sequence;
    /// `auto` EOS = `eos_token` of the `tokenizer_config.json` beside the file (a GGUF's EOS id),
    /// else the first of [`EOS_CANDIDATES`] in the vocabulary, else an error asking for `--eos`.
    /// `auto` template = the tokenizer's own chat template, when it has one.
    pub fn load(path: &Path, bos: &SpecialChoice, eos: &SpecialChoice, chat: &TemplateChoice) -> Result<Vocab> {
        let (tokenizer, source, config, template) = if coa_model::gguf::is_gguf(path) {
            let g = coa_model::gguf::load_tokenizer(path)?;
            // The special tokens as a tokenizer_config.json would name them.
            let mut config = serde_json::Map::new();
            for (key, t) in [("bos_token", &g.specials.bos), ("eos_token", &g.specials.eos), ("pad_token", &g.specials.pad), ("unk_token", &g.specials.unk)] {
                if let Some(t) = t {
                    config.insert(key.into(), json!(t.content));
                }
            }
            (g.tokenizer, path.display().to_string(), config, g.chat_template)
        } else {
            let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
            let tokenizer = Tokenizer::from_file(&file).map_err(|e| anyhow!("{}: not a readable tokenizer.json: {e}", file.display()))?;
            let (config, template) = read_tokenizer_config(&file)?;
            (tokenizer, file.display().to_string(), config, template)
        };
        let template = match chat {
            TemplateChoice::Auto => template,
            TemplateChoice::None => None,
            TemplateChoice::File(f) => {
                Some(std::fs::read_to_string(f).with_context(|| format!("--chat-template {}: cannot read the template", f.display()))?)
            }
        };
        let config_eos = if *eos == SpecialChoice::Auto { config_token(&config, "eos_token") } else { None };
        Vocab::from_tokenizer(tokenizer, source, bos, eos, config_eos, config, template)
    }

    fn from_tokenizer(
        mut tokenizer: Tokenizer,
        source: String,
        bos: &SpecialChoice,
        eos: &SpecialChoice,
        config_eos: Option<String>,
        config: serde_json::Map<String, serde_json::Value>,
        template: Option<String>,
    ) -> Result<Vocab> {
        // Disable any padding / truncation the file asks for: lengths are this stage's policy.
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| anyhow!("{source}: {e}"))?;
        let base_size = tokenizer.get_vocab_size(false);
        let tags = tag_strings();
        let before = tags.iter().filter(|t| tokenizer.get_added_vocabulary().get_vocab().contains_key(**t)).count();
        let added: Vec<AddedToken> = tags.iter().map(|t| tag_token(t)).collect();
        tokenizer.add_tokens(added).map_err(|e| anyhow!("{source}: adding the CoA tags: {e}"))?;
        let tag_ids = tags
            .iter()
            .map(|t| tokenizer.token_to_id(t).ok_or_else(|| anyhow!("{source}: tag {t} has no id after adding it")))
            .collect::<Result<Vec<u32>>>()?;
        let distinct: HashSet<u32> = tag_ids.iter().copied().collect();
        if distinct.len() != tag_ids.len() {
            bail!("{source}: two CoA tags share one id");
        }
        let bos = match bos {
            // A chat template writes its own BOS, if any (HF encodes it without special tokens).
            _ if template.is_some() => Vec::new(),
            SpecialChoice::None => Vec::new(),
            SpecialChoice::Token(t) => vec![id_of(&tokenizer, &source, t, "--bos")?],
            SpecialChoice::Auto => post_processor_prefix(&tokenizer).map_err(|e| anyhow!("{source}: {e}"))?,
        };
        let eos = match eos {
            SpecialChoice::None => None,
            SpecialChoice::Token(t) => Some(id_of(&tokenizer, &source, t, "--eos")?),
            SpecialChoice::Auto => {
                let name = match config_eos {
                    Some(n) => Some(n),
                    None => EOS_CANDIDATES.iter().find(|c| tokenizer.token_to_id(c).is_some()).map(|c| c.to_string()),
                };
                match name {
                    Some(n) => Some(id_of(&tokenizer, &source, &n, "eos_token")?),
                    None => bail!(
                        "{source}: cannot tell the EOS token (no tokenizer_config.json beside it, none of {} in the vocabulary): pass --eos TOKEN or --eos none",
                        EOS_CANDIDATES.join(", ")
                    ),
                }
            }
        };
        let mut specials: Vec<String> =
            tokenizer.get_added_vocabulary().get_added_tokens_decoder().values().map(|t| t.content.clone()).collect();
        specials.sort();
        let added = tokenizer.get_added_vocabulary().get_added_tokens_decoder();
        // Added tokens matched on the raw text with nothing stripped, special or not, split the
        // text the same way; the fast path reproduces that.
        let plain_specials = added.values().all(|t| (t.special || !t.normalized) && !t.lstrip && !t.rstrip && !t.single_word);
        let bpe = matches!(tokenizer.get_model(), ModelWrapper::BPE(m) if m.dropout.is_none());
        // Metaspace (SentencePiece vocabularies) prepends ▁ to the text's first piece only, so it
        // cannot run piece by piece between added tokens.
        let piecewise = !tokenizer.get_pre_tokenizer().is_some_and(has_metaspace);
        let fast = plain_specials && bpe && piecewise && tokenizer.get_normalizer().is_none() && !tokenizer.get_encode_special_tokens();
        let mut by_length: Vec<(String, u32)> = added.iter().map(|(id, t)| (t.content.clone(), *id)).collect();
        by_length.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        let mut first_bytes = [false; 256];
        for (t, _) in &by_length {
            first_bytes[t.as_bytes()[0] as usize] = true;
        }
        let chat = match template {
            Some(t) => {
                let token = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i)).unwrap_or_default();
                let bos_token = config_token(&config, "bos_token").unwrap_or_else(|| token(bos.first().copied()));
                Some(ChatTemplate::new(&t, &bos_token, &token(eos)).with_context(|| format!("{source}: chat template"))?)
            }
            None => None,
        };
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        Ok(Vocab {
            tokenizer,
            bos,
            eos,
            tag_ids,
            specials,
            tags_added: tags.len() - before,
            base_size,
            chat,
            config,
            source,
            fast,
            by_length,
            first_bytes,
            generation,
        })
    }

    /// Trains a byte-level BPE of `vocab_size` ids (special tokens and tags included) on `texts`.
    /// `<|endoftext|>` (the one special token) is id 0; the tags, added tokens like in a loaded
    /// vocabulary, take the last ids in [`tag_strings`] order. Tags are cut out of the training
    /// text (no merge ever spans a tag). Deterministic: the same texts give the same file.
    pub fn train<'a>(texts: impl Iterator<Item = &'a str>, vocab_size: usize, min_frequency: u64) -> Result<Vocab> {
        let tags = tag_strings();
        let mut specials: Vec<&str> = vec![ENDOFTEXT];
        specials.extend(tags.iter().copied());
        let alphabet = ByteLevel::alphabet();
        if vocab_size < specials.len() + alphabet.len() {
            bail!(
                "--vocab-size {vocab_size} is too small: a byte-level BPE needs at least {} ids ({} special tokens + 256 bytes)",
                specials.len() + alphabet.len(),
                specials.len()
            );
        }
        let mut tokenizer = Tokenizer::new(BPE::default());
        let split = Split::new(SplitPattern::Regex(TRAIN_SPLIT_REGEX.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| anyhow!("pre-tokenizer regex: {e}"))?;
        let bound = Split::new(SplitPattern::Regex(word_bound_regex()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| anyhow!("pre-tokenizer word bound: {e}"))?;
        tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::Split(bound),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ]))));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        tokenizer.with_post_processor(Some(ByteLevel::new(false, false, false)));
        let trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size - tags.len())
            .min_frequency(min_frequency)
            .show_progress(false)
            .special_tokens(vec![AddedToken::from(ENDOFTEXT, true)])
            .initial_alphabet(alphabet.into_iter().collect())
            .build();
        let mut trainer = TrainerWrapper::BpeTrainer(trainer);
        let pieces: Vec<&str> = texts.flat_map(|t| split_at_specials(t, &specials)).collect();
        tokenizer.train(&mut trainer, pieces.into_iter()).map_err(|e| anyhow!("training the BPE: {e}"))?;
        let source = format!("trained byte-level BPE ({vocab_size} ids requested)");
        Vocab::from_tokenizer(tokenizer, source, &SpecialChoice::None, &SpecialChoice::Token(ENDOFTEXT.into()), None, Default::default(), None)
    }

    /// The `tokenizer.json` text of this vocabulary (tags included).
    pub fn tokenizer_json(&self) -> Result<String> {
        self.tokenizer.to_string(true).map_err(|e| anyhow!("serialising the tokenizer: {e}"))
    }

    /// The `tokenizer_config.json` HF transformers, vLLM and verl read beside `tokenizer.json`:
    /// the loaded file's fields, updated with the BOS/EOS/pad tokens of this layout, every added
    /// token (`added_tokens_decoder`; tags with `special: false`) and the chat template: the one
    /// the layout renders, else [`PLAIN_TEMPLATE`] (our plain layout as a template), so that
    /// `apply_chat_template` gives a model trained here its training prefix.
    pub fn tokenizer_config_json(&self) -> Result<String> {
        let mut c = self.config.clone();
        let token = |id: u32| self.tokenizer.id_to_token(id).unwrap_or_default();
        c.entry("tokenizer_class").or_insert_with(|| json!("PreTrainedTokenizerFast"));
        c.entry("clean_up_tokenization_spaces").or_insert(json!(false));
        let bos = self.bos.first().map(|&b| token(b));
        if let Some(b) = &bos {
            c.insert("bos_token".into(), json!(b));
        }
        match self.eos {
            Some(e) => {
                c.insert("eos_token".into(), json!(token(e)));
                // padding must not invent a token: reuse EOS (as Llama and Qwen recipes do)
                if config_token(&c, "pad_token").and_then(|p| self.tokenizer.token_to_id(&p)).is_none() {
                    c.insert("pad_token".into(), json!(token(e)));
                }
            }
            None => {
                c.remove("eos_token");
            }
        }
        let mut decoder = serde_json::Map::new();
        let mut added: Vec<_> = self.tokenizer.get_added_vocabulary().get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        for (id, t) in added {
            decoder.insert(
                id.to_string(),
                json!({"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                       "single_word": t.single_word, "special": t.special}),
            );
        }
        c.insert("added_tokens_decoder".into(), serde_json::Value::Object(decoder));
        let template = match &self.chat {
            Some(t) => t.source.clone(),
            None => PLAIN_TEMPLATE.to_string(),
        };
        c.insert("chat_template".into(), json!(template));
        Ok(serde_json::to_string_pretty(&serde_json::Value::Object(c))? + "\n")
    }

    /// The files an HF tokenizer directory holds: (`tokenizer.json`, its text) and
    /// ([`CONFIG_FILE`], its text).
    pub fn hf_files(&self) -> Result<[(&'static str, String); 2]> {
        Ok([("tokenizer.json", self.tokenizer_json()?), (CONFIG_FILE, self.tokenizer_config_json()?)])
    }

    /// Writes `tokenizer.json` to `path` and `tokenizer_config.json` beside it, each through a
    /// temporary name (see [`Vocab::tokenizer_config_json`]).
    pub fn save(&self, path: &Path) -> Result<()> {
        let [(_, tokenizer), (config_name, config)] = self.hf_files()?;
        coa_schemas::stage::write_atomically(path, tokenizer.as_bytes())?;
        coa_schemas::stage::write_atomically(&path.with_file_name(config_name), config.as_bytes())
    }

    /// The ids the *base* vocabulary splits an added token's text into (its model and
    /// pre-tokenizer, no added tokens): `<code>` → `<`, `code`, `>`. A grown embedding row starts
    /// as the mean of these rows. None for an id that is not an added token.
    pub fn base_pieces(&self, id: u32) -> Result<Option<Vec<u32>>> {
        let decoder = self.tokenizer.get_added_vocabulary().get_added_tokens_decoder();
        let Some(t) = decoder.get(&id) else { return Ok(None) };
        let mut pre = PreTokenizedString::from(t.content.as_str());
        if let Some(p) = self.tokenizer.get_pre_tokenizer() {
            p.pre_tokenize(&mut pre).map_err(|e| anyhow!("pre-tokenizing {:?}: {e}", t.content))?;
        }
        let mut ids = Vec::new();
        for (word, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::None) {
            let toks = self.tokenizer.get_model().tokenize(word).map_err(|e| anyhow!("tokenizing {:?}: {e}", t.content))?;
            ids.extend(toks.iter().map(|t| t.id));
        }
        Ok(Some(ids))
    }

    /// Appends the ids of `text` (no BOS/EOS) to `out`: the same ids as
    /// `tokenizer.encode_fast(text, false)`. Fast path, for BPE vocabularies without a normalizer
    /// whose added tokens are all plain special tokens (Qwen2, Llama 3, trained): split at special
    /// tokens (leftmost-longest, as the tokenizer does), run the tokenizer's own pre-tokenizer, and
    /// map each word to ids through a per-thread word cache, falling back to the tokenizer's BPE
    /// model on a miss. Anything else goes through `encode_fast`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if !self.fast {
            let enc = self.tokenizer.encode_fast(text, false).map_err(|e| anyhow!("{e}"))?;
            out.extend_from_slice(enc.get_ids());
            return Ok(());
        }
        let bytes = text.as_bytes();
        let (mut start, mut i) = (0, 0);
        while i < bytes.len() {
            if self.first_bytes[bytes[i] as usize] {
                if let Some((t, id)) = self.by_length.iter().find(|(t, _)| bytes[i..].starts_with(t.as_bytes())) {
                    self.encode_words(&text[start..i], out)?;
                    out.push(*id);
                    i += t.len();
                    start = i;
                    continue;
                }
            }
            i += 1;
        }
        self.encode_words(&text[start..], out)
    }

    fn encode_words(&self, piece: &str, out: &mut Vec<u32>) -> Result<()> {
        if piece.is_empty() {
            return Ok(());
        }
        let mut pre = PreTokenizedString::from(piece);
        if let Some(p) = self.tokenizer.get_pre_tokenizer() {
            p.pre_tokenize(&mut pre).map_err(|e| anyhow!("pre-tokenizing: {e}"))?;
        }
        let model = self.tokenizer.get_model();
        WORDS.with(|cache| -> Result<()> {
            let mut cache = cache.borrow_mut();
            if cache.generation != self.generation || cache.map.len() >= WORD_CACHE_MAX {
                cache.map.clear();
                cache.generation = self.generation;
            }
            for (word, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::None) {
                if let Some(ids) = cache.map.get(word) {
                    out.extend_from_slice(ids);
                    continue;
                }
                let ids: Vec<u32> = model.tokenize(word).map_err(|e| anyhow!("tokenizing: {e}"))?.iter().map(|t| t.id).collect();
                out.extend_from_slice(&ids);
                cache.map.insert(word.to_string(), ids);
            }
            Ok(())
        })
    }

    /// Vocabulary size including added tokens.
    pub fn size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Embedding rows a model needs for this vocabulary: one more than its largest id.
    pub fn rows_needed(&self) -> usize {
        self.tokenizer.get_vocab(true).values().map(|&id| id as usize + 1).max().unwrap_or(0)
    }

    /// The BOS, EOS and pad ids a checkpoint's `config.json` and `generation_config.json` carry:
    /// BOS = the layout's (or the config's `bos_token`), EOS = the layout's, pad = the config's
    /// `pad_token`, else EOS.
    pub fn special_ids(&self) -> (Option<u32>, Option<u32>, Option<u32>) {
        let id = |key: &str| config_token(&self.config, key).and_then(|t| self.tokenizer.token_to_id(&t));
        let bos = self.bos.first().copied().or_else(|| id("bos_token"));
        (bos, self.eos, id("pad_token").or(self.eos))
    }

    /// Whether `s` starts with a special added token.
    pub fn starts_with_special(&self, s: &str) -> bool {
        self.specials.iter().any(|t| s.starts_with(t.as_str()))
    }

    /// Whether `s` ends with a special added token.
    pub fn ends_with_special(&self, s: &str) -> bool {
        self.specials.iter().any(|t| s.ends_with(t.as_str()))
    }
}

fn id_of(tokenizer: &Tokenizer, source: &str, token: &str, what: &str) -> Result<u32> {
    tokenizer.token_to_id(token).ok_or_else(|| anyhow!("{source}: {what} token `{token}` is not in the vocabulary"))
}

/// The ids the post-processor puts before a single sequence (e.g. Llama's BOS).
fn post_processor_prefix(tokenizer: &Tokenizer) -> Result<Vec<u32>> {
    let probe = "a";
    let plain = tokenizer.encode_fast(probe, false).map_err(|e| anyhow!("encoding a probe: {e}"))?;
    let with = tokenizer.encode_fast(probe, true).map_err(|e| anyhow!("encoding a probe: {e}"))?;
    let (plain, with) = (plain.get_ids(), with.get_ids());
    match (0..=with.len().saturating_sub(plain.len())).find(|&i| with[i..].starts_with(plain)) {
        Some(i) => Ok(with[..i].to_vec()),
        None => bail!("its post-processor changes the tokens of a sequence (not only adds special tokens around it): pass --bos explicitly"),
    }
}

/// Whether a Metaspace pre-tokenizer is part of `p`.
fn has_metaspace(p: &PreTokenizerWrapper) -> bool {
    match p {
        PreTokenizerWrapper::Metaspace(_) => true,
        PreTokenizerWrapper::Sequence(s) => s.as_ref().iter().any(has_metaspace),
        _ => false,
    }
}

/// Fits a model to a tokenizer. When the tokenizer has ids past the model's rows (a pretrained
/// model and its tokenizer with the CoA tags added) and `can_grow`, the vocabulary grows (see
/// [`coa_model::Model::grow_vocab`]: each new row the mean of the rows of the token's base
/// pieces) and `Ok(true)` is returned; without `can_grow` that is an error. A model with more rows
/// than the tokenizer has ids (padded vocabularies) is left as it is.
pub fn fit_model(model: &mut coa_model::Model, vocab: &Vocab, can_grow: bool) -> Result<bool> {
    let need = vocab.rows_needed();
    let have = model.config.vocab_size;
    if need <= have {
        return Ok(false);
    }
    if !can_grow {
        bail!("tokenizer {} has {need} ids but the model's vocab_size is {have} (only a run started with --init grows the vocabulary: a resume keeps it, and a config for a fresh model must say vocab_size {need})", vocab.source);
    }
    let mut pieces = |id: u32| -> Result<Vec<u32>> {
        vocab.base_pieces(id)?.with_context(|| format!("tokenizer {}: id {id} is past the model's {have} rows but is not an added token", vocab.source))
    };
    model.grow_vocab(need, &mut pieces).with_context(|| format!("growing the vocabulary to tokenizer {}", vocab.source))?;
    Ok(true)
}

/// The HF tokenizer config file name (beside `tokenizer.json`).
pub const CONFIG_FILE: &str = "tokenizer_config.json";

/// Which chat template the layout renders the prompt with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateChoice {
    /// The tokenizer's own template, if it has one (else the plain layout).
    Auto,
    /// The plain layout (`[BOS] prompt "\n" text [EOS]`).
    None,
    /// The Jinja template in this file.
    File(std::path::PathBuf),
}

impl std::str::FromStr for TemplateChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "auto" => TemplateChoice::Auto,
            "none" => TemplateChoice::None,
            "" => return Err("empty path (use `none` for no template)".into()),
            f => TemplateChoice::File(f.into()),
        })
    }
}

/// How the vocabulary lays a sequence out: `--chat-template`, `--bos`, `--eos`, defined once for
/// the stages that tokenize (coa-tokenize) and the ones that must lay prompts out as the model was
/// trained (coa-generate policy, coa-serve).
#[derive(clap::Args, Debug, Clone)]
pub struct LayoutArgs {
    /// Render the prompt with a chat template: `auto` (the tokenizer's own, when it has one: for a
    /// checkpoint, the layout it was trained with), `none` (the plain layout
    /// `[BOS] prompt "\n" text [EOS]`), or a Jinja template FILE.
    #[arg(long, value_name = "auto|none|FILE", default_value = "auto")]
    pub chat_template: TemplateChoice,
    /// Token(s) before the prompt: `auto` (what the tokenizer's post-processor prepends, e.g.
    /// Llama's BOS; nothing for Qwen2 and trained vocabularies), `none`, or a token.
    #[arg(long, value_name = "auto|none|TOKEN", default_value = "auto")]
    pub bos: SpecialChoice,
    /// Token after the text, a target: `auto` (tokenizer_config.json's eos_token beside the file,
    /// else <|endoftext|>, <|end_of_text|> or </s>), `none`, or a token. Trained: <|endoftext|>.
    #[arg(long, value_name = "auto|none|TOKEN", default_value = "auto")]
    pub eos: SpecialChoice,
}

/// A tag as an added token: one id, matched on the raw text, kept by `skip_special_tokens`.
fn tag_token(tag: &str) -> AddedToken {
    AddedToken::from(tag, false).normalized(false)
}

/// The `tokenizer_config.json` beside `tokenizer_json` (empty when there is none) and its chat
/// template: `chat_template` as a string, the `default` of a list of named templates, or a
/// `chat_template.jinja` file beside it (transformers 5 writes the template there).
fn read_tokenizer_config(tokenizer_json: &Path) -> Result<(serde_json::Map<String, serde_json::Value>, Option<String>)> {
    let path = tokenizer_json.with_file_name(CONFIG_FILE);
    let config = match std::fs::read_to_string(&path) {
        Ok(text) => match serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))? {
            serde_json::Value::Object(m) => m,
            _ => bail!("{}: expected a JSON object", path.display()),
        },
        Err(_) => serde_json::Map::new(),
    };
    let template = match config.get("chat_template") {
        Some(serde_json::Value::String(t)) => Some(t.clone()),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_string),
        _ => None,
    };
    let template = match template {
        Some(t) => Some(t),
        None => std::fs::read_to_string(tokenizer_json.with_file_name("chat_template.jinja")).ok(),
    };
    Ok((config, template))
}

/// A token field of a tokenizer config (`"eos_token": "</s>"` or `{"content": "</s>", ...}`).
fn config_token(config: &serde_json::Map<String, serde_json::Value>, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        v => v.get("content").and_then(|c| c.as_str()).map(str::to_string),
    }
}

/// The pieces of `text` between occurrences of `specials` (empty pieces left out).
pub fn split_at_specials<'a>(text: &'a str, specials: &[&str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < bytes.len() {
        if bytes[i] == b'<' {
            if let Some(s) = specials.iter().find(|s| text[i..].starts_with(**s)) {
                if start < i {
                    out.push(&text[start..i]);
                }
                i += s.len();
                start = i;
                continue;
            }
        }
        i += 1;
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

