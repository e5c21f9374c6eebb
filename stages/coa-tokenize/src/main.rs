//! `coa-tokenize`: CoA text (`coa_text`) → token ids with loss masks (`tokens`). The logic lives in
//! the `coa_tokenize` library; this binary parses flags.

use std::process::ExitCode;

use clap::Parser;
use coa_schemas::flags;
use coa_schemas::shard::ShardArgs;
use coa_schemas::stage::{self, IoArgs};
use coa_tokenize::TokenizeArgs;

#[derive(Parser)]
#[command(
    name = "coa-tokenize",
    version,
    about = "Tokenize CoA text (coa_text) into token ids with loss masks (tokens)",
    long_about = "Tokenize CoA text (coa_text) into token ids with loss masks (tokens).\n\n\
Vocabulary: --tokenizer FILE loads any HF tokenizer.json (Qwen/Llama style); --train-bpe trains a byte-level BPE of \
--vocab-size ids on the input's prompts and texts first (offline) and --save-tokenizer writes it. Either way every CoA \
tag (<think>, </think>, <plan>, ... <observation>, <answer>) is a special token with one id.\n\n\
Sequence (no chat template): [BOS] prompt \"\\n\" text [EOS]. BOS is what the tokenizer's post-processor prepends \
(none for Qwen2 and trained vocabularies); EOS is <|endoftext|> (trained) or the tokenizer's eos.\n\n\
Loss mask, from the character offsets of observation_spans (never from token patterns): 0 for BOS, prompt and \
separator and every observation span (its tags included), 1 for everything else the model writes, EOS included; \
--mask-retracted also masks the steps the trajectory's own reflections retract (a buggy program before its fix). \
The sequence is encoded segment by segment, cut at the prompt/text boundary and at every span boundary, so no token \
straddles a boundary; for coa-convert output every boundary touches a tag and the ids equal the encoding of the joined \
string (--verify-joined checks it).\n\n\
--max-len N: a longer sequence is dropped and counted (default), or with --overlong truncate cut at the last token \
boundary <= N that is not inside an observation (dropped if no target is left). --pack packs sequences first-fit \
into rows of at most N tokens with segment_ids 0,1,2,...\n\n\
A bad row (span end < start, span out of range, overlapping spans) is an error naming the input, row, task_id and \
span; nothing is written.",
    after_help = "Examples:\n  coa-tokenize -i coa_text.parquet --train-bpe --vocab-size 8192 --save-tokenizer tok/tokenizer.json -o tokens.parquet\n  \
coa-tokenize -i coa_text.parquet --tokenizer Qwen2.5-0.5B/tokenizer.json --max-len 4096 --overlong truncate -o tokens.parquet\n  \
coa-convert -i trajectories.parquet | coa-tokenize --tokenizer tok/tokenizer.json --max-len 2048 --pack -o packed.parquet"
)]
struct Cli {
    #[command(flatten)]
    args: TokenizeArgs,
    #[command(flatten)]
    shard: ShardArgs,
    #[command(flatten)]
    io: IoArgs,
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = flags::parse();
    stage::main("coa-tokenize", env!("CARGO_PKG_VERSION"), cli.io.stats.clone(), |s| {
        let [out, stats] = cli.io.outputs();
        s.outputs(&[out, stats, ("--save-tokenizer", cli.args.save_tokenizer.as_deref())])?;
        // Neither changes the tokens: --verify-joined only adds a count to the summary.
        s.not_recorded(&["--threads"]);
        s.not_recorded_switches(&["--verify-joined"]);
        coa_tokenize::run(s, &cli.args, &cli.io, cli.shard.shard)
    })
}
