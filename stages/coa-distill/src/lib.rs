//! Distillation logic behind the `coa-extract` and `coa-convert` binaries (see
//! docs/ARCHITECTURE.md, "Teacher and distillation"), on Arrow arrays directly (no per-row
//! serde), in parallel over fixed-size work units with rayon.
//!
//! - [`extract`]: `mas_runs` → `trajectories` (teacher events → ordered CoA steps).
//! - [`convert`]: `trajectories` → `coa_text`, alpaca / sharegpt JSON (LLaMA-Factory).
//! - [`verl`]: the verl RL layout (from trajectories or straight from tasks).
//! - [`stages`]: the stage bodies the binaries run.
//! - [`util`]: work units, reject tables (`--skip-bad`), atomic streaming files.
//!
//! The CoA grammar itself (tags, parser, validator, renderer, prompts) is `coa_format`.

pub mod convert;
pub mod extract;
pub mod stages;
pub mod util;
pub mod verl;

pub use convert::Target;
