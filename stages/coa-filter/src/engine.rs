//! The filter: a plan of named rules applied progressively to a table, with per-rule counts.
//!
//! Rules, in the order they run (each sees only the rows the previous ones kept):
//!
//! | name | applies to | drops / duplicates |
//! |---|---|---|
//! | `dedup` | distill, or `--dedup` | a row whose key equals an earlier row's: key = (`task_id`, `steps`) for trajectories, else every column (or `--dedup-key`); the first occurrence is kept |
//! | `complexity` | distill | `hops < --min-hops` (null hops too) |
//! | `wrong_answer` | distill | `correct` is false or null |
//! | `format` | distill | `format_ok` is false or null |
//! | `repeated_tool_input` | distill | two steps with a non-null `tool` and the same (`tool`, `tool_input`) |
//! | `where[i]` | `--where` | the i-th expression is false or null |
//! | `dynamic_sampling` | `--dynamic-sampling` | every row of a `--group-by` group whose `--value` is the same in all its rows |
//! | `reflection` | distill | `reflections = 0` (or null): all such rows of the suites in `--reflection-required-suites`; elsewhere all but a `--no-reflection-keep` fraction, chosen by xxh3(task_id, seed) |
//! | `error_correction` | distill | none dropped: `correct` and the first `double_check_scores` ≤ 2 → the row appears `--error-correction-copies` times |
//!
//! `quality` names the three quality rules at once in `--no-rule`.
//!
//! Row-wise rules run batch by batch (bounded memory); `--where` and `--dynamic-sampling` need the
//! whole table (aggregates and groups span batches), so with either the stage reads it all first.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{cast, filter, filter_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Int32Type, Schema, SchemaRef};
use coa_schemas::reasons::ReasonTable;
use coa_schemas::suite::Suite;
use coa_schemas::tables::{compatible, type_name, META_TABLE, TRAJECTORIES};
use serde::Serialize;

use crate::hash::{self, Hasher};
use crate::sql::WhereRule;

/// Which built-in rule set runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleSet {
    /// The distillation rules for a trajectories table; none for any other table.
    Auto,
    /// The distillation rules; the input must be a trajectories table.
    Distill,
    /// No built-in rules: only --where, --dedup and --dynamic-sampling.
    None,
}

/// The distillation rules, in the order they run (`where[i]` and `dynamic_sampling` run between
/// `repeated_tool_input` and `reflection`).
pub const DISTILL_RULES: [&str; 7] = ["dedup", "complexity", "wrong_answer", "format", "repeated_tool_input", "reflection", "error_correction"];

/// The quality rules, disabled together by `--no-rule quality`.
pub const QUALITY_RULES: [&str; 3] = ["wrong_answer", "format", "repeated_tool_input"];

/// Column that `--keep-dropped` adds: the name of the rule that dropped the row.
pub const DROP_REASON: &str = "drop_reason";

/// What to filter, as given on the command line.
/// The suites where `reflection` drops every trajectory without a reflection (`--reflection-required-suites`'s
/// default, spelled there as `math,code`).
pub const REFLECTION_REQUIRED_SUITES: [Suite; 2] = [Suite::Math, Suite::Code];

#[derive(Debug, Clone)]
pub struct Options {
    pub rules: RuleSet,
    /// Rule names (or `quality`) not to run.
    pub disabled: Vec<String>,
    pub min_hops: i64,
    pub no_reflection_keep: f64,
    pub reflection_required_suites: Vec<String>,
    pub error_correction_copies: u32,
    pub seed: u64,
    pub wheres: Vec<String>,
    /// Exact dedup on a table the distillation rules do not cover.
    pub dedup: bool,
    /// Dedup key columns; empty = the default key.
    pub dedup_key: Vec<String>,
    /// `(group_by, value)` for DAPO dynamic sampling.
    pub dynamic_sampling: Option<(String, String)>,
    /// The input's name in error messages (`stdin` or its path).
    pub source: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rules: RuleSet::Auto,
            disabled: Vec::new(),
            min_hops: 5,
            no_reflection_keep: 0.3,
            reflection_required_suites: REFLECTION_REQUIRED_SUITES.iter().map(|s| s.as_str().to_string()).collect(),
            error_correction_copies: 2,
            seed: 0,
            wheres: Vec::new(),
            dedup: false,
            dedup_key: Vec::new(),
            dynamic_sampling: None,
            source: "input".into(),
        }
    }
}

/// Counts of one rule over the whole input.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RuleStats {
    pub name: String,
    /// The rule in words (`hops < 5`, the `--where` text, ...).
    pub rule: String,
    pub rows_in: u64,
    pub kept: u64,
    pub dropped: u64,
    /// Extra copies made by up-sampling (rows out = kept + duplicated).
    pub duplicated: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups_in: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups_kept: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups_dropped: Option<u64>,
}

enum Kind {
    Dedup { columns: Vec<usize> },
    Complexity { min_hops: i64 },
    WrongAnswer,
    Format,
    RepeatedToolInput,
    Where(Box<WhereRule>),
    DynamicSampling { group: usize, value: usize },
    Reflection { keep: f64, required: Vec<String>, seed: u64 },
    ErrorCorrection { copies: u32 },
}

/// The rows of one batch that survived a window, and the ones it dropped.
pub struct BatchOutput {
    /// Kept rows (up-sampled rows repeated in place), with the input's exact schema.
    pub kept: RecordBatch,
    /// Dropped rows plus a `drop_reason` column (only when asked for, and only if any).
    pub dropped: Option<RecordBatch>,
}

/// A u128 key is already uniformly distributed: hash it by taking its low bits.
#[derive(Default)]
struct KeyHasher(u64);
impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u128(&mut self, i: u128) {
        self.0 = i as u64 ^ (i >> 64) as u64;
    }
}
type KeySet = HashSet<u128, BuildHasherDefault<KeyHasher>>;

/// The filter over one input table.
pub struct Filter {
    schema: SchemaRef,
    table: Option<String>,
    distill: bool,
    notes: Vec<String>,
    rules: Vec<Kind>,
    stats: Vec<RuleStats>,
    seen: KeySet,
    hasher: Hasher,
    keep_dropped: bool,
    dropped: ReasonTable,
}

const ALIVE: u16 = u16::MAX;

/// Per-row state of a window of batches: how many times each row is output (0 = dropped) and
/// which rule dropped it.
struct Window {
    mult: Vec<Vec<u32>>,
    reason: Vec<Vec<u16>>,
}

impl Filter {
    /// Plans the rules for a table with `schema`, checking every flag against it.
    pub fn new(schema: SchemaRef, opts: &Options) -> Result<Filter> {
        let table = schema.metadata().get(META_TABLE).cloned();
        let mut notes = Vec::new();
        let distill = match opts.rules {
            RuleSet::None => false,
            RuleSet::Distill => {
                if let Some(name) = table.as_deref().filter(|n| *n != TRAJECTORIES.name) {
                    bail!(
                        "{}: --rules distill: the input holds the `{name}` table, expected the `trajectories` table (written by `{}`); \
                         use --rules none to filter it with --where, --dedup or --dynamic-sampling",
                        opts.source,
                        TRAJECTORIES.produced_by
                    );
                }
                true
            }
            RuleSet::Auto => match table.as_deref() {
                Some(name) => name == TRAJECTORIES.name,
                None => looks_like_trajectories(&schema),
            },
        };
        if distill {
            check_trajectories(&schema, &opts.source)?;
            if opts.rules == RuleSet::Auto {
                // Inferred, not asked for: say so, since they drop rows a --where alone would keep.
                notes.push(format!(
                    "the input holds trajectories, so the distillation rules run too (--rules auto; --rules none for {} alone)",
                    if opts.wheres.is_empty() { "the flags given" } else { "--where" }
                ));
            }
        } else if opts.rules == RuleSet::Auto {
            let what = table.as_deref().map(|n| format!("the `{n}` table")).unwrap_or_else(|| "a table without `coa.table` metadata".into());
            notes.push(format!("distillation rules not applied: the input holds {what}, not trajectories"));
        }

        let mut disabled: HashSet<&str> = HashSet::new();
        for name in &opts.disabled {
            match name.as_str() {
                "quality" => disabled.extend(QUALITY_RULES),
                n if DISTILL_RULES.contains(&n) => {
                    disabled.insert(n);
                }
                n => bail!("--no-rule {n}: unknown rule; rules are {} (and `quality` for the three quality rules)", DISTILL_RULES.join(", ")),
            }
        }
        if !(0.0..=1.0).contains(&opts.no_reflection_keep) || opts.no_reflection_keep.is_nan() {
            bail!("--no-reflection-keep {}: expected a fraction between 0 and 1", opts.no_reflection_keep);
        }
        if opts.error_correction_copies == 0 {
            bail!("--error-correction-copies 0: expected at least 1 (1 = no up-sampling)");
        }
        let on = |n: &str| distill && !disabled.contains(n);
        let mut rules: Vec<(String, String, Kind)> = Vec::new();

        let dedup = (distill || opts.dedup || !opts.dedup_key.is_empty()) && !disabled.contains("dedup");
        if dedup {
            let names: Vec<String> = if !opts.dedup_key.is_empty() {
                opts.dedup_key.clone()
            } else if distill {
                vec!["task_id".into(), "steps".into()]
            } else {
                schema.fields().iter().map(|f| f.name().clone()).collect()
            };
            let mut columns = Vec::new();
            for n in &names {
                let i = column_index(&schema, n, "--dedup-key")?;
                let dt = schema.field(i).data_type();
                if !hash::supported(dt) {
                    bail!("dedup: column `{n}` has type {}, which cannot be compared; choose other columns with --dedup-key", type_name(dt));
                }
                columns.push(i);
            }
            rules.push(("dedup".into(), format!("same {} as an earlier row", names.join(" + ")), Kind::Dedup { columns }));
        }
        if on("complexity") {
            rules.push(("complexity".into(), format!("hops < {}", opts.min_hops), Kind::Complexity { min_hops: opts.min_hops }));
        }
        if on("wrong_answer") {
            rules.push(("wrong_answer".into(), "correct = false".into(), Kind::WrongAnswer));
        }
        if on("format") {
            rules.push(("format".into(), "format_ok = false".into(), Kind::Format));
        }
        if on("repeated_tool_input") {
            rules.push(("repeated_tool_input".into(), "same (tool, tool_input) twice in the steps".into(), Kind::RepeatedToolInput));
        }
        for (i, text) in opts.wheres.iter().enumerate() {
            let rule = WhereRule::parse(text, &schema)?;
            rules.push((format!("where[{i}]"), format!("not ({text})"), Kind::Where(Box::new(rule))));
        }
        if let Some((group_by, value)) = &opts.dynamic_sampling {
            let group = column_index(&schema, group_by, "--dynamic-sampling --group-by")?;
            let value_i = column_index(&schema, value, "--dynamic-sampling --value")?;
            for (i, flag) in [(group, "--group-by"), (value_i, "--value")] {
                let dt = schema.field(i).data_type();
                if !hash::supported(dt) {
                    bail!("--dynamic-sampling {flag}: column `{}` has type {}, which cannot be compared", schema.field(i).name(), type_name(dt));
                }
            }
            rules.push((
                "dynamic_sampling".into(),
                format!("{value} constant within its {group_by} group"),
                Kind::DynamicSampling { group, value: value_i },
            ));
        }
        if on("reflection") {
            let keep = opts.no_reflection_keep;
            let required = opts.reflection_required_suites.clone();
            let what = if required.is_empty() {
                format!("reflections = 0: keep {}%", fmt_pct(keep))
            } else {
                format!("reflections = 0: all in {}, else keep {}%", required.join("/"), fmt_pct(keep))
            };
            rules.push(("reflection".into(), what, Kind::Reflection { keep, required, seed: opts.seed }));
        }
        if on("error_correction") {
            let copies = opts.error_correction_copies;
            rules.push((
                "error_correction".into(),
                format!("first double_check <= 2 and correct: x{copies}"),
                Kind::ErrorCorrection { copies },
            ));
        }

        let stats = rules.iter().map(|(name, what, _)| RuleStats { name: name.clone(), rule: what.clone(), ..Default::default() }).collect();
        // Filtering a --keep-dropped file again replaces its reason column.
        let dropped = ReasonTable::new(&schema, DROP_REASON);
        Ok(Filter {
            schema,
            table,
            distill,
            notes,
            rules: rules.into_iter().map(|(_, _, k)| k).collect(),
            stats,
            seen: KeySet::default(),
            hasher: Hasher::default(),
            keep_dropped: false,
            dropped,
        })
    }

    /// Also return the dropped rows (with `drop_reason`) from [`Filter::process`].
    pub fn keep_dropped(&mut self, yes: bool) {
        self.keep_dropped = yes;
    }

    /// Whether the rules need the whole table at once (`--where`, `--dynamic-sampling`).
    pub fn needs_whole_table(&self) -> bool {
        self.rules.iter().any(|r| matches!(r, Kind::Where(_) | Kind::DynamicSampling { .. }))
    }

    /// Whether the distillation rules run.
    pub fn distill(&self) -> bool {
        self.distill
    }

    /// The table named in the input's metadata.
    pub fn table(&self) -> Option<&str> {
        self.table.as_deref()
    }

    /// Remarks for the summary (e.g. why no distillation rule ran).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Per-rule counts so far.
    pub fn stats(&self) -> &[RuleStats] {
        &self.stats
    }

    /// The schema of `--keep-dropped` output: the input's plus `drop_reason`.
    pub fn dropped_schema(&self) -> SchemaRef {
        self.dropped.schema().clone()
    }

    /// Runs every rule over a window of batches (one batch when streaming, the whole table when a
    /// rule needs it) and returns, per batch, its kept (and dropped) rows.
    pub fn process(&mut self, batches: &[RecordBatch]) -> Result<Vec<BatchOutput>> {
        for b in batches {
            if b.schema().fields() != self.schema.fields() {
                bail!("a batch's columns differ from the table's schema");
            }
        }
        let mut w = Window {
            mult: batches.iter().map(|b| vec![1u32; b.num_rows()]).collect(),
            reason: batches.iter().map(|b| vec![ALIVE; b.num_rows()]).collect(),
        };
        for ri in 0..self.rules.len() {
            let rows_in: u64 = w.mult.iter().flatten().map(|&m| m as u64).sum();
            let (dropped, duplicated) = self.apply(ri, batches, &mut w)?;
            let s = &mut self.stats[ri];
            s.rows_in += rows_in;
            s.dropped += dropped;
            s.duplicated += duplicated;
            s.kept += rows_in - dropped;
        }
        batches.iter().enumerate().map(|(bi, b)| self.output(b, &w.mult[bi], &w.reason[bi])).collect()
    }

    fn output(&self, batch: &RecordBatch, mult: &[u32], reason: &[u16]) -> Result<BatchOutput> {
        let kept = if mult.iter().all(|&m| m == 1) {
            batch.clone()
        } else if mult.iter().all(|&m| m <= 1) {
            filter_record_batch(batch, &BooleanArray::from(mult.iter().map(|&m| m == 1).collect::<Vec<_>>()))?
        } else {
            let idx: Vec<u32> = mult.iter().enumerate().flat_map(|(i, &m)| std::iter::repeat_n(i as u32, m as usize)).collect();
            take_record_batch(batch, &UInt32Array::from(idx))?
        };
        let mut dropped = None;
        if self.keep_dropped && reason.iter().any(|&r| r != ALIVE) {
            let mask = BooleanArray::from(reason.iter().map(|&r| r != ALIVE).collect::<Vec<_>>());
            let rows = filter_record_batch(batch, &mask)?;
            let reasons = StringArray::from_iter_values(reason.iter().filter(|&&r| r != ALIVE).map(|&r| self.stats[r as usize].name.as_str()));
            dropped = Some(self.dropped.batch(&rows, reasons)?);
        }
        Ok(BatchOutput { kept, dropped })
    }

    /// Applies rule `ri`; returns (rows dropped, copies added).
    fn apply(&mut self, ri: usize, batches: &[RecordBatch], w: &mut Window) -> Result<(u64, u64)> {
        let reason = ri as u16;
        let mut dropped = 0u64;
        let mut duplicated = 0u64;
        let mut drop_row = |w: &mut Window, bi: usize, r: usize| {
            dropped += w.mult[bi][r] as u64;
            w.mult[bi][r] = 0;
            w.reason[bi][r] = reason;
        };
        match &self.rules[ri] {
            Kind::Dedup { columns } => {
                for (bi, b) in batches.iter().enumerate() {
                    let cols: Vec<&dyn Array> = columns.iter().map(|&i| b.column(i).as_ref()).collect();
                    for r in 0..b.num_rows() {
                        if w.mult[bi][r] == 0 {
                            continue;
                        }
                        let key = self.hasher.row_key(&cols, r)?;
                        if !self.seen.insert(key) {
                            drop_row(w, bi, r);
                        }
                    }
                }
            }
            Kind::Complexity { min_hops } => {
                for (bi, b) in batches.iter().enumerate() {
                    let hops = typed(b, "hops", &DataType::Int32)?;
                    let hops = hops.as_primitive::<Int32Type>();
                    for r in alive(&w.mult[bi]) {
                        if hops.is_null(r) || (hops.value(r) as i64) < *min_hops {
                            drop_row(w, bi, r);
                        }
                    }
                }
            }
            Kind::WrongAnswer | Kind::Format => {
                let name = if matches!(self.rules[ri], Kind::WrongAnswer) { "correct" } else { "format_ok" };
                for (bi, b) in batches.iter().enumerate() {
                    let col = typed(b, name, &DataType::Boolean)?;
                    let col = col.as_boolean();
                    for r in alive(&w.mult[bi]) {
                        if col.is_null(r) || !col.value(r) {
                            drop_row(w, bi, r);
                        }
                    }
                }
            }
            Kind::RepeatedToolInput => {
                let steps_type = &TRAJECTORIES.column("steps").expect("trajectories has steps").dtype;
                for (bi, b) in batches.iter().enumerate() {
                    let mut calls: Vec<(&str, Option<&str>)> = Vec::new();
                    let steps = typed(b, "steps", steps_type)?;
                    let steps = steps.as_list::<i32>();
                    let fields = steps.values().as_struct();
                    let tool = fields.column_by_name("tool").context("steps without `tool`")?.as_string::<i32>();
                    let input = fields.column_by_name("tool_input").context("steps without `tool_input`")?.as_string::<i32>();
                    let offsets = steps.value_offsets();
                    for r in alive(&w.mult[bi]) {
                        if steps.is_null(r) {
                            continue;
                        }
                        calls.clear();
                        for s in offsets[r] as usize..offsets[r + 1] as usize {
                            if fields.is_valid(s) && tool.is_valid(s) {
                                calls.push((tool.value(s), input.is_valid(s).then(|| input.value(s))));
                            }
                        }
                        calls.sort_unstable();
                        if calls.windows(2).any(|p| p[0] == p[1]) {
                            drop_row(w, bi, r);
                        }
                    }
                }
            }
            Kind::Where(rule) => {
                let height: usize = w.mult.iter().flatten().filter(|&&m| m > 0).count();
                let mut chunks: Vec<Vec<ArrayRef>> = vec![Vec::new(); rule.columns().len()];
                for (bi, b) in batches.iter().enumerate() {
                    let all_alive = w.mult[bi].iter().all(|&m| m > 0);
                    let mask = (!all_alive).then(|| BooleanArray::from(w.mult[bi].iter().map(|&m| m > 0).collect::<Vec<_>>()));
                    for (k, &ci) in rule.columns().iter().enumerate() {
                        let c = b.column(ci);
                        chunks[k].push(match &mask {
                            None => c.clone(),
                            Some(m) => filter(c.as_ref(), m)?,
                        });
                    }
                }
                let keep = rule.evaluate(&self.schema, height, &chunks)?;
                let mut k = 0;
                for bi in 0..batches.len() {
                    for r in 0..w.mult[bi].len() {
                        if w.mult[bi][r] == 0 {
                            continue;
                        }
                        if !keep[k] {
                            drop_row(w, bi, r);
                        }
                        k += 1;
                    }
                }
            }
            Kind::DynamicSampling { group, value } => {
                // Group key -> (value of its first row, whether every row had that value).
                let mut groups: HashMap<u128, (u128, bool), BuildHasherDefault<KeyHasher>> = HashMap::default();
                let mut keys: Vec<Vec<u128>> = Vec::with_capacity(batches.len());
                for (bi, b) in batches.iter().enumerate() {
                    let (g, v) = (b.column(*group).as_ref(), b.column(*value).as_ref());
                    let mut batch_keys = vec![0u128; b.num_rows()];
                    for r in alive(&w.mult[bi]) {
                        let key = self.hasher.row_key(&[g], r)?;
                        let val = self.hasher.row_key(&[v], r)?;
                        batch_keys[r] = key;
                        groups.entry(key).and_modify(|e| e.1 &= e.0 == val).or_insert((val, true));
                    }
                    keys.push(batch_keys);
                }
                for (bi, batch_keys) in keys.iter().enumerate() {
                    for r in alive(&w.mult[bi]) {
                        if groups[&batch_keys[r]].1 {
                            drop_row(w, bi, r);
                        }
                    }
                }
                let constant = groups.values().filter(|g| g.1).count() as u64;
                let s = &mut self.stats[ri];
                *s.groups_in.get_or_insert(0) += groups.len() as u64;
                *s.groups_dropped.get_or_insert(0) += constant;
                *s.groups_kept.get_or_insert(0) += groups.len() as u64 - constant;
            }
            Kind::Reflection { keep, required, seed } => {
                for (bi, b) in batches.iter().enumerate() {
                    let refl = typed(b, "reflections", &DataType::Int32)?;
                    let refl = refl.as_primitive::<Int32Type>();
                    let suite = typed(b, "suite", &DataType::Utf8)?;
                    let suite = suite.as_string::<i32>();
                    let task = typed(b, "task_id", &DataType::Utf8)?;
                    let task = task.as_string::<i32>();
                    for r in alive(&w.mult[bi]) {
                        if refl.is_valid(r) && refl.value(r) > 0 {
                            continue;
                        }
                        let required_here = suite.is_valid(r) && required.iter().any(|s| s == suite.value(r));
                        let id = if task.is_valid(r) { task.value(r) } else { "" };
                        if required_here || !sampled(id, *seed, *keep) {
                            drop_row(w, bi, r);
                        }
                    }
                }
            }
            Kind::ErrorCorrection { copies } => {
                let scores_type = &TRAJECTORIES.column("double_check_scores").expect("trajectories has double_check_scores").dtype;
                for (bi, b) in batches.iter().enumerate() {
                    let correct = typed(b, "correct", &DataType::Boolean)?;
                    let correct = correct.as_boolean();
                    let scores = typed(b, "double_check_scores", scores_type)?;
                    let scores = scores.as_list::<i32>();
                    let values = scores.values().as_primitive::<Int32Type>();
                    let offsets = scores.value_offsets();
                    for r in alive(&w.mult[bi]) {
                        let right = correct.is_valid(r) && correct.value(r);
                        let first = offsets[r] as usize;
                        let doubted = scores.is_valid(r) && offsets[r + 1] as usize > first && values.is_valid(first) && values.value(first) <= 2;
                        if right && doubted {
                            let m = w.mult[bi][r];
                            duplicated += (m * (*copies - 1)) as u64;
                            w.mult[bi][r] = m * *copies;
                        }
                    }
                }
            }
        }
        Ok((dropped, duplicated))
    }
}

/// Indices of the rows still alive.
fn alive(mult: &[u32]) -> Vec<usize> {
    mult.iter().enumerate().filter(|(_, &m)| m > 0).map(|(i, _)| i).collect()
}

/// Whether a reflection-less trajectory of `task_id` is kept, with probability `keep`: a
/// deterministic function of (task_id, seed), the same in any batch, order or run.
pub fn sampled(task_id: &str, seed: u64, keep: f64) -> bool {
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(task_id.as_bytes(), seed);
    let u = (h >> 11) as f64 / (1u64 << 53) as f64;
    u < keep
}

/// A column in the type the rule code reads (inputs written by polars or pyarrow may carry
/// large or view encodings; they were checked compatible when the filter was planned).
fn typed(batch: &RecordBatch, name: &str, dt: &DataType) -> Result<ArrayRef> {
    let c = batch.column_by_name(name).ok_or_else(|| anyhow!("column `{name}` is missing"))?;
    if c.data_type() == dt {
        Ok(c.clone())
    } else {
        cast(c, dt).with_context(|| format!("casting column `{name}` to {}", type_name(dt)))
    }
}

fn column_index(schema: &Schema, name: &str, flag: &str) -> Result<usize> {
    schema.index_of(name).map_err(|_| {
        let known: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        anyhow!("{flag}: no column `{name}` in the input (its columns: {})", known.join(", "))
    })
}

const DISTILL_COLUMNS: [&str; 8] = ["task_id", "suite", "steps", "hops", "reflections", "double_check_scores", "correct", "format_ok"];

fn looks_like_trajectories(schema: &Schema) -> bool {
    TRAJECTORIES
        .columns
        .iter()
        .all(|c| schema.field_with_name(c.name).map(|f| compatible(&c.dtype, f.data_type())).unwrap_or(false))
}

/// The distillation rules read these columns; each must be there, in a compatible type.
fn check_trajectories(schema: &Schema, source: &str) -> Result<()> {
    let written_by = format!("the `trajectories` table is written by `{}`", TRAJECTORIES.produced_by);
    for name in DISTILL_COLUMNS {
        let col = TRAJECTORIES.column(name).expect("distill columns are trajectories columns");
        let Ok(field) = schema.field_with_name(name) else {
            let known: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            bail!(
                "{source}: column `{name}` is missing: expected {} ({written_by}; columns found: {})",
                type_name(&col.dtype),
                known.join(", ")
            );
        };
        if !compatible(&col.dtype, field.data_type()) {
            bail!("{source}: column `{name}` has type {}, expected {} ({written_by})", type_name(field.data_type()), type_name(&col.dtype));
        }
    }
    Ok(())
}

fn fmt_pct(f: f64) -> String {
    let p = f * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{}", p.round() as i64)
    } else {
        format!("{p:.2}")
    }
}

/// The per-rule counts as a small table for stderr.
pub fn render_stats(stats: &[RuleStats]) -> String {
    let mut rows: Vec<[String; 6]> = vec![["rule".into(), "rows_in".into(), "kept".into(), "dropped".into(), "duplicated".into(), "condition".into()]];
    for s in stats {
        let mut cond = s.rule.clone();
        if let (Some(gi), Some(gd)) = (s.groups_in, s.groups_dropped) {
            cond.push_str(&format!(" ({gd} of {gi} groups dropped)"));
        }
        rows.push([s.name.clone(), s.rows_in.to_string(), s.kept.to_string(), s.dropped.to_string(), s.duplicated.to_string(), cond]);
    }
    let widths: Vec<usize> = (0..5).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &rows {
        out.push_str(&format!(
            "  {:<w0$}  {:>w1$}  {:>w2$}  {:>w3$}  {:>w4$}  {}\n",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4]
        ));
    }
    out
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
