//! `coa-generate mas` end to end: the real binary on a small generated task set.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use coa_agents::MasRun;
use coa_schemas::io::{self, Provenance};
use coa_schemas::rows::{self, Row, Task};
use coa_schemas::tables::{CORPUS, MAS_RUNS};
use coa_tasks::{Split, Suite};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coa-generate"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// 30 multihop + 4 math + 4 code tasks and the multihop corpus, as Parquet files in `dir`.
fn task_files(dir: &Path) -> (PathBuf, PathBuf, Vec<Task>) {
    let web = coa_tasks::generate(Suite::Multihop, 30, 4, Split::Train).unwrap();
    let mut tasks = web.tasks;
    tasks.extend(coa_tasks::generate(Suite::Math, 4, 4, Split::Train).unwrap().tasks);
    tasks.extend(coa_tasks::generate(Suite::Code, 4, 4, Split::Train).unwrap().tasks);
    let prov = Provenance { stage: "test".into(), ..Default::default() };
    let tasks_path = dir.join("tasks.parquet");
    io::write_all(Some(&tasks_path), None, &Task::table().schema(), &[rows::to_batch(&tasks).unwrap()], &prov).unwrap();
    let corpus_path = dir.join("corpus.parquet");
    io::write_all(Some(&corpus_path), None, &CORPUS.schema(), &[rows::to_batch(&web.corpus).unwrap()], &prov).unwrap();
    (tasks_path, corpus_path, tasks)
}

fn read_runs(path: &Path) -> Vec<MasRun> {
    let (_, batches) = io::read_all(Some(path), &MAS_RUNS).unwrap();
    batches.iter().flat_map(|b| coa_agents::event::from_batch(b).unwrap()).collect()
}

#[test]
fn runs_the_teacher_on_a_task_file_and_writes_mas_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks_path, corpus_path, tasks) = task_files(dir.path());
    let out = dir.path().join("runs.parquet");
    let stats = dir.path().join("stats.json");
    let o = run(&[
        "mas", "-i", tasks_path.to_str().unwrap(), "--corpus", corpus_path.to_str().unwrap(), "-o", out.to_str().unwrap(),
        "--seed", "3", "--concurrency", "2", "--stats", stats.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "data goes to the file, not stdout");
    let runs = read_runs(&out);
    assert_eq!(runs.len(), tasks.len());
    for (r, t) in runs.iter().zip(&tasks) {
        assert_eq!((&r.task_id, &r.suite, &r.question, &r.answers), (&t.task_id, &t.suite, &t.question, &t.answers));
        assert_eq!((r.backend.as_str(), r.simulator), ("scripted", true));
        assert!(r.events.len() >= 8 && r.final_answer.is_some());
        assert!(r.events.iter().any(|e| e.role == "answer"));
    }
    let successes = runs.iter().filter(|r| r.success).count();
    assert!(successes >= 26 && successes < runs.len() + 1, "{successes}");

    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(summary["stage"], "coa-generate mas");
    assert_eq!((summary["rows_in"].as_u64(), summary["rows_out"].as_u64()), (Some(38), Some(38)));
    let rate = summary["success_rate"].as_f64().unwrap();
    assert!((rate - successes as f64 / 38.0).abs() < 1e-3, "{summary}");
    for key in ["mean_events", "mean_actions", "tokens_per_task", "reflection_rate", "suites"] {
        assert!(summary.get(key).is_some(), "summary has {key}: {summary}");
    }
    assert_eq!(summary["backend"], "scripted");

    // provenance: the tasks and corpus inputs and the seed
    let meta = provenance_json(&out);
    assert!(meta.contains("\"stage\":\"coa-generate mas\"") && meta.contains("\"seed\":3") && meta.contains("corpus.parquet"), "{meta}");
}

fn provenance_json(path: &Path) -> String {
    let reader = io::open(Some(path), &MAS_RUNS).unwrap();
    serde_json::to_string(&reader.provenance().unwrap()).unwrap()
}

#[test]
fn same_seed_same_bytes_and_the_same_runs_at_any_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    task_files(dir.path());
    // the same arguments (relative paths, run from sibling directories), so the provenance matches too
    let go = |sub: &str, threads: &str| {
        let cwd = dir.path().join(sub);
        std::fs::create_dir(&cwd).unwrap();
        let o = bin()
            .current_dir(&cwd)
            .args(["mas", "-i", "../tasks.parquet", "--corpus", "../corpus.parquet", "-o", "runs.parquet", "--seed", "9", "--concurrency", threads])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        cwd.join("runs.parquet")
    };
    let a = go("a", "2");
    let b = go("b", "2");
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "byte-identical output");
    let c = go("c", "1");
    assert_eq!(read_runs(&a), read_runs(&c));
}

#[test]
fn pipes_tasks_in_and_runs_out() {
    let mut tasks = bin().args(["tasks", "--suite", "math", "--n", "3", "--seed", "2"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut mas = bin()
        .args(["mas", "--concurrency", "2"])
        .stdin(tasks.stdout.take().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // bounded: a stage that never finishes reading its stdin fails the test instead of hanging it
    let mut stdout = mas.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).unwrap();
        v
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = mas.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            mas.kill().unwrap();
            let _ = mas.wait();
            panic!("`coa-generate mas` reading tasks from a pipe did not finish in 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(tasks.wait().unwrap().success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut mas.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    let out = reader.join().unwrap();
    let reader = io::open_bytes("stdout", out.into(), Some(&MAS_RUNS)).unwrap();
    let runs: Vec<MasRun> = reader.flat_map(|b| coa_agents::event::from_batch(&b.unwrap()).unwrap()).collect();
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|r| r.suite == "math" && r.final_answer.as_deref().is_some_and(|a| a.starts_with("\\boxed{"))));
}

#[test]
fn clear_errors_and_no_partial_output() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks_path, corpus_path, _) = task_files(dir.path());
    let out = dir.path().join("runs.parquet");
    let (t, c, o_) = (tasks_path.to_str().unwrap(), corpus_path.to_str().unwrap(), out.to_str().unwrap());

    let o = run(&["mas", "-i", t, "-o", o_]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--corpus FILE is required") && stderr(&o).contains("multihop-train-000000"), "{}", stderr(&o));
    assert!(!out.exists(), "no partial output");

    let o = run(&["mas", "-i", t, "--corpus", c, "--noise-give-up", "1.5"]);
    assert!(!o.status.success() && stderr(&o).contains("not a probability"), "{}", stderr(&o));

    let o = run(&["mas", "-i", t, "--corpus", c, "--backend", "openai"]);
    assert!(!o.status.success() && stderr(&o).contains("--base-url"), "{}", stderr(&o));

    let o = run(&["mas", "-i", t, "--corpus", c, "--model", "gpt"]);
    assert!(!o.status.success() && stderr(&o).contains("--model is an option of --backend openai"), "{}", stderr(&o));

    let o = run(&["mas", "-i", t, "--corpus", c, "--backend", "openai", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--noise-premature", "0.5"]);
    assert!(!o.status.success() && stderr(&o).contains("--noise-premature is an option of the scripted expert"), "{}", stderr(&o));

    let o = run(&["mas", "-i", c, "--corpus", c]);
    assert!(!o.status.success() && stderr(&o).contains("tasks"), "a corpus is not a tasks table: {}", stderr(&o));

    let o = run(&["mas", "-i", t, "--corpus", c, "--backend", "openai", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--api-key-env", "COA_TEST_SURELY_UNSET"]);
    assert!(!o.status.success() && stderr(&o).contains("COA_TEST_SURELY_UNSET"), "{}", stderr(&o));
}

#[test]
fn an_unreachable_endpoint_is_a_clear_error_after_the_retries() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = coa_tasks::generate(Suite::Math, 2, 1, Split::Train).unwrap().tasks;
    let path = dir.path().join("t.parquet");
    io::write_all(Some(&path), None, &Task::table().schema(), &[rows::to_batch(&tasks).unwrap()], &Provenance::default()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(); // closed again at once
    let url = format!("http://127.0.0.1:{port}/v1");
    let o = run(&["mas", "-i", path.to_str().unwrap(), "--backend", "openai", "--base-url", &url, "--model", "m", "--max-retries", "1", "--timeout", "2", "-o", dir.path().join("o.parquet").to_str().unwrap()]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("giving up after 2 tries") && e.contains("connection"), "{e}");
    assert!(!dir.path().join("o.parquet").exists());
}

/// A one-thread HTTP endpoint on 127.0.0.1 for `n` requests: each request's headers and JSON body
/// go to `reply`, which answers with a status and a chat-completions `content`.
fn endpoint(n: usize, reply: fn(&str, &serde_json::Value) -> (u16, String)) -> (String, std::thread::JoinHandle<Vec<String>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let mut heads = Vec::new();
        for stream in listener.incoming().take(n) {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let (mut head, mut len) = (String::new(), 0);
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line.trim().is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                head.push_str(&line);
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            let (status, content) = reply(&head, &serde_json::from_slice(&body).unwrap());
            let json = serde_json::json!({"choices": [{"message": {"role": "assistant", "content": content}}]}).to_string();
            let _ = write!(stream, "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}", json.len());
            heads.push(head);
        }
        heads
    });
    (url, handle)
}

/// The request heads `endpoint` saw, once it has served all its requests. The stage has exited by
/// then, so an endpoint still waiting got fewer requests than the test expects: a failure after
/// 30 s, not a hang.
fn served(server: std::thread::JoinHandle<Vec<String>>) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !server.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the endpoint got fewer requests than the test expects");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.join().unwrap()
}

/// A model for math tasks: plan, then answer 2 (task `m-fail` gets HTTP 400, which is not retried).
fn math_model(_: &str, req: &serde_json::Value) -> (u16, String) {
    let msgs = req["messages"].as_array().unwrap();
    let all: String = msgs.iter().map(|m| m["content"].as_str().unwrap()).collect();
    let last = msgs.last().unwrap()["content"].as_str().unwrap();
    if all.contains("FAIL") {
        return (400, "no".into());
    }
    if msgs[0]["content"].as_str().unwrap().contains("MANAGER") {
        return (200, "next: answer\nreason: done".into());
    }
    if last.ends_with("write the plan (revise it if the team went wrong).") {
        (200, "<plan>1. Add the numbers.</plan>".into())
    } else {
        (200, "<think>1 + 1 = 2.</think>\n<answer>\\boxed{2}</answer>".into())
    }
}

fn math_tasks(dir: &Path, questions: &[(&str, &str)]) -> PathBuf {
    let tasks: Vec<Task> = questions
        .iter()
        .map(|(id, q)| Task { task_id: id.to_string(), suite: "math".into(), split: "test".into(), question: q.to_string(), answers: vec!["2".into()], ..Default::default() })
        .collect();
    let path = dir.join("math.parquet");
    io::write_all(Some(&path), None, &Task::table().schema(), &[rows::to_batch(&tasks).unwrap()], &Provenance::default()).unwrap();
    path
}

#[test]
fn the_api_key_comes_from_openai_api_key_unless_a_flag_says_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = math_tasks(dir.path(), &[("m-1", "What is 1 + 1?")]);
    let out = dir.path().join("o.parquet");
    // (flags, OPENAI_API_KEY set, the bearer sent)
    let cases: [(&[&str], bool, Option<&str>); 4] = [
        (&[], true, Some("sk-from-the-environment")),
        (&[], false, None),
        (&["--api-key-env", "COA_TEST_ENDPOINT_KEY"], true, Some("sk-named")),
        (&["--no-api-key"], true, None),
    ];
    for (flags, openai_key, sent) in cases {
        let (url, server) = endpoint(3, math_model);
        let mut cmd = bin();
        cmd.args(["mas", "-i", tasks.to_str().unwrap(), "--backend", "openai", "--base-url", &url, "--model", "m", "-o", out.to_str().unwrap()])
            .args(flags)
            .env("COA_TEST_ENDPOINT_KEY", "sk-named");
        if openai_key {
            cmd.env("OPENAI_API_KEY", "sk-from-the-environment");
        } else {
            cmd.env_remove("OPENAI_API_KEY");
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{flags:?}: {}", stderr(&o));
        let heads = served(server);
        assert_eq!(heads.len(), 3, "plan, routing, answer");
        for head in &heads {
            let bearer = head.lines().find(|l| l.to_ascii_lowercase().starts_with("authorization:")).map(|l| l["authorization:".len()..].trim().trim_start_matches("Bearer ").to_string());
            assert_eq!(bearer.as_deref(), sent, "{flags:?}, OPENAI_API_KEY set: {openai_key}:\n{head}");
        }
        assert_eq!(read_runs(&out).len(), 1);
    }
    // --no-api-key and --api-key-env contradict each other
    let o = run(&["mas", "-i", tasks.to_str().unwrap(), "--backend", "openai", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--no-api-key", "--api-key-env", "X"]);
    assert!(!o.status.success() && stderr(&o).contains("--no-api-key") && stderr(&o).contains("--api-key-env"), "{}", stderr(&o));
}

#[test]
fn a_task_that_fails_is_recorded_and_skipped_up_to_max_failed() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = math_tasks(dir.path(), &[("m-1", "What is 1 + 1?"), ("m-fail", "FAIL: what is 1 + 1?"), ("m-3", "And 2 + 0?")]);
    let (out, stats) = (dir.path().join("o.parquet"), dir.path().join("s.json"));
    let (url, server) = endpoint(7, math_model);
    let args = ["mas", "-i", tasks.to_str().unwrap(), "--backend", "openai", "--base-url", &url, "--model", "m", "--concurrency", "1"];
    let o = bin().args(args).args(["-o", out.to_str().unwrap(), "--stats", stats.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("task m-fail failed and is left out") && stderr(&o).contains("HTTP 400"), "{}", stderr(&o));
    served(server);
    let runs = read_runs(&out);
    assert_eq!(runs.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(), ["m-1", "m-3"]);
    assert!(runs.iter().all(|r| r.success));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(summary["failed"], 1);
    assert_eq!(summary["failed_tasks"][0]["task_id"], "m-fail");

    // One failure more than allowed stops the stage, with no output.
    std::fs::remove_file(&out).unwrap();
    let (url, server) = endpoint(7, math_model);
    let args = ["mas", "-i", tasks.to_str().unwrap(), "--backend", "openai", "--base-url", &url, "--model", "m", "--concurrency", "1", "--max-failed", "0"];
    let o = bin().args(args).args(["-o", out.to_str().unwrap()]).output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("1 task(s) failed, more than --max-failed 0; the first: task m-fail"), "{}", stderr(&o));
    assert!(!out.exists());
    drop(server); // it waits for requests that never come once the stage has stopped
}

/// --max-failed is checked as each task fails: with N = 2 the third failure stops the stage and
/// no further task is sent (it was checked once per batch of 32 tasks, so 32 failed first).
#[test]
fn max_failed_stops_at_the_failure_past_it_not_a_batch_later() {
    let dir = tempfile::tempdir().unwrap();
    let questions: Vec<(String, String)> = (0..40).map(|k| (format!("m-fail-{k:02}"), format!("FAIL: what is {k} + 0?"))).collect();
    let refs: Vec<(&str, &str)> = questions.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let tasks = math_tasks(dir.path(), &refs);
    let out = dir.path().join("o.parquet");
    let (url, server) = endpoint(3, math_model);
    let args = ["mas", "-i", tasks.to_str().unwrap(), "--backend", "openai", "--base-url", &url, "--model", "m", "--concurrency", "1", "--max-failed", "2"];
    let o = bin().args(args).args(["-o", out.to_str().unwrap()]).output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("3 task(s) failed, more than --max-failed 2; the first: task m-fail-00"), "{}", stderr(&o));
    assert_eq!(stderr(&o).matches("failed and is left out").count(), 3, "{}", stderr(&o));
    assert_eq!(served(server).len(), 3, "one request per failed task, none after the third");
    assert!(!out.exists());
}

#[test]
fn imported_tasks_without_a_solution_need_skip_unsolvable() {
    let Some(aime) = coa_tasks::external::file_or_skip("imported_tasks_without_a_solution_need_skip_unsolvable", "aime24.parquet") else { return };
    let dir = tempfile::tempdir().unwrap();
    let imported = dir.path().join("aime.parquet");
    let o = run(&["tasks", "--import", aime.to_str().unwrap(), "-o", imported.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["mas", "-i", imported.to_str().unwrap()]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("30 task(s) cannot be run") && e.contains("--skip-unsolvable") && e.contains("no solution path"), "{e}");

    let out = dir.path().join("runs.parquet");
    let stats = dir.path().join("s.json");
    let o = run(&["mas", "-i", imported.to_str().unwrap(), "--skip-unsolvable", "-o", out.to_str().unwrap(), "--stats", stats.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(read_runs(&out).is_empty());
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!((summary["rows_in"].as_u64(), summary["rows_out"].as_u64(), summary["skipped_unsolvable"].as_u64()), (Some(30), Some(0), Some(30)));
}
