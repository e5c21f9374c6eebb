//! Synthetic shard parts for measuring a merge: N tasks whose `question` holds B bytes, split
//! into P parts as `--shard I/P` would, each part in task order, plus the tasks table that gives
//! the order. (The merge's memory bound: docs/cluster.md.)
//!
//! usage: shard_parts OUT_DIR N P B   (writes OUT_DIR/tasks.parquet, OUT_DIR/parts/part-*.parquet)

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use coa_schemas::io::{self, Provenance};
use coa_schemas::rows::{self, Task};
use coa_schemas::shard::ShardSpec;
use coa_schemas::tables::TASKS;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, n, p, b] = &args[..] else { bail!("usage: shard_parts OUT_DIR N P B") };
    let (dir, n, p, b): (PathBuf, usize, u32, usize) = (dir.into(), n.parse().context("N")?, p.parse().context("P")?, b.parse().context("B")?);
    std::fs::create_dir_all(dir.join("parts"))?;
    let task = |k: usize, question: String| Task { task_id: format!("task-{k:07}"), suite: "qa".into(), question, ..Default::default() };
    let prov = Provenance::default();
    let ids: Vec<Task> = (0..n).map(|k| task(k, String::new())).collect();
    io::write_all(Some(&dir.join("tasks.parquet")), None, &TASKS.schema(), &[rows::to_batch(&ids)?], &prov)?;
    for i in 0..p {
        let mut writer = io::create(Some(&dir.join(format!("parts/part-{i:05}-of-{p:05}.parquet"))), None, &TASKS.schema(), &prov)?;
        let mine: Vec<usize> = (0..n).filter(|&k| ShardSpec::of(&ids[k].task_id, p) == i).collect();
        for chunk in mine.chunks(256) {
            let rows: Vec<Task> = chunk.iter().map(|&k| task(k, format!("{k:07} {}", "x".repeat(b)))).collect();
            writer.write(&rows::to_batch(&rows)?)?;
        }
        writer.finish()?;
    }
    Ok(())
}
