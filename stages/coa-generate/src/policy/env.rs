//! The environment of the loop: the tools a sample calls ([`Environment`], [`ToolEnv`]), the
//! token ids the loop watches for and the observation blocks it appends ([`Codec`]), and the
//! input a tool call's tokens hold ([`tool_call`]).

use anyhow::{anyhow, bail, Result};
use coa_agents::{Action, Tools};
use coa_format::{build_plain_prompt, build_prompt, code_source, find_last_block, render, Step, Tag};
use coa_tokenize::{encode_row, Vocab};
use coa_tools::crawl::Goal;

/// What joins a tool call and its observation block in the rendered CoA text (`coa_format::render`
/// separates blocks with one newline; a test holds the two together).
pub const OBSERVATION_PREFIX: &str = "\n";

/// Runs a tool call and returns its observation text (the body of `<observation>`). `goal` is
/// what a crawl summarizes its pages for (the response's last think and web search; empty for
/// other tools).
pub trait Environment: Sync {
    fn observe(&self, tool: Tag, input: &str, goal: &Goal) -> Result<String>;
}

/// The teacher's tools (`coa_agents::Tools`).
pub struct ToolEnv<'a> {
    pub tools: Tools<'a>,
}

impl Environment for ToolEnv<'_> {
    fn observe(&self, tool: Tag, input: &str, goal: &Goal) -> Result<String> {
        let action = match tool {
            Tag::WebSearch | Tag::WikiSearch => Action::WebSearch,
            Tag::CrawlPage => Action::CrawlPage,
            Tag::Code => Action::Code,
            other => bail!("{} is not a tool", other.open()),
        };
        if action != Action::Code && self.tools.corpus.is_none() {
            // A web tool called on a task without a corpus (a math or code task): the model
            // learns from the answer, the run goes on.
            return Ok(format!("[ERROR] {} is not available for this task.", tool.name()));
        }
        Ok(self.tools.run(action, input, goal)?.observation)
    }
}


/// The ids the loop watches for, and the vocabulary to encode observations and decode turns.
pub struct Codec<'a> {
    pub vocab: &'a Vocab,
    pub(super) eos: Option<u32>,
    /// `</answer>`; none for plain answers.
    pub(super) answer_close: Option<u32>,
    /// (opening id, closing id, tag) of every tool; none for plain answers.
    pub(super) tools: Vec<(u32, u32, Tag)>,
    obs_head: Vec<u32>,
    obs_tail: Vec<u32>,
    /// Plain answers: the plain prompt, and these ids (the CoA tags) are never sampled.
    plain: bool,
    pub(super) never_sampled: Vec<u32>,
}

impl<'a> Codec<'a> {
    pub fn new(vocab: &'a Vocab) -> Result<Self> {
        let id = |s: &str| -> Result<u32> {
            vocab.tokenizer.token_to_id(s).ok_or_else(|| anyhow!("{}: the CoA tag {s} is not in the vocabulary", vocab.source))
        };
        let tools = [Tag::WebSearch, Tag::WikiSearch, Tag::CrawlPage, Tag::Code]
            .into_iter()
            .map(|t| Ok((id(t.open())?, id(t.close())?, t)))
            .collect::<Result<Vec<_>>>()?;
        let mut obs_head = Vec::new();
        vocab.encode_into(&format!("{OBSERVATION_PREFIX}{}", Tag::Observation.open()), &mut obs_head)?;
        let mut obs_tail = Vec::new();
        vocab.encode_into(Tag::Observation.close(), &mut obs_tail)?;
        let answer_close = Some(id(Tag::Answer.close())?);
        Ok(Codec { vocab, eos: vocab.eos, answer_close, tools, obs_head, obs_tail, plain: false, never_sampled: Vec::new() })
    }

    /// Plain answers (`--plain`): no tools, no `</answer>`; the sample ends at EOS or the budget.
    /// The CoA tags the vocabulary holds are never sampled: a pretrained model's vocabulary is
    /// grown by them, with rows it was never trained on.
    pub fn plain(vocab: &'a Vocab) -> Codec<'a> {
        let tok = &vocab.tokenizer;
        let mut never_sampled: Vec<u32> = Tag::ALL.iter().flat_map(|t| [t.open(), t.close()]).filter_map(|s| tok.token_to_id(s)).collect();
        never_sampled.sort_unstable();
        never_sampled.dedup();
        Codec { vocab, eos: vocab.eos, answer_close: None, tools: Vec::new(), obs_head: Vec::new(), obs_tail: Vec::new(), plain: true, never_sampled }
    }

    /// The prompt ids of a task: the conditioning prefix of the training layout.
    pub fn prompt_ids(&self, suite: &str, question: &str) -> Result<Vec<u32>> {
        let prompt = if self.plain { build_plain_prompt(suite, question) } else { build_prompt(suite, question) };
        let enc = encode_row(self.vocab, &prompt, "", &[], &[]).map_err(|e| anyhow!("{e}"))?;
        Ok(enc.ids[..enc.prompt_len as usize].to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.vocab.tokenizer.decode(ids, false).map_err(|e| anyhow!("decoding tokens: {e}"))
    }

    /// The ids of the observation block for `body` (prefix, tags, body cut to `max_body` tokens).
    pub(super) fn observation_ids(&self, body: &str, max_body: Option<usize>) -> Result<Vec<u32>> {
        // Text a tool returns may hold `</observation>`, which would end the block early and
        // could not be rendered; it is removed.
        let body = body.replace(Tag::Observation.close(), "");
        // The block as training renders it (a check: an error here is a bug, not bad input).
        let block = render(&[Step::new(Tag::Observation, &body)]).map_err(|e| anyhow!("rendering an observation: {e}"))?;
        debug_assert!(block.text.starts_with(Tag::Observation.open()));
        let mut body_ids = Vec::new();
        self.vocab.encode_into(&body, &mut body_ids)?;
        if let Some(n) = max_body {
            body_ids.truncate(n);
        }
        let mut ids = self.obs_head.clone();
        ids.extend(body_ids);
        ids.extend_from_slice(&self.obs_tail);
        Ok(ids)
    }
}

/// The input of the tool call whose closing tag ends `response` (that tool's `open` id is the
/// opening tag): this turn's tokens only, after the last opening tag of that tool (for `<code>`,
/// the fenced source); and, for a crawl, the goal it summarizes its pages for.
pub(super) fn tool_call(codec: &Codec, response: &[u32], turn_start: usize, open: u32, tag: Tag) -> Result<(String, Goal)> {
    let turn = &response[turn_start..response.len() - 1];
    let from = turn.iter().rposition(|&t| t == open).map_or(0, |p| p + 1);
    let content = codec.decode(&turn[from..])?;
    let input = if tag == Tag::Code { code_source(&content).to_string() } else { content.trim().to_string() };
    let goal = match tag {
        Tag::CrawlPage => {
            let text = codec.decode(response)?;
            Goal::new(find_last_block(&text, Tag::Think), find_last_block(&text, Tag::WebSearch))
        }
        _ => Goal::default(),
    };
    Ok((input, goal))
}
