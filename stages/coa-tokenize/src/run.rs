//! The stage body: read `coa_text`, (train a vocabulary,) encode rows in parallel batch by batch,
//! apply the length policy and packing, write `tokens`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use arrow::array::AsArray;
use arrow::record_batch::RecordBatch;
use coa_schemas::flags::ThreadsArg;
use coa_schemas::shard::ShardSpec;
use coa_schemas::stage::{IoArgs, Stage};
use coa_schemas::tables::{COA_TEXT, TOKENS};
use coa_schemas::rows::Shown;
use rayon::prelude::*;
use serde_json::json;

use crate::encode::{check_spans, encode_joined, encode_row_untrained, Encoded};
use crate::pack::{apply_max_len, Fate, OutRow, Overlong, Packer};
use crate::table::{build_batch, InputBatch};
use crate::vocab::{LayoutArgs, Vocab};

/// The stage's own flags (the IO flags are [`IoArgs`]).
#[derive(Debug, Clone, clap::Args)]
pub struct TokenizeArgs {
    /// Load this tokenizer: an HF `tokenizer.json` (with the `tokenizer_config.json` beside it,
    /// if any), a directory holding them (an HF checkpoint), or a GGUF model file. The CoA tags
    /// are added as tokens where missing.
    #[arg(long, value_name = "FILE|DIR|GGUF", conflicts_with = "train_bpe", required_unless_present = "train_bpe")]
    pub tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE on the input (prompt and text) first, then tokenize with it
    /// (needs --save-tokenizer).
    #[arg(long, requires = "save_tokenizer")]
    pub train_bpe: bool,
    /// Vocabulary size of --train-bpe, special tokens included.
    #[arg(long, value_name = "N", default_value_t = 8192)]
    pub vocab_size: usize,
    /// Minimum pair count for a BPE merge (--train-bpe).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub min_frequency: u64,
    /// Write the tokenizer used (trained, or loaded with the tags added) as a tokenizer.json,
    /// with the tokenizer_config.json HF tools read beside it (special tokens, chat template).
    #[arg(long, value_name = "FILE")]
    pub save_tokenizer: Option<PathBuf>,
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// Maximum tokens per sequence (and per packed row).
    #[arg(long, value_name = "N")]
    pub max_len: Option<usize>,
    /// What to do with a sequence longer than --max-len.
    #[arg(long, value_enum, default_value_t = Overlong::Drop)]
    pub overlong: Overlong,
    /// Pack sequences greedily (first fit) into rows of at most --max-len tokens, with segment ids.
    #[arg(long, requires = "max_len")]
    pub pack: bool,
    /// Open rows the packer keeps before emitting the oldest (bigger: fuller rows, more memory).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub pack_window: usize,
    /// Keep retracted steps out of the loss as well: a tool call (with the think right before it)
    /// that the first reflection after its observation grades `trajectory_monitoring` Fair or
    /// Poor, such as a teacher's buggy first program before the fix. The student then learns the
    /// recovery (the reflection and the corrected call stay targets) but not the misstep. The text
    /// must parse as CoA; the tokens are the same, only the mask changes.
    #[arg(long)]
    pub mask_retracted: bool,
    /// Also encode each joined `prompt\ntext` in one piece and count rows whose ids differ
    /// (`joined_mismatch` in the summary). Twice the work; for checking a new tokenizer.
    #[arg(long)]
    pub verify_joined: bool,
    #[command(flatten)]
    pub threads: ThreadsArg,
}

struct RowResult {
    enc: Encoded,
    /// Retracted steps masked (--mask-retracted).
    retracted: u64,
    joined_differs: bool,
}

#[derive(Default)]
struct Counts {
    tokens: u64,
    targets: u64,
    dropped: u64,
    truncated: u64,
    unaligned: u64,
    joined_mismatch: u64,
    retracted_steps: u64,
    retracted_tokens: u64,
}

/// Runs the stage.
pub fn run(stage: &mut Stage, args: &TokenizeArgs, io: &IoArgs, shard: Option<ShardSpec>) -> Result<()> {
    args.threads.install()?;
    if args.max_len == Some(0) {
        bail!("--max-len must be at least 1");
    }
    if let Some(spec) = shard {
        // Both look at every row at once: a shard would train its own vocabulary, or pack its own rows.
        if args.train_bpe {
            bail!("--shard {spec} with --train-bpe: the vocabulary is trained on the whole input; train it once (unsharded, --save-tokenizer FILE) and shard with --tokenizer FILE");
        }
        if args.pack {
            bail!("--shard {spec} with --pack: packing fills rows across tasks; tokenize the shards without --pack and pack the merged tokens unsharded");
        }
    }
    let started = Instant::now();
    let reader = stage.open(io.input.as_deref(), &COA_TEXT)?;
    let mut reader = stage.shard(reader, shard)?;
    let source = reader.source().to_string();

    let mut held: Vec<RecordBatch> = Vec::new();
    let vocab = if args.train_bpe {
        for batch in &mut reader {
            held.push(batch?);
        }
        let texts = held.iter().flat_map(|b| {
            let (p, t) = (b.column_by_name("prompt"), b.column_by_name("text"));
            let (p, t) = (p.expect("checked schema").as_string::<i32>(), t.expect("checked schema").as_string::<i32>());
            (0..b.num_rows()).flat_map(move |i| [p.value(i), t.value(i)])
        });
        let v = Vocab::train(texts, args.vocab_size, args.min_frequency)?;
        stage.note("train_seconds", round3(started.elapsed().as_secs_f64()));
        v
    } else {
        let path = args.tokenizer.as_deref().ok_or_else(|| anyhow!("pass --tokenizer FILE or --train-bpe"))?;
        stage.add_input_file(path);
        Vocab::load(path, &args.layout.bos, &args.layout.eos, &args.layout.chat_template)?
    };
    // Written now (a bad path fails before the rows are encoded); inside a stage the files are
    // committed with the tokens, when the stage succeeds.
    if let Some(path) = args.save_tokenizer.as_deref() {
        vocab.save(path)?;
    }

    let schema = TOKENS.schema();
    let mut writer = stage.create(io.output.as_deref(), io.format, &schema)?;
    let batches: Box<dyn Iterator<Item = Result<RecordBatch>>> =
        if args.train_bpe { Box::new(held.into_iter().map(Ok)) } else { Box::new(reader) };

    let mut packer = args.pack.then(|| Packer::new(args.max_len.expect("--pack requires --max-len"), args.pack_window));
    let mut counts = Counts::default();
    let mut row0: u64 = 0;
    let mut out: Vec<OutRow> = Vec::new();
    let bar = stage.progress(None, "rows");
    for batch in batches {
        let batch = batch?;
        let input = InputBatch::new(&batch, &source)?;
        let results: Vec<Result<RowResult, String>> = (0..input.len())
            .into_par_iter()
            .map(|i| {
                let (starts, ends) = input.spans(i);
                let (prompt, text) = (input.prompt.value(i), input.text.value(i));
                let n_chars = if text.is_ascii() { text.len() } else { text.chars().count() };
                check_spans(starts, ends, n_chars)?;
                let retracted = if args.mask_retracted {
                    let segments = coa_format::parse(text).map_err(|e| format!("--mask-retracted: `text` is not CoA text: {e}"))?;
                    coa_format::retracted_steps(&segments)
                } else {
                    Vec::new()
                };
                let enc = encode_row_untrained(&vocab, prompt, text, starts, ends, &retracted)?;
                let joined_differs = args.verify_joined && encode_joined(&vocab, prompt, text)? != enc.ids;
                Ok(RowResult { enc, retracted: retracted.len() as u64, joined_differs })
            })
            .collect();
        for (i, r) in results.into_iter().enumerate() {
            let r = r.map_err(|msg| anyhow!("{source}: row {} (task_id {}): {msg}", row0 + i as u64, Shown(input.task_id.value(i))))?;
            counts.unaligned += u64::from(!r.enc.aligned);
            counts.joined_mismatch += u64::from(r.joined_differs);
            if r.retracted > 0 {
                counts.retracted_steps += r.retracted;
                // Text tokens outside observations that are not targets (EOS is always one).
                let obs: u32 = r.enc.observations.iter().map(|(a, b)| b - a).sum();
                counts.retracted_tokens += (r.enc.len() - r.enc.prompt_len as usize - obs as usize - r.enc.targets()) as u64;
            }
            let enc = match apply_max_len(r.enc, args.max_len, args.overlong) {
                Fate::Keep(e) => e,
                Fate::Truncated(e) => {
                    counts.truncated += 1;
                    e
                }
                Fate::Dropped => {
                    counts.dropped += 1;
                    continue;
                }
            };
            let task_id = input.task_id.value(i);
            match packer.as_mut() {
                Some(p) => p.push(task_id, enc, &mut out),
                None => out.push(OutRow::single(task_id.to_string(), enc)),
            }
        }
        row0 += input.len() as u64;
        stage.add_rows_in(input.len() as u64);
        bar.inc(input.len() as u64);
        write_rows(stage, &mut writer, &schema, &mut out, &mut counts)?;
    }
    if let Some(p) = packer.as_mut() {
        p.finish(&mut out);
        write_rows(stage, &mut writer, &schema, &mut out, &mut counts)?;
    }
    writer.finish()?;
    bar.finish_and_clear();

    let secs = started.elapsed().as_secs_f64();
    stage.note("tokenizer", vocab.source.clone());
    stage.note("vocab_size", vocab.size());
    stage.note("tags_added", vocab.tags_added);
    stage.note("bos", json!(vocab.bos));
    stage.note("chat_template", vocab.chat.is_some());
    stage.note("eos", json!(vocab.eos));
    stage.note("tokens", counts.tokens);
    stage.note("targets", counts.targets);
    stage.note("dropped_overlong", counts.dropped);
    stage.note("truncated", counts.truncated);
    if let Some(max) = args.max_len {
        if counts.dropped > 0 {
            stage.headline(match args.overlong {
                Overlong::Drop => format!("dropped {} rows longer than --max-len {max} (--overlong truncate cuts them instead)", counts.dropped),
                Overlong::Truncate => format!("dropped {} rows left without a target when cut to --max-len {max}", counts.dropped),
            });
        }
        if counts.truncated > 0 {
            stage.headline(format!("cut {} rows to --max-len {max}", counts.truncated));
        }
    }
    stage.note("rows_unaligned", counts.unaligned);
    if args.verify_joined {
        stage.note("joined_mismatch", counts.joined_mismatch);
    }
    if args.mask_retracted {
        stage.note("retracted_steps", counts.retracted_steps);
        stage.note("retracted_tokens", counts.retracted_tokens);
    }
    if let Some(p) = &packer {
        stage.note("packed_rows", p.rows);
        stage.note("pack_fill", round3(p.fill()));
    }
    stage.note("tokens_per_s", (counts.tokens as f64 / secs.max(1e-9)).round());
    Ok(())
}

fn write_rows(
    stage: &mut Stage,
    writer: &mut coa_schemas::io::TableWriter,
    schema: &arrow::datatypes::SchemaRef,
    out: &mut Vec<OutRow>,
    counts: &mut Counts,
) -> Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    for r in out.iter() {
        counts.tokens += r.ids.len() as u64;
        counts.targets += r.mask.iter().map(|&m| m as u64).sum::<u64>();
    }
    let batch = build_batch(schema, out)?;
    writer.write(&batch)?;
    stage.add_rows_out(out.len() as u64);
    out.clear();
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
