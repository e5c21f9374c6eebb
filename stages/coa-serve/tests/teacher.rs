//! The teacher's `openai` backend (`coa-generate mas --backend openai`, the `coa_agents` code it
//! runs) end to end against two real servers serving SmolLM2-135M-Instruct, coa-serve and
//! llama.cpp's (llama-cpp-python[server]): the runs complete, tool agents are stopped before
//! `<observation>`, and the endpoint's usage is recorded; against coa-serve the client's retries
//! also carry the runs through the server's 503s (it is full when they begin).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coa_agents::{OpenAiBackend, OpenAiClient, OpenAiConfig, RunConfig, ToolConfig, Tools};
use coa_serve::{start, ServeArgs};
use coa_tasks::{Split, Suite};

/// Where `make model` puts SmolLM2 (or `COA_SMOLLM2_GGUF`).
fn smollm2_path() -> PathBuf {
    match std::env::var_os("COA_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

/// Three multihop runs of the teacher at once over the endpoint at `base` (model `model`),
/// checked; returns the client's stats and a summary line.
fn teacher_runs(base: &str, model: &str) -> (coa_agents::backend::openai::ClientStats, String) {
    let generated = coa_tasks::generate(Suite::Multihop, 3, 1, Split::Test).unwrap();
    let corpus = coa_tools::Corpus::new(generated.corpus).unwrap();
    let mut cfg = OpenAiConfig::new(&format!("{base}/v1"), model);
    (cfg.max_tokens, cfg.max_retries, cfg.timeout) = (Some(48), 60, Duration::from_secs(300));
    (cfg.backoff_base, cfg.backoff_max) = (Duration::from_millis(100), Duration::from_secs(2));
    let backend = OpenAiBackend::new(OpenAiClient::new(cfg).unwrap());
    let tool_cfg = ToolConfig::default();
    let run_cfg = RunConfig { max_activations: 5, ..RunConfig::default() };
    let t0 = Instant::now();
    let runs: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = generated
            .tasks
            .iter()
            .map(|t| {
                let (backend, corpus, tool_cfg, run_cfg) = (&backend, &corpus, &tool_cfg, &run_cfg);
                sc.spawn(move || coa_agents::run_task(t, backend, Tools { corpus: Some(corpus), config: tool_cfg }, run_cfg))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stats = backend.client().stats();
    for run in &runs {
        let run = run.as_ref().expect("the run completes over the real server");
        assert_eq!(run.backend, format!("openai:{model}"));
        assert!(!run.simulator);
        let model_events: Vec<_> = run.events.iter().filter(|e| !e.input_messages.is_empty()).collect();
        assert!(!model_events.is_empty());
        for e in &model_events {
            // The server's usage counts are what the run records.
            assert!(e.tokens_in > 0 && e.tokens_out > 0 && e.tokens_out <= 48, "{} {}: {} in, {} out", e.agent, e.role, e.tokens_in, e.tokens_out);
            // `stop` is honoured: no reply carries an observation the model made up.
            assert!(!e.output.contains("<observation>"), "{}: {}", e.agent, e.output);
        }
    }
    let events: usize = runs.iter().map(|r| r.as_ref().unwrap().events.len()).sum();
    let line = format!("3 multihop runs, {events} events, {} requests, {} retries in {:.1} s", stats.requests, stats.retries, t0.elapsed().as_secs_f64());
    (stats, line)
}

#[test]
fn the_teacher_runs_against_coa_serve_serving_smollm2() {
    let gguf = smollm2_path();
    if !gguf.is_file() {
        eprintln!("the_teacher_runs_against_coa_serve_serving_smollm2: SKIPPED: no SmolLM2 GGUF at {} (run `make model`, or set COA_SMOLLM2_GGUF)", gguf.display());
        return;
    }
    let args: ServeArgs = coa_schemas::flags::try_parse_from([
        "coa-serve", "--checkpoint", gguf.to_str().unwrap(), "--port", "0", "--model-name", "smollm2", "--batch", "2", "--queue", "1", "--context", "2048",
    ])
    .unwrap();
    let server = start(&args).unwrap();
    // Three long streamed requests fill both slots and the queue place (each answered 200 once
    // it is queued; the first two hold the slots for 1500 tokens), so the runs' first requests are refused (503) and retried; the fillers hang
    // up after a second and the runs go on (three fit in two slots and one queue place).
    let http: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let body = serde_json::json!({"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 1500, "stream": true}).to_string();
    let mut fillers = Vec::new();
    while fillers.len() < 3 {
        // A filler sent while the one before it still waits in the queue is refused: again.
        let r = http.post(&format!("{}/v1/chat/completions", server.url())).send(body.as_str()).unwrap();
        match r.status().as_u16() {
            200 => fillers.push(r),
            503 => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("a filler request: HTTP {other}"),
        }
    }
    let (stats, line) = std::thread::scope(|sc| {
        sc.spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            drop(fillers);
        });
        teacher_runs(&server.url(), "smollm2")
    });
    assert!(stats.retries >= 3, "the server was full when the three runs began: their first requests were refused and retried ({stats:?})");
    eprintln!("the_teacher_runs_against_coa_serve_serving_smollm2: {line}");
}

/// The Python with llama-cpp-python's server: `COA_LLAMA_PYTHON`, else `.venv-llama` (`make
/// bench-serve` builds it from the source package).
fn llama_python() -> Option<PathBuf> {
    let p = std::env::var_os("COA_LLAMA_PYTHON").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-llama/bin/python"));
    let ok = std::process::Command::new(&p).args(["-c", "import llama_cpp.server"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

#[test]
fn the_teacher_runs_against_llama_cpps_server_serving_smollm2() {
    let gguf = smollm2_path();
    let Some(python) = llama_python().filter(|_| gguf.is_file()) else {
        eprintln!("the_teacher_runs_against_llama_cpps_server_serving_smollm2: SKIPPED: needs the SmolLM2 GGUF (`make model`) and llama-cpp-python[server] in .venv-llama (`make .venv-llama/.ok`, or COA_LLAMA_PYTHON)");
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = std::process::Command::new(python)
        .args(["-m", "llama_cpp.server", "--model", gguf.to_str().unwrap(), "--model_alias", "smollm2", "--host", "127.0.0.1", "--port", &port.to_string()])
        // One thread: its OpenMP workers spin-wait for each other, which on a shared 2-core machine
        // slows two threads to a crawl.
        .args(["--n_ctx", "2048", "--n_threads", "1", "--n_threads_batch", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(120) && child.try_wait().unwrap().is_none(), "llama.cpp's server did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    let result = std::panic::catch_unwind(|| teacher_runs(&base, "smollm2"));
    let exited = child.try_wait().ok().flatten();
    let _ = child.kill();
    let _ = child.wait();
    let (_, line) = result.unwrap_or_else(|e| {
        let text = std::fs::read_to_string(log.path()).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        eprintln!("llama.cpp's server ({}), last lines:\n{}", exited.map_or("still running".to_string(), |s| format!("exited: {s}")), tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        std::panic::resume_unwind(e)
    });
    eprintln!("the_teacher_runs_against_llama_cpps_server_serving_smollm2: {line}");
}
