//! A stage's file outputs are all-or-none: each waits under its temporary name until the stage
//! body succeeded, then all are renamed into place; a failing body leaves none of them (and
//! none of the directories made for them). One test per process, because the deferral is
//! process-wide.

use std::path::Path;
use std::process::ExitCode;

use coa_schemas::rows::{self, Task};
use coa_schemas::stage::{self, Stage};
use coa_schemas::tables::TASKS;

fn write_outputs(stage: &mut Stage, dir: &Path) -> anyhow::Result<()> {
    let batch = rows::to_batch(&[Task { task_id: "t0".into(), suite: "math".into(), question: "1+1?".into(), ..Default::default() }])?;
    let mut w = stage.create(Some(&dir.join("tables/a.parquet")), None, &TASKS.schema())?;
    w.write(&batch)?;
    w.finish()?;
    stage::write_atomically(&dir.join("report.md"), b"report\n")?;
    // Finished, yet nothing is in place while the stage runs.
    assert!(!dir.join("tables/a.parquet").exists() && !dir.join("report.md").exists());
    Ok(())
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn outputs_are_committed_together_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A body that fails after finishing both outputs: neither appears, no temporary file, no
    // directory made for them.
    let mut stage = Stage::new("test", "0");
    let code = stage::run(&mut stage, |s| {
        write_outputs(s, d)?;
        anyhow::bail!("a late failure")
    });
    assert_eq!(code, ExitCode::FAILURE);
    assert_eq!(names(d), Vec::<String>::new());

    // The same body succeeding: both are in place, nothing else.
    let mut stage = Stage::new("test", "0");
    stage.set_stats_path(Some(d.join("stats.json")));
    let code = stage::run(&mut stage, |s| write_outputs(s, d));
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(names(d), ["report.md", "stats.json", "tables"]);
    assert_eq!(names(&d.join("tables")), ["a.parquet"]);
    assert_eq!(std::fs::read(d.join("report.md")).unwrap(), b"report\n");
}
