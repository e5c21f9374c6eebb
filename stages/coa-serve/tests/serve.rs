//! coa-serve over loopback on a tiny random checkpoint: the API's answers, sampling settings,
//! streaming, continuous batching under load, and bad requests that never take it down.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coa_model::{Model, ModelConfig, SaveDtype};
use coa_serve::{start, Running, ServeArgs};
use coa_tokenize::{SpecialChoice, TemplateChoice, Vocab};
use serde_json::{json, Value};

/// A checkpoint as coa-train-step saves it: a BPE trained on a few CoA texts and a tiny random
/// model, its weights scaled up so that samples are far from uniform.
fn checkpoint(dir: &Path) -> PathBuf {
    let texts = [
        "<think>go</think>\n<web_search>capital of France</web_search>\n<observation>Found 1 results:\n1. [Paris](https://x)</observation>",
        "<think>ok</think>\n<answer>Paris</answer> the quick brown fox jumps over the lazy dog 0123456789",
        "<code>\n```py\nprint(6*7)\n```\n</code> Question: what is 6 times 7? You are one model playing a whole team",
        "Hello there, how are you today? I am fine, thank you. Tell me a story about a cat and a dog.",
    ];
    let vocab = Vocab::train(texts.iter().copied(), 400, 1).unwrap();
    let ckpt = dir.join("tiny-agent");
    std::fs::create_dir_all(&ckpt).unwrap();
    vocab.save(&ckpt.join("tokenizer.json")).unwrap();
    let mut c = ModelConfig::preset("tiny", vocab.size()).unwrap();
    (c.hidden_size, c.intermediate_size, c.num_hidden_layers) = (32, 48, 2);
    (c.num_attention_heads, c.num_key_value_heads) = (4, 2);
    let mut m = Model::init(c, 5).unwrap();
    m.params.scale(4.0);
    m.save(&ckpt, SaveDtype::F32).unwrap();
    ckpt
}

struct Server {
    _dir: tempfile::TempDir,
    ckpt: PathBuf,
    running: Running,
    http: ureq::Agent,
}

fn serve(extra: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let mut argv: Vec<String> = ["coa-serve", "--checkpoint", ckpt.to_str().unwrap(), "--port", "0", "--eos", "none"].map(String::from).to_vec();
    argv.extend(extra.iter().map(|s| s.to_string()));
    let args: ServeArgs = coa_schemas::flags::try_parse_from(argv).unwrap();
    let running = start(&args).unwrap();
    Server { _dir: dir, ckpt, running, http: agent() }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into()
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.running.url())
    }

    /// POSTs `body` (raw bytes) and returns the status and the JSON answer.
    fn post_raw(&self, path: &str, body: &[u8]) -> (u16, Value) {
        post_raw(&self.http, &self.url(path), body)
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string().as_bytes())
    }

    fn ok(&self, path: &str, body: &Value) -> Value {
        let (status, v) = self.post(path, body);
        assert_eq!(status, 200, "{body} -> {v}");
        v
    }

    fn chat(&self, body: Value) -> Value {
        self.ok("/v1/chat/completions", &body)
    }

    /// A streamed answer: the JSON of every `data:` event before `[DONE]`, and whether `[DONE]` came.
    fn stream(&self, path: &str, body: &Value) -> (Vec<Value>, bool) {
        let resp = self.http.post(&self.url(path)).header("content-type", "application/json").send(body.to_string()).unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert!(resp.headers().get("content-type").unwrap().to_str().unwrap().starts_with("text/event-stream"));
        let mut events = Vec::new();
        for line in BufReader::new(resp.into_body().into_reader()).lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                return (events, true);
            }
            events.push(serde_json::from_str(data).unwrap());
        }
        (events, false)
    }

    fn stats(&self) -> Value {
        let mut r = self.http.get(&self.url("/stats")).call().unwrap();
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    }

    fn vocab(&self) -> Vocab {
        Vocab::load(&self.ckpt, &SpecialChoice::Auto, &SpecialChoice::None, &TemplateChoice::Auto).unwrap()
    }
}

fn post_raw(http: &ureq::Agent, url: &str, body: &[u8]) -> (u16, Value) {
    let mut resp = http.post(url).header("content-type", "application/json").send(body).unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text}")))
}

fn text(v: &Value, i: usize) -> String {
    let c = &v["choices"][i];
    c["message"]["content"].as_str().or(c["text"].as_str()).unwrap().to_string()
}

fn hello(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Hello there, tell me a story"}], "max_tokens": 24});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn models_lists_the_served_model() {
    let s = serve(&[]);
    let mut r = s.http.get(&s.url("/v1/models")).call().unwrap();
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "tiny-agent");
    assert_eq!(v["data"][0]["object"], "model");
    // The name requests give must be the served one.
    assert_eq!(s.chat(hello(json!({"model": "tiny-agent", "max_tokens": 2})))["model"], "tiny-agent");
    let (status, e) = s.post("/v1/chat/completions", &hello(json!({"model": "gpt-4o"})));
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("model_not_found")));
}

#[test]
fn the_same_seed_gives_the_same_text_and_usage_counts_the_tokens() {
    let s = serve(&[]);
    let a = s.chat(hello(json!({"seed": 11, "logprobs": true, "top_logprobs": 3})));
    let b = s.chat(hello(json!({"seed": 11, "logprobs": true, "top_logprobs": 3})));
    let c = s.chat(hello(json!({"seed": 12})));
    assert_eq!(text(&a, 0), text(&b, 0));
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
    assert_ne!(text(&a, 0), text(&c, 0), "another seed, another text");
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["choices"][0]["message"]["role"], "assistant");
    assert_eq!(a["choices"][0]["finish_reason"], "length", "no EOS (--eos none): the 24 tokens of max_tokens");

    // Usage: the prompt's tokens as the chat layout encodes them, one per sampled token.
    let vocab = s.vocab();
    let layout = coa_serve::http::ChatLayout::new(&vocab).unwrap();
    let prompt = layout.prompt_ids(&vocab, &[("user", "Hello there, tell me a story")]).unwrap();
    let usage = &a["usage"];
    assert_eq!(usage["prompt_tokens"], prompt.len());
    assert_eq!(usage["completion_tokens"], 24);
    assert_eq!(usage["total_tokens"], prompt.len() + 24);
    let content = a["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 24);
    let mut joined = String::new();
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0 && lp.is_finite());
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Alternatives are in order, and at temperature 1 the sampled token's log-prob is among
        // the model's: at most the best one's.
        assert!(top.windows(2).all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        assert!(lp <= top[0]["logprob"].as_f64().unwrap() + 1e-6);
        joined.push_str(t["token"].as_str().unwrap());
    }
    assert_eq!(joined, text(&a, 0), "the tokens spell the text");
}

#[test]
fn a_stop_string_cuts_the_text_and_is_not_included() {
    let s = serve(&[]);
    let greedy = hello(json!({"temperature": 0, "max_tokens": 40}));
    let full = text(&s.chat(greedy.clone()), 0);
    assert!(full.chars().count() > 12, "a text to cut: {full:?}");
    // A stop string from the middle of the greedy text: the answer is the text before its first
    // occurrence.
    let stop: String = full.chars().skip(6).take(4).collect();
    let cut = &full[..full.find(&stop).unwrap()];
    for stop_field in [json!(stop), json!(["never-in-the-text", stop])] {
        let mut body = greedy.clone();
        body["stop"] = stop_field;
        let v = s.chat(body.clone());
        assert_eq!(text(&v, 0), cut, "stop {stop:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 40);
        // Streamed: the same text, the stop string never sent.
        body["stream"] = json!(true);
        let (events, done) = s.stream("/v1/chat/completions", &body);
        assert!(done);
        let streamed: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(streamed, cut);
    }
}

#[test]
fn n_gives_n_choices_each_its_own_stream() {
    let s = serve(&[]);
    let v = s.chat(hello(json!({"n": 3, "seed": 5})));
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    assert_eq!(v["usage"]["completion_tokens"], 3 * 24);
    let texts: Vec<String> = (0..3).map(|i| text(&v, i)).collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "three samples at temperature 1: {texts:?}");
    // Choice k's stream depends on the seed and k only.
    assert_eq!(text(&s.chat(hello(json!({"n": 1, "seed": 5}))), 0), texts[0]);
    // Text completions: a prompt list times n.
    let v = s.ok("/v1/completions", &json!({"prompt": ["Hello there", "Tell me"], "n": 2, "max_tokens": 5, "seed": 1}));
    assert_eq!(v["choices"].as_array().unwrap().len(), 4);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 20);
}

#[test]
fn streamed_deltas_add_up_to_the_whole_answer_at_temperature_zero() {
    let s = serve(&[]);
    for (path, body) in [
        ("/v1/chat/completions", hello(json!({"temperature": 0, "max_tokens": 30, "n": 2}))),
        ("/v1/completions", json!({"prompt": "Hello there, how are", "temperature": 0, "max_tokens": 30, "logprobs": 2})),
    ] {
        let whole = s.ok(path, &body);
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (events, done) = s.stream(path, &sb);
        assert!(done, "{path}: ends with [DONE]");
        let n = whole["choices"].as_array().unwrap().len();
        for i in 0..n {
            let parts: Vec<&Value> = events.iter().filter(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty()) && e["choices"][0]["index"] == i).collect();
            let joined: String = parts.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str().or(e["choices"][0]["text"].as_str())).collect();
            assert_eq!(joined, text(&whole, i), "{path} choice {i}");
            let last = parts.last().unwrap();
            assert_eq!(last["choices"][0]["finish_reason"], whole["choices"][i]["finish_reason"]);
            assert!(parts[..parts.len() - 1].iter().all(|e| e["choices"][0]["finish_reason"].is_null()));
        }
        // The last chunk before [DONE] carries the usage, the same as the whole answer's.
        let last = events.last().unwrap();
        assert_eq!(last["choices"].as_array().unwrap().len(), 0);
        assert_eq!(last["usage"], whole["usage"], "{path}");
    }
    // Text completion log-probs: one per token, offsets into the text.
    let v = s.ok("/v1/completions", &json!({"prompt": "Hello there", "temperature": 0, "max_tokens": 6, "logprobs": 2}));
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);
}

/// Every bad request gets an OpenAI error object with its status, and the server serves the next.
#[test]
fn bad_requests_get_errors_and_the_server_keeps_serving() {
    let s = serve(&["--context", "64", "--batch", "4", "--max-body", "20000"]);
    let chat = "/v1/chat/completions";
    let long = "Hello there, how are you today? ".repeat(20);
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        (chat, b"{\"messages\": [".to_vec(), 400, None),
        (chat, b"not json at all".to_vec(), 400, None),
        (chat, b"{} trailing".to_vec(), 400, None),
        (chat, hello(json!({"frobnicate": 1})).to_string().into_bytes(), 422, None),
        (chat, hello(json!({"temperature": "hot"})).to_string().into_bytes(), 422, Some("temperature")),
        (chat, json!({"messages": "hi"}).to_string().into_bytes(), 422, Some("messages")),
        (chat, json!({"max_tokens": 3}).to_string().into_bytes(), 400, Some("messages")),
        (chat, json!({"messages": []}).to_string().into_bytes(), 400, Some("messages")),
        (chat, json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string().into_bytes(), 400, Some("messages[0].role")),
        (chat, hello(json!({"max_tokens": 0})).to_string().into_bytes(), 400, Some("max_tokens")),
        (chat, hello(json!({"max_tokens": -5})).to_string().into_bytes(), 400, Some("max_tokens")),
        (chat, hello(json!({"max_tokens": 1_000_000_000_000i64})).to_string().into_bytes(), 400, Some("max_tokens")),
        (chat, hello(json!({"n": 5})).to_string().into_bytes(), 400, Some("n")),
        (chat, hello(json!({"n": 0})).to_string().into_bytes(), 400, Some("n")),
        (chat, hello(json!({"temperature": 3})).to_string().into_bytes(), 400, Some("temperature")),
        (chat, hello(json!({"top_p": 0})).to_string().into_bytes(), 400, Some("top_p")),
        (chat, hello(json!({"stop": ["a", "b", "c", "d", "e"]})).to_string().into_bytes(), 400, Some("stop")),
        (chat, hello(json!({"frequency_penalty": 0.5})).to_string().into_bytes(), 400, Some("frequency_penalty")),
        (chat, hello(json!({"prompt": "x"})).to_string().into_bytes(), 400, Some("prompt")),
        (chat, json!({"messages": [{"role": "user", "content": long}]}).to_string().into_bytes(), 400, Some("messages")),
        (chat, vec![b' '; 30_000], 413, None),
        ("/v1/completions", json!({"prompt": "Hello", "messages": []}).to_string().into_bytes(), 400, Some("messages")),
        ("/v1/completions", json!({"prompt": [999_999]}).to_string().into_bytes(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": ""}).to_string().into_bytes(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": "Hello", "logprobs": 50}).to_string().into_bytes(), 400, Some("logprobs")),
        ("/v1/nothing", b"{}".to_vec(), 404, None),
    ];
    for (path, body, status, param) in &cases {
        let (got, v) = s.post_raw(path, body);
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        assert_eq!(got, *status, "{path} {shown} -> {v}");
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(), "{v}");
        if let Some(p) = param {
            assert_eq!(e["param"], *p, "{path} {shown} -> {v}");
        }
        // ...and the server still answers.
        assert_eq!(text(&s.chat(hello(json!({"max_tokens": 2, "seed": 1}))), 0).is_empty(), false);
    }
    let (code, v) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": long}]}));
    assert_eq!((code, v["error"]["code"].as_str()), (400, Some("context_length_exceeded")));
    // A wrong method.
    let mut r = s.http.get(&s.url("/v1/chat/completions")).call().unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert!(v["error"]["message"].is_string());
}

/// Opens a streamed request by hand and hangs up after its first events.
fn hang_up_mid_stream(s: &Server, body: &Value) {
    let mut c = std::net::TcpStream::connect(s.running.addr).unwrap();
    let b = body.to_string();
    write!(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while got.windows(6).filter(|w| w == b"data: ").count() < 3 {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"));
    drop(c);
}

#[test]
fn a_client_gone_mid_stream_frees_its_slot() {
    let s = serve(&["--batch", "1"]);
    let long = hello(json!({"max_tokens": 1800, "stream": true}));
    hang_up_mid_stream(&s, &long);
    // The sequence is dropped at its next token: the slot frees long before 1800 tokens.
    let t0 = Instant::now();
    loop {
        let st = s.stats();
        if st["sequences_cancelled"] == 1 && st["active"] == 0 {
            assert!(st["tokens_sampled"].as_u64().unwrap() < 1800, "{st}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the cancelled sequence still runs: {st}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The one slot serves the next request.
    let v = s.chat(hello(json!({"max_tokens": 4})));
    assert_eq!(v["usage"]["completion_tokens"], 4);
}

#[test]
fn a_full_queue_answers_503_and_the_server_recovers() {
    let s = serve(&["--batch", "1", "--queue", "1"]);
    let url = s.url("/v1/chat/completions");
    let body = hello(json!({"max_tokens": 600})).to_string();
    let statuses: Vec<(u16, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6).map(|_| sc.spawn(|| post_raw(&agent(), &url, body.as_bytes()))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy = statuses.iter().filter(|(c, _)| *c == 503).count();
    let served = statuses.iter().filter(|(c, _)| *c == 200).count();
    assert_eq!(busy + served, 6, "{statuses:?}");
    assert!(busy >= 1 && served >= 1, "one slot and one queue place for six at once: {busy} refused, {served} served");
    let refused = statuses.iter().find(|(c, _)| *c == 503).unwrap();
    assert_eq!(refused.1["error"]["code"], "server_overloaded");
    assert_eq!(s.chat(hello(json!({"max_tokens": 3})))["usage"]["completion_tokens"], 3);
}

#[test]
fn sixty_four_clients_share_the_batch() {
    let s = serve(&["--batch", "8", "--queue", "64"]);
    let url = s.url("/v1/chat/completions");
    let t0 = Instant::now();
    let answers: Vec<(u16, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..64)
            .map(|i| {
                let url = &url;
                sc.spawn(move || post_raw(&agent(), url, hello(json!({"max_tokens": 6 + i % 5, "seed": i})).to_string().as_bytes()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    for (i, (status, v)) in answers.iter().enumerate() {
        assert_eq!(*status, 200, "client {i}: {v}");
        assert_eq!(v["usage"]["completion_tokens"], 6 + i % 5);
    }
    // Same seed, same text, whatever shared the batch.
    assert_eq!(text(&s.chat(hello(json!({"max_tokens": 6, "seed": 0}))), 0), text(&answers[0].1, 0));
    let st = s.stats();
    assert_eq!(st["sequences_finished"], 65);
    // Continuous batching: far fewer forwards than the 64 requests' tokens one by one.
    let tokens: u64 = (0..64).map(|i| 6 + i % 5).sum();
    assert!(st["forwards"].as_u64().unwrap() < tokens / 2, "{st}: {tokens} tokens");
    eprintln!("sixty_four_clients_share_the_batch: 64 clients, {tokens} tokens in {secs:.2} s, {st}");
}

#[test]
fn the_binary_prints_its_address_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_coa-serve"))
        .args(["--checkpoint", ckpt.to_str().unwrap(), "--port", "0", "--model-name", "tiny"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{line:?}");
    let (status, v) = post_raw(&agent(), &format!("{url}/v1/completions"), json!({"model": "tiny", "prompt": "Hello", "max_tokens": 3}).to_string().as_bytes());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "tiny");

    // A checkpoint that is not there: an error naming the flag, no server.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coa-serve")).args(["--checkpoint", "/nonexistent/ckpt", "--port", "0"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--checkpoint /nonexistent/ckpt"), "{err}");
}

/// The Python with the pinned `openai` client: `COA_OPENAI_PYTHON`, else `.venv-openai` (`make
/// openai-venv`, which `make test` runs).
fn openai_python() -> Option<PathBuf> {
    let p = std::env::var_os("COA_OPENAI_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-openai/bin/python"));
    let ok = std::process::Command::new(&p).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

#[test]
fn the_official_openai_client_and_curl_talk_to_it() {
    let s = serve(&["--batch", "4"]);
    let base = s.running.url();
    match openai_python() {
        Some(py) => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
            let out = std::process::Command::new(py).arg(script).args([&base, "tiny-agent"]).output().unwrap();
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "the openai client failed:\n{stdout}\n{stderr}");
            eprintln!("the_official_openai_client_and_curl_talk_to_it: {}", stdout.trim());
        }
        None => eprintln!("the_official_openai_client_and_curl_talk_to_it: SKIPPED the openai client part: no Python with the `openai` package (run `make openai-venv`, or set COA_OPENAI_PYTHON)"),
    }
    let curl = |args: &[&str]| std::process::Command::new("curl").args(["-sS", "--max-time", "60"]).args(args).output();
    match curl(&["--version"]) {
        Ok(o) if o.status.success() => {
            let body = hello(json!({"max_tokens": 5, "stream": true, "temperature": 0})).to_string();
            let out = curl(&["-N", "-H", "Content-Type: application/json", "-d", &body, &format!("{base}/v1/chat/completions")]).unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success() && text.trim_end().ends_with("data: [DONE]"), "{text}");
            let chunks = text.matches("data: ").count();
            assert!((4..=5 + 3).contains(&chunks), "at most 5 token chunks, then the finish, the usage and [DONE]: {text}");
            assert!(text.contains(r#""role":"assistant""#) && text.contains(r#""finish_reason":"length""#), "{text}");
            // curl's default form content type, and a bad body: the error object.
            let out = curl(&["-w", "\n%{http_code}", "-d", "{\"messages\": 3}", &format!("{base}/v1/chat/completions")]).unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let (json_body, code) = text.rsplit_once('\n').unwrap();
            assert_eq!(code, "422", "{text}");
            let v: Value = serde_json::from_str(json_body).unwrap();
            assert_eq!(v["error"]["param"], "messages");
        }
        _ => eprintln!("the_official_openai_client_and_curl_talk_to_it: SKIPPED the curl part: no curl on PATH"),
    }
}

/// Writes `script` at its k-th forward on a slot (then repeats its last token), as a logit of 40
/// over zeros (every other token then has a probability under e^-40 at temperature 1): a policy
/// whose tool calls are known, to run the agent loop behind the API.
struct Scripted {
    script: Vec<u32>,
    vocab: usize,
    cursor: Vec<usize>,
}

impl coa_generate::policy::Policy for Scripted {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn n_slots(&self) -> usize {
        self.cursor.len()
    }
    fn reset(&mut self, slot: usize) {
        self.cursor[slot] = 0;
    }
    fn extend(&mut self, items: &[(usize, &[u32])]) -> anyhow::Result<Vec<f32>> {
        let mut out = vec![0f32; items.len() * self.vocab];
        for (i, &(slot, _)) in items.iter().enumerate() {
            let k = self.cursor[slot].min(self.script.len() - 1);
            self.cursor[slot] += 1;
            out[i * self.vocab + self.script[k] as usize] = 40.0;
        }
        Ok(out)
    }
}

impl coa_serve::engine::Decoding for Scripted {
    fn run(
        mut self: Box<Self>,
        slots: usize,
        _context: usize,
        serve: &mut dyn FnMut(&mut dyn coa_generate::policy::Policy, String) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.cursor = vec![0; slots];
        serve(&mut *self, "scripted".into())
    }
}

#[test]
fn with_tools_a_chat_completion_runs_the_agent_loop_and_returns_the_trajectory() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let vocab = Vocab::load(&ckpt, &SpecialChoice::Auto, &SpecialChoice::Auto, &TemplateChoice::Auto).unwrap();
    let script = "<think>compute it</think>\n<code>\n```py\nprint(6*7)\n```\n</code>\n<answer>42</answer>";
    let mut ids = Vec::new();
    vocab.encode_into(script, &mut ids).unwrap();
    let n_vocab = vocab.size();
    let args: ServeArgs = coa_schemas::flags::try_parse_from(["coa-serve", "--checkpoint", ckpt.to_str().unwrap(), "--port", "0", "--tools", "--batch", "2"]).unwrap();
    let running = coa_serve::start_with(&args, vocab, Box::new(Scripted { script: ids, vocab: n_vocab, cursor: Vec::new() }), 2048).unwrap();
    let url = format!("{}/v1/chat/completions", running.url());
    let (status, v) = post_raw(&agent(), &url, json!({"messages": [{"role": "user", "content": "What is 6 times 7?"}], "suite": "math", "n": 2}).to_string().as_bytes());
    assert_eq!(status, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        // The message is the final answer; the trajectory has the steps, the real tool's output.
        assert_eq!(c["message"]["content"], "42", "{c}");
        assert_eq!(c["finish_reason"], "stop");
        let t = &c["trajectory"];
        assert_eq!(t["finish_reason"], "answer");
        assert_eq!((t["turns"].as_u64(), t["tool_calls"].as_u64()), (Some(2), Some(1)), "{t}");
        let tags: Vec<&str> = t["steps"].as_array().unwrap().iter().map(|s| s["tag"].as_str().unwrap()).collect();
        assert_eq!(tags, ["think", "code", "answer"], "{t}");
        let obs = t["steps"][1]["observation"].as_str().unwrap();
        assert!(obs.contains("42"), "the sandbox ran the code: {obs:?}");
        assert!(t["text"].as_str().unwrap().contains("<observation>"));
        assert!(t["observation_tokens"].as_u64().unwrap() > 0);
    }
    let sampled: u64 = v["choices"].as_array().unwrap().iter().map(|c| c["trajectory"]["sampled_tokens"].as_u64().unwrap()).sum();
    assert_eq!(v["usage"]["completion_tokens"], sampled);
    // Settings that do not apply to the agent loop are refused.
    let (status, e) = post_raw(&agent(), &url, json!({"messages": [{"role": "user", "content": "x"}], "stop": "a"}).to_string().as_bytes());
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("stop")));
}

#[test]
fn the_gpu_decoder_serves_on_the_emulated_device() {
    // `--device emu`: the GPU decoder's code (bf16 weights and KV cache) on the CPU's emulated
    // CUDA device, as `--device cuda` runs it on a GPU.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let args: ServeArgs =
        coa_schemas::flags::try_parse_from(["coa-serve", "--checkpoint", ckpt.to_str().unwrap(), "--port", "0", "--eos", "none", "--device", "emu", "--batch", "3", "--context", "256"]).unwrap();
    let running = match start(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("the_gpu_decoder_serves_on_the_emulated_device: SKIPPED: no emulated CUDA device ({e:#}; `make cuda-deps` builds it)");
            return;
        }
    };
    assert!(running.device.contains("emu") || running.device.to_lowercase().contains("emulat"), "{}", running.device);
    let s = Server { _dir: dir, ckpt, running, http: agent() };
    let a = s.chat(hello(json!({"n": 2, "seed": 3, "max_tokens": 10})));
    let b = s.chat(hello(json!({"n": 2, "seed": 3, "max_tokens": 10})));
    assert_eq!(a["choices"], b["choices"], "the same seed, the same texts on the GPU decoder");
    assert_eq!(a["usage"]["completion_tokens"], 20);
    let greedy = hello(json!({"temperature": 0, "max_tokens": 10}));
    let whole = text(&s.chat(greedy.clone()), 0);
    let mut sb = greedy;
    sb["stream"] = json!(true);
    let (events, done) = s.stream("/v1/chat/completions", &sb);
    assert!(done);
    let streamed: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, whole);
}
