//! The routes: request checking, prompts, and the OpenAI answers' JSON (whole or streamed as
//! server-sent events ending with `data: [DONE]`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State as AxState};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coa_generate::policy::{sample_seed, Codec, Mode, SampleConfig};
use coa_tokenize::chat::{ChatTemplate, PLAIN_TEMPLATE};
use coa_tokenize::Vocab;
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::{parse_body, ApiError, Content, Logprobs, Prompt, Request, Usage};
use crate::engine::{Event, Seq, TokenInfo, Trajectory, Work};

/// What the handlers share.
pub struct State {
    pub work: SyncSender<Work>,
    pub vocab: Arc<Vocab>,
    pub chat: ChatLayout,
    pub model_name: String,
    pub context: usize,
    pub max_choices: usize,
    /// Requests that may wait for a slot (`--queue`).
    pub queue: usize,
    pub tools: bool,
    pub suite: String,
    pub max_turns: usize,
    pub max_observation_tokens: Option<usize>,
    pub created: u64,
    pub stats: Arc<crate::engine::Stats>,
    /// Numbers the answers' ids.
    pub ids: AtomicU64,
    /// Counts requests without a seed (their seeds differ even within one clock tick).
    pub unseeded: AtomicU64,
}

type Shared = Arc<State>;

/// The most alternatives per token `top_logprobs` / `logprobs` may ask for (the API's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How chat messages become the prompt: the checkpoint's chat template, or (a checkpoint trained
/// without one) the plain layout as a template, both preceded by the vocabulary's BOS ids, as
/// `coa-tokenize` lays out a training row.
pub struct ChatLayout {
    template: ChatTemplate,
}

impl ChatLayout {
    pub fn new(vocab: &Vocab) -> anyhow::Result<ChatLayout> {
        let template = match &vocab.chat {
            Some(t) => ChatTemplate::new(&t.source, &t.bos_token, &t.eos_token)?,
            None => {
                let eos = vocab.eos.and_then(|id| vocab.tokenizer.id_to_token(id)).unwrap_or_default();
                ChatTemplate::new(PLAIN_TEMPLATE, "", &eos)?
            }
        };
        Ok(ChatLayout { template })
    }

    /// The prompt ids of `messages` (`(role, content)`), the assistant's turn opened.
    pub fn prompt_ids(&self, vocab: &Vocab, messages: &[(&str, &str)]) -> anyhow::Result<Vec<u32>> {
        let text = self.template.render(messages, true)?;
        let mut ids = vocab.bos.clone();
        vocab.encode_into(&text, &mut ids)?;
        Ok(ids)
    }
}

/// The app: the three API routes (and `/health`), OpenAI-style errors for unknown paths (404) and
/// methods (405), request bodies up to `max_body` bytes (413 above).
pub fn router(state: Shared, max_body: usize) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/health", get(|| async { "ok" }))
        .route("/stats", get(|AxState(st): AxState<Shared>| async move { Json(st.stats.json()) }))
        .fallback(|uri: axum::http::Uri| async move {
            ApiError::status(StatusCode::NOT_FOUND, "invalid_request_error", format!("no route {uri}: the API is GET /v1/models, POST /v1/chat/completions, POST /v1/completions"))
                .with_code("not_found")
        })
        .method_not_allowed_fallback(|method: axum::http::Method, uri: axum::http::Uri| async move {
            ApiError::status(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", format!("{method} {uri}: method not allowed")).with_code("method_not_allowed")
        })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn models(AxState(st): AxState<Shared>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": st.model_name, "object": "model", "created": st.created, "owned_by": "coa"}]}))
}

/// The body, or the error its reading gave (413 over the limit).
fn body_of(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE { "request_too_large" } else { "invalid_body" };
        ApiError::status(status, "invalid_request_error", format!("reading the request body: {}", e.body_text())).with_code(code)
    })
}

/// The two endpoints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

/// A checked request: its sequences and how to run and answer them.
struct Plan {
    seqs: Vec<Seq>,
    /// Prompt tokens, each distinct prompt counted once.
    prompt_tokens: usize,
    cfg: SampleConfig,
    mode: Mode,
    stop: Vec<String>,
    top_logprobs: Option<usize>,
    stream: bool,
}

async fn chat(AxState(st): AxState<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    respond(st, Kind::Chat, body).await
}

async fn completions(AxState(st): AxState<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    respond(st, Kind::Text, body).await
}

async fn respond(st: Shared, kind: Kind, body: Result<Bytes, BytesRejection>) -> Response {
    let plan = match body_of(body).and_then(|b| parse_body::<Request>(&b)).and_then(|r| plan(&st, kind, r)) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = unbounded_channel();
    let n = plan.seqs.len();
    let work = Work { seqs: plan.seqs.clone(), cfg: plan.cfg.clone(), mode: plan.mode, stop: plan.stop.clone(), top_logprobs: plan.top_logprobs, reply: tx };
    match st.work.try_send(work) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            return ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", format!("the server is busy: {} requests are already waiting (--queue); retry later", st.queue))
                .with_code("server_overloaded")
                .into_response()
        }
        Err(TrySendError::Disconnected(_)) => {
            return ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the decoder has stopped").with_code("decoder_stopped").into_response()
        }
    }
    let id = st.ids.fetch_add(1, Ordering::Relaxed);
    let id = match kind {
        Kind::Chat => format!("chatcmpl-{id}"),
        Kind::Text => format!("cmpl-{id}"),
    };
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let head = Head { id, created, model: st.model_name.clone(), kind, logprobs: plan.top_logprobs.is_some() };
    if plan.stream {
        let events = sse(head, rx, n, plan.prompt_tokens);
        return Sse::new(events).into_response();
    }
    match collect(rx, n).await {
        Ok(choices) => Json(head.whole(&choices, plan.prompt_tokens)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A finite number within `[lo, hi]`, else an error about `param`.
fn in_range(param: &str, v: Option<f64>, default: f64, lo: f64, hi: f64, what: &str) -> Result<f64, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x),
        Some(x) => Err(ApiError::invalid(param, format!("`{param}` is {x}: expected {what}"))),
    }
}

/// A count within `[lo, hi]`, else an error about `param`.
fn count(param: &str, v: Option<i64>, lo: i64, hi: i64) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x >= lo && x <= hi => Ok(Some(x as usize)),
        Some(x) => Err(ApiError::invalid(param, format!("`{param}` is {x}: expected a whole number from {lo} to {hi}"))),
    }
}

/// Checks a request and lays out its sequences.
fn plan(st: &State, kind: Kind, r: Request) -> Result<Plan, ApiError> {
    if let Some(m) = &r.model {
        if *m != st.model_name {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("the model `{m}` does not exist: this server serves `{}` (GET /v1/models)", st.model_name),
                kind: "invalid_request_error",
                param: Some("model".into()),
                code: Some("model_not_found"),
            });
        }
    }
    let other = |field: &str, endpoint: &str| ApiError::invalid(field, format!("`{field}` is a field of {endpoint}, not of this endpoint"));
    match kind {
        Kind::Chat if r.prompt.is_some() => return Err(other("prompt", "POST /v1/completions")),
        Kind::Chat if r.echo.is_some() => return Err(other("echo", "POST /v1/completions")),
        Kind::Text if r.messages.is_some() => return Err(other("messages", "POST /v1/chat/completions")),
        Kind::Text if r.max_completion_tokens.is_some() => return Err(other("max_completion_tokens", "POST /v1/chat/completions")),
        Kind::Text if r.top_logprobs.is_some() => return Err(ApiError::invalid("top_logprobs", "text completions take the number of alternatives as `logprobs`")),
        Kind::Text if r.suite.is_some() => return Err(other("suite", "POST /v1/chat/completions (with --tools)")),
        _ => {}
    }
    if r.echo == Some(true) {
        return Err(ApiError::invalid("echo", "`echo: true` is not supported: the answer holds the completion only"));
    }
    for (param, v) in [("frequency_penalty", r.frequency_penalty), ("presence_penalty", r.presence_penalty)] {
        if v.is_some_and(|x| x != 0.0) {
            return Err(ApiError::invalid(param, format!("`{param}` is not supported (only 0)")));
        }
    }
    if r.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::invalid("logit_bias", "`logit_bias` is not supported (only {})"));
    }
    let temperature = in_range("temperature", r.temperature, 1.0, 0.0, 2.0, "a number from 0 to 2 (0 = greedy)")? as f32;
    let top_p = in_range("top_p", r.top_p, 1.0, f64::MIN_POSITIVE, 1.0, "a probability in (0, 1]")? as f32;
    let n = count("n", r.n, 1, st.max_choices as i64)?.unwrap_or(1);
    let max_tokens = match (r.max_tokens, r.max_completion_tokens) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("max_completion_tokens", "give `max_tokens` or `max_completion_tokens`, not both")),
        (Some(m), None) => count("max_tokens", Some(m), 1, i64::MAX)?,
        (None, m) => count("max_completion_tokens", m, 1, i64::MAX)?,
    };
    let top_logprobs = match (kind, r.logprobs, r.top_logprobs) {
        (_, None, None) | (Kind::Chat, Some(Logprobs::Switch(false)), None) => None,
        (Kind::Chat, Some(Logprobs::Switch(true)), k) => Some(count("top_logprobs", k, 0, MAX_TOP_LOGPROBS as i64)?.unwrap_or(0)),
        (Kind::Chat, _, Some(_)) => return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
        (Kind::Chat, Some(Logprobs::Top(_)), None) => return Err(ApiError::invalid("logprobs", "`logprobs` of a chat completion is true or false")),
        (Kind::Text, Some(Logprobs::Top(k)), None) => count("logprobs", Some(k), 0, MAX_TOP_LOGPROBS as i64)?,
        (Kind::Text, Some(Logprobs::Switch(_)), _) => return Err(ApiError::invalid("logprobs", "`logprobs` of a text completion is a number of alternatives (0 to 20)")),
        (Kind::Text, _, Some(_)) => unreachable!("refused above"),
    };
    let stop = r.stop.as_ref().map(|s| s.list()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::invalid("stop", format!("`stop` has {} strings: at most 4", stop.len())));
    }
    let agent = kind == Kind::Chat && st.tools;
    if agent && (r.logprobs.is_some() || !stop.is_empty()) {
        return Err(ApiError::invalid(if stop.is_empty() { "logprobs" } else { "stop" }, "with --tools a chat completion runs the whole agent loop: `stop` and `logprobs` do not apply"));
    }
    if r.suite.is_some() && !agent {
        return Err(ApiError::invalid("suite", "`suite` chooses the agent's instruction: the server runs without --tools"));
    }
    // No seed: one of its own (the clock, mixed with a count so that two requests in the same
    // nanosecond differ).
    let seed = r.seed.map_or_else(|| coa_schemas::rng::splitmix64_mix(now_nanos() ^ st.unseeded.fetch_add(1, Ordering::Relaxed).rotate_left(32)), |s| s as u64);

    let prompts: Vec<Vec<u32>> = match kind {
        Kind::Chat => vec![chat_prompt(st, &r, agent)?],
        Kind::Text => text_prompts(st, r.prompt.as_ref())?,
    };
    let mut seqs = Vec::with_capacity(prompts.len() * n);
    let mut max_response = usize::MAX;
    for (p, ids) in prompts.iter().enumerate() {
        let param = if kind == Kind::Chat { "messages" } else { "prompt" };
        if ids.len() >= st.context {
            return Err(ApiError::invalid(param, format!("the prompt is {} tokens: this server's context is {} tokens (--context), with room for at least one new token", ids.len(), st.context))
                .with_code("context_length_exceeded"));
        }
        let room = st.context - ids.len();
        if let Some(m) = max_tokens {
            if m > room {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("max_tokens {m} and the prompt's {} tokens need {} positions: this server's context is {} tokens (--context); ask for {room} or fewer", ids.len(), ids.len() as u128 + m as u128, st.context),
                )
                .with_code("context_length_exceeded"));
            }
        }
        max_response = max_response.min(max_tokens.unwrap_or(room));
        for k in 0..n {
            seqs.push(Seq { index: p * n + k, prompt_ids: ids.clone(), seed: sample_seed(seed, "coa-serve", k) });
        }
    }
    if seqs.len() > st.max_choices {
        return Err(ApiError::invalid("n", format!("{} prompts times n = {n} is {} sequences: this server runs at most {} per request (--batch)", prompts.len(), seqs.len(), st.max_choices)));
    }
    let cfg = SampleConfig {
        temperature,
        top_p,
        max_response_tokens: max_response,
        max_turns: if agent { st.max_turns } else { usize::MAX },
        max_observation_tokens: st.max_observation_tokens,
    };
    Ok(Plan {
        seqs,
        prompt_tokens: prompts.iter().map(Vec::len).sum(),
        cfg,
        mode: if agent { Mode::Agent } else { Mode::Text },
        stop,
        top_logprobs,
        stream: r.stream,
    })
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The text of a message's content (text parts joined).
fn content_text(i: usize, c: Option<&Content>) -> Result<String, ApiError> {
    match c {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s.clone()),
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => s.push_str(t),
                    _ => return Err(ApiError::invalid(&format!("messages[{i}].content[{j}]"), format!("a content part of type `{}`: only text parts (with `text`) are supported", p.kind))),
                }
            }
            Ok(s)
        }
    }
}

fn chat_prompt(st: &State, r: &Request, agent: bool) -> Result<Vec<u32>, ApiError> {
    let messages = r.messages.as_deref().unwrap_or_default();
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is required and must not be empty"));
    }
    let mut turns: Vec<(String, String)> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant") {
            return Err(ApiError::invalid(&format!("messages[{i}].role"), format!("role `{}`: expected system, developer, user or assistant", m.role)));
        }
        let role = if m.role == "developer" { "system" } else { m.role.as_str() };
        turns.push((role.to_string(), content_text(i, m.content.as_ref())?));
    }
    let internal = |e: anyhow::Error| ApiError::invalid("messages", format!("{e:#}"));
    if agent {
        // The agent is prompted as it was trained: the suite's instruction and the question (the
        // last user message).
        let question = turns.iter().rev().find(|(role, _)| role == "user").map(|(_, c)| c.as_str());
        let Some(question) = question else { return Err(ApiError::invalid("messages", "with --tools the question is the last user message: there is none")) };
        let suite = r.suite.as_deref().unwrap_or(&st.suite);
        let codec = Codec::new(&st.vocab).map_err(internal)?;
        return codec.prompt_ids(suite, question).map_err(internal);
    }
    let pairs: Vec<(&str, &str)> = turns.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
    st.chat.prompt_ids(&st.vocab, &pairs).map_err(internal)
}

fn text_prompts(st: &State, p: Option<&Prompt>) -> Result<Vec<Vec<u32>>, ApiError> {
    let v = st.vocab.size() as u32;
    let encode = |s: &str| -> Result<Vec<u32>, ApiError> {
        let mut ids = st.vocab.bos.clone();
        st.vocab.encode_into(s, &mut ids).map_err(|e| ApiError::invalid("prompt", format!("{e:#}")))?;
        Ok(ids)
    };
    let check = |ids: &[u32]| -> Result<Vec<u32>, ApiError> {
        match ids.iter().find(|&&t| t >= v) {
            Some(t) => Err(ApiError::invalid("prompt", format!("token id {t} is not in the vocabulary ({v} tokens)"))),
            None => Ok(ids.to_vec()),
        }
    };
    let prompts = match p {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Prompt::Text(s)) => vec![encode(s)?],
        Some(Prompt::Texts(v)) => v.iter().map(|s| encode(s)).collect::<Result<_, _>>()?,
        Some(Prompt::Ids(ids)) => vec![check(ids)?],
        Some(Prompt::IdLists(l)) => l.iter().map(|ids| check(ids)).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid("prompt", "an empty prompt: give at least one token of text"));
    }
    Ok(prompts)
}

/// One finished choice.
#[derive(Debug, Default)]
struct Choice {
    text: String,
    finish_reason: &'static str,
    tokens: Vec<TokenInfo>,
    completion_tokens: usize,
    trajectory: Option<Box<Trajectory>>,
}

/// Waits for all `n` choices.
async fn collect(mut rx: UnboundedReceiver<Event>, n: usize) -> Result<Vec<Choice>, ApiError> {
    let mut out: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
    let mut left = n;
    while left > 0 {
        match rx.recv().await {
            Some(Event::Token { index, token, .. }) => out[index].tokens.extend(token),
            Some(Event::Done { index, finish_reason, text, completion_tokens, trajectory, .. }) => {
                let c = &mut out[index];
                (c.text, c.finish_reason, c.completion_tokens, c.trajectory) = (text, finish_reason, completion_tokens, trajectory);
                left -= 1;
            }
            Some(Event::Failed(msg)) => return Err(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg)),
            None => return Err(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the decoder stopped before the answer was finished")),
        }
    }
    Ok(out)
}

/// What every answer of a request repeats.
#[derive(Clone)]
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    logprobs: bool,
}

fn token_json(t: &TokenInfo) -> Value {
    let top: Vec<Value> = t.top.iter().map(|(s, lp)| json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})).collect();
    json!({"token": t.text, "logprob": t.logprob, "bytes": t.text.as_bytes(), "top_logprobs": top})
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    /// The `logprobs` of a choice: the chat form (`content`: one entry per token) or the text form
    /// (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`); `offset` is where the tokens'
    /// text starts in the choice's text.
    fn logprobs(&self, tokens: &[TokenInfo], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.kind {
            Kind::Chat => json!({"content": tokens.iter().map(token_json).collect::<Vec<_>>()}),
            Kind::Text => {
                let mut at = offset;
                let offsets: Vec<usize> = tokens
                    .iter()
                    .map(|t| {
                        let o = at;
                        at += t.text.len();
                        o
                    })
                    .collect();
                json!({
                    "tokens": tokens.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                    "top_logprobs": tokens.iter().map(|t| t.top.iter().map(|(s, lp)| (s.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    fn whole(&self, choices: &[Choice], prompt_tokens: usize) -> Value {
        let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = match self.kind {
                    Kind::Chat => json!({"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": self.logprobs(&c.tokens, 0), "finish_reason": c.finish_reason}),
                    Kind::Text => json!({"index": i, "text": c.text, "logprobs": self.logprobs(&c.tokens, 0), "finish_reason": c.finish_reason}),
                };
                if let Some(t) = &c.trajectory {
                    v["trajectory"] = serde_json::to_value(t).unwrap_or(Value::Null);
                }
                v
            })
            .collect();
        json!({"id": self.id, "object": self.object(false), "created": self.created, "model": self.model, "choices": choices, "usage": Usage::new(prompt_tokens, completion)})
    }

    /// One streamed chunk of choice `index`.
    fn chunk(&self, index: usize, delta: Option<&str>, role: bool, tokens: &[TokenInfo], offset: usize, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut d = serde_json::Map::new();
                if role {
                    d.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = delta {
                    d.insert("content".into(), json!(t));
                }
                json!({"index": index, "delta": d, "logprobs": if tokens.is_empty() { Value::Null } else { self.logprobs(tokens, offset) }, "finish_reason": finish})
            }
            Kind::Text => json!({"index": index, "text": delta.unwrap_or(""), "logprobs": if tokens.is_empty() { Value::Null } else { self.logprobs(tokens, offset) }, "finish_reason": finish}),
        };
        json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model, "choices": [choice]})
    }

    /// The last chunk: no choices, the usage.
    fn usage_chunk(&self, usage: Usage) -> Value {
        json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model, "choices": [], "usage": usage})
    }
}

/// The stream of an answer: a chunk per event, a last chunk with the usage, then `[DONE]`.
fn sse(head: Head, rx: UnboundedReceiver<Event>, n: usize, prompt_tokens: usize) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    struct S {
        head: Head,
        rx: UnboundedReceiver<Event>,
        left: usize,
        started: Vec<bool>,
        /// Text bytes sent per choice (the text form's `text_offset`).
        sent: Vec<usize>,
        completion: usize,
        prompt_tokens: usize,
        end: u8,
    }
    let s = S { head, rx, left: n, started: vec![false; n], sent: vec![0; n], completion: 0, prompt_tokens, end: 0 };
    stream::unfold(s, |mut s| async move {
        let data = |v: Value| Ok::<_, Infallible>(SseEvent::default().data(v.to_string()));
        if s.left == 0 {
            s.end += 1;
            return match s.end {
                1 => {
                    let u = s.head.usage_chunk(Usage::new(s.prompt_tokens, s.completion));
                    Some((data(u), s))
                }
                2 => Some((Ok(SseEvent::default().data("[DONE]")), s)),
                _ => None,
            };
        }
        let ev = match s.rx.recv().await {
            Some(Event::Token { index, delta, token }) => {
                let role = !std::mem::replace(&mut s.started[index], true);
                let tokens: Vec<TokenInfo> = token.into_iter().collect();
                let v = s.head.chunk(index, Some(&delta), role, &tokens, s.sent[index], None);
                s.sent[index] += delta.len();
                data(v)
            }
            Some(Event::Done { index, finish_reason, tail, completion_tokens, trajectory, .. }) => {
                s.left -= 1;
                s.completion += completion_tokens;
                let role = !std::mem::replace(&mut s.started[index], true);
                let mut v = s.head.chunk(index, Some(&tail), role, &[], s.sent[index], Some(finish_reason));
                if let Some(t) = trajectory {
                    v["choices"][0]["trajectory"] = serde_json::to_value(t).unwrap_or(Value::Null);
                }
                data(v)
            }
            Some(Event::Failed(msg)) => {
                s.left = 0;
                s.end = 1;
                data(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg).body())
            }
            None => {
                s.left = 0;
                s.end = 1;
                data(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the decoder stopped before the answer was finished").body())
            }
        };
        Some((ev, s))
    })
}
