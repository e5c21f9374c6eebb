//! Training objectives. An objective only decides, per sequence, the loss and its gradient with
//! respect to each token's log-probability (`dloss/dlogp[t]`); the model's backward pass takes
//! it from there. SFT is here; DAPO (DESIGN §9) adds a variant whose per-token gradient is the
//! clipped-ratio policy gradient over the batch's unmasked token count.

use anyhow::{bail, Result};
use coa_model::TokenStats;

use crate::data::Example;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Masked mean cross-entropy: `loss = -(1/N) Σ_t mask[t] log p(x_t | x_<t)` with N the number
    /// of target tokens of the whole accumulated batch (all micro-batches of the step).
    Sft,
}

impl Objective {
    pub fn parse(name: &str) -> Result<Objective> {
        match name {
            "sft" => Ok(Objective::Sft),
            "dapo" => bail!(
                "--objective dapo: not implemented yet (it needs scored rollouts as input, DESIGN.md §9); \
                 this coa-train-step trains --objective sft on the `tokens` table"
            ),
            other => bail!("--objective {other:?}: unknown objective (expected sft or dapo)"),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Objective::Sft => "sft",
        }
    }

    /// The loss contribution of one sequence (to be summed over the step) and `dloss/dlogp[t]`
    /// for each of its tokens. `n_targets` is the target count of the whole step.
    pub fn token_grads(&self, example: &Example, target_mask: &[u8], stats: &TokenStats, n_targets: usize) -> (f64, Vec<f32>) {
        debug_assert_eq!(target_mask.len(), example.input_ids.len());
        match self {
            Objective::Sft => {
                let inv = 1.0 / n_targets as f64;
                let mut loss = 0.0f64;
                let mut g = vec![0.0f32; target_mask.len()];
                for (t, &m) in target_mask.iter().enumerate() {
                    if m != 0 {
                        loss -= stats.logp[t] as f64;
                        g[t] = -(inv as f32);
                    }
                }
                (loss * inv, g)
            }
        }
    }
}
