//! The `openai` backend: any OpenAI-compatible `/v1/chat/completions` endpoint.
//!
//! - **Requests**: `POST {base_url}/chat/completions` (or `base_url` itself when it already ends
//!   in `/chat/completions`) with `{"model", "messages", "temperature"[, "max_tokens"][, "stop"]}`;
//!   an agent asked for a tool call is sent `"stop": ["<observation>"]`, so that a model which
//!   goes on to imagine the tool's output is cut where the real output will go; an endpoint that
//!   ignores `stop` has its reply cut here at the first stop sequence instead (what a server that
//!   honours it returns: the text before it), so the imagined output never reaches the run. The key, if one
//!   was given ([`OpenAiConfig::api_key`]), as `Authorization: Bearer …`. Blocking HTTP (ureq),
//!   no async runtime; loopback URLs bypass any proxy set in the environment.
//! - **Concurrency**: at most [`OpenAiConfig::max_inflight`] requests at once across threads.
//! - **Retries**: on HTTP 429 and 5xx, connection errors, timeouts and malformed responses (not
//!   JSON, or no `choices[0].message.content`), up to [`OpenAiConfig::max_retries`] more tries,
//!   sleeping `min(backoff_max, backoff_base · 2^attempt)` scaled by a jitter factor in
//!   [0.5, 1] — or the server's `Retry-After` seconds when longer (still capped). The jitter is
//!   drawn from a hash of (`jitter_seed`, request, attempt): deterministic, yet different across
//!   requests so that parallel clients do not retry in lockstep. Other 4xx fail at once. A reply's
//!   latency is the whole time it took: every try and the waits between tries.
//! - **Timeouts**: [`OpenAiConfig::timeout`] bounds each request (connect, send, wait, read).
//! - **Cache**: with a cache dir, each successful response is stored as
//!   `<dir>/<h[0..2]>/<h>.json` where `h` = SHA-256 of the exact request body, written under a
//!   temporary name and renamed; a later identical request is answered from disk without any
//!   network traffic, with the latency recorded originally. Since the scripted state of a run is
//!   its messages, a rerun of an interrupted stage replays every finished activation for free and
//!   resumes where it stopped. An unreadable cache entry is reported and fetched again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use coa_schemas::rng::splitmix64_mix;
use coa_schemas::rows::Task;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{Backend, Mind, Reply, Turn};
use crate::action::Action;
use crate::event::ChatMessage;

/// Settings of an OpenAI-compatible endpoint. (`Debug` never shows the key.)
#[derive(Clone)]
pub struct OpenAiConfig {
    /// `https://api.openai.com/v1`, `http://127.0.0.1:8000/v1`, ...
    pub base_url: String,
    pub model: String,
    /// The bearer key (read by the caller from the environment variable the user named); `None`
    /// sends none.
    pub api_key: Option<String>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Retries after the first try.
    pub max_retries: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub jitter_seed: u64,
    /// Requests in flight at once.
    pub max_inflight: usize,
    pub cache_dir: Option<PathBuf>,
    pub temperature: f64,
    pub max_tokens: Option<u32>,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("max_inflight", &self.max_inflight)
            .field("cache_dir", &self.cache_dir)
            .finish_non_exhaustive()
    }
}

impl OpenAiConfig {
    /// Defaults: 120 s timeout, 6 retries, backoff 1 s doubling up to 60 s, 8 in flight,
    /// temperature 0, no cache.
    pub fn new(base_url: &str, model: &str) -> OpenAiConfig {
        OpenAiConfig {
            base_url: base_url.to_string(),
            model: model.to_string(),
            api_key: None,
            timeout: Duration::from_secs(120),
            max_retries: 6,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            jitter_seed: 0,
            max_inflight: 8,
            cache_dir: None,
            temperature: 0.0,
            max_tokens: None,
        }
    }

    /// The chat-completions URL.
    pub fn url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        if base.ends_with("/chat/completions") {
            base.to_string()
        } else {
            format!("{base}/chat/completions")
        }
    }
}

/// A reply from the endpoint (or its cache).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    pub content: String,
    /// `usage.prompt_tokens`, `usage.completion_tokens` when the endpoint sent them.
    pub usage: Option<(i64, i64)>,
    pub latency_ms: f64,
    pub cached: bool,
}

/// Counters of a client's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientStats {
    /// HTTP requests sent (retries included).
    pub requests: u64,
    /// Replies served from the cache.
    pub cache_hits: u64,
    /// Tries that failed and were retried.
    pub retries: u64,
}

/// A counting semaphore.
#[derive(Debug)]
struct Semaphore {
    free: Mutex<usize>,
    cv: Condvar,
}

impl Semaphore {
    fn new(n: usize) -> Semaphore {
        Semaphore { free: Mutex::new(n.max(1)), cv: Condvar::new() }
    }

    fn acquire(&self) -> Permit<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.cv.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Permit(self)
    }
}

struct Permit<'a>(&'a Semaphore);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut free = self.0.free.lock().unwrap_or_else(|e| e.into_inner());
        *free += 1;
        self.0.cv.notify_one();
    }
}

/// What one try came to.
enum Attempt {
    Done(ChatResponse, Value),
    /// Worth another try; the server's Retry-After if it sent one.
    Retry(String, Option<Duration>),
    Fatal(String),
}

/// A blocking chat-completions client with retries, a concurrency limit and a response cache.
pub struct OpenAiClient {
    cfg: OpenAiConfig,
    url: String,
    agent: ureq::Agent,
    sem: Semaphore,
    requests: AtomicU64,
    cache_hits: AtomicU64,
    retries: AtomicU64,
}

impl std::fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiClient").field("config", &self.cfg).field("stats", &self.stats()).finish()
    }
}

fn is_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let host = if host.starts_with('[') { host.split(']').next().unwrap_or("").trim_start_matches('[') } else { host.split(':').next().unwrap_or("") };
    host == "localhost" || host == "::1" || host.starts_with("127.")
}

fn snippet(s: &str) -> String {
    let one_line: String = s.chars().take(200).map(|c| if c.is_control() { ' ' } else { c }).collect();
    if s.chars().count() > 200 {
        format!("{one_line}…")
    } else {
        one_line
    }
}

impl OpenAiClient {
    pub fn new(cfg: OpenAiConfig) -> Result<OpenAiClient> {
        if cfg.model.trim().is_empty() {
            bail!("--model: an OpenAI-compatible backend needs a model name");
        }
        let url = cfg.url();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--base-url: `{}` is not an http(s) URL", cfg.base_url);
        }
        if let Some(dir) = &cfg.cache_dir {
            std::fs::create_dir_all(dir).with_context(|| format!("--cache-dir: creating {}", dir.display()))?;
        }
        let proxy = if is_loopback(&url) { None } else { ureq::Proxy::try_from_env() };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(cfg.timeout))
            .http_status_as_error(false)
            .proxy(proxy)
            .build()
            .into();
        let sem = Semaphore::new(cfg.max_inflight);
        Ok(OpenAiClient { cfg, url, agent, sem, requests: AtomicU64::new(0), cache_hits: AtomicU64::new(0), retries: AtomicU64::new(0) })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.cfg
    }

    pub fn stats(&self) -> ClientStats {
        ClientStats {
            requests: self.requests.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }

    /// The exact request body for `messages` with `stop` sequences (what the cache key hashes).
    pub fn request_body(&self, messages: &[ChatMessage], stop: &[&str]) -> String {
        let mut body = json!({
            "model": self.cfg.model,
            "messages": messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
            "temperature": self.cfg.temperature,
        });
        if let Some(n) = self.cfg.max_tokens {
            body["max_tokens"] = json!(n);
        }
        if !stop.is_empty() {
            body["stop"] = json!(stop);
        }
        body.to_string()
    }

    fn cache_path(&self, key: &str) -> Option<PathBuf> {
        self.cfg.cache_dir.as_ref().map(|d| d.join(&key[..2]).join(format!("{key}.json")))
    }

    fn read_cache(&self, path: &Path) -> Option<ChatResponse> {
        let bytes = std::fs::read(path).ok()?;
        let parsed: Result<ChatResponse> = (|| {
            let v: Value = serde_json::from_slice(&bytes)?;
            let latency_ms = v["latency_ms"].as_f64().unwrap_or(0.0);
            let mut r = parse_response(&v["response"])?;
            r.latency_ms = latency_ms;
            r.cached = true;
            Ok(r)
        })();
        match parsed {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("coa-agents: warning: unreadable cache entry {} ({e:#}); fetching again", path.display());
                None
            }
        }
    }

    fn write_cache(&self, path: &Path, response: &Value, latency_ms: f64) -> Result<()> {
        let entry = json!({"latency_ms": latency_ms, "response": response});
        coa_schemas::output::write_cache_entry(path, entry.to_string().as_bytes()).with_context(|| format!("writing {}", path.display()))
    }

    /// Sends one chat request (see the module docs for retries and the cache).
    pub fn chat(&self, messages: &[ChatMessage]) -> Result<ChatResponse> {
        self.chat_until(messages, &[])
    }

    /// [`OpenAiClient::chat`] with `stop` sequences.
    pub fn chat_until(&self, messages: &[ChatMessage], stop: &[&str]) -> Result<ChatResponse> {
        let body = self.request_body(messages, stop);
        let key = hex(&Sha256::digest(body.as_bytes()));
        let cache = self.cache_path(&key);
        if let Some(path) = &cache {
            if let Some(hit) = self.read_cache(path) {
                self.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(hit);
            }
        }
        let key_bits = u64::from_str_radix(&key[..16], 16).unwrap_or(0);
        let mut last = String::new();
        let start = Instant::now();
        for attempt in 0..=self.cfg.max_retries {
            match self.try_once(&body) {
                Attempt::Done(mut resp, raw) => {
                    // every try and every wait counts
                    resp.latency_ms = (start.elapsed().as_secs_f64() * 1_000_000.0).round() / 1000.0;
                    if let Some(path) = &cache {
                        self.write_cache(path, &raw, resp.latency_ms).with_context(|| format!("--cache-dir: caching the response of {}", self.url))?;
                    }
                    return Ok(resp);
                }
                Attempt::Fatal(why) => bail!("{}: {why}", self.url),
                Attempt::Retry(why, retry_after) => {
                    last = why;
                    if attempt == self.cfg.max_retries {
                        break;
                    }
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(self.backoff(attempt, key_bits, retry_after));
                }
            }
        }
        bail!("{}: giving up after {} tries: {last}", self.url, self.cfg.max_retries + 1)
    }

    /// The sleep before retry number `attempt + 1`.
    pub fn backoff(&self, attempt: u32, key_bits: u64, retry_after: Option<Duration>) -> Duration {
        let exp = self.cfg.backoff_base.saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX));
        let capped = exp.min(self.cfg.backoff_max);
        let u = (splitmix64_mix(self.cfg.jitter_seed ^ key_bits ^ (attempt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 11) as f64 / (1u64 << 53) as f64;
        let jittered = capped.mul_f64(0.5 + 0.5 * u);
        match retry_after {
            Some(ra) => jittered.max(ra).min(self.cfg.backoff_max),
            None => jittered,
        }
    }

    fn try_once(&self, body: &str) -> Attempt {
        let _permit = self.sem.acquire();
        self.requests.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let mut req = self.agent.post(&self.url).header("Content-Type", "application/json");
        if let Some(key) = &self.cfg.api_key {
            req = req.header("Authorization", &format!("Bearer {key}"));
        }
        let mut resp = match req.send(body) {
            Ok(r) => r,
            Err(e) => return classify(e, self.cfg.timeout),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        let text = match resp.body_mut().read_to_string() {
            Ok(t) => t,
            Err(e) => return classify(e, self.cfg.timeout),
        };
        let latency_ms = (start.elapsed().as_secs_f64() * 1_000_000.0).round() / 1000.0;
        match status {
            200..=299 => {
                let raw: Value = match serde_json::from_str(&text) {
                    Ok(v) => v,
                    Err(e) => return Attempt::Retry(format!("malformed JSON in the response ({e}); body starts: {}", snippet(&text)), None),
                };
                match parse_response(&raw) {
                    Ok(mut r) => {
                        r.latency_ms = latency_ms;
                        Attempt::Done(r, raw)
                    }
                    Err(e) => Attempt::Retry(format!("{e:#}; body starts: {}", snippet(&text)), None),
                }
            }
            429 | 500..=599 => Attempt::Retry(format!("HTTP {status}: {}", snippet(&text)), retry_after),
            _ => Attempt::Fatal(format!("HTTP {status} (not retried): {}", snippet(&text))),
        }
    }
}

fn classify(e: ureq::Error, timeout: Duration) -> Attempt {
    match e {
        ureq::Error::Timeout(which) => Attempt::Retry(format!("timed out after {timeout:?} ({which:?})"), None),
        ureq::Error::Io(io) => Attempt::Retry(format!("connection error: {io}"), None),
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => Attempt::Retry(format!("connection error: {e}"), None),
        ureq::Error::Protocol(p) => Attempt::Retry(format!("HTTP protocol error: {p}"), None),
        other => Attempt::Fatal(format!("request failed: {other}")),
    }
}

/// `choices[0].message.content` and `usage` of a chat-completions response.
fn parse_response(v: &Value) -> Result<ChatResponse> {
    let content = v
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("the response has no choices[0].message.content string"))?;
    let usage = match (v.pointer("/usage/prompt_tokens").and_then(Value::as_i64), v.pointer("/usage/completion_tokens").and_then(Value::as_i64)) {
        (Some(p), Some(c)) => Some((p, c)),
        _ => None,
    };
    Ok(ChatResponse { content: content.to_string(), usage, latency_ms: 0.0, cached: false })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Agents thinking with an OpenAI-compatible model: every activation sends the agent's messages.
pub struct OpenAiBackend {
    client: OpenAiClient,
}

impl OpenAiBackend {
    pub fn new(client: OpenAiClient) -> OpenAiBackend {
        OpenAiBackend { client }
    }

    pub fn client(&self) -> &OpenAiClient {
        &self.client
    }
}

struct OpenAiMind<'a> {
    client: &'a OpenAiClient,
}

/// Where a tool's output will follow the agent's reply.
const OBSERVATION_STOP: [&str; 1] = ["<observation>"];

impl Mind for OpenAiMind<'_> {
    fn reply(&mut self, turn: &Turn<'_>) -> Result<Reply> {
        let stop: &[&str] = if turn.action.is_some_and(Action::is_tool) { &OBSERVATION_STOP } else { &[] };
        let mut r = self.client.chat_until(turn.messages, stop)?;
        let keep = cut_at_stop(&r.content, stop).len();
        r.content.truncate(keep);
        Ok(Reply { text: r.content, usage: r.usage, latency_ms: r.latency_ms })
    }
}

/// `text` before the first of the `stop` sequences in it (all of it when none is): a reply as an
/// endpoint that honours `stop` returns it.
pub fn cut_at_stop<'a>(text: &'a str, stop: &[&str]) -> &'a str {
    let at = stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s)).min();
    &text[..at.unwrap_or(text.len())]
}

impl Backend for OpenAiBackend {
    fn label(&self) -> String {
        format!("openai:{}", self.client.cfg.model)
    }

    fn simulator(&self) -> bool {
        false
    }

    fn check_task(&self, _task: &Task) -> Result<()> {
        Ok(())
    }

    fn start<'a>(&'a self, _task: &'a Task) -> Result<Box<dyn Mind + 'a>> {
        Ok(Box::new(OpenAiMind { client: &self.client }))
    }

    fn tool_latency_ms(&self, _action: Action, _input: &str, measured_ms: f64) -> f64 {
        (measured_ms * 1000.0).round() / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_cut_at_the_first_stop_sequence() {
        let reply = "<web_search>q</web_search>\n<observation>imagined</observation><observation>";
        assert_eq!(cut_at_stop(reply, &OBSERVATION_STOP), "<web_search>q</web_search>\n");
        assert_eq!(cut_at_stop(reply, &[]), reply);
        assert_eq!(cut_at_stop("a STOP b END", &["END", "STOP"]), "a ");
    }

    #[test]
    fn urls_and_loopback() {
        assert_eq!(OpenAiConfig::new("http://h/v1/", "m").url(), "http://h/v1/chat/completions");
        assert_eq!(OpenAiConfig::new("http://h/v1/chat/completions", "m").url(), "http://h/v1/chat/completions");
        assert!(is_loopback("http://127.0.0.1:8080/v1"));
        assert!(is_loopback("http://localhost/v1"));
        assert!(is_loopback("http://[::1]:80/v1"));
        assert!(!is_loopback("https://api.openai.com/v1"));
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered_deterministically() {
        let mut cfg = OpenAiConfig::new("http://127.0.0.1:9/v1", "m");
        cfg.backoff_base = Duration::from_millis(100);
        cfg.backoff_max = Duration::from_millis(1000);
        let c = OpenAiClient::new(cfg).unwrap();
        for attempt in 0..8u32 {
            let d = c.backoff(attempt, 42, None);
            let full = Duration::from_millis(100 * (1u64 << attempt)).min(Duration::from_millis(1000));
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
            assert_eq!(d, c.backoff(attempt, 42, None));
        }
        assert_ne!(c.backoff(3, 1, None), c.backoff(3, 2, None));
        assert_eq!(c.backoff(0, 1, Some(Duration::from_secs(5))), Duration::from_millis(1000));
        assert!(c.backoff(0, 1, Some(Duration::from_millis(300))) >= Duration::from_millis(300));
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(OpenAiClient::new(OpenAiConfig::new("ftp://x", "m")).unwrap_err().to_string().contains("--base-url"));
        assert!(OpenAiClient::new(OpenAiConfig::new("http://x/v1", " ")).unwrap_err().to_string().contains("--model"));
    }
}
