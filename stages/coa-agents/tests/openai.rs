//! The `openai` backend against a local HTTP server started by the test (127.0.0.1 only, bounded
//! loops): retries on 429/5xx, the timeout, malformed JSON, the concurrency limit, the response
//! cache, and a whole multi-agent run over a replayed model.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use coa_agents::{ChatMessage, OpenAiBackend, OpenAiClient, OpenAiConfig, RunConfig, ToolConfig, Tools};
use coa_schemas::rows::{CorpusPage, Task};
use coa_tools::Corpus;
use serde_json::{json, Value};

/// A canned HTTP reply.
#[derive(Clone)]
struct Canned {
    status: u16,
    body: String,
    delay: Duration,
    headers: Vec<(&'static str, String)>,
}

fn ok(content: &str) -> Canned {
    let body = json!({
        "id": "x", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
    });
    Canned { status: 200, body: body.to_string(), delay: Duration::ZERO, headers: Vec::new() }
}

fn status(code: u16, body: &str) -> Canned {
    Canned { status: code, body: body.to_string(), delay: Duration::ZERO, headers: Vec::new() }
}

type Responder = Arc<dyn Fn(usize, &Value) -> Canned + Send + Sync>;

/// A minimal HTTP/1.1 server on 127.0.0.1: one thread per connection, `Connection: close`.
struct Server {
    addr: SocketAddr,
    count: Arc<AtomicUsize>,
    max_inflight: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

const MAX_CONNECTIONS: usize = 400;

impl Server {
    fn start(responder: impl Fn(usize, &Value) -> Canned + Send + Sync + 'static) -> Server {
        let responder: Responder = Arc::new(responder);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let inflight = Arc::new(AtomicUsize::new(0));
        let max_inflight = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, mi) = (count.clone(), stop.clone(), max_inflight.clone());
        let accept = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut accepted = 0;
            while !s.load(Ordering::SeqCst) && Instant::now() < deadline && accepted < MAX_CONNECTIONS {
                match listener.accept() {
                    Ok((stream, _)) => {
                        accepted += 1;
                        let (c, r, inf, mi) = (c.clone(), responder.clone(), inflight.clone(), mi.clone());
                        std::thread::spawn(move || handle(stream, &c, &r, &inf, &mi));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Server { addr, count, max_inflight, stop, accept: Some(accept) }
    }

    fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn requests(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn handle(stream: TcpStream, count: &AtomicUsize, responder: &Responder, inflight: &AtomicUsize, max_inflight: &AtomicUsize) {
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut content_length = 0usize;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            content_length = v.trim().parse().unwrap();
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        body.resize(content_length, 0);
        reader.read_exact(&mut body).unwrap();
    }
    let now = inflight.fetch_add(1, Ordering::SeqCst) + 1;
    max_inflight.fetch_max(now, Ordering::SeqCst);
    let n = count.fetch_add(1, Ordering::SeqCst);
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = responder(n, &request);
    std::thread::sleep(reply.delay);
    inflight.fetch_sub(1, Ordering::SeqCst);
    let mut head = format!("HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n", reply.status, reply.body.len());
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = stream;
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(reply.body.as_bytes());
}

fn config(server: &Server) -> OpenAiConfig {
    let mut cfg = OpenAiConfig::new(&server.url(), "test-model");
    cfg.timeout = Duration::from_secs(5);
    cfg.max_retries = 3;
    cfg.backoff_base = Duration::from_millis(2);
    cfg.backoff_max = Duration::from_millis(20);
    cfg.jitter_seed = 7;
    cfg
}

fn hello() -> Vec<ChatMessage> {
    vec![ChatMessage::system("You are terse."), ChatMessage::user("Say hello.")]
}

#[test]
fn retries_on_429_and_5xx_then_succeeds() {
    let server = Server::start(|n, req| {
        assert_eq!(req["model"], "test-model");
        assert_eq!(req["messages"][1]["content"], "Say hello.");
        match n {
            0 => Canned { headers: vec![("Retry-After", "0".into())], ..status(429, "{\"error\": \"rate limited\"}") },
            1 => status(500, "oops"),
            2 => status(503, "busy"),
            _ => ok("hello"),
        }
    });
    let client = OpenAiClient::new(config(&server)).unwrap();
    let r = client.chat(&hello()).unwrap();
    assert_eq!((r.content.as_str(), r.usage, r.cached), ("hello", Some((100, 10)), false));
    assert_eq!(server.requests(), 4);
    assert_eq!(client.stats().retries, 3);
}

#[test]
fn latency_counts_every_try_and_the_waits_between() {
    let server = Server::start(|n, _| match n {
        0 | 1 => Canned { delay: Duration::from_millis(150), ..status(503, "busy") },
        _ => Canned { delay: Duration::from_millis(10), ..ok("hello") },
    });
    let client = OpenAiClient::new(config(&server)).unwrap();
    let r = client.chat(&hello()).unwrap();
    assert_eq!(server.requests(), 3);
    assert!(r.latency_ms >= 310.0, "two slow failures and the answer: {} ms", r.latency_ms);
}

#[test]
fn stop_sequences_are_part_of_the_request_and_its_cache_key() {
    let server = Server::start(|_, req| ok(&req.get("stop").map_or("none".to_string(), |s| s.to_string())));
    let client = OpenAiClient::new(config(&server)).unwrap();
    assert_eq!(client.chat(&hello()).unwrap().content, "none");
    assert_eq!(client.chat_until(&hello(), &["<observation>"]).unwrap().content, "[\"<observation>\"]");
    assert_ne!(client.request_body(&hello(), &[]), client.request_body(&hello(), &["<observation>"]));
}

#[test]
fn gives_up_after_the_retry_budget_with_the_last_error() {
    let server = Server::start(|_, _| status(502, "bad gateway"));
    let client = OpenAiClient::new(config(&server)).unwrap();
    let e = client.chat(&hello()).unwrap_err().to_string();
    assert!(e.contains("giving up after 4 tries") && e.contains("HTTP 502") && e.contains("bad gateway"), "{e}");
    assert_eq!(server.requests(), 4);
}

#[test]
fn client_errors_are_not_retried() {
    let server = Server::start(|_, _| status(401, "{\"error\": \"bad key\"}"));
    let mut cfg = config(&server);
    cfg.api_key = Some("sk-test".into());
    let client = OpenAiClient::new(cfg).unwrap();
    let e = client.chat(&hello()).unwrap_err().to_string();
    assert!(e.contains("HTTP 401") && e.contains("not retried"), "{e}");
    assert!(!format!("{client:?}").contains("sk-test"), "the key never shows in Debug output");
    assert_eq!(server.requests(), 1);
}

#[test]
fn the_timeout_fires_and_is_retried() {
    let server = Server::start(|n, _| if n < 2 { Canned { delay: Duration::from_millis(1500), ..ok("late") } } else { ok("on time") });
    let mut cfg = config(&server);
    cfg.timeout = Duration::from_millis(250);
    cfg.max_retries = 1;
    let client = OpenAiClient::new(cfg.clone()).unwrap();
    let start = Instant::now();
    let e = client.chat(&hello()).unwrap_err().to_string();
    assert!(e.contains("timed out"), "{e}");
    assert!(start.elapsed() < Duration::from_millis(1200), "the client did not wait for the slow reply: {:?}", start.elapsed());
    assert_eq!(server.requests(), 2);
    // the third request is answered in time
    assert_eq!(OpenAiClient::new(cfg).unwrap().chat(&hello()).unwrap().content, "on time");
}

#[test]
fn malformed_json_is_retried_then_reported_clearly() {
    let server = Server::start(|n, _| match n {
        0 => status(200, "{\"choices\": [oops"),
        1 => status(200, "{\"choices\": []}"),
        _ => status(200, "<html>gateway</html>"),
    });
    let mut cfg = config(&server);
    cfg.max_retries = 2;
    let client = OpenAiClient::new(cfg).unwrap();
    let e = client.chat(&hello()).unwrap_err().to_string();
    assert!(e.contains("giving up after 3 tries") && e.contains("malformed JSON") && e.contains("<html>gateway"), "{e}");
    assert_eq!(server.requests(), 3);

    let server = Server::start(|_, _| status(200, "{\"choices\": []}"));
    let mut cfg = config(&server);
    cfg.max_retries = 0;
    let e = OpenAiClient::new(cfg).unwrap().chat(&hello()).unwrap_err().to_string();
    assert!(e.contains("no choices[0].message.content"), "{e}");
}

#[test]
fn the_cache_answers_a_second_run_without_any_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(|_, req| ok(&format!("echo: {}", req["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap())));
    let mut cfg = config(&server);
    cfg.cache_dir = Some(dir.path().join("cache"));
    let first = OpenAiClient::new(cfg.clone()).unwrap().chat(&hello()).unwrap();
    assert_eq!((first.content.as_str(), first.cached), ("echo: Say hello.", false));
    assert_eq!(server.requests(), 1);
    let again = OpenAiClient::new(cfg.clone()).unwrap();
    let second = again.chat(&hello()).unwrap();
    assert_eq!(server.requests(), 1, "served from the cache");
    assert!(second.cached);
    assert_eq!((second.content, second.usage, second.latency_ms), (first.content, first.usage, first.latency_ms));
    assert_eq!(again.stats().cache_hits, 1);
    // another request body is another key
    let other = again.chat(&[ChatMessage::user("Something else.")]).unwrap();
    assert_eq!((other.cached, server.requests()), (false, 2));
    // a corrupt entry is fetched again
    for entry in walk(&dir.path().join("cache")) {
        std::fs::write(entry, "{truncated").unwrap();
    }
    assert!(!OpenAiClient::new(cfg).unwrap().chat(&hello()).unwrap().cached);
    assert_eq!(server.requests(), 3);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn at_most_max_inflight_requests_at_once() {
    let server = Server::start(|_, _| Canned { delay: Duration::from_millis(60), ..ok("x") });
    let mut cfg = config(&server);
    cfg.max_inflight = 2;
    let client = OpenAiClient::new(cfg).unwrap();
    std::thread::scope(|s| {
        for i in 0..6 {
            let client = &client;
            s.spawn(move || client.chat(&[ChatMessage::user(format!("q{i}"))]).unwrap());
        }
    });
    assert_eq!(server.requests(), 6);
    assert_eq!(server.max_inflight.load(Ordering::SeqCst), 2);
}

/// A replayed model that plays every agent of a one-hop question, breaking the format once.
fn team_model(_: usize, req: &Value) -> Canned {
    let msgs = req["messages"].as_array().unwrap();
    let system = msgs[0]["content"].as_str().unwrap();
    let all: String = msgs.iter().map(|m| m["content"].as_str().unwrap()).collect::<Vec<_>>().join("\n");
    let last = msgs.last().unwrap()["content"].as_str().unwrap();
    // Tool agents are stopped where the tool's observation will go; the others are not.
    let tool_agent = system.contains("You are the SEARCH AGENT") || system.contains("You are the CRAWL AGENT");
    assert_eq!(req.get("stop"), tool_agent.then(|| json!(["<observation>"])).as_ref(), "{system}");
    let reply = if system.contains("You are the MANAGER") {
        let allowed = last.rsplit("Allowed next: ").next().unwrap().split('.').next().unwrap();
        let pick = ["answer", "double_check", "suggested_answer", "crawl_page", "web_search", "plan"]
            .into_iter()
            .find(|a| {
                allowed.split(", ").any(|x| x == *a)
                    && match *a {
                        // (a qa task may answer right after the plan; this model verifies first)
                        "answer" => all.contains("<double_check>"),
                        "suggested_answer" => all.contains("<crawl_page>"),
                        "crawl_page" => all.contains("<web_search>") && !all.contains("<crawl_page>"),
                        _ => true,
                    }
            })
            .unwrap();
        format!("next: {pick}\nreason: it is the natural next step")
    } else if system.contains("You are the PLANNER") {
        if last.ends_with("write the plan (revise it if the team went wrong).") {
            "<think>One hop: find the capital.</think>\n<plan>\n1. Search for Veltaria.\n2. Read its page.\n</plan>".into()
        } else if last.contains("Your previous reply was rejected") {
            "Sure! <think>The page says Ardena.</think>\n<suggested_answer>Ardena</suggested_answer>".into()
        } else if last.ends_with("suggest the answer from the evidence so far.") {
            "Ardena is the capital.".into() // breaks the format: rejected, asked again
        } else {
            "<answer>Ardena</answer>".into()
        }
    } else if system.contains("You are the SEARCH AGENT") {
        "<think>Search the country.</think>\n<web_search>Veltaria capital</web_search>".into()
    } else if system.contains("You are the CRAWL AGENT") {
        "<think>Open its page.</think>\n<crawl_page>https://wiki.local/Veltaria</crawl_page>".into()
    } else if system.contains("You are the VERIFIER") {
        "<think>The page states it.</think>\n<double_check>\nscore: 4\nThe page of Veltaria names Ardena as its capital.\n</double_check>".into()
    } else {
        panic!("unexpected agent: {system}")
    };
    ok(&reply)
}

#[test]
fn a_whole_team_run_over_a_replayed_model_then_again_from_the_cache() {
    let corpus = Corpus::new(vec![
        CorpusPage { url: "https://wiki.local/Veltaria".into(), title: "Veltaria".into(), text: "Veltaria is a country. Its capital is Ardena.".into(), kind: "entity".into() },
        CorpusPage { url: "https://wiki.local/Ardena".into(), title: "Ardena".into(), text: "Ardena is a city in Veltaria.".into(), kind: "entity".into() },
    ])
    .unwrap();
    let task = Task {
        task_id: "qa-1".into(),
        suite: "qa".into(),
        split: "test".into(),
        source: "handmade".into(),
        question: "What is the capital of Veltaria?".into(),
        answers: vec!["Ardena".into()],
        tools: vec!["web_search".into(), "crawl_page".into()],
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(team_model);
    let mut cfg = config(&server);
    cfg.cache_dir = Some(dir.path().to_path_buf());
    let tool_cfg = ToolConfig::default();
    let tools = Tools { corpus: Some(&corpus), config: &tool_cfg };

    let backend = OpenAiBackend::new(OpenAiClient::new(cfg.clone()).unwrap());
    let run = coa_agents::run_task(&task, &backend, tools, &RunConfig::default()).unwrap();
    assert_eq!((run.backend.as_str(), run.simulator), ("openai:test-model", false));
    assert_eq!(run.final_answer.as_deref(), Some("Ardena"));
    assert!(run.success);
    common::check_run(&run);
    assert_eq!(common::trace(&run), ["plan", "web_search", "crawl_page", "suggested_answer", "double_check", "answer"]);
    let rejected: Vec<_> = run.events.iter().filter(|e| e.role == "manager" && e.agent == "planner").collect();
    assert_eq!(rejected.len(), 1, "the broken suggestion is logged, not fatal");
    assert_eq!(rejected[0].output, "Ardena is the capital.");
    // the endpoint's usage counts are used
    let model_events: Vec<_> = run.events.iter().filter(|e| !e.input_messages.is_empty()).collect();
    assert!(model_events.iter().all(|e| (e.tokens_in, e.tokens_out) == (100, 10)));
    let requests = server.requests();
    assert_eq!(requests, model_events.len());
    // the crawl observation is the real tool's
    let crawl = run.events.iter().find(|e| e.role == "crawl_page").unwrap();
    assert_eq!(crawl.observation.as_deref(), Some("Page 1 [https://wiki.local/Veltaria] Summary:\nVeltaria is a country. Its capital is Ardena."));

    // rerun: everything from the cache
    let backend = OpenAiBackend::new(OpenAiClient::new(cfg).unwrap());
    let again = coa_agents::run_task(&task, &backend, tools, &RunConfig::default()).unwrap();
    assert_eq!(server.requests(), requests, "a rerun issues no request");
    assert_eq!(backend.client().stats().cache_hits as usize, requests);
    let outputs = |r: &coa_agents::MasRun| r.events.iter().map(|e| (e.role.clone(), e.output.clone(), e.input_messages.clone())).collect::<Vec<_>>();
    assert_eq!(outputs(&again), outputs(&run));
}

#[test]
fn an_endpoint_that_ignores_stop_is_cut_at_the_observation_by_the_client() {
    // The same team, from a server that ignores `stop`: tool agents go on to imagine the
    // observation and a wrong answer after it. The client cuts each reply where `stop` would
    // have, so the run is the one a server honouring `stop` gives.
    let corpus = Corpus::new(vec![CorpusPage {
        url: "https://wiki.local/Veltaria".into(),
        title: "Veltaria".into(),
        text: "Veltaria is a country. Its capital is Ardena.".into(),
        kind: "entity".into(),
    }])
    .unwrap();
    let task = Task {
        task_id: "qa-2".into(),
        suite: "qa".into(),
        question: "What is the capital of Veltaria?".into(),
        answers: vec!["Ardena".into()],
        tools: vec!["web_search".into(), "crawl_page".into()],
        ..Default::default()
    };
    let server = Server::start(|i, req| {
        let honoured = team_model(i, req);
        match req.get("stop") {
            Some(_) => {
                let body: Value = serde_json::from_str(&honoured.body).unwrap();
                let text = body["choices"][0]["message"]["content"].as_str().unwrap();
                ok(&format!("{text}\n<observation>Veltaria's capital is Imaginaria.</observation>\n<answer>Imaginaria</answer>"))
            }
            None => honoured,
        }
    });
    let tool_cfg = ToolConfig::default();
    let backend = OpenAiBackend::new(OpenAiClient::new(config(&server)).unwrap());
    let run = coa_agents::run_task(&task, &backend, Tools { corpus: Some(&corpus), config: &tool_cfg }, &RunConfig::default()).unwrap();
    assert_eq!(run.final_answer.as_deref(), Some("Ardena"));
    assert!(run.success);
    common::check_run(&run);
    assert_eq!(common::trace(&run), ["plan", "web_search", "crawl_page", "suggested_answer", "double_check", "answer"]);
    assert!(run.events.iter().all(|e| !e.output.contains("Imaginaria")), "no imagined observation reaches the run");
}

#[test]
fn a_model_that_never_follows_the_format_ends_the_run_without_an_answer() {
    let server = Server::start(|_, req| {
        let system = req["messages"][0]["content"].as_str().unwrap();
        if system.contains("MANAGER") {
            ok("no idea")
        } else {
            ok("I would rather chat.")
        }
    });
    let task = Task { task_id: "m1".into(), suite: "math".into(), question: "1+1?".into(), answers: vec!["2".into()], ..Default::default() };
    let tool_cfg = ToolConfig::default();
    let backend = OpenAiBackend::new(OpenAiClient::new(config(&server)).unwrap());
    let run = coa_agents::run_task(&task, &backend, Tools { corpus: None, config: &tool_cfg }, &RunConfig::default()).unwrap();
    assert!(!run.success && run.final_answer.is_none());
    let rejected = run.events.iter().filter(|e| e.role == "manager" && e.agent != "manager").count();
    assert_eq!(rejected, coa_agents::orchestrator::MAX_CONSECUTIVE_REJECTIONS);
    assert_eq!(server.requests(), rejected, "plan is forced at the start: only the planner is asked");
}
