//! `crawl_page` offline backend: page text by URL, in the reference observation format.

use crate::corpus::PageLookup;

/// Marker appended to a page text cut at `max_chars`.
pub const TRUNCATION_MARKER: &str = "...";

/// Fetches one or more `|`-separated URLs and renders them as the reference `crawl_page`
/// observation: blocks `Page i [url] Summary:\n<text>` separated by blank lines.
///
/// Each text is cut to `max_chars` characters (not bytes, so multi-byte text is never split
/// inside a character) and then marked with `...`. An unknown URL is an observation the agent
/// must see and react to, not a failure of the tool, so its block reads
/// `Error: page not found`. Blank segments (`a||b`, a trailing `|`) are skipped; with no URL
/// at all the observation says so.
pub fn crawl_page<L: PageLookup + ?Sized>(lookup: &L, urls: &str, max_chars: usize) -> String {
    let mut blocks = Vec::new();
    for url in urls.split('|').map(str::trim).filter(|u| !u.is_empty()) {
        let body = match lookup.page(url) {
            Some(page) => truncate_chars(&page.text, max_chars),
            None => "Error: page not found".to_owned(),
        };
        blocks.push(format!(
            "Page {} [{url}] Summary:\n{body}",
            blocks.len() + 1
        ));
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
    use crate::Corpus;
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
        ])
        .unwrap()
    }

    #[test]
    fn one_url() {
        assert_eq!(
            crawl_page(&corpus(), "https://w/a", 100),
            "Page 1 [https://w/a] Summary:\nAlpha is short."
        );
    }

    #[test]
    fn several_urls_with_an_unknown_one_and_truncation() {
        let got = crawl_page(&corpus(), "https://w/a | https://w/missing|https://w/b", 10);
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
            crawl_page(&corpus(), "https://w/c", 4),
            "Page 1 [https://w/c] Summary:\nÜnïc..."
        );
        assert_eq!(
            crawl_page(&corpus(), "https://w/c", 12),
            "Page 1 [https://w/c] Summary:\nÜnïcödé text"
        );
    }

    #[test]
    fn blank_segments_and_no_url() {
        assert_eq!(
            crawl_page(&corpus(), "||https://w/a|", 100),
            "Page 1 [https://w/a] Summary:\nAlpha is short."
        );
        assert_eq!(crawl_page(&corpus(), " | ", 100), "Error: no URL given.");
    }
}
