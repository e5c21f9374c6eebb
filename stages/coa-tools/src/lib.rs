//! The agents' tools, offline backends: `web_search` (BM25 over the corpus), `crawl_page`
//! (each page summarized for the agent's goal) and `code` (Python 3 in a sandbox), each producing the observation text
//! in the reference tools' format (docs/ARCHITECTURE.md, "The CoA format", "Tasks and tools").
//!
//! - [`search`] has [`Bm25Index`], [`SearchHit`] and [`render_search`];
//! - [`corpus`] has [`Corpus`], the pages + URL map + index, built once and shared;
//! - [`crawl`] has [`crawl_page`] and the crawl's goal ([`crawl::goal`]);
//! - [`flags`] has [`ToolFlags`] and [`CodeTimeout`], the tool flags every stage that runs the
//!   tools shares (`--search-k`, `--crawl-chars`, `--code-timeout`);
//! - [`code`] has [`run_python`] (the agents' tool), [`run_program`] (a program with unit tests
//!   or stdin), [`run_calls`] and [`run_checked`] (a program's functions called by a driver, the
//!   plain values they return coming back as [`PyValue`]s: how the rewards grade), [`SandboxLimits`],
//!   [`CodeRun`] and [`isolation`] (what this machine's kernel lets the sandbox enforce).
//!
//! Nothing here panics on bad input: bad data is an `Err` with context, and bad *agent*
//! behaviour (unknown URL, failing code) is an observation for the agent to read.

pub mod code;
pub mod corpus;
pub mod crawl;
pub mod flags;
pub mod search;

pub use code::{find_python, isolation, run_calls, run_checked, run_program, run_program_with, run_python, run_python_with, Answer, CodeRun, Ending, Isolation, Program, PyValue, RunStatus, SandboxLimits, TreeLimit, PLAIN_PY};
pub use corpus::Corpus;
pub use crawl::crawl_page;
pub use flags::{CodeTimeout, ToolFlags};
pub use search::{render_search, Bm25Index, SearchHit};
