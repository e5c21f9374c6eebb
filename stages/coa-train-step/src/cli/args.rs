//! The flags of `coa-train-step` ([`TrainArgs`]) and of `merge-lora` ([`MergeArgs`]), and the
//! checks of the flags that need no data.

use std::path::PathBuf;

use anyhow::{bail, Result};
use coa_kernels::DeviceArg;
use coa_model::gguf::GgufDtype;
use coa_model::SaveDtype;
use coa_schemas::flags::ThreadsArg;
use coa_schemas::stage::{IoArgs, Stage};
use coa_tokenize::SpecialChoice;

use crate::checkpoint;
use crate::tensorboard;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SaveDtypeArg {
    F32,
    Bf16,
}

impl From<SaveDtypeArg> for SaveDtype {
    fn from(a: SaveDtypeArg) -> SaveDtype {
        match a {
            SaveDtypeArg::F32 => SaveDtype::F32,
            SaveDtypeArg::Bf16 => SaveDtype::Bf16,
        }
    }
}

/// Training flags. Run settings are options so that a resume can tell given from defaulted.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// Objective: `sft` (masked mean cross-entropy on the `tokens` table) or `dapo` (the clipped
    /// token-level policy loss on the `scores` table of coa-score).
    #[arg(long, value_name = "NAME")]
    pub objective: Option<String>,
    /// DAPO: lower clip of the ratio (1 - clip_low).
    #[arg(long, value_name = "EPS", default_value_t = 0.2, value_parser = coa_schemas::flags::positive::<f32>)]
    pub clip_low: f32,
    /// DAPO: upper clip of the ratio (1 + clip_high; "clip-higher").
    #[arg(long, value_name = "EPS", default_value_t = 0.28, value_parser = coa_schemas::flags::positive::<f32>)]
    pub clip_high: f32,
    /// DAPO: weight of a KL(policy || reference) term (k3 estimator); needs --ref. 0: none.
    #[arg(long, value_name = "BETA", default_value_t = 0.0, value_parser = coa_schemas::flags::non_negative::<f32>)]
    pub kl_coef: f32,
    /// DAPO: the reference checkpoint of the KL term.
    #[arg(long = "ref", value_name = "DIR")]
    pub reference: Option<PathBuf>,
    /// Start from the weights of this HF checkpoint directory (fresh optimizer state).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["init_config", "resume"])]
    pub init: Option<PathBuf>,
    /// Start from a fresh model: preset `tiny` or `small`, or an HF config.json FILE.
    #[arg(long, value_name = "tiny|small|FILE", conflicts_with = "resume")]
    pub init_config: Option<String>,
    /// Vocabulary size of a preset model (default: from --tokenizer).
    #[arg(long, value_name = "N", value_parser = coa_schemas::flags::at_least_one::<usize>)]
    pub vocab_size: Option<usize>,
    /// The tokenizer the tokens were made with (a tokenizer.json as `coa-tokenize
    /// --save-tokenizer` writes it, with its tokenizer_config.json beside it, or a directory or
    /// GGUF file holding one). Saved into every checkpoint. When it has more tokens than the
    /// --init model (e.g. the CoA tags added to a pretrained tokenizer), the embedding and an
    /// untied head grow to its size, each new row the mean of the rows of the token's text as the
    /// base tokenizer splits it. Default: the one of --resume, or --init's own (an HF
    /// directory's tokenizer.json or the GGUF's) when the model has a row for each of its ids
    /// with the tags loading adds (a checkpoint this stage saved); a pretrained model's own
    /// tokenizer lacks the tags, so without --tokenizer its vocabulary is left as it is (a
    /// directory and a GGUF alike: the loss of plain text is transformers').
    #[arg(long, value_name = "FILE|DIR|GGUF")]
    pub tokenizer: Option<PathBuf>,
    /// The tokenizer's EOS token, as given to coa-tokenize: `auto` (tokenizer_config.json's
    /// eos_token beside it, a GGUF's EOS, else <|endoftext|>, <|end_of_text|> or </s>), `none`,
    /// or a token. A saved checkpoint's config.json and generation_config.json carry it.
    #[arg(long, value_name = "auto|none|TOKEN", default_value = "auto")]
    pub eos: SpecialChoice,
    /// Learning-rate factor of the embedding rows (and untied head rows) that --init grows for
    /// the tokenizer's new tokens (the CoA tags). Each starts at the mean of its base pieces, next
    /// to a common word's row (`<code>` beside `code`); a larger step on these rows alone tells
    /// the tag from the word within a short fine-tune. Default 1 (the base rate).
    #[arg(long, value_name = "M", value_parser = coa_schemas::flags::positive::<f64>)]
    pub new_token_lr_mult: Option<f64>,
    /// Train only the layers above the bottom N (a fresh run's choice, kept on resume): the
    /// backward pass stops above them, so a step of SmolLM2 (30 layers) with 20 frozen costs
    /// about half. The input embedding then gets no gradient (a tied head's rows still train
    /// as the head). CPU only. Default 0: every layer trains.
    #[arg(long, value_name = "N", value_parser = coa_schemas::flags::whole::<usize>)]
    pub freeze_layers: Option<usize>,
    /// What the linear layers' and the head's products multiply on the CPU (a fresh run's
    /// choice, kept on resume): `f32` (default, the reference), or `bf16`: both inputs rounded
    /// to bf16, f32 sums (PyTorch's CPU autocast to bf16), on AMX tiles on CPUs that have them
    /// (Intel Xeon since Sapphire Rapids: several times the f32 rate), else on the f32 kernel
    /// with rounded inputs (no faster). Weights, gradients, optimizer state, norms, attention
    /// and the loss stay f32.
    #[arg(long, value_name = "f32|bf16")]
    pub matmul: Option<coa_model::MatmulDtype>,
    /// LoRA: train rank-R adapters (PEFT's `r`) on the --lora-targets linear layers instead of
    /// the weights, which stay frozen (no gradient, no optimizer state). A fresh run's choice,
    /// kept on resume; checkpoints hold the base and the adapter in PEFT's layout
    /// (adapter_config.json, adapter_model.safetensors). --init of such a directory with
    /// --lora-rank trains its adapter further (its settings are the defaults); without, the
    /// merged model is fine-tuned. On the CPU and the GPU (--device cuda).
    #[arg(long, value_name = "R", value_parser = coa_schemas::flags::positive::<usize>)]
    pub lora_rank: Option<usize>,
    /// LoRA's `lora_alpha`: the adapter's output is scaled by alpha / r. Default 8 (PEFT's).
    #[arg(long, value_name = "A", value_parser = coa_schemas::flags::positive::<f64>)]
    pub lora_alpha: Option<f64>,
    /// LoRA's `lora_dropout`: dropout on the adapter's input, in training only (seeded by
    /// --seed, the step and the row). Default 0.
    #[arg(long, value_name = "P")]
    pub lora_dropout: Option<f64>,
    /// LoRA's `target_modules`: a comma-separated list of q_proj, k_proj, v_proj, o_proj,
    /// gate_proj, up_proj, down_proj, or `all-linear`. Default q_proj,v_proj (PEFT's for Llama).
    #[arg(long, value_name = "LIST")]
    pub lora_targets: Option<String>,
    /// Continue the run saved in this checkpoint directory exactly.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Write the checkpoint here (at the end, and every --save-every steps). May equal --resume.
    #[arg(long, value_name = "DIR")]
    pub save: Option<PathBuf>,
    /// Also save every N steps.
    #[arg(long, value_name = "N", value_parser = coa_schemas::flags::at_least_one::<u64>)]
    pub save_every: Option<u64>,
    /// dtype of model.safetensors: f32 (default) or bf16 (exact f32 masters then go into optimizer.safetensors).
    #[arg(long, value_enum, default_value = "f32")]
    pub save_dtype: SaveDtypeArg,
    /// Largest weights file of a checkpoint: bigger weights are split into
    /// model-0000I-of-0000N.safetensors files named by model.safetensors.index.json, as HF
    /// save_pretrained writes them (5GB: the Hub's usual shards; units KB/MB/GB, KiB/MiB/GiB).
    #[arg(long, value_name = "SIZE", default_value = "5GB", value_parser = coa_model::parse_size)]
    pub max_shard_size: u64,
    /// Also write the final weights as this GGUF file, with the tokenizer and its chat template
    /// (for llama.cpp, Ollama, LM Studio); needs --save. Checked before the first step.
    #[arg(long, value_name = "FILE", requires = "save")]
    pub save_gguf: Option<PathBuf>,
    /// Matrix dtype of --save-gguf (1-D tensors stay F32).
    #[arg(long, value_name = "F16|BF16|Q8_0|F32", default_value = "F16", requires = "save_gguf")]
    pub gguf_dtype: GgufDtype,
    /// Optimizer steps of the whole run (the schedule's length). Default: one epoch.
    #[arg(long, value_name = "N", conflicts_with = "epochs", value_parser = coa_schemas::flags::at_least_one::<u64>)]
    pub steps: Option<u64>,
    /// Length of the run in epochs over the input (fractions allowed), instead of --steps.
    #[arg(long, value_name = "E", value_parser = coa_schemas::flags::positive::<f64>)]
    pub epochs: Option<f64>,
    /// Stop this invocation once the run reaches step S (then --save; a --resume continues).
    #[arg(long, value_name = "S", value_parser = coa_schemas::flags::at_least_one::<u64>)]
    pub stop_at_step: Option<u64>,
    /// Tokens per optimizer step (rows are added while they fit; at least one row). Default 4096.
    #[arg(long, value_name = "N", value_parser = coa_schemas::flags::at_least_one::<usize>)]
    pub batch_tokens: Option<usize>,
    /// Tokens per micro-batch (rows computed concurrently); default: --batch-tokens. Does not change the update
    /// (on the GPU: one packed pass, and the size of its activation buffers; the update then changes only by rounding).
    #[arg(long, value_name = "N", value_parser = coa_schemas::flags::at_least_one::<usize>)]
    pub micro_batch_tokens: Option<usize>,
    /// Peak learning rate. Default 3e-4.
    #[arg(long, value_name = "LR", value_parser = coa_schemas::flags::positive::<f64>)]
    pub lr: Option<f64>,
    /// Final learning rate of the cosine decay. Default: --lr / 10.
    #[arg(long, value_name = "LR", value_parser = coa_schemas::flags::non_negative::<f64>)]
    pub min_lr: Option<f64>,
    /// Linear warmup steps. Default 0.
    #[arg(long, value_name = "N", value_parser = coa_schemas::flags::whole::<u64>)]
    pub warmup_steps: Option<u64>,
    /// Decoupled weight decay (matrices only). Default 0.01.
    #[arg(long, value_name = "W", value_parser = coa_schemas::flags::non_negative::<f64>)]
    pub weight_decay: Option<f64>,
    /// AdamW beta1. Default 0.9.
    #[arg(long, value_name = "B")]
    pub beta1: Option<f64>,
    /// AdamW beta2. Default 0.999.
    #[arg(long, value_name = "B")]
    pub beta2: Option<f64>,
    /// AdamW epsilon. Default 1e-8.
    #[arg(long, value_name = "E", value_parser = coa_schemas::flags::positive::<f64>)]
    pub eps: Option<f64>,
    /// Clip gradients to this global L2 norm (0: no clipping). Default 1.0.
    #[arg(long, value_name = "NORM", value_parser = coa_schemas::flags::non_negative::<f64>)]
    pub grad_clip: Option<f64>,
    /// Seed of the model init and the data shuffle. Default 0.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub device: DeviceArg,
    /// Compute every row alone. By default (CPU), rows of a micro-batch that begin with the same
    /// prompt (a suite's instruction, the G rollouts of a task) run as one sequence with the
    /// prompt computed once, and the other rows as one sequence of independent segments (larger
    /// matrix products): the same update up to float rounding, with less work.
    #[arg(long)]
    pub no_share_prompts: bool,
    #[command(flatten)]
    pub threads: ThreadsArg,
    /// Print a log line every K steps (default: about 20 lines per run).
    #[arg(long, value_name = "K", value_parser = coa_schemas::flags::at_least_one::<u64>)]
    pub log_every: Option<u64>,
    /// Write the loss curve (of the whole run, resumes included) as a PNG.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Also write every step's metrics (loss, lr, grad_norm, tokens/s; DAPO: reward, clip
    /// fraction, entropy, response length, ...) as TensorBoard scalars into DIR
    /// (`tensorboard --logdir DIR`). A resume adds a new event file beside the earlier ones.
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// More `tokens` tables, trained on together with -i (in this order; default: stdin).
    #[arg(value_name = "TOKENS")]
    pub inputs: Vec<PathBuf>,
    #[command(flatten)]
    pub io: IoArgs,
}

#[derive(clap::Args)]
pub struct MergeArgs {
    /// The adapter directory (a --lora-rank checkpoint, or a PEFT adapter whose
    /// base_model_name_or_path is a local model).
    #[arg(short = 'i', long, value_name = "DIR")]
    pub input: PathBuf,
    /// The merged checkpoint directory to write.
    #[arg(short = 'o', long, value_name = "DIR")]
    pub output: PathBuf,
    /// Storage dtype of the merged weights.
    #[arg(long, value_enum, default_value = "f32")]
    pub save_dtype: SaveDtypeArg,
}

/// Checks the output paths and the flags that need no data, and sets up the thread pool.
pub(super) fn check_flags(stage: &mut Stage, args: &TrainArgs) -> Result<()> {
    // Every output path is checked before any work (a --plot that is a directory used to fail
    // after the whole training).
    let [out, stats] = args.io.outputs();
    stage.outputs(&[out, stats, ("--plot", args.plot.as_deref()), ("--save-gguf", args.save_gguf.as_deref())])?;
    if let Some(dir) = &args.tensorboard {
        tensorboard::check_dir(dir)?;
    }
    // The checkpoint directory is an output too (checked below, as a directory); the others
    // change how the run is done or logged, not its metrics.
    stage.not_recorded(&["--save", "--save-every", "--threads", "--log-every", "--tensorboard", "--max-shard-size", "--save-gguf", "--gguf-dtype"]);
    if let Some(dir) = &args.save {
        checkpoint::check_save_dir(dir)?;
    }
    args.threads.install()?;
    if args.save_every.is_some() && args.save.is_none() {
        bail!("--save-every needs --save DIR");
    }
    if args.save_every == Some(0) {
        bail!("--save-every must be at least 1");
    }
    if let Some(e) = args.epochs {
        if !(e.is_finite() && e > 0.0) {
            bail!("--epochs must be positive, got {e}");
        }
    }
    if args.resume.is_some() && (args.vocab_size.is_some()) {
        bail!("--vocab-size applies to a fresh model (--init-config), not to --resume");
    }
    Ok(())
}
