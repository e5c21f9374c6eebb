//! The command line of `coa-train-step`: flags, their resolution against a checkpoint on
//! `--resume`, the training loop with its log table, and the outputs (metrics, checkpoint, plot).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, Float32Array, Int64Array, StringArray};
use arrow::record_batch::RecordBatch;
use coa_kernels::{gpu_for_model, select_device, Device, DeviceChoice, Gpu};
use coa_model::gguf::{GgufDtype, GgufTokenizer};
use coa_model::lora::{Lora, LoraConfig, Target};
use coa_model::{Model, ModelConfig, SaveDtype, SaveFormat};
use coa_tokenize::{fit_model, SpecialChoice, TemplateChoice, Vocab};
use coa_schemas::stage::{IoArgs, Stage};
use coa_schemas::tables::METRICS;

use crate::checkpoint::{self, TrainerState};
use crate::dapo::DapoConfig;
use crate::data::{self, Dataset};
use crate::objective::Objective;
use crate::optim::{AdamWConfig, NewRows};
use crate::plot;
use crate::schedule::Schedule;
use crate::tensorboard;
use crate::train::{RlStep, Settings, StepReport, Trainer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SaveDtypeArg {
    F32,
    Bf16,
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
    /// Where to train: `cpu`; `cuda` or `cuda:N` (the GPU; an error when none is usable or the
    /// GPU path cannot train this model); `auto` (the GPU when it can, else the CPU with a note on
    /// stderr). GPU runs use bf16 weights and activations with fp32 masters, gradients and
    /// optimizer state: close to the CPU's f32 run, not bit-identical. The checkpoint format is
    /// the same, so a run can resume on either device. `emu`: the GPU path on the CPU's emulated
    /// CUDA device (a correctness check of the GPU code, not a fast device).
    #[arg(long, value_name = "auto|cpu|cuda[:N]|emu", default_value = "cpu")]
    pub device: DeviceChoice,
    /// Compute every row alone. By default (CPU), rows of a micro-batch that begin with the same
    /// prompt (a suite's instruction, the G rollouts of a task) run as one sequence with the
    /// prompt computed once, and the other rows as one sequence of independent segments (larger
    /// matrix products): the same update up to float rounding, with less work.
    #[arg(long)]
    pub no_share_prompts: bool,
    /// Worker threads (default: all cores). Does not change the result.
    #[arg(long, value_name = "N", value_parser = coa_schemas::flags::at_least_one::<usize>)]
    pub threads: Option<usize>,
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

/// Takes a flag's value, the checkpoint's, or the default; a given value must equal the saved one.
fn pick<T: PartialEq + std::fmt::Debug + Copy>(flag: &str, given: Option<T>, saved: Option<T>, default: T, ckpt: &Option<PathBuf>) -> Result<T> {
    match (given, saved) {
        (Some(g), Some(s)) if g != s => bail!(
            "{flag} {g:?} differs from the checkpoint's {s:?} ({}/{}); a resume continues the same run: drop {flag} or give the same value (or start a new run with --init)",
            ckpt.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            checkpoint::STATE_FILE
        ),
        (Some(g), _) => Ok(g),
        (None, Some(s)) => Ok(s),
        (None, None) => Ok(default),
    }
}

/// Loads the tokenizer a checkpoint carries, as the stages that made its tokens resolved it.
fn load_vocab(path: &Path, eos: &SpecialChoice) -> Result<Vocab> {
    Vocab::load(path, &SpecialChoice::Auto, eos, &TemplateChoice::Auto).with_context(|| format!("tokenizer {}", path.display()))
}

/// The tokenizer of a run: --tokenizer, else the one inside --resume, else --init's own when it
/// fits the model unchanged (see `--tokenizer`). Without --tokenizer nothing grows: the 22 tags
/// loading adds have no rows in a pretrained model, and rows for them would change its loss on
/// plain text (the new rows take part in every softmax).
fn run_vocab(args: &TrainArgs) -> Result<Option<Vocab>> {
    if let Some(t) = &args.tokenizer {
        return load_vocab(t, &args.eos).map(Some);
    }
    if let Some(dir) = &args.resume {
        return match dir.join(checkpoint::TOKENIZER_FILE).is_file() {
            true => load_vocab(dir, &args.eos).map(Some),
            false => Ok(None),
        };
    }
    let Some(init) = &args.init else { return Ok(None) };
    let gguf = coa_model::gguf::is_gguf(init);
    if !gguf && !init.join(checkpoint::TOKENIZER_FILE).is_file() {
        return Ok(None);
    }
    let vocab = load_vocab(init, &args.eos)?;
    let rows = if gguf {
        coa_model::gguf::model_config(&coa_model::gguf::GgufFile::open(init)?)?.vocab_size
    } else {
        ModelConfig::from_file(&init.join("config.json")).with_context(|| format!("--init {}", init.display()))?.vocab_size
    };
    if vocab.rows_needed() > rows {
        eprintln!(
            "coa-train-step: --init {}'s own tokenizer has {} ids with the CoA tags, the model {rows} rows: its vocabulary is left as it is and no tokenizer is saved (pass --tokenizer, e.g. the one coa-tokenize --save-tokenizer wrote, to grow rows for the tags)",
            init.display(),
            vocab.rows_needed()
        );
        return Ok(None);
    }
    Ok(Some(vocab))
}

/// Builds the model of a fresh run from --init or --init-config.
fn fresh_model(args: &TrainArgs, vocab: Option<&Vocab>, seed: u64) -> Result<(Model, String)> {
    if let Some(dir) = &args.init {
        // An adapter directory keeps its adapter apart: trained further with --lora-rank, merged
        // by Trainer::new otherwise.
        let model = Model::load_with_adapter(dir).with_context(|| format!("--init {}", dir.display()))?;
        if let Some(v) = args.vocab_size {
            if v != model.config.vocab_size {
                bail!("--vocab-size {v} differs from --init {}'s vocab_size {}", dir.display(), model.config.vocab_size);
            }
        }
        return Ok((model, format!("init {}", dir.display())));
    }
    let Some(spec) = &args.init_config else {
        bail!("give --init DIR (HF checkpoint), --init-config tiny|small|FILE (fresh model) or --resume DIR");
    };
    let config = if spec == "tiny" || spec == "small" {
        let vocab = match (args.vocab_size, vocab) {
            (Some(v), _) => v,
            (None, Some(v)) => v.rows_needed(),
            (None, None) => bail!("--init-config {spec}: give --vocab-size N or --tokenizer tokenizer.json for the vocabulary size"),
        };
        ModelConfig::preset(spec, vocab).with_context(|| format!("--init-config {spec}"))?
    } else {
        let path = Path::new(spec);
        if !path.exists() {
            bail!("--init-config {spec}: not a preset (tiny, small) and no such file");
        }
        let c = ModelConfig::from_file(path).with_context(|| format!("--init-config {spec}"))?;
        c.validate().with_context(|| format!("--init-config {spec}"))?;
        if let Some(v) = args.vocab_size {
            if v != c.vocab_size {
                bail!("--vocab-size {v} differs from --init-config {spec}'s vocab_size {}", c.vocab_size);
            }
        }
        c
    };
    let model = Model::init(config, seed).with_context(|| format!("--init-config {spec}"))?;
    Ok((model, format!("init-config {spec}")))
}

fn metrics_batch(objective: &str, reports: &[StepReport]) -> Result<RecordBatch> {
    let n = reports.len();
    let f32s = |f: &dyn Fn(&StepReport) -> f32| Arc::new(Float32Array::from(reports.iter().map(f).collect::<Vec<_>>())) as ArrayRef;
    let rl = |f: &dyn Fn(&RlStep) -> f64| Arc::new(Float32Array::from(reports.iter().map(|r| r.rl.as_ref().map(|x| f(x) as f32)).collect::<Vec<_>>())) as ArrayRef;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(reports.iter().map(|r| r.step as i64).collect::<Vec<_>>())),
        Arc::new(StringArray::from(vec![objective; n])),
        f32s(&|r| r.loss as f32),
        f32s(&|r| r.lr as f32),
        f32s(&|r| r.grad_norm as f32),
        Arc::new(Int64Array::from(reports.iter().map(|r| r.targets as i64).collect::<Vec<_>>())),
        f32s(&|r| (r.tokens as f64 / r.seconds.max(1e-9)) as f32),
        rl(&|x| x.reward_mean),
        rl(&|x| x.clip_frac),
        rl(&|x| x.entropy),
        rl(&|x| x.response_len),
        rl(&|x| x.logprob_mismatch),
    ];
    RecordBatch::try_new(METRICS.schema(), columns).map_err(|e| anyhow!("building the metrics table: {e}"))
}

/// `coa-train-step` (training): flags checked, settings resolved, the trainer built and placed,
/// the steps taken, the outputs written.
pub fn run_train(stage: &mut Stage, args: &TrainArgs) -> Result<()> {
    check_flags(stage, args)?;
    // The device first: `--device cuda` without a GPU fails before any data is read.
    let device = select_device(args.device).map_err(|e| anyhow!("{e}"))?;
    let saved: Option<TrainerState> = match &args.resume {
        Some(dir) => Some(TrainerState::read(dir)?),
        None => None,
    };
    let objective = resolve_objective(args, saved.as_ref())?;
    let mut data = read_data(stage, args, objective)?;
    let settings = resolve_settings(stage, args, saved.as_ref(), objective, &data)?;
    // Read now: --save may replace the directory it comes from (--resume DIR --save DIR).
    let vocab = run_vocab(args)?;
    let (mut trainer, origin) = build_trainer(args, objective, settings, saved.as_ref(), &data, vocab.as_ref())?;
    prepare_trainer(stage, args, &mut trainer, &mut data, device, vocab.as_ref())?;
    let data = data;
    let gguf = gguf_tokenizer(args, &trainer.model.config, vocab.as_ref())?;
    let dtype = match args.save_dtype {
        SaveDtypeArg::F32 => SaveDtype::F32,
        SaveDtypeArg::Bf16 => SaveDtype::Bf16,
    };
    let save_format = SaveFormat { dtype, max_shard_bytes: args.max_shard_size };
    let run = train_loop(stage, args, &mut trainer, &data, vocab.as_ref(), save_format, &origin)?;
    write_outputs(stage, args, &mut trainer, &data, vocab.as_ref(), save_format, gguf.as_ref(), run)
}

/// The tokenizer --save-gguf writes (the one the checkpoint gets), checked with the model's
/// architecture before any step: a vocabulary GGUF cannot hold fails now, not after the run.
fn gguf_tokenizer(args: &TrainArgs, config: &ModelConfig, vocab: Option<&Vocab>) -> Result<Option<GgufTokenizer>> {
    let Some(path) = &args.save_gguf else { return Ok(None) };
    let Some(vocab) = vocab else {
        bail!("--save-gguf {}: this run saves no tokenizer (pass --tokenizer, e.g. the one coa-tokenize --save-tokenizer wrote)", path.display())
    };
    let [(json_name, json), (config_name, tok_config)] = vocab.hf_files()?;
    let tok = coa_model::gguf::hf_tokenizer_from(&json, Some(&tok_config), None, Path::new(json_name), Path::new(config_name))
        .and_then(|t| coa_model::gguf::check_exportable(config, &t).map(|()| t))
        .with_context(|| format!("--save-gguf {}", path.display()))?;
    Ok(Some(tok))
}

impl From<SaveDtypeArg> for SaveDtype {
    fn from(a: SaveDtypeArg) -> SaveDtype {
        match a {
            SaveDtypeArg::F32 => SaveDtype::F32,
            SaveDtypeArg::Bf16 => SaveDtype::Bf16,
        }
    }
}

/// `coa-train-step merge-lora`: the adapter of `input` merged into its base, saved to `output`
/// as a plain checkpoint with the tokenizer files found beside the adapter.
pub fn run_merge(input: &Path, output: &Path, dtype: SaveDtype) -> Result<()> {
    if !Lora::is_adapter_dir(input) {
        bail!("-i {}: no {} there (not a LoRA adapter directory)", input.display(), coa_model::lora::ADAPTER_CONFIG);
    }
    checkpoint::check_save_dir(output)?;
    let model = Model::load(input).with_context(|| format!("-i {}", input.display()))?;
    let base = Lora::base_dir(input)?;
    checkpoint::write_dir_atomically(output, |tmp| {
        model.save(tmp, dtype)?;
        for name in [checkpoint::TOKENIZER_FILE, "tokenizer_config.json"] {
            if let Some(src) = [input, base.as_path()].iter().map(|d| d.join(name)).find(|p| p.is_file()) {
                std::fs::copy(&src, tmp.join(name)).with_context(|| format!("copying {}", src.display()))?;
            }
        }
        Ok(())
    })?;
    eprintln!("coa-train-step merge-lora: {} merged into {}", input.display(), output.display());
    Ok(())
}

/// Checks the output paths and the flags that need no data, and sets up the thread pool.
fn check_flags(stage: &mut Stage, args: &TrainArgs) -> Result<()> {
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
    if let Some(t) = args.threads {
        if t == 0 {
            bail!("--threads must be at least 1");
        }
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global().context("--threads: setting up the thread pool")?;
    }
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

/// The objective: --objective (else the checkpoint's, else `sft`), with the DAPO flags checked.
fn resolve_objective(args: &TrainArgs, saved: Option<&TrainerState>) -> Result<Objective> {
    let objective_name = pick_str("--objective", args.objective.as_deref(), saved.map(|s| s.objective.as_str()), "sft", &args.resume)?;
    let objective = Objective::parse(&objective_name)?;
    if matches!(objective, Objective::Dapo(_)) {
        let config = DapoConfig { clip_low: args.clip_low, clip_high: args.clip_high, kl_coef: args.kl_coef };
        if !(config.clip_low > 0.0 && config.clip_low < 1.0 && config.clip_high > 0.0 && config.clip_high.is_finite()) {
            bail!("--clip-low must be in (0, 1) and --clip-high positive (got {} and {})", config.clip_low, config.clip_high);
        }
        if !(config.kl_coef >= 0.0 && config.kl_coef.is_finite()) {
            bail!("--kl-coef must be >= 0, got {}", config.kl_coef);
        }
        if (config.kl_coef > 0.0) != args.reference.is_some() {
            bail!("--kl-coef > 0 and --ref DIR go together (the KL term is measured against the reference checkpoint)");
        }
        return Ok(Objective::Dapo(config));
    }
    if args.reference.is_some() || args.kl_coef != 0.0 {
        bail!("--ref and --kl-coef apply to --objective dapo");
    }
    Ok(objective)
}

/// Reads -i and the other inputs: `tokens` tables, or the `scores` table for DAPO.
fn read_data(stage: &mut Stage, args: &TrainArgs, objective: Objective) -> Result<Dataset> {
    let mut inputs: Vec<&Path> = args.io.input.iter().map(|p| p.as_path()).collect();
    inputs.extend(args.inputs.iter().map(|p| p.as_path()));
    match objective {
        Objective::Dapo(_) => data::read_scores(stage, &inputs),
        Objective::Sft => data::read(stage, &inputs),
    }
}

/// The run's settings: each flag's value, else the checkpoint's (`--resume`), else the default.
/// `new_rows` is left unset: a fresh run that grows the vocabulary sets it ([`build_trainer`]).
fn resolve_settings(stage: &mut Stage, args: &TrainArgs, saved: Option<&TrainerState>, objective: Objective, data: &Dataset) -> Result<Settings> {
    let s = saved.map(|s| &s.settings);
    let dapo = matches!(objective, Objective::Dapo(_));
    let seed = pick("--seed", args.seed, s.map(|s| s.seed), 0, &args.resume)?;
    stage.set_seed(seed);
    let batch_tokens = pick("--batch-tokens", args.batch_tokens, s.map(|s| s.batch_tokens), 4096, &args.resume)?;
    if batch_tokens == 0 {
        bail!("--batch-tokens must be at least 1");
    }
    let micro_batch_tokens = args.micro_batch_tokens.or(s.map(|s| s.micro_batch_tokens)).unwrap_or(batch_tokens);
    if micro_batch_tokens == 0 {
        bail!("--micro-batch-tokens must be at least 1");
    }
    let lr = pick("--lr", args.lr, s.map(|s| s.schedule.lr), 3e-4, &args.resume)?;
    // DAPO's reference setting is a constant learning rate after warm-up.
    let min_lr = pick("--min-lr", args.min_lr, s.map(|s| s.schedule.min_lr), if dapo { lr } else { lr * 0.1 }, &args.resume)?;
    let warmup = pick("--warmup-steps", args.warmup_steps, s.map(|s| s.schedule.warmup_steps), 0, &args.resume)?;
    let adamw = AdamWConfig {
        beta1: pick("--beta1", args.beta1, s.map(|s| s.adamw.beta1), 0.9, &args.resume)?,
        beta2: pick("--beta2", args.beta2, s.map(|s| s.adamw.beta2), 0.999, &args.resume)?,
        eps: pick("--eps", args.eps, s.map(|s| s.adamw.eps), 1e-8, &args.resume)?,
        weight_decay: pick("--weight-decay", args.weight_decay, s.map(|s| s.adamw.weight_decay), 0.01, &args.resume)?,
    };
    adamw.validate()?;
    let grad_clip = pick("--grad-clip", args.grad_clip, s.map(|s| s.grad_clip), 1.0, &args.resume)?;
    if !(grad_clip.is_finite() && grad_clip >= 0.0) {
        bail!("--grad-clip must be >= 0 (0 disables clipping), got {grad_clip}");
    }
    let steps_given = match (args.steps, args.epochs) {
        (Some(n), _) => Some(n),
        (None, Some(e)) => Some(data::steps_for_epochs(&data.examples, seed, batch_tokens, e)),
        (None, None) => None,
    };
    let default_steps = data::steps_for_epochs(&data.examples, seed, batch_tokens, 1.0);
    let total_steps = pick("--steps", steps_given, s.map(|s| s.schedule.total_steps), default_steps, &args.resume)?;
    let schedule = Schedule::new(lr, min_lr, warmup, total_steps)?;
    let frozen_layers = pick("--freeze-layers", args.freeze_layers, s.map(|s| s.frozen_layers), 0, &args.resume)?;
    let matmul = pick("--matmul", args.matmul, s.map(|s| s.matmul), coa_model::MatmulDtype::F32, &args.resume)?;
    let lora = lora_settings(args, s.and_then(|s| s.lora.as_ref()))?;
    Ok(Settings { seed, schedule, adamw, grad_clip, batch_tokens, micro_batch_tokens, new_rows: None, frozen_layers, matmul, lora })
}

/// The LoRA settings: the flags, else the checkpoint's (resume), else the --init adapter's, else
/// PEFT's defaults; `None` without --lora-rank (nor a LoRA run to resume).
fn lora_settings(args: &TrainArgs, saved: Option<&LoraConfig>) -> Result<Option<LoraConfig>> {
    let targets = args.lora_targets.as_deref().map(Target::parse_list).transpose().context("--lora-targets")?;
    if args.resume.is_some() && saved.is_none() && args.lora_rank.is_some() {
        bail!("--lora-rank: the run of --resume fine-tunes every weight (no adapter); a resume continues the same run (start a new one with --init to train an adapter)");
    }
    let rank = args.lora_rank.or(saved.map(|l| l.rank));
    let Some(rank) = rank else {
        if args.lora_alpha.is_some() || args.lora_dropout.is_some() || targets.is_some() {
            bail!("--lora-alpha, --lora-dropout and --lora-targets need --lora-rank R");
        }
        return Ok(None);
    };
    let from_init = match (&args.init, saved) {
        (Some(dir), None) if Lora::is_adapter_dir(dir) => Some(Lora::read_config(dir).with_context(|| format!("--init {}", dir.display()))?.0),
        _ => None,
    };
    let dflt = from_init.as_ref().or(saved);
    let pr = &args.resume;
    let config = LoraConfig {
        rank: pick("--lora-rank", Some(rank), saved.map(|l| l.rank), rank, pr)?,
        alpha: pick("--lora-alpha", args.lora_alpha, saved.map(|l| l.alpha), dflt.map_or(8.0, |l| l.alpha), pr)?,
        dropout: pick("--lora-dropout", args.lora_dropout, saved.map(|l| l.dropout), dflt.map_or(0.0, |l| l.dropout), pr)?,
        targets: match (targets, saved) {
            (Some(t), Some(s)) if t != s.targets => bail!("--lora-targets {:?} differs from the checkpoint's {:?}; a resume continues the same run", args.lora_targets.as_deref().unwrap_or_default(), s.targets),
            (Some(t), _) => t,
            (None, _) => dflt.map_or_else(Target::peft_default, |l| l.targets.clone()),
        },
    };
    config.validate().context("--lora-rank / --lora-alpha / --lora-dropout")?;
    Ok(Some(config))
}

/// The trainer and a note of where it starts: the checkpoint of --resume, or a fresh model
/// (--init, --init-config) grown to the tokenizer's vocabulary.
fn build_trainer(args: &TrainArgs, objective: Objective, mut settings: Settings, saved: Option<&TrainerState>, data: &Dataset, vocab: Option<&Vocab>) -> Result<(Trainer, String)> {
    if let Some(dir) = &args.resume {
        let mut t = Trainer::load(dir, data)?;
        t.state.settings.micro_batch_tokens = settings.micro_batch_tokens;
        let saved_mult = t.state.settings.new_rows.map(|n| n.lr_mult);
        pick("--new-token-lr-mult", args.new_token_lr_mult, saved_mult.or(Some(1.0)), 1.0, &args.resume)?;
        t.objective = objective;
        return Ok((t, format!("resume {} at step {}", dir.display(), saved.map(|s| s.step).unwrap_or(0))));
    }
    let (mut model, origin) = fresh_model(args, vocab, settings.seed)?;
    let base_rows = model.config.vocab_size;
    let mut grown = false;
    if let Some(v) = vocab {
        if fit_model(&mut model, v, args.init.is_some())? {
            grown = true;
            let mult = args.new_token_lr_mult.unwrap_or(1.0);
            settings.new_rows = Some(NewRows { first: base_rows, lr_mult: mult });
            eprintln!(
                "coa-train-step: vocabulary grown to the tokenizer's {} ids (new rows {base_rows}.., each the mean of its token's base pieces; learning rate x{mult})",
                model.config.vocab_size
            );
        }
    }
    if !grown && args.new_token_lr_mult.is_some_and(|m| m != 1.0) {
        bail!("--new-token-lr-mult applies to the rows --init adds for new tokens, and this run adds none (the tokenizer has no ids past the model's {base_rows})");
    }
    Ok((Trainer::new(model, objective, &settings, data)?, origin))
}

/// Readies the trainer for its first step: the model fitted to the tokenizer and checked against
/// the data, moved to the GPU when one trains it, and for DAPO the old (and reference) log-probs.
fn prepare_trainer(stage: &mut Stage, args: &TrainArgs, trainer: &mut Trainer, data: &mut Dataset, device: Device, vocab: Option<&Vocab>) -> Result<()> {
    if let Some(v) = vocab {
        fit_model(&mut trainer.model, v, false)?;
    }
    trainer.share_prompts = !args.no_share_prompts;
    let fit = data.check_model_fit(trainer.model.config.vocab_size, trainer.model.config.max_position_embeddings);
    match (fit, vocab, &args.init) {
        (Err(e), None, Some(init)) => {
            return Err(e.context(format!("no --tokenizer: the model of --init {} is not grown for tokens past its rows (give --tokenizer, the tokenizer the tokens were made with)", init.display())))
        }
        (fit, ..) => fit?,
    }
    let supported = coa_kernels::model::check_supported(&trainer.model.config);
    let device = match gpu_for_model(device, args.device, supported, "trains this model").map_err(|e| anyhow!("{e}"))? {
        Some(info) => {
            let gpu = Gpu::open(&info).map_err(|e| anyhow!("--device {}: {e}", args.device))?;
            // Compile (or load from the PTX cache) every kernel now, not inside the first step.
            gpu.warm_up().map_err(|e| anyhow!("--device {}: {e}", args.device))?;
            trainer.to_cuda(Arc::new(gpu), data)?;
            let gm = trainer.cuda.as_deref().map(|g| (g.capacity(), g.device_bytes())).unwrap_or_default();
            eprintln!("coa-train-step: training on {info}: {} tokens per pass, {:.2} GiB of buffers", gm.0, gm.1 as f64 / (1u64 << 30) as f64);
            info.to_string()
        }
        None => "cpu".to_string(),
    };
    stage.note("device", device);
    if matches!(trainer.objective, Objective::Dapo(_)) {
        let reference = match &args.reference {
            Some(dir) => {
                let m = Model::load(dir).with_context(|| format!("--ref {}", dir.display()))?;
                m.params.check_same_layout(&trainer.model.params, "the reference model").with_context(|| format!("--ref {}", dir.display()))?;
                Some(m)
            }
            None => None,
        };
        let t0 = Instant::now();
        trainer.prepare_rl(data, reference.as_ref())?;
        eprintln!("coa-train-step: old log-probs of {} rollouts recomputed in {:.1} s", data.examples.len(), t0.elapsed().as_secs_f64());
    }
    Ok(())
}

/// What the steps of this invocation did.
struct Run {
    reports: Vec<StepReport>,
    /// Wall-clock seconds of the steps (checkpoints saved on the way included).
    wall: f64,
    threads: usize,
}

/// The training loop: steps up to --stop-at-step (else the end of the run), the log table on
/// stderr, TensorBoard scalars, and a checkpoint every --save-every steps.
fn train_loop(stage: &mut Stage, args: &TrainArgs, trainer: &mut Trainer, data: &Dataset, vocab: Option<&Vocab>, save_format: SaveFormat, origin: &str) -> Result<Run> {
    let Settings { schedule, batch_tokens, .. } = trainer.state.settings;
    let total_steps = schedule.total_steps;
    let stop_at = args.stop_at_step.unwrap_or(total_steps).min(total_steps);
    let start_step = trainer.state.step;
    // A finished run resumed again does nothing more (a pipeline may re-run it); asking to stop at
    // a step the run has already passed is a mistake.
    if let Some(s) = args.stop_at_step.filter(|_| stop_at <= start_step) {
        bail!("nothing to train: the run is at step {start_step} of {total_steps} and --stop-at-step is {s}");
    }
    let todo = stop_at.saturating_sub(start_step);
    let log_every = args.log_every.unwrap_or((todo / 20).max(1)).max(1);
    eprintln!(
        "coa-train-step: {origin}; {} params; {} rows ({} trained, {} without targets), {} tokens, {} targets; {} steps of <= {batch_tokens} tokens, steps {}..{stop_at} now",
        trainer.model.params.n_elements(),
        data.rows,
        data.examples.len(),
        data.skipped_no_targets,
        data.tokens,
        data.targets,
        total_steps,
        start_step + 1,
    );
    if let Some(l) = &trainer.model.lora {
        let c = &l.config;
        let targets: Vec<&str> = c.targets.iter().map(|t| t.name()).collect();
        eprintln!("coa-train-step: LoRA r {} alpha {} dropout {} on {}: {} trained params, the base frozen", c.rank, c.alpha, c.dropout, targets.join(","), l.params.n_elements());
    }
    let threads = rayon::current_num_threads();
    let started = Instant::now();
    let mut reports: Vec<StepReport> = Vec::new();
    let mut header = true;
    let mut win_loss = 0.0f64;
    let mut win_n = 0u64;
    let mut win_tokens = 0usize;
    let mut win_secs = 0.0f64;
    let mut board = args.tensorboard.as_deref().map(|dir| tensorboard::Board::open(dir, start_step)).transpose()?;
    let bar = stage.progress(Some(todo), "training");
    while trainer.state.step < stop_at {
        let r = trainer.step(data)?;
        bar.inc(1);
        bar.set_message(format!("step {} of {stop_at}, loss {:.4}", r.step, r.loss));
        if let Some(board) = &mut board {
            board.write_step(&r)?;
        }
        win_loss += r.loss;
        win_n += 1;
        win_tokens += r.tokens;
        win_secs += r.seconds;
        if r.step % log_every == 0 || r.step == stop_at || r.step == start_step + 1 {
            let row = (r.step as i64, (win_loss / win_n as f64) as f32, r.lr as f32, r.grad_norm as f32, (win_tokens as f64 / win_secs.max(1e-9)) as f32);
            let table = plot::text_table(&[row]);
            let mut lines = table.lines();
            let head = lines.next().unwrap_or_default();
            if header {
                Stage::log_line(&bar, &format!("{head}   (loss: mean over the steps since the last line)"));
                header = false;
            }
            for l in lines {
                Stage::log_line(&bar, l);
            }
            win_loss = 0.0;
            win_n = 0;
            win_tokens = 0;
            win_secs = 0.0;
        }
        if let (Some(every), Some(dir)) = (args.save_every, &args.save) {
            if r.step % every == 0 && r.step != stop_at {
                trainer.save(dir, vocab, save_format)?;
            }
        }
        reports.push(r);
    }
    bar.finish_and_clear();
    Ok(Run { reports, wall: started.elapsed().as_secs_f64(), threads })
}

/// The outputs of the run: the final checkpoint (--save), the `metrics` table, the loss plot
/// (--plot) and the stage's notes.
fn write_outputs(stage: &mut Stage, args: &TrainArgs, trainer: &mut Trainer, data: &Dataset, vocab: Option<&Vocab>, save_format: SaveFormat, gguf: Option<&GgufTokenizer>, run: Run) -> Result<()> {
    let Run { reports, wall, threads } = run;
    let total_steps = trainer.state.settings.schedule.total_steps;
    let objective = trainer.objective;
    if let Some(dir) = &args.save {
        trainer.save(dir, vocab, save_format)?;
        stage.note("checkpoint", dir.display().to_string());
    }
    if let (Some(path), Some(tok)) = (&args.save_gguf, gguf) {
        // The special ids the checkpoint's config got from the tokenizer are in the model now.
        coa_model::gguf::save(&trainer.model, tok, path, args.gguf_dtype)?;
        stage.note("gguf", path.display().to_string());
    }
    let batch = metrics_batch(objective.name(), &reports)?;
    let mut writer = stage.create(args.io.output.as_deref(), args.io.format, &METRICS.schema())?;
    writer.write(&batch)?;
    let rows = writer.finish()?;
    stage.add_rows_out(rows);
    if let Some(png) = &args.plot {
        let pts: Vec<(f64, f64)> = trainer.state.history.iter().map(|h| (h.step as f64, h.loss as f64)).collect();
        if pts.is_empty() {
            bail!("--plot {}: no steps were taken, nothing to plot", png.display());
        }
        // Where each epoch ends (steps never straddle one), and how long one is.
        let (seed, batch) = (trainer.state.settings.seed, trainer.state.settings.batch_tokens);
        let per_epoch = data::steps_for_epochs(&data.examples, seed, batch, 1.0);
        let last = pts.last().map_or(0, |p| p.0 as u64);
        let mut ends = Vec::new();
        for k in 1..=last / per_epoch.max(1) {
            let end = data::steps_for_epochs(&data.examples, seed, batch, k as f64);
            if end > last {
                break;
            }
            ends.push(end);
        }
        plot::write_loss_png(png, &pts, &format!("{} loss", objective.name()), &ends, per_epoch)?;
        stage.note("plot", png.display().to_string());
    }
    let tokens: usize = reports.iter().map(|r| r.tokens).sum();
    let compute: f64 = reports.iter().map(|r| r.seconds).sum();
    stage.note("objective", objective.name());
    stage.note("steps", reports.len() as u64);
    stage.note("step", trainer.state.step);
    stage.note("total_steps", total_steps);
    if let (Some(first), Some(last)) = (reports.first(), reports.last()) {
        stage.note("first_loss", (first.loss * 1e4).round() / 1e4);
        stage.note("final_loss", (last.loss * 1e4).round() / 1e4);
    }
    let rl: Vec<&RlStep> = reports.iter().filter_map(|r| r.rl.as_ref()).collect();
    if !rl.is_empty() {
        let mean = |f: &dyn Fn(&RlStep) -> f64| (rl.iter().map(|x| f(x)).sum::<f64>() / rl.len() as f64 * 1e4).round() / 1e4;
        stage.note("reward_mean", mean(&|x| x.reward_mean));
        stage.note("response_len", mean(&|x| x.response_len));
        stage.note("clip_frac", mean(&|x| x.clip_frac));
        stage.note("entropy", mean(&|x| x.entropy));
        stage.note("logprob_mismatch", mean(&|x| x.logprob_mismatch));
        stage.note("mean_loss", (reports.iter().map(|r| r.loss).sum::<f64>() / reports.len() as f64 * 1e4).round() / 1e4);
    }
    stage.note("tokens", tokens as u64);
    stage.note("tokens_per_s", ((tokens as f64 / compute.max(1e-9)) * 10.0).round() / 10.0);
    stage.note("train_seconds", (wall * 1000.0).round() / 1000.0);
    stage.note("threads", threads as u64);
    stage.note("params", trainer.model.params.n_elements() as u64);
    Ok(())
}

fn pick_str(flag: &str, given: Option<&str>, saved: Option<&str>, default: &str, ckpt: &Option<PathBuf>) -> Result<String> {
    match (given, saved) {
        (Some(g), Some(s)) if g != s => bail!(
            "{flag} {g} differs from the checkpoint's {s} ({}/{}); a resume continues the same run",
            ckpt.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            checkpoint::STATE_FILE
        ),
        (Some(g), _) => Ok(g.to_string()),
        (None, Some(s)) => Ok(s.to_string()),
        (None, None) => Ok(default.to_string()),
    }
}

/// `coa-train-step plot --bars FILE.json` (the pipeline's comparison plot) or `--lines
/// FILE.json` (RL curves per iteration): panels as PNG.
pub fn run_panels(stage: &mut Stage, json: &Path, output: &Path, lines: bool) -> Result<()> {
    let figure = plot::BarFigure::read(json)?;
    if lines {
        plot::write_lines_png(output, &figure)?;
    } else {
        plot::write_bars_png(output, &figure)?;
    }
    stage.add_input_file(json);
    stage.note("plot", output.display().to_string());
    Ok(())
}

/// `coa-train-step plot`: a `metrics` table's curve of `column` (e.g. loss, reward_mean) as PNG.
pub fn run_plot(stage: &mut Stage, input: Option<&Path>, output: &Path, title: Option<&str>, column: &str) -> Result<()> {
    let reader = stage.open(input, &METRICS)?;
    let source = reader.source().to_string();
    let mut pts = Vec::new();
    for batch in reader {
        let batch = batch?;
        stage.add_rows_in(batch.num_rows() as u64);
        let step = batch.column_by_name("step").and_then(|c| c.as_any().downcast_ref::<Int64Array>()).ok_or_else(|| anyhow!("{source}: column `step` is not int64"))?;
        let values = batch
            .column_by_name(column)
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .ok_or_else(|| anyhow!("{source}: --column {column}: not a float32 column of the metrics table"))?;
        for i in 0..batch.num_rows() {
            if values.is_valid(i) {
                pts.push((step.value(i) as f64, values.value(i) as f64));
            }
        }
    }
    if pts.is_empty() {
        bail!("{source}: the metrics table has no `{column}` values, nothing to plot");
    }
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Named after what it draws unless told otherwise; a loss on a log axis, as in training.
    let title = title.map_or_else(|| format!("{column} per step"), str::to_string);
    let style = plot::CurveStyle { log_y: column == "loss", ..Default::default() };
    plot::write_curve_png(output, &pts, &title, column, &style)?;
    stage.note("plot", output.display().to_string());
    Ok(())
}
