//! The AFM-style instructions a Chain-of-Agents model is prompted with, one per suite, kept in
//! one place: distillation (`coa-convert`), policy rollouts and exports all build prompts here, so
//! the model is trained and sampled on the same words. Each states the order
//! [`crate::grammar`] checks, which is the order AFM's own prompts ask for (math and code:
//! `plan, (think, code, observation, reflection)*, think, answer`).
//!
//! A prompt is the suite's instruction (the tags, what each one is for, and the order rules of
//! [`crate::grammar`]), a blank line, then `Question: {question}`.

use std::fmt;

use coa_schemas::suite::Suite;

/// Search agents (multihop, qa and other web suites).
pub const WEB_INSTRUCTION: &str = "\
You are one model playing a whole team of agents: a planner, search and crawl tools, a reflector and a verifier. \
Solve the question step by step, writing each step inside its tag:
- <think>...</think>: your reasoning. Write one right before every <plan>, <web_search>, <crawl_page>, <reflection>, <suggested_answer> and <double_check>.
- <plan>...</plan>: break the question into the facts you need and the order to find them.
- <web_search>query</web_search>: search the web. <crawl_page>url</crawl_page>: read pages (several urls separated by |). \
Each tool call is answered by an <observation>...</observation> from the environment; never write one yourself.
- <reflection>...</reflection>: review the trajectory and grade information_conflict, tool_effectiveness and trajectory_monitoring, \
each as Good, Fair or Poor, one per line (e.g. `tool_effectiveness: Fair`). Any Poor means you must <plan> again.
- <suggested_answer>...</suggested_answer>: a candidate answer. Always follow it with \
<double_check>...</double_check>, ending with `score: N` (N from 1 to 4): 3 or 4 means give the final answer, \
1 or 2 means plan, search or crawl again.
- <answer>...</answer>: the final answer, short; it ends your response. Separate several answers with |.
Order: start with <plan>; after <plan> search, crawl or suggest an answer; after an observation plan, search, crawl, \
reflect or suggest an answer; after <reflection> plan, search, crawl or suggest an answer; after <suggested_answer> only \
<double_check>; after <double_check> plan, search, crawl or answer.";

/// Math agents: compute with code, answer in `\boxed{}`.
pub const MATH_INSTRUCTION: &str = "\
You are one model playing a whole team of agents: a planner, a code tool and a reflector. \
Solve the problem step by step, writing each step inside its tag:
- <plan>...</plan>: the steps of the solution; it comes first, once.
- <think>...</think>: your reasoning. Write one right before every <code> and before the answer.
- <code>\n```py\n...\n```\n</code>: run a Python program; print what you need. It is answered by an \
<observation>...</observation> with its output; never write one yourself.
- <reflection>...</reflection>: right after each observation, check the result: is it plausible, does it answer the step?
- <answer>...</answer>: the final answer as \\boxed{...}; it ends your response.
Order: <plan>, then any number of rounds of <think> <code> <observation> <reflection>, then <think> <answer>.";

/// Code agents: write and test a program, answer with the final program.
pub const CODE_INSTRUCTION: &str = "\
You are one model playing a whole team of agents: a planner, a code tool and a reflector. \
Solve the programming task step by step, writing each step inside its tag:
- <plan>...</plan>: the approach and the cases to test; it comes first, once.
- <think>...</think>: your reasoning. Write one right before every <code> and before the answer.
- <code>\n```py\n...\n```\n</code>: run a Python program (your solution with a few tests). It is answered by an \
<observation>...</observation> with its output; never write one yourself.
- <reflection>...</reflection>: right after each observation, check the result: do the tests pass, what must change?
- <answer>...</answer>: the complete final program in a ```python block; it ends your response.
Order: <plan>, then any number of rounds of <think> <code> <observation> <reflection>, then <think> <answer>.";

/// The instruction for a suite: `math`, `code`, otherwise (multihop, qa, a suite this build does
/// not know) the web instruction.
pub fn instruction(suite: &str) -> &'static str {
    match Suite::parse(suite) {
        Some(Suite::Math) => MATH_INSTRUCTION,
        Some(Suite::Code) => CODE_INSTRUCTION,
        Some(Suite::Multihop | Suite::Qa) | None => WEB_INSTRUCTION,
    }
}

/// Plain prompts: a model answering on its own, without tags or tools (a base model measured
/// beside the students). The answer forms are the ones the field's evaluations read: math as
/// Qwen-Math and AFM's evaluations prompt it (the last `\boxed{}`), code as LiveCodeBench does
/// (the last fenced block), a short answer boxed too.
pub const PLAIN_MATH_INSTRUCTION: &str = "Please reason step by step, and put your final answer within \\boxed{}.";
pub const PLAIN_CODE_INSTRUCTION: &str =
    "Solve the programming task. Write the complete final program in one ```python block at the end of your response.";
pub const PLAIN_WEB_INSTRUCTION: &str = "Answer the question. Put your final answer, short, within \\boxed{}.";

/// The plain instruction for a suite (see [`PLAIN_MATH_INSTRUCTION`]).
pub fn plain_instruction(suite: &str) -> &'static str {
    match Suite::parse(suite) {
        Some(Suite::Math) => PLAIN_MATH_INSTRUCTION,
        Some(Suite::Code) => PLAIN_CODE_INSTRUCTION,
        Some(Suite::Multihop | Suite::Qa) | None => PLAIN_WEB_INSTRUCTION,
    }
}

/// The plain prompt for `question` in `suite`: the same shape as [`build_prompt`]'s (instruction,
/// [`QUESTION_PREFIX`], question), so chat templates render it the same way.
pub fn build_plain_prompt(suite: &str, question: &str) -> String {
    format!("{}{QUESTION_PREFIX}{question}", plain_instruction(suite))
}

/// Separates the instruction from the question.
pub const QUESTION_PREFIX: &str = "\n\nQuestion: ";

/// Writes the prompt for `question` in `suite` to a sink (no intermediate string).
pub fn write_prompt<W: fmt::Write>(suite: &str, question: &str, out: &mut W) -> fmt::Result {
    out.write_str(instruction(suite))?;
    out.write_str(QUESTION_PREFIX)?;
    out.write_str(question)
}

/// The prompt for `question` in `suite`.
pub fn build_prompt(suite: &str, question: &str) -> String {
    let inst = instruction(suite);
    let mut s = String::with_capacity(inst.len() + QUESTION_PREFIX.len() + question.len());
    // Writing to a String cannot fail.
    let _ = write_prompt(suite, question, &mut s);
    s
}

/// The question back out of a prompt built by [`build_prompt`], if it is one.
pub fn question_of(prompt: &str) -> Option<&str> {
    [WEB_INSTRUCTION, MATH_INSTRUCTION, CODE_INSTRUCTION]
        .iter()
        .find_map(|inst| prompt.strip_prefix(inst))
        .and_then(|rest| rest.strip_prefix(QUESTION_PREFIX))
}

/// A prompt as chat turns: `(Some(instruction), question)` for a prompt of the shape
/// [`build_prompt`] writes (`instruction` + [`QUESTION_PREFIX`] + `question`, split at the first
/// prefix), `(None, prompt)` for any other prompt. Chat templates render the instruction as the
/// system turn and the question as the user turn.
pub fn split_prompt(prompt: &str) -> (Option<&str>, &str) {
    match prompt.split_once(QUESTION_PREFIX) {
        Some((system, question)) => (Some(system), question),
        None => (None, prompt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::Flavor;
    use crate::tag::Tag;

    #[test]
    fn prompts_name_every_tag_their_flavor_uses() {
        for (suite, inst) in [
            ("multihop", WEB_INSTRUCTION),
            ("qa", WEB_INSTRUCTION),
            ("math", MATH_INSTRUCTION),
            ("code", CODE_INSTRUCTION),
        ] {
            assert_eq!(instruction(suite), inst);
            let flavor = Flavor::for_suite(suite);
            for (_, next) in flavor.transitions() {
                for t in next.iter().filter(|t| **t != Tag::WikiSearch) {
                    assert!(inst.contains(t.open()), "{suite}: {t} missing");
                }
            }
            let p = build_prompt(suite, "What is 2+2?");
            assert!(p.ends_with("\n\nQuestion: What is 2+2?"));
            assert_eq!(question_of(&p), Some("What is 2+2?"));
            assert_eq!(split_prompt(&p), (Some(inst), "What is 2+2?"));
        }
    }

    #[test]
    fn other_prompts_are_one_user_turn() {
        assert_eq!(split_prompt("Solve x."), (None, "Solve x."));
        assert_eq!(split_prompt("A\n\nQuestion: b\n\nQuestion: c"), (Some("A"), "b\n\nQuestion: c"));
    }
}
