//! Which parameters a run updates and at what rate ([`Trainable`], [`NewRows`]). The AdamW update
//! and the clipping by the global gradient norm are `coa_model::adamw` (the CPU reference the GPU
//! kernel is tested against), re-exported here.

use std::ops::Range;

use serde::{Deserialize, Serialize};

pub use coa_model::adamw::{adamw_update, adamw_update_range, clip_factor, decays, global_norm, AdamWConfig, Moments};

/// The embedding rows (and the rows of an untied head) that this run added for the tokenizer's
/// new tokens, the CoA tags, and the factor their learning rate is multiplied by.
///
/// A new row starts as the mean of its base pieces' rows (`<code>` from `<`, `code`, `>`), so it
/// sits next to the row of a common word; with a tied head its logit then moves with that word's,
/// and at the base learning rate a short fine-tune does not tell the two apart (the student
/// writes `code` where the tag belongs). A larger step on these few rows alone separates them
/// without touching what the pretrained rows know.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NewRows {
    /// The first new token id: rows `first..vocab_size` are new.
    pub first: usize,
    pub lr_mult: f64,
}

/// The tensors whose rows are vocabulary ids.
const VOCAB_ROW_TENSORS: [&str; 2] = ["model.embed_tokens.weight", "lm_head.weight"];

/// Which parameters a run updates, and at what rate.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Trainable {
    pub new_rows: Option<NewRows>,
    /// The bottom decoder layers that get no gradient (see `coa_model::Model::frozen_layers`);
    /// with any frozen, an untied input embedding gets none either.
    pub frozen_layers: usize,
    pub tied_head: bool,
}

impl Trainable {
    /// The element ranges of tensor `name` (shape `shape`, row-major) that are updated, and the
    /// learning-rate factor of each: none for a frozen tensor, `[(0..numel, 1.0)]` for most, and
    /// the new rows apart in the vocabulary-row tensors.
    pub fn lr_spans(&self, name: &str, shape: &[usize]) -> Vec<(Range<usize>, f64)> {
        let numel: usize = shape.iter().product();
        if self.is_frozen(name) {
            return Vec::new();
        }
        match self.new_rows {
            Some(n) if n.lr_mult != 1.0 && shape.len() == 2 && VOCAB_ROW_TENSORS.contains(&name) && n.first < shape[0] => {
                let split = n.first * shape[1];
                vec![(0..split, 1.0), (split..numel, n.lr_mult)]
            }
            _ => vec![(0..numel, 1.0)],
        }
    }

    pub fn is_frozen(&self, name: &str) -> bool {
        if self.frozen_layers == 0 {
            return false;
        }
        if name == "model.embed_tokens.weight" {
            return !self.tied_head;
        }
        let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()).and_then(|i| i.parse::<usize>().ok());
        layer.is_some_and(|l| l < self.frozen_layers)
    }
}
