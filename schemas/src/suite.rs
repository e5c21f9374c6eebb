//! The task suites and what differs between them, in one place. The `suite` column stays a
//! string on disk (a table may carry a suite this build does not know); [`Suite::parse`] turns it
//! into the typed suite, and code that depends on the suite matches on [`Suite`] or asks it
//! ([`Suite::answer`], [`Suite::tools`]) instead of comparing names.

use std::fmt;

/// A task suite, as written in a table's `suite` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Suite {
    /// Synthetic multi-hop questions over the offline web corpus (coa-tasks).
    Multihop,
    /// Synthetic arithmetic word problems, answered as `\boxed{...}` (coa-tasks).
    Math,
    /// Synthetic programming tasks with tests, answered with a program (coa-tasks).
    Code,
    /// Imported question answering (NQ, HotpotQA, GAIA, AFM's files...): web tools, short answers.
    Qa,
}

/// How a suite's final answer is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    /// A name or phrase: SQuAD-normalised exact match (and F1) against the gold answers.
    Phrase,
    /// A number or expression in `\boxed{...}`, compared by mathematical equality.
    Math,
    /// A Python program, checked by running the task's tests.
    Program,
}

impl Suite {
    /// Every suite this build knows.
    pub const ALL: [Suite; 4] = [Suite::Multihop, Suite::Math, Suite::Code, Suite::Qa];

    /// The suites coa-tasks synthesises (`qa` tasks are only imported).
    pub const SYNTHESISED: [Suite; 3] = [Suite::Multihop, Suite::Math, Suite::Code];

    /// The name in the `suite` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Suite::Multihop => "multihop",
            Suite::Math => "math",
            Suite::Code => "code",
            Suite::Qa => "qa",
        }
    }

    /// The suite a `suite` column value names (exactly, as written), or `None` for a suite this
    /// build does not know.
    pub fn parse(name: &str) -> Option<Suite> {
        Suite::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// How an answer on this suite is checked.
    pub fn answer(self) -> AnswerKind {
        match self {
            Suite::Multihop | Suite::Qa => AnswerKind::Phrase,
            Suite::Math => AnswerKind::Math,
            Suite::Code => AnswerKind::Program,
        }
    }

    /// The tools an agent may call on this suite: the web tools for question answering, the code
    /// sandbox for math and code.
    pub fn tools(self) -> &'static [&'static str] {
        match self {
            Suite::Multihop | Suite::Qa => &[tool::WEB_SEARCH, tool::CRAWL_PAGE],
            Suite::Math | Suite::Code => &[tool::CODE],
        }
    }

    /// Whether agents on this suite search and crawl the web (a run without such tasks needs no
    /// corpus).
    pub fn uses_web(self) -> bool {
        self.tools().contains(&tool::WEB_SEARCH)
    }
}

/// The tools, by the name of their CoA tag (also the `tool` column of teacher events and
/// trajectory steps): defined once, for the grammar (coa-format's tool tags), the suites' tool
/// lists, the importers and the verl export.
pub mod tool {
    pub const WEB_SEARCH: &str = "web_search";
    pub const WIKI_SEARCH: &str = "wiki_search";
    pub const CRAWL_PAGE: &str = "crawl_page";
    pub const CODE: &str = "code";
    /// Every tool a trajectory may call, in the grammar's order.
    pub const ALL: [&str; 4] = [WEB_SEARCH, WIKI_SEARCH, CRAWL_PAGE, CODE];
}

impl fmt::Display for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// [`AnswerKind`] of a `suite` column value; `None` for an unknown suite.
pub fn answer_kind(suite: &str) -> Option<AnswerKind> {
    Suite::parse(suite).map(Suite::answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_suites_stay_unknown() {
        for s in Suite::ALL {
            assert_eq!(Suite::parse(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(Suite::parse("gaia"), None);
        // The column is matched exactly, as written.
        assert_eq!(Suite::parse("Math"), None);
        assert_eq!(answer_kind("qa"), Some(AnswerKind::Phrase));
        assert_eq!(answer_kind("code"), Some(AnswerKind::Program));
        assert_eq!(answer_kind("other"), None);
    }

    #[test]
    fn question_answering_uses_the_web_and_the_rest_the_sandbox() {
        assert!(Suite::Multihop.uses_web() && Suite::Qa.uses_web());
        assert!(!Suite::Math.uses_web() && !Suite::Code.uses_web());
        assert_eq!(Suite::Code.tools(), ["code"]);
        assert!(!Suite::SYNTHESISED.contains(&Suite::Qa));
    }
}
