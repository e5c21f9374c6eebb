//! The data contract of the Chain-of-Agents pipeline and the one IO layer every stage uses.
//!
//! - [`tables`]: the Arrow schema of every stage boundary, defined once.
//! - [`rows`]: typed rows for tables built row by row (tasks, corpus).
//! - [`io`]: reading (stdin or file; IPC stream, IPC file or Parquet, sniffed) and writing
//!   (IPC stream to pipes, Parquet for `.parquet`, temp name + rename), with provenance.
//! - [`output`]: output paths checked before the work, temporary files, all-or-none commits.
//! - [`cleanup`]: what is undone on SIGTERM/SIGINT/SIGHUP (temporary files, sandboxed code).
//! - [`flags`]: argument parsing with clear messages for bad numbers (negative, zero, NaN).
//! - [`parallel`]: a table read group by group, each group processed in parallel (work units,
//!   column access, `--skip-bad` reject tables, a background writer).
//! - [`shard`]: `--shard I/N`, the stable task hash behind it, and the merge of shard outputs.
//! - [`stage`]: the shared command-line harness: common flags, summary line, broken pipes.

pub mod cleanup;
pub mod flags;
pub mod io;
pub mod output;
pub mod parallel;
pub mod reasons;
pub mod rng;
pub mod rows;
pub mod shard;
pub mod stage;
pub mod suite;
pub mod tables;
pub mod text;
