//! `trajectories` → `coa_text` (prompt, rendered CoA text, observation spans), and the exports
//! that make the data usable in the reference tool chains:
//!
//! - **alpaca JSON** (AFM / LLaMA-Factory SFT): a JSON array of `{instruction, input, output}`,
//!   the whole trajectory as one assistant turn: `instruction` = the prompt, `input` = "",
//!   `output` = the CoA text.
//! - **verl Parquet** (RL): `data_source` (`coa-<suite>`), `prompt` (`[{content, role: "user"}]`),
//!   `ability` (the suite), `reward_model {ground_truth, style: "rule"}` and
//!   `extra_info {index, split, task_id}`. The ground truth is the first gold answer, or for code
//!   tasks their test spec as JSON (`{"stdin": [...], "expected_output": [...]}` or
//!   `{"functional": test program}`, the layouts `coa-generate tasks --import` reads back), which
//!   comes from the tasks table.
//!
//! A trajectory with `format_ok = false`, steps that break the grammar (checked again here), a
//! role that is no CoA tag, content that cannot be rendered, or (verl) no ground truth is bad: an
//! error naming the row and task, or with `skip_bad` a row of the reject table.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int32Array, Int64Array, ListArray, StringArray, StringBuilder, StructArray};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use coa_format::{render_to, validate, write_prompt, Flavor, Span, Step, Tag};
use coa_schemas::tables::COA_TEXT;
use rayon::prelude::*;
use serde::Serialize;

use crate::util::{self, opt_str, select, Unit};

/// What `coa-convert` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The `coa_text` table.
    CoaText,
    /// LLaMA-Factory alpaca JSON.
    AlpacaJson,
    /// verl RL Parquet.
    Verl,
}

/// Options of one conversion.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub target: Target,
    pub skip_bad: bool,
    /// task_id → code test spec JSON (for verl ground truths of code tasks).
    pub code_specs: Option<Arc<HashMap<String, String>>>,
}

/// One work unit's result.
pub struct UnitOut {
    /// The `coa_text` rows of the kept trajectories.
    pub coa: RecordBatch,
    /// Input row (within its batch) of each kept trajectory.
    pub kept: Vec<u32>,
    /// verl ground truths, one per kept row.
    pub ground_truth: Option<StringArray>,
    /// alpaca records, `,\n`-separated, no brackets.
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
        let steps = util::list(batch, "steps")?;
        let st = steps.values().as_struct_opt().ok_or_else(|| anyhow!("`steps` items are not structs"))?;
        let answers = util::list(batch, "answers")?;
        let answer_items = answers.values().as_string_opt::<i32>().ok_or_else(|| anyhow!("`answers` items are not utf8"))?;
        let what = "`steps` item";
        Ok(Trajs {
            task_id: util::utf8(batch, "task_id")?,
            suite: util::utf8(batch, "suite")?,
            question: util::utf8(batch, "question")?,
            answers,
            answer_items,
            steps,
            role: util::struct_utf8(st, "role", what)?,
            content: util::struct_utf8(st, "content", what)?,
            observation: util::struct_utf8(st, "observation", what)?,
            format_ok: util::boolean(batch, "format_ok")?,
            format_error: util::utf8(batch, "format_error")?,
        })
    }

    /// The verl ground truth of row `i`.
    fn ground_truth<'s>(&'s self, i: usize, specs: Option<&'s HashMap<String, String>>) -> Result<&'s str, String> {
        let task = self.task_id.value(i);
        if self.suite.value(i) == "code" {
            let Some(specs) = specs else {
                return Err("code task: its verl ground truth is the test spec, which trajectories do not carry; pass --tasks FILE (the tasks table)".into());
            };
            return specs.get(task).map(String::as_str).ok_or_else(|| format!("code task `{task}` has no tests in the --tasks table"));
        }
        let o = self.answers.value_offsets();
        (o[i] as usize..o[i + 1] as usize)
            .filter(|&k| !self.answer_items.is_null(k))
            .map(|k| self.answer_items.value(k))
            .find(|a| !a.trim().is_empty())
            .ok_or_else(|| "no gold answer for the verl ground truth".to_string())
    }
}

#[derive(Serialize)]
struct Alpaca<'a> {
    instruction: &'a str,
    input: &'a str,
    output: &'a str,
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
    let mut gt = (opts.target == Target::Verl).then(|| StringBuilder::with_capacity(n, n * 16));
    let mut kept = Vec::with_capacity(n);
    let mut rejected = Vec::new();
    let mut steps: Vec<Step<'_>> = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
    let specs = opts.code_specs.as_deref();
    for i in lo..hi {
        let row = (|| -> Result<Option<&str>, String> {
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
            let g = match &gt {
                Some(_) => Some(t.ground_truth(i, specs)?),
                None => None,
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
        if let (Some(b), Some(g)) = (gt.as_mut(), g) {
            b.append_value(g);
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
    if opts.target == Target::AlpacaJson {
        json.reserve(prompt.value_data().len() + text.value_data().len() + kept.len() * 64);
        for k in 0..prompt.len() {
            if k > 0 {
                json.extend_from_slice(b",\n");
            }
            serde_json::to_writer(&mut json, &Alpaca { instruction: prompt.value(k), input: "", output: text.value(k) })?;
        }
    }
    let columns: Vec<ArrayRef> = vec![pick("task_id")?, pick("suite")?, Arc::new(prompt), Arc::new(text), Arc::new(spans_col)];
    let coa = RecordBatch::try_new(schema, columns)?;
    Ok(UnitOut { coa, kept, ground_truth: gt.map(|mut b| b.finish()), json, rejected, spans: n_spans })
}

/// Converts a group of `trajectories` batches in parallel; `first_row` is the global row number
/// of the group's first row. Returns the units' results in input order and the units themselves.
pub fn convert_group(batches: &[RecordBatch], first_row: u64, opts: &ConvertOptions) -> Result<(Vec<Unit>, Vec<UnitOut>)> {
    let units = util::units(batches, first_row);
    let results: Vec<Result<UnitOut>> = units.par_iter().map(|u| convert_unit(&batches[u.batch], *u, opts)).collect();
    let outs = results.into_iter().collect::<Result<Vec<_>>>()?;
    Ok((units, outs))
}

/// The schema of the verl export.
pub fn verl_schema() -> SchemaRef {
    let s = |name: &str| Field::new(name, DataType::Utf8, true);
    let message = Fields::from(vec![s("content"), s("role")]);
    Arc::new(Schema::new(vec![
        s("data_source"),
        Field::new("prompt", DataType::List(Arc::new(Field::new("item", DataType::Struct(message), true))), true),
        s("ability"),
        Field::new("reward_model", DataType::Struct(Fields::from(vec![s("ground_truth"), s("style")])), true),
        Field::new(
            "extra_info",
            DataType::Struct(Fields::from(vec![Field::new("index", DataType::Int64, true), s("split"), s("task_id")])),
            true,
        ),
    ]))
}

fn repeated(value: &str, n: usize) -> ArrayRef {
    let mut b = StringBuilder::with_capacity(n, n * value.len());
    for _ in 0..n {
        b.append_value(value);
    }
    Arc::new(b.finish())
}

/// The verl rows of one unit; `first_index` is `extra_info.index` of its first row.
pub fn verl_batch(out: &UnitOut, first_index: i64, split: &str) -> Result<RecordBatch> {
    let schema = verl_schema();
    let n = out.coa.num_rows();
    let coa = &out.coa;
    let suite = coa.column(1).as_string::<i32>();
    let mut data_source = StringBuilder::with_capacity(n, n * 16);
    for k in 0..n {
        data_source.append_value(format!("coa-{}", suite.value(k)));
    }
    let field = |name: &str| -> Result<Field> { Ok(schema.field_with_name(name)?.clone()) };
    let DataType::List(msg_item) = field("prompt")?.data_type().clone() else { bail!("verl prompt is not a list") };
    let DataType::Struct(msg_fields) = msg_item.data_type().clone() else { bail!("verl prompt items are not structs") };
    let messages = StructArray::try_new(msg_fields, vec![coa.column(2).clone(), repeated("user", n)], None)?;
    let prompt = ListArray::try_new(msg_item, OffsetBuffer::from_lengths(std::iter::repeat_n(1, n)), Arc::new(messages), None)?;
    let DataType::Struct(rm_fields) = field("reward_model")?.data_type().clone() else { bail!("verl reward_model is not a struct") };
    let gt = out.ground_truth.clone().ok_or_else(|| anyhow!("verl export without ground truths"))?;
    let reward_model = StructArray::try_new(rm_fields, vec![Arc::new(gt), repeated("rule", n)], None)?;
    let DataType::Struct(ei_fields) = field("extra_info")?.data_type().clone() else { bail!("verl extra_info is not a struct") };
    let index = Int64Array::from_iter_values((0..n as i64).map(|k| first_index + k));
    let extra_info = StructArray::try_new(ei_fields, vec![Arc::new(index), repeated(split, n), coa.column(0).clone()], None)?;
    let columns: Vec<ArrayRef> = vec![Arc::new(data_source.finish()), Arc::new(prompt), coa.column(1).clone(), Arc::new(reward_model), Arc::new(extra_info)];
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Code test specs by task id, from a `tasks` table batch: `{"stdin", "expected_output"}` for
/// stdio tests, else `{"functional": test_code}`.
pub fn code_specs_from_tasks(batch: &RecordBatch, specs: &mut HashMap<String, String>) -> Result<()> {
    let task_id = util::utf8(batch, "task_id")?;
    let suite = util::utf8(batch, "suite")?;
    let test_code = util::utf8(batch, "test_code")?;
    let stdio = util::list(batch, "stdio_tests")?;
    let st = stdio.values().as_struct_opt().ok_or_else(|| anyhow!("`stdio_tests` items are not structs"))?;
    let stdin = util::struct_utf8(st, "stdin", "`stdio_tests` item")?;
    let expected = util::struct_utf8(st, "expected_stdout", "`stdio_tests` item")?;
    let o = stdio.value_offsets();
    for i in 0..batch.num_rows() {
        if suite.value(i) != "code" {
            continue;
        }
        let range = o[i] as usize..o[i + 1] as usize;
        let spec = if !range.is_empty() {
            let ins: Vec<&str> = range.clone().map(|k| stdin.value(k)).collect();
            let outs: Vec<&str> = range.map(|k| expected.value(k)).collect();
            serde_json::json!({ "stdin": ins, "expected_output": outs }).to_string()
        } else if let Some(code) = opt_str(test_code, i).filter(|c| !c.trim().is_empty()) {
            serde_json::json!({ "functional": code }).to_string()
        } else {
            continue;
        };
        specs.insert(task_id.value(i).to_string(), spec);
    }
    Ok(())
}
