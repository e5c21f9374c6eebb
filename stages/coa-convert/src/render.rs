//! `trajectories` → `coa_text` (prompt, rendered CoA text, observation spans), and the exports
//! that make the data train as the field trains it:
//!
//! - **alpaca JSON** (AFM's LLaMA-Factory fork, `--ignore_observation true`): a JSON array of
//!   `{instruction, input, output}`, the whole trajectory as one assistant turn: `instruction` =
//!   the prompt, `input` = "", `output` = the CoA text with a blank line before and after every
//!   `<observation>…</observation>` block. The fork masks an observation from the tokens of
//!   `<observation` to the tokens of `observation>\n\n`; with a single newline after the block
//!   that end marker never appears and no observation would be masked.
//! - **sharegpt JSON** (upstream LLaMA-Factory): `{"conversations": [{"from", "value"}, …]}`:
//!   the prompt as the `human` turn, then the CoA text cut at the observations: the text up to a
//!   tool call is a `gpt` turn, its `<observation>…</observation>` block an `observation` turn
//!   (which LLaMA-Factory masks from the loss), and so on to the final `gpt` turn. Joining the
//!   turns after the prompt with `\n` gives the `coa_text` text back.
//! - **verl Parquet** (RL), see [`crate::verl`].
//!
//! A trajectory with `format_ok = false`, steps that break the grammar (checked again here), a
//! role that is no CoA tag, content that cannot be rendered, or (verl) no ground truth is bad: an
//! error naming the row and task, or with `skip_bad` a row of the reject table.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int32Array, ListArray, StringArray, StringBuilder, StructArray};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Fields, SchemaRef};
use arrow::record_batch::RecordBatch;
use coa_format::{render_to, validate, write_prompt, Flavor, Span, Step, Tag};
use coa_schemas::tables::COA_TEXT;
use rayon::prelude::*;
use serde::Serialize;

use coa_schemas::parallel::{self, opt_str, select, Unit};
use crate::verl::VerlTask;

/// What `coa-convert` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The `coa_text` table.
    CoaText,
    /// AFM's LLaMA-Factory alpaca JSON.
    AlpacaJson,
    /// Upstream LLaMA-Factory sharegpt JSON.
    ShareGpt,
    /// verl RL Parquet.
    Verl,
}

impl Target {
    /// A JSON array of records (with a `dataset_info.json` entry beside it).
    pub fn is_json(self) -> bool {
        matches!(self, Target::AlpacaJson | Target::ShareGpt)
    }
}

/// Options of one conversion.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub target: Target,
    pub skip_bad: bool,
    /// task_id → the task as a verl row sees it (its source, its file's index, a code task's
    /// test spec), from the tasks table `--tasks` names.
    pub tasks: Option<Arc<HashMap<String, VerlTask>>>,
}

/// One work unit's result.
pub struct UnitOut {
    /// The `coa_text` rows of the kept trajectories.
    pub coa: RecordBatch,
    /// Input row (within its batch) of each kept trajectory.
    pub kept: Vec<u32>,
    /// verl rows, one per kept row (verl only).
    pub verl: Vec<VerlTask>,
    /// JSON records (alpaca or sharegpt), `,\n`-separated, no brackets.
    pub json: Vec<u8>,
    pub rejected: Vec<(u32, String)>,
    pub spans: u64,
}

/// The trajectory columns convert reads.
struct Trajs<'a> {
    task_id: &'a StringArray,
    suite: &'a StringArray,
    question: &'a StringArray,
    answers: &'a ListArray,
    answer_items: &'a StringArray,
    steps: &'a ListArray,
    role: &'a StringArray,
    content: &'a StringArray,
    observation: &'a StringArray,
    format_ok: &'a BooleanArray,
    format_error: &'a StringArray,
}

impl<'a> Trajs<'a> {
    fn new(batch: &'a RecordBatch) -> Result<Trajs<'a>> {
        let steps = parallel::list(batch, "steps")?;
        let st = steps.values().as_struct_opt().ok_or_else(|| anyhow!("`steps` items are not structs"))?;
        let answers = parallel::list(batch, "answers")?;
        let answer_items = answers.values().as_string_opt::<i32>().ok_or_else(|| anyhow!("`answers` items are not utf8"))?;
        let what = "`steps` item";
        Ok(Trajs {
            task_id: parallel::utf8(batch, "task_id")?,
            suite: parallel::utf8(batch, "suite")?,
            question: parallel::utf8(batch, "question")?,
            answers,
            answer_items,
            steps,
            role: parallel::struct_utf8(st, "role", what)?,
            content: parallel::struct_utf8(st, "content", what)?,
            observation: parallel::struct_utf8(st, "observation", what)?,
            format_ok: parallel::boolean(batch, "format_ok")?,
            format_error: parallel::utf8(batch, "format_error")?,
        })
    }
}

impl Trajs<'_> {
    /// Row `i` as a verl task; its source, index and a code task's test spec come from the tasks
    /// table (`tasks`).
    fn verl_task(&self, i: usize, tasks: Option<&HashMap<String, VerlTask>>) -> VerlTask {
        let o = self.answers.value_offsets();
        let answers = (o[i] as usize..o[i + 1] as usize).filter(|&k| !self.answer_items.is_null(k)).map(|k| self.answer_items.value(k).to_string()).collect();
        let task_id = self.task_id.value(i);
        let known = tasks.and_then(|m| m.get(task_id));
        VerlTask {
            task_id: task_id.to_string(),
            suite: self.suite.value(i).to_string(),
            question: self.question.value(i).to_string(),
            answers,
            code_spec: known.and_then(|t| t.code_spec.clone()),
            source: known.and_then(|t| t.source.clone()),
            source_index: known.and_then(|t| t.source_index.clone()),
        }
    }
}

#[derive(Serialize)]
struct Alpaca<'a> {
    instruction: &'a str,
    input: &'a str,
    output: &'a str,
}

#[derive(Serialize)]
struct Turn<'a> {
    from: &'static str,
    value: &'a str,
}

#[derive(Serialize)]
struct ShareGpt<'a> {
    conversations: Vec<Turn<'a>>,
}

/// Byte ranges of character spans (within `text`).
fn byte_ranges(text: &str, spans: &[Span]) -> Vec<(usize, usize)> {
    let starts: Vec<usize> = text.char_indices().map(|(b, _)| b).chain(std::iter::once(text.len())).collect();
    spans.iter().map(|s| (starts[s.start], starts[s.end])).collect()
}

/// The alpaca output: the text with a blank line around every observation block (module docs).
fn afm_output(text: &str, spans: &[Span]) -> String {
    let mut out = String::with_capacity(text.len() + 2 * spans.len());
    let mut from = 0;
    for (start, end) in byte_ranges(text, spans) {
        out.push_str(&text[from..start]);
        out.push('\n');
        out.push_str(&text[start..end]);
        out.push('\n');
        from = end;
    }
    out.push_str(&text[from..]);
    out
}

/// The sharegpt conversation of one trajectory (module docs).
fn sharegpt<'a>(prompt: &'a str, text: &'a str, spans: &[Span]) -> ShareGpt<'a> {
    let mut turns = vec![Turn { from: "human", value: prompt }];
    let mut from = 0;
    for (start, end) in byte_ranges(text, spans) {
        turns.push(Turn { from: "gpt", value: text[from..start].trim_matches('\n') });
        turns.push(Turn { from: "observation", value: &text[start..end] });
        from = end;
    }
    turns.push(Turn { from: "gpt", value: text[from..].trim_matches('\n') });
    ShareGpt { conversations: turns }
}

fn spans_item(schema: &SchemaRef) -> Result<(Arc<Field>, Fields)> {
    let DataType::List(item) = schema.field_with_name("observation_spans")?.data_type() else {
        bail!("coa_text.observation_spans is not a list")
    };
    let DataType::Struct(fields) = item.data_type() else { bail!("coa_text.observation_spans items are not structs") };
    Ok((item.clone(), fields.clone()))
}

fn to_i32(n: usize, what: &str) -> Result<i32, String> {
    i32::try_from(n).map_err(|_| format!("{what} exceeds 2^31 characters"))
}

/// Converts one unit of a `trajectories` batch.
pub fn convert_unit(batch: &RecordBatch, unit: Unit, opts: &ConvertOptions) -> Result<UnitOut> {
    let schema = COA_TEXT.schema();
    let t = Trajs::new(batch)?;
    let (lo, hi) = (unit.lo, unit.hi);
    let n = hi - lo;
    let so = t.steps.value_offsets();
    let (s_lo, s_hi) = (so[lo] as usize, so[hi] as usize);
    let bytes = |a: &StringArray| (a.value_offsets()[s_hi] - a.value_offsets()[s_lo]).max(0) as usize;
    let mut text = StringBuilder::with_capacity(n, bytes(t.content) + bytes(t.observation) + (s_hi - s_lo) * 40);
    let qo = t.question.value_offsets();
    let mut prompt = StringBuilder::with_capacity(n, (qo[hi] - qo[lo]).max(0) as usize + n * 1600);
    let (mut starts, mut ends, mut span_offsets) = (Vec::new(), Vec::new(), Vec::with_capacity(n + 1));
    span_offsets.push(0i32);
    let mut verl: Vec<VerlTask> = Vec::new();
    // Each kept row's observation spans, for the JSON exports.
    let mut row_spans: Vec<Vec<Span>> = Vec::new();
    let mut kept = Vec::with_capacity(n);
    let mut rejected = Vec::new();
    let mut steps: Vec<Step<'_>> = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
    let specs = opts.tasks.as_deref();
    for i in lo..hi {
        let row = (|| -> Result<Option<VerlTask>, String> {
            if !t.format_ok.value(i) {
                return Err(format!("format_ok is false ({})", opt_str(t.format_error, i).unwrap_or("no format_error given")));
            }
            steps.clear();
            for k in so[i] as usize..so[i + 1] as usize {
                let role = t.role.value(k);
                let tag = Tag::from_name(role).ok_or_else(|| format!("step {}: unknown role `{role}`", k - so[i] as usize))?;
                steps.push(Step { tag, content: t.content.value(k), observation: opt_str(t.observation, k) });
            }
            validate(&steps, Flavor::for_suite(t.suite.value(i))).map_err(|v| format!("steps break the CoA grammar: {v}"))?;
            let g = match opts.target {
                Target::Verl => {
                    let task = t.verl_task(i, specs);
                    task.ground_truth()?;
                    Some(task)
                }
                _ => None,
            };
            spans.clear();
            render_to(&steps, &mut text, &mut spans).map_err(|e| format!("cannot render: {e}"))?;
            Ok(g)
        })();
        let g = match row {
            Ok(g) => g,
            Err(problem) => {
                if opts.skip_bad {
                    rejected.push((i as u32, problem));
                    continue;
                }
                bail!("row {}, task `{}`: {problem}", unit.global + (i - lo) as u64, t.task_id.value(i));
            }
        };
        text.append_value("");
        write_prompt(t.suite.value(i), t.question.value(i), &mut prompt).map_err(|_| anyhow!("writing a prompt failed"))?;
        prompt.append_value("");
        for s in &spans {
            let task = t.task_id.value(i);
            starts.push(to_i32(s.start, "an observation span").map_err(|e| anyhow!("task `{task}`: {e}"))?);
            ends.push(to_i32(s.end, "an observation span").map_err(|e| anyhow!("task `{task}`: {e}"))?);
        }
        span_offsets.push(i32::try_from(starts.len()).context("too many observation spans in one unit")?);
        verl.extend(g);
        if opts.target.is_json() {
            row_spans.push(spans.clone());
        }
        kept.push(i as u32);
    }
    let n_spans = starts.len() as u64;
    let (item, fields) = spans_item(&schema)?;
    let span_struct = StructArray::try_new(fields, vec![Arc::new(Int32Array::from(starts)), Arc::new(Int32Array::from(ends))], None)?;
    let spans_col = ListArray::try_new(item, OffsetBuffer::new(ScalarBuffer::from(span_offsets)), Arc::new(span_struct), None)?;
    let pick = |name: &str| -> Result<ArrayRef> {
        let col = batch.column_by_name(name).ok_or_else(|| anyhow!("column `{name}` is missing"))?;
        select(col, lo, hi, &kept)
    };
    let prompt = prompt.finish();
    let text = text.finish();
    let mut json = Vec::new();
    if opts.target.is_json() {
        json.reserve(prompt.value_data().len() + text.value_data().len() + kept.len() * 64);
        for (k, spans) in row_spans.iter().enumerate() {
            if k > 0 {
                json.extend_from_slice(b",\n");
            }
            let (p, t) = (prompt.value(k), text.value(k));
            match opts.target {
                Target::ShareGpt => serde_json::to_writer(&mut json, &sharegpt(p, t, spans))?,
                _ => serde_json::to_writer(&mut json, &Alpaca { instruction: p, input: "", output: &afm_output(t, spans) })?,
            }
        }
    }
    let columns: Vec<ArrayRef> = vec![pick("task_id")?, pick("suite")?, Arc::new(prompt), Arc::new(text), Arc::new(spans_col)];
    let coa = RecordBatch::try_new(schema, columns)?;
    Ok(UnitOut { coa, kept, verl, json, rejected, spans: n_spans })
}

/// Converts a group of `trajectories` batches in parallel; `first_row` is the global row number
/// of the group's first row. Returns the units' results in input order and the units themselves.
pub fn convert_group(batches: &[RecordBatch], first_row: u64, opts: &ConvertOptions) -> Result<(Vec<Unit>, Vec<UnitOut>)> {
    let units = parallel::units(batches, first_row);
    let results: Vec<Result<UnitOut>> = units.par_iter().map(|u| convert_unit(&batches[u.batch], *u, opts)).collect();
    let outs = results.into_iter().collect::<Result<Vec<_>>>()?;
    Ok((units, outs))
}
