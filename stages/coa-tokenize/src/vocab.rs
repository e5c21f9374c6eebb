//! The vocabulary: a HF `tokenizer.json` loaded from disk or a byte-level BPE trained offline on
//! the input, with every CoA tag registered as an added special token (one id each), and the
//! BOS/EOS ids the sequence layout uses.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
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
    /// Contents of every special added token (tags, EOS, …): used to tell whether a segment
    /// boundary falls on a token boundary of the joined text.
    pub specials: Vec<String>,
    /// Tags that were not special tokens of the loaded file and were added.
    pub tags_added: usize,
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
    /// Loads a `tokenizer.json`, adds the CoA tags as special tokens where missing, and resolves
    /// BOS / EOS. `auto` BOS = what the file's post-processor puts before a sequence; `auto` EOS =
    /// `eos_token` of a `tokenizer_config.json` next to the file, else the first of
    /// [`EOS_CANDIDATES`] in the vocabulary, else an error asking for `--eos`.
    pub fn load(path: &Path, bos: &SpecialChoice, eos: &SpecialChoice) -> Result<Vocab> {
        let tokenizer = Tokenizer::from_file(path).map_err(|e| anyhow!("{}: not a readable tokenizer.json: {e}", path.display()))?;
        let config_eos = if *eos == SpecialChoice::Auto { eos_from_config(path)? } else { None };
        Vocab::from_tokenizer(tokenizer, path.display().to_string(), bos, eos, config_eos)
    }

    fn from_tokenizer(mut tokenizer: Tokenizer, source: String, bos: &SpecialChoice, eos: &SpecialChoice, config_eos: Option<String>) -> Result<Vocab> {
        // Disable any padding / truncation the file asks for: lengths are this stage's policy.
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| anyhow!("{source}: {e}"))?;
        let tags = tag_strings();
        let before: usize = tags.iter().filter(|t| tokenizer.get_added_vocabulary().is_special_token(t)).count();
        let added: Vec<AddedToken> = tags.iter().map(|t| AddedToken::from(*t, true)).collect();
        tokenizer.add_special_tokens(added).map_err(|e| anyhow!("{source}: adding the CoA tags: {e}"))?;
        let tag_ids = tags
            .iter()
            .map(|t| tokenizer.token_to_id(t).ok_or_else(|| anyhow!("{source}: tag {t} has no id after adding it")))
            .collect::<Result<Vec<u32>>>()?;
        let distinct: HashSet<u32> = tag_ids.iter().copied().collect();
        if distinct.len() != tag_ids.len() {
            bail!("{source}: two CoA tags share one id");
        }
        let bos = match bos {
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
        let mut specials: Vec<String> = tokenizer
            .get_added_vocabulary()
            .get_added_tokens_decoder()
            .values()
            .filter(|t| t.special)
            .map(|t| t.content.clone())
            .collect();
        specials.sort();
        let added = tokenizer.get_added_vocabulary().get_added_tokens_decoder();
        let plain_specials = added.values().all(|t| t.special && !t.normalized && !t.lstrip && !t.rstrip && !t.single_word);
        let bpe = matches!(tokenizer.get_model(), ModelWrapper::BPE(m) if m.dropout.is_none());
        let fast = plain_specials && bpe && tokenizer.get_normalizer().is_none() && !tokenizer.get_encode_special_tokens();
        let mut by_length: Vec<(String, u32)> = added.iter().map(|(id, t)| (t.content.clone(), *id)).collect();
        by_length.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        let mut first_bytes = [false; 256];
        for (t, _) in &by_length {
            first_bytes[t.as_bytes()[0] as usize] = true;
        }
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        Ok(Vocab { tokenizer, bos, eos, tag_ids, specials, tags_added: tags.len() - before, source, fast, by_length, first_bytes, generation })
    }

    /// Trains a byte-level BPE of `vocab_size` ids (special tokens included) on `texts`. The
    /// special tokens come first: `<|endoftext|>` = 0, then the tags in [`tag_strings`] order.
    /// Tags are cut out of the training text (no merge ever spans a tag). Deterministic: the same
    /// texts give the same file.
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
        let bound = Split::new(SplitPattern::Regex(format!("(?s).{{1,{MAX_WORD_CHARS}}}")), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| anyhow!("pre-tokenizer word bound: {e}"))?;
        tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::Split(bound),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ]))));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        tokenizer.with_post_processor(Some(ByteLevel::new(false, false, false)));
        let trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(min_frequency)
            .show_progress(false)
            .special_tokens(specials.iter().map(|s| AddedToken::from(*s, true)).collect())
            .initial_alphabet(alphabet.into_iter().collect())
            .build();
        let mut trainer = TrainerWrapper::BpeTrainer(trainer);
        let pieces: Vec<&str> = texts.flat_map(|t| split_at_specials(t, &specials)).collect();
        tokenizer.train(&mut trainer, pieces.into_iter()).map_err(|e| anyhow!("training the BPE: {e}"))?;
        let source = format!("trained byte-level BPE ({vocab_size} ids requested)");
        Vocab::from_tokenizer(tokenizer, source, &SpecialChoice::None, &SpecialChoice::Token(ENDOFTEXT.into()), None)
    }

    /// Writes the tokenizer (with the tags) as `tokenizer.json` to `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.tokenizer.save(path, true).map_err(|e| anyhow!("writing {}: {e}", path.display()))
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

/// `eos_token` of the `tokenizer_config.json` beside `path`, if there is one.
fn eos_from_config(path: &Path) -> Result<Option<String>> {
    let config = path.with_file_name("tokenizer_config.json");
    let Ok(text) = std::fs::read_to_string(&config) else { return Ok(None) };
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
    Ok(match json.get("eos_token") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(v) => v.get("content").and_then(|c| c.as_str()).map(str::to_string),
        None => None,
    })
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
