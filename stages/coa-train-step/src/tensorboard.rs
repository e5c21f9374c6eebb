//! `--tensorboard DIR`: every optimizer step's metrics as TensorBoard scalars, in an event file
//! (`events.out.tfevents.<time>.<host>`) that `tensorboard --logdir` reads while the run goes on.
//!
//! The file format (TFRecord framing of `Event` protobufs with `Summary` scalars) is written by
//! the `syntaxdot-summary` crate. An invocation opens a new file; the files of earlier
//! invocations in DIR are kept, so a resumed run continues the same curves. A run killed after
//! its last checkpoint has written steps that the resume will redo: those events are cut from
//! the earlier files first (and a fresh run cuts all earlier steps), so no step appears twice.
//! Like checkpoints, event files are written as the run goes, not renamed into place at the end.

use std::fs::{File, OpenOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use prost::Message;
use syntaxdot_summary::SummaryWriter;

use crate::step::StepReport;

/// The scalars of one step, as (tag, value): the same quantities as the `metrics` row.
pub fn scalars(r: &StepReport) -> Vec<(&'static str, f64)> {
    let mut v = vec![
        ("train/loss", r.loss),
        ("train/lr", r.lr),
        ("train/grad_norm", r.grad_norm),
        ("train/tokens_per_s", r.tokens as f64 / r.seconds.max(1e-9)),
        ("train/targets", r.targets as f64),
    ];
    if let Some(rl) = &r.rl {
        v.extend([
            ("dapo/reward_mean", rl.reward_mean),
            ("dapo/clip_frac", rl.clip_frac),
            ("dapo/entropy", rl.entropy),
            ("dapo/response_len", rl.response_len),
            ("dapo/logprob_mismatch", rl.logprob_mismatch),
            ("dapo/kl", rl.kl),
        ]);
    }
    v
}

/// The open event file of this invocation.
pub struct Board {
    writer: SummaryWriter<BufWriter<File>>,
    dir: PathBuf,
}

/// Fails at once when DIR cannot be a log directory (a file, or under one), before any work.
pub fn check_dir(dir: &Path) -> Result<()> {
    if dir.as_os_str().is_empty() {
        bail!("--tensorboard: give a directory");
    }
    if dir.exists() && !dir.is_dir() {
        bail!("--tensorboard {}: is a file, expected a directory (created if missing)", dir.display());
    }
    Ok(())
}

impl Board {
    /// Opens a new event file in `dir` (created if missing) for a run whose next step is
    /// `after_step + 1`; steps past `after_step` in the directory's earlier files are cut.
    pub fn open(dir: &Path, after_step: u64) -> Result<Board> {
        check_dir(dir)?;
        std::fs::create_dir_all(dir).with_context(|| format!("--tensorboard {}: creating the directory", dir.display()))?;
        for path in event_files(dir)? {
            let cut = cut_after(&path, after_step)?;
            if cut > 0 {
                eprintln!("coa-train-step: --tensorboard: {cut} events past step {after_step} cut from {} (this run writes those steps)", path.display());
            }
        }
        let writer = SummaryWriter::from_prefix(dir.join("events")).with_context(|| format!("--tensorboard {}: creating an event file", dir.display()))?;
        Ok(Board { writer, dir: dir.to_path_buf() })
    }

    /// Appends one step's scalars (flushed: TensorBoard sees them at once).
    pub fn write_step(&mut self, r: &StepReport) -> Result<()> {
        for (tag, value) in scalars(r) {
            self.writer.write_scalar(tag, r.step as i64, value as f32).with_context(|| format!("--tensorboard {}: writing step {}", self.dir.display(), r.step))?;
        }
        Ok(())
    }
}

/// The event files in `dir`, by name (TensorBoard's order: the name carries the creation time).
pub fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("--tensorboard {}: listing", dir.display()))? {
        let path = entry?.path();
        if path.is_file() && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains(".tfevents.")) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The field of an `Event` this module reads back (prost skips the others).
#[derive(Clone, PartialEq, Message)]
struct EventStep {
    #[prost(int64, tag = "2")]
    step: i64,
}

/// The steps of the records of an event file, in order, with each record's byte offset; stops
/// at a torn record (a run killed mid-write) and reports where the readable part ends.
pub fn record_steps(bytes: &[u8]) -> (Vec<(usize, i64)>, usize) {
    let mut out = Vec::new();
    let mut at = 0usize;
    // A record: u64 length, u32 masked CRC of the length, the data, u32 masked CRC of the data.
    while at + 12 <= bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8])) as usize;
        let end = match at.checked_add(12).and_then(|x| x.checked_add(len)).and_then(|x| x.checked_add(4)) {
            Some(end) if end <= bytes.len() => end,
            _ => break,
        };
        match EventStep::decode(&bytes[at + 12..end - 4]) {
            Ok(e) => out.push((at, e.step)),
            Err(_) => break,
        }
        at = end;
    }
    (out, at)
}

/// Cuts the records of `path` from the first with a step past `after_step` (and a torn tail);
/// removes the file when only its header (step 0) would remain. Returns the records cut.
fn cut_after(path: &Path, after_step: u64) -> Result<usize> {
    let bytes = std::fs::read(path).with_context(|| format!("--tensorboard: reading {}", path.display()))?;
    let (records, readable) = record_steps(&bytes);
    let first_past = records.iter().position(|&(_, step)| step > after_step as i64);
    let keep_bytes = first_past.map_or(readable, |i| records[i].0);
    let kept = &records[..first_past.unwrap_or(records.len())];
    let cut = records.len() - kept.len();
    if kept.iter().all(|&(_, step)| step == 0) && cut > 0 {
        std::fs::remove_file(path).with_context(|| format!("--tensorboard: removing {}", path.display()))?;
    } else if keep_bytes < bytes.len() {
        let f = OpenOptions::new().write(true).open(path).with_context(|| format!("--tensorboard: opening {}", path.display()))?;
        f.set_len(keep_bytes as u64).with_context(|| format!("--tensorboard: truncating {}", path.display()))?;
    }
    Ok(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(step: u64) -> StepReport {
        StepReport { step, loss: 5.0 / step as f64, lr: 1e-3, grad_norm: 1.5, targets: 100, tokens: 200, rows: 4, seconds: 0.5, rl: None }
    }

    fn steps_on_disk(dir: &Path) -> Vec<Vec<i64>> {
        event_files(dir).unwrap().iter().map(|p| record_steps(&std::fs::read(p).unwrap()).0.into_iter().map(|(_, s)| s).collect()).collect()
    }

    #[test]
    fn a_resume_continues_in_a_new_file_and_cuts_the_redone_steps() {
        let dir = tempfile::tempdir().unwrap();
        let tb = dir.path().join("tb");
        let mut b = Board::open(&tb, 0).unwrap();
        for s in 1..=5 {
            b.write_step(&report(s)).unwrap();
        }
        drop(b);
        let per_step = scalars(&report(1)).len();
        let mut rl = report(1);
        rl.rl = Some(crate::step::RlStep { reward_mean: -1.5, clip_frac: 0.01, entropy: 1.6, response_len: 700.0, logprob_mismatch: 0.0, kl: 0.0 });
        let tags: Vec<&str> = scalars(&rl).into_iter().map(|(t, _)| t).collect();
        assert!(["train/loss", "dapo/reward_mean", "dapo/clip_frac", "dapo/entropy", "dapo/response_len"].iter().all(|t| tags.contains(t)), "{tags:?}");
        assert_eq!(steps_on_disk(&tb), vec![std::iter::once(0).chain((1..=5).flat_map(|s| vec![s; per_step])).collect::<Vec<i64>>()]);
        // Killed after step 5, resumed from the checkpoint at step 3: steps 4 and 5 are redone.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut b = Board::open(&tb, 3).unwrap();
        for s in 4..=6 {
            b.write_step(&report(s)).unwrap();
        }
        drop(b);
        let files = steps_on_disk(&tb);
        assert_eq!(files.len(), 2);
        assert_eq!(*files[0].last().unwrap(), 3, "the first file ends at the checkpoint");
        let all: Vec<i64> = files.concat().into_iter().filter(|&s| s > 0).collect();
        let mut distinct = all.clone();
        distinct.dedup();
        assert_eq!(distinct, (1..=6).collect::<Vec<_>>());
        assert_eq!(all.len(), 6 * per_step, "every step once");
        // A fresh run into the same directory starts the curves over: earlier files are removed.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut b = Board::open(&tb, 0).unwrap();
        b.write_step(&report(1)).unwrap();
        drop(b);
        let files = steps_on_disk(&tb);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].iter().filter(|&&s| s == 1).count(), per_step);
    }

    #[test]
    fn a_torn_tail_is_cut_and_a_file_is_refused_as_logdir() {
        let dir = tempfile::tempdir().unwrap();
        let tb = dir.path().join("tb");
        let mut b = Board::open(&tb, 0).unwrap();
        b.write_step(&report(1)).unwrap();
        drop(b);
        let file = event_files(&tb).unwrap().remove(0);
        let mut bytes = std::fs::read(&file).unwrap();
        let whole = bytes.len();
        bytes.extend_from_slice(&[40, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]);
        std::fs::write(&file, &bytes).unwrap();
        Board::open(&tb, 1).unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().len() as usize, whole);
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();
        let err = Board::open(&f, 0).err().unwrap().to_string();
        assert!(err.contains("is a file, expected a directory"), "{err}");
    }
}
