//! What one optimizer step computes and reports, and the tensors it trains: shared by the CPU
//! step ([`crate::train`]) and the GPU step ([`crate::cuda`]).

use anyhow::{bail, Result};
use coa_model::{Model, Params};

use crate::data::Dataset;
use crate::objective::RlSums;

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// 1-based step number.
    pub step: u64,
    /// Token-mean loss over the whole step.
    pub loss: f64,
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Target tokens (the N of the mean).
    pub targets: usize,
    /// Input tokens processed.
    pub tokens: usize,
    pub rows: usize,
    pub seconds: f64,
    /// DAPO: the step's token statistics and its rows' mean reward and response length.
    pub rl: Option<RlStep>,
}

/// What a DAPO step reports beyond the loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlStep {
    pub reward_mean: f64,
    pub clip_frac: f64,
    pub entropy: f64,
    pub response_len: f64,
    pub logprob_mismatch: f64,
    pub kl: f64,
}

/// The LoRA dropout mask seed of a step's sequence, named by its (first) row: a resume, and the
/// GPU path (one row per sequence), draw the same masks.
pub(crate) fn dropout_seed(seed: u64, step: u64, row: usize) -> u64 {
    coa_schemas::rng::fmix64(seed ^ (step << 32) ^ row as u64)
}

/// The tensors a run trains: the adapter's with LoRA, else the model's.
pub fn trained(m: &Model) -> &Params {
    m.lora.as_ref().map_or(&m.params, |l| &l.params)
}

pub fn trained_mut(m: &mut Model) -> &mut Params {
    match m.lora.as_mut() {
        Some(l) => &mut l.params,
        None => &mut m.params,
    }
}

/// What a step computed, before it is recorded.
pub(crate) struct StepTotals {
    pub step: u64,
    pub rows: Vec<usize>,
    pub n_targets: usize,
    pub n_tokens: usize,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub sums: RlSums,
}

/// A step whose loss or gradient norm is not finite stops the run, naming its rows.
pub(crate) fn check_finite(step: u64, loss: f64, grad_norm: f64, data: &Dataset, rows: &[usize]) -> Result<()> {
    if !loss.is_finite() || !grad_norm.is_finite() {
        bail!("step {step}: the loss ({loss}) or the gradient norm ({grad_norm}) is not finite; lower --lr or check the data (rows {:?})", rows.iter().map(|&r| data.examples[r].row).collect::<Vec<_>>());
    }
    Ok(())
}
