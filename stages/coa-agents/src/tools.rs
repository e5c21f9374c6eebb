//! The tools the agents call, over the offline backends of `coa-tools`.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use coa_tools::crawl::Goal;
use coa_tools::{crawl_page, render_search, run_python, Corpus, SandboxLimits};

use crate::action::Action;

/// Tool settings shared by every run.
#[derive(Debug, Clone)]
pub struct ToolConfig {
    /// Hits per `web_search`.
    pub search_k: usize,
    /// Characters kept per crawled page (its summary for the crawl's goal, `coa_tools::crawl`).
    pub crawl_chars: usize,
    /// Sandbox limits of the `code` tool (and of the unit tests that check code answers).
    pub limits: SandboxLimits,
}

impl Default for ToolConfig {
    /// The tool flags' defaults (`coa_tools::flags`), the sandbox's default limits.
    fn default() -> Self {
        ToolConfig { search_k: coa_tools::flags::SEARCH_K, crawl_chars: coa_tools::flags::CRAWL_CHARS, limits: SandboxLimits::default() }
    }
}

/// The tools of one stage run: the corpus (for web suites) and the sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Tools<'a> {
    pub corpus: Option<&'a Corpus>,
    pub config: &'a ToolConfig,
}

/// A tool's observation and how long the tool took.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub observation: String,
    pub wall_ms: f64,
}

impl Tools<'_> {
    /// Runs the tool of `action` on `input` (a query, `|`-separated URLs, or Python source) and
    /// renders its observation as `coa-tools` does; a crawl summarizes its pages for `goal`
    /// (the agent's last think and web search). `Err` only when the
    /// tool itself cannot run (no corpus loaded, the sandbox failing); bad input is an
    /// observation for the agent.
    pub fn run(&self, action: Action, input: &str, goal: &Goal) -> Result<ToolOutput> {
        let start = Instant::now();
        let observation = match action {
            Action::WebSearch => render_search(&self.corpus()?.search(input, self.config.search_k)),
            Action::CrawlPage => crawl_page(self.corpus()?, input, goal, self.config.crawl_chars),
            Action::Code => run_python(input, None, &self.config.limits).context("running the code tool")?.render(),
            other => bail!("`{other}` is not a tool call"),
        };
        Ok(ToolOutput { observation, wall_ms: start.elapsed().as_secs_f64() * 1000.0 })
    }

    fn corpus(&self) -> Result<&Corpus> {
        match self.corpus {
            Some(c) => Ok(c),
            None => bail!("web_search/crawl_page need a corpus: pass --corpus FILE (written by `coa-generate tasks --corpus-out`)"),
        }
    }
}
