//! `coa-score` end to end on real task files (`$COA_EXTERNAL_DATA`; each test prints a `skipped:`
//! line without them): the binary reads rollouts and tasks, writes scores with rewards and group
//! advantages, and the eval report; bad input is named.

use std::path::Path;
use std::process::Command;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Float32Type;
use coa_schemas::io::{self, Provenance};
use coa_schemas::rows::{self, Rollout, Task};
use coa_schemas::tables::{ROLLOUTS, SCORES, TASKS};

/// The first task of the real file `name`, or `None` after the test's skip line.
fn first_task(test: &str, name: &str) -> Option<Task> {
    let path = coa_tasks::external::file_or_skip(test, name)?;
    Some(coa_tasks::import::import_file(&path, None).unwrap().remove(0))
}

fn prov() -> Provenance {
    Provenance { stage: "test".into(), version: "0".into(), args: vec![], seed: None, inputs: vec![] }
}

fn web_text(answer: &str) -> String {
    format!(
        "<think>t</think>\n<plan>find it</plan>\n<think>t</think>\n<web_search>q</web_search>\n<observation>o</observation>\n\
         <think>t</think>\n<suggested_answer>{answer}</suggested_answer>\n<think>t</think>\n<double_check>score: 4</double_check>\n\
         <answer>{answer}</answer>"
    )
}

/// AFM's code-agent order: plan, (think, code, observation, reflection)*, think, answer.
fn code_text(answer: &str) -> String {
    format!(
        "<plan>p</plan>\n<think>b</think>\n<code>\n```py\nprint(1)\n```\n</code>\n<observation>1</observation>\n\
         <reflection>ok</reflection>\n<think>c</think>\n<answer>{answer}</answer>"
    )
}

fn rollout(task: &Task, idx: i32, text: String, len: usize) -> Rollout {
    Rollout {
        task_id: task.task_id.clone(),
        suite: task.suite.clone(),
        sample_idx: idx,
        model: "m".into(),
        prompt_ids: vec![1, 2],
        response_ids: vec![5; len],
        loss_mask: vec![1; len],
        logprobs: vec![-0.5; len],
        response_text: text,
        turns: 2,
        tool_calls: 1,
        finish_reason: "answer".into(),
    }
}

fn write<R: rows::Row>(path: &Path, rows: &[R], table: &'static coa_schemas::tables::Table) {
    io::write_all(Some(path), None, &table.schema(), &[rows::to_batch(rows).unwrap()], &prov()).unwrap();
}

fn score(dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_coa-score"))
        .args(["-i", dir.join("rollouts.parquet").to_str().unwrap(), "--tasks", dir.join("tasks.parquet").to_str().unwrap()])
        .args(["-o", dir.join("scores.parquet").to_str().unwrap(), "--report", dir.join("eval.json").to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn rewards_advantages_and_report_on_real_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let test = "rewards_advantages_and_report_on_real_tasks";
    let (Some(math), Some(code), Some(nq)) =
        (first_task(test, "math500.parquet"), first_task(test, "HumanEval.jsonl.gz"), first_task(test, "nq_full.jsonl"))
    else {
        return;
    };
    write(&dir.path().join("tasks.parquet"), &[math.clone(), code.clone(), nq.clone()], &TASKS);

    let gold = &math.answers[0];
    let program: serde_json::Value = serde_json::from_str(code.solution.as_deref().unwrap()).unwrap();
    let program = program["code"].as_str().unwrap();
    let rollouts = vec![
        rollout(&math, 0, code_text(&format!("\\boxed{{{gold}}}")), 100), // right
        rollout(&math, 1, code_text("\\boxed{123456789}"), 100),          // wrong
        rollout(&math, 2, format!("<think>x</think><answer>\\boxed{{{gold}}}</answer>"), 100), // right answer, bad format
        rollout(&math, 3, code_text(&format!("\\boxed{{{gold}}}")), 3800), // right, in the overlong band
        rollout(&code, 0, code_text(&format!("```python\n{program}\n```")), 50),
        rollout(&code, 1, code_text("```python\ndef nope():\n    pass\n```"), 50),
        rollout(&nq, 0, web_text(&nq.answers[0]), 10),
        rollout(&nq, 1, web_text("certainly not the answer"), 10),
    ];
    write(&dir.path().join("rollouts.parquet"), &rollouts, &ROLLOUTS);

    let out = score(dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let reader = io::open(Some(&dir.path().join("scores.parquet")), &SCORES).unwrap();
    let batches: Vec<RecordBatch> = reader.collect::<anyhow::Result<_>>().unwrap();
    let b = &batches[0];
    let col = |n: &str| b.column_by_name(n).unwrap().clone();
    let correct: Vec<bool> = col("correct").as_boolean().iter().map(|v| v.unwrap()).collect();
    let format_ok: Vec<bool> = col("format_ok").as_boolean().iter().map(|v| v.unwrap()).collect();
    let reward: Vec<f32> = col("reward").as_primitive::<Float32Type>().values().to_vec();
    let overlong: Vec<f32> = col("overlong").as_primitive::<Float32Type>().values().to_vec();
    let adv: Vec<f32> = col("advantage").as_primitive::<Float32Type>().values().to_vec();
    let f1 = col("f1");
    assert_eq!(correct, [true, false, true, true, true, false, true, false], "{stderr}");
    assert_eq!(format_ok, [true, true, false, true, true, true, true, true], "{stderr}");
    // Lmax 4096, Lcache 512: 3800 tokens is (3584 - 3800) / 512 into the band.
    assert!((overlong[3] - (3584.0 - 3800.0) / 512.0).abs() < 1e-6);
    assert_eq!(&reward[..3], &[1.0, 0.0, -1.0]);
    assert!((reward[3] - (1.0 + overlong[3])).abs() < 1e-6);
    // Group advantages: per task, mean zero, the best sample highest.
    assert!((adv[..4].iter().sum::<f32>()).abs() < 1e-4);
    assert!(adv[0] > adv[3] && adv[3] > adv[1] && adv[1] > adv[2], "{adv:?}");
    assert!(adv[4] > 0.0 && adv[5] < 0.0 && (adv[4] + adv[5]).abs() < 1e-4);
    // F1 only for QA.
    assert!(f1.is_null(0) && f1.is_null(4));
    assert_eq!(f1.as_primitive::<Float32Type>().value(6), 1.0);
    assert!(f1.as_primitive::<Float32Type>().value(7) < 1.0);

    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("eval.json")).unwrap()).unwrap();
    let math_line = report.as_array().unwrap().iter().find(|l| l["suite"] == "math").unwrap();
    assert_eq!(math_line["pass_at_1"], 0.75);
    assert_eq!(math_line["pass_at_k"], 1.0);
    assert_eq!(math_line["format_error_rate"], 0.25);
    assert!(stderr.contains("| math | m | 1 | 4 | 75.0% | 100.0% |"), "{stderr}");
    // Tokens are prompt (2) + response: math spent 4 * 2 + 100 + 100 + 100 + 3800 on 3 solves.
    assert_eq!(math_line["tokens_per_task"], 1027.0);
    assert_eq!(math_line["tokens_per_solved"], 4108.0 / 3.0);
}

/// A code task: write `add(a, b)`, checked by two asserts.
fn add_task() -> Task {
    Task {
        task_id: "code-1".into(),
        suite: "code".into(),
        question: "Write add(a, b).".into(),
        test_code: Some("assert add(2, 3) == 5\nassert add(-1, 1) == 0\n".into()),
        ..Default::default()
    }
}

#[test]
fn the_sandbox_verdict_is_recorded_and_early_exits_do_not_pass() {
    let dir = tempfile::tempdir().unwrap();
    let code = add_task();
    let math = Task { task_id: "math-1".into(), suite: "math".into(), question: "1 + 1?".into(), answers: vec!["2".into()], ..Default::default() };
    write(&dir.path().join("tasks.parquet"), &[code.clone(), math.clone()], &TASKS);
    let program = |body: &str| code_text(&format!("```python\n{body}\n```"));
    let rollouts = vec![
        rollout(&code, 0, program("def add(a, b):\n    return a + b"), 50),
        rollout(&code, 1, program("import os\nos._exit(0)"), 50),
        rollout(&code, 2, program("def add(a, b):\n    raise SystemExit(0)"), 50),
        rollout(&code, 3, program("import time\nwhile True:\n    time.sleep(1)"), 50),
        rollout(&code, 4, program("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"), 50),
        rollout(&code, 5, program("import sys\nwhile True:\n    sys.stdout.write('y' * 65536)"), 50),
        rollout(&code, 6, program("def add(a, b):\n    return a - b"), 50),
        // The right answer, from a run whose processes together hold more than its 1 GiB.
        rollout(&code, 7, program("import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        held = b'x' * (400 << 20)\n        time.sleep(1)\n        os._exit(0)\nfor _ in range(4):\n    os.wait()\ndef add(a, b):\n    return a + b"), 50),
        rollout(&math, 0, code_text("\\boxed{2}"), 50),
    ];
    write(&dir.path().join("rollouts.parquet"), &rollouts, &ROLLOUTS);
    let out = score(dir.path(), &["--code-timeout", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let batches: Vec<RecordBatch> = io::open(Some(&dir.path().join("scores.parquet")), &SCORES).unwrap().collect::<anyhow::Result<_>>().unwrap();
    let b = &batches[0];
    let correct: Vec<bool> = b.column_by_name("correct").unwrap().as_boolean().iter().map(|v| v.unwrap()).collect();
    let sandbox: Vec<Option<&str>> = b.column_by_name("sandbox").unwrap().as_string::<i32>().iter().collect();
    assert_eq!(correct, [true, false, false, false, false, false, false, false, true], "{stderr}");
    assert_eq!(
        sandbox,
        [Some("passed"), Some("failed"), Some("failed"), Some("timed_out"), Some("killed"), Some("output_limit"), Some("failed"), Some("killed"), None],
        "{stderr}"
    );
}

#[test]
fn unknown_tasks_and_ragged_rows_are_named() {
    let dir = tempfile::tempdir().unwrap();
    // A made-up task: these are checks of the input, which need no real file.
    let math = Task {
        task_id: "math-0".into(),
        suite: "math".into(),
        split: "test".into(),
        source: "synthetic".into(),
        question: "What is 1 + 1?".into(),
        answers: vec!["2".into()],
        tools: vec!["code".into()],
        ..Task::default()
    };
    write(&dir.path().join("tasks.parquet"), std::slice::from_ref(&math), &TASKS);
    let mut stranger = rollout(&math, 0, code_text("\\boxed{1}"), 5);
    stranger.task_id = "who-is-this".into();
    write(&dir.path().join("rollouts.parquet"), &[stranger], &ROLLOUTS);
    let out = score(dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("who-is-this") && stderr.contains("--tasks"), "{stderr}");
    assert!(!dir.path().join("scores.parquet").exists(), "no partial output");

    let mut ragged = rollout(&math, 0, code_text("\\boxed{1}"), 5);
    ragged.loss_mask.pop();
    write(&dir.path().join("rollouts.parquet"), &[ragged], &ROLLOUTS);
    let out = score(dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("row 0") && stderr.contains("loss_mask 4"), "{stderr}");

    let out = score(dir.path(), &["--overlong-cache", "9999"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--overlong-cache 9999 is larger than --max-response-len 4096"), "{stderr}");
}

/// Attacks on the verdict itself (issue 43): programs that would make the tests pass without
/// solving the task (and one that copies the solution from the host's task file), each a real
/// row through `coa-score`, each scored wrong, on tasks of every
/// grading path: calls planned from asserts (a synthetic task, tolerance asserts, HumanEval/0,
/// a LiveCodeBench method task), a checker process (unittest-style tests, HumanEval/32 with its
/// random inputs and the prompt's `poly`) and stdin/stdout (LiveCodeBench). Each task's honest
/// program scores correct in the same table, so a task that cannot pass proves nothing. The
/// real-file tasks join when `$COA_EXTERNAL_DATA` has them (a `skipped:` line otherwise).
#[test]
fn attacks_on_the_verdict_score_wrong() {
    let test = "attacks_on_the_verdict_score_wrong";
    let dir = tempfile::tempdir().unwrap();
    let synthetic = coa_tasks::generate(coa_tasks::Suite::Code, 1, 0, coa_tasks::Split::Train).unwrap().tasks.remove(0);
    let custom = |id: &str, entry: &str, tests: &str, gold: &str| Task {
        task_id: id.into(),
        suite: "code".into(),
        source: "synthetic".into(),
        question: format!("Write {entry}."),
        entry_point: Some(entry.into()),
        test_code: Some(tests.into()),
        solution: Some(serde_json::json!({ "code": gold }).to_string()),
        ..Default::default()
    };
    let mut tasks = vec![
        synthetic,
        custom(
            "tolerance",
            "root",
            "import math\n\ndef check(candidate):\n    assert abs(candidate(2.0) - 1.4142135) < 1e-6\n    assert math.isclose(candidate(9.0), 3.0)\n\ncheck(root)\n",
            "def root(x):\n    return x ** 0.5\n",
        ),
        custom(
            "unittest",
            "double",
            "import unittest\n\nclass TestDouble(unittest.TestCase):\n    def test_values(self):\n        for x in range(5):\n            self.assertEqual(double(x), 2 * x)\n\n\
             result = unittest.main(argv=['tests'], exit=False).result\nassert result.wasSuccessful()\n",
            "def double(x):\n    return 2 * x\n",
        ),
    ];
    // A HumanEval-layout task whose tests call a helper of its prompt (as HumanEval/38 calls
    // `encode_cyclic`), through the importer.
    let demo = dir.path().join("demo.jsonl");
    let line = serde_json::json!({
        "task_id": "Demo/0",
        "prompt": "def shift(s: str):\n    return s[1:] + s[:1]\n\n\ndef unshift(s: str):\n    \"\"\"Undo shift.\"\"\"\n",
        "entry_point": "unshift",
        "canonical_solution": "    return s[-1:] + s[:-1]\n",
        "test": "def check(candidate):\n    for w in ['abc', 'hello', 'xy', 'a']:\n        assert candidate(shift(w)) == w\n",
    });
    std::fs::write(&demo, format!("{line}\n")).unwrap();
    tasks.extend(coa_tasks::import::import_file(&demo, None).unwrap());
    let humaneval = coa_tasks::external::file_or_skip(test, "HumanEval.jsonl.gz");
    if let Some(path) = &humaneval {
        let all = coa_tasks::import::import_file(path, None).unwrap();
        tasks.extend(all.into_iter().filter(|t| ["humaneval-0", "humaneval-32", "humaneval-38", "humaneval-50"].contains(&t.task_id.as_str())));
    }
    if let Some(path) = coa_tasks::external::file_or_skip(test, "livecodebench_v4.parquet") {
        let all = coa_tasks::import::import_file(&path, None).unwrap();
        tasks.push(all.iter().find(|t| t.test_code.is_some()).unwrap().clone());
        tasks.push(all.iter().find(|t| !t.stdio_tests.is_empty()).unwrap().clone());
    }
    write(&dir.path().join("tasks.parquet"), &tasks, &TASKS);

    // Each attack defines the entry point (`ENTRY`) and a `Solution` whose every method is it.
    let stub = "ENTRY = _attack\nclass Solution:\n    def __getattr__(self, name):\n        return _attack\n";
    let attacks: Vec<(&str, String)> = vec![
        ("an object whose __eq__ is always true", format!("def _attack(*args, **kwargs):\n    class Anything:\n        def __eq__(self, other):\n            return True\n        def __ne__(self, other):\n            return False\n        def __bool__(self):\n            return True\n        def __sub__(self, other):\n            return 0\n        def __abs__(self):\n            return 0\n        __hash__ = None\n    return Anything()\n{stub}")),
        ("patched builtins and math", format!("import builtins, math\nbuiltins.abs = lambda x: 0\nmath.isclose = lambda *a, **k: True\nbuiltins.isinstance = lambda *a: True\ndef _attack(*args, **kwargs):\n    return 0.0\n{stub}")),
        ("patched unittest and sys.modules", format!("import sys, types, unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n\
            class Passed:\n    def wasSuccessful(self):\n        return True\nfake = types.ModuleType('unittest')\nfake.TestCase = object\nfake.main = lambda *a, **k: types.SimpleNamespace(result=Passed())\n\
            sys.modules['unittest'] = fake\ndef _attack(*args, **kwargs):\n    return None\n{stub}")),
        ("the expected constant read from the caller's frame", format!("import dis, sys\ndef _attack(*args, **kwargs):\n    frame = sys._getframe(1)\n    \
            after = [i for i in dis.get_instructions(frame.f_code) if i.offset > frame.f_lasti]\n    \
            for i, ins in enumerate(after):\n        if ins.opname == 'COMPARE_OP':\n            break\n        if ins.opname == 'LOAD_CONST':\n            \
            nxt = after[i + 1].opname if i + 1 < len(after) else ''\n            return list(ins.argval) if nxt == 'LIST_EXTEND' else ins.argval\n    return None\n{stub}")),
        ("an audit hook reading the test source", format!("import ast, sys\nsources = []\n\
            sys.addaudithook(lambda event, args: sources.append(args[0]) if event in ('compile', 'exec') and isinstance(args[0], (str, bytes)) else None)\n\
            def _attack(*args, **kwargs):\n    for source in list(sources):\n        try:\n            tree = ast.parse(source)\n        except Exception:\n            continue\n        \
            for node in ast.walk(tree):\n            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):\n                try:\n                    \
            if [ast.literal_eval(a) for a in node.left.args] == list(args):\n                        return ast.literal_eval(node.comparators[0])\n                \
            except Exception:\n                    pass\n    return None\n{stub}")),
        ("a child reading its parent's memory through /proc/<parent>/mem", format!("import os, subprocess, sys\n\
            reader = r'''\nimport re, sys\npid = sys.argv[1]\nfound = set()\nfor line in open('/proc/%s/maps' % pid):\n    span, perms = line.split()[:2]\n    \
            if not perms.startswith('rw'):\n        continue\n    a, b = (int(x, 16) for x in span.split('-'))\n    try:\n        with open('/proc/%s/mem' % pid, 'rb') as m:\n            \
            m.seek(a)\n            found.update(re.findall(rb'(?<![0-9a-f])[0-9a-f]{{32}}(?![0-9a-f])', m.read(b - a)))\n    except (OSError, ValueError, OverflowError):\n        pass\n\
            for f in found:\n    sys.stdout.write('\\n' + f.decode() + '\\n')\n'''\n\
            sys.stdout.flush()\nsubprocess.run([sys.executable, '-c', reader, str(os.getpid())])\nos._exit(0)\ndef _attack(*args, **kwargs):\n    return None\n{stub}")),
        ("the prompt's helpers redefined (an identity encoder, a zero polynomial)", format!("def shift(s):\n    return s\ndef encode_cyclic(s):\n    return s\n\
            def encode_shift(s):\n    return s\ndef poly(xs, x):\n    return 0.0\ndef _attack(*args, **kwargs):\n    return args[0] if args else None\n{stub}")),
    ];
    // The host's copy of the benchmark, canonical solutions included: out of sight in the
    // sandbox's minimal root (readable, read-only, before it).
    let mut attacks = attacks;
    if let Some(path) = &humaneval {
        let path = std::fs::canonicalize(path).unwrap();
        attacks.push(("the canonical solution read from the host's task file", format!("import gzip, json
def _load():
    \
            for line in gzip.open({:?}, 'rt'):
        task = json.loads(line)
        if task['entry_point'] == 'ENTRY':
            \
            scope = {{}}
            exec(task['prompt'] + task['canonical_solution'], scope)
            return scope['ENTRY']
    raise LookupError('ENTRY')
\
            try:
    _attack = _load()
except Exception:
    def _attack(*args, **kwargs):
        return None
{stub}", path.display().to_string())));
    }
    let program = |body: &str| code_text(&format!("```python\n{body}\n```"));
    let mut rollouts = Vec::new();
    for t in &tasks {
        rollouts.push(rollout(t, 0, program(&coa_rewards::gold::gold_answer(t).map(|g| coa_rewards::extract_program(&g)).unwrap()), 50));
        let entry = t.entry_point.as_deref().unwrap_or("solve");
        for (i, (_, attack)) in attacks.iter().enumerate() {
            rollouts.push(rollout(t, 1 + i as i32, program(&attack.replace("ENTRY", entry)), 50));
        }
    }
    write(&dir.path().join("rollouts.parquet"), &rollouts, &ROLLOUTS);
    let out = score(dir.path(), &["--code-timeout", "20"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let batches: Vec<RecordBatch> = io::open(Some(&dir.path().join("scores.parquet")), &SCORES).unwrap().collect::<anyhow::Result<_>>().unwrap();
    let b = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let correct: Vec<bool> = b.column_by_name("correct").unwrap().as_boolean().iter().map(|v| v.unwrap()).collect();
    let mut wrong = Vec::new();
    for (row, r) in rollouts.iter().enumerate() {
        let what = if r.sample_idx == 0 { "the honest program" } else { attacks[r.sample_idx as usize - 1].0 };
        if correct[row] != (r.sample_idx == 0) {
            wrong.push(format!("{}: {what} scored correct={}", r.task_id, correct[row]));
        }
    }
    assert!(wrong.is_empty(), "{}\n{stderr}", wrong.join("\n"));
    eprintln!("{test}: {} attacks on {} tasks scored wrong, their honest programs right", attacks.len(), tasks.len());
}

/// The stats say what the code sandbox enforces here. Where the machine (here the environment)
/// withholds a protection the stage refuses to grade code, naming it, unless `--weaker-sandbox`
/// accepts the weaker set: then it grades and says so on stderr and in `sandbox_missing`.
#[test]
fn the_stats_say_which_sandbox_protections_hold_and_a_weaker_sandbox_needs_a_flag() {
    let dir = tempfile::tempdir().unwrap();
    let code = Task { task_id: "c".into(), suite: "code".into(), test_code: Some("assert f() == 1\n".into()), ..Default::default() };
    write(&dir.path().join("tasks.parquet"), std::slice::from_ref(&code), &TASKS);
    write(&dir.path().join("rollouts.parquet"), &[rollout(&code, 0, code_text("```python\ndef f():\n    return 1\n```"), 5)], &ROLLOUTS);
    let (stats, scores) = (dir.path().join("stats.json"), dir.path().join("scores.parquet"));
    let read_stats = || -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap() };
    let here = coa_tools::isolation();
    let weaker = if here.missing().is_empty() { vec![] } else { vec!["--weaker-sandbox"] };
    let out = score(dir.path(), &[&["--stats", stats.to_str().unwrap()][..], &weaker].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read_stats()["sandbox"], here.describe());
    assert_eq!(read_stats()["sandbox_missing"], here.missing().join(", "));
    std::fs::remove_file(&scores).unwrap();
    let without_seccomp = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_coa-score"))
            .args(["-i", dir.path().join("rollouts.parquet").to_str().unwrap(), "--tasks", dir.path().join("tasks.parquet").to_str().unwrap()])
            .args(["-o", scores.to_str().unwrap(), "--stats", stats.to_str().unwrap()])
            .args(extra)
            .env("COA_SANDBOX_SECCOMP", "0")
            .output()
            .unwrap()
    };
    let out = without_seccomp(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("runs without") && stderr.contains("seccomp") && stderr.contains("--weaker-sandbox"), "{stderr}");
    assert!(!scores.exists(), "no partial output");
    let out = without_seccomp(&["--weaker-sandbox"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("coa-score: --weaker-sandbox: the code sandbox runs without") && stderr.contains("seccomp"), "{stderr}");
    assert!(read_stats()["sandbox_missing"].as_str().unwrap().contains("seccomp"), "{}", read_stats());
    assert!(read_stats()["sandbox"].as_str().unwrap().contains("no seccomp filter"), "{}", read_stats());
}

/// `--plain` (rollouts of `coa-generate policy --plain`): the last `\boxed{}` is the answer of a
/// math or QA task, the last fenced block the program of a code task; no grammar is checked. The
/// same texts graded as CoA answers have no `<answer>` and score wrong, with a format error.
#[test]
fn plain_answers_are_the_last_box_or_the_last_code_block() {
    let dir = tempfile::tempdir().unwrap();
    let code = add_task();
    let math = Task { task_id: "math-1".into(), suite: "math".into(), question: "Half of 1?".into(), answers: vec!["\\frac{1}{2}".into()], ..Default::default() };
    let qa = Task { task_id: "qa-1".into(), suite: "qa".into(), question: "Capital of France?".into(), answers: vec!["Paris".into()], ..Default::default() };
    write(&dir.path().join("tasks.parquet"), &[code.clone(), math.clone(), qa.clone()], &TASKS);
    let rollouts = vec![
        // A draft first, the final program last: the last block is graded.
        rollout(&code, 0, "A draft:\n```python\ndef add(a, b):\n    return a - b\n```\nFixed:\n```python\ndef add(a, b):\n    return a + b\n```\n".into(), 40),
        rollout(&code, 1, "```python\ndef add(a, b):\n    return a + b\n```\nOops:\n```python\ndef add(a, b):\n    return 0\n```".into(), 40),
        // The last box (an earlier one far enough before it, without a list separator, is a
        // draft; boxes listed together are one several-part answer, as math-verify reads them).
        rollout(&math, 0, "First I guessed \\boxed{1}. Checking it again shows it was wrong. The half is \\boxed{0.5}.".into(), 20),
        rollout(&math, 1, "It is \\boxed{\\frac{1}{2}}, or maybe \\boxed{2}.".into(), 20),
        rollout(&math, 2, "The answer is 1/2.".into(), 20), // no box: no answer
        rollout(&qa, 0, "It is \\boxed{Paris}.".into(), 10),
    ];
    write(&dir.path().join("rollouts.parquet"), &rollouts, &ROLLOUTS);
    let read = |name: &str| -> Vec<bool> {
        let batches: Vec<RecordBatch> = io::open(Some(&dir.path().join("scores.parquet")), &SCORES).unwrap().collect::<anyhow::Result<_>>().unwrap();
        batches[0].column_by_name(name).unwrap().as_boolean().iter().map(|v| v.unwrap()).collect()
    };
    let out = score(dir.path(), &["--plain", "--code-timeout", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(read("correct"), [true, false, true, false, false, true], "{stderr}");
    assert_eq!(read("format_ok"), [true; 6]);

    std::fs::remove_file(dir.path().join("scores.parquet")).unwrap();
    let out = score(dir.path(), &["--code-timeout", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read("correct"), [false; 6]);
    assert_eq!(read("format_ok"), [false; 6]);
}
