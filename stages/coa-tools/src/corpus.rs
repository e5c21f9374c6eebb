//! The offline web: the corpus pages, a URL lookup, and the BM25 index, built once.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use coa_schemas::rows::CorpusPage;

use crate::search::{Bm25Index, SearchHit};

/// The corpus with everything the search and crawl tools need, built once and shared
/// read-only (it is `Sync`; queries use a thread-local scratch buffer).
#[derive(Debug)]
pub struct Corpus {
    /// Owns the pages (in corpus order) and answers `web_search`.
    index: Bm25Index,
    /// URL -> position in `pages()`.
    by_url: HashMap<String, usize>,
}

impl Corpus {
    /// Validates the pages and builds the URL map and the search index.
    ///
    /// URLs must be unique and non-empty: a duplicate would make `crawl_page` answer with one
    /// page while `web_search` can return the other, so it is an error that names the URL.
    pub fn new(pages: Vec<CorpusPage>) -> Result<Self> {
        let mut by_url = HashMap::with_capacity(pages.len());
        for (i, page) in pages.iter().enumerate() {
            if page.url.trim().is_empty() {
                bail!("corpus page {i} (title {:?}) has an empty URL", page.title);
            }
            if let Some(first) = by_url.insert(page.url.clone(), i) {
                bail!(
                    "duplicate URL in corpus: {:?} (pages {first} and {i}, titles {:?} and {:?})",
                    page.url,
                    pages[first].title,
                    page.title
                );
            }
        }
        let index = Bm25Index::new(pages).context("building the BM25 index over the corpus")?;
        Ok(Self { index, by_url })
    }

    /// All pages, in corpus order.
    pub fn pages(&self) -> &[CorpusPage] {
        self.index.pages()
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The page at `url`, exactly as stored, or after trimming surrounding whitespace.
    pub fn get(&self, url: &str) -> Option<&CorpusPage> {
        Some(&self.pages()[self.position(url)?])
    }

    /// The position in [`Corpus::pages`] of the page at `url` (as [`Corpus::get`] finds it).
    pub fn position(&self, url: &str) -> Option<usize> {
        self.by_url.get(url).or_else(|| self.by_url.get(url.trim())).copied()
    }

    /// The BM25 index (for statistics or direct queries).
    pub fn index(&self) -> &Bm25Index {
        &self.index
    }

    /// `web_search`: the `k` best pages for `query` (see [`Bm25Index::search`]).
    pub fn search(&self, query: &str, k: usize) -> Vec<SearchHit> {
        self.index.search(query, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(url: &str, title: &str) -> CorpusPage {
        CorpusPage {
            url: url.into(),
            title: title.into(),
            text: format!("{title} text."),
            kind: "entity".into(),
        }
    }

    #[test]
    fn duplicate_url_is_an_error_naming_it() {
        let err = Corpus::new(vec![page("u/a", "A"), page("u/b", "B"), page("u/a", "C")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("duplicate URL"), "{err}");
        assert!(err.contains("u/a"), "{err}");
        assert!(err.contains("pages 0 and 2"), "{err}");
    }

    #[test]
    fn empty_url_is_an_error() {
        let err = Corpus::new(vec![page(" ", "A")]).unwrap_err().to_string();
        assert!(err.contains("empty URL"), "{err}");
    }

    #[test]
    fn lookup_and_search() {
        let corpus = Corpus::new(vec![page("u/a", "Alpha"), page("u/b", "Beta")]).unwrap();
        assert_eq!(corpus.len(), 2);
        assert_eq!(corpus.get("u/b").unwrap().title, "Beta");
        assert_eq!(corpus.get("  u/b\n").unwrap().title, "Beta");
        assert!(corpus.get("u/c").is_none());
        assert_eq!(corpus.search("beta", 5)[0].url, "u/b");
    }
}
