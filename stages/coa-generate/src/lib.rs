//! `coa-generate`: the stage that makes data from nothing but flags and files; the binary parses
//! flags and calls [`tasks::run`], [`mas::run`] or [`policy::run`].
//!
//! - [`tasks`] synthesizes an offline task suite (with its document corpus for multihop) or
//!   imports a real task file, and writes the `tasks` table.
//! - [`mas`] runs the teacher multi-agent system (`coa-agents`) on a `tasks` table and writes
//!   `mas_runs`.
//! - [`policy`] samples a checkpoint G times per task with real tool calls (the rollout engine)
//!   and writes `rollouts`.

pub mod mas;
pub mod policy;
pub mod tasks;

use std::path::Path;

use anyhow::{bail, Context, Result};
use coa_agents::ToolConfig;
use coa_schemas::rows::{self, Task};
use coa_schemas::stage::Stage;
use coa_schemas::shard::ShardSpec;
use coa_schemas::tables::{CORPUS, TASKS};
use coa_tools::flags::ToolFlags;
use coa_tools::Corpus;

/// Whether `task` searches the web, so that its run needs a `--corpus` (every suite but math and
/// code, including ones this build does not know).
pub fn searches_the_web(task: &Task) -> bool {
    coa_schemas::suite::Suite::parse(&task.suite).is_none_or(|s| s.uses_web())
}

/// Reads the `tasks` table (stdin or `-i`; this shard's rows with `--shard`) whole, counting its
/// rows in: a few thousand rows, and each run then holds its own messages (mas and policy share it).
/// Returns the input's name for error messages with the tasks.
pub fn read_tasks(stage: &mut Stage, input: Option<&Path>, shard: Option<ShardSpec>) -> Result<(String, Vec<Task>)> {
    let reader = stage.open(input, &TASKS)?;
    let reader = stage.shard(reader, shard)?;
    let source = reader.source().to_string();
    let mut tasks: Vec<Task> = Vec::new();
    for batch in reader {
        tasks.extend(rows::from_batch::<Task>(&batch?).with_context(|| format!("{source}: reading tasks"))?);
    }
    stage.add_rows_in(tasks.len() as u64);
    Ok((source, tasks))
}

/// Reads the `corpus` table of `--corpus FILE` into a searchable corpus (mas and policy share it).
pub fn read_corpus(stage: &mut Stage, path: &Path) -> Result<Corpus> {
    let reader = stage.open(Some(path), &CORPUS)?;
    let mut pages: Vec<rows::CorpusPage> = Vec::new();
    for batch in reader {
        pages.extend(rows::from_batch::<rows::CorpusPage>(&batch?).with_context(|| format!("{}: reading corpus pages", path.display()))?);
    }
    Corpus::new(pages).with_context(|| format!("--corpus {}", path.display()))
}

/// The corpus of `--corpus FILE`, which is required when any of `tasks` searches the web.
pub fn corpus_for<'t>(stage: &mut Stage, path: Option<&Path>, tasks: impl IntoIterator<Item = &'t Task>) -> Result<Option<Corpus>> {
    let web: Vec<&Task> = tasks.into_iter().filter(|t| searches_the_web(t)).collect();
    match path {
        Some(path) => Ok(Some(read_corpus(stage, path)?)),
        None if !web.is_empty() => bail!(
            "--corpus FILE is required: {} task(s) search the web (suite {}, first: task {}); pass the corpus written by `coa-generate tasks --corpus-out`",
            web.len(),
            web[0].suite,
            web[0].task_id
        ),
        None => Ok(None),
    }
}

/// The tools' settings from `--search-k`, `--crawl-chars` and `--code-timeout`.
pub fn tool_config(flags: &ToolFlags) -> ToolConfig {
    ToolConfig { search_k: flags.search_k, crawl_chars: flags.crawl_chars, limits: flags.code.limits() }
}

/// Flag parser: a whole number of at least 1.
fn positive(s: &str) -> Result<usize, String> {
    coa_schemas::flags::at_least_one(s)
}
