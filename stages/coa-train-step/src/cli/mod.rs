//! The command line of `coa-train-step`: flags, their resolution against a checkpoint on
//! `--resume`, the training loop with its log table, and the outputs (metrics, checkpoint, plot).
//!
//! - [`args`]: the flags, and the checks that need no data.
//! - [`resolve`]: the objective, settings, tokenizer and trainer, from the flags and `--resume`.
//! - [`run`]: the run (trainer placed, steps, outputs) and `merge-lora`.
//!
//! The `plot` subcommand is [`crate::plot::command`].

pub mod args;
pub mod resolve;
pub mod run;

pub use args::{MergeArgs, SaveDtypeArg, TrainArgs};
pub use run::{run_merge, run_train};
