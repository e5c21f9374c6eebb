//! The settings that define a training run: saved in the checkpoint's trainer state and checked
//! on resume. A module of their own so that the trainer and the checkpoint format both use them
//! without using each other for them.

use serde::{Deserialize, Serialize};

use crate::optim::{self, AdamWConfig};
use crate::schedule::Schedule;

/// The settings that define a run besides its objective. Saved in trainer_state.json (flattened
/// into [`TrainerState`](crate::checkpoint::TrainerState), in this order); all but
/// `micro_batch_tokens` must match on resume. The objective stays apart: the state saves its
/// name, while its DAPO clip and KL settings are flags of each invocation
/// ([`Trainer::objective`](crate::train::Trainer::objective)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub seed: u64,
    pub schedule: Schedule,
    pub adamw: AdamWConfig,
    /// Max global gradient norm; 0 disables clipping.
    pub grad_clip: f64,
    pub batch_tokens: usize,
    pub micro_batch_tokens: usize,
    /// The embedding rows this run added to the vocabulary and their learning-rate factor
    /// (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_rows: Option<optim::NewRows>,
    /// The bottom decoder layers that do not train (0, absent from the file: all train).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frozen_layers: usize,
    /// What the linear layers' products multiply: f32, or both inputs rounded to bf16 (f32,
    /// absent from the file: f32).
    #[serde(default, skip_serializing_if = "is_f32")]
    pub matmul: coa_model::MatmulDtype,
    /// LoRA: the adapter that trains instead of the weights (absent: full fine-tuning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<coa_model::LoraConfig>,
}

fn is_f32(m: &coa_model::MatmulDtype) -> bool {
    *m == coa_model::MatmulDtype::F32
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
