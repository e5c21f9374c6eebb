//! Training data: the `tokens` table read whole and validated, its deterministic shuffle, and the
//! cutting of an epoch into optimizer steps and micro-batches.
//!
//! - Every row is checked: no null ids or mask entries, `loss_mask` (and `segment_ids` when set)
//!   as long as `input_ids`, mask values 0/1, ids non-negative and (once the model is known)
//!   below the vocabulary size, `n_tokens`/`n_targets` consistent. Errors name the row, the task
//!   and the column (and the position for ids).
//! - Targets: `loss_mask[t] = 1` marks token t as a target (HF unshifted labels). A token at a
//!   sequence or packed-segment start has no prefix to be predicted from and is never a target,
//!   whatever its mask says.
//! - Order: each epoch is a Fisher-Yates shuffle of the rows with targets, drawn from a SplitMix64
//!   generator seeded by `--seed`; its state at the start of the epoch is saved, so a resume
//!   regenerates the same order and continues at the saved cursor.
//! - Steps: an optimizer step takes rows in order while they fit in `--batch-tokens` (at least one
//!   row); steps never straddle an epoch (the last step of an epoch may be smaller). A step's rows
//!   are cut the same way into micro-batches of `--micro-batch-tokens`.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use arrow::array::{Array, AsArray, ListArray};
use arrow::datatypes::{Int32Type, UInt8Type};
use arrow::record_batch::RecordBatch;
use coa_schemas::rng::Fnv1a;
use coa_schemas::rows::Shown;
/// The shuffles' generator (its state is saved in the trainer state).
pub use coa_schemas::rng::SplitMix64;
use serde::{Deserialize, Serialize};

/// One training row.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// Index of its input in [`Dataset::sources`].
    pub source: usize,
    /// 0-based row within that input.
    pub row: usize,
    pub task_id: String,
    pub input_ids: Vec<u32>,
    pub loss_mask: Vec<u8>,
    pub segment_ids: Option<Vec<i32>>,
    /// Targets that can be predicted (mask 1 and not at a sequence/segment start).
    pub n_targets: usize,
    /// DAPO: the rollout's reward, advantage and log-probs (None for the `tokens` table).
    pub rl: Option<RlRow>,
}

/// The RL fields of a scored rollout. Per-position vectors cover `input_ids` (prompt + response);
/// the prompt's entries are 0.
#[derive(Debug, Clone, PartialEq)]
pub struct RlRow {
    pub reward: f32,
    pub advantage: f32,
    /// Log-probs the sampler recorded (0 on prompt and observation tokens).
    pub sample_logp: Vec<f32>,
    /// Response tokens (all turns).
    pub response_len: usize,
    /// π_old: filled by `Trainer::prepare_rl` before the first step.
    pub old_logp: Option<Vec<f32>>,
    /// The reference model's, with a KL term.
    pub ref_logp: Option<Vec<f32>>,
}

impl Example {
    /// The mask actually trained on: `loss_mask` with sequence and segment starts cleared.
    pub fn target_mask(&self) -> Vec<u8> {
        let mut m = self.loss_mask.clone();
        if let Some(first) = m.first_mut() {
            *first = 0;
        }
        if let Some(seg) = &self.segment_ids {
            for t in 1..m.len() {
                if seg[t] != seg[t - 1] {
                    m[t] = 0;
                }
            }
        }
        m
    }
}

/// The whole data set.
#[derive(Debug, Clone, Default)]
pub struct Dataset {
    pub examples: Vec<Example>,
    /// The inputs, in reading order (`stdin` or paths).
    pub sources: Vec<String>,
    /// Rows read (including rows without targets, which are not trained on).
    pub rows: usize,
    /// Rows read from the current (last) input.
    source_rows: usize,
    pub skipped_no_targets: usize,
    pub tokens: u64,
    pub targets: u64,
    /// FNV-1a over every row's ids, mask and segments: identifies the data for `--resume`.
    pub fingerprint: u64,
    pub max_len: usize,
}

fn list_col<'a>(batch: &'a RecordBatch, name: &str, source: &str) -> Result<&'a ListArray> {
    let col = batch.column_by_name(name).ok_or_else(|| anyhow!("{source}: the `tokens` table has no column `{name}`"))?;
    col.as_list_opt::<i32>().ok_or_else(|| anyhow!("{source}: column `{name}` is not a list"))
}

impl Dataset {
    /// Appends the rows of one batch of the `tokens` table (already schema-checked and cast by
    /// the reader). `source` names the input in errors; a new name starts a new input.
    pub fn add_batch(&mut self, batch: &RecordBatch, source: &str) -> Result<()> {
        if self.sources.last().map(|s| s.as_str()) != Some(source) {
            self.sources.push(source.to_string());
            self.source_rows = 0;
        }
        let source_idx = self.sources.len() - 1;
        let ids = list_col(batch, "input_ids", source)?;
        let mask = list_col(batch, "loss_mask", source)?;
        let seg = list_col(batch, "segment_ids", source)?;
        let task = batch.column_by_name("task_id").ok_or_else(|| anyhow!("{source}: the `tokens` table has no column `task_id`"))?;
        let task = task.as_string_opt::<i32>().ok_or_else(|| anyhow!("{source}: column `task_id` is not utf8"))?;
        let n_tok = batch.column_by_name("n_tokens").ok_or_else(|| anyhow!("{source}: the `tokens` table has no column `n_tokens`"))?.as_primitive::<Int32Type>();
        let n_tgt = batch.column_by_name("n_targets").ok_or_else(|| anyhow!("{source}: the `tokens` table has no column `n_targets`"))?.as_primitive::<Int32Type>();
        for i in 0..batch.num_rows() {
            let row = self.source_rows;
            self.rows += 1;
            self.source_rows += 1;
            let task_id = if task.is_null(i) { String::new() } else { task.value(i).to_string() };
            let at = || format!("{source}: row {row} (task_id {})", Shown(&task_id));
            if ids.is_null(i) {
                bail!("{}: `input_ids` is null", at());
            }
            if mask.is_null(i) {
                bail!("{}: `loss_mask` is null", at());
            }
            let id_vals = ids.value(i);
            let id_vals = id_vals.as_primitive::<Int32Type>();
            let m_vals = mask.value(i);
            let m_vals = m_vals.as_primitive::<UInt8Type>();
            if id_vals.null_count() > 0 {
                bail!("{}: `input_ids` holds a null at position {}", at(), (0..id_vals.len()).find(|&k| id_vals.is_null(k)).unwrap_or(0));
            }
            if m_vals.null_count() > 0 {
                bail!("{}: `loss_mask` holds a null at position {}", at(), (0..m_vals.len()).find(|&k| m_vals.is_null(k)).unwrap_or(0));
            }
            if m_vals.len() != id_vals.len() {
                bail!("{}: `loss_mask` has {} entries but `input_ids` has {}", at(), m_vals.len(), id_vals.len());
            }
            let mut input_ids = Vec::with_capacity(id_vals.len());
            for (p, &v) in id_vals.values().iter().enumerate() {
                if v < 0 {
                    bail!("{}, position {p}: `input_ids` holds the negative token id {v}", at());
                }
                input_ids.push(v as u32);
            }
            let loss_mask: Vec<u8> = m_vals.values().to_vec();
            if let Some(p) = loss_mask.iter().position(|&m| m > 1) {
                bail!("{}, position {p}: `loss_mask` holds {} (only 0 and 1 are allowed)", at(), loss_mask[p]);
            }
            let segment_ids = if seg.is_null(i) {
                None
            } else {
                let s = seg.value(i);
                let s = s.as_primitive::<Int32Type>();
                if s.null_count() > 0 {
                    bail!("{}: `segment_ids` holds a null", at());
                }
                if s.len() != id_vals.len() {
                    bail!("{}: `segment_ids` has {} entries but `input_ids` has {}", at(), s.len(), id_vals.len());
                }
                Some(s.values().to_vec())
            };
            if n_tok.is_valid(i) && n_tok.value(i) as usize != input_ids.len() {
                bail!("{}: `n_tokens` is {} but `input_ids` has {} entries", at(), n_tok.value(i), input_ids.len());
            }
            let ones = loss_mask.iter().filter(|&&m| m == 1).count();
            if n_tgt.is_valid(i) && n_tgt.value(i) as usize != ones {
                bail!("{}: `n_targets` is {} but `loss_mask` has {} ones", at(), n_tgt.value(i), ones);
            }
            let mut h = Fnv1a::new();
            h.write(&(input_ids.len() as u64).to_le_bytes());
            for &v in &input_ids {
                h.write(&v.to_le_bytes());
            }
            h.write(&loss_mask);
            if let Some(s) = &segment_ids {
                for &v in s {
                    h.write(&v.to_le_bytes());
                }
            }
            self.fingerprint = (self.fingerprint ^ h.finish()).rotate_left(5).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            self.push(Example { source: source_idx, row, task_id, input_ids, loss_mask, segment_ids, n_targets: 0, rl: None });
        }
        Ok(())
    }

    /// Counts a validated row and keeps it when it has a target (`n_targets` is computed here).
    /// Public for data built in memory (benchmarks, tests), which the readers' checks skip.
    pub fn push(&mut self, mut ex: Example) {
        ex.n_targets = ex.target_mask().iter().filter(|&&m| m == 1).count();
        self.tokens += ex.input_ids.len() as u64;
        if ex.n_targets == 0 {
            self.skipped_no_targets += 1;
            return;
        }
        self.targets += ex.n_targets as u64;
        self.max_len = self.max_len.max(ex.input_ids.len());
        self.examples.push(ex);
    }

    /// Checks every id against the vocabulary and every length against the context window.
    pub fn check_model_fit(&self, vocab_size: usize, max_positions: usize) -> Result<()> {
        for ex in &self.examples {
            let source = &self.sources[ex.source];
            if let Some(p) = ex.input_ids.iter().position(|&v| v as usize >= vocab_size) {
                bail!(
                    "{source}: row {} (task_id {}), position {p}: token id {} is outside the model's vocabulary (vocab_size {vocab_size})",
                    ex.row,
                    Shown(&ex.task_id),
                    ex.input_ids[p]
                );
            }
            if ex.input_ids.len() > max_positions {
                bail!(
                    "{source}: row {} (task_id {}) has {} tokens, more than the model's max_position_embeddings {max_positions} (tokenize with --max-len)",
                    ex.row,
                    Shown(&ex.task_id),
                    ex.input_ids.len()
                );
            }
        }
        Ok(())
    }

    pub fn fingerprint_hex(&self) -> String {
        format!("{:016x}", self.fingerprint)
    }
}

/// Where the data stream stands: which epoch, its order, and the next position in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cursor {
    /// 0-based epoch.
    pub epoch: u64,
    /// Next position in this epoch's order.
    pub position: usize,
    /// Generator state before this epoch's shuffle (regenerates `order`).
    pub epoch_rng_state: u64,
    /// Generator state now (after this epoch's shuffle).
    pub rng_state: u64,
    #[serde(skip)]
    pub order: Vec<usize>,
}

impl Cursor {
    /// The start of the stream for `n` examples.
    pub fn start(seed: u64, n: usize) -> Cursor {
        let mut rng = SplitMix64::new(seed);
        let epoch_rng_state = rng.state;
        let order = rng.permutation(n);
        Cursor { epoch: 0, position: 0, epoch_rng_state, rng_state: rng.state, order }
    }

    /// Regenerates the order after loading a saved cursor, checking it against the saved state.
    pub fn restore(mut self, n: usize) -> Result<Cursor> {
        let mut rng = SplitMix64::new(self.epoch_rng_state);
        self.order = rng.permutation(n);
        if rng.state != self.rng_state {
            bail!("trainer_state.json: the data cursor's RNG state does not match its epoch state (the file was edited?)");
        }
        if self.position > n {
            bail!("trainer_state.json: data cursor position {} is past the {n} training rows", self.position);
        }
        Ok(self)
    }

    fn next_epoch(&mut self, n: usize) {
        let mut rng = SplitMix64::new(self.rng_state);
        self.epoch += 1;
        self.position = 0;
        self.epoch_rng_state = rng.state;
        self.order = rng.permutation(n);
        self.rng_state = rng.state;
    }

    /// The rows (indices into `examples`) of the next optimizer step, advancing the cursor.
    pub fn next_step(&mut self, examples: &[Example], batch_tokens: usize) -> Vec<usize> {
        if self.position >= self.order.len() {
            self.next_epoch(examples.len());
        }
        let mut rows = Vec::new();
        let mut tokens = 0usize;
        while self.position < self.order.len() {
            let idx = self.order[self.position];
            let len = examples[idx].input_ids.len();
            if !rows.is_empty() && tokens + len > batch_tokens {
                break;
            }
            rows.push(idx);
            tokens += len;
            self.position += 1;
        }
        rows
    }
}

/// Cuts a step's rows into micro-batches of at most `micro_batch_tokens` (at least one row each).
pub fn micro_batches(examples: &[Example], rows: &[usize], micro_batch_tokens: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur = Vec::new();
    let mut tokens = 0usize;
    for &r in rows {
        let len = examples[r].input_ids.len();
        if !cur.is_empty() && tokens + len > micro_batch_tokens {
            out.push(std::mem::take(&mut cur));
            tokens = 0;
        }
        cur.push(r);
        tokens += len;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The number of optimizer steps in `epochs` epochs (simulating the batching of each epoch).
pub fn steps_for_epochs(examples: &[Example], seed: u64, batch_tokens: usize, epochs: f64) -> u64 {
    let n = examples.len();
    let total_rows = (epochs * n as f64).ceil() as u64;
    let mut cursor = Cursor::start(seed, n);
    let mut seen = 0u64;
    let mut steps = 0u64;
    while seen < total_rows {
        seen += cursor.next_step(examples, batch_tokens).len() as u64;
        steps += 1;
    }
    steps
}

impl Dataset {
    /// Appends the rows of one batch of the `scores` table (DAPO): input = prompt_ids ++
    /// response_ids, targets = the response's loss_mask (tokens the policy wrote; prompt and
    /// observations are not targets).
    pub fn add_scores_batch(&mut self, batch: &RecordBatch, source: &str) -> Result<()> {
        use arrow::datatypes::Float32Type;
        if self.sources.last().map(|s| s.as_str()) != Some(source) {
            self.sources.push(source.to_string());
            self.source_rows = 0;
        }
        let source_idx = self.sources.len() - 1;
        let rollouts = coa_schemas::rows::from_batch::<coa_schemas::rows::Rollout>(batch).map_err(|e| anyhow!("{source}: {e:#}"))?;
        let col = |name: &str| batch.column_by_name(name).ok_or_else(|| anyhow!("{source}: the `scores` table has no column `{name}`"));
        let reward = col("reward")?.as_primitive::<Float32Type>().clone();
        let advantage = col("advantage")?.as_primitive::<Float32Type>().clone();
        for (i, r) in rollouts.into_iter().enumerate() {
            let row = self.source_rows;
            self.rows += 1;
            self.source_rows += 1;
            let at = || format!("{source}: row {row} (task_id {})", Shown(&r.task_id));
            let n = r.response_ids.len();
            if r.loss_mask.len() != n || r.logprobs.len() != n {
                bail!("{}: `response_ids` has {n} entries but `loss_mask` {} and `logprobs` {}", at(), r.loss_mask.len(), r.logprobs.len());
            }
            if let Some(p) = r.loss_mask.iter().position(|&m| m > 1) {
                bail!("{}, response position {p}: `loss_mask` holds {} (only 0 and 1 are allowed)", at(), r.loss_mask[p]);
            }
            if !advantage.value(i).is_finite() || !reward.value(i).is_finite() {
                bail!("{}: `reward` or `advantage` is not finite", at());
            }
            let mut input_ids = Vec::with_capacity(r.prompt_ids.len() + n);
            for (p, &v) in r.prompt_ids.iter().chain(&r.response_ids).enumerate() {
                if v < 0 {
                    bail!("{}, position {p}: token id {v} is negative", at());
                }
                input_ids.push(v as u32);
            }
            let mut loss_mask = vec![0u8; r.prompt_ids.len()];
            loss_mask.extend_from_slice(&r.loss_mask);
            let mut sample_logp = vec![0f32; r.prompt_ids.len()];
            sample_logp.extend_from_slice(&r.logprobs);
            let mut h = Fnv1a::new();
            for &v in &input_ids {
                h.write(&v.to_le_bytes());
            }
            h.write(&loss_mask);
            h.write(&advantage.value(i).to_le_bytes());
            self.fingerprint = (self.fingerprint ^ h.finish()).rotate_left(5).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let rl = RlRow { reward: reward.value(i), advantage: advantage.value(i), sample_logp, response_len: n, old_logp: None, ref_logp: None };
            self.push(Example { source: source_idx, row, task_id: r.task_id, input_ids, loss_mask, segment_ids: None, n_targets: 0, rl: Some(rl) });
        }
        Ok(())
    }
}

/// Reads whole `scores` tables (DAPO), concatenated in order (stdin when `paths` is empty).
pub fn read_scores(stage: &mut coa_schemas::stage::Stage, paths: &[&Path]) -> Result<Dataset> {
    let mut d = Dataset::default();
    let stdin: [Option<&Path>; 1] = [None];
    let inputs: Vec<Option<&Path>> = if paths.is_empty() { stdin.to_vec() } else { paths.iter().map(|p| Some(*p)).collect() };
    for path in inputs {
        let reader = stage.open(path, &coa_schemas::tables::SCORES)?;
        let source = reader.source().to_string();
        for batch in reader {
            let batch = batch?;
            stage.add_rows_in(batch.num_rows() as u64);
            d.add_scores_batch(&batch, &source)?;
        }
    }
    if d.examples.is_empty() {
        bail!(
            "{}: no rollout to train on ({} rows; every response is empty or fully masked, or dynamic sampling dropped every group)",
            d.sources.join(", "),
            d.rows
        );
    }
    Ok(d)
}

/// Reads whole `tokens` tables, concatenated in order (stdin when `paths` is empty). The order
/// of the inputs is part of the data (and of its fingerprint).
pub fn read(stage: &mut coa_schemas::stage::Stage, paths: &[&Path]) -> Result<Dataset> {
    let mut d = Dataset::default();
    let stdin: [Option<&Path>; 1] = [None];
    let inputs: Vec<Option<&Path>> = if paths.is_empty() { stdin.to_vec() } else { paths.iter().map(|p| Some(*p)).collect() };
    // Every input by name, those without a row too: the error below names what was read.
    let mut read_from: Vec<String> = Vec::new();
    for path in inputs {
        let reader = stage.open(path, &coa_schemas::tables::TOKENS)?;
        let mut source = reader.source().to_string();
        if read_from.contains(&source) {
            source = format!("{source} (input {})", read_from.len() + 1);
        }
        read_from.push(source.clone());
        for batch in reader {
            let batch = batch?;
            stage.add_rows_in(batch.num_rows() as u64);
            d.add_batch(&batch, &source)?;
        }
    }
    if d.examples.is_empty() {
        bail!("{}: no row has a target token (loss_mask is all 0, or the input is empty: {} rows)", read_from.join(", "), d.rows);
    }
    Ok(d)
}
