//! Checkpoint directories: the HF model files plus what an exact resume needs.
//!
//! ```text
//! DIR/config.json, model.safetensors, generation_config.json   the model (coa-model writes them)
//! DIR/tokenizer.json, tokenizer_config.json                      when the tokenizer is known
//! DIR/optimizer.safetensors   exp_avg.<param>, exp_avg_sq.<param> (f32), and master.<param> (f32)
//!                             when model.safetensors was saved in bf16 (--save-dtype bf16)
//! DIR/trainer_state.json      step, data cursor + RNG state, schedule, optimizer and batch
//!                             settings, data fingerprint, loss history
//! ```
//! With `--save-dtype f32` (the default) the f32 weights in model.safetensors are the exact master
//! weights; with `bf16` the HF file is half the size and the exact f32 masters travel in
//! optimizer.safetensors, so a resume is exact either way.
//!
//! A directory is written under a temporary name beside DIR and renamed into place; an existing
//! DIR is replaced only if it looks like a checkpoint (never a directory of other files).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::data::Cursor;
use crate::optim::Moments;
use crate::settings::Settings;

pub const STATE_FILE: &str = "trainer_state.json";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const FORMAT: &str = "coa-train-step/1";

/// The data a run trains on, to refuse resuming on other data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataInfo {
    pub rows: usize,
    pub examples: usize,
    pub tokens: u64,
    pub targets: u64,
    pub fingerprint: String,
}

/// One logged step (kept so the plot of a resumed run shows the whole curve).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogPoint {
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub grad_norm: f32,
}

/// Everything besides the tensors that a resume needs. What defines the run (objective, settings,
/// data) must match on resume. Its JSON keys: format, objective, step, tokens_seen, the settings'
/// keys (see [`Settings`]), cursor, data, history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub format: String,
    pub objective: String,
    /// Optimizer steps taken so far.
    pub step: u64,
    pub tokens_seen: u64,
    #[serde(flatten)]
    pub settings: Settings,
    pub cursor: Cursor,
    pub data: DataInfo,
    pub history: Vec<LogPoint>,
}

impl TrainerState {
    pub fn read(dir: &Path) -> Result<TrainerState> {
        let path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| format!("--resume {}: cannot read {}", dir.display(), path.display()))?;
        let state: TrainerState = serde_json::from_str(&text).with_context(|| format!("{}: not a coa-train-step trainer state", path.display()))?;
        if state.format != FORMAT {
            bail!("{}: format {:?}, this coa-train-step reads {FORMAT:?}", path.display(), state.format);
        }
        Ok(state)
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Serializes the optimizer state (and optionally the f32 master weights) as safetensors.
pub fn optimizer_bytes(params: &[(String, Vec<usize>, &[f32])], moments: &[Moments], step: u64, with_master: bool) -> Result<Vec<u8>> {
    if params.len() != moments.len() {
        bail!("optimizer state has {} tensors, the model {}", moments.len(), params.len());
    }
    let mut buffers: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for ((name, shape, data), m) in params.iter().zip(moments) {
        buffers.push((format!("exp_avg.{name}"), shape.clone(), f32_bytes(&m.exp_avg)));
        buffers.push((format!("exp_avg_sq.{name}"), shape.clone(), f32_bytes(&m.exp_avg_sq)));
        if with_master {
            buffers.push((format!("master.{name}"), shape.clone(), f32_bytes(data)));
        }
    }
    let views: Vec<(String, TensorView)> = buffers
        .iter()
        .map(|(n, s, b)| TensorView::new(Dtype::F32, s.clone(), b).map(|v| (n.clone(), v)).map_err(|e| anyhow!("{n}: {e}")))
        .collect::<Result<_>>()?;
    // One metadata entry: safetensors writes the metadata map in hash order, so several keys
    // would make the bytes of identical states differ from run to run.
    let meta: HashMap<String, String> = [("coa_train_step".to_string(), serde_json::json!({"format": FORMAT, "step": step}).to_string())].into_iter().collect();
    safetensors::serialize(views, Some(meta)).map_err(|e| anyhow!("serializing the optimizer state: {e}"))
}

/// The optimizer state read back: moments in parameter order, and master weights when present.
pub struct OptimizerState {
    pub moments: Vec<Moments>,
    pub master: Option<Vec<Vec<f32>>>,
}

fn read_f32(st: &SafeTensors, name: &str, shape: &[usize], file: &Path) -> Result<Option<Vec<f32>>> {
    let t = match st.tensor(name) {
        Ok(t) => t,
        Err(_) => return Ok(None),
    };
    if t.dtype() != Dtype::F32 {
        bail!("{}: tensor `{name}` is {:?}, expected F32", file.display(), t.dtype());
    }
    if t.shape() != shape {
        bail!("{}: tensor `{name}` has shape {:?}, the model's parameter has {:?}", file.display(), t.shape(), shape);
    }
    Ok(Some(t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()))
}

/// Reads `optimizer.safetensors` for parameters `(name, shape)`; every moment must be there.
pub fn read_optimizer(dir: &Path, params: &[(String, Vec<usize>)]) -> Result<OptimizerState> {
    let file = dir.join(OPTIMIZER_FILE);
    let bytes = std::fs::read(&file).with_context(|| format!("--resume {}: cannot read {}", dir.display(), file.display()))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| anyhow!("{}: not a safetensors file: {e}", file.display()))?;
    let expected: std::collections::HashSet<String> =
        params.iter().flat_map(|(n, _)| [format!("exp_avg.{n}"), format!("exp_avg_sq.{n}"), format!("master.{n}")]).collect();
    if let Some(extra) = st.names().into_iter().find(|n| !expected.contains(*n)) {
        bail!("{}: tensor `{extra}` belongs to no parameter of the model", file.display());
    }
    let mut moments = Vec::with_capacity(params.len());
    let mut master = Vec::new();
    let mut n_master = 0;
    for (name, shape) in params {
        let get = |key: String| -> Result<Vec<f32>> {
            read_f32(&st, &key, shape, &file)?.ok_or_else(|| anyhow!("{}: tensor `{key}` is missing", file.display()))
        };
        let exp_avg = get(format!("exp_avg.{name}"))?;
        let exp_avg_sq = get(format!("exp_avg_sq.{name}"))?;
        moments.push(Moments { exp_avg, exp_avg_sq });
        match read_f32(&st, &format!("master.{name}"), shape, &file)? {
            Some(m) => {
                n_master += 1;
                master.push(m);
            }
            None => master.push(Vec::new()),
        }
    }
    let master = match n_master {
        0 => None,
        n if n == params.len() => Some(master),
        _ => bail!("{}: master weights are present for only {n_master} of {} parameters", file.display(), params.len()),
    };
    Ok(OptimizerState { moments, master })
}

/// Whether `dir` may be replaced by a new checkpoint: absent, empty, or a checkpoint already.
fn replaceable(dir: &Path) -> Result<bool> {
    if !dir.exists() {
        return Ok(true);
    }
    if !dir.is_dir() {
        bail!("--save {}: exists and is not a directory", dir.display());
    }
    let mut entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    if entries.next().is_none() {
        return Ok(true);
    }
    Ok(dir.join("config.json").exists() || dir.join(STATE_FILE).exists())
}

/// Checks `--save DIR` before any training: a directory that may be replaced (see
/// [`write_dir_atomically`]) in a place where it can be created.
pub fn check_save_dir(dir: &Path) -> Result<()> {
    if !replaceable(dir)? {
        bail!("--save {}: the directory holds files that are not a checkpoint; refusing to replace it", dir.display());
    }
    coa_schemas::output::check_output_path("--save", &dir.join(STATE_FILE))
}

/// Writes a checkpoint directory atomically ([`coa_schemas::output::write_dir_atomically`]):
/// `fill` writes the files into a fresh temporary directory beside `dir`, which then replaces
/// `dir`. A checkpoint is committed when written (it is the point a `--resume` restarts from),
/// not with the stage's other outputs.
pub fn write_dir_atomically(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    check_save_dir(dir)?;
    coa_schemas::output::write_dir_atomically(dir, fill).with_context(|| format!("writing checkpoint {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// trainer_state.json as this format has always written it: a fresh run's settings (no new
    /// rows, no frozen layers: both keys absent) ...
    const PLAIN: &str = r#"{
  "format": "coa-train-step/1",
  "objective": "sft",
  "step": 3,
  "tokens_seen": 1234,
  "seed": 7,
  "schedule": {
    "lr": 0.0003,
    "min_lr": 0.00003,
    "warmup_steps": 2,
    "total_steps": 10
  },
  "adamw": {
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "weight_decay": 0.01
  },
  "grad_clip": 1.0,
  "batch_tokens": 4096,
  "micro_batch_tokens": 1024,
  "cursor": {
    "epoch": 1,
    "position": 5,
    "epoch_rng_state": 18446744073709551557,
    "rng_state": 12345678901234567890
  },
  "data": {
    "rows": 40,
    "examples": 38,
    "tokens": 5000,
    "targets": 2100,
    "fingerprint": "00ff00ff00ff00ff"
  },
  "history": [
    {
      "step": 1,
      "loss": 5.25,
      "lr": 0.00015,
      "grad_norm": 2.5
    },
    {
      "step": 2,
      "loss": 4.75,
      "lr": 0.0003,
      "grad_norm": 1.125
    }
  ]
}
"#;

    /// ... and a DAPO run on a grown vocabulary with frozen layers (both keys present).
    const GROWN: &str = r#"{
  "format": "coa-train-step/1",
  "objective": "dapo",
  "step": 0,
  "tokens_seen": 0,
  "seed": 0,
  "schedule": {
    "lr": 1e-6,
    "min_lr": 1e-6,
    "warmup_steps": 0,
    "total_steps": 4
  },
  "adamw": {
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "weight_decay": 0.0
  },
  "grad_clip": 0.0,
  "batch_tokens": 512,
  "micro_batch_tokens": 512,
  "new_rows": {
    "first": 49152,
    "lr_mult": 10.0
  },
  "frozen_layers": 20,
  "cursor": {
    "epoch": 0,
    "position": 0,
    "epoch_rng_state": 0,
    "rng_state": 1
  },
  "data": {
    "rows": 8,
    "examples": 8,
    "tokens": 800,
    "targets": 400,
    "fingerprint": "abc"
  },
  "history": []
}
"#;

    /// Reads `text` as a checkpoint's trainer_state.json and writes it back as `Trainer::save`
    /// does: the bytes must not change (old checkpoints resume, new ones read the same).
    fn round_trip(text: &str) -> TrainerState {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), text).unwrap();
        let state = TrainerState::read(dir.path()).unwrap();
        assert_eq!(format!("{}\n", serde_json::to_string_pretty(&state).unwrap()), text);
        state
    }

    #[test]
    fn trainer_state_json_is_pinned() {
        let plain = round_trip(PLAIN);
        assert_eq!((plain.step, plain.tokens_seen, plain.cursor.rng_state), (3, 1234, 12345678901234567890));
        assert_eq!((plain.settings.seed, plain.settings.batch_tokens, plain.settings.micro_batch_tokens, plain.settings.grad_clip), (7, 4096, 1024, 1.0));
        assert_eq!((plain.settings.new_rows, plain.settings.frozen_layers, plain.settings.schedule.min_lr, plain.settings.adamw.eps), (None, 0, 3e-5, 1e-8));
        let grown = round_trip(GROWN);
        assert_eq!(grown.objective, "dapo");
        assert_eq!(grown.history, vec![]);
        assert_eq!((grown.settings.new_rows, grown.settings.frozen_layers), (Some(crate::optim::NewRows { first: 49152, lr_mult: 10.0 }), 20));
    }

    #[test]
    fn trainer_state_of_another_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), PLAIN.replace("coa-train-step/1", "coa-train-step/0")).unwrap();
        let err = TrainerState::read(dir.path()).err().unwrap().to_string();
        assert!(err.contains("format \"coa-train-step/0\""), "{err}");
    }
}
