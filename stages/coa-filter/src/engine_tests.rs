//! Rule-by-rule tests on hand-built tables.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Float32Array, Int32Array, RecordBatch, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Float32Type, Int32Type, Schema};
use coa_schemas::tables::{TASKS, TRAJECTORIES};

use super::*;
use coa_schemas::rows::{Step, Trajectory as Traj};

fn step(role: &str, content: &str) -> Step {
    Step { role: role.into(), agent: role.into(), content: content.into(), tool: None, tool_input: None, observation: None }
}

fn call(tool: &str, input: &str) -> Step {
    Step {
        role: "tool".into(),
        agent: tool.into(),
        content: input.into(),
        tool: Some(tool.into()),
        tool_input: Some(input.into()),
        observation: Some(format!("Found 1 results: {input}")),
    }
}

/// A trajectory that passes every distillation rule.
fn good(id: &str) -> Traj {
    Traj {
        task_id: id.into(),
        suite: "multihop".into(),
        question: format!("question of {id}"),
        answers: vec!["Paris".into()],
        steps: vec![
            step("think", "plan it"),
            step("plan", "1. search"),
            step("think", "search first"),
            call("web_search", &format!("{id} a")),
            step("think", "now crawl"),
            call("crawl_page", &format!("https://wiki.local/{id}")),
            step("reflection", "Good"),
            step("suggested_answer", "Paris"),
            step("double_check", "4"),
            step("answer", "Paris"),
        ],
        hops: 6,
        reflections: 1,
        double_check_scores: vec![4],
        final_answer: Some("Paris".into()),
        correct: true,
        format_ok: true,
        format_error: None,
        teacher_tokens: 1234,
    }
}

fn batch(rows: &[Traj]) -> RecordBatch {
    let b = serde_arrow::to_record_batch(TRAJECTORIES.schema().fields(), &rows).unwrap();
    b.with_schema(TRAJECTORIES.schema()).unwrap()
}

fn ids(b: &RecordBatch) -> Vec<String> {
    b.column_by_name("task_id").unwrap().as_string::<i32>().iter().map(|s| s.unwrap().to_string()).collect()
}

fn run(opts: &Options, batches: &[RecordBatch]) -> (Vec<String>, Filter) {
    let mut f = Filter::new(batches[0].schema(), opts).unwrap();
    let mut kept = Vec::new();
    for o in f.process(batches).unwrap() {
        assert_eq!(o.kept.schema(), batches[0].schema(), "output keeps the input schema");
        kept.extend(ids(&o.kept));
    }
    (kept, f)
}

fn stat<'a>(f: &'a Filter, name: &str) -> &'a RuleStats {
    f.stats().iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no rule {name}"))
}

fn only(names: &[&str]) -> Options {
    let disabled = DISTILL_RULES.iter().filter(|r| !names.contains(r)).map(|s| s.to_string()).collect();
    Options { disabled, ..Options::default() }
}

#[test]
fn good_trajectories_pass_every_rule() {
    let rows: Vec<Traj> = (0..5).map(|i| good(&format!("t{i}"))).collect();
    let (kept, f) = run(&Options::default(), &[batch(&rows)]);
    assert_eq!(kept.len(), 5);
    assert!(f.distill());
    let names: Vec<&str> = f.stats().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, DISTILL_RULES);
    for s in f.stats() {
        assert_eq!((s.rows_in, s.kept, s.dropped, s.duplicated), (5, 5, 0, 0), "{}", s.name);
    }
}

#[test]
fn dedup_drops_identical_trajectories_across_batches() {
    let a = good("t1");
    let mut same_content = good("t1");
    same_content.final_answer = Some("other".into()); // not part of the key
    let mut other_steps = good("t1");
    other_steps.steps.push(step("think", "one more thought"));
    let b = good("t2");
    let opts = only(&["dedup"]);
    let mut f = Filter::new(TRAJECTORIES.schema(), &opts).unwrap();
    let first = f.process(&[batch(&[a.clone(), same_content, other_steps])]).unwrap();
    assert_eq!(ids(&first[0].kept), vec!["t1", "t1"]);
    // A later batch (streaming) still sees the earlier keys.
    let second = f.process(&[batch(&[a, b])]).unwrap();
    assert_eq!(ids(&second[0].kept), vec!["t2"]);
    let s = stat(&f, "dedup");
    assert_eq!((s.rows_in, s.kept, s.dropped), (5, 3, 2));
    assert_eq!(s.rule, "same task_id + steps as an earlier row");
}

#[test]
fn complexity_drops_short_trajectories() {
    let mut rows: Vec<Traj> = (0..4).map(|i| good(&format!("t{i}"))).collect();
    rows[0].hops = 4;
    rows[1].hops = 5;
    rows[2].hops = 0;
    let (kept, f) = run(&only(&["complexity"]), &[batch(&rows)]);
    assert_eq!(kept, vec!["t1", "t3"]);
    assert_eq!(stat(&f, "complexity").dropped, 2);
    let (kept, _) = run(&Options { min_hops: 6, ..only(&["complexity"]) }, &[batch(&rows)]);
    assert_eq!(kept, vec!["t3"]);
}

#[test]
fn quality_rules_each_count_their_drops() {
    let mut rows: Vec<Traj> = (0..7).map(|i| good(&format!("t{i}"))).collect();
    rows[0].correct = false;
    rows[1].format_ok = false;
    rows[1].format_error = Some("answer before double_check".into());
    rows[2].steps.push(call("web_search", "t2 a")); // same tool, same input as an earlier step
    rows[3].steps.push(call("crawl_page", "t3 a")); // same input, other tool: fine
    rows[4].steps.push(call("web_search", "t4 b")); // same tool, other input: fine
    rows[5].steps.push(step("think", "plan it")); // repeated non-tool content: fine
    rows[6].correct = false;
    rows[6].format_ok = false; // dropped once, by the first rule that sees it
    let (kept, f) = run(&only(&["wrong_answer", "format", "repeated_tool_input"]), &[batch(&rows)]);
    assert_eq!(kept, vec!["t3", "t4", "t5"]);
    assert_eq!(stat(&f, "wrong_answer").dropped, 2);
    assert_eq!(stat(&f, "format").dropped, 1);
    assert_eq!(stat(&f, "format").rows_in, 5);
    assert_eq!(stat(&f, "repeated_tool_input").dropped, 1);
}

#[test]
fn repeated_tool_input_counts_null_inputs_as_equal() {
    let mut rows = vec![good("t0"), good("t1")];
    let mut c = call("code", "x");
    c.tool_input = None;
    rows[0].steps.push(c.clone());
    rows[0].steps.push(c.clone());
    rows[1].steps.push(c);
    let (kept, _) = run(&only(&["repeated_tool_input"]), &[batch(&rows)]);
    assert_eq!(kept, vec!["t1"]);
}

#[test]
fn reflection_drops_math_and_code_and_samples_the_rest() {
    let mut rows = Vec::new();
    for suite in ["math", "code"] {
        let mut t = good(&format!("{suite}-0"));
        t.suite = suite.into();
        t.reflections = 0;
        rows.push(t);
        let mut t = good(&format!("{suite}-1"));
        t.suite = suite.into();
        rows.push(t); // has a reflection: kept
    }
    let (kept, f) = run(&only(&["reflection"]), &[batch(&rows)]);
    assert_eq!(kept, vec!["math-1", "code-1"]);
    assert_eq!(stat(&f, "reflection").dropped, 2);

    // Multihop without reflection: about --no-reflection-keep of them survive.
    let rows: Vec<Traj> = (0..2000)
        .map(|i| {
            let mut t = good(&format!("mh-{i}"));
            t.reflections = 0;
            t
        })
        .collect();
    let (kept, _) = run(&only(&["reflection"]), &[batch(&rows)]);
    let frac = kept.len() as f64 / 2000.0;
    assert!((0.26..0.34).contains(&frac), "kept {frac}");
    let (all, _) = run(&Options { no_reflection_keep: 1.0, ..only(&["reflection"]) }, &[batch(&rows)]);
    assert_eq!(all.len(), 2000);
    let (none, _) = run(&Options { no_reflection_keep: 0.0, ..only(&["reflection"]) }, &[batch(&rows)]);
    assert!(none.is_empty());
    // No required suites: math is sampled like the rest.
    let mut m = good("m");
    m.suite = "math".into();
    m.reflections = 0;
    let opts = Options { no_reflection_keep: 1.0, reflection_required_suites: vec![], ..only(&["reflection"]) };
    assert_eq!(run(&opts, &[batch(&[m])]).0, vec!["m"]);
}

#[test]
fn down_sampling_is_deterministic_in_task_id_and_seed() {
    let rows: Vec<Traj> = (0..600)
        .map(|i| {
            let mut t = good(&format!("mh-{i}"));
            t.reflections = 0;
            t
        })
        .collect();
    let opts = only(&["reflection"]);
    let (whole, _) = run(&opts, &[batch(&rows)]);
    // Other batching, other order: the same rows survive.
    let (a, b) = rows.split_at(123);
    let (split, _) = run(&opts, &[batch(b), batch(a)]);
    let mut s1 = whole.clone();
    let mut s2 = split;
    s1.sort();
    s2.sort();
    assert_eq!(s1, s2);
    let (again, _) = run(&opts, &[batch(&rows)]);
    assert_eq!(whole, again);
    let (other_seed, _) = run(&Options { seed: 7, ..opts.clone() }, &[batch(&rows)]);
    assert_ne!(whole, other_seed);
    for id in &whole {
        assert!(sampled(id, 0, 0.3));
    }
}

#[test]
fn error_correction_up_samples_doubted_but_correct() {
    let mut rows: Vec<Traj> = (0..5).map(|i| good(&format!("t{i}"))).collect();
    rows[0].double_check_scores = vec![2, 4]; // doubted first, then correct: up-sampled
    rows[1].double_check_scores = vec![3, 2]; // first check confident
    rows[2].double_check_scores = vec![];
    rows[3].double_check_scores = vec![1];
    rows[3].correct = false; // doubted but wrong: not up-sampled
    rows[4].double_check_scores = vec![1];
    let (kept, f) = run(&only(&["error_correction"]), &[batch(&rows)]);
    assert_eq!(kept, vec!["t0", "t0", "t1", "t2", "t3", "t4", "t4"]);
    let s = stat(&f, "error_correction");
    assert_eq!((s.rows_in, s.kept, s.dropped, s.duplicated), (5, 5, 0, 2));
    let (kept, f) = run(&Options { error_correction_copies: 3, ..only(&["error_correction"]) }, &[batch(&rows)]);
    assert_eq!(kept.len(), 9);
    assert_eq!(stat(&f, "error_correction").duplicated, 4);
}

#[test]
fn rules_run_progressively() {
    let mut rows: Vec<Traj> = (0..6).map(|i| good(&format!("t{i}"))).collect();
    rows[1] = rows[0].clone(); // dedup
    rows[2].hops = 2; // complexity
    rows[3].correct = false; // wrong_answer
    rows[4].suite = "code".into();
    rows[4].reflections = 0; // reflection
    rows[5].double_check_scores = vec![2]; // error_correction
    let (kept, f) = run(&Options::default(), &[batch(&rows)]);
    assert_eq!(kept, vec!["t0", "t5", "t5"]);
    let stats = f.stats();
    for pair in stats.windows(2) {
        assert_eq!(pair[1].rows_in, pair[0].kept + pair[0].duplicated, "{} -> {}", pair[0].name, pair[1].name);
    }
    let dropped: Vec<(&str, u64)> = stats.iter().map(|s| (s.name.as_str(), s.dropped)).collect();
    assert_eq!(
        dropped,
        vec![("dedup", 1), ("complexity", 1), ("wrong_answer", 1), ("format", 0), ("repeated_tool_input", 0), ("reflection", 1), ("error_correction", 0)]
    );
    assert_eq!(stats.last().unwrap().duplicated, 1);
    // The table says the same.
    let table = render_stats(stats);
    assert!(table.contains("complexity") && table.contains("hops < 5"), "{table}");
}

#[test]
fn rules_can_be_disabled() {
    let mut rows = vec![good("t0"), good("t1")];
    rows[0].correct = false;
    rows[1].hops = 1;
    let opts = Options { disabled: vec!["quality".into(), "complexity".into()], ..Options::default() };
    let (kept, f) = run(&opts, &[batch(&rows)]);
    assert_eq!(kept, vec!["t0", "t1"]);
    assert!(f.stats().iter().all(|s| !["wrong_answer", "format", "repeated_tool_input", "complexity"].contains(&s.name.as_str())));
    let bad = Options { disabled: vec!["nope".into()], ..Options::default() };
    let e = Filter::new(TRAJECTORIES.schema(), &bad).err().unwrap().to_string();
    assert!(e.contains("--no-rule nope") && e.contains("complexity"), "{e}");
}

#[test]
fn bad_settings_are_refused() {
    let schema = TRAJECTORIES.schema();
    let e = Filter::new(schema.clone(), &Options { no_reflection_keep: 1.5, ..Options::default() }).err().unwrap().to_string();
    assert!(e.contains("--no-reflection-keep"), "{e}");
    let e = Filter::new(schema.clone(), &Options { error_correction_copies: 0, ..Options::default() }).err().unwrap().to_string();
    assert!(e.contains("--error-correction-copies"), "{e}");
    let e = Filter::new(schema.clone(), &Options { dedup_key: vec!["nope".into()], ..Options::default() }).err().unwrap().to_string();
    assert!(e.contains("--dedup-key: no column `nope`"), "{e}");
    let e = Filter::new(schema, &Options { dynamic_sampling: Some(("task_id".into(), "reward".into())), ..Options::default() })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--value: no column `reward`"), "{e}");
}

#[test]
fn where_rules_run_after_quality_and_see_only_survivors() {
    let mut rows: Vec<Traj> = (0..6).map(|i| good(&format!("t{i}"))).collect();
    for (i, r) in rows.iter_mut().enumerate() {
        r.hops = 5 + 5 * i as i32; // 5 10 15 20 25 30
    }
    rows[5].correct = false;
    rows[0].suite = "math".into();
    let opts = Options { wheres: vec!["hops <= 20 AND suite = 'multihop'".into(), "hops > avg(hops)".into()], ..only(&["wrong_answer"]) };
    let (kept, f) = run(&opts, &[batch(&rows[..3]), batch(&rows[3..])]);
    // where[0] keeps t1 t2 t3 (hops 10 15 20); where[1] compares with their mean (15), not the
    // mean of the whole input.
    assert_eq!(kept, vec!["t3"]);
    assert_eq!(stat(&f, "where[0]").rows_in, 5);
    assert_eq!(stat(&f, "where[0]").dropped, 2);
    assert_eq!(stat(&f, "where[1]").dropped, 2);
    assert_eq!(stat(&f, "where[0]").rule, "not (hops <= 20 AND suite = 'multihop')");
    assert!(f.needs_whole_table());
}

#[test]
fn where_errors_name_the_expression() {
    let schema = TRAJECTORIES.schema();
    for (expr, want) in [("hops <=", "--where `hops <=`"), ("hopz > 3", "unknown column `hopz`"), ("hops * 2", "expected a condition")] {
        let opts = Options { wheres: vec![expr.into()], ..Options::default() };
        let e = format!("{:#}", Filter::new(schema.clone(), &opts).err().unwrap());
        assert!(e.contains(want), "{expr}: {e}");
    }
}

#[test]
fn keep_dropped_gives_rows_and_reasons() {
    let mut rows: Vec<Traj> = (0..5).map(|i| good(&format!("t{i}"))).collect();
    rows[1].hops = 1;
    rows[3].format_ok = false;
    rows[4].hops = 2;
    let mut f = Filter::new(TRAJECTORIES.schema(), &Options::default()).unwrap();
    f.keep_dropped(true);
    let out = f.process(&[batch(&rows)]).unwrap();
    let d = out[0].dropped.as_ref().unwrap();
    assert_eq!(ids(d), vec!["t1", "t3", "t4"]);
    let reasons: Vec<&str> = d.column_by_name(DROP_REASON).unwrap().as_string::<i32>().iter().map(|s| s.unwrap()).collect();
    assert_eq!(reasons, vec!["complexity", "format", "complexity"]);
    assert_eq!(d.schema(), f.dropped_schema());
    assert_eq!(d.num_columns(), TRAJECTORIES.columns.len() + 1);
    assert_eq!(d.schema().metadata(), TRAJECTORIES.schema().metadata());
    // Hops of the dropped rows are the original ones.
    let hops: Vec<i32> = d.column_by_name("hops").unwrap().as_primitive::<Int32Type>().values().to_vec();
    assert_eq!(hops, vec![1, 6, 2]);
    // Without keep_dropped nothing is built.
    let mut f = Filter::new(TRAJECTORIES.schema(), &Options::default()).unwrap();
    assert!(f.process(&[batch(&rows)]).unwrap()[0].dropped.is_none());
}

/// A scores-like table: G samples per task with a reward.
fn scores(rewards: &[(&str, f32)]) -> RecordBatch {
    let schema = Arc::new(
        Schema::new(vec![
            Field::new("task_id", DataType::Utf8, false),
            Field::new("sample_idx", DataType::Int32, false),
            Field::new("reward", DataType::Float32, false),
        ])
        .with_metadata(std::collections::HashMap::from([("coa.table".to_string(), "scores".to_string())])),
    );
    let ids: Vec<&str> = rewards.iter().map(|r| r.0).collect();
    let idx: Vec<i32> = (0..rewards.len() as i32).collect();
    let rw: Vec<f32> = rewards.iter().map(|r| r.1).collect();
    RecordBatch::try_new(
        schema,
        vec![Arc::new(StringArray::from(ids)) as ArrayRef, Arc::new(Int32Array::from(idx)), Arc::new(Float32Array::from(rw))],
    )
    .unwrap()
}

#[test]
fn dynamic_sampling_drops_constant_groups() {
    let a = scores(&[("a", 1.0), ("b", 0.0), ("a", 1.0), ("c", 0.5), ("b", 1.0), ("a", 1.0)]);
    let b = scores(&[("c", 0.5), ("d", 0.0), ("b", 0.0)]); // c stays constant across batches; d alone
    let opts = Options { dynamic_sampling: Some(("task_id".into(), "reward".into())), ..Options::default() };
    let mut f = Filter::new(a.schema(), &opts).unwrap();
    assert!(!f.distill(), "a scores table gets no distillation rules");
    assert!(f.notes()[0].contains("`scores` table"), "{:?}", f.notes());
    assert!(f.needs_whole_table());
    f.keep_dropped(true);
    let out = f.process(&[a, b]).unwrap();
    assert_eq!(ids(&out[0].kept), vec!["b", "b"]);
    assert_eq!(ids(&out[1].kept), vec!["b"]);
    let rewards: Vec<f32> = out[0].kept.column(2).as_primitive::<Float32Type>().values().to_vec();
    assert_eq!(rewards, vec![0.0, 1.0]);
    let s = stat(&f, "dynamic_sampling");
    assert_eq!((s.rows_in, s.kept, s.dropped), (9, 3, 6));
    assert_eq!((s.groups_in, s.groups_kept, s.groups_dropped), (Some(4), Some(1), Some(3)));
    let reasons: Vec<&str> = out[1].dropped.as_ref().unwrap().column_by_name(DROP_REASON).unwrap().as_string::<i32>().iter().map(|s| s.unwrap()).collect();
    assert_eq!(reasons, vec!["dynamic_sampling", "dynamic_sampling"]);
    // Other columns work as group and value.
    let opts = Options { dynamic_sampling: Some(("reward".into(), "task_id".into())), ..Options::default() };
    let (kept, _) = run(&opts, &[scores(&[("a", 1.0), ("b", 1.0), ("c", 0.0)])]);
    assert_eq!(kept, vec!["a", "b"]);
}

#[test]
fn other_tables_get_no_distillation_rules_unless_asked() {
    let tasks = {
        let mut fields: Vec<Field> = TASKS.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.truncate(2);
        let schema = Arc::new(Schema::new(fields).with_metadata(TASKS.schema().metadata().clone()));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(StringArray::from(vec!["a", "b", "a"])) as ArrayRef, Arc::new(StringArray::from(vec!["math", "code", "math"]))],
        )
        .unwrap()
    };
    let (kept, f) = run(&Options::default(), std::slice::from_ref(&tasks));
    assert_eq!(kept.len(), 3);
    assert!(f.stats().is_empty());
    assert!(f.notes()[0].contains("not applied") && f.notes()[0].contains("`tasks`"));
    let e = Filter::new(tasks.schema(), &Options { rules: RuleSet::Distill, ..Options::default() }).err().unwrap().to_string();
    assert!(e.contains("the `tasks` table, expected the `trajectories` table"), "{e}");
    // --dedup compares whole rows on any table; --rules none says nothing.
    let (kept, f) = run(&Options { rules: RuleSet::None, dedup: true, ..Options::default() }, std::slice::from_ref(&tasks));
    assert_eq!(kept, vec!["a", "b"]);
    assert!(f.notes().is_empty());
    assert_eq!(stat(&f, "dedup").rule, "same task_id + suite as an earlier row");
    let (kept, _) = run(&Options { rules: RuleSet::None, dedup_key: vec!["suite".into()], ..Options::default() }, &[tasks]);
    assert_eq!(kept, vec!["a", "b"]);
}

#[test]
fn rules_none_on_trajectories_runs_only_what_is_asked() {
    let mut rows = vec![good("t0"), good("t1")];
    rows[0].hops = 1;
    let (kept, f) = run(&Options { rules: RuleSet::None, wheres: vec!["task_id <> 't1'".into()], ..Options::default() }, &[batch(&rows)]);
    assert_eq!(kept, vec!["t0"]);
    assert_eq!(f.stats().len(), 1);
}

#[test]
fn trajectories_are_recognised_by_columns_and_polars_encodings_work() {
    let mut rows: Vec<Traj> = (0..4).map(|i| good(&format!("t{i}"))).collect();
    rows[1].hops = 2;
    rows[2].steps.push(call("web_search", "t2 a"));
    rows[3].double_check_scores = vec![1];
    let b = batch(&rows);
    // As polars would write it, without our metadata: large strings and large lists.
    let large = |dt: &DataType| -> DataType {
        match dt {
            DataType::Utf8 => DataType::LargeUtf8,
            DataType::List(f) => DataType::LargeList(Arc::new(Field::new("item", f.data_type().clone(), true))),
            other => other.clone(),
        }
    };
    let fields: Vec<Field> = b.schema().fields().iter().map(|f| Field::new(f.name(), large(f.data_type()), f.is_nullable())).collect();
    let columns: Vec<ArrayRef> = b.columns().iter().zip(&fields).map(|(c, f)| cast(c, f.data_type()).unwrap()).collect();
    let polars_like = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    let mut f = Filter::new(polars_like.schema(), &Options::default()).unwrap();
    assert!(f.distill(), "recognised by its columns");
    let out = f.process(std::slice::from_ref(&polars_like)).unwrap();
    assert_eq!(out[0].kept.schema(), polars_like.schema(), "the input's encodings are kept");
    let kept: Vec<&str> = out[0].kept.column(0).as_string::<i64>().iter().map(|s| s.unwrap()).collect();
    assert_eq!(kept, vec!["t0", "t3", "t3"]);
}

#[test]
fn trajectories_metadata_with_missing_columns_is_an_error() {
    let b = batch(&[good("t0")]);
    let schema = Arc::new(b.schema().project(&[0, 1, 2]).unwrap());
    let e = Filter::new(schema, &Options::default()).err().unwrap().to_string();
    assert!(e.contains("column `steps` is missing") && e.contains("coa-extract"), "{e}");
}

#[test]
fn empty_windows_are_fine() {
    let b = batch(&[]);
    let (kept, f) = run(&Options::default(), &[b]);
    assert!(kept.is_empty());
    assert!(f.stats().iter().all(|s| s.rows_in == 0));
    let w = Options { wheres: vec!["hops > avg(hops)".into()], ..Options::default() };
    let (kept, _) = run(&w, &[batch(&[])]);
    assert!(kept.is_empty());
}
