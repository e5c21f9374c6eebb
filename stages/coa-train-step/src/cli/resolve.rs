//! The run a `coa-train-step` invocation continues or starts: its objective, settings and LoRA
//! settings resolved from the flags and the checkpoint of `--resume` (a given flag must match
//! the saved value), its tokenizer, and the trainer built from the checkpoint or a fresh model.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use coa_model::lora::{Lora, LoraConfig, Target};
use coa_model::{Model, ModelConfig};
use coa_schemas::stage::Stage;
use coa_tokenize::{fit_model, SpecialChoice, TemplateChoice, Vocab};

use super::args::TrainArgs;
use crate::checkpoint::{self, TrainerState};
use crate::dapo::DapoConfig;
use crate::data::{self, Dataset};
use crate::objective::Objective;
use crate::optim::{AdamWConfig, NewRows};
use crate::schedule::Schedule;
use crate::train::{Settings, Trainer};

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

/// [`pick`] for a flag given as text (the objective's name).
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

/// The objective: --objective (else the checkpoint's, else `sft`), with the DAPO flags checked.
pub(super) fn resolve_objective(args: &TrainArgs, saved: Option<&TrainerState>) -> Result<Objective> {
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

/// The run's settings: each flag's value, else the checkpoint's (`--resume`), else the default.
/// `new_rows` is left unset: a fresh run that grows the vocabulary sets it ([`build_trainer`]).
pub(super) fn resolve_settings(stage: &mut Stage, args: &TrainArgs, saved: Option<&TrainerState>, objective: Objective, data: &Dataset) -> Result<Settings> {
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

/// Loads the tokenizer a checkpoint carries, as the stages that made its tokens resolved it.
fn load_vocab(path: &Path, eos: &SpecialChoice) -> Result<Vocab> {
    Vocab::load(path, &SpecialChoice::Auto, eos, &TemplateChoice::Auto).with_context(|| format!("tokenizer {}", path.display()))
}

/// The tokenizer of a run: --tokenizer, else the one inside --resume, else --init's own when it
/// fits the model unchanged (see `--tokenizer`). Without --tokenizer nothing grows: the 22 tags
/// loading adds have no rows in a pretrained model, and rows for them would change its loss on
/// plain text (the new rows take part in every softmax).
pub(super) fn run_vocab(args: &TrainArgs) -> Result<Option<Vocab>> {
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

/// The trainer and a note of where it starts: the checkpoint of --resume, or a fresh model
/// (--init, --init-config) grown to the tokenizer's vocabulary.
pub(super) fn build_trainer(args: &TrainArgs, objective: Objective, mut settings: Settings, saved: Option<&TrainerState>, data: &Dataset, vocab: Option<&Vocab>) -> Result<(Trainer, String)> {
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
