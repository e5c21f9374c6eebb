//! The Chain-of-Agents tag grammar (docs/ARCHITECTURE.md, "The CoA format"), defined once. Every
//! stage that reads or writes CoA text uses this crate: `coa-extract` parses teacher outputs,
//! `coa-convert` renders trajectories and prompts, `coa-score` validates rollouts, `coa-agents`
//! routes by the transition tables (`coa-filter` reads the `format_ok` that `coa-extract` wrote).
//!
//! - [`tag`]: the [`Tag`]s (think, plan, reflection, suggested_answer, double_check, web_search /
//!   wiki_search, crawl_page, code, observation, answer) and the tool names.
//! - [`parse`]: text → [`Segment`]s `(tag, content, byte range, char span)` with positioned
//!   [`ParseError`]s (unclosed, stray closing, unknown, nested tags, text outside tags), and
//!   [`find_block`] / [`find_last_block`], the plain text search lenient readers fall back to.
//! - [`grammar`]: the ordering state machine as explicit transition tables, [`validate`] for steps
//!   (ordering + score/grade rules), [`validate_text`] for raw text.
//! - [`grade`]: reflection grades and double_check scores.
//! - [`render`]: steps → text with observation spans in character offsets.
//! - [`retract`]: the steps a trajectory's own reflection retracts (kept out of the SFT loss on request).
//! - [`prompt`]: the AFM-style instruction per suite.

pub mod grade;
pub mod grammar;
pub mod parse;
pub mod prompt;
pub mod render;
pub mod retract;
pub mod tag;

pub use grade::{
    parse_double_check, parse_reflection, Grade, GradeError, ReflectionGrades, REFLECTION_CRITERIA,
};
pub use grammar::{
    next_actions, steps_from_text, think_rule, validate, validate_tags, validate_text, Flavor,
    Machine, Step, TextError, ThinkRule, Violation, ViolationKind, CODE_TRANSITIONS,
    WEB_TRANSITIONS,
};
pub use parse::{
    char_len, code_source, find_block, find_last_block, parse, parse_into, ParseError,
    ParseErrorKind, Segment, Span,
};
pub use prompt::{build_plain_prompt, build_prompt, instruction, plain_instruction, split_prompt, write_prompt};
pub use render::{check_observations, check_steps, render, render_to, RenderError, RenderProblem, Rendered};
pub use retract::retracted_steps;
pub use tag::{is_known_tool, list_tags, Tag, TagKind, TOOL_NAMES};
