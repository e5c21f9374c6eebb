//! `coa-train-step`: optimizer steps of a Llama/Qwen2 model on the CPU or a CUDA GPU (see
//! docs/ARCHITECTURE.md, "Training" and "RL").
//!
//! - [`data`]: the `tokens` table, validated; deterministic shuffling, steps and micro-batches.
//! - [`objective`]: per-token loss gradients (SFT, DAPO).
//! - [`dapo`]: the DAPO clipped token-level policy loss, by itself.
//! - [`schedule`]: warmup then cosine learning rate.
//! - [`optim`]: which parameters train and at what rate; AdamW and global-norm clipping
//!   (`coa_model::adamw`, re-exported).
//! - [`settings`]: the settings that define a run (saved in the checkpoint, checked on resume).
//! - [`step`]: what one optimizer step computes and reports, on either device.
//! - [`train`]: the trainer (one optimizer step; save and load for exact resume).
//! - [`share`]: rows that share a prompt packed behind it, computed once.
//! - [`cuda`]: the trainer's GPU path (`--device cuda`), on `coa_kernels::GpuModel`.
//! - [`checkpoint`]: the checkpoint directory (optimizer and trainer state, atomic writes).
//! - [`plot`]: the figures (curves, bar panels) as PNG, and the log's text table.
//! - [`tensorboard`]: per-step metrics as TensorBoard event files (`--tensorboard DIR`).
//! - [`cli`]: the command line.

pub mod checkpoint;
pub mod cli;
pub mod cuda;
pub mod dapo;
pub mod data;
pub mod objective;
pub mod optim;
pub mod plot;
pub mod schedule;
pub mod settings;
pub mod share;
pub mod step;
pub mod tensorboard;
pub mod train;
