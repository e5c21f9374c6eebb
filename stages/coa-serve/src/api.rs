//! The OpenAI API's request and response bodies (the subset coa-serve implements), and the
//! error object every failure answers with.
//!
//! Requests are parsed strictly: a field this server does not know is an error naming it (a
//! silently ignored setting would give the caller other results than it asked for). Fields the
//! API has but this server cannot honour (`frequency_penalty`, `logit_bias`, ...) are accepted at
//! their neutral value only.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}` with its HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A request the server will not run (400, `invalid_request_error`), about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), kind: "invalid_request_error", param: Some(param.to_string()), code: None }
    }
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }
    pub fn status(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Parses a request body: malformed JSON is 400 (`invalid_json`); JSON of the wrong shape (an
/// unknown field, a wrong type, a missing field) is 422 with the field's path as `param`, as
/// axum's own JSON extractor answers.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = serde_path_to_error::deserialize(&mut de);
    if parsed.is_ok() {
        // Trailing characters after the JSON value.
        de.end().map_err(|e| ApiError::status(StatusCode::BAD_REQUEST, "invalid_request_error", format!("the request body is not valid JSON: {e}")).with_code("invalid_json"))?;
    }
    parsed.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                message: if path == "." { format!("the request body: {inner}") } else { format!("`{path}`: {inner}") },
                kind: "invalid_request_error",
                param: (path != ".").then_some(path),
                code: Some("invalid_type"),
            },
            _ => ApiError {
                status: StatusCode::BAD_REQUEST,
                message: format!("the request body is not valid JSON: {inner}"),
                kind: "invalid_request_error",
                param: None,
                code: Some("invalid_json"),
            },
        }
    })
}

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn list(&self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

/// A message's `content`: a string or a list of text parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `prompt` of a text completion: a string, a list of strings, token ids, or a list of those.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// `logprobs`: a switch in chat completions, the number of top alternatives in text completions.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    Switch(bool),
    Top(i64),
}

/// The body of `POST /v1/chat/completions` and `POST /v1/completions`: one type, so that the
/// settings both take are declared (and checked) once; each endpoint refuses the other's fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub model: Option<String>,
    /// Chat completions only.
    pub messages: Option<Vec<Message>>,
    /// Text completions only.
    pub prompt: Option<Prompt>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<i64>,
    /// Chat completions: the newer name of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    pub seed: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<Logprobs>,
    /// Chat completions: alternatives per token with `logprobs: true`.
    pub top_logprobs: Option<i64>,
    /// Text completions: only `false` (the prompt is not repeated in the answer).
    pub echo: Option<bool>,
    pub user: Option<String>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// coa-serve with `--tools` (chat completions): the task suite whose instruction prompts the
    /// agent (default: `--suite`).
    pub suite: Option<String>,
}

/// `usage` of every answer.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens }
    }
}
