//! extract → convert on the library level: for canonical teacher outputs, the rendered CoA text
//! is exactly the events' outputs in order, each tool call followed by its observation block, and
//! the observation spans point at those blocks.

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int32Type;
use coa_convert::render::{convert_group, ConvertOptions};
use coa_extract::linearize::extract_group;
use coa_convert::Target;
use coa_schemas::tables::MAS_RUNS;
use coa_schemas::rows::{Event, MasRun as Run};

fn ev(seq: i32, role: &str, output: String, obs: Option<&str>) -> Event {
    let tool = obs.map(|_| role.to_string());
    Event {
        seq,
        agent: format!("{role}-agent"),
        role: role.into(),
        input_messages: vec![],
        output,
        tool_input: tool.as_ref().map(|_| "input".to_string()),
        tool,
        observation: obs.map(str::to_string),
        tokens_in: 1,
        tokens_out: 1,
        latency_ms: 0.0,
    }
}

/// A web run with `k` search rounds (observations with multi-byte text).
fn web_run(i: usize, k: usize) -> Run {
    let mut events = vec![
        ev(0, "manager", "route".into(), None),
        ev(1, "plan", format!("<think>Plan {i} é</think>\n<plan>Steps for {i}.</plan>"), None),
    ];
    let mut seq = 2;
    for r in 0..k {
        let obs = format!("Found 1 results:\n1. [Zürich {r}](https://wiki.local/Z{r})\nSnippet 🙂 {i}");
        events.push(ev(seq, "web_search", format!("<think>Round {r}.</think>\n<web_search>query {r} ß</web_search>"), Some(&obs)));
        seq += 1;
    }
    let reflection = "<think>Review.</think>\n<reflection>information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Good</reflection>";
    events.push(ev(seq, "reflection", reflection.into(), None));
    events.push(ev(seq + 1, "suggested_answer", "<think>Guess.</think>\n<suggested_answer>Zürich</suggested_answer>".into(), None));
    events.push(ev(seq + 2, "double_check", "<think>Check.</think>\n<double_check>ok\nscore: 3</double_check>".into(), None));
    events.push(ev(seq + 3, "answer", "<answer>Zürich</answer>".into(), None));
    Run {
        task_id: format!("w{i}"),
        suite: "multihop".into(),
        question: format!("Where {i}?"),
        answers: vec!["Zürich".into()],
        backend: "scripted".into(),
        simulator: true,
        events,
        final_answer: Some("Zürich".into()),
        success: true,
        tokens_in: 10,
        tokens_out: 5,
        latency_ms: 1.0,
    }
}

#[test]
fn extract_then_convert_reproduces_the_teacher_outputs() {
    let runs: Vec<Run> = (0..3000).map(|i| web_run(i, 1 + i % 4)).collect();
    let schema = MAS_RUNS.schema();
    let batches: Vec<_> = runs
        .chunks(700)
        .map(|c| serde_arrow::to_record_batch(schema.fields(), &c).unwrap().with_schema(schema.clone()).unwrap())
        .collect();
    let ex = extract_group(&batches, 0, false).unwrap();
    assert_eq!(ex.format_errors, 0);
    let opts = ConvertOptions { target: Target::CoaText, skip_bad: false, tasks: None };
    let (_, outs) = convert_group(&ex.batches, 0, &opts).unwrap();
    let mut row = 0;
    for o in &outs {
        let text = o.coa.column_by_name("text").unwrap().as_string::<i32>();
        let spans = o.coa.column_by_name("observation_spans").unwrap().as_list::<i32>();
        for k in 0..o.coa.num_rows() {
            let run = &runs[row];
            let mut want = Vec::new();
            let mut obs = Vec::new();
            for e in run.events.iter().filter(|e| e.role != "manager") {
                want.push(e.output.clone());
                if let Some(ob) = &e.observation {
                    want.push(format!("<observation>{ob}</observation>"));
                    obs.push(ob.clone());
                }
            }
            assert_eq!(text.value(k), want.join("\n"), "{}", run.task_id);
            let sp = spans.value(k);
            let sp = sp.as_struct();
            let (starts, ends) = (sp.column(0).as_primitive::<Int32Type>(), sp.column(1).as_primitive::<Int32Type>());
            let chars: Vec<char> = text.value(k).chars().collect();
            assert_eq!(sp.len(), obs.len());
            for (j, ob) in obs.iter().enumerate() {
                let block: String = chars[starts.value(j) as usize..ends.value(j) as usize].iter().collect();
                assert_eq!(block, format!("<observation>{ob}</observation>"));
            }
            row += 1;
        }
    }
    assert_eq!(row, runs.len());
}
