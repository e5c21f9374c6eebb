//! The LLM each agent thinks with, behind one trait.
//!
//! A [`Backend`] is shared by every run of a stage; [`Backend::start`] opens a [`Mind`] for one
//! task, and every activation of every agent of that run (manager included) asks that mind for
//! its reply through [`Mind::reply`]. A [`Turn`] carries both what a language model sees (the
//! agent's chat messages) and the structured state of the run (task, steps, allowed actions):
//! the `openai` backend sends only the messages; the `scripted` expert reads the structured state
//! instead of parsing its own prompts.

pub mod openai;
pub mod scripted;

use anyhow::Result;
use coa_format::Flavor;
use coa_schemas::rows::Task;

use crate::action::{Action, AgentRole, Step};
use crate::event::ChatMessage;

/// One activation request.
#[derive(Debug, Clone, Copy)]
pub struct Turn<'a> {
    pub task: &'a Task,
    pub flavor: Flavor,
    pub agent: AgentRole,
    /// The action the manager asked for (`None` when the manager itself is asked to route).
    pub action: Option<Action>,
    /// The actions the grammar allows now.
    pub allowed: &'a [Action],
    /// What the agent reads: its history plus the new message.
    pub messages: &'a [ChatMessage],
    /// The run's accepted steps so far.
    pub steps: &'a [Step],
}

/// A mind's reply to one turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub text: String,
    /// Prompt and completion tokens as the backend counted them (`None`: estimate them).
    pub usage: Option<(i64, i64)>,
    /// Time the reply took: measured (openai; the original time for a cached reply) or
    /// simulated (scripted).
    pub latency_ms: f64,
}

/// An LLM backend (see the module docs).
pub trait Backend: Sync {
    /// The `backend` column: `scripted` or `openai:<model>`.
    fn label(&self) -> String;
    /// Whether runs are simulated (the `simulator` column).
    fn simulator(&self) -> bool;
    /// Whether this backend can run `task` (the scripted expert needs a solution path); the
    /// error says why not.
    fn check_task(&self, task: &Task) -> Result<()>;
    /// A mind for one run of `task`.
    fn start<'a>(&'a self, task: &'a Task) -> Result<Box<dyn Mind + 'a>>;
    /// The latency to record for a tool call that took `measured_ms` of wall-clock time.
    fn tool_latency_ms(&self, action: Action, input: &str, measured_ms: f64) -> f64;
}

/// The per-run state of a backend.
pub trait Mind {
    fn reply(&mut self, turn: &Turn<'_>) -> Result<Reply>;
}
