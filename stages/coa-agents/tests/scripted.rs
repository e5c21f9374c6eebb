//! The scripted teacher on generated task sets: grammar, event completeness, noise rates,
//! determinism, and answers really checked.

mod common;

use std::collections::BTreeMap;

use coa_agents::tokens::{estimate_messages, estimate_text};
use coa_agents::{Backend, MasRun, Noise, RunStats, ScriptedBackend};
use coa_tasks::Suite;

const QUIET: Noise = Noise { wrong_pick: 0.0, buggy_code: 0.0, premature: 0.0, give_up: 0.0, routine_reflection: 0.0 };

fn stats(runs: &[MasRun]) -> RunStats {
    let mut s = RunStats::default();
    for r in runs {
        s.add(r, None);
    }
    s
}

#[test]
fn multihop_runs_follow_the_grammar_on_many_seeds_and_noise_levels() {
    let (tasks, corpus) = common::tasks(Suite::Multihop, 300, 11);
    let heavy = Noise { wrong_pick: 0.5, buggy_code: 0.5, premature: 0.5, give_up: 0.3, routine_reflection: 0.5 };
    for (seed, noise) in [(1, Noise::default()), (2, Noise::default()), (3, heavy), (4, QUIET)] {
        let runs = common::run_scripted(&tasks, corpus.as_ref(), seed, noise, 2);
        assert_eq!(runs.len(), tasks.len());
        for (run, task) in runs.iter().zip(&tasks) {
            assert_eq!(run.task_id, task.task_id, "input order is kept");
            assert_eq!((run.backend.as_str(), run.simulator), ("scripted", true));
            common::check_run(run);
        }
        let s = stats(&runs);
        assert_eq!((s.rejected, s.no_answer), (0, 0), "seed {seed}");
    }
}

/// A multihop run's first thought names the question's relations from its innermost name outward
/// and only then counts them, so that the count a student writes follows from a list it can read
/// off the question (a count stated first was learnt as its data's commonest value).
#[test]
fn multihop_plans_unnest_the_relations_before_counting_them() {
    let (tasks, corpus) = common::tasks(Suite::Multihop, 60, 7);
    let runs = common::run_scripted(&tasks, corpus.as_ref(), 1, Noise::default(), 2);
    for (run, task) in runs.iter().zip(&tasks) {
        let sol: coa_tasks::synth::multihop::MultihopSolution = serde_json::from_str(task.solution.as_deref().unwrap()).unwrap();
        let n = sol.hops.len();
        assert_eq!(task.hops, Some(n as i32));
        let plan = run.events.iter().find(|e| e.role == "plan").unwrap();
        let think = plan.output.split("</think>").next().unwrap();
        let listed = think.split("outward: ").nth(1).and_then(|t| t.split(". That is").next()).unwrap_or_else(|| panic!("{think}"));
        let names: Vec<&str> = listed.split(" -> ").collect();
        assert_eq!(names.len(), n + 1, "{think}");
        assert_eq!(names[0], sol.hops[0].subject, "{think}");
        assert!(think.contains(&format!("That is {n} relations.")), "{think}");
    }
}

#[test]
fn math_and_code_runs_follow_the_code_pattern() {
    for suite in [Suite::Math, Suite::Code] {
        let (tasks, _) = common::tasks(suite, 24, 5);
        let runs = common::run_scripted(&tasks, None, 9, Noise { buggy_code: 0.5, give_up: 0.2, ..QUIET }, 2);
        for run in &runs {
            common::check_run(run);
            let t = common::trace(run);
            assert_eq!(t[0], "plan");
            assert_eq!(*t.last().unwrap(), "answer");
            for pair in t.windows(2) {
                if pair[0] == "code" {
                    assert_eq!(pair[1], "reflection", "{}: {t:?}", run.task_id);
                }
            }
            assert!(t.iter().filter(|r| **r == "code").count() <= 3, "few python runs per task: {t:?}");
        }
        let s = stats(&runs);
        assert!(s.recoveries > 0, "{suite}: {}", s.to_json());
        assert!(s.successes > 12, "{suite}: {}", s.to_json());
    }
}

#[test]
fn events_are_complete_and_every_agent_rereads_a_growing_context() {
    let (tasks, corpus) = common::tasks(Suite::Multihop, 40, 3);
    let runs = common::run_scripted(&tasks, corpus.as_ref(), 1, Noise { wrong_pick: 0.5, ..Noise::default() }, 1);
    for run in &runs {
        let mut last_len: BTreeMap<&str, (usize, i64)> = BTreeMap::new();
        for e in &run.events {
            if e.role == "manager" && e.input_messages.is_empty() {
                // a routing decision the protocol forced: no model call
                assert_eq!((e.tokens_in, e.tokens_out, e.latency_ms), (0, 0, 0.0));
                continue;
            }
            let msgs = &e.input_messages;
            assert_eq!(msgs[0].role, "system", "{}: role prompt first", run.task_id);
            assert_eq!(msgs.last().unwrap().role, "user");
            assert!(msgs[1].content.starts_with("Task (multihop): "), "{}", msgs[1].content);
            for pair in msgs[1..].chunks(2) {
                assert_eq!(pair[0].role, "user");
                if pair.len() == 2 {
                    assert_eq!(pair[1].role, "assistant");
                }
            }
            assert_eq!(e.tokens_in, estimate_messages(msgs), "{}: tokens_in", run.task_id);
            assert_eq!(e.tokens_out, estimate_text(&e.output));
            assert!(e.latency_ms > 0.0);
            if let Some((n, tin)) = last_len.get(e.agent.as_str()) {
                assert_eq!(msgs.len(), n + 2, "{}: {} re-reads its history plus one message", run.task_id, e.agent);
                assert!(e.tokens_in > *tin, "{}: {}'s context grows", run.task_id, e.agent);
            }
            last_len.insert(&e.agent, (msgs.len(), e.tokens_in));
        }
        assert!(run.tokens_in > 0 && run.tokens_out > 0 && run.latency_ms > 0.0);
    }
    // the verifier reads the evidence the crawl agent found
    let run = &runs[0];
    let check = run.events.iter().find(|e| e.role == "double_check").unwrap();
    let crawl = run.events.iter().rev().find(|e| e.role == "crawl_page").unwrap();
    assert!(check.input_messages.iter().any(|m| m.content.contains(crawl.observation.as_deref().unwrap())));
}

#[test]
fn noise_produces_failures_reflections_and_recoveries_at_the_configured_rates() {
    let (tasks, corpus) = common::tasks(Suite::Multihop, 400, 21);
    let run = |noise: Noise| stats(&common::run_scripted(&tasks, corpus.as_ref(), 3, noise, 2));

    let quiet = run(QUIET);
    assert_eq!(quiet.successes, 400, "a noiseless expert is always right: {}", quiet.to_json());
    assert_eq!((quiet.runs_with_reflection, quiet.runs_with_doubted_answer), (0, 0));

    // (a wrong pick needs a search hit that is neither the right page nor one the chain needs)
    let picks = run(Noise { wrong_pick: 1.0, ..QUIET });
    assert!(picks.runs_with_poor_reflection >= 390, "{}", picks.to_json());
    assert_eq!((picks.successes, picks.recoveries), (400, picks.runs_with_poor_reflection), "every wrong pick is recovered");

    let premature = run(Noise { premature: 1.0, ..QUIET });
    assert_eq!((premature.runs_with_doubted_answer, premature.successes), (400, 400), "{}", premature.to_json());

    for routine_reflection in [0.0, 1.0] {
        let give_up = run(Noise { give_up: 1.0, routine_reflection, ..QUIET });
        assert_eq!(give_up.successes, 0, "{}", give_up.to_json());
    }

    let d = run(Noise::default());
    let j = d.to_json();
    let rate = |x: u64| x as f64 / 400.0;
    let n = Noise::default();
    assert!((rate(400 - d.successes) - n.give_up).abs() < 0.05, "wrong-answer rate ~ give_up: {j}");
    assert!((rate(d.runs_with_doubted_answer) - n.premature * (1.0 - n.give_up)).abs() < 0.05, "{j}");
    // a wrong pick happens on each searched hop with probability wrong_pick (2-4 searched hops)
    let p = n.wrong_pick;
    assert!((1.5 * p..4.0 * p).contains(&rate(d.runs_with_poor_reflection)), "{j}");
    assert!(d.runs_with_reflection > d.runs_with_poor_reflection && d.runs_with_reflection < 350, "some runs reflect, some do not: {j}");
    assert!(d.recoveries > 80, "{j}");
    assert!(d.min_actions.unwrap() >= 5 && d.max_actions <= 30, "{j}");
}

#[test]
fn same_seed_same_runs_whatever_the_concurrency() {
    let (mut tasks, corpus) = common::tasks(Suite::Multihop, 120, 8);
    tasks.extend(common::tasks(Suite::Math, 6, 8).0);
    let one = common::run_scripted(&tasks, corpus.as_ref(), 42, Noise::default(), 1);
    let three = common::run_scripted(&tasks, corpus.as_ref(), 42, Noise::default(), 3);
    assert_eq!(one, three);
    let other = common::run_scripted(&tasks, corpus.as_ref(), 43, Noise::default(), 3);
    assert_ne!(one, other, "the seed matters");
}

#[test]
fn success_is_really_checked() {
    let (mut tasks, corpus) = common::tasks(Suite::Multihop, 30, 2);
    for t in &mut tasks {
        t.answers = vec!["Nobody In Particular".to_string()];
    }
    let runs = common::run_scripted(&tasks, corpus.as_ref(), 1, QUIET, 2);
    assert!(runs.iter().all(|r| !r.success && r.final_answer.is_some()));

    let (mut math, _) = common::tasks(Suite::Math, 3, 2);
    for t in &mut math {
        t.answers = vec![format!("{}1", t.answers[0])];
    }
    assert!(common::run_scripted(&math, None, 1, QUIET, 1).iter().all(|r| !r.success));

    let (mut code, _) = common::tasks(Suite::Code, 3, 2);
    let ok = common::run_scripted(&code, None, 1, QUIET, 1);
    assert!(ok.iter().all(|r| r.success));
    for t in &mut code {
        t.test_code = Some(format!("{}\nassert False, 'hidden test'\n", t.test_code.as_deref().unwrap()));
    }
    assert!(common::run_scripted(&code, None, 1, QUIET, 1).iter().all(|r| !r.success));
}

#[test]
fn tasks_without_a_solution_path_are_refused_by_name() {
    let backend = ScriptedBackend::new(0, Noise::default()).unwrap();
    let (tasks, _) = common::tasks(Suite::Math, 1, 1);
    let mut t = tasks[0].clone();
    assert!(backend.check_task(&t).is_ok());
    t.solution = None;
    t.task_id = "aime24-3".into();
    let e = backend.check_task(&t).unwrap_err().to_string();
    assert!(e.contains("aime24-3") && e.contains("no solution path"), "{e}");
    t.solution = Some("{\"nope\": 1}".into());
    assert!(format!("{:#}", backend.check_task(&t).unwrap_err()).contains("not a math solution path"));
    t.suite = "qa".into();
    assert!(backend.check_task(&t).unwrap_err().to_string().contains("suite `qa`"));
}

#[test]
fn humaneval_tasks_are_solved_through_their_doctest_example() {
    let Some(path) = coa_tasks::external::file_or_skip("humaneval_tasks_are_solved_through_their_doctest_example", "HumanEval.jsonl.gz") else { return };
    let tasks = coa_tasks::import::import_file(&path, None).unwrap();
    let runs = common::run_scripted(&tasks[..3], None, 1, Noise::default(), 2);
    for r in &runs {
        common::check_run(r);
        assert!(r.success, "{}: {:?}", r.task_id, common::trace(r));
        let code = r.events.iter().find(|e| e.role == "code").unwrap();
        assert!(code.observation.as_deref().unwrap().contains("example passed: True"), "{}", code.observation.as_deref().unwrap());
    }
}

/// The summary's success by hop count: per hop count, the runs of that count's tasks and their
/// success, adding up to the suite's.
#[test]
fn the_summary_counts_success_by_hop_count() {
    let (tasks, corpus) = common::tasks(Suite::Multihop, 120, 5);
    let runs = common::run_scripted(&tasks, corpus.as_ref(), 1, Noise::default(), 2);
    let mut s = RunStats::default();
    for (r, t) in runs.iter().zip(&tasks) {
        s.add(r, t.hops);
    }
    let json = s.to_json();
    let by = json["suites"]["multihop"]["by_hops"].as_object().expect("by_hops");
    let hops: Vec<&str> = by.keys().map(String::as_str).collect();
    assert_eq!(hops, ["2", "3", "4", "5"]);
    let total: u64 = by.values().map(|v| v["runs"].as_u64().unwrap()).sum();
    assert_eq!(total, 120);
    for (h, v) in by {
        let of_h: Vec<&MasRun> = runs.iter().zip(&tasks).filter(|(_, t)| t.hops == h.parse().ok()).map(|(r, _)| r).collect();
        let rate = of_h.iter().filter(|r| r.success).count() as f64 / of_h.len() as f64;
        assert!((v["success_rate"].as_f64().unwrap() - rate).abs() < 1e-4, "{h} hops");
    }
    assert_eq!(json["counts"]["per_suite_hops"]["multihop"]["2"][0], by["2"]["runs"]);
    // Tasks without a hop count (math, code) get none.
    let (math, _) = common::tasks(Suite::Math, 5, 5);
    let mut m = RunStats::default();
    for (r, t) in common::run_scripted(&math, None, 1, Noise::default(), 2).iter().zip(&math) {
        m.add(r, t.hops);
    }
    assert!(m.to_json()["suites"]["math"].get("by_hops").is_none());
}
