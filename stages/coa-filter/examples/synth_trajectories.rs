//! Writes N synthetic trajectories (teacher-like sizes and failure mix) for timing `coa-filter`.
//!
//! `cargo run --release -p coa-filter --example synth_trajectories -- 100000 traj.arrow [SEED]`
//!
//! Mix: hops 2-15, 80% correct, 95% format_ok, 40% without reflection, 5% with a repeated tool
//! call, 15% whose first double_check doubted, 2% exact duplicates; suites 60% multihop, 20% math,
//! 20% code; 8-20 steps with observations of 300-1500 characters.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, BooleanArray, Int32Builder, Int64Array, ListBuilder, RecordBatch, StringArray, StringBuilder, StructBuilder};
use arrow::datatypes::{DataType, Field, Fields};
use coa_schemas::io::{self, Provenance};
use coa_schemas::tables::TRAJECTORIES;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

const WORDS: [&str; 16] =
    ["the", "river", "city", "founded", "company", "director", "born", "museum", "capital", "album", "released", "north", "award", "university", "bridge", "author"];

fn text(rng: &mut Rng, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 16);
    while s.len() < chars {
        s.push_str(WORDS[rng.below(16) as usize]);
        s.push(' ');
    }
    s
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).context("usage: synth_trajectories N OUT [SEED]")?.parse()?;
    let out = PathBuf::from(args.get(2).context("usage: synth_trajectories N OUT [SEED]")?);
    let seed: u64 = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(1);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let schema = TRAJECTORIES.schema();
    let steps_fields = match &TRAJECTORIES.column("steps").unwrap().dtype {
        DataType::List(f) => match f.data_type() {
            DataType::Struct(fs) => fs.clone(),
            _ => unreachable!(),
        },
        _ => unreachable!(),
    };
    let provenance = Provenance { stage: "synth_trajectories".into(), version: "example".into(), seed: Some(seed), ..Default::default() };
    let mut w = io::create(Some(&out), None, &schema, &provenance)?;
    let mut done = 0;
    while done < n {
        let rows = (n - done).min(io::BATCH_ROWS);
        w.write(&batch(&mut rng, done, rows, &steps_fields)?)?;
        done += rows;
    }
    w.finish()?;
    eprintln!("wrote {n} trajectories to {}", out.display());
    Ok(())
}

fn batch(rng: &mut Rng, first: usize, rows: usize, steps_fields: &Fields) -> Result<RecordBatch> {
    let schema = TRAJECTORIES.schema();
    let mut ids = Vec::with_capacity(rows);
    let mut suites = Vec::with_capacity(rows);
    let mut questions = Vec::with_capacity(rows);
    let mut answers = ListBuilder::new(StringBuilder::new());
    let mut steps = ListBuilder::new(StructBuilder::from_fields(steps_fields.clone(), 0)).with_field(Arc::new(Field::new(
        "item",
        DataType::Struct(steps_fields.clone()),
        true,
    )));
    let mut hops = Vec::with_capacity(rows);
    let mut refl = Vec::with_capacity(rows);
    let mut dcs = ListBuilder::new(Int32Builder::new());
    let mut finals = Vec::with_capacity(rows);
    let mut correct = Vec::with_capacity(rows);
    let mut format_ok = Vec::with_capacity(rows);
    let mut format_err: Vec<Option<String>> = Vec::with_capacity(rows);
    let mut tokens = Vec::with_capacity(rows);
    // Each row's random choices are made from its own generator so that a duplicate is exact.
    let mut row_seed = 0u64;
    for r in 0..rows {
        let dup = r > 0 && rng.chance(0.02);
        if !dup {
            row_seed = rng.next();
        }
        let mut g = Rng(row_seed | 1);
        let idx = if dup { first + r - 1 } else { first + r };
        let suite = match g.below(10) {
            0 | 1 => "math",
            2 | 3 => "code",
            _ => "multihop",
        };
        ids.push(format!("{suite}-train-{idx:07}"));
        suites.push(suite);
        questions.push(text(&mut g, 120));
        answers.values().append_value(text(&mut g, 12));
        answers.append(true);
        let n_steps = 8 + g.below(13) as usize;
        let repeat = g.chance(0.05);
        let mut first_call: Option<(String, String)> = None;
        let sb = steps.values();
        for s in 0..n_steps {
            let role = ["think", "plan", "tool", "reflection", "suggested_answer", "double_check"][s % 6];
            let is_tool = role == "tool";
            sb.field_builder::<StringBuilder>(0).unwrap().append_value(role);
            sb.field_builder::<StringBuilder>(1).unwrap().append_value(if is_tool { "search_agent" } else { "planner" });
            let len = 100 + g.below(200) as usize;
            sb.field_builder::<StringBuilder>(2).unwrap().append_value(text(&mut g, len));
            if is_tool {
                let tool = if suite == "multihop" { "web_search" } else { "code" };
                let input = match (&first_call, repeat) {
                    (Some(c), true) => c.1.clone(),
                    _ => text(&mut g, 40),
                };
                first_call.get_or_insert((tool.to_string(), input.clone()));
                sb.field_builder::<StringBuilder>(3).unwrap().append_value(tool);
                sb.field_builder::<StringBuilder>(4).unwrap().append_value(&input);
                let len = 300 + g.below(1200) as usize;
                sb.field_builder::<StringBuilder>(5).unwrap().append_value(text(&mut g, len));
            } else {
                for k in 3..6 {
                    sb.field_builder::<StringBuilder>(k).unwrap().append_null();
                }
            }
            sb.append(true);
        }
        steps.append(true);
        hops.push(2 + g.below(14) as i32);
        refl.push(if g.chance(0.4) { 0 } else { 1 + g.below(3) as i32 });
        let doubted = g.chance(0.15);
        dcs.values().append_value(if doubted { 1 + g.below(2) as i32 } else { 3 + g.below(2) as i32 });
        if doubted {
            dcs.values().append_value(4);
        }
        dcs.append(true);
        finals.push(Some(text(&mut g, 12)));
        correct.push(g.chance(0.8));
        let ok = g.chance(0.95);
        format_ok.push(ok);
        format_err.push((!ok).then(|| "answer before double_check".to_string()));
        tokens.push(5000 + g.below(20000) as i64);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(ids)),
        Arc::new(StringArray::from(suites)),
        Arc::new(StringArray::from(questions)),
        Arc::new(answers.finish()),
        Arc::new(steps.finish()),
        Arc::new(arrow::array::Int32Array::from(hops)),
        Arc::new(arrow::array::Int32Array::from(refl)),
        Arc::new(dcs.finish()),
        Arc::new(StringArray::from(finals)),
        Arc::new(BooleanArray::from(correct)),
        Arc::new(BooleanArray::from(format_ok)),
        Arc::new(StringArray::from(format_err)),
        Arc::new(Int64Array::from(tokens)),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}
