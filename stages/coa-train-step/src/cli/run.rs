//! A training run from start to end ([`run_train`]): flags checked, settings resolved, the
//! trainer built and placed on its device, the steps taken with their log table, and the outputs
//! written (checkpoint, GGUF, `metrics`, plot, notes); and `merge-lora` ([`run_merge`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{ArrayRef, Float32Array, Int64Array, StringArray};
use arrow::record_batch::RecordBatch;
use coa_kernels::{gpu_for_model, select_device, Device, Gpu};
use coa_model::gguf::GgufTokenizer;
use coa_model::lora::Lora;
use coa_model::{Model, ModelConfig, SaveDtype, SaveFormat};
use coa_schemas::stage::Stage;
use coa_schemas::tables::METRICS;
use coa_tokenize::{fit_model, Vocab};

use super::args::{check_flags, SaveDtypeArg, TrainArgs};
use super::resolve::{build_trainer, resolve_objective, resolve_settings, run_vocab};
use crate::checkpoint::{self, TrainerState};
use crate::data::{self, Dataset};
use crate::objective::Objective;
use crate::plot;
use crate::tensorboard;
use crate::train::{RlStep, Settings, StepReport, Trainer};

/// `coa-train-step` (training): flags checked, settings resolved, the trainer built and placed,
/// the steps taken, the outputs written.
pub fn run_train(stage: &mut Stage, args: &TrainArgs) -> Result<()> {
    check_flags(stage, args)?;
    // The device first: `--device cuda` without a GPU fails before any data is read.
    let device = select_device(args.device.device).map_err(|e| anyhow!("{e}"))?;
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

/// Reads -i and the other inputs: `tokens` tables, or the `scores` table for DAPO.
fn read_data(stage: &mut Stage, args: &TrainArgs, objective: Objective) -> Result<Dataset> {
    let mut inputs: Vec<&Path> = args.io.input.iter().map(|p| p.as_path()).collect();
    inputs.extend(args.inputs.iter().map(|p| p.as_path()));
    match objective {
        Objective::Dapo(_) => data::read_scores(stage, &inputs),
        Objective::Sft => data::read(stage, &inputs),
    }
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
    let device = match gpu_for_model(device, args.device.device, supported, "trains this model").map_err(|e| anyhow!("{e}"))? {
        Some(info) => {
            let gpu = Gpu::open(&info).map_err(|e| anyhow!("--device {}: {e}", args.device.device))?;
            // Compile (or load from the PTX cache) every kernel now, not inside the first step.
            gpu.warm_up().map_err(|e| anyhow!("--device {}: {e}", args.device.device))?;
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
