//! `coa-tokenize`: Chain-of-Agents text (`coa_text`) → token ids with loss masks (`tokens`).
//!
//! - [`vocab`]: the HF `tokenizers` vocabulary (a loaded `tokenizer.json` or a byte-level BPE
//!   trained offline, or a GGUF's), CoA tags as added tokens, BOS/EOS, the HF tokenizer files.
//! - [`chat`]: chat templates (minijinja), and our plain layout as one.
//! - [`encode`]: the sequence layout and the loss mask from character offsets (segment-wise
//!   encoding; no token straddles a prompt or observation boundary).
//! - [`pack`]: the `--max-len` policy (drop or truncate outside observations) and first-fit packing.
//! - [`table`]: Arrow batches in and out.
//! - [`run`]: the stage body (flags, streaming, parallel encoding, summary).

pub mod chat;
pub mod encode;
pub mod pack;
pub mod run;
pub mod table;
pub mod vocab;

pub use chat::{ChatTemplate, PLAIN_TEMPLATE};
pub use encode::{check_spans, encode_joined, encode_row, encode_row_untrained, prompt_segment, Encoded, PROMPT_SEPARATOR};
pub use pack::{apply_max_len, Fate, OutRow, Overlong, Packer};
pub use run::{run, TokenizeArgs};
pub use vocab::{fit_model, tag_strings, LayoutArgs, SpecialChoice, TemplateChoice, Vocab, CONFIG_FILE, ENDOFTEXT, MAX_WORD_CHARS};
