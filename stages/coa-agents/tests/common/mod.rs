//! Shared helpers: generated task sets with their corpus, a run helper, and a trajectory checker
//! that validates a run's CoA trace with `coa-format` and the event contract.

#![allow(dead_code)]

use coa_agents::{Backend, MasRun, Noise, RunConfig, Runner, ScriptedBackend, ToolConfig, Tools};
use coa_format::{think_rule, Flavor, Step as FStep, Tag, ThinkRule};
use coa_schemas::rows::Task;
use coa_tasks::{Split, Suite};
use coa_tools::Corpus;

pub fn tasks(suite: Suite, n: usize, seed: u64) -> (Vec<Task>, Option<Corpus>) {
    let g = coa_tasks::generate(suite, n, seed, Split::Train).unwrap();
    let corpus = (!g.corpus.is_empty()).then(|| Corpus::new(g.corpus).unwrap());
    (g.tasks, corpus)
}

pub fn run_scripted(tasks: &[Task], corpus: Option<&Corpus>, seed: u64, noise: Noise, threads: usize) -> Vec<MasRun> {
    let backend = ScriptedBackend::new(seed, noise).unwrap();
    run_with(tasks, corpus, &backend, threads)
}

pub fn run_with(tasks: &[Task], corpus: Option<&Corpus>, backend: &dyn Backend, threads: usize) -> Vec<MasRun> {
    let config = ToolConfig::default();
    let tools = Tools { corpus, config: &config };
    Runner::new(threads).unwrap().run(tasks, backend, tools, &RunConfig::default()).unwrap()
}

/// The non-manager events of a run as `coa-format` steps, validated against the grammar, plus the
/// event contract: canonical tagged output, think blocks, tool fields.
pub fn check_run(run: &MasRun) {
    let flavor = Flavor::for_suite(&run.suite);
    let mut steps = Vec::new();
    for (i, e) in run.events.iter().enumerate() {
        assert_eq!(e.seq as usize, i, "{}: seq", run.task_id);
        assert!(e.tokens_in >= 0 && e.tokens_out >= 0 && e.latency_ms >= 0.0);
        if e.role == "manager" {
            assert!(e.tool.is_none() && e.observation.is_none());
            if e.agent == "manager" {
                assert!(e.output.starts_with("next: "), "{}: manager output {:?}", run.task_id, e.output);
            }
            continue;
        }
        let segs = coa_format::parse(&e.output).unwrap_or_else(|err| panic!("{} event {i}: {err}\n{}", run.task_id, e.output));
        // exactly one action, with a think block exactly where the grammar's think rule has one
        let action = segs.last().unwrap_or_else(|| panic!("{} event {i}: empty output", run.task_id)).tag;
        let thought = segs.len() == 2;
        assert!(segs.len() <= 2 && (!thought || segs[0].tag == Tag::Think), "{} event {i}: [think] + one action: {}", run.task_id, e.output);
        match think_rule(flavor, action) {
            ThinkRule::Required => assert!(thought, "{} event {i}: {action} needs a think: {}", run.task_id, e.output),
            ThinkRule::Forbidden => assert!(!thought, "{} event {i}: {action} takes no think ({flavor:?}): {}", run.task_id, e.output),
            ThinkRule::Optional => {}
        }
        let segs = if thought {
            assert!(!segs[0].content.trim().is_empty());
            steps.push(FStep::new(Tag::Think, segs[0].content));
            segs[1..].to_vec()
        } else {
            segs
        };
        let tag = segs[0].tag;
        assert_eq!(tag.name(), e.role, "{} event {i}: role is the action tag", run.task_id);
        let content = if tag == Tag::Code { coa_format::code_source(segs[0].content) } else { segs[0].content.trim() };
        if tag.is_tool() {
            assert_eq!(e.tool.as_deref(), Some(tag.name()), "{} event {i}", run.task_id);
            assert_eq!(e.tool_input.as_deref(), Some(content), "{} event {i}: tool_input", run.task_id);
            let obs = e.observation.as_deref().unwrap_or_else(|| panic!("{} event {i}: no observation", run.task_id));
            match tag {
                Tag::WebSearch => assert!(obs.starts_with("Found "), "{obs}"),
                Tag::CrawlPage => assert!(obs.starts_with("Page 1 [") || obs.starts_with("Error"), "{obs}"),
                Tag::Code => assert!(obs.starts_with("[EXECUTED]") || obs.starts_with("[FAILED]"), "{obs}"),
                _ => unreachable!(),
            }
            steps.push(FStep::tool(tag, content, obs));
        } else {
            assert!(e.tool.is_none() && e.tool_input.is_none() && e.observation.is_none(), "{} event {i}", run.task_id);
            steps.push(FStep::new(tag, content));
        }
    }
    if let Err(v) = coa_format::validate(&steps, flavor) {
        let trace: Vec<&str> = steps.iter().map(|s| s.tag.name()).collect();
        panic!("{}: {v}\ntrace: {trace:?}", run.task_id);
    }
    // the final answer is the last answer's content
    let last = run.events.iter().rev().find(|e| e.role == "answer").expect("an answer");
    let inner = coa_format::parse(&last.output).unwrap().last().unwrap().content.trim().to_string();
    if run.suite == "code" {
        assert_eq!(run.final_answer.as_deref(), Some(coa_rewards::extract_program(&inner).as_str()));
    } else {
        assert_eq!(run.final_answer.as_deref(), Some(inner.as_str()));
    }
    // no tool call is repeated with the same input (coa-filter drops such trajectories)
    let mut inputs: Vec<(&str, &str)> = run.events.iter().filter_map(|e| Some((e.role.as_str(), e.tool_input.as_deref()?))).collect();
    let n = inputs.len();
    inputs.sort();
    inputs.dedup();
    assert_eq!(inputs.len(), n, "{}: a repeated tool input", run.task_id);
    assert_eq!(run.tokens_in, run.events.iter().map(|e| e.tokens_in).sum::<i64>());
    assert_eq!(run.tokens_out, run.events.iter().map(|e| e.tokens_out).sum::<i64>());
}

/// Roles of the non-manager events.
pub fn trace(run: &MasRun) -> Vec<&str> {
    run.events.iter().filter(|e| e.role != "manager").map(|e| e.role.as_str()).collect()
}
