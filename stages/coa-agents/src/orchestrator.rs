//! The orchestrator: runs one task through the team of agents.
//!
//! Each agent has its own role prompt and message history. The orchestrator keeps the run's
//! blackboard (the accepted [`Step`]s) and forwards to each agent, when it is activated, the
//! steps it has not seen yet (tool observations included; the manager gets observations cut to
//! [`RunConfig::manager_observation_chars`]), plus any note addressed to it, plus the
//! instruction for this activation. What the agent read (history + that new message) is the
//! event's `input_messages`; afterwards both the message and the agent's reply join its history,
//! so every agent re-reads its whole context at each activation, as real multi-agent systems do.
//!
//! Each round: the **manager** routes — when the grammar allows one action only, by rule
//! (an event with no input and zero tokens: no model is asked), else by asking its mind to pick
//! among the allowed actions (falling back to a fixed preference, with a note to the manager,
//! when its reply names none); then the **agent** owning that action is activated. Its output is
//! parsed and checked (one action block, think first, grades and scores readable, an action the
//! grammar allows and the agent owns). An accepted output is re-rendered canonically, its tool
//! (if any) runs, and it becomes a step. A rejected output is logged as an event with role
//! `manager` (it is no part of the CoA trace, but its tokens were spent) and the agent and the
//! manager get a note; after [`MAX_CONSECUTIVE_REJECTIONS`] in a row, or
//! [`RunConfig::max_activations`] agent activations, the run ends without an answer.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use coa_format::Flavor;
use coa_rewards::{answer_correct, code_passes, extract_program};
use coa_schemas::rows::Task;
use coa_schemas::suite::{answer_kind, AnswerKind};

use crate::action::{allowed_next, parse_output, render_output, Action, AgentRole, Step};
use crate::backend::{Backend, Turn};
use crate::event::{ChatMessage, Event, MasRun};
use crate::prompts::{instruction, manager_instruction, manager_reply, parse_manager_reply, role_prompt};
use crate::tokens::{estimate_messages, estimate_text};
use crate::tools::Tools;

/// Rejected outputs in a row after which a run ends without an answer.
pub const MAX_CONSECUTIVE_REJECTIONS: usize = 3;

/// Per-run limits.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Agent activations (routing decisions not counted, rejected outputs counted) per run.
    pub max_activations: usize,
    /// Characters of each tool observation forwarded to the manager.
    pub manager_observation_chars: usize,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig { max_activations: 40, manager_observation_chars: 300 }
    }
}

#[derive(Debug)]
struct AgentState {
    history: Vec<ChatMessage>,
    /// Steps already forwarded.
    seen: usize,
    notes: Vec<String>,
}

fn cut(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        None => s.to_string(),
        Some((i, _)) => format!("{}… [{} more characters]", &s[..i], s[i..].chars().count()),
    }
}

/// How a step is forwarded to agent `to`: its agent and output, then the observation. An
/// agent's own step is already in its history: only its observation is forwarded (or nothing).
fn render_step(step: &Step, to: AgentRole, observation_chars: Option<usize>) -> Option<String> {
    let obs = step.observation.as_ref().map(|obs| {
        let obs = match observation_chars {
            Some(n) => cut(obs, n),
            None => obs.clone(),
        };
        format!("<observation>\n{obs}\n</observation>")
    });
    if step.agent == to {
        return obs.map(|o| format!("[result of your <{}>]\n{o}", step.action));
    }
    let mut out = format!("[{}]\n{}", step.agent, step.output);
    if let Some(o) = obs {
        out.push('\n');
        out.push_str(&o);
    }
    Some(out)
}

/// Preference when the manager's reply names no allowed action.
const FALLBACK_ORDER: [Action; 8] = [
    Action::WebSearch,
    Action::Code,
    Action::CrawlPage,
    Action::Reflection,
    Action::SuggestedAnswer,
    Action::DoubleCheck,
    Action::Answer,
    Action::Plan,
];

struct Run<'a> {
    task: &'a Task,
    cfg: &'a RunConfig,
    agents: BTreeMap<AgentRole, AgentState>,
    steps: Vec<Step>,
    events: Vec<Event>,
}

impl Run<'_> {
    /// The agent's history plus the new message for this activation (and records what it saw).
    fn compose(&mut self, role: AgentRole, instruction: &str) -> Vec<ChatMessage> {
        let suite = self.task.suite.clone();
        let agent = self.agents.entry(role).or_insert_with(|| AgentState {
            history: vec![ChatMessage::system(role_prompt(role, &suite))],
            seen: 0,
            notes: Vec::new(),
        });
        let mut parts = Vec::new();
        if agent.history.len() == 1 {
            parts.push(format!("Task ({}): {}", self.task.suite, self.task.question));
        }
        if self.steps.len() > agent.seen {
            let obs_chars = (role == AgentRole::Manager).then_some(self.cfg.manager_observation_chars);
            let rendered: Vec<String> = self.steps[agent.seen..].iter().filter_map(|s| render_step(s, role, obs_chars)).collect();
            if !rendered.is_empty() {
                let head = if agent.seen == 0 { "Team steps so far:" } else { "New team steps:" };
                parts.push(format!("{head}\n\n{}", rendered.join("\n\n")));
            }
            agent.seen = self.steps.len();
        }
        parts.append(&mut agent.notes);
        parts.push(instruction.to_string());
        let mut input = agent.history.clone();
        input.push(ChatMessage::user(parts.join("\n\n")));
        input
    }

    fn remember(&mut self, role: AgentRole, input: Vec<ChatMessage>, output: &str) {
        let agent = self.agents.get_mut(&role).expect("composed before");
        agent.history = input;
        agent.history.push(ChatMessage::assistant(output));
    }

    fn note(&mut self, role: AgentRole, note: String) {
        if let Some(a) = self.agents.get_mut(&role) {
            a.notes.push(note);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        agent: AgentRole,
        role: &str,
        input_messages: Vec<ChatMessage>,
        output: String,
        tool: Option<(Action, String, String)>,
        tokens: (i64, i64),
        latency_ms: f64,
    ) {
        let (tool, tool_input, observation) = match tool {
            Some((a, i, o)) => (Some(a.name().to_string()), Some(i), Some(o)),
            None => (None, None, None),
        };
        self.events.push(Event {
            seq: self.events.len() as i32,
            agent: agent.name().to_string(),
            role: role.to_string(),
            input_messages,
            output,
            tool,
            tool_input,
            observation,
            tokens_in: tokens.0,
            tokens_out: tokens.1,
            latency_ms,
        });
    }
}

/// Runs `task` through the multi-agent system (module docs) and checks its answer.
///
/// `Err` when the backend or a tool fails outright (the endpoint gives up after its retries,
/// the sandbox cannot start): the stage stops rather than record a run that never happened.
pub fn run_task(task: &Task, backend: &dyn Backend, tools: Tools<'_>, cfg: &RunConfig) -> Result<MasRun> {
    let flavor = Flavor::for_suite(&task.suite);
    let answers_with_a_program = answer_kind(&task.suite) == Some(AnswerKind::Program);
    let mut mind = backend.start(task).with_context(|| format!("task {}", task.task_id))?;
    let mut run = Run { task, cfg, agents: BTreeMap::new(), steps: Vec::new(), events: Vec::new() };
    let mut activations = 0usize;
    let mut rejections = 0usize;
    let mut final_answer = None;

    loop {
        let allowed = allowed_next(flavor, run.steps.last());
        if allowed.is_empty() || activations >= cfg.max_activations || rejections >= MAX_CONSECUTIVE_REJECTIONS {
            break;
        }

        // 1. The manager routes.
        let action = if allowed.len() == 1 {
            let after = run.steps.last().map_or("the start".to_string(), |s| format!("<{}>", s.action));
            let text = manager_reply(allowed[0], &format!("the only action the protocol allows after {after}"));
            run.event(AgentRole::Manager, "manager", Vec::new(), text, None, (0, 0), 0.0);
            allowed[0]
        } else {
            let input = run.compose(AgentRole::Manager, &manager_instruction(&allowed));
            let turn = Turn { task, flavor, agent: AgentRole::Manager, action: None, allowed: &allowed, messages: &input, steps: &run.steps };
            let reply = mind.reply(&turn).with_context(|| format!("task {}: manager", task.task_id))?;
            let tokens = reply.usage.unwrap_or_else(|| (estimate_messages(&input), estimate_text(&reply.text)));
            let chosen = parse_manager_reply(&reply.text, &allowed);
            run.remember(AgentRole::Manager, input.clone(), &reply.text);
            run.event(AgentRole::Manager, "manager", input, reply.text, None, tokens, reply.latency_ms);
            match chosen {
                Some(a) => a,
                None => {
                    let a = FALLBACK_ORDER.into_iter().find(|a| allowed.contains(a)).unwrap_or(allowed[0]);
                    run.note(AgentRole::Manager, format!("Your last reply named none of the allowed actions; the work was routed to {a}."));
                    a
                }
            }
        };

        // 2. The agent acts.
        let agent = action.agent();
        activations += 1;
        let input = run.compose(agent, instruction(action));
        let turn = Turn { task, flavor, agent, action: Some(action), allowed: &allowed, messages: &input, steps: &run.steps };
        let reply = mind.reply(&turn).with_context(|| format!("task {}: {agent}", task.task_id))?;
        let tokens = reply.usage.unwrap_or_else(|| (estimate_messages(&input), estimate_text(&reply.text)));
        let parsed = parse_output(&reply.text, flavor).and_then(|p| {
            if p.action.agent() != agent {
                anyhow::bail!("{} is not the {agent}'s action; the {agent} was asked for <{action}>", p.action.tag().open());
            }
            if !allowed.contains(&p.action) {
                anyhow::bail!("{} is not allowed now; the {agent} was asked for <{action}>", p.action.tag().open());
            }
            Ok(p)
        });
        let p = match parsed {
            Ok(p) => p,
            Err(why) => {
                rejections += 1;
                run.remember(agent, input.clone(), &reply.text);
                run.event(agent, "manager", input, reply.text, None, tokens, reply.latency_ms);
                run.note(agent, format!("Your previous reply was rejected: {why:#}. Reply again in the required format."));
                run.note(AgentRole::Manager, format!("The {agent}'s reply was rejected ({why:#}); it is asked again."));
                continue;
            }
        };
        rejections = 0;
        let output = render_output(p.think.as_deref(), p.action, &p.body);
        let mut latency = reply.latency_ms;
        let tool = if p.action.is_tool() {
            let last_query = run.steps.iter().rev().find(|s| s.action == Action::WebSearch).map(|s| s.body.as_str());
            let goal = coa_tools::crawl::Goal::new(p.think.as_deref(), last_query);
            let out = tools.run(p.action, &p.body, &goal).with_context(|| format!("task {}: {}", task.task_id, p.action))?;
            latency += backend.tool_latency_ms(p.action, &p.body, out.wall_ms);
            Some((p.action, p.body.clone(), out.observation))
        } else {
            None
        };
        let needs_replan = p.action == Action::Reflection && coa_format::parse_reflection(&p.body).is_ok_and(|g| g.needs_replan());
        let score = (p.action == Action::DoubleCheck).then(|| coa_format::parse_double_check(&p.body).ok()).flatten();
        if p.action == Action::Answer {
            final_answer = Some(if answers_with_a_program { extract_program(&p.body) } else { p.body.clone() });
        }
        run.steps.push(Step {
            action: p.action,
            agent,
            think: p.think.clone(),
            body: p.body.clone(),
            output: output.clone(),
            observation: tool.as_ref().map(|t| t.2.clone()),
            needs_replan,
            score,
        });
        run.remember(agent, input.clone(), &reply.text);
        run.event(agent, p.action.name(), input, output, tool, tokens, (latency * 1000.0).round() / 1000.0);
    }

    let success = match &final_answer {
        None => false,
        Some(answer) if answers_with_a_program => {
            code_passes(task, answer, &tools.config.limits).with_context(|| format!("task {}: checking the program", task.task_id))?.passed
        }
        Some(answer) => answer_correct(task, answer).with_context(|| format!("task {}: checking the answer", task.task_id))?,
    };
    let tokens_in = run.events.iter().map(|e| e.tokens_in).sum();
    let tokens_out = run.events.iter().map(|e| e.tokens_out).sum();
    let latency_ms = run.events.iter().map(|e| e.latency_ms).sum::<f64>();
    Ok(MasRun {
        task_id: task.task_id.clone(),
        suite: task.suite.clone(),
        question: task.question.clone(),
        answers: task.answers.clone(),
        backend: backend.label(),
        simulator: backend.simulator(),
        events: run.events,
        final_answer,
        success,
        tokens_in,
        tokens_out,
        latency_ms: (latency_ms * 1000.0).round() / 1000.0,
    })
}
