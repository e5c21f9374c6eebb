//! Training objectives. An objective only decides, per sequence, the loss and its gradient with
//! respect to each token's log-probability (`dloss/dlogp[t]`); the model's backward pass takes it
//! from there. SFT is here; DAPO (docs/ARCHITECTURE.md, "RL") adds a variant whose per-token
//! gradient is the clipped-ratio policy gradient over the batch's unmasked token count.

use anyhow::{bail, Result};
use coa_model::TokenStats;
use coa_schemas::rows::Shown;

use crate::dapo::{dapo_terms, DapoConfig};
use crate::data::Example;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Objective {
    /// Masked mean cross-entropy: `loss = -(1/N) Σ_t mask[t] log p(x_t | x_<t)` with N the number
    /// of target tokens of the whole accumulated batch (all micro-batches of the step).
    Sft,
    /// DAPO's clipped token-level policy loss on scored rollouts (see [`crate::dapo`]).
    Dapo(DapoConfig),
}

/// Per-sequence statistics an RL step reports (sums over the sequence's target tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RlSums {
    pub targets: usize,
    pub clipped: usize,
    pub entropy: f64,
    /// Σ |sampling log-prob − trainer log-prob| (the trainer's: recomputed before the first step).
    pub mismatch: f64,
    pub kl: f64,
}

impl RlSums {
    pub fn add(&mut self, o: &RlSums) {
        self.targets += o.targets;
        self.clipped += o.clipped;
        self.entropy += o.entropy;
        self.mismatch += o.mismatch;
        self.kl += o.kl;
    }
}

impl Objective {
    /// `dapo` takes its clip range and KL weight from [`DapoConfig::default`]; the CLI replaces
    /// them with its flags.
    pub fn parse(name: &str) -> Result<Objective> {
        match name {
            "sft" => Ok(Objective::Sft),
            "dapo" => Ok(Objective::Dapo(DapoConfig::default())),
            other => bail!("--objective {other:?}: unknown objective (expected sft or dapo)"),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Objective::Sft => "sft",
            Objective::Dapo(_) => "dapo",
        }
    }

    /// DAPO's loss, gradient and statistics for one sequence. The example must carry its
    /// rollout fields with the old log-probs filled in ([`crate::data::Dataset::read_scores`],
    /// `prepare_rl`).
    fn rl_token_grads(&self, example: &Example, target_mask: &[u8], stats: &TokenStats, n_targets: usize) -> Result<(f64, Vec<f32>, RlSums)> {
        let Objective::Dapo(config) = self else { bail!("internal: rl_token_grads on {}", self.name()) };
        let Some(rl) = &example.rl else { bail!("row {} (task_id {}): not a scored rollout", example.row, Shown(&example.task_id)) };
        let Some(old) = &rl.old_logp else { bail!("internal: old log-probs of row {} were not computed", example.row) };
        let t = dapo_terms(&stats.logp, old, rl.ref_logp.as_deref(), target_mask, rl.advantage, n_targets, config);
        let mut sums = RlSums { targets: t.targets, clipped: t.clipped, kl: t.kl, ..Default::default() };
        for (i, &m) in target_mask.iter().enumerate() {
            if m != 0 {
                sums.entropy += stats.entropy[i] as f64;
                sums.mismatch += (rl.sample_logp[i] as f64 - old[i] as f64).abs();
            }
        }
        Ok((t.loss, t.dlogp, sums))
    }

    /// The loss contribution of one sequence (to be summed over the step) and `dloss/dlogp[t]`
    /// for each of its tokens. `n_targets` is the target count of the whole step.
    pub fn token_grads(&self, example: &Example, target_mask: &[u8], stats: &TokenStats, n_targets: usize) -> Result<(f64, Vec<f32>, RlSums)> {
        debug_assert_eq!(target_mask.len(), example.input_ids.len());
        match self {
            Objective::Dapo(_) => self.rl_token_grads(example, target_mask, stats, n_targets),
            Objective::Sft => {
                let inv = 1.0 / n_targets as f64;
                let mut loss = 0.0f64;
                for (t, &m) in target_mask.iter().enumerate() {
                    if m != 0 {
                        loss -= stats.logp[t] as f64;
                    }
                }
                Ok((loss * inv, sft_dlogp(target_mask, n_targets), RlSums::default()))
            }
        }
    }

    /// `dloss/dlogp[t]` when it does not depend on the log-probs (SFT), so that a fused GPU
    /// kernel can compute the log-probs and the gradient in one pass; None when it does (DAPO).
    pub fn fixed_token_grads(&self, target_mask: &[u8], n_targets: usize) -> Option<Vec<f32>> {
        match self {
            Objective::Sft => Some(sft_dlogp(target_mask, n_targets)),
            Objective::Dapo(_) => None,
        }
    }
}

/// SFT's `dloss/dlogp`: −1/N on every target, 0 elsewhere.
fn sft_dlogp(target_mask: &[u8], n_targets: usize) -> Vec<f32> {
    let inv = 1.0 / n_targets as f64;
    target_mask.iter().map(|&m| if m != 0 { -(inv as f32) } else { 0.0 }).collect()
}
