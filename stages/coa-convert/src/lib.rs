//! `coa-convert`: Chain-of-Agents trajectories → CoA text (`coa_text`), or exports for
//! LLaMA-Factory (alpaca JSON for AFM's fork, sharegpt JSON upstream) and verl (RL Parquet, also
//! straight from a tasks table) (docs/ARCHITECTURE.md, "Teacher and distillation").
//!
//! - [`render`]: `trajectories` → `coa_text` (prompt, text, observation spans), alpaca and
//!   sharegpt JSON records, on Arrow arrays in parallel work units.
//! - [`verl`]: the verl RL layout (`data_source`, `prompt`, `reward_model`, `extra_info`).
//! - [`run`]: the stage the binary calls: read group by group, convert each group in parallel,
//!   write in input order. The main output is created once the first group converted cleanly, so
//!   a bad first row leaves no output at all.

pub mod render;
pub mod verl;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use coa_schemas::io::{Format, TableReader};
use coa_schemas::output::AtomicFile;
use coa_schemas::parallel::{next_group, BackgroundWriter, Rejects};
use coa_schemas::rows::{self, Task};
use coa_schemas::shard::{ShardArgs, ShardSpec};
use coa_schemas::stage::{IoArgs, Stage};
use coa_schemas::tables::{COA_TEXT, TASKS, TRAJECTORIES};

pub use render::Target;
use render::ConvertOptions;

/// `--to`: what to write.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum To {
    /// The `coa_text` table (task_id, suite, prompt, text, observation_spans): what coa-tokenize reads.
    CoaText,
    /// AFM's LLaMA-Factory fork (--ignore_observation true): a JSON array of {instruction, input, output}, one
    /// trajectory per record, a blank line around every observation block; dataset_info.json beside it.
    AlpacaJson,
    /// Upstream LLaMA-Factory: a JSON array of {conversations: [human, gpt, observation, gpt, ...]}, tool results as
    /// observation turns (masked by LLaMA-Factory); dataset_info.json beside it.
    Sharegpt,
    /// verl RL Parquet in AFM's layout (data_source, prompt, ability, reward_model, extra_info with tools_kwargs),
    /// from trajectories (kept runs) or from a tasks table (every task).
    Verl,
}

impl To {
    fn target(self) -> Target {
        match self {
            To::CoaText => Target::CoaText,
            To::AlpacaJson => Target::AlpacaJson,
            To::Sharegpt => Target::ShareGpt,
            To::Verl => Target::Verl,
        }
    }
}

/// The flags of `coa-convert`.
#[derive(clap::Args, Debug, Clone)]
pub struct ConvertArgs {
    /// What to write.
    #[arg(long, value_enum, default_value = "coa-text")]
    pub to: To,
    /// Write bad trajectories here (trajectories rows + `reject_reason`) instead of failing.
    #[arg(long, value_name = "FILE")]
    pub skip_bad: Option<PathBuf>,
    /// The tasks table, for --to verl: code tasks' ground truth is their test spec, read from here,
    /// and each row keeps its task's data source and index (without it: our suites' names).
    #[arg(long, value_name = "FILE")]
    pub tasks: Option<PathBuf>,
    /// extra_info.split of the verl rows.
    #[arg(long, default_value = "train")]
    pub split: String,
    #[command(flatten)]
    pub shard: ShardArgs,
    #[command(flatten)]
    pub io: IoArgs,
}

/// The flags as the conversion uses them.
struct Settings<'a> {
    target: Target,
    skip_bad: Option<&'a Path>,
    /// The tasks table (code test specs for verl ground truths).
    tasks: Option<&'a Path>,
    /// `extra_info.split` of verl rows.
    split: &'a str,
    /// Only this shard of the input (`--shard I/N`).
    shard: Option<ShardSpec>,
}

/// The `dataset_info.json` entry LLaMA-Factory needs for a JSON export named `file_name`.
fn dataset_info_entry(target: Target, file_name: &str) -> serde_json::Value {
    match target {
        Target::ShareGpt => serde_json::json!({
            "file_name": file_name,
            "formatting": "sharegpt",
            "columns": {"messages": "conversations"},
            "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt", "observation_tag": "observation"}
        }),
        _ => serde_json::json!({
            "file_name": file_name,
            "columns": {"prompt": "instruction", "query": "input", "response": "output"}
        }),
    }
}

/// `dataset_info.json` beside a JSON export, with the export's entry added (an existing file keeps
/// its other entries). Returns the path and the whole new content; the file is written by the
/// caller once the export is complete.
fn dataset_info(target: Target, out: &Path) -> Result<(std::path::PathBuf, Vec<u8>)> {
    let file_name = out.file_name().and_then(|n| n.to_str()).ok_or_else(|| anyhow::anyhow!("-o {}: not a file name", out.display()))?;
    let entry_name = file_name.split('.').next().unwrap_or(file_name).to_string();
    let path = out.with_file_name("dataset_info.json");
    let mut info = match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) => bail!("{}: expected a JSON object of datasets (LLaMA-Factory's dataset_info.json)", path.display()),
            Err(e) => bail!("{}: not valid JSON ({e}); expected LLaMA-Factory's dataset_info.json", path.display()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Map::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    info.insert(entry_name, dataset_info_entry(target, file_name));
    let mut bytes = serde_json::to_vec_pretty(&serde_json::Value::Object(info))?;
    bytes.push(b'\n');
    Ok((path, bytes))
}

/// A JSON array of records (alpaca or sharegpt), streamed to a file (temp name + rename) or stdout.
#[derive(Default)]
struct JsonOut {
    file: Option<AtomicFile>,
    stdout: Option<std::io::BufWriter<std::io::Stdout>>,
    records: bool,
}

impl JsonOut {
    fn open(&mut self, path: Option<&Path>) -> Result<()> {
        match path {
            Some(p) => self.file = Some(AtomicFile::create(p)?),
            None => self.stdout = Some(std::io::BufWriter::with_capacity(1 << 20, std::io::stdout())),
        }
        self.write(b"[\n")
    }

    fn is_open(&self) -> bool {
        self.file.is_some() || self.stdout.is_some()
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        match (&mut self.file, &mut self.stdout) {
            (Some(f), _) => f.write_all(bytes),
            (None, Some(s)) => Ok(s.write_all(bytes)?),
            (None, None) => bail!("internal: JSON output not open"),
        }
    }

    /// Appends `,\n`-separated records.
    fn records(&mut self, chunk: &[u8]) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        if self.records {
            self.write(b",\n")?;
        }
        self.records = true;
        self.write(chunk)
    }

    fn finish(mut self) -> Result<()> {
        self.write(if self.records { b"\n]\n" } else { b"]\n" })?;
        if let Some(f) = self.file.take() {
            f.finish()?;
        } else if let Some(mut s) = self.stdout.take() {
            s.flush()?;
        }
        Ok(())
    }
}

/// `coa-convert`: `trajectories` → `coa_text`, alpaca or sharegpt JSON, or verl Parquet (also
/// straight from a `tasks` table).
pub fn run(stage: &mut Stage, cli: &ConvertArgs) -> Result<()> {
    let [out, stats] = cli.io.outputs();
    stage.outputs(&[out, stats, ("--skip-bad", cli.skip_bad.as_deref())])?;
    let args = &Settings {
        target: cli.to.target(),
        skip_bad: cli.skip_bad.as_deref(),
        tasks: cli.tasks.as_deref(),
        split: &cli.split,
        shard: cli.shard.shard,
    };
    let io = &cli.io;
    if let (Some(spec), true) = (args.shard, args.target != Target::CoaText) {
        // JSON is one file, and verl rows carry no task_id to merge shards by.
        bail!(
            "--shard {spec}: --to {} writes the whole dataset in one file; convert the merged trajectories \
             unsharded (only --to coa-text shards, merged with `coa-filter --rules none --task-order`)",
            target_name(args.target)
        );
    }
    let format = match (args.target, io.format) {
        (Target::CoaText, f) => f,
        (Target::Verl, None | Some(Format::Parquet)) => Some(Format::Parquet),
        (Target::Verl, Some(f)) => bail!("--to verl writes Parquet; --format {f:?} does not apply"),
        (_, None) => None,
        (_, Some(_)) => bail!("--to {} writes JSON; --format does not apply", target_name(args.target)),
    };
    if args.tasks.is_some() && args.target != Target::Verl {
        bail!("--tasks is only used by --to verl (the tasks' sources and code test specs)");
    }
    let out_path = io.output.as_deref().filter(|p| *p != Path::new("-"));
    // LLaMA-Factory's dataset_info.json, checked before anything is written.
    // (none beside a device such as /dev/null)
    let info = match (args.target.is_json(), out_path) {
        (true, Some(p)) if std::fs::metadata(p).map_or(true, |m| m.is_file()) => Some(dataset_info(args.target, p)?),
        _ => None,
    };
    let tasks = match args.tasks {
        Some(path) => {
            let mut tasks = HashMap::new();
            for batch in stage.open(Some(path), &TASKS)? {
                for t in rows::from_batch::<Task>(&batch?).with_context(|| format!("--tasks {}", path.display()))? {
                    tasks.insert(t.task_id.clone(), verl::VerlTask::from_task(&t));
                }
            }
            stage.note("code_specs", tasks.values().filter(|t| t.code_spec.is_some()).count());
            Some(Arc::new(tasks))
        }
        None => None,
    };
    let opts = ConvertOptions { target: args.target, skip_bad: args.skip_bad.is_some(), tasks };
    let mut reader = if args.target == Target::Verl {
        // verl rows come from trajectories or, for every task, straight from a tasks table.
        let reader = stage.open_any(io.input.as_deref())?;
        let reader = stage.shard(reader, args.shard)?;
        let is_tasks = match reader.table_name().as_deref() {
            Some("tasks") => true,
            Some("trajectories") => false,
            Some(other) => bail!("{}: input holds the `{other}` table; --to verl reads `trajectories` (kept runs) or `tasks` (every task)", reader.source()),
            None => TASKS.columns.iter().all(|c| reader.schema().index_of(c.name).is_ok()),
        };
        if is_tasks {
            return verl_from_tasks(stage, reader, out_path, args);
        }
        reader
    } else {
        let reader = stage.open(io.input.as_deref(), &TRAJECTORIES)?;
        stage.shard(reader, args.shard)?
    };
    let mut rejects = Rejects::new(stage, args.skip_bad, &reader.schema())?;
    let mut table: Option<BackgroundWriter> = None;
    let mut json = JsonOut::default();
    let table_schema = match args.target {
        Target::Verl => verl::verl_schema(),
        _ => COA_TEXT.schema(),
    };
    let bar = stage.progress(None, "converting");
    let (mut rows_in, mut rows_out, mut spans) = (0u64, 0u64, 0u64);
    loop {
        let group = next_group(&mut reader)?;
        let last = group.is_empty();
        let (units, outs) = if last {
            (Vec::new(), Vec::new())
        } else {
            render::convert_group(&group, rows_in, &opts).with_context(|| reader.source().to_string())?
        };
        // Open the output once the first group converted cleanly (or at the end of an empty input).
        if args.target.is_json() {
            if !json.is_open() {
                json.open(out_path)?;
            }
        } else if table.is_none() {
            table = Some(BackgroundWriter::new(stage.create(out_path, format, &table_schema)?)?);
        }
        for o in &outs {
            match (&mut table, args.target) {
                (_, Target::AlpacaJson | Target::ShareGpt) => json.records(&o.json)?,
                (Some(w), Target::Verl) => w.write(verl::verl_batch(&o.verl, rows_out as i64, args.split)?)?,
                (Some(w), _) => w.write(o.coa.clone())?,
                (None, _) => bail!("internal: output not open"),
            }
            rows_out += o.coa.num_rows() as u64;
            spans += o.spans;
        }
        if last {
            break;
        }
        let mut rejected = vec![Vec::new(); group.len()];
        for (u, o) in units.iter().zip(outs) {
            rejected[u.batch].extend(o.rejected);
        }
        rejects.write(&group, &rejected)?;
        let n: u64 = group.iter().map(|b| b.num_rows() as u64).sum();
        rows_in += n;
        bar.inc(n);
    }
    bar.finish_and_clear();
    match table {
        Some(w) => {
            w.finish()?;
        }
        None => json.finish()?,
    }
    if let Some((path, bytes)) = info {
        let mut f = AtomicFile::create(&path)?;
        f.write_all(&bytes)?;
        f.finish()?;
        stage.note("dataset_info", path.display().to_string());
    }
    rejects.finish(stage)?;
    stage.add_rows_in(rows_in);
    stage.add_rows_out(rows_out);
    stage.note("to", target_name(args.target));
    stage.note("observation_spans", spans);
    Ok(())
}

fn target_name(t: Target) -> &'static str {
    match t {
        Target::CoaText => "coa-text",
        Target::AlpacaJson => "alpaca-json",
        Target::ShareGpt => "sharegpt",
        Target::Verl => "verl",
    }
}

/// `--to verl` from a `tasks` table: one RL row per task (tasks the teacher failed included).
fn verl_from_tasks(stage: &mut Stage, reader: TableReader, out_path: Option<&Path>, args: &Settings<'_>) -> Result<()> {
    let source = reader.source().to_string();
    let mut rejects = Rejects::new(stage, args.skip_bad, &reader.schema())?;
    let mut writer = stage.create(out_path, Some(Format::Parquet), &verl::verl_schema())?;
    let (mut rows_in, mut rows_out) = (0u64, 0u64);
    for batch in reader {
        let batch = batch?;
        let mut good = Vec::with_capacity(batch.num_rows());
        let mut bad = Vec::new();
        for (k, t) in rows::from_batch::<Task>(&batch).with_context(|| format!("{source}: reading tasks"))?.iter().enumerate() {
            let task = verl::VerlTask::from_task(t);
            match task.ground_truth() {
                Ok(_) => good.push(task),
                Err(why) if args.skip_bad.is_some() => bad.push((k as u32, why)),
                Err(why) => bail!("{source}: row {}, task `{}`: {why}", rows_in + k as u64, t.task_id),
            }
        }
        rejects.write(std::slice::from_ref(&batch), &[bad])?;
        writer.write(&verl::verl_batch(&good, rows_out as i64, args.split)?)?;
        rows_in += batch.num_rows() as u64;
        rows_out += good.len() as u64;
    }
    writer.finish()?;
    rejects.finish(stage)?;
    stage.add_rows_in(rows_in);
    stage.add_rows_out(rows_out);
    stage.note("to", "verl");
    stage.note("from", "tasks");
    Ok(())
}
