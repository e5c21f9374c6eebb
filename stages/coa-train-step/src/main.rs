//! `coa-train-step`: optimizer steps on the `tokens` table (SFT), CPU or GPU, with HF checkpoints and
//! exact resume. The logic lives in the library (`coa_train_step::{data, train, optim, ...}`);
//! this binary parses flags and calls the library's commands: training and `merge-lora`
//! (`coa_train_step::cli`, which resolves the flags against a checkpoint on `--resume` and writes
//! the `metrics` table, the checkpoint and the plot) and `plot` (`coa_train_step::plot::command`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use coa_schemas::stage;

use coa_train_step::cli::{run_merge, run_train, MergeArgs, TrainArgs};
use coa_train_step::plot::command::{self as plot, PlotArgs};

#[derive(Parser)]
#[command(
    name = "coa-train-step",
    version,
    args_conflicts_with_subcommands = true,
    args_override_self = true,
    about = "Train a Llama/Qwen2 model on the `tokens` table (SFT) on the CPU or a CUDA GPU; writes `metrics` rows and HF checkpoints",
    long_about = "Train a Llama/Qwen2 model on the `tokens` table (--objective sft) on the CPU (or a CUDA GPU: --device), writing one `metrics` row per \
optimizer step (step, loss, lr, grad_norm, tokens, tokens_per_s) to stdout or -o, and a checkpoint directory with --save.\n\n\
Loss: masked mean cross-entropy, the token mean over the whole step (all micro-batches); `loss_mask[t] = 1` marks token t \
as a target, and a token at a sequence or packed-segment start is never a target. Optimizer: AdamW with decoupled weight \
decay (none on 1-D tensors: RMSNorm weights and biases), linear warmup then cosine to --min-lr, gradients clipped to \
--grad-clip by their global norm (grad_norm reports the norm before clipping). tokens_per_s counts input tokens.\n\n\
Steps: a step takes shuffled rows while they fit in --batch-tokens; steps never straddle an epoch. --steps N (or --epochs E) \
is the length of the whole run and of its schedule; --stop-at-step S ends this invocation early (a resume continues).\n\n\
Checkpoints (--save DIR, every --save-every steps and at the end): config.json, model.safetensors (above --max-shard-size: \
model-0000I-of-0000N.safetensors with model.safetensors.index.json), generation_config.json \
(loadable by HF transformers), tokenizer.json when known, optimizer.safetensors (AdamW moments, f32) and trainer_state.json \
(step, data cursor, RNG state, schedule, settings). --resume DIR continues exactly: same data order and state; on the CPU \
the weights are bit-identical to an uninterrupted run's (on the GPU equal up to rounding: its attention backward adds with \
float atomics), and a run may resume on the other device (one checkpoint format). Settings not given on resume come from the checkpoint; given ones must match it (except \
--micro-batch-tokens, --threads and --device).",
    after_help = "Examples:\n  coa-tokenize -i coa_text.parquet --tokenizer tok.json | coa-train-step --init-config tiny --tokenizer tok.json \\\n      --steps 200 --batch-tokens 8192 --lr 1e-3 --save ckpt --plot loss.png -o metrics.parquet\n  \
coa-train-step -i tokens.parquet --resume ckpt --save ckpt -o more_metrics.parquet\n  \
coa-train-step -i tokens.parquet --init SmolLM2-135M-Instruct --tokenizer tok.json --epochs 1 --save ckpt \\\n      --save-gguf student.gguf --gguf-dtype q8_0 -o metrics.parquet\n  \
coa-train-step plot -i metrics.parquet -o loss.png"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Draw a curve of a `metrics` table (loss by default) as a PNG, or bar panels from JSON.
    Plot(PlotArgs),
    /// Merge a LoRA checkpoint's adapter into its base (W + alpha/r · B A) and write a plain HF
    /// checkpoint (config, weights, tokenizer) that transformers loads without peft.
    MergeLora(MergeArgs),
}

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let cli: Cli = coa_schemas::flags::parse();
    match cli.command {
        Some(Command::Plot(p)) => stage::main("coa-train-step plot", env!("CARGO_PKG_VERSION"), None, |s| plot::run(s, &p)),
        Some(Command::MergeLora(m)) => {
            stage::main("coa-train-step merge-lora", env!("CARGO_PKG_VERSION"), None, |_| run_merge(&m.input, &m.output, m.save_dtype.into()))
        }
        None => {
            stage::main("coa-train-step", env!("CARGO_PKG_VERSION"), cli.train.io.stats.clone(), |s| run_train(s, &cli.train))
        }
    }
}
