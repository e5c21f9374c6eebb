//! The trainer on the GPU (`--device cuda`): the same steps as the CPU trainer, with the model,
//! its gradients and the AdamW state in a [`GpuModel`]. The trainer ([`crate::train::Trainer`])
//! holds the GPU model and calls these functions; they take the parts of it they use, so this
//! module does not depend on the trainer.
//!
//! What differs from the CPU path, and why:
//! - A micro-batch's rows run as one packed pass (attention and RoPE stay inside each row and
//!   segment), cut from the step's rows by [`micro_batches`] at the GPU buffers' capacity.
//! - The objective still decides `dloss/dlogp` per token on the host. SFT's does not depend on
//!   the log-probs, so the fused cross-entropy computes log-probs and gradient in one pass; DAPO's
//!   does, so its log-probs and entropies come back to the host first (two passes over the logits).
//! - Precision: bf16 weights and activations, fp32 gradients, master weights and moments; so a
//!   GPU run tracks a CPU run closely but not bit for bit. The clipping rule, the learning-rate
//!   schedule, the AdamW arithmetic and its decay rule (`optim::decays`) are the CPU's.
//! - Checkpoints are the CPU's format: the f32 masters and moments are downloaded into
//!   `Trainer::model` / `Trainer::moments` before a save, and a resume uploads them (either device
//!   can continue the other's run).
//! - LoRA: the adapter trains on the device as on the CPU (its gradients and moments only), with
//!   the CPU's dropout masks: each row is its own sequence with the seed the CPU gives a sequence
//!   of that row ([`crate::step::dropout_seed`]). Rows the CPU packs behind one shared prompt
//!   (DAPO's groups) draw other masks there, so with dropout the two then differ by the draw.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use coa_kernels::ops::adamw::AdamWArgs;
use coa_kernels::model::DLogp;
use coa_kernels::{Gpu, GpuModel};
use coa_model::{Model, Seq, TokenStats};
use coa_schemas::rows::Shown;

use crate::checkpoint::TrainerState;
use crate::data::{micro_batches, Dataset, Example};
use crate::objective::{Objective, RlSums};
use crate::optim::{self, Moments, Trainable};
use crate::settings::Settings;
use crate::step::{check_finite, dropout_seed, trained_mut, StepTotals};

fn seq_of(ex: &Example) -> Seq<'_> {
    Seq { input_ids: &ex.input_ids, segment_ids: ex.segment_ids.as_deref(), shared_prefix: 0 }
}

/// The GPU model of a run (`Trainer::to_cuda`): `model`'s f32 masters and the AdamW `moments`
/// uploaded, with buffers for passes of `max(--micro-batch-tokens, longest row)` tokens.
pub(crate) fn upload(settings: &Settings, model: &Model, moments: &[Moments], gpu: Arc<Gpu>, data: &Dataset) -> Result<GpuModel> {
    if settings.frozen_layers > 0 {
        bail!("--freeze-layers: the GPU path trains every layer (frozen layers are a CPU saving); drop the flag with --device cuda");
    }
    if settings.matmul != coa_model::MatmulDtype::F32 {
        bail!("--matmul {}: a CPU setting (the GPU path multiplies bf16 weights and activations already); drop the flag with --device cuda", settings.matmul);
    }
    let capacity = settings.micro_batch_tokens.max(data.max_len).max(1);
    let mut gm = GpuModel::with_lora(gpu, &model.config, &model.params, model.lora.as_ref(), capacity).map_err(|e| anyhow!("--device cuda: {e}"))?;
    let m: Vec<&[f32]> = moments.iter().map(|m| m.exp_avg.as_slice()).collect();
    let v: Vec<&[f32]> = moments.iter().map(|m| m.exp_avg_sq.as_slice()).collect();
    gm.upload_moments(&m, &v).map_err(|e| anyhow!("--device cuda: {e}"))?;
    Ok(gm)
}

/// The GPU's master weights (or LoRA adapter), downloaded into `model`, and its moments
/// (`Trainer::sync_from_cuda`).
pub(crate) fn download(gm: &GpuModel, model: &mut Model) -> Result<Vec<Moments>> {
    if gm.has_lora() {
        // The base does not change under LoRA.
        gm.download_lora(trained_mut(model)).map_err(|e| anyhow!("downloading the LoRA adapter from the GPU: {e}"))?;
    } else {
        gm.download_params(&mut model.params).map_err(|e| anyhow!("downloading the weights from the GPU: {e}"))?;
    }
    let (m, v) = gm.download_moments().map_err(|e| anyhow!("downloading the optimizer state from the GPU: {e}"))?;
    Ok(m.into_iter().zip(v).map(|(exp_avg, exp_avg_sq)| Moments { exp_avg, exp_avg_sq }).collect())
}

/// `Trainer::step` on the GPU: the next rows of `data` (from `state`'s cursor) through `gm`
/// and its AdamW update; returns what the step computed, for the trainer to record.
pub(crate) fn step(gm: &mut GpuModel, state: &mut TrainerState, objective: Objective, trainable: Trainable, data: &Dataset) -> Result<StepTotals> {
    let rows = state.cursor.next_step(&data.examples, state.settings.batch_tokens);
    let n_targets: usize = rows.iter().map(|&r| data.examples[r].n_targets).sum();
    let n_tokens: usize = rows.iter().map(|&r| data.examples[r].input_ids.len()).sum();
    let step = state.step + 1;
    let seed = state.settings.seed;
    let gpu_err = |e: coa_kernels::Error| anyhow!("step {step}: {e}");
    gm.zero_grads().map_err(gpu_err)?;
    let mut loss = 0.0f64;
    let mut sums = RlSums::default();
    for mb in micro_batches(&data.examples, &rows, gm.capacity()) {
        let exs: Vec<&Example> = mb.iter().map(|&r| &data.examples[r]).collect();
        let seqs: Vec<Seq> = exs.iter().map(|ex| seq_of(ex)).collect();
        let masks: Vec<Vec<u8>> = exs.iter().map(|ex| ex.target_mask()).collect();
        let at = || format!("step {step}: rows {:?}", exs.iter().map(|ex| ex.row).collect::<Vec<_>>());
        if gm.has_lora() {
            gm.set_dropout_seeds(mb.iter().map(|&r| dropout_seed(seed, step, r)).collect());
        }
        let fixed: Option<Vec<Vec<f32>>> = masks.iter().map(|m| objective.fixed_token_grads(m, n_targets)).collect();
        match &fixed {
            Some(d) => {
                let stats = gm.forward_backward(&seqs, DLogp::Fixed(d)).map_err(|e| anyhow!("{}: {e}", at()))?;
                // SFT's loss from the targets' log-probs the pass computed.
                for ((ex, mask), st) in exs.iter().zip(&masks).zip(&stats) {
                    let (l, _, s) = objective.token_grads(ex, mask, st, n_targets).with_context(at)?;
                    loss += l;
                    sums.add(&s);
                }
            }
            None => {
                // DAPO: the gradients, the loss and the statistics come from one call per row.
                let mut failed: Option<anyhow::Error> = None;
                let mut totals: Vec<(f64, RlSums)> = Vec::with_capacity(exs.len());
                let mut dloss = |stats: &[TokenStats]| -> Vec<Vec<f32>> {
                    exs.iter()
                        .zip(&masks)
                        .zip(stats)
                        .map(|((ex, mask), st)| match objective.token_grads(ex, mask, st, n_targets) {
                            Ok((l, d, s)) => {
                                totals.push((l, s));
                                d
                            }
                            Err(e) => {
                                failed.get_or_insert(e);
                                vec![0.0; mask.len()]
                            }
                        })
                        .collect()
                };
                gm.forward_backward(&seqs, DLogp::FromStats(&mut dloss)).map_err(|e| anyhow!("{}: {e}", at()))?;
                if let Some(e) = failed {
                    return Err(e.context(at()));
                }
                for (l, s) in &totals {
                    loss += l;
                    sums.add(s);
                }
            }
        }
    }
    let grad_norm = gm.grad_norm().map_err(gpu_err)?;
    check_finite(step, loss, grad_norm, data, &rows)?;
    let clip = optim::clip_factor(grad_norm, state.settings.grad_clip);
    let lr = state.settings.schedule.lr_at(step);
    let a = state.settings.adamw;
    gm.adamw_step(|name, shape| {
        trainable
            .lr_spans(name, shape)
            .into_iter()
            .map(|(span, mult)| (span, AdamWArgs::new(lr * mult, a.beta1, a.beta2, a.eps, a.weight_decay, step, optim::decays(shape), clip)))
            .collect()
    })
    .map_err(gpu_err)?;
    // The step's time includes its device work.
    gm.synchronize().map_err(gpu_err)?;
    Ok(StepTotals { step, rows, n_targets, n_tokens, loss, lr, grad_norm, sums })
}

/// `Trainer::prepare_rl` on the GPU: π_old from the current weights, and the reference
/// model's log-probs from its weights swapped into the bf16 working copy for the occasion.
pub(crate) fn prepare_rl(gm: &mut GpuModel, data: &mut Dataset, reference: Option<&Model>) -> Result<()> {
    let all: Vec<usize> = (0..data.examples.len()).collect();
    let passes = micro_batches(&data.examples, &all, gm.capacity());
    let logps = |gm: &mut GpuModel, what: &str| -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(all.len());
        for pass in &passes {
            let seqs: Vec<Seq> = pass.iter().map(|&r| seq_of(&data.examples[r])).collect();
            let stats = gm.token_stats(&seqs).map_err(|e| {
                let rows: Vec<usize> = pass.iter().map(|&r| data.examples[r].row).collect();
                anyhow!("rows {rows:?}: {what} log-probs: {e}")
            })?;
            out.extend(stats.into_iter().map(|s| s.logp));
        }
        Ok(out)
    };
    let old = logps(gm, "old")?;
    let refl = match reference {
        Some(m) => {
            gm.set_working_weights(&m.params).map_err(|e| anyhow!("--ref: {e}"))?;
            let r = logps(gm, "reference");
            gm.restore_working_weights().map_err(|e| anyhow!("restoring the policy weights: {e}"))?;
            Some(r?)
        }
        None => None,
    };
    // `passes` cover every example once, in order.
    let mut refl = refl.map(|r| r.into_iter());
    for (ex, old) in data.examples.iter_mut().zip(old) {
        let Some(rl) = ex.rl.as_mut() else { bail!("row {} (task_id {}): --objective dapo needs scored rollouts", ex.row, Shown(&ex.task_id)) };
        rl.old_logp = Some(old);
        rl.ref_logp = refl.as_mut().and_then(|r| r.next());
    }
    Ok(())
}
