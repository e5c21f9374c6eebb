//! `mas_runs` → `trajectories`: linearize the teacher's agent activations into CoA steps.
//!
//! Event contract (what `coa-generate mas` logs): an event's `role` is `manager` (routing; not
//! part of the CoA trace, skipped) or the CoA action tag the activation produced (`plan`,
//! `web_search`, `wiki_search`, `crawl_page`, `code`, `reflection`, `suggested_answer`,
//! `double_check`, `answer`). A non-manager event's `output` is CoA text: an optional
//! `<think>…</think>` then exactly one action block in the role's tag. Tool events also carry
//! `tool` (= the tag name), `tool_input` and `observation` (the rendered tool output).
//!
//! Each non-manager event, in order, becomes a `think` step (if it thought) and an action step
//! (role = tag, agent = the event's agent, content = the block's content; for `code`, the Python
//! source without its fence; tool/tool_input/observation copied for tool calls).
//!
//! A malformed event (output that does not parse, a role that is no action, an action tag other
//! than the role, a tool call naming no or an unknown tool, a `seq` out of order, a null event or
//! field) makes the row bad: an error naming the row, task and event, or, with `skip_bad`, a row of
//! the reject table. A well-formed run whose steps break the CoA grammar is *not* bad: it becomes a
//! trajectory with `format_ok = false` and the first violation in `format_error` (for coa-filter).

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use arrow::array::{Array, ArrayRef, BooleanBuilder, Int32Array, Int64Array, ListArray, StringArray, StringBuilder, StructArray};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, FieldRef, SchemaRef};
use arrow::record_batch::RecordBatch;
use coa_format::{code_source, parse_double_check, parse_into, validate, Flavor, Segment, Step, Tag, TOOL_NAMES};
use coa_schemas::tables::TRAJECTORIES;
use rayon::prelude::*;

use coa_schemas::parallel::{self, opt_str, select, Unit};

/// What one pass over a group of input batches produced.
pub struct Extracted {
    /// `trajectories` batches, one per work unit, in input order.
    pub batches: Vec<RecordBatch>,
    /// Per input batch: the rejected rows and why (only with `skip_bad`).
    pub rejected: Vec<Vec<(u32, String)>>,
    pub format_errors: u64,
    pub steps: u64,
}

/// The `mas_runs` columns one unit reads.
struct Runs<'a> {
    task_id: &'a StringArray,
    suite: &'a StringArray,
    final_answer: &'a StringArray,
    tokens_in: &'a Int64Array,
    tokens_out: &'a Int64Array,
    events: &'a ListArray,
    ev: Events<'a>,
}

/// The fields of the `events` structs.
struct Events<'a> {
    all: &'a StructArray,
    seq: &'a Int32Array,
    agent: &'a StringArray,
    role: &'a StringArray,
    output: &'a StringArray,
    tool: &'a StringArray,
    tool_input: &'a StringArray,
    observation: &'a StringArray,
}

impl<'a> Runs<'a> {
    fn new(batch: &'a RecordBatch) -> Result<Runs<'a>> {
        let events = parallel::list(batch, "events")?;
        let all = events.values().as_any().downcast_ref::<StructArray>().ok_or_else(|| anyhow!("`events` items are not structs"))?;
        let what = "`events` item";
        Ok(Runs {
            task_id: parallel::utf8(batch, "task_id")?,
            suite: parallel::utf8(batch, "suite")?,
            final_answer: parallel::utf8(batch, "final_answer")?,
            tokens_in: parallel::int64(batch, "tokens_in")?,
            tokens_out: parallel::int64(batch, "tokens_out")?,
            events,
            ev: Events {
                all,
                seq: parallel::struct_i32(all, "seq", what)?,
                agent: parallel::struct_utf8(all, "agent", what)?,
                role: parallel::struct_utf8(all, "role", what)?,
                output: parallel::struct_utf8(all, "output", what)?,
                tool: parallel::struct_utf8(all, "tool", what)?,
                tool_input: parallel::struct_utf8(all, "tool_input", what)?,
                observation: parallel::struct_utf8(all, "observation", what)?,
            },
        })
    }
}

/// One extracted step, borrowing the input.
#[derive(Clone, Copy)]
struct StepOut<'a> {
    tag: Tag,
    agent: &'a str,
    content: &'a str,
    tool: Option<&'a str>,
    tool_input: Option<&'a str>,
    observation: Option<&'a str>,
}

/// Reused per work unit: no allocation per row once warm.
#[derive(Default)]
struct Scratch<'a> {
    steps: Vec<StepOut<'a>>,
    segs: Vec<Segment<'a>>,
    check: Vec<Step<'a>>,
    scores: Vec<i32>,
}

/// Linearizes the events of one run into `scratch.steps` / `scratch.scores`; returns hops.
/// `Err` is the problem with the event at that seq.
fn linearize<'a>(ev: &Events<'a>, range: std::ops::Range<usize>, scratch: &mut Scratch<'a>) -> Result<i32, String> {
    scratch.steps.clear();
    scratch.scores.clear();
    let mut hops = 0;
    let mut prev_seq: Option<i32> = None;
    for (k, j) in range.enumerate() {
        if ev.all.is_null(j) {
            return Err(format!("event {k} is null"));
        }
        if ev.seq.is_null(j) {
            return Err(format!("event {k} has a null `seq`"));
        }
        let seq = ev.seq.value(j);
        let at = |msg: String| format!("event seq {seq}: {msg}");
        if let Some(p) = prev_seq {
            if seq <= p {
                return Err(at(format!("out of order: seq {seq} comes after seq {p} (events must be in increasing seq order)")));
            }
        }
        prev_seq = Some(seq);
        for (name, col) in [("role", ev.role), ("agent", ev.agent), ("output", ev.output)] {
            if col.is_null(j) {
                return Err(at(format!("`{name}` is null")));
            }
        }
        let role = ev.role.value(j);
        if role == "manager" {
            continue;
        }
        let tag = match Tag::from_name(role) {
            Some(t) if t != Tag::Think && t != Tag::Observation => t,
            Some(t) => return Err(at(format!("role `{role}` is not an action ({t} blocks only come inside an action's output or from a tool)"))),
            None => {
                return Err(at(format!(
                    "unknown role `{role}` (expected `manager` or an action tag: plan, web_search, wiki_search, crawl_page, code, reflection, suggested_answer, double_check, answer)"
                )))
            }
        };
        let output = ev.output.value(j);
        scratch.segs.clear();
        parse_into(output, &mut scratch.segs).map_err(|e| at(format!("output does not parse: {e}")))?;
        let (think, action) = match scratch.segs.as_slice() {
            [a] if a.tag != Tag::Think => (None, a),
            [t, a] if t.tag == Tag::Think && a.tag != Tag::Think => (Some(t), a),
            segs => {
                let found: Vec<&str> = segs.iter().map(|s| s.tag.open()).collect();
                return Err(at(format!(
                    "output must be an optional <think> block then exactly one {} block; found {}",
                    tag.open(),
                    if found.is_empty() { "no tagged block".to_string() } else { found.join(" ") }
                )));
            }
        };
        if action.tag != tag {
            return Err(at(format!("output's action block is {} but the event role is `{role}`", action.tag)));
        }
        let tool = opt_str(ev.tool, j);
        if tag.is_tool() {
            match tool {
                None => return Err(at(format!("tool call {tag} has no `tool` name"))),
                Some(t) if !TOOL_NAMES.contains(&t) => {
                    return Err(at(format!("unknown tool name `{t}` (known tools: {})", TOOL_NAMES.join(", "))))
                }
                Some(t) if t != role => return Err(at(format!("tool `{t}` does not match the event role `{role}`"))),
                Some(_) => {}
            }
        } else if let Some(t) = tool {
            return Err(at(format!("role `{role}` is not a tool call but the event names tool `{t}`")));
        }
        let agent = ev.agent.value(j);
        if let Some(t) = think {
            scratch.steps.push(StepOut { tag: Tag::Think, agent, content: t.content, tool: None, tool_input: None, observation: None });
        }
        let content = if tag == Tag::Code { code_source(action.content) } else { action.content };
        let (tool_input, observation) =
            if tag.is_tool() { (opt_str(ev.tool_input, j), opt_str(ev.observation, j)) } else { (None, None) };
        scratch.steps.push(StepOut { tag, agent, content, tool, tool_input, observation });
        if tag == Tag::DoubleCheck {
            if let Ok(n) = parse_double_check(content) {
                scratch.scores.push(n as i32);
            }
        }
        hops += 1;
    }
    Ok(hops)
}

/// Output columns of one unit, built directly (no serde).
struct Builders {
    n_steps: usize,
    step_offsets: Vec<i32>,
    role: StringBuilder,
    agent: StringBuilder,
    content: StringBuilder,
    tool: StringBuilder,
    tool_input: StringBuilder,
    observation: StringBuilder,
    hops: Vec<i32>,
    reflections: Vec<i32>,
    score_offsets: Vec<i32>,
    scores: Vec<i32>,
    final_answer: StringBuilder,
    format_ok: BooleanBuilder,
    format_error: StringBuilder,
    teacher_tokens: Vec<i64>,
}

fn list_item(schema: &SchemaRef, name: &str) -> Result<FieldRef> {
    match schema.field_with_name(name)?.data_type() {
        DataType::List(item) => Ok(item.clone()),
        other => bail!("trajectories.{name} is {other}, expected a list"),
    }
}

impl Builders {
    fn new(rows: usize, events: usize, text_bytes: usize, obs_bytes: usize) -> Builders {
        let steps = events * 2;
        Builders {
            n_steps: 0,
            step_offsets: {
                let mut v = Vec::with_capacity(rows + 1);
                v.push(0);
                v
            },
            role: StringBuilder::with_capacity(steps, steps * 8),
            agent: StringBuilder::with_capacity(steps, steps * 10),
            content: StringBuilder::with_capacity(steps, text_bytes),
            tool: StringBuilder::with_capacity(steps, events * 4),
            tool_input: StringBuilder::with_capacity(steps, events * 16),
            observation: StringBuilder::with_capacity(steps, obs_bytes),
            hops: Vec::with_capacity(rows),
            reflections: Vec::with_capacity(rows),
            score_offsets: {
                let mut v = Vec::with_capacity(rows + 1);
                v.push(0);
                v
            },
            scores: Vec::new(),
            final_answer: StringBuilder::with_capacity(rows, rows * 16),
            format_ok: BooleanBuilder::with_capacity(rows),
            format_error: StringBuilder::new(),
            teacher_tokens: Vec::with_capacity(rows),
        }
    }

    fn offset(n: usize) -> Result<i32> {
        i32::try_from(n).map_err(|_| anyhow!("a work unit holds more than 2^31 steps"))
    }

    fn finish(mut self, schema: &SchemaRef, copied: [ArrayRef; 5]) -> Result<RecordBatch> {
        let steps_item = list_item(schema, "steps")?;
        let DataType::Struct(step_fields) = steps_item.data_type() else { bail!("trajectories.steps items are not structs") };
        let children: Vec<ArrayRef> = vec![
            Arc::new(self.role.finish()),
            Arc::new(self.agent.finish()),
            Arc::new(self.content.finish()),
            Arc::new(self.tool.finish()),
            Arc::new(self.tool_input.finish()),
            Arc::new(self.observation.finish()),
        ];
        let steps_struct = StructArray::try_new(step_fields.clone(), children, None)?;
        let steps = ListArray::try_new(steps_item, OffsetBuffer::new(ScalarBuffer::from(self.step_offsets)), Arc::new(steps_struct), None)?;
        let scores_item = list_item(schema, "double_check_scores")?;
        let scores = ListArray::try_new(
            scores_item,
            OffsetBuffer::new(ScalarBuffer::from(self.score_offsets)),
            Arc::new(Int32Array::from(self.scores)),
            None,
        )?;
        let [task_id, suite, question, answers, correct] = copied;
        let columns: Vec<ArrayRef> = vec![
            task_id,
            suite,
            question,
            answers,
            Arc::new(steps),
            Arc::new(Int32Array::from(self.hops)),
            Arc::new(Int32Array::from(self.reflections)),
            Arc::new(scores),
            Arc::new(self.final_answer.finish()),
            correct,
            Arc::new(self.format_ok.finish()),
            Arc::new(self.format_error.finish()),
            Arc::new(Int64Array::from(self.teacher_tokens)),
        ];
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

fn byte_span(a: &StringArray, lo: usize, hi: usize) -> usize {
    let o = a.value_offsets();
    (o[hi] - o[lo]).max(0) as usize
}

/// What one work unit produced.
struct UnitOut {
    batch: RecordBatch,
    rejected: Vec<(u32, String)>,
    format_errors: u64,
    steps: u64,
}

/// One unit: its `trajectories` batch, its rejected rows, format-error and step counts.
fn extract_unit(batch: &RecordBatch, unit: Unit, skip_bad: bool, schema: &SchemaRef) -> Result<UnitOut> {
    let runs = Runs::new(batch)?;
    let (lo, hi) = (unit.lo, unit.hi);
    let offsets = runs.events.value_offsets();
    let (ev_lo, ev_hi) = (offsets[lo] as usize, offsets[hi] as usize);
    let mut b = Builders::new(
        hi - lo,
        ev_hi - ev_lo,
        byte_span(runs.ev.output, ev_lo, ev_hi),
        byte_span(runs.ev.observation, ev_lo, ev_hi),
    );
    let mut scratch = Scratch::default();
    let mut kept: Vec<u32> = Vec::with_capacity(hi - lo);
    let mut rejected = Vec::new();
    let (mut format_errors, mut n_steps) = (0u64, 0u64);
    for i in lo..hi {
        let range = offsets[i] as usize..offsets[i + 1] as usize;
        let hops = match linearize(&runs.ev, range, &mut scratch) {
            Ok(h) => h,
            Err(problem) => {
                let task = runs.task_id.value(i);
                if skip_bad {
                    rejected.push((i as u32, problem));
                    continue;
                }
                bail!("row {}, task `{task}`: {problem}", unit.global + (i - lo) as u64);
            }
        };
        kept.push(i as u32);
        // Grammar check of the whole trajectory.
        scratch.check.clear();
        scratch.check.extend(scratch.steps.iter().map(|s| Step { tag: s.tag, content: s.content, observation: s.observation }));
        let flavor = Flavor::for_suite(runs.suite.value(i));
        let format = validate(&scratch.check, flavor).map_err(|v| v.to_string()).and_then(|()| coa_format::check_observations(&scratch.check).map_err(|e| e.to_string()));
        let mut reflections = 0;
        let mut answer = None;
        for s in &scratch.steps {
            b.role.append_value(s.tag.name());
            b.agent.append_value(s.agent);
            b.content.append_value(s.content);
            b.tool.append_option(s.tool);
            b.tool_input.append_option(s.tool_input);
            b.observation.append_option(s.observation);
            match s.tag {
                Tag::Reflection => reflections += 1,
                Tag::Answer => answer = Some(s.content),
                _ => {}
            }
        }
        n_steps += scratch.steps.len() as u64;
        b.n_steps += scratch.steps.len();
        b.step_offsets.push(Builders::offset(b.n_steps)?);
        b.scores.extend_from_slice(&scratch.scores);
        b.score_offsets.push(Builders::offset(b.scores.len())?);
        b.hops.push(hops);
        b.reflections.push(reflections);
        b.final_answer.append_option(answer.or_else(|| opt_str(runs.final_answer, i)));
        match format {
            Ok(()) => {
                b.format_ok.append_value(true);
                b.format_error.append_null();
            }
            Err(e) => {
                format_errors += 1;
                b.format_ok.append_value(false);
                b.format_error.append_value(e);
            }
        }
        b.teacher_tokens.push(runs.tokens_in.value(i).saturating_add(runs.tokens_out.value(i)));
    }
    let pick = |name: &str| -> Result<ArrayRef> {
        let col = batch.column_by_name(name).ok_or_else(|| anyhow!("column `{name}` is missing"))?;
        select(col, lo, hi, &kept)
    };
    let copied = [pick("task_id")?, pick("suite")?, pick("question")?, pick("answers")?, pick("success")?];
    Ok(UnitOut { batch: b.finish(schema, copied)?, rejected, format_errors, steps: n_steps })
}

/// Extracts a group of `mas_runs` batches in parallel. `first_row` is the global row number of the
/// group's first row (for error messages). Without `skip_bad`, the first bad row (in input order)
/// is the error.
pub fn extract_group(batches: &[RecordBatch], first_row: u64, skip_bad: bool) -> Result<Extracted> {
    let schema = TRAJECTORIES.schema();
    let units = parallel::units(batches, first_row);
    let results: Vec<Result<UnitOut>> = units.par_iter().map(|u| extract_unit(&batches[u.batch], *u, skip_bad, &schema)).collect();
    let mut out = Extracted { batches: Vec::with_capacity(units.len()), rejected: vec![Vec::new(); batches.len()], format_errors: 0, steps: 0 };
    for (u, r) in units.iter().zip(results) {
        let r = r?;
        out.batches.push(r.batch);
        out.rejected[u.batch].extend(r.rejected);
        out.format_errors += r.format_errors;
        out.steps += r.steps;
    }
    Ok(out)
}
