//! The CoA tags (docs/ARCHITECTURE.md, "The CoA format"): bare XML-like `<name>…</name>` blocks,
//! lowercase, no attributes.

use std::fmt;

use coa_schemas::suite::tool;

/// One CoA tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tag {
    /// Role-playing: private reasoning before an action.
    Think,
    /// Role-playing: the planning agent's plan.
    Plan,
    /// Role-playing: the reflection agent's graded review of the trajectory.
    Reflection,
    /// Role-playing: a candidate answer, to be verified.
    SuggestedAnswer,
    /// Role-playing: the verification agent's `score: N` (1-4) of the suggested answer.
    DoubleCheck,
    /// Tool call: a search query.
    WebSearch,
    /// Tool call: a search query (alias of `web_search`, as the AFM MHQA data spells it).
    WikiSearch,
    /// Tool call: one or several `|`-separated URLs to read.
    CrawlPage,
    /// Tool call: a fenced Python program.
    Code,
    /// Environment: a tool's output (never a training target).
    Observation,
    /// Final: the answer; ends the trajectory.
    Answer,
}

/// What kind of agent (or the environment) writes a tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagKind {
    RolePlaying,
    Tool,
    Environment,
    Final,
}

/// Names of the tools a trajectory may call (the tool tags).
pub const TOOL_NAMES: [&str; 4] = tool::ALL;

/// Whether `name` is a known tool (see [`TOOL_NAMES`]).
pub fn is_known_tool(name: &str) -> bool {
    TOOL_NAMES.contains(&name)
}

impl Tag {
    /// Every tag, in documentation order.
    pub const ALL: [Tag; 11] = [
        Tag::Think,
        Tag::Plan,
        Tag::Reflection,
        Tag::SuggestedAnswer,
        Tag::DoubleCheck,
        Tag::WebSearch,
        Tag::WikiSearch,
        Tag::CrawlPage,
        Tag::Code,
        Tag::Observation,
        Tag::Answer,
    ];

    /// The tag's name, as written between `<` and `>`.
    pub const fn name(self) -> &'static str {
        match self {
            Tag::Think => "think",
            Tag::Plan => "plan",
            Tag::Reflection => "reflection",
            Tag::SuggestedAnswer => "suggested_answer",
            Tag::DoubleCheck => "double_check",
            Tag::WebSearch => tool::WEB_SEARCH,
            Tag::WikiSearch => tool::WIKI_SEARCH,
            Tag::CrawlPage => tool::CRAWL_PAGE,
            Tag::Code => tool::CODE,
            Tag::Observation => "observation",
            Tag::Answer => "answer",
        }
    }

    /// `<name>`.
    pub const fn open(self) -> &'static str {
        match self {
            Tag::Think => "<think>",
            Tag::Plan => "<plan>",
            Tag::Reflection => "<reflection>",
            Tag::SuggestedAnswer => "<suggested_answer>",
            Tag::DoubleCheck => "<double_check>",
            Tag::WebSearch => "<web_search>",
            Tag::WikiSearch => "<wiki_search>",
            Tag::CrawlPage => "<crawl_page>",
            Tag::Code => "<code>",
            Tag::Observation => "<observation>",
            Tag::Answer => "<answer>",
        }
    }

    /// `</name>`.
    pub const fn close(self) -> &'static str {
        match self {
            Tag::Think => "</think>",
            Tag::Plan => "</plan>",
            Tag::Reflection => "</reflection>",
            Tag::SuggestedAnswer => "</suggested_answer>",
            Tag::DoubleCheck => "</double_check>",
            Tag::WebSearch => "</web_search>",
            Tag::WikiSearch => "</wiki_search>",
            Tag::CrawlPage => "</crawl_page>",
            Tag::Code => "</code>",
            Tag::Observation => "</observation>",
            Tag::Answer => "</answer>",
        }
    }

    /// The tag named `name` (exact, lowercase), if any.
    pub fn from_name(name: &str) -> Option<Tag> {
        Some(match name {
            "think" => Tag::Think,
            "plan" => Tag::Plan,
            "reflection" => Tag::Reflection,
            "suggested_answer" => Tag::SuggestedAnswer,
            "double_check" => Tag::DoubleCheck,
            tool::WEB_SEARCH => Tag::WebSearch,
            tool::WIKI_SEARCH => Tag::WikiSearch,
            tool::CRAWL_PAGE => Tag::CrawlPage,
            tool::CODE => Tag::Code,
            "observation" => Tag::Observation,
            "answer" => Tag::Answer,
            _ => return None,
        })
    }

    pub const fn kind(self) -> TagKind {
        match self {
            Tag::Think | Tag::Plan | Tag::Reflection | Tag::SuggestedAnswer | Tag::DoubleCheck => {
                TagKind::RolePlaying
            }
            Tag::WebSearch | Tag::WikiSearch | Tag::CrawlPage | Tag::Code => TagKind::Tool,
            Tag::Observation => TagKind::Environment,
            Tag::Answer => TagKind::Final,
        }
    }

    /// A tool call (`web_search`, `wiki_search`, `crawl_page`, `code`): followed by an observation.
    pub const fn is_tool(self) -> bool {
        matches!(self.kind(), TagKind::Tool)
    }

    /// A search call (`web_search` or its alias `wiki_search`).
    pub const fn is_search(self) -> bool {
        matches!(self, Tag::WebSearch | Tag::WikiSearch)
    }

    /// Whether the body is raw text that may hold anything but the tag's own closing tag (program
    /// source and environment output). Other bodies must not contain CoA tags.
    pub const fn is_opaque(self) -> bool {
        matches!(self, Tag::Code | Tag::Observation)
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.open())
    }
}

/// Formats tags as `<a>, <b> or <c>` (for error messages).
pub fn list_tags(tags: &[Tag]) -> String {
    match tags {
        [] => "nothing".to_string(),
        [one] => one.open().to_string(),
        [init @ .., last] => {
            let head: Vec<&str> = init.iter().map(|t| t.open()).collect();
            format!("{} or {}", head.join(", "), last.open())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in Tag::ALL {
            assert_eq!(Tag::from_name(t.name()), Some(t));
            assert_eq!(t.open(), format!("<{}>", t.name()));
            assert_eq!(t.close(), format!("</{}>", t.name()));
        }
        assert_eq!(Tag::from_name("Think"), None);
        let tools: Vec<&str> = Tag::ALL
            .iter()
            .filter(|t| t.is_tool())
            .map(|t| t.name())
            .collect();
        assert_eq!(tools, TOOL_NAMES);
        assert_eq!(
            list_tags(&[Tag::Plan, Tag::Code, Tag::Answer]),
            "<plan>, <code> or <answer>"
        );
    }
}
