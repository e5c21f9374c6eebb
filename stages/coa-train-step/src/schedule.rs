//! Learning-rate schedule: linear warmup, then cosine decay to `min_lr`.
//!
//! Steps are 1-based (the step about to be taken). For `step <= warmup_steps` the rate rises
//! linearly, `lr * step / warmup_steps` (so the first step already moves); after that it follows
//! `min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2` with `p = (step - warmup) / (total - warmup)`,
//! reaching `min_lr` exactly at `total_steps`. Past `total_steps` it stays at `min_lr`.
//! A constant rate after warmup (the DAPO reference setting) is `min_lr == lr`.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
}

impl Schedule {
    pub fn new(lr: f64, min_lr: f64, warmup_steps: u64, total_steps: u64) -> Result<Schedule> {
        if !(lr.is_finite() && lr > 0.0) {
            bail!("--lr must be a positive number, got {lr}");
        }
        if !(min_lr.is_finite() && min_lr >= 0.0 && min_lr <= lr) {
            bail!("--min-lr must be between 0 and --lr ({lr}), got {min_lr}");
        }
        if total_steps == 0 {
            bail!("the run has 0 optimizer steps (--steps / --epochs)");
        }
        Ok(Schedule { lr, min_lr, warmup_steps, total_steps })
    }

    /// The learning rate of 1-based step `step`.
    pub fn lr_at(&self, step: u64) -> f64 {
        if self.warmup_steps > 0 && step <= self.warmup_steps {
            return self.lr * step as f64 / self.warmup_steps as f64;
        }
        if step >= self.total_steps || self.total_steps <= self.warmup_steps {
            return if step >= self.total_steps { self.min_lr } else { self.lr };
        }
        let p = (step - self.warmup_steps) as f64 / (self.total_steps - self.warmup_steps) as f64;
        self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
    }
}
