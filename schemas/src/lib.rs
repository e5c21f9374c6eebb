//! The data contract of the Chain-of-Agents pipeline and the one IO layer every stage uses.
//!
//! - [`tables`]: the Arrow schema of every stage boundary, defined once.
//! - [`rows`]: typed rows for tables built row by row (tasks, corpus).
//! - [`io`]: reading (stdin or file; IPC stream, IPC file or Parquet, sniffed) and writing
//!   (IPC stream to pipes, Parquet for `.parquet`, temp name + rename), with provenance.
//! - [`stage`]: the shared command-line harness: common flags, summary line, broken pipes.

pub mod io;
pub mod rows;
pub mod stage;
pub mod tables;
