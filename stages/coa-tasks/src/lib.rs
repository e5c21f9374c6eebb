//! Offline verifiable task suites and importers for real task files.
//!
//! - [`synth`]: the synthetic suites (`multihop` world + corpus, `math`, `code`), generated from a
//!   seed with disjoint train/test name and number spaces. Entry point: [`generate`].

pub mod external;
pub mod import;
pub mod synth;

pub use synth::code::CodeSolution;
pub use synth::math::MathSolution;
pub use synth::multihop::{Hop, MultihopSolution};
pub use synth::{generate, parse_synthesised, Generated, Split, Suite};
