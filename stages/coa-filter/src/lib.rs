//! `coa-filter`: rule-based filtering of any table, with per-rule counts.
//!
//! - [`engine`]: the plan of named rules (CoA distillation rules, `--where`, dedup, DAPO dynamic
//!   sampling) and their progressive application with per-rule stats.
//! - [`sql`]: `--where` expressions, parsed and evaluated by polars' SQL front end.
//! - [`ffi`]: arrow-rs ↔ polars through the Arrow C Data Interface.
//! - [`hash`]: exact content keys of rows (dedup, groups).
//! - [`run`]: the stage body the binary runs (inputs, task order, outputs, summary).

pub mod engine;
pub mod ffi;
pub mod hash;
pub mod run;
pub mod sql;

pub use engine::{render_stats, BatchOutput, Filter, Options, RuleSet, RuleStats, DISTILL_RULES, DROP_REASON};
