//! Writes N synthetic `mas_runs` rows following the event contract (multihop and math runs with
//! realistic observation sizes), for benchmarks: `gen_mas_runs N OUT [SEED]`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use coa_schemas::io::{self, Provenance, BATCH_ROWS};
use coa_schemas::rng::SplitMix64;
use coa_schemas::tables::MAS_RUNS;
use serde::Serialize;

#[derive(Serialize)]
struct Message {
    role: &'static str,
    content: String,
}

#[derive(Serialize)]
struct Event {
    seq: i32,
    agent: &'static str,
    role: &'static str,
    input_messages: Vec<Message>,
    output: String,
    tool: Option<&'static str>,
    tool_input: Option<String>,
    observation: Option<String>,
    tokens_in: i64,
    tokens_out: i64,
    latency_ms: f64,
}

#[derive(Serialize)]
struct Run {
    task_id: String,
    suite: &'static str,
    question: String,
    answers: Vec<String>,
    backend: &'static str,
    simulator: bool,
    events: Vec<Event>,
    final_answer: Option<String>,
    success: bool,
    tokens_in: i64,
    tokens_out: i64,
    latency_ms: f64,
}

/// SplitMix64 with a modulo draw.
struct Rng(SplitMix64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.below_mod(n as usize) as u64
    }
}

const WORDS: &[&str] = &["the", "founder", "of", "lab", "Zürich", "born", "in", "river", "city", "company", "product", "was", "named", "after", "Këlmo", "Ardena", "Varos", "museum", "1961", "and"];

fn sentence(rng: &mut Rng, words: u64) -> String {
    let mut s = String::new();
    for k in 0..words {
        if k > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
    s.push('.');
    s
}

fn ev(seq: i32, agent: &'static str, role: &'static str, output: String) -> Event {
    Event { seq, agent, role, input_messages: vec![Message { role: "user", content: "context".into() }], output, tool: None, tool_input: None, observation: None, tokens_in: 800, tokens_out: 60, latency_ms: 2.0 }
}

fn think(rng: &mut Rng) -> String {
    format!("<think>{}</think>\n", sentence(rng, 20))
}

fn multihop(rng: &mut Rng, i: usize) -> Run {
    let mut events = Vec::new();
    let mut seq = 0;
    let mut push = |e: Event| events.push(e);
    let mut next = || {
        seq += 1;
        seq
    };
    push(ev(next(), "manager", "manager", "next: planner".into()));
    push(ev(next(), "planner", "plan", format!("{}<plan>{}</plan>", think(rng), sentence(rng, 30))));
    let hops = 2 + rng.below(3);
    for _ in 0..hops {
        push(ev(next(), "manager", "manager", "next: search".into()));
        let q = sentence(rng, 5);
        let obs = format!("Found 5 results:\n{}", (1..=5).map(|k| format!("{k}. [{}](https://wiki.local/P{k})\n{}", sentence(rng, 3), sentence(rng, 30))).collect::<Vec<_>>().join("\n"));
        push(Event { tool: Some("web_search"), tool_input: Some(q.clone()), observation: Some(obs), ..ev(next(), "search_agent", "web_search", format!("{}<web_search>{q}</web_search>", think(rng))) });
        let url = format!("https://wiki.local/P{}", rng.below(100));
        let obs = format!("Page 1 [{url}] Summary:\n{}", sentence(rng, 120));
        push(Event { tool: Some("crawl_page"), tool_input: Some(url.clone()), observation: Some(obs), ..ev(next(), "crawl_agent", "crawl_page", format!("{}<crawl_page>{url}</crawl_page>", think(rng))) });
    }
    push(ev(next(), "reflector", "reflection", format!("{}<reflection>{}\ninformation_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Fair</reflection>", think(rng), sentence(rng, 20))));
    push(ev(next(), "planner", "suggested_answer", format!("{}<suggested_answer>Ardena Varos</suggested_answer>", think(rng))));
    push(ev(next(), "verifier", "double_check", format!("{}<double_check>{}\nscore: 4</double_check>", think(rng), sentence(rng, 15))));
    push(ev(next(), "planner", "answer", "<answer>Ardena Varos</answer>".into()));
    Run { task_id: format!("multihop-train-{i:06}"), suite: "multihop", question: sentence(rng, 25), answers: vec!["Ardena Varos".into()], backend: "scripted", simulator: true, events, final_answer: Some("Ardena Varos".into()), success: rng.below(4) != 0, tokens_in: 20000, tokens_out: 900, latency_ms: 100.0 }
}

fn math(rng: &mut Rng, i: usize) -> Run {
    let mut events = vec![ev(1, "planner", "plan", format!("{}<plan>{}</plan>", think(rng), sentence(rng, 25)))];
    let mut seq = 1;
    for _ in 0..1 + rng.below(3) {
        seq += 1;
        let code = format!("x = {}\ny = x * 7\nprint(y)", rng.below(1000));
        let obs = format!("[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n{}\n[STDOUT:END]", rng.below(10000));
        events.push(Event { tool: Some("code"), tool_input: Some(code.clone()), observation: Some(obs), ..ev(seq, "code_agent", "code", format!("{}<code>\n```py\n{code}\n```\n</code>", think(rng))) });
        seq += 1;
        events.push(ev(seq, "reflector", "reflection", format!("{}<reflection>{}</reflection>", think(rng), sentence(rng, 20))));
    }
    events.push(ev(seq + 1, "planner", "answer", format!("{}<answer>\\boxed{{42}}</answer>", think(rng))));
    Run { task_id: format!("math-train-{i:06}"), suite: "math", question: sentence(rng, 30), answers: vec!["42".into()], backend: "scripted", simulator: true, events, final_answer: Some("42".into()), success: true, tokens_in: 8000, tokens_out: 500, latency_ms: 50.0 }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).context("usage: gen_mas_runs N OUT [SEED]")?.parse()?;
    let out = PathBuf::from(args.get(2).context("usage: gen_mas_runs N OUT [SEED]")?);
    let mut rng = Rng(SplitMix64::new(args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(1)));
    let schema = MAS_RUNS.schema();
    let mut batches = Vec::new();
    let mut i = 0;
    while i < n {
        let rows: Vec<Run> = (i..(i + BATCH_ROWS).min(n)).map(|k| if k % 3 == 2 { math(&mut rng, k) } else { multihop(&mut rng, k) }).collect();
        batches.push(serde_arrow::to_record_batch(schema.fields(), &rows)?.with_schema(schema.clone())?);
        i += rows.len();
    }
    io::write_all(Some(&out), None, &schema, &batches, &Provenance::default())?;
    eprintln!("wrote {n} mas_runs rows to {}", out.display());
    Ok(())
}
