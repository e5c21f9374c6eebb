//! `coa-serve`: serves a checkpoint (an HF directory as coa-train-step saves it, or a GGUF file)
//! over HTTP with the OpenAI API: `GET /v1/models`, `POST /v1/chat/completions` and
//! `POST /v1/completions` (streaming as server-sent events), so that an application, a notebook or
//! another agent framework can use a model `make pipeline` trained.
//!
//! - [`engine`]: the decode thread. It owns the model and its KV cache and runs the continuous
//!   batch of `coa-generate policy` (`coa_generate::policy::Batch`, the same decoder and sampler):
//!   concurrent requests share one batched forward per token, a request joins at the next step and
//!   leaves when it is finished.
//! - [`http`]: the routes (axum on hyper and tokio), request checking and the answers' JSON.
//! - [`api`]: the request bodies and the OpenAI-style error object.
//!
//! With `--tools`, a chat completion runs the whole CoA agent loop server-side (the tools and
//! sandbox of `coa-generate policy`) and returns the final answer with the trajectory.

pub mod api;
pub mod engine;
pub mod http;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use coa_generate::policy::{CheckpointFlags, DecodeFlags};
use coa_schemas::flags::{at_least_one, ThreadsArg};
use coa_tools::flags::ToolFlags;

#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "coa-serve",
    version,
    about = "Serve a checkpoint with the OpenAI API (chat and text completions, streaming), concurrent requests sharing one batched decoder",
    after_help = "Examples:\n  coa-serve --checkpoint runs/default/rl/checkpoint\n  \
coa-serve --checkpoint runs/default/rl/checkpoint --tools --corpus runs/default/corpus.parquet\n  \
coa-serve --checkpoint .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --port 0   # prints the address it bound"
)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: CheckpointFlags,
    #[command(flatten)]
    pub decode: DecodeFlags,
    /// Address to listen on (loopback by default: the API has no authentication).
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDR")]
    pub host: String,
    /// Port to listen on; 0 takes a free one. The bound address is printed on stdout
    /// (`http://ADDR:PORT`) once the model is loaded and the server accepts requests.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model's name in the API (`GET /v1/models`; requests naming another model get 404).
    /// Default: the checkpoint directory's or file's name.
    #[arg(long, value_name = "NAME")]
    pub model_name: Option<String>,
    /// Sequences decoded together (KV-cache slots); also the most choices one request may ask for.
    #[arg(long, value_parser = at_least_one::<usize>, default_value = "8", value_name = "N")]
    pub batch: usize,
    /// Tokens per sequence, prompt and completion together (default: the model's
    /// max_position_embeddings, at most 2048). Every slot's KV cache holds this many.
    #[arg(long, value_parser = at_least_one::<usize>, value_name = "N")]
    pub context: Option<usize>,
    /// Requests waiting for a slot; more at once are refused with 503 (retry later).
    #[arg(long, value_parser = at_least_one::<usize>, default_value = "64", value_name = "N")]
    pub queue: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, value_parser = at_least_one::<usize>, default_value = "4194304", value_name = "BYTES")]
    pub max_body: usize,
    /// Chat completions run the CoA agent loop: tool calls (code, search, crawl) are executed
    /// server-side as in `coa-generate policy`, and the answer carries the trajectory.
    #[arg(long)]
    pub tools: bool,
    /// With --tools: the offline web the search and crawl tools read (written by `coa-generate
    /// tasks --corpus-out`); without it a web tool answers that it is not available.
    #[arg(long, value_name = "FILE", requires = "tools")]
    pub corpus: Option<PathBuf>,
    /// With --tools: the suite whose instruction prompts the agent when a request names none
    /// (`suite` in the request body).
    #[arg(long, default_value = "multihop", value_name = "SUITE")]
    pub suite: String,
    /// With --tools: generation turns per answer (a turn ends at a tool call).
    #[arg(long, value_parser = at_least_one::<usize>, default_value = "16", value_name = "N")]
    pub max_turns: usize,
    /// With --tools: keep only the first N tokens of each observation's body.
    #[arg(long, value_parser = at_least_one::<usize>, value_name = "N")]
    pub max_observation_tokens: Option<usize>,
    #[command(flatten)]
    pub tool_flags: ToolFlags,
    #[command(flatten)]
    pub threads: ThreadsArg,
}

/// The largest context used when `--context` is not given.
pub const DEFAULT_CONTEXT: usize = 2048;

/// A running server: its address; dropping it stops accepting connections.
pub struct Running {
    pub addr: SocketAddr,
    pub model_name: String,
    pub device: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Running {
    /// `http://ADDR:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves until the server stops (an error of the listener).
    pub fn wait(mut self) -> Result<()> {
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(anyhow!("the server thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Loads the checkpoint, opens the decoder, binds the address and serves in the background.
pub fn start(args: &ServeArgs) -> Result<Running> {
    let device = args.decode.select()?;
    // A second server in the same process (tests) finds the pool built: not an error.
    let _ = args.threads.install();
    let (model, vocab) = args.model.load()?;
    let positions = model.config.max_position_embeddings;
    start_with(args, vocab, Box::new(engine::ModelDecoding { model, flags: args.decode.clone(), device }), positions)
}

/// [`start`] with the vocabulary and decoder given (`positions`: the most the model takes): the
/// checkpoint's model, or in tests a scripted policy.
pub fn start_with(args: &ServeArgs, vocab: coa_tokenize::Vocab, decoding: Box<dyn engine::Decoding>, positions: usize) -> Result<Running> {
    let vocab = Arc::new(vocab);
    let context = match args.context {
        Some(n) if n > positions => bail!("--context {n}: more than the model's max_position_embeddings {positions} (--checkpoint {})", args.model.checkpoint.display()),
        Some(n) => n,
        None => positions.min(DEFAULT_CONTEXT),
    };
    let model_name = args.model.name(args.model_name.as_deref());
    let tools = if args.tools {
        let corpus = match &args.corpus {
            Some(path) => {
                let mut stage = coa_schemas::stage::Stage::new("coa-serve", env!("CARGO_PKG_VERSION"));
                Some(coa_generate::read_corpus(&mut stage, path)?)
            }
            None => None,
        };
        Some(engine::ToolSetup { corpus, config: coa_generate::tool_config(&args.tool_flags) })
    } else {
        None
    };
    // The chat layout: the checkpoint's template, else the plain layout it was trained with.
    let chat = http::ChatLayout::new(&vocab)?;
    let stats = Arc::new(engine::Stats::default());
    let cfg = engine::EngineConfig { slots: args.batch, context, tools, stats: stats.clone() };
    let (work, device) = engine::spawn(decoding, vocab.clone(), cfg, args.queue)?;
    let state = Arc::new(http::State {
        work,
        vocab,
        chat,
        model_name: model_name.clone(),
        context,
        max_choices: args.batch,
        queue: args.queue,
        tools: args.tools,
        suite: args.suite.clone(),
        max_turns: args.max_turns,
        max_observation_tokens: args.max_observation_tokens,
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        ids: Default::default(),
        unseeded: Default::default(),
        stats,
    });
    let listener = std::net::TcpListener::bind((args.host.as_str(), args.port)).with_context(|| format!("--host {} --port {}: binding", args.host, args.port))?;
    listener.set_nonblocking(true).context("the listening socket")?;
    let addr = listener.local_addr().context("the listening socket")?;
    let app = http::router(state, args.max_body);
    let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("coa-serve-http".into())
        .spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("starting the HTTP runtime")?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).context("the listening socket")?;
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .context("serving HTTP")
            })
        })
        .context("starting the HTTP thread")?;
    Ok(Running { addr, model_name, device, shutdown: Some(shutdown), thread: Some(thread) })
}
