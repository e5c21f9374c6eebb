//! `crawl_page` offline backend: each page summarized for the crawl's goal, in the reference
//! observation format.
//!
//! AFM's crawl tool hands every page to an LLM with a goal made of the agent's last `<think>`
//! and last `<web_search>` query, and returns that LLM's summary of what the page says about
//! the goal. Offline, the summary is extractive ([`crate::Bm25Index::summary`]): the page's
//! sentences most relevant to the goal, in page order, within a character budget, so a crawl
//! costs the agent (and the student trained on its trajectories) the relevant facts, not the
//! page.

use crate::corpus::Corpus;

/// Marker appended to a page text cut at `max_chars`.
pub const TRUNCATION_MARKER: &str = "...";

/// What a crawl summarizes its pages for, as AFM's crawl tool takes it: the agent's last
/// thought and its last web search query (either may be missing).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Goal {
    pub think: String,
    pub query: String,
}

/// Weight of the last search query's words against the thought's in a summary: the search may
/// be an earlier hop's (a page opened directly follows none of its own), so its words only
/// break ties among the sentences the thought asks for, or choose when the thought matches
/// nothing.
pub const QUERY_WEIGHT: f32 = 1.0 / 16.0;

impl Goal {
    pub fn new(last_think: Option<&str>, last_query: Option<&str>) -> Goal {
        let text = |s: Option<&str>| s.map(str::trim).unwrap_or_default().to_string();
        Goal { think: text(last_think), query: text(last_query) }
    }

    /// No thought and no query: a crawl returns the pages' beginnings.
    pub fn is_empty(&self) -> bool {
        self.think.is_empty() && self.query.is_empty()
    }
}

/// Fetches one or more `|`-separated URLs and renders them as the reference `crawl_page`
/// observation: blocks `Page i [url] Summary:\n<text>` separated by blank lines.
///
/// With a [`Goal`] each text is the page's summary for it, at most `max_chars` characters
/// ([`crate::Bm25Index::summary`]; the thought's words, the query's at [`QUERY_WEIGHT`]);
/// without one, the page's first `max_chars` characters (not bytes, so multi-byte text is never
/// split inside a character), marked with `...` where cut. An unknown URL is an observation
/// the agent must see and react to, not a failure of the tool, so its block reads
/// `Error: page not found`. Blank segments (`a||b`, a trailing `|`) are skipped; with no URL at
/// all the observation says so.
pub fn crawl_page(corpus: &Corpus, urls: &str, goal: &Goal, max_chars: usize) -> String {
    let mut blocks = Vec::new();
    for url in urls.split('|').map(str::trim).filter(|u| !u.is_empty()) {
        let body = match corpus.position(url) {
            Some(doc) if !goal.is_empty() => corpus.index().summary(doc, &[(&goal.think, 1.0), (&goal.query, QUERY_WEIGHT)], max_chars),
            Some(doc) => truncate_chars(&corpus.pages()[doc].text, max_chars),
            None => "Error: page not found".to_owned(),
        };
        blocks.push(format!("Page {} [{url}] Summary:\n{body}", blocks.len() + 1));
    }
    if blocks.is_empty() {
        return "Error: no URL given.".to_owned();
    }
    blocks.join("\n\n")
}

/// `text` cut to `max_chars` characters plus [`TRUNCATION_MARKER`], or unchanged if it fits.
fn truncate_chars(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}{TRUNCATION_MARKER}", text[..cut].trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coa_schemas::rows::CorpusPage;

    fn corpus() -> Corpus {
        let page = |url: &str, text: &str| CorpusPage {
            url: url.into(),
            title: url.into(),
            text: text.into(),
            kind: "entity".into(),
        };
        Corpus::new(vec![
            page("https://w/a", "Alpha is short."),
            page(
                "https://w/b",
                "Beta has a much longer text than ten characters.",
            ),
            page("https://w/c", "Ünïcödé text"),
            page(
                "https://wiki/Ziys_Vraemgir",
                "Ziys Vraemgir is a mathematician born in 1994. Born in Tungam, Ziys Vraemgir showed an early interest in water management. \
                 Ziys Vraemgir works for Bounpesh Biolabs, where she has been chief executive since 2024. In 2024, she received the Rymkam Prize. \
                 Ziys Vraemgir designed the Panres GT86. She enjoys chess in her spare time. Ziys Vraemgir founded nothing.",
            ),
        ])
        .unwrap()
    }

    #[test]
    fn one_url() {
        assert_eq!(
            crawl_page(&corpus(), "https://w/a", &Goal::default(), 100),
            "Page 1 [https://w/a] Summary:\nAlpha is short."
        );
    }

    #[test]
    fn several_urls_with_an_unknown_one_and_truncation() {
        let got = crawl_page(&corpus(), "https://w/a | https://w/missing|https://w/b", &Goal::default(), 10);
        assert_eq!(
            got,
            "Page 1 [https://w/a] Summary:\nAlpha is s...\n\n\
             Page 2 [https://w/missing] Summary:\nError: page not found\n\n\
             Page 3 [https://w/b] Summary:\nBeta has a..."
        );
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        assert_eq!(
            crawl_page(&corpus(), "https://w/c", &Goal::default(), 4),
            "Page 1 [https://w/c] Summary:\nÜnïc..."
        );
        assert_eq!(
            crawl_page(&corpus(), "https://w/c", &Goal::default(), 12),
            "Page 1 [https://w/c] Summary:\nÜnïcödé text"
        );
    }

    #[test]
    fn blank_segments_and_no_url() {
        assert_eq!(
            crawl_page(&corpus(), "||https://w/a|", &Goal::default(), 100),
            "Page 1 [https://w/a] Summary:\nAlpha is short."
        );
        assert_eq!(crawl_page(&corpus(), " | ", &Goal::default(), 100), "Error: no URL given.");
    }

    #[test]
    fn a_goal_is_the_trimmed_thought_and_query() {
        let g = Goal::new(Some(" I need her employer. "), Some("Ziys Vraemgir works for"));
        assert_eq!((g.think.as_str(), g.query.as_str()), ("I need her employer.", "Ziys Vraemgir works for"));
        assert!(!Goal::new(None, Some("q")).is_empty());
        assert!(Goal::new(Some(" "), None).is_empty());
    }

    #[test]
    fn a_goal_keeps_the_relevant_sentences_in_page_order() {
        let url = "https://wiki/Ziys_Vraemgir";
        let c = corpus();
        let summary = |g: &str, n: usize| crawl_page(&c, url, &Goal::new(Some(g), None), n).split_once(" Summary:\n").unwrap().1.to_string();
        const LEAD: &str = "Ziys Vraemgir is a mathematician born in 1994.";
        // The lead sentence (what the page is) always comes first; then the birthplace: the
        // other sentence with "born" ranks first (the subject's name, the page's title, counts
        // for nothing; stop words neither), and fills the budget.
        let born = summary("Step 1: where was Ziys Vraemgir born?\nZiys Vraemgir born", 130);
        assert_eq!(born, format!("{LEAD} Born in Tungam, Ziys Vraemgir showed an early interest in water management."));
        let employer = summary("I need the employer of Ziys Vraemgir.\nZiys Vraemgir works for company", 140);
        assert_eq!(employer, format!("{LEAD} Ziys Vraemgir works for Bounpesh Biolabs, where she has been chief executive since 2024."));
        // Sentences that fit in the budget, printed in page order whatever their rank.
        let two = summary("chess designed", 130);
        assert_eq!(two, format!("{LEAD} Ziys Vraemgir designed the Panres GT86. She enjoys chess in her spare time."));
        // Nothing matches: the page's first sentences that fit.
        assert_eq!(summary("zzz unknown words", 60), LEAD);
        // A lead longer than the budget is cut at a word.
        assert_eq!(summary("chief executive", 30), "Ziys Vraemgir is a...");
        // A large budget: the whole page, in page order.
        let page = &c.pages()[3].text;
        assert_eq!(summary("Ziys Vraemgir born", 10_000), page.split_whitespace().collect::<Vec<_>>().join(" "));
        // The query's words only break ties: a search for an earlier hop ("Bounpesh Biolabs")
        // does not outweigh what the thought asks for.
        let g = Goal::new(Some("who trained or mentored Ziys Vraemgir, and what she designed"), Some("Bounpesh Biolabs chief executive"));
        let got = crawl_page(&c, url, &g, 90);
        assert!(got.ends_with(&format!("{LEAD} Ziys Vraemgir designed the Panres GT86.")), "{got}");
        let g = Goal::new(Some("what about her?"), Some("Bounpesh Biolabs chief executive"));
        let got = crawl_page(&c, url, &g, 140);
        assert!(got.ends_with("Ziys Vraemgir works for Bounpesh Biolabs, where she has been chief executive since 2024."), "{got}");
        // Words match by stem: "founder" finds "founded" (no sentence says "founder").
        assert_eq!(summary("founder", 80), format!("{LEAD} Ziys Vraemgir founded nothing."));
    }
}
