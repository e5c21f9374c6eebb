//! The mind: one intent per state, shared by the manager's routing and the agent's action.

use anyhow::Result;
use coa_format::ThinkRule;

use super::math_code::{CodeExpert, MathExpert};
use super::multihop::WebExpert;
use super::{SIM_BASE_MS, SIM_MS_PER_OUTPUT_TOKEN, SIM_MS_PER_PROMPT_TOKEN};
use crate::action::{render_output, Action, AgentRole, Step};
use crate::backend::{Mind, Reply, Turn};
use crate::prompts::manager_reply;
use crate::tokens::{estimate_messages, estimate_text};

/// What the expert wants to do next.
#[derive(Debug, Clone)]
pub(super) struct Intent {
    action: Action,
    think: String,
    body: String,
    /// The manager's one-line reason for routing to it.
    reason: String,
}

pub(super) enum Expert {
    Web(WebExpert),
    Math(MathExpert),
    Code(CodeExpert),
}

pub(super) struct ScriptedMind {
    pub(super) expert: Expert,
    /// The intent decided for the state with this many steps.
    pub(super) pending: Option<(usize, Intent)>,
}

impl ScriptedMind {
    fn intent(&mut self, steps: &[Step]) -> Result<Intent> {
        if let Some((at, intent)) = &self.pending {
            if *at == steps.len() {
                return Ok(intent.clone());
            }
        }
        let intent = match &mut self.expert {
            Expert::Web(e) => e.decide(steps)?,
            Expert::Math(e) => e.decide(steps)?,
            Expert::Code(e) => e.decide(steps)?,
        };
        self.pending = Some((steps.len(), intent.clone()));
        Ok(intent)
    }
}

impl Mind for ScriptedMind {
    fn reply(&mut self, turn: &Turn<'_>) -> Result<Reply> {
        let intent = self.intent(turn.steps)?;
        let text = if turn.agent == AgentRole::Manager {
            manager_reply(intent.action, &intent.reason)
        } else {
            // A think block only where the grammar has one before this action.
            let think = (intent.action.think_rule(turn.flavor) != ThinkRule::Forbidden).then_some(intent.think.as_str());
            render_output(think, intent.action, &intent.body)
        };
        let (tin, tout) = (estimate_messages(turn.messages), estimate_text(&text));
        let latency_ms = SIM_BASE_MS + SIM_MS_PER_PROMPT_TOKEN * tin as f64 + SIM_MS_PER_OUTPUT_TOKEN * tout as f64;
        Ok(Reply { text, usage: None, latency_ms: (latency_ms * 1000.0).round() / 1000.0 })
    }
}

pub(super) fn last_observation(steps: &[Step]) -> &str {
    steps.last().and_then(|s| s.observation.as_deref()).unwrap_or("")
}

pub(super) fn intent(action: Action, think: String, body: String, reason: impl Into<String>) -> Intent {
    Intent { action, think, body, reason: reason.into() }
}
