//! AdamW with decoupled weight decay, and clipping by the global gradient norm: the f32 CPU
//! update coa-train-step applies, and the reference the GPU's AdamW kernel is tested against.
//!
//! The update is PyTorch's `torch.optim.AdamW` (non-amsgrad, `maximize=False`), step `t` 1-based:
//! ```text
//! p  <- p * (1 - lr * wd)                      (decoupled decay, only on decayed tensors)
//! m  <- beta1 * m + (1 - beta1) * g
//! v  <- beta2 * v + (1 - beta2) * g^2
//! p  <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! ```
//! Weight decay applies to matrices (embeddings, projections, the head) and not to 1-D tensors:
//! RMSNorm weights and QKV biases (the usual LLaMA-Factory / HF Trainer grouping).
//!
//! Clipping follows `torch.nn.utils.clip_grad_norm_`: the norm is the L2 norm over every
//! gradient element (accumulated in f64 here), and when it exceeds `max_norm` every gradient is
//! scaled by `max_norm / (norm + 1e-6)`. The reported norm is the one before clipping.

use std::ops::Range;

use anyhow::{bail, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    pub fn validate(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.beta1) {
            bail!("--beta1 must be in [0, 1), got {}", self.beta1);
        }
        if !(0.0..1.0).contains(&self.beta2) {
            bail!("--beta2 must be in [0, 1), got {}", self.beta2);
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            bail!("--eps must be positive, got {}", self.eps);
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            bail!("--weight-decay must be >= 0, got {}", self.weight_decay);
        }
        Ok(())
    }
}
/// Whether a tensor of this shape gets weight decay (matrices yes; norms and biases, 1-D, no).
pub fn decays(shape: &[usize]) -> bool {
    shape.len() >= 2
}
/// The Adam moments of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Moments {
    pub exp_avg: Vec<f32>,
    pub exp_avg_sq: Vec<f32>,
}

impl Moments {
    pub fn zeros(n: usize) -> Moments {
        Moments { exp_avg: vec![0.0; n], exp_avg_sq: vec![0.0; n] }
    }
}

/// One AdamW update of one tensor; `t` is the 1-based optimizer step.
pub fn adamw_update(cfg: &AdamWConfig, lr: f64, t: u64, decay: bool, param: &mut [f32], grad: &[f32], m: &mut Moments) {
    adamw_update_span(cfg, lr, t, decay, param, grad, &mut m.exp_avg, &mut m.exp_avg_sq)
}

/// [`adamw_update`] of the elements `span` of a tensor (its moments indexed alike).
#[allow(clippy::too_many_arguments)]
pub fn adamw_update_range(cfg: &AdamWConfig, lr: f64, t: u64, decay: bool, param: &mut [f32], grad: &[f32], m: &mut Moments, span: Range<usize>) {
    let (ma, va) = (&mut m.exp_avg[span.clone()], &mut m.exp_avg_sq[span.clone()]);
    adamw_update_span(cfg, lr, t, decay, &mut param[span.clone()], &grad[span], ma, va)
}

#[allow(clippy::too_many_arguments)]
fn adamw_update_span(cfg: &AdamWConfig, lr: f64, t: u64, decay: bool, param: &mut [f32], grad: &[f32], exp_avg: &mut [f32], exp_avg_sq: &mut [f32]) {
    assert_eq!(param.len(), grad.len());
    assert_eq!(param.len(), exp_avg.len());
    assert_eq!(param.len(), exp_avg_sq.len());
    let b1 = cfg.beta1 as f32;
    let b2 = cfg.beta2 as f32;
    let bc1 = 1.0 - cfg.beta1.powi(t as i32);
    let bc2 = 1.0 - cfg.beta2.powi(t as i32);
    let step_size = (lr / bc1) as f32;
    let bc2_sqrt = bc2.sqrt() as f32;
    let eps = cfg.eps as f32;
    let keep = if decay { (1.0 - lr * cfg.weight_decay) as f32 } else { 1.0 };
    const CHUNK: usize = 1 << 14;
    param
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(exp_avg.par_chunks_mut(CHUNK).zip(exp_avg_sq.par_chunks_mut(CHUNK)))
        .for_each(|((p, g), (ma, va))| {
            for i in 0..p.len() {
                let gi = g[i];
                let pi = p[i] * keep;
                let mi = ma[i] * b1 + (1.0 - b1) * gi;
                let vi = va[i] * b2 + (1.0 - b2) * gi * gi;
                ma[i] = mi;
                va[i] = vi;
                p[i] = pi - step_size * mi / (vi.sqrt() / bc2_sqrt + eps);
            }
        });
}

/// The global L2 norm over all gradients (f64 accumulation, deterministic order).
pub fn global_norm<'a>(grads: impl IntoIterator<Item = &'a [f32]>) -> f64 {
    let mut total = 0.0f64;
    for g in grads {
        // Fixed-size chunks summed in order: the result does not depend on the thread count.
        let partial: Vec<f64> = g.par_chunks(1 << 14).map(|c| c.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>()).collect();
        total += partial.iter().sum::<f64>();
    }
    total.sqrt()
}

/// The factor gradients are scaled by so that their global norm is at most `max_norm`
/// (`max_norm <= 0` disables clipping): torch's `max_norm / (norm + 1e-6)`, capped at 1.
pub fn clip_factor(norm: f64, max_norm: f64) -> f32 {
    if max_norm <= 0.0 || !norm.is_finite() {
        return 1.0;
    }
    let c = max_norm / (norm + 1e-6);
    if c < 1.0 { c as f32 } else { 1.0 }
}
