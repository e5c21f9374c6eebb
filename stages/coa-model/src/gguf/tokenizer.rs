//! The tokenizer a GGUF file describes (`tokenizer.ggml.*`), built as an HF `tokenizers` object
//! that encodes exactly as the `tokenizer.json` HF transformers derives from the same file
//! (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, transformers 5.23:
//! `integrations/gguf/gguf_tokenizer_mapping.py` and the tokenizer class it hands the vocabulary
//! to). Two kinds of vocabulary, by `tokenizer.ggml.model`:
//!
//! **"gpt2", byte-level BPE** (Llama 3, Qwen2, SmolLM; `GPT2Tokenizer`):
//!
//! 1. Vocabulary: `tokenizer.ggml.tokens` in id order. A token with a character outside the
//!    256-character byte-level alphabet is respelled byte by byte (its UTF-8 bytes through the
//!    alphabet). Ids are a map from spelling: a spelling seen twice keeps its last id.
//! 2. Model: byte-level BPE with `tokenizer.ggml.merges` ("a b" pairs), no unknown token, no dropout,
//!    empty subword prefix and suffix.
//! 3. Pre-tokenizer: for a `tokenizer.ggml.pre` transformers knows (llama3, qwen2, gpt-4o, ...)
//!    the model's split regex then a byte-level mapping without its own regex; otherwise plain
//!    byte-level with the GPT-2 regex, no prefix space. Decoder: byte-level.
//! 4. Default special token: `<|endoftext|>` (GPT2Tokenizer's unknown/BOS/EOS, so it is added even
//!    to a vocabulary without it, with the next free id: HF's behaviour, kept).
//!
//! **"llama", SentencePiece BPE** (Llama 2, Mistral, Gemma, Phi-3; [`SentencePiece`]):
//!
//! 1. Vocabulary: the tokens as spelled (`▁` for a space), byte-fallback tokens `<0x00>`...
//!    Gemma's tokens made only of whitespace with a space in them are respelled as that many `▁`.
//! 2. Merges: `tokenizer.ggml.merges` when the file has them, else rebuilt from the vocabulary as
//!    transformers' `generate_merges` does ([`merges_from_scores`]): every split of a token into
//!    two tokens, ranked by the token's score (`tokenizer.ggml.scores`; Gemma: minus its position).
//! 3. Model: BPE with byte fallback and fused unknowns (Gemma: unknown token `<unk>`).
//! 4. Normalizer, pre-tokenizer, decoder of the tokenizer class: Llama's `Metaspace` (prefix `▁`
//!    on the first piece), Gemma's spaces replaced by `▁`, Phi-3's prepend-and-replace normalizer.
//! 5. Default special tokens of that class (`<s>`, `</s>`, `<unk>`; Gemma's `<bos>`, `<eos>`,
//!    `<unk>`, `<pad>`, `<mask>`), added like GPT-2's above; BOS added by default.
//!
//! Then, for both: every CONTROL token (type 3) as a special token (for byte-level vocabularies
//! only those spelled in the byte alphabet); every USER_DEFINED token (type 4) already in the
//! vocabulary as a plain (non-special) added token; the BOS, EOS, UNK and PAD tokens as special
//! tokens unless already added; a post-processor putting BOS before and/or EOS after each
//! sequence as `tokenizer.ggml.add_bos_token` and `add_eos_token` say. Other models (T5's
//! unigram, "gemma4") are refused with a message naming them.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::file::{GgufFile, Value};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// The token GPT2Tokenizer uses for unknown, BOS and EOS by default.
const GPT2_DEFAULT_SPECIAL: &str = "<|endoftext|>";

/// One special token: its id and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    pub id: u32,
    pub content: String,
}

/// The special tokens a GGUF names, and whether the tokenizer adds BOS / EOS itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<SpecialToken>,
    pub eos: Option<SpecialToken>,
    pub pad: Option<SpecialToken>,
    pub unk: Option<SpecialToken>,
    /// `tokenizer.ggml.add_bos_token` (default false): the post-processor puts BOS first.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token` (default false): the post-processor puts EOS last.
    pub add_eos: bool,
}

/// The tokenizer of a GGUF file, with what a chat-formatted prompt needs.
#[derive(Clone, Debug)]
pub struct GgufTokenizer {
    pub tokenizer: Tokenizer,
    pub specials: SpecialTokens,
    /// `tokenizer.chat_template` (Jinja), when the file has one.
    pub chat_template: Option<String>,
}

/// The pre-tokenizer split regex of each `tokenizer.ggml.pre` that transformers
/// (`GGUF_PRE_TOKENIZER_SPLITS`) gives one; any other name keeps GPT-2's byte-level regex.
pub(crate) fn split_regex(pre: &str) -> Option<&'static str> {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3,
        "tekken" => TEKKEN,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2,
        "qwen35" => QWEN35,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O,
        _ => return None,
    })
}

/// GPT-2's byte → character table (`bytes_to_unicode`): printable bytes stand for themselves,
/// the others (controls, space, ...) for the characters from U+0100 on, in byte order.
fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are chars");
            next += 1;
            c
        };
    }
    table
}

/// The tokenizer class transformers builds a SentencePiece ("llama") vocabulary with, by
/// `general.architecture` (`GGUF_SENTENCEPIECE_BUILDERS`; any other: `LlamaTokenizer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SentencePiece {
    Llama,
    Gemma,
    Phi3,
}

impl SentencePiece {
    pub fn of(architecture: &str) -> SentencePiece {
        match architecture {
            "gemma" | "gemma2" | "gemma3" => SentencePiece::Gemma,
            "phi3" => SentencePiece::Phi3,
            _ => SentencePiece::Llama,
        }
    }

    /// The class's own special tokens, in the order it adds them (bos, eos, unk, pad, mask).
    fn default_specials(self) -> &'static [&'static str] {
        match self {
            SentencePiece::Gemma => &["<bos>", "<eos>", "<unk>", "<pad>", "<mask>"],
            SentencePiece::Llama | SentencePiece::Phi3 => &["<s>", "</s>", "<unk>"],
        }
    }
}

/// The tokenizer, special tokens and chat template of `file`.
pub fn from_gguf(file: &GgufFile) -> Result<GgufTokenizer> {
    let path = file.path().display();
    let model = file
        .get_str("tokenizer.ggml.model")?
        .with_context(|| format!("{path}: metadata `tokenizer.ggml.model` is missing: the file has no tokenizer"))?;
    let tokens = string_array(file, "tokenizer.ggml.tokens")?
        .with_context(|| format!("{path}: metadata `tokenizer.ggml.tokens` is missing"))?;
    let token_types: Vec<i64> = match file.get_array("tokenizer.ggml.token_type")? {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_i64().with_context(|| {
                    format!(
                        "{path}: metadata `tokenizer.ggml.token_type` element {i} is {}, expected an integer",
                        v.type_name()
                    )
                })
            })
            .collect::<Result<_>>()?,
    };
    let alphabet = ByteLevel::alphabet();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let (mut tokenizer, defaults, add_bos_default) = match model {
        "gpt2" => (byte_level_bpe(file, &tokens)?, &[GPT2_DEFAULT_SPECIAL][..], false),
        "llama" => {
            let kind = SentencePiece::of(file.get_str("general.architecture")?.unwrap_or(""));
            // transformers (and llama.cpp) add BOS to a SentencePiece vocabulary that does not say.
            (sentencepiece_bpe(file, &tokens, kind)?, kind.default_specials(), true)
        }
        other => bail!(
            "{path}: metadata `tokenizer.ggml.model` is {other:?}; only \"gpt2\" (byte-level BPE: Llama 3, Qwen2, SmolLM) and \"llama\" (SentencePiece BPE: Llama 2, Mistral, Gemma) are supported"
        ),
    };
    let byte_level = model == "gpt2";

    let token_of = |key: &str| -> Result<Option<SpecialToken>> {
        let Some(id) = file.get_u64(key)? else { return Ok(None) };
        match tokens.get(id as usize) {
            Some(t) => Ok(Some(SpecialToken { id: id as u32, content: t.to_string() })),
            None => {
                bail!("{path}: metadata `{key}` = {id} is not a token id (the vocabulary has {} tokens)", tokens.len())
            }
        }
    };
    let specials = SpecialTokens {
        bos: token_of("tokenizer.ggml.bos_token_id")?,
        eos: token_of("tokenizer.ggml.eos_token_id")?,
        pad: token_of("tokenizer.ggml.padding_token_id")?,
        unk: token_of("tokenizer.ggml.unknown_token_id")?,
        add_bos: file.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default),
        add_eos: file.get_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
    };

    let special = |t: &str| AddedToken::from(t, true).normalized(false);
    let add_special = |tk: &mut Tokenizer, added: Vec<AddedToken>| -> Result<()> {
        tk.add_special_tokens(added).map_err(|e| anyhow!("{path}: adding special tokens: {e}"))?;
        Ok(())
    };
    add_special(&mut tokenizer, defaults.iter().map(|t| special(t)).collect())?;
    // A type list shorter than the tokens covers only its prefix (transformers zips the two).
    let typed = |ty: i64| tokens.iter().zip(&token_types).filter(move |(_, t)| **t == ty).map(|(tok, _)| *tok);
    add_special(&mut tokenizer, typed(CONTROL).filter(|t| !byte_level || in_alphabet(t)).map(special).collect())?;
    let vocab_now = tokenizer.get_vocab(true);
    let user_defined: Vec<AddedToken> = typed(USER_DEFINED)
        .filter(|t| vocab_now.contains_key(*t))
        .map(|t| AddedToken::from(t, false).normalized(false))
        .collect();
    tokenizer.add_tokens(user_defined).map_err(|e| anyhow!("{path}: adding user-defined tokens: {e}"))?;
    let named: Vec<AddedToken> = [&specials.bos, &specials.eos, &specials.unk, &specials.pad]
        .into_iter()
        .flatten()
        .filter(|s| tokenizer.get_added_vocabulary().get_vocab().get(&s.content).is_none())
        .map(|s| special(&s.content))
        .collect();
    add_special(&mut tokenizer, named)?;

    let template = post_processor(&tokenizer, &specials)?;
    tokenizer.with_post_processor(Some(template));
    let chat_template = file.get_str("tokenizer.chat_template")?.map(str::to_string);
    Ok(GgufTokenizer { tokenizer, specials, chat_template })
}

/// The byte-level BPE of a "gpt2" vocabulary, before its added tokens.
fn byte_level_bpe(file: &GgufFile, tokens: &[&str]) -> Result<Tokenizer> {
    let path = file.path().display();
    let merges = string_array(file, "tokenizer.ggml.merges")?.with_context(|| {
        format!("{path}: metadata `tokenizer.ggml.merges` is missing (a byte-level BPE needs its merges)")
    })?;
    let spelling = byte_to_char();
    let alphabet = ByteLevel::alphabet();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        let key = if in_alphabet(t) { t.to_string() } else { t.bytes().map(|b| spelling[b as usize]).collect() };
        vocab.insert(key, id as u32);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, split_merges(file, &merges)?)
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix(String::new())
        .fuse_unk(false)
        .build()
        .map_err(|e| {
            anyhow!("{path}: building the BPE from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`: {e}")
        })?;
    let mut tokenizer = Tokenizer::new(bpe);

    let pre = file.get_str("tokenizer.ggml.pre")?;
    match pre.and_then(split_regex) {
        Some(regex) => {
            let split = Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| anyhow!("pre-tokenizer regex of {pre:?}: {e}"))?;
            tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Split(split),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
            ]))));
        }
        None => {
            tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        }
    }
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tokenizer)
}

/// `tokenizer.ggml.merges` ("a b") as pairs.
fn split_merges(file: &GgufFile, merges: &[&str]) -> Result<Vec<(String, String)>> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split(' ').collect::<Vec<_>>()[..] {
            [a, b] => Ok((a.to_string(), b.to_string())),
            _ => bail!(
                "{}: metadata `tokenizer.ggml.merges` element {i} is {m:?}; expected two tokens separated by one space",
                file.path().display()
            ),
        })
        .collect()
}

/// Python's `str.strip` whitespace: Unicode White_Space plus the separators U+001C..U+001F.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The SentencePiece BPE of a "llama" vocabulary as `kind`'s tokenizer class builds it, before
/// its added tokens.
fn sentencepiece_bpe(file: &GgufFile, tokens: &[&str], kind: SentencePiece) -> Result<Tokenizer> {
    let path = file.path().display();
    let spelled: Vec<String> = tokens
        .iter()
        .map(|t| match kind {
            // Gemma files store runs of spaces as spaces; its tokenizer looks them up as ▁s.
            SentencePiece::Gemma if t.contains(' ') && t.chars().all(py_space) => "\u{2581}".repeat(t.chars().count()),
            _ => t.to_string(),
        })
        .collect();
    let mut vocab = Vocab::with_capacity(spelled.len());
    for (id, t) in spelled.iter().enumerate() {
        vocab.insert(t.clone(), id as u32);
    }
    let merges = match string_array(file, "tokenizer.ggml.merges")? {
        Some(m) => split_merges(file, &m)?,
        None => {
            let scores: Vec<f64> = match kind {
                // Gemma's scores do not follow its merge order; its token order does.
                SentencePiece::Gemma => (0..spelled.len()).map(|i| -(i as f64)).collect(),
                _ => {
                    let a = file.get_array("tokenizer.ggml.scores")?.with_context(|| {
                        format!("{path}: metadata `tokenizer.ggml.scores` is missing (a SentencePiece vocabulary without `tokenizer.ggml.merges` needs them)")
                    })?;
                    a.iter()
                        .enumerate()
                        .map(|(i, v)| {
                            v.as_f64().with_context(|| {
                                format!("{path}: metadata `tokenizer.ggml.scores` element {i} is {}, expected a FLOAT32", v.type_name())
                            })
                        })
                        .collect::<Result<_>>()?
                }
            };
            merges_from_scores(&spelled, &vocab, &scores)
        }
    };
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges).fuse_unk(true).byte_fallback(true);
    if kind == SentencePiece::Gemma {
        bpe = bpe.unk_token("<unk>".into());
    }
    let bpe = bpe
        .build()
        .map_err(|e| anyhow!("{path}: building the SentencePiece BPE from `tokenizer.ggml.tokens`: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let replace = |from: &str, to: &str| Replace::new(from, to).expect("a plain string pattern");
    let decoders = |strip: bool| {
        let mut d = vec![
            DecoderWrapper::Replace(replace("\u{2581}", " ")),
            DecoderWrapper::ByteFallback(ByteFallback::new()),
            DecoderWrapper::Fuse(Fuse::new()),
        ];
        if strip {
            d.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
        }
        DecoderSequence::new(d)
    };
    match kind {
        SentencePiece::Llama => {
            tokenizer.with_pre_tokenizer(Some(Metaspace::new('\u{2581}', PrependScheme::First, false)));
            tokenizer.with_decoder(Some(decoders(true)));
        }
        SentencePiece::Phi3 => {
            tokenizer
                .with_normalizer(Some(tokenizers::normalizers::Sequence::new(vec![
                    NormalizerWrapper::Prepend(Prepend::new("\u{2581}".into())),
                    NormalizerWrapper::Replace(replace(" ", "\u{2581}")),
                ])))
                .map_err(|e| anyhow!("Phi-3's normalizer: {e}"))?;
            tokenizer.with_decoder(Some(decoders(true)));
        }
        SentencePiece::Gemma => {
            tokenizer.with_normalizer(Some(replace(" ", "\u{2581}"))).map_err(|e| anyhow!("Gemma's normalizer: {e}"))?;
            let split = Split::new(SplitPattern::String(" ".into()), SplitDelimiterBehavior::MergedWithPrevious, false)
                .map_err(|e| anyhow!("Gemma's pre-tokenizer: {e}"))?;
            tokenizer.with_pre_tokenizer(Some(split));
            tokenizer.with_decoder(Some(decoders(false)));
        }
    }
    Ok(tokenizer)
}

/// The merges a vocabulary implies (transformers' `generate_merges` with scores): for each
/// distinct token in order of first appearance, with the score of its last appearance, every
/// split into two tokens of the vocabulary, by the ids of the two; then all of them by score,
/// then the left and right piece's length in characters, highest first, ties kept in order.
pub fn merges_from_scores(tokens: &[String], vocab: &Vocab, scores: &[f64]) -> Vec<(String, String)> {
    let mut score_of: HashMap<&str, f64> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (t, &s) in tokens.iter().zip(scores) {
        if score_of.insert(t, s).is_none() {
            order.push(t);
        }
    }
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for t in order {
        let score = score_of[t];
        let mut local: Vec<(&str, &str, f64)> = t
            .char_indices()
            .skip(1)
            .map(|(i, _)| t.split_at(i))
            .filter(|(l, r)| vocab.contains_key(*l) && vocab.contains_key(*r))
            .map(|(l, r)| (l, r, score))
            .collect();
        local.sort_by_key(|(l, r, _)| (vocab[*l], vocab[*r]));
        merges.extend(local);
    }
    let key = |m: &(&str, &str, f64)| (m.2, m.0.chars().count(), m.1.chars().count());
    merges.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        kb.0.total_cmp(&ka.0).then(kb.1.cmp(&ka.1)).then(kb.2.cmp(&ka.2))
    });
    merges.into_iter().map(|(l, r, _)| (l.to_string(), r.to_string())).collect()
}

/// transformers' `update_post_processor`: `[BOS] $A [EOS]` for one sequence,
/// `[BOS] $A [EOS] [BOS] $B [EOS]` for a pair, each present only when asked for and named. The
/// ids are the tokenizer's own for those texts (as `convert_tokens_to_ids` gives them).
fn post_processor(tokenizer: &Tokenizer, s: &SpecialTokens) -> Result<TemplateProcessing> {
    let bos = s.bos.as_ref().filter(|_| s.add_bos);
    let eos = s.eos.as_ref().filter(|_| s.add_eos);
    let piece = |t: Option<&SpecialToken>, type_id: u32| t.map(|t| format!("{}:{type_id}", t.content));
    let join = |parts: Vec<Option<String>>| parts.into_iter().flatten().collect::<Vec<_>>().join(" ");
    let single = join(vec![piece(bos, 0), Some("$A:0".into()), piece(eos, 0)]);
    let pair = join(vec![
        piece(bos, 0),
        Some("$A:0".into()),
        piece(eos, 0),
        piece(bos, 1),
        Some("$B:1".into()),
        piece(eos, 1),
    ]);
    let mut tokens: Vec<(String, u32)> = Vec::new();
    for t in [bos, eos].into_iter().flatten() {
        if !tokens.iter().any(|(c, _)| c == &t.content) {
            tokens.push((t.content.clone(), tokenizer.token_to_id(&t.content).unwrap_or(t.id)));
        }
    }
    TemplateProcessing::builder()
        .try_single(single.as_str())
        .and_then(|b| b.try_pair(pair.as_str()))
        .map_err(|e| anyhow!("post-processor template: {e}"))?
        .special_tokens(tokens)
        .build()
        .map_err(|e| anyhow!("post-processor template: {e}"))
}

/// A metadata array of strings (e.g. the token list), borrowed.
fn string_array<'a>(file: &'a GgufFile, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(items) = file.get_array(key)? else { return Ok(None) };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(s.as_str()),
            other => bail!(
                "{}: metadata `{key}` element {i} is {}, expected a STRING",
                file.path().display(),
                other.type_name()
            ),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}
