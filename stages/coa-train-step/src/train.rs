//! The trainer: model, optimizer state and trainer state, one optimizer step at a time.
//!
//! A step takes the next rows of the data stream (see [`crate::data`]), computes every row's
//! gradient with the model's forward/backward, sums them, clips by the global norm and applies
//! AdamW at the scheduled learning rate.
//!
//! Micro-batches: the rows of a micro-batch run concurrently (rayon), each into its own gradient
//! buffer; the buffers are then added to the step's gradient in row order, and micro-batches run
//! one after another. So `--micro-batch-tokens` bounds what is in flight (activations and one
//! gradient buffer per row) and the update does not depend on it, nor on the thread count: the
//! per-token loss weights use N, the target count of the whole step, fixed before the first
//! micro-batch runs.
//!
//! On a GPU (`Trainer::to_cuda`, `--device cuda`) the same step runs in [`crate::cuda`]; what it
//! records and reports is shared (`finish_step`).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use coa_kernels::{Gpu, GpuModel};
use coa_model::{Model, Params, SaveDtype, SaveFormat, Seq, Workspace};
use coa_tokenize::Vocab;
use coa_schemas::rows::Shown;
use rayon::prelude::*;

use crate::checkpoint::{self, DataInfo, LogPoint, TrainerState};
use crate::cuda;
use crate::data::{micro_batches, Cursor, Dataset};
use crate::objective::{Objective, RlSums};
use crate::optim::{self, Moments};
pub use crate::settings::Settings;
use crate::share;
use crate::step::{check_finite, dropout_seed, StepTotals};
pub use crate::step::{trained, trained_mut, RlStep, StepReport};

pub struct Trainer {
    /// The model; on CUDA its parameters are the ones of the last upload or sync (the GPU
    /// holds the current ones, see [`Trainer::sync_from_cuda`]).
    pub model: Model,
    pub moments: Vec<Moments>,
    pub state: TrainerState,
    pub objective: Objective,
    /// Training on the GPU: the model and optimizer state there (`Trainer::to_cuda`).
    pub cuda: Option<Box<GpuModel>>,
    /// CPU steps pack rows that share a prompt (see [`share`]); off: every row alone.
    pub share_prompts: bool,
    /// The CPU step's memory, allocated by the first step and reused by the next ones.
    cpu: CpuBuffers,
}

/// What a CPU step allocates once: the forward / backward buffers, sized for the longest
/// sequence so far, and the gradients `[params]`, zeroed at the start of each step.
#[derive(Default)]
struct CpuBuffers {
    ws: Workspace,
    grads: Option<Params>,
}

pub fn data_info(d: &Dataset) -> DataInfo {
    DataInfo { rows: d.rows, examples: d.examples.len(), tokens: d.tokens, targets: d.targets, fingerprint: d.fingerprint_hex() }
}

impl Trainer {
    /// A fresh run: zero optimizer state, the data stream at its start.
    pub fn new(model: Model, objective: Objective, settings: &Settings, data: &Dataset) -> Result<Trainer> {
        settings.adamw.validate()?;
        if settings.batch_tokens == 0 || settings.micro_batch_tokens == 0 {
            bail!("--batch-tokens and --micro-batch-tokens must be positive");
        }
        if settings.frozen_layers > model.config.num_hidden_layers {
            bail!("--freeze-layers {}: the model has {} layers", settings.frozen_layers, model.config.num_hidden_layers);
        }
        let mut model = model;
        model.frozen_layers = settings.frozen_layers;
        model.matmul = settings.matmul;
        match (&settings.lora, &model.lora) {
            (Some(_), _) if settings.frozen_layers > 0 => bail!("--freeze-layers and --lora-rank do not combine: the adapter trains every layer it targets"),
            (Some(want), Some(have)) if *want != have.config => {
                bail!("--lora-* settings {want:?} differ from the --init adapter's {:?}: give the adapter's (or drop --lora-rank to fine-tune the merged model)", have.config)
            }
            (Some(want), None) => model.lora = Some(coa_model::Lora::init(&model.config, want.clone(), settings.seed)?),
            (None, Some(_)) => model.merge_lora()?,
            _ => {}
        }
        let moments = trained(&model).tensors.iter().map(|t| Moments::zeros(t.data.len())).collect();
        let state = TrainerState {
            format: checkpoint::FORMAT.to_string(),
            objective: objective.name().to_string(),
            step: 0,
            tokens_seen: 0,
            settings: settings.clone(),
            cursor: Cursor::start(settings.seed, data.examples.len()),
            data: data_info(data),
            history: Vec::new(),
        };
        Ok(Trainer { model, moments, state, objective, cuda: None, share_prompts: true, cpu: CpuBuffers::default() })
    }

    /// Loads a checkpoint written by [`Trainer::save`]: model (f32 masters), moments, state.
    /// The caller checks the run's settings against `state` (see `cli::resolve::resolve_settings`).
    pub fn load(dir: &Path, data: &Dataset) -> Result<Trainer> {
        let state = TrainerState::read(dir)?;
        let objective = Objective::parse(&state.objective).with_context(|| format!("{}/{}", dir.display(), checkpoint::STATE_FILE))?;
        let mut model = Model::load_with_adapter(dir).with_context(|| format!("--resume {}", dir.display()))?;
        model.frozen_layers = state.settings.frozen_layers;
        model.matmul = state.settings.matmul;
        if model.lora.as_ref().map(|l| &l.config) != state.settings.lora.as_ref() {
            bail!("--resume {}: the adapter beside the model ({:?}) is not the LoRA of trainer_state.json ({:?})", dir.display(), model.lora.as_ref().map(|l| &l.config), state.settings.lora);
        }
        let specs: Vec<(String, Vec<usize>)> = trained(&model).tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect();
        let opt = checkpoint::read_optimizer(dir, &specs)?;
        if let Some(master) = opt.master {
            for (t, m) in trained_mut(&mut model).tensors.iter_mut().zip(master) {
                t.data = m;
            }
        }
        let info = data_info(data);
        if info != state.data {
            bail!(
                "--resume {}: the input is not the data this run was trained on (checkpoint: {} rows, {} tokens, fingerprint {}; input: {} rows, {} tokens, fingerprint {}); \
                 to train these weights on other data start a new run with --init {}",
                dir.display(),
                state.data.rows,
                state.data.tokens,
                state.data.fingerprint,
                info.rows,
                info.tokens,
                info.fingerprint,
                dir.display()
            );
        }
        let mut state = state;
        state.cursor = state.cursor.clone().restore(data.examples.len()).with_context(|| format!("--resume {}", dir.display()))?;
        Ok(Trainer { model, moments: opt.moments, state, objective, cuda: None, share_prompts: true, cpu: CpuBuffers::default() })
    }

    /// Writes the checkpoint directory atomically. The weights for resuming are always exact
    /// f32 (in model.safetensors, or in optimizer.safetensors as `master.*` when the HF file is
    /// bf16). On CUDA the masters and moments are downloaded first: the format is the CPU's.
    /// With a tokenizer, its HF files (`tokenizer.json`, `tokenizer_config.json`) are written too
    /// and its BOS/EOS/pad ids go into `config.json` and `generation_config.json`, so HF
    /// `generate`, vLLM and verl use the checkpoint unchanged.
    pub fn save(&mut self, dir: &Path, tokenizer: Option<&Vocab>, format: impl Into<SaveFormat>) -> Result<()> {
        let format = format.into();
        self.sync_from_cuda()?;
        let tokenizer_files = match tokenizer {
            Some(v) => {
                let (bos, eos, pad) = v.special_ids();
                self.model.config.set_special_ids(bos, eos, pad);
                Some(v.hf_files()?)
            }
            None => None,
        };
        // With LoRA the frozen base is saved beside the adapter (f32 unless the format's dtype
        // holds it exactly, e.g. a bf16 base: resuming needs it as it was) and the adapter in f32.
        let lora = self.model.lora.as_ref();
        let base_format = match lora {
            Some(_) if !self.model.params.iter().all(|t| format.dtype.holds_exactly(&t.data)) => SaveFormat { dtype: SaveDtype::F32, ..format },
            _ => format,
        };
        let with_master = lora.is_none() && !matches!(format.dtype, SaveDtype::F32);
        let params: Vec<(String, Vec<usize>, &[f32])> = trained(&self.model).tensors.iter().map(|t| (t.name.clone(), t.shape.clone(), t.data.as_slice())).collect();
        let opt = checkpoint::optimizer_bytes(&params, &self.moments, self.state.step, with_master)?;
        let state = serde_json::to_string_pretty(&self.state)?;
        // PEFT's base_model_name_or_path: this directory, whose config.json and weights are the
        // base (transformers with peft installed then loads the adapted model from it).
        let abs = std::path::absolute(dir).with_context(|| format!("--save {}", dir.display()))?;
        checkpoint::write_dir_atomically(dir, |tmp| {
            self.model.save(tmp, base_format)?;
            if let Some(l) = lora {
                l.save(tmp, &abs.to_string_lossy())?;
            }
            for (name, text) in tokenizer_files.iter().flatten() {
                std::fs::write(tmp.join(name), text).with_context(|| format!("writing {name}"))?;
            }
            std::fs::write(tmp.join(checkpoint::OPTIMIZER_FILE), &opt)?;
            std::fs::write(tmp.join(checkpoint::STATE_FILE), format!("{state}\n"))?;
            Ok(())
        })
    }

    /// DAPO: the old log-probs of every rollout under the weights as they are now, before the
    /// first step (π_old of the ratio), and the reference model's when a KL term is used.
    pub fn prepare_rl(&mut self, data: &mut Dataset, reference: Option<&Model>) -> Result<()> {
        if let Some(gm) = self.cuda.as_deref_mut() {
            return cuda::prepare_rl(gm, data, reference);
        }
        let model = &self.model;
        data.examples.par_iter_mut().try_for_each(|ex| -> Result<()> {
            let seq = Seq { input_ids: &ex.input_ids, segment_ids: ex.segment_ids.as_deref(), shared_prefix: 0 };
            // only the targets' log-probs enter the loss
            let need = ex.target_mask();
            let old = model.token_stats_at(&seq, Some(&need)).with_context(|| format!("row {} (task_id {}): old log-probs", ex.row, Shown(&ex.task_id)))?.logp;
            let refl = match reference {
                Some(m) => Some(m.token_stats_at(&seq, Some(&need)).with_context(|| format!("row {} (task_id {}): reference log-probs", ex.row, Shown(&ex.task_id)))?.logp),
                None => None,
            };
            let Some(rl) = ex.rl.as_mut() else { bail!("row {} (task_id {}): --objective dapo needs scored rollouts", ex.row, Shown(&ex.task_id)) };
            rl.old_logp = Some(old);
            rl.ref_logp = refl;
            Ok(())
        })
    }

    /// One optimizer step over the next rows of `data`.
    pub fn step(&mut self, data: &Dataset) -> Result<StepReport> {
        if self.cuda.is_some() {
            return self.step_cuda(data);
        }
        let started = Instant::now();
        let rows = self.state.cursor.next_step(&data.examples, self.state.settings.batch_tokens);
        let n_targets: usize = rows.iter().map(|&r| data.examples[r].n_targets).sum();
        let n_tokens: usize = rows.iter().map(|&r| data.examples[r].input_ids.len()).sum();
        let step = self.state.step + 1;
        // Last step's gradient buffer, zeroed (a first step, or a model of another layout: a
        // fresh one). With LoRA: the adapter's tensors only.
        let mut grads = match self.cpu.grads.take() {
            Some(mut g) if g.check_same_layout(trained(&self.model), "").is_ok() => {
                g.tensors.iter_mut().for_each(|t| t.data.par_chunks_mut(1 << 14).for_each(|c| c.fill(0.0)));
                g
            }
            _ => trained(&self.model).zeros_like(),
        };
        let seed = self.state.settings.seed;
        let mut loss = 0.0f64;
        let mut sums = RlSums::default();
        let objective = self.objective;
        let model = &self.model;
        let ws = &mut self.cpu.ws;
        // One sequence at a time, every op parallel inside, each adding its gradients into
        // `grads`: the sum runs in row order whatever the thread count, and a step needs one
        // gradient buffer and one sequence's activations.
        for mb in micro_batches(&data.examples, &rows, self.state.settings.micro_batch_tokens) {
            // Rows sharing a prompt run as one sequence with the prompt once (see `share`).
            let packs = if self.share_prompts { share::packs(&data.examples, &mb) } else { mb.iter().map(|&r| share::Pack { rows: vec![r], prefix: 0 }).collect() };
            for pack in &packs {
                let (ids, mask, seg) = pack.build(&data.examples);
                let offsets = pack.offsets(&data.examples);
                let mut failed: Option<anyhow::Error> = None;
                let (mut seq_loss, mut seq_sums) = (0.0f64, RlSums::default());
                let seq = Seq { input_ids: &ids, segment_ids: seg.as_deref(), shared_prefix: pack.prefix };
                if let Some(l) = &model.lora {
                    l.set_dropout_seed(dropout_seed(seed, step, pack.rows[0]));
                }
                // Each row's loss and d loss / d logp from its own statistics, placed back
                // into the pack (the shared prefix has no target).
                let mut dloss = |stats: &coa_model::TokenStats| {
                    let mut d = vec![0f32; ids.len()];
                    for (k, &r) in pack.rows.iter().enumerate() {
                        let ex = &data.examples[r];
                        let row_stats = pack.row_stats(&data.examples, stats, k, offsets[k]);
                        match objective.token_grads(ex, &ex.target_mask(), &row_stats, n_targets) {
                            Ok((l, dr, s)) => {
                                seq_loss += l;
                                seq_sums.add(&s);
                                let (p, o) = (pack.prefix, offsets[k]);
                                d[o..o + dr.len() - p].copy_from_slice(&dr[p..]);
                            }
                            Err(e) => failed = Some(e),
                        }
                    }
                    d
                };
                let rows_named = || pack.rows.iter().map(|&r| format!("{} (task_id {})", data.examples[r].row, Shown(&data.examples[r].task_id))).collect::<Vec<_>>().join(", ");
                model
                    .forward_backward_in(ws, &seq, Some(&mask), &mut grads, &mut dloss)
                    .with_context(|| format!("step {step}: rows {}", rows_named()))?;
                if let Some(e) = failed {
                    return Err(e);
                }
                loss += seq_loss;
                sums.add(&seq_sums);
            }
        }
        let grad_norm = optim::global_norm(grads.tensors.iter().map(|t| t.data.as_slice()));
        check_finite(step, loss, grad_norm, data, &rows)?;
        let clip = optim::clip_factor(grad_norm, self.state.settings.grad_clip);
        let lr = self.state.settings.schedule.lr_at(step);
        let adamw = self.state.settings.adamw;
        let trainable = self.trainable();
        for ((p, g), m) in trained_mut(&mut self.model).tensors.iter_mut().zip(grads.tensors.iter_mut()).zip(self.moments.iter_mut()) {
            if clip < 1.0 {
                g.data.par_iter_mut().for_each(|x| *x *= clip);
            }
            for (span, mult) in trainable.lr_spans(&p.name, &p.shape) {
                optim::adamw_update_range(&adamw, lr * mult, step, optim::decays(&p.shape), &mut p.data, &g.data, m, span);
            }
        }
        self.cpu.grads = Some(grads);
        let totals = StepTotals { step, rows, n_targets, n_tokens, loss, lr, grad_norm, sums };
        Ok(self.finish_step(data, totals, started))
    }

    /// [`Trainer::step`] on the GPU ([`cuda::step`]), recorded as a CPU step is.
    fn step_cuda(&mut self, data: &Dataset) -> Result<StepReport> {
        let started = Instant::now();
        let trainable = self.trainable();
        let Some(gm) = self.cuda.as_deref_mut() else { bail!("internal: step_cuda without a GPU model") };
        let totals = cuda::step(gm, &mut self.state, self.objective, trainable, data)?;
        Ok(self.finish_step(data, totals, started))
    }

    /// Moves training to the GPU: uploads the f32 masters and the AdamW moments, and allocates
    /// the buffers for passes of `max(--micro-batch-tokens, longest row)` tokens.
    pub fn to_cuda(&mut self, gpu: Arc<Gpu>, data: &Dataset) -> Result<()> {
        self.cuda = Some(Box::new(cuda::upload(&self.state.settings, &self.model, &self.moments, gpu, data)?));
        Ok(())
    }

    /// Brings the GPU's master weights (or LoRA adapter) and moments back into `model` and
    /// `moments` (no-op on the CPU).
    pub fn sync_from_cuda(&mut self) -> Result<()> {
        let Some(gm) = &self.cuda else { return Ok(()) };
        self.moments = cuda::download(gm, &mut self.model)?;
        Ok(())
    }

    /// Which parameters this run updates, and at what rate.
    pub fn trainable(&self) -> optim::Trainable {
        optim::Trainable { new_rows: self.state.settings.new_rows, frozen_layers: self.state.settings.frozen_layers, tied_head: self.model.config.tie_word_embeddings }
    }

    /// Records a step taken (state, history) and reports it.
    fn finish_step(&mut self, data: &Dataset, t: StepTotals, started: Instant) -> StepReport {
        let StepTotals { step, rows, n_targets, n_tokens, loss, lr, grad_norm, sums } = t;
        let objective = self.objective;
        self.state.step = step;
        self.state.tokens_seen += n_tokens as u64;
        self.state.history.push(LogPoint { step, loss: loss as f32, lr: lr as f32, grad_norm: grad_norm as f32 });
        let rl = match objective {
            Objective::Sft => None,
            Objective::Dapo(_) => {
                let n = rows.len().max(1) as f64;
                let t = sums.targets.max(1) as f64;
                let rl_rows = rows.iter().filter_map(|&r| data.examples[r].rl.as_ref());
                let (reward, len) = rl_rows.fold((0.0, 0.0), |(a, b), x| (a + x.reward as f64, b + x.response_len as f64));
                Some(RlStep {
                    reward_mean: reward / n,
                    clip_frac: sums.clipped as f64 / t,
                    entropy: sums.entropy / t,
                    response_len: len / n,
                    logprob_mismatch: sums.mismatch / t,
                    kl: sums.kl / t,
                })
            }
        };
        StepReport { step, loss, lr, grad_norm, targets: n_targets, tokens: n_tokens, rows: rows.len(), seconds: started.elapsed().as_secs_f64(), rl }
    }
}
