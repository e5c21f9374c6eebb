//! The Arrow schema of every stage boundary, defined once.
//!
//! Each table is a list of columns with a type, nullability and a one-line doc. `schemas/README.md`
//! is generated from these definitions (`make schemas-doc`); a test fails when it is stale.
//! A reader checks an input against its expected table and casts compatible encodings
//! (large strings, string views, large lists, as polars writes them) to the canonical types.

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};

/// Bumped whenever any table changes shape; written into every output's metadata.
pub const SCHEMA_VERSION: &str = "2";

/// Metadata key naming the table an Arrow stream or file holds.
pub const META_TABLE: &str = "coa.table";
/// Metadata key holding [`SCHEMA_VERSION`].
pub const META_SCHEMA_VERSION: &str = "coa.schema_version";
/// Metadata key holding the provenance JSON (see [`crate::io::Provenance`]).
pub const META_PROVENANCE: &str = "coa.provenance";

/// One column of a table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: &'static str,
    pub dtype: DataType,
    pub nullable: bool,
    pub doc: &'static str,
    /// How a reader fills this column when an input lacks it (tables written by other tools,
    /// e.g. HF datasets or polars, without our bookkeeping columns); `None`: the column is required.
    pub derived: Option<Derived>,
}

/// A column that can be computed from the others of its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derived {
    /// The length of this list column (int32).
    ListLen(&'static str),
    /// The number of ones in this uint8 list column (int32).
    ListOnes(&'static str),
}

/// A table that crosses a stage boundary.
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    /// The stage that writes this table (named in schema errors so a user knows what to run).
    pub produced_by: &'static str,
    pub doc: &'static str,
    pub columns: Vec<Column>,
    schema: SchemaRef,
}

impl Table {
    fn new(name: &'static str, produced_by: &'static str, doc: &'static str, columns: Vec<Column>) -> Table {
        let fields: Vec<Field> = columns.iter().map(|c| Field::new(c.name, c.dtype.clone(), c.nullable)).collect();
        let meta = [
            (META_TABLE.to_string(), name.to_string()),
            (META_SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
        ];
        let schema = Arc::new(Schema::new(fields).with_metadata(meta.into_iter().collect::<std::collections::HashMap<String, String>>()));
        Table { name, produced_by, doc, columns, schema }
    }

    /// The canonical Arrow schema (with `coa.table` and `coa.schema_version` metadata).
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }
}

fn col(name: &'static str, dtype: DataType, nullable: bool, doc: &'static str) -> Column {
    Column { name, dtype, nullable, doc, derived: None }
}

impl Column {
    fn derived(self, how: Derived) -> Column {
        Column { derived: Some(how), ..self }
    }
}

fn utf8() -> DataType {
    DataType::Utf8
}
fn list(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, true)))
}
fn strukt(fields: Vec<Field>) -> DataType {
    DataType::Struct(Fields::from(fields))
}
fn f(name: &str, dtype: DataType, nullable: bool) -> Field {
    Field::new(name, dtype, nullable)
}
/// `list<struct<role, content>>`: a chat transcript.
fn messages() -> DataType {
    list(strukt(vec![f("role", utf8(), false), f("content", utf8(), false)]))
}

pub static TASKS: LazyLock<Table> = LazyLock::new(|| {
    Table::new(
        "tasks",
        "coa-generate tasks",
        "One verifiable task per row: synthetic offline suites or imported real task files.",
        vec![
            col("task_id", utf8(), false, "Unique id, e.g. `multihop-train-000042` or `aime24-7`."),
            col("suite", utf8(), false, "`multihop`, `math`, `code` or `qa`; decides tools and reward."),
            col("split", utf8(), false, "`train` or `test` (held-out entities and numbers)."),
            col("source", utf8(), false, "`synthetic` or the imported data source (`aime24`, `nq`, `humaneval`, ...)."),
            col("question", utf8(), false, "The task as the agent sees it."),
            col("system_prompt", utf8(), true, "System message of an imported prompt, and the instruction block (AFM's, or ours) split off its question, if any."),
            col("answers", list(utf8()), false, "Gold answers; any one counts as correct. Empty for code tasks (tests decide)."),
            col("tools", list(utf8()), false, "Tools the agent may call: `web_search`, `crawl_page`, `code`."),
            col("hops", DataType::Int32, true, "Number of reasoning hops (multihop), or null."),
            col("difficulty", utf8(), true, "`easy`/`medium`/`hard` (or the source's own label), or null."),
            col("entry_point", utf8(), true, "Function under test for function-style code tasks."),
            col("test_code", utf8(), true, "Python test program run after the candidate code (asserts; exit 0 = pass)."),
            col(
                "stdio_tests",
                list(strukt(vec![f("stdin", utf8(), false), f("expected_stdout", utf8(), false)])),
                false,
                "stdin/expected-stdout pairs for program-style code tasks (LiveCodeBench).",
            ),
            col("solution", utf8(), true, "Expert solution path (JSON) for the scripted teacher; never shown to the student."),
            col("extra", utf8(), true, "Importer leftovers as JSON (e.g. verl `extra_info`)."),
        ],
    )
});

pub static CORPUS: LazyLock<Table> = LazyLock::new(|| {
    Table::new(
        "corpus",
        "coa-generate tasks --corpus-out",
        "The offline web: one page per entity of the synthetic world, plus distractor pages.",
        vec![
            col("url", utf8(), false, "Unique page URL, e.g. `https://wiki.local/Ardena_Varos`."),
            col("title", utf8(), false, "Page title."),
            col("text", utf8(), false, "Page body (plain text, several sentences)."),
            col("kind", utf8(), false, "`entity` or `distractor`."),
        ],
    )
});

fn event_fields() -> Vec<Field> {
    vec![
        f("seq", DataType::Int32, false),
        f("agent", utf8(), false),
        f("role", utf8(), false),
        f("input_messages", messages(), false),
        f("output", utf8(), false),
        f("tool", utf8(), true),
        f("tool_input", utf8(), true),
        f("observation", utf8(), true),
        f("tokens_in", DataType::Int64, false),
        f("tokens_out", DataType::Int64, false),
        f("latency_ms", DataType::Float64, false),
    ]
}

pub static MAS_RUNS: LazyLock<Table> = LazyLock::new(|| {
    Table::new(
        "mas_runs",
        "coa-generate mas",
        "One teacher multi-agent run per task, with every agent activation logged as an event.",
        vec![
            col("task_id", utf8(), false, "Task this run solves."),
            col("suite", utf8(), false, "Suite of the task."),
            col("question", utf8(), false, "The task's question."),
            col("answers", list(utf8()), false, "Gold answers (copied from tasks)."),
            col("backend", utf8(), false, "LLM backend: `scripted` (simulator) or `openai:<model>`."),
            col("simulator", DataType::Boolean, false, "True when the agents were simulated by the scripted expert."),
            col(
                "events",
                list(strukt(event_fields())),
                false,
                "Agent activations in order: agent, role, messages read, output, tool call, observation, tokens, latency.",
            ),
            col("final_answer", utf8(), true, "The answer the system gave, or null if it gave none."),
            col("success", DataType::Boolean, false, "Whether the final answer is correct."),
            col("tokens_in", DataType::Int64, false, "Total prompt tokens over every activation (each agent re-reads its context)."),
            col("tokens_out", DataType::Int64, false, "Total generated tokens over every activation."),
            col("latency_ms", DataType::Float64, false, "Wall-clock time of the run."),
        ],
    )
});

pub static TRAJECTORIES: LazyLock<Table> = LazyLock::new(|| {
    Table::new(
        "trajectories",
        "coa-extract",
        "Linear Chain-of-Agents trajectories: the teacher's activations as ordered steps.",
        vec![
            col("task_id", utf8(), false, "Task this trajectory solves."),
            col("suite", utf8(), false, "Suite of the task."),
            col("question", utf8(), false, "The task's question."),
            col("answers", list(utf8()), false, "Gold answers."),
            col(
                "steps",
                list(strukt(vec![
                    f("role", utf8(), false),
                    f("agent", utf8(), false),
                    f("content", utf8(), false),
                    f("tool", utf8(), true),
                    f("tool_input", utf8(), true),
                    f("observation", utf8(), true),
                ])),
                false,
                "Ordered steps: role (think/plan/tool/reflection/...), agent, content, tool call and observation.",
            ),
            col("hops", DataType::Int32, false, "Number of agent and tool interactions."),
            col("reflections", DataType::Int32, false, "Number of reflection steps."),
            col("double_check_scores", list(DataType::Int32), false, "Scores (1-4) of each double_check, in order."),
            col("final_answer", utf8(), true, "The trajectory's answer, or null."),
            col("correct", DataType::Boolean, false, "Whether the final answer is correct."),
            col("format_ok", DataType::Boolean, false, "Whether the steps follow the CoA tag grammar (`coa_format::validate`)."),
            col("format_error", utf8(), true, "The first grammar violation, or null."),
            col("teacher_tokens", DataType::Int64, false, "Teacher token cost (in + out) of the run."),
        ],
    )
});

pub static COA_TEXT: LazyLock<Table> = LazyLock::new(|| {
    Table::new(
        "coa_text",
        "coa-convert",
        "Rendered Chain-of-Agents text with observation spans, ready to tokenize.",
        vec![
            col("task_id", utf8(), false, "Task id."),
            col("suite", utf8(), false, "Suite of the task."),
            col("prompt", utf8(), false, "The prompt the model is conditioned on (never a training target)."),
            col("text", utf8(), false, "The CoA trajectory in AFM tags: what the model learns to write."),
            col(
                "observation_spans",
                list(strukt(vec![f("start", DataType::Int32, false), f("end", DataType::Int32, false)])),
                false,
                "Character (Unicode scalar) offsets [start, end) of tool observations in `text`; masked from the loss.",
            ),
        ],
    )
});

pub static TOKENS: LazyLock<Table> = LazyLock::new(|| {
    Table::new(
        "tokens",
        "coa-tokenize",
        "Token ids with a loss mask; `loss_mask[t] = 1` marks token t as a training target (HF unshifted labels).",
        vec![
            col("task_id", utf8(), false, "Task id (of the first segment when packed)."),
            col("input_ids", list(DataType::Int32), false, "Token ids."),
            col("loss_mask", list(DataType::UInt8), false, "1 where the token is a target, 0 for prompt and observations."),
            col("segment_ids", list(DataType::Int32), true, "Packed sequence id per token, or null when not packed."),
            col("n_tokens", DataType::Int32, false, "Length of `input_ids` (derived when absent).").derived(Derived::ListLen("input_ids")),
            col("n_targets", DataType::Int32, false, "Number of ones in `loss_mask` (derived when absent).").derived(Derived::ListOnes("loss_mask")),
        ],
    )
});

fn rollout_columns() -> Vec<Column> {
    vec![
        col("task_id", utf8(), false, "Task id."),
        col("suite", utf8(), false, "Suite of the task."),
        col("sample_idx", DataType::Int32, false, "Index of this sample within its group of G."),
        col("model", utf8(), false, "Checkpoint that generated it."),
        col("prompt_ids", list(DataType::Int32), false, "Prompt token ids."),
        col("response_ids", list(DataType::Int32), false, "Every response token over all turns, observations included."),
        col("loss_mask", list(DataType::UInt8), false, "1 for tokens the policy wrote, 0 for observation tokens."),
        col("logprobs", list(DataType::Float32), false, "Sampling log-prob of each response token (0 for observations)."),
        col("response_text", utf8(), false, "Decoded response, for reading and scoring."),
        col("turns", DataType::Int32, false, "Number of generation turns."),
        col("tool_calls", DataType::Int32, false, "Number of tool calls executed."),
        col("finish_reason", utf8(), false, "`answer`, `budget`, `max_turns` or `eos`."),
    ]
}

pub static ROLLOUTS: LazyLock<Table> = LazyLock::new(|| {
    Table::new("rollouts", "coa-generate policy", "Policy samples with real tool calls, G per task.", rollout_columns())
});

fn score_columns() -> Vec<Column> {
    vec![
        col("reward", DataType::Float32, false, "Total reward: outcome + format + overlong shaping."),
        col("correct", DataType::Boolean, false, "Outcome verified correct (EM, math equivalence or unit tests)."),
        col("f1", DataType::Float32, true, "SQuAD F1 for QA tasks, else null."),
        col("format_ok", DataType::Boolean, false, "Whether the response follows the CoA tag grammar."),
        col("overlong", DataType::Float32, false, "Overlong shaping term (0 inside the budget, down to -1)."),
        col("advantage", DataType::Float32, false, "Group-normalised advantage (R - mean) / (std + 1e-6)."),
        col(
            "sandbox",
            utf8(),
            true,
            "Code tasks: the sandbox's verdict on the answer's program: `passed`, `failed` (an assertion, an error, wrong output, or an exit before the tests finished), `timed_out`, `killed` (a signal: CPU or memory limit, a crash) or `output_limit`. Null when no code ran (other suites, no answer).",
        ),
    ]
}

pub static SCORES: LazyLock<Table> = LazyLock::new(|| {
    let mut cols = rollout_columns();
    cols.extend(score_columns());
    Table::new("scores", "coa-score", "Rollouts with verifiable rewards and group advantages.", cols)
});

pub static METRICS: LazyLock<Table> = LazyLock::new(|| {
    Table::new(
        "metrics",
        "coa-train-step",
        "One row per optimizer step.",
        vec![
            col("step", DataType::Int64, false, "Optimizer step (1-based, continues across resumes)."),
            col("objective", utf8(), false, "`sft` or `dapo`."),
            col("loss", DataType::Float32, false, "Loss of the step (token mean over the whole accumulated batch)."),
            col("lr", DataType::Float32, false, "Learning rate used."),
            col("grad_norm", DataType::Float32, false, "Global gradient norm before clipping."),
            col("tokens", DataType::Int64, false, "Target tokens in the step."),
            col("tokens_per_s", DataType::Float32, false, "Throughput of the step."),
            col("reward_mean", DataType::Float32, true, "DAPO: mean reward of the batch."),
            col("clip_frac", DataType::Float32, true, "DAPO: fraction of tokens whose ratio was clipped."),
            col("entropy", DataType::Float32, true, "DAPO: mean token entropy."),
            col("response_len", DataType::Float32, true, "DAPO: mean response length."),
            col("logprob_mismatch", DataType::Float32, true, "DAPO: mean |sampling - trainer| log-prob."),
        ],
    )
});

/// Every table, in pipeline order.
pub fn all() -> Vec<&'static Table> {
    vec![&TASKS, &CORPUS, &MAS_RUNS, &TRAJECTORIES, &COA_TEXT, &TOKENS, &ROLLOUTS, &SCORES, &METRICS]
}

/// Looks a table up by name.
pub fn by_name(name: &str) -> Option<&'static Table> {
    all().into_iter().find(|t| t.name == name)
}

/// Human spelling of a type, as in error messages and the generated reference.
pub fn type_name(dt: &DataType) -> String {
    match dt {
        DataType::Utf8 => "utf8".into(),
        DataType::LargeUtf8 => "large_utf8".into(),
        DataType::Utf8View => "utf8_view".into(),
        DataType::Boolean => "bool".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::UInt8 => "uint8".into(),
        DataType::Float32 => "float32".into(),
        DataType::Float64 => "float64".into(),
        DataType::List(f) => format!("list<{}>", type_name(f.data_type())),
        DataType::LargeList(f) => format!("large_list<{}>", type_name(f.data_type())),
        DataType::Struct(fs) => {
            let inner: Vec<String> = fs.iter().map(|f| format!("{}: {}", f.name(), type_name(f.data_type()))).collect();
            format!("struct<{}>", inner.join(", "))
        }
        other => format!("{other}").to_lowercase(),
    }
}

/// Whether `found` can be read as `expected`: the same logical type, allowing the other string
/// and list encodings that polars and pyarrow write (cast on read).
pub fn compatible(expected: &DataType, found: &DataType) -> bool {
    use DataType::*;
    match (expected, found) {
        (Utf8, Utf8 | LargeUtf8 | Utf8View) => true,
        (List(e), List(g) | LargeList(g) | ListView(g) | LargeListView(g)) => compatible(e.data_type(), g.data_type()),
        // Integer widths are cast (polars and HF datasets write token ids as int64); a value that
        // does not fit fails the cast with an error naming the column.
        (e, g) if e.is_integer() && g.is_integer() => true,
        (Struct(e), Struct(g)) => e.iter().all(|ef| match g.iter().find(|gf| gf.name() == ef.name()) {
            Some(gf) => compatible(ef.data_type(), gf.data_type()),
            None => ef.is_nullable(),
        }),
        (e, g) => e == g,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_findable() {
        let names: Vec<_> = all().iter().map(|t| t.name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        for n in names {
            assert_eq!(by_name(n).unwrap().name, n);
        }
        assert!(by_name("nope").is_none());
    }

    #[test]
    fn compatibility_accepts_polars_encodings_and_rejects_other_types() {
        let lu = DataType::LargeList(Arc::new(Field::new("item", DataType::LargeUtf8, true)));
        assert!(compatible(&list(utf8()), &lu));
        assert!(compatible(&utf8(), &DataType::Utf8View));
        assert!(compatible(&list(DataType::Int32), &list(DataType::Int64)));
        assert!(compatible(&list(DataType::UInt8), &list(DataType::Int64)));
        assert!(!compatible(&list(DataType::Int32), &list(DataType::Float32)));
        assert!(!compatible(&DataType::Int32, &list(DataType::Int32)));
        assert!(!compatible(&utf8(), &DataType::Int32));
    }
}

/// The generated reference `schemas/README.md` (see `make schemas-doc`).
pub fn reference_markdown() -> String {
    let mut out = String::new();
    out.push_str("# coa-schemas\n\n");
    out.push_str("<!-- Generated from schemas/src/tables.rs by `make schemas-doc`; a test fails when this file is stale. -->\n\n");
    out.push_str(
        "Owns the data contract every stage shares and the code every stage runs through: the Arrow schema of each \
         table (below, from `src/tables.rs`), the one IO layer (`io`), atomic outputs (`output`), signal cleanup \
         (`cleanup`), the stage harness (`stage::main`: flags, summary line, provenance), flag parsing and the flags \
         several stages share (`flags`: `ThreadsArg`), `--shard` (`shard`), group-by-group parallel passes \
         (`parallel`), the task suites and their tools (`suite`), the deterministic RNG (`rng`). Entry points: \
         `stage::main`, `Stage::open`/`create`, `tables::*`. It must not depend on any other workspace crate: \
         every crate depends on it.\n\n## Table schemas\n\n",
    );
    out.push_str(&format!(
        "Schema version **{SCHEMA_VERSION}**. Every output also carries `{META_TABLE}`, `{META_SCHEMA_VERSION}` and \
         `{META_PROVENANCE}` (JSON: stage, version, args, seed, inputs with their own provenance) in its Arrow schema metadata.\n\n"
    ));
    out.push_str("Readers accept the equivalent encodings polars and pyarrow write (`large_utf8`, `utf8_view`, `large_list`) \
                  and cast them; extra columns are kept.\n\n");
    for t in all() {
        out.push_str(&format!("## `{}`\n\nWritten by `{}`. {}\n\n", t.name, t.produced_by, t.doc));
        out.push_str("| column | type | nullable | meaning |\n|---|---|---|---|\n");
        for c in &t.columns {
            let ty = type_name(&c.dtype).replace('|', "\\|");
            out.push_str(&format!("| `{}` | `{}` | {} | {} |\n", c.name, ty, if c.nullable { "yes" } else { "no" }, c.doc));
        }
        out.push('\n');
    }
    out
}
