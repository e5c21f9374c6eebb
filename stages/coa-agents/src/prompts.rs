//! Role prompts (each agent's system message), the per-activation instructions the orchestrator
//! appends, and the manager's routing reply format.

use coa_format::Flavor;
use coa_schemas::suite::{answer_kind, AnswerKind};

use crate::action::{Action, AgentRole};

/// How an agent replies, in the order the flavor's grammar checks.
fn format_note(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Web | Flavor::Qa => "Reply in the Chain-of-Agents format and nothing else: first <think>your reasoning</think>, \
then exactly ONE action block. Never write <observation> blocks: the tools write them.",
        Flavor::Code => "Reply in the Chain-of-Agents format and nothing else: exactly ONE action block, with \
<think>your reasoning</think> right before a <code> block or the final <answer>; a <plan> (it comes first) and a \
<reflection> (right after the program's output) are written without <think>. Never write <observation> blocks: the \
tools write them.",
    }
}

/// The system message of `agent` for a task of `suite`.
pub fn role_prompt(agent: AgentRole, suite: &str) -> String {
    let flavor = Flavor::for_suite(suite);
    let team = "You are one agent of a team that solves a task together: a manager routes the work between a \
planner, a search agent, a crawl agent, a code agent, a reflector and a verifier. You see the team's steps as they \
happen, each prefixed with the agent that took it.";
    let answer_form = match answer_kind(suite) {
        Some(AnswerKind::Math) => "The final answer is the number or expression only, as \\boxed{...}.",
        Some(AnswerKind::Program) => "The final answer is the complete Python program (the function and its imports), in one ```python block.",
        _ => "Answers are the exact name or phrase only, no sentence; several answers are separated by |.",
    };
    let body = match agent {
        AgentRole::Manager => {
            return format!(
                "{team}\n\nYou are the MANAGER. Each message lists the actions allowed next. Pick the one that moves the \
team forward and reply with exactly two lines:\nnext: <action>\nreason: <one short sentence>\n\
Actions: plan (planner), web_search (search agent), crawl_page (crawl agent), code (code agent), reflection \
(reflector), suggested_answer (planner), double_check (verifier), answer (planner)."
            )
        }
        AgentRole::Planner => format!(
            "You are the PLANNER. When asked for a plan, write <plan>numbered high-level steps</plan> (revise it when the \
team went wrong). When asked to suggest an answer, write <suggested_answer>answer</suggested_answer>. When asked for \
the final answer, write <answer>answer</answer> (after a double check, the <think> is optional). {answer_form}"
        ),
        AgentRole::SearchAgent => "You are the SEARCH AGENT. Write <web_search>one keyword query</web_search> for the next \
fact the plan needs. The search engine is BM25 over an offline wiki: use the names of the entities involved and a few \
words about the relation you need."
            .to_string(),
        AgentRole::CrawlAgent => "You are the CRAWL AGENT. Write <crawl_page>url</crawl_page> with the URL of the page most \
likely to state the fact the plan needs (several URLs may be separated by |). Take URLs from the search results; an \
entity's page is https://wiki.local/<Title_With_Underscores>."
            .to_string(),
        AgentRole::CodeAgent => "You are the CODE AGENT. Write\n<code>\n```py\n<a complete Python 3 program>\n```\n</code>\n\
The program runs in a sandbox with no input, no network and no files; it must print what the team needs to see. \
Test functions on examples and print the results."
            .to_string(),
        AgentRole::Reflector => match flavor {
            Flavor::Web | Flavor::Qa => "You are the REFLECTOR. Judge the latest steps. Write <reflection> with these three lines \
first:\ninformation_conflict: Good|Fair|Poor\ntool_effectiveness: Good|Fair|Poor\ntrajectory_monitoring: Good|Fair|Poor\n\
then what went right or wrong and what to do next, then </reflection>. Grade Poor when the evidence contradicts the \
question or the team is off track: any Poor makes the planner re-plan."
                .to_string(),
            Flavor::Code => "You are the REFLECTOR. Judge the program's output against what the task needs. Write \
<reflection> with these three lines first:\ninformation_conflict: Good|Fair|Poor\ntool_effectiveness: Good|Fair|Poor\n\
trajectory_monitoring: Good|Fair|Poor\nthen whether the result is right, and what to fix if not, then </reflection>."
                .to_string(),
        },
        AgentRole::Verifier => "You are the VERIFIER. Check the suggested answer against the question and the evidence the \
team gathered. Write <double_check> with a line `score: N` where N is 4 (certain), 3 (likely right), 2 (doubtful) or \
1 (wrong), then your reasons, then </double_check>. A score of 3 or 4 ends the task with that answer."
            .to_string(),
    };
    format!("{team}\n\n{body}\n\n{}", format_note(flavor))
}

/// What the orchestrator asks for when it activates an agent for `action`.
pub fn instruction(action: Action) -> &'static str {
    match action {
        Action::Plan => "Your turn: write the plan (revise it if the team went wrong).",
        Action::WebSearch => "Your turn: search for the next fact the plan needs.",
        Action::CrawlPage => "Your turn: open the page(s) most likely to state the fact the plan needs.",
        Action::Code => "Your turn: write and run a program for the next step.",
        Action::Reflection => "Your turn: reflect on the latest steps and grade them.",
        Action::SuggestedAnswer => "Your turn: suggest the answer from the evidence so far.",
        Action::DoubleCheck => "Your turn: double-check the suggested answer and score it.",
        Action::Answer => "Your turn: give the final answer.",
    }
}

/// The manager's instruction: the allowed actions.
pub fn manager_instruction(allowed: &[Action]) -> String {
    let names: Vec<&str> = allowed.iter().map(|a| a.name()).collect();
    format!("Allowed next: {}. Reply `next: <action>` and `reason: ...`.", names.join(", "))
}

/// The manager's reply for `action`.
pub fn manager_reply(action: Action, reason: &str) -> String {
    format!("next: {}\nreason: {}", action.name(), reason.trim())
}

/// The action a manager reply names, if it names one of `allowed`: the `next:` line first, then
/// any allowed action or agent name in the text (an agent that owns one allowed action).
pub fn parse_manager_reply(text: &str, allowed: &[Action]) -> Option<Action> {
    let lower = text.to_ascii_lowercase();
    let pick = |s: &str| -> Option<Action> {
        let word: String = s.trim().trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_').to_string();
        let word = word.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or("");
        if let Some(a) = Action::from_name(word).filter(|a| allowed.contains(a)) {
            return Some(a);
        }
        let agent = AgentRole::from_name(word)?;
        let owned: Vec<Action> = allowed.iter().copied().filter(|a| a.agent() == agent).collect();
        (owned.len() == 1).then(|| owned[0])
    };
    for line in lower.lines() {
        if let Some(rest) = line.trim().trim_start_matches(['*', '-', ' ']).strip_prefix("next") {
            if let Some(a) = pick(rest.trim_start_matches(['*', ':', ' ', '`'])) {
                return Some(a);
            }
        }
    }
    let words: Vec<&str> = lower.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).collect();
    let found: Vec<Action> = allowed.iter().copied().filter(|a| words.contains(&a.name())).collect();
    (found.len() == 1).then(|| found[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    #[test]
    fn manager_replies_are_read() {
        let allowed = [Plan, WebSearch, CrawlPage, SuggestedAnswer];
        assert_eq!(parse_manager_reply(&manager_reply(CrawlPage, "open it"), &allowed), Some(CrawlPage));
        assert_eq!(parse_manager_reply("**Next**: `web_search`\nreason: x", &allowed), Some(WebSearch));
        assert_eq!(parse_manager_reply("next: search_agent", &allowed), Some(WebSearch));
        assert_eq!(parse_manager_reply("next: planner", &allowed), None, "planner owns two allowed actions");
        assert_eq!(parse_manager_reply("I think we should crawl_page now.", &allowed), Some(CrawlPage));
        assert_eq!(parse_manager_reply("next: answer", &allowed), None);
        assert_eq!(parse_manager_reply("no idea", &allowed), None);
    }

    #[test]
    fn prompts_name_the_format() {
        for agent in AgentRole::ALL {
            for suite in ["multihop", "math", "code"] {
                let p = role_prompt(agent, suite);
                assert!(p.contains(&agent.name().replace('_', " ").to_uppercase()), "{agent}: {p}");
            }
        }
        assert!(role_prompt(AgentRole::Reflector, "multihop").contains("information_conflict"));
        assert!(role_prompt(AgentRole::Verifier, "qa").contains("score: N"));
    }
}
