//! The CoA actions agents produce, which agent owns each, the ordering rules the manager routes
//! by, and the canonical tagged text of an activation's output.
//!
//! The grammar is `coa-format`'s (one definition for the whole pipeline): [`allowed_next`] reads
//! its transition tables and adds the content rules that steer the order: in the web and qa
//! flavors a reflection graded Poor anywhere forces a `<plan>`; a double_check with score ≥ 3 forces the
//! `<answer>`, ≤ 2 forbids it.

use std::fmt;

use anyhow::{anyhow, bail, Result};
use coa_format::{find_block, next_actions, parse, parse_double_check, parse_reflection, think_rule, Flavor, Tag, ThinkRule};

/// An action an agent can produce: every CoA tag but think and observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Plan,
    WebSearch,
    CrawlPage,
    Code,
    Reflection,
    SuggestedAnswer,
    DoubleCheck,
    Answer,
}

impl Action {
    pub const ALL: [Action; 8] = [
        Action::Plan,
        Action::WebSearch,
        Action::CrawlPage,
        Action::Code,
        Action::Reflection,
        Action::SuggestedAnswer,
        Action::DoubleCheck,
        Action::Answer,
    ];

    pub fn tag(self) -> Tag {
        match self {
            Action::Plan => Tag::Plan,
            Action::WebSearch => Tag::WebSearch,
            Action::CrawlPage => Tag::CrawlPage,
            Action::Code => Tag::Code,
            Action::Reflection => Tag::Reflection,
            Action::SuggestedAnswer => Tag::SuggestedAnswer,
            Action::DoubleCheck => Tag::DoubleCheck,
            Action::Answer => Tag::Answer,
        }
    }

    pub fn from_tag(tag: Tag) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.tag() == tag)
    }

    /// The tag name: `plan`, `web_search`, ... (the event `role`).
    pub fn name(self) -> &'static str {
        self.tag().name()
    }

    pub fn from_name(name: &str) -> Option<Action> {
        Tag::from_name(name).and_then(Action::from_tag)
    }

    /// The agent that produces this action.
    pub fn agent(self) -> AgentRole {
        match self {
            Action::Plan | Action::SuggestedAnswer | Action::Answer => AgentRole::Planner,
            Action::WebSearch => AgentRole::SearchAgent,
            Action::CrawlPage => AgentRole::CrawlAgent,
            Action::Code => AgentRole::CodeAgent,
            Action::Reflection => AgentRole::Reflector,
            Action::DoubleCheck => AgentRole::Verifier,
        }
    }

    /// A tool call: its input runs a tool and an observation follows.
    pub fn is_tool(self) -> bool {
        matches!(self, Action::WebSearch | Action::CrawlPage | Action::Code)
    }

    /// Whether a `<think>` precedes it in `flavor` (the grammar's think rule).
    pub fn think_rule(self, flavor: Flavor) -> ThinkRule {
        think_rule(flavor, self.tag())
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The agents of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AgentRole {
    Manager,
    Planner,
    SearchAgent,
    CrawlAgent,
    CodeAgent,
    Reflector,
    Verifier,
}

impl AgentRole {
    pub const ALL: [AgentRole; 7] = [
        AgentRole::Manager,
        AgentRole::Planner,
        AgentRole::SearchAgent,
        AgentRole::CrawlAgent,
        AgentRole::CodeAgent,
        AgentRole::Reflector,
        AgentRole::Verifier,
    ];

    /// The event `agent` value.
    pub fn name(self) -> &'static str {
        match self {
            AgentRole::Manager => "manager",
            AgentRole::Planner => "planner",
            AgentRole::SearchAgent => "search_agent",
            AgentRole::CrawlAgent => "crawl_agent",
            AgentRole::CodeAgent => "code_agent",
            AgentRole::Reflector => "reflector",
            AgentRole::Verifier => "verifier",
        }
    }

    pub fn from_name(name: &str) -> Option<AgentRole> {
        AgentRole::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The actions this agent produces.
    pub fn actions(self) -> Vec<Action> {
        Action::ALL.into_iter().filter(|a| a.agent() == self).collect()
    }
}

impl fmt::Display for AgentRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One accepted action of a run: what the team's blackboard holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub action: Action,
    pub agent: AgentRole,
    pub think: Option<String>,
    /// The action's content; for `code`, the Python source (no fence).
    pub body: String,
    /// The canonical tagged text (the event output).
    pub output: String,
    /// The tool's rendered output, for tool calls.
    pub observation: Option<String>,
    /// Reflection: any Poor grade.
    pub needs_replan: bool,
    /// Double check: the score.
    pub score: Option<u8>,
}

/// The actions allowed next after `last` (`None` = start), content rules included (module docs).
pub fn allowed_next(flavor: Flavor, last: Option<&Step>) -> Vec<Action> {
    let state = match last {
        None => None,
        // after a tool call comes its observation; what may follow is the observation's row
        Some(s) if s.action.is_tool() => Some(Tag::Observation),
        Some(s) => Some(s.action.tag()),
    };
    let mut out: Vec<Action> = next_actions(flavor, state).iter().filter_map(|&t| Action::from_tag(t)).collect();
    if let Some(s) = last {
        if s.action == Action::Reflection && flavor != Flavor::Code && s.needs_replan {
            out.retain(|&a| a == Action::Plan);
        }
        if let (Action::DoubleCheck, Some(score)) = (s.action, s.score) {
            if score >= 3 {
                out.retain(|&a| a == Action::Answer);
            } else {
                out.retain(|&a| a != Action::Answer);
            }
        }
    }
    out
}

/// An activation's output taken apart.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub think: Option<String>,
    pub action: Action,
    /// Trimmed content; for `code`, the Python source without the fence.
    pub body: String,
}

/// The canonical tagged output: `<think>…</think>` (if any), a newline, then the one action
/// block. Multi-line bodies go on their own lines; code is fenced as ```` ```py ````.
pub fn render_output(think: Option<&str>, action: Action, body: &str) -> String {
    let mut out = String::new();
    if let Some(t) = think {
        out.push_str(&block(Tag::Think, t.trim()));
        out.push('\n');
    }
    let body = body.trim();
    if action == Action::Code {
        out.push_str(&format!("<code>\n```py\n{body}\n```\n</code>"));
    } else {
        out.push_str(&block(action.tag(), body));
    }
    out
}

fn block(tag: Tag, body: &str) -> String {
    if body.contains('\n') {
        format!("{}\n{body}\n{}", tag.open(), tag.close())
    } else {
        format!("{}{body}{}", tag.open(), tag.close())
    }
}

/// Reads an agent's output: an optional `<think>` block, then exactly one action block.
///
/// Strict CoA text is parsed with `coa-format`; text around the blocks (chatter an LLM adds) is
/// tolerated by a lenient fallback that takes the first think block and the first action block.
/// The think block is required where the grammar requires one before the action, and dropped
/// where the grammar allows none (the code agent's plan and reflection), so that the trajectory
/// keeps AFM's order.
/// Content rules are checked: a code block holds a program, a reflection grades its three
/// criteria (web flavor), a double_check has `score: N`. The error says what is wrong, for the
/// manager's note to the agent.
pub fn parse_output(text: &str, flavor: Flavor) -> Result<Parsed> {
    let (think, tag, content) = match parse(text) {
        Ok(segs) => {
            let mut think = None;
            let mut actions = Vec::new();
            for seg in &segs {
                if seg.tag == Tag::Think {
                    if !actions.is_empty() {
                        bail!("<think> comes after the action block; write <think> first");
                    }
                    if think.is_some() {
                        bail!("two <think> blocks; write one");
                    }
                    think = Some(seg.content.to_string());
                } else {
                    actions.push((seg.tag, seg.content.to_string()));
                }
            }
            match actions.len() {
                0 => bail!("no action block: after <think> write exactly one action block"),
                1 => {
                    let (tag, content) = actions.pop().expect("one action");
                    (think, tag, content)
                }
                n => bail!("{n} action blocks ({}); write exactly one", actions.iter().map(|(t, _)| t.open()).collect::<Vec<_>>().join(", ")),
            }
        }
        Err(strict) => lenient(text).ok_or_else(|| anyhow!("not CoA-tagged text: {strict}"))?,
    };
    let action = match tag {
        Tag::WikiSearch => bail!("<wiki_search> is not available here; use <web_search>"),
        Tag::Observation => bail!("<observation> is written by the tools, not by agents"),
        Tag::Think => bail!("no action block after <think>"),
        other => Action::from_tag(other).ok_or_else(|| anyhow!("unexpected tag {}", other.open()))?,
    };
    let body = if action == Action::Code { coa_format::code_source(&content).trim_end().to_string() } else { content.trim().to_string() };
    if body.trim().is_empty() {
        bail!("{} is empty", action.tag().open());
    }
    let think = match action.think_rule(flavor) {
        ThinkRule::Required if think.as_deref().is_none_or(|t| t.trim().is_empty()) => {
            bail!("{} must be preceded by a non-empty <think> block", action.tag().open())
        }
        ThinkRule::Forbidden => None,
        _ => think,
    };
    match action {
        Action::Reflection if flavor.grades_reflections() => {
            parse_reflection(&body).map_err(|e| anyhow!("<reflection> has {e}"))?;
        }
        Action::DoubleCheck => {
            parse_double_check(&body).map_err(|e| anyhow!("<double_check> has {e}"))?;
        }
        Action::Code if content.contains("```sh") => bail!("<code> takes one ```py block; stdin input is not supported here"),
        _ => {}
    }
    Ok(Parsed { think: think.map(|t| t.trim().to_string()), action, body })
}

/// First `<think>` block and first action block anywhere in `text` (ignoring text around them).
/// An agent's output is read from its first blocks: one activation writes one action (a rollout,
/// which `coa-score` reads, ends with its last `<answer>` instead).
fn lenient(text: &str) -> Option<(Option<String>, Tag, String)> {
    let think = find_block(text, Tag::Think, 0);
    let from = think.as_ref().map_or(0, |(block, _)| block.end);
    let mut best: Option<(usize, Tag, &str)> = None;
    for tag in Tag::ALL {
        if tag == Tag::Think || tag == Tag::Observation {
            continue;
        }
        if let Some((block, content)) = find_block(text, tag, from) {
            if best.as_ref().is_none_or(|(s, _, _)| block.start < *s) {
                best = Some((block.start, tag, content));
            }
        }
    }
    let (_, tag, content) = best?;
    // the action body must not hold other tags (nested blocks are a broken output)
    if tag != Tag::Code && Tag::ALL.iter().any(|t| content.contains(t.open()) || content.contains(t.close())) {
        return None;
    }
    Some((think.map(|(_, t)| t.to_string()), tag, content.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(action: Action, needs_replan: bool, score: Option<u8>) -> Step {
        Step { action, agent: action.agent(), think: None, body: String::new(), output: String::new(), observation: None, needs_replan, score }
    }

    #[test]
    fn routing_follows_the_grammar_and_content_rules() {
        use Action::*;
        assert_eq!(allowed_next(Flavor::Web, None), vec![Plan]);
        assert_eq!(allowed_next(Flavor::Web, Some(&step(Plan, false, None))), vec![WebSearch, CrawlPage, SuggestedAnswer]);
        assert_eq!(allowed_next(Flavor::Web, Some(&step(WebSearch, false, None))), vec![Plan, WebSearch, CrawlPage, Reflection, SuggestedAnswer]);
        assert_eq!(allowed_next(Flavor::Web, Some(&step(Reflection, true, None))), vec![Plan]);
        assert_eq!(allowed_next(Flavor::Web, Some(&step(Reflection, false, None))), vec![Plan, WebSearch, CrawlPage, SuggestedAnswer]);
        assert_eq!(allowed_next(Flavor::Web, Some(&step(SuggestedAnswer, false, None))), vec![DoubleCheck]);
        assert_eq!(allowed_next(Flavor::Web, Some(&step(DoubleCheck, false, Some(3)))), vec![Answer]);
        assert_eq!(allowed_next(Flavor::Web, Some(&step(DoubleCheck, false, Some(2)))), vec![Plan, WebSearch, CrawlPage]);
        assert_eq!(allowed_next(Flavor::Web, Some(&step(Answer, false, None))), Vec::<Action>::new());
        assert_eq!(allowed_next(Flavor::Code, Some(&step(Plan, false, None))), vec![Code, Answer]);
        assert_eq!(allowed_next(Flavor::Code, Some(&step(Code, false, None))), vec![Reflection]);
        assert_eq!(allowed_next(Flavor::Code, Some(&step(Reflection, true, None))), vec![Code, Answer]);
    }

    #[test]
    fn outputs_render_and_parse_back() {
        for (action, body) in [
            (Action::Plan, "1. a\n2. b"),
            (Action::WebSearch, "Zentor X2 manufacturer"),
            (Action::CrawlPage, "https://wiki.local/A|https://wiki.local/B"),
            (Action::Code, "x = 1\nprint(x + 1)"),
            (Action::Reflection, "information_conflict: Good\ntool_effectiveness: Fair\ntrajectory_monitoring: Good\nFine."),
            (Action::DoubleCheck, "score: 4\nThe page states it."),
            (Action::Answer, "\\boxed{42}"),
        ] {
            let text = render_output(Some("because"), action, body);
            let back = parse_output(&text, Flavor::Web).unwrap();
            assert_eq!(back, Parsed { think: Some("because".into()), action, body: body.to_string() }, "{text}");
            assert!(coa_format::parse(&text).is_ok());
        }
        assert_eq!(render_output(None, Action::Answer, "Fymdou"), "<answer>Fymdou</answer>");
        assert_eq!(
            render_output(Some("t"), Action::Code, "print(1)"),
            "<think>t</think>\n<code>\n```py\nprint(1)\n```\n</code>"
        );
    }

    #[test]
    fn broken_outputs_are_explained() {
        let err = |t: &str| parse_output(t, Flavor::Web).unwrap_err().to_string();
        assert!(err("just text").contains("not CoA-tagged"));
        assert!(err("<web_search>q</web_search>").contains("<think>"));
        assert!(err("<think>a</think><plan>x</plan><web_search>q</web_search>").contains("exactly one"));
        assert!(err("<think>a</think><reflection>fine</reflection>").contains("information_conflict"));
        assert!(err("<think>a</think><double_check>ok</double_check>").contains("score"));
        assert!(err("<think>a</think><wiki_search>q</wiki_search>").contains("web_search"));
        assert!(err("<think>a</think><plan>  </plan>").contains("empty"));
        // chatter around the blocks is tolerated
        let p = parse_output("Sure! <think>a</think>\n<web_search>q</web_search> Hope this helps.", Flavor::Web).unwrap();
        assert_eq!((p.action, p.body.as_str()), (Action::WebSearch, "q"));
        // answer needs no think
        assert_eq!(parse_output("<answer>x</answer>", Flavor::Web).unwrap().think, None);
        // reflections in the code flavor need no grades, and take no think (AFM's order)
        let p = parse_output("<think>a</think><reflection>works</reflection>", Flavor::Code).unwrap();
        assert_eq!((p.think, p.body.as_str()), (None, "works"));
        assert!(parse_output("<plan>1. compute</plan>", Flavor::Code).is_ok());
        assert!(parse_output("<answer>\\boxed{1}</answer>", Flavor::Code).unwrap_err().to_string().contains("<think>"));
    }
}
