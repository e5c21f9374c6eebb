//! `coa-extract`: teacher multi-agent runs (`mas_runs`) → linear Chain-of-Agents trajectories
//! (`trajectories`) (docs/ARCHITECTURE.md, "Teacher and distillation"). [`run`] is the stage the
//! binary calls: it reads the runs group by group, linearizes each group in parallel
//! ([`linearize`]) and writes the trajectories in input order. The main output is created once
//! the first group is processed, so a bad first row leaves no output at all.

pub mod linearize;

use std::path::PathBuf;

use anyhow::{Context, Result};
use coa_schemas::parallel::{next_group, BackgroundWriter, Rejects};
use coa_schemas::shard::ShardArgs;
use coa_schemas::stage::{IoArgs, Stage};
use coa_schemas::tables::{MAS_RUNS, TRAJECTORIES};

/// The flags of `coa-extract`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExtractArgs {
    /// Write malformed runs here (mas_runs rows + `reject_reason`) instead of failing.
    #[arg(long, value_name = "FILE")]
    pub skip_bad: Option<PathBuf>,
    #[command(flatten)]
    pub shard: ShardArgs,
    #[command(flatten)]
    pub io: IoArgs,
}

/// `coa-extract`: `mas_runs` → `trajectories`.
pub fn run(stage: &mut Stage, args: &ExtractArgs) -> Result<()> {
    let [out, stats] = args.io.outputs();
    stage.outputs(&[out, stats, ("--skip-bad", args.skip_bad.as_deref())])?;
    let (io, skip_bad, shard) = (&args.io, args.skip_bad.as_deref(), args.shard.shard);
    // Extraction never reads what each agent re-read (`events.input_messages`, most of a run's
    // bytes): skip it, unless rejected rows must be written whole.
    let reader = match skip_bad {
        None => stage.open_without(io.input.as_deref(), &MAS_RUNS, &["events.input_messages"])?,
        Some(_) => stage.open(io.input.as_deref(), &MAS_RUNS)?,
    };
    let mut reader = stage.shard(reader, shard)?;
    let mut rejects = Rejects::new(stage, skip_bad, &reader.schema())?;
    let mut out: Option<BackgroundWriter> = None;
    let bar = stage.progress(None, "extracting");
    let (mut rows_in, mut format_errors, mut steps) = (0u64, 0u64, 0u64);
    loop {
        let group = next_group(&mut reader)?;
        if group.is_empty() {
            break;
        }
        let n: u64 = group.iter().map(|b| b.num_rows() as u64).sum();
        let ex = linearize::extract_group(&group, rows_in, skip_bad.is_some()).with_context(|| reader.source().to_string())?;
        let w = match &mut out {
            Some(w) => w,
            None => out.insert(BackgroundWriter::new(stage.create(io.output.as_deref(), io.format, &TRAJECTORIES.schema())?)?),
        };
        for b in ex.batches {
            w.write(b)?;
        }
        rejects.write(&group, &ex.rejected)?;
        rows_in += n;
        format_errors += ex.format_errors;
        steps += ex.steps;
        bar.inc(n);
    }
    bar.finish_and_clear();
    let rows_out = match out {
        Some(w) => w.finish()?,
        None => stage.create(io.output.as_deref(), io.format, &TRAJECTORIES.schema())?.finish()?,
    };
    rejects.finish(stage)?;
    stage.add_rows_in(rows_in);
    stage.add_rows_out(rows_out);
    stage.note("steps", steps);
    stage.note("format_errors", format_errors);
    Ok(())
}
