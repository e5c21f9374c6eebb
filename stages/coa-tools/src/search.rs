//! `web_search` offline backend: Okapi BM25 over the corpus, plus the observation text.
//!
//! The index is built once per corpus and then queried ~10^5 times by the benchmark, so the
//! build does all the work it can: the per-posting BM25 term weight (which only depends on the
//! term frequency and the document length) is precomputed, leaving a query with one
//! multiply-add per posting of each query term. Scores are accumulated in a thread-local
//! buffer that is reused across queries and reset only where it was touched, so a query
//! allocates nothing proportional to the corpus.
//!
//! Results are deterministic: equal scores are ordered by corpus position, and the query
//! terms are summed in a fixed order.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::HashMap;

use anyhow::{bail, Result};
use coa_schemas::rows::CorpusPage;
use serde::Serialize;

/// BM25 term-frequency saturation (the classic value).
pub const BM25_K1: f32 = 1.2;
/// BM25 document-length normalisation (the classic value).
pub const BM25_B: f32 = 0.75;

/// Hard cap on a snippet's length, in characters (cut at a word boundary, with "...").
const SNIPPET_MAX_CHARS: usize = 300;
/// When no sentence contains a query term (e.g. only the title matched): this many leading chars.
const SNIPPET_FALLBACK_CHARS: usize = 200;
/// Weight, in choosing a snippet's sentence, of a query term that is also in the page title:
/// the title is printed above the snippet already, so the snippet should show what else
/// matched. (A crawl summary gives such terms none: every sentence of a page is about its
/// title, most of them under a pronoun.)
const SNIPPET_TITLE_WEIGHT: f32 = 0.25;

/// Calls `emit` with each token of `text`: maximal runs of alphanumeric characters, lowercased.
///
/// One reused buffer, no allocation per token; this is the only tokenizer, used for the
/// index, the snippets and the queries, so they always agree.
pub fn for_each_token(text: &str, buf: &mut String, mut emit: impl FnMut(&str)) {
    buf.clear();
    for c in text.chars() {
        if c.is_alphanumeric() {
            if c.is_ascii() {
                buf.push(c.to_ascii_lowercase());
            } else {
                buf.extend(c.to_lowercase());
            }
        } else if !buf.is_empty() {
            emit(buf);
            buf.clear();
        }
    }
    if !buf.is_empty() {
        emit(buf);
        buf.clear();
    }
}

/// Tokenizes `text` into owned tokens (convenience for tests and callers outside hot paths).
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_token(text, &mut String::new(), |t| out.push(t.to_owned()));
    out
}

/// One search result, ready to render.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchHit {
    /// Position of the page in the corpus (stable; the tie-breaker).
    pub doc: usize,
    pub url: String,
    pub title: String,
    /// The best-matching sentence of the page (whitespace collapsed).
    pub snippet: String,
    pub score: f32,
}

/// A sentence of a page: its byte span in the page text and its distinct term ids.
#[derive(Debug, Clone, Copy)]
struct Sentence {
    start: u32,
    end: u32,
    /// Range into `Bm25Index::sentence_terms` (sorted, deduplicated term ids).
    terms_start: u32,
    terms_end: u32,
}

/// An Okapi BM25 index over a corpus of pages (title + text as one field).
///
/// The index owns the pages so that a hit can carry its url, title and snippet without the
/// caller passing the corpus back in (and possibly the wrong one).
#[derive(Debug)]
pub struct Bm25Index {
    pages: Vec<CorpusPage>,
    vocab: HashMap<String, u32>,
    /// Inverse document frequency per term id.
    idf: Vec<f32>,
    /// Postings in CSR form: term `t` owns `post_doc[post_off[t]..post_off[t + 1]]`, docs ascending.
    post_off: Vec<u32>,
    post_doc: Vec<u32>,
    /// Precomputed `tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))` per posting.
    post_weight: Vec<f32>,
    /// Sentences of doc `d`: `sentences[sent_off[d]..sent_off[d + 1]]`.
    sent_off: Vec<u32>,
    sentences: Vec<Sentence>,
    sentence_terms: Vec<u32>,
    /// Distinct title terms of doc `d` (sorted): `title_terms[title_off[d]..title_off[d + 1]]`.
    title_off: Vec<u32>,
    title_terms: Vec<u32>,
    avg_doc_len: f32,
    /// [`stem`] of each term, as an id into `stems` (crawl summaries match words by stem).
    term_stem: Vec<u32>,
    stems: HashMap<String, u32>,
    /// Per stem id: the largest idf of its terms.
    stem_idf: Vec<f32>,
}

/// Per-thread score accumulator, reused across queries (sized to the largest corpus seen).
#[derive(Default)]
struct Scratch {
    acc: Vec<f32>,
    touched: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn to_u32(n: usize, what: &str) -> Result<u32> {
    match u32::try_from(n) {
        Ok(v) => Ok(v),
        Err(_) => bail!("corpus too large for the search index: {what} = {n} exceeds u32"),
    }
}

/// Byte spans of the sentences of `text`: a sentence ends at a newline, or at `.`, `!` or `?`
/// followed by whitespace or the end. Spans are trimmed; empty ones are dropped.
///
/// Boundaries always fall on non-alphanumeric characters, so tokenizing sentence by sentence
/// yields exactly the tokens of the whole text.
fn sentence_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = if c == '\n' {
            Some(i)
        } else if matches!(c, '.' | '!' | '?')
            && chars.peek().is_none_or(|&(_, next)| next.is_whitespace())
        {
            Some(i + c.len_utf8())
        } else {
            None
        };
        if let Some(end) = end {
            push_trimmed(text, start, end, &mut spans);
            start = end;
        }
    }
    push_trimmed(text, start, text.len(), &mut spans);
    spans
}

fn push_trimmed(text: &str, start: usize, end: usize, spans: &mut Vec<(usize, usize)>) {
    let piece = &text[start..end];
    let lead = piece.len() - piece.trim_start().len();
    let trimmed = piece.trim();
    if !trimmed.is_empty() {
        spans.push((start + lead, start + lead + trimmed.len()));
    }
}

impl Bm25Index {
    /// Builds the index over `pages` (their order is the tie-breaking order).
    ///
    /// Fails only when the corpus exceeds the index's u32 offsets (billions of tokens).
    pub fn new(pages: Vec<CorpusPage>) -> Result<Self> {
        let n_docs = pages.len();
        to_u32(n_docs, "pages")?;
        let mut vocab: HashMap<String, u32> = HashMap::new();
        let mut buf = String::new();
        // (term, doc, tf) for every distinct term of every doc, docs ascending.
        let mut triples: Vec<(u32, u32, u32)> = Vec::new();
        let mut doc_len: Vec<u32> = Vec::with_capacity(n_docs);
        let mut sent_off: Vec<u32> = Vec::with_capacity(n_docs + 1);
        let mut sentences: Vec<Sentence> = Vec::new();
        let mut sentence_terms: Vec<u32> = Vec::new();
        let mut doc_terms: Vec<u32> = Vec::new();
        let mut sent_terms: Vec<u32> = Vec::new();
        let mut title_off: Vec<u32> = Vec::with_capacity(n_docs + 1);
        let mut title_terms: Vec<u32> = Vec::new();

        let intern = |tok: &str, vocab: &mut HashMap<String, u32>| -> u32 {
            if let Some(&id) = vocab.get(tok) {
                return id;
            }
            let id = vocab.len() as u32;
            vocab.insert(tok.to_owned(), id);
            id
        };

        for (d, page) in pages.iter().enumerate() {
            doc_terms.clear();
            for_each_token(&page.title, &mut buf, |t| {
                doc_terms.push(intern(t, &mut vocab))
            });
            title_off.push(to_u32(title_terms.len(), "title terms")?);
            sent_terms.clear();
            sent_terms.extend_from_slice(&doc_terms);
            sent_terms.sort_unstable();
            sent_terms.dedup();
            title_terms.extend_from_slice(&sent_terms);
            sent_off.push(to_u32(sentences.len(), "sentences")?);
            for (start, end) in sentence_spans(&page.text) {
                sent_terms.clear();
                for_each_token(&page.text[start..end], &mut buf, |t| {
                    sent_terms.push(intern(t, &mut vocab))
                });
                doc_terms.extend_from_slice(&sent_terms);
                sent_terms.sort_unstable();
                sent_terms.dedup();
                let terms_start = to_u32(sentence_terms.len(), "sentence terms")?;
                sentence_terms.extend_from_slice(&sent_terms);
                sentences.push(Sentence {
                    start: to_u32(start, "page text bytes")?,
                    end: to_u32(end, "page text bytes")?,
                    terms_start,
                    terms_end: to_u32(sentence_terms.len(), "sentence terms")?,
                });
            }
            doc_len.push(to_u32(doc_terms.len(), "tokens in a page")?);
            doc_terms.sort_unstable();
            let mut i = 0;
            while i < doc_terms.len() {
                let t = doc_terms[i];
                let run = doc_terms[i..].iter().take_while(|&&x| x == t).count();
                triples.push((t, d as u32, run as u32));
                i += run;
            }
        }
        sent_off.push(to_u32(sentences.len(), "sentences")?);
        title_off.push(to_u32(title_terms.len(), "title terms")?);
        to_u32(triples.len(), "postings")?;

        let n_terms = vocab.len();
        let total_len: u64 = doc_len.iter().map(|&l| u64::from(l)).sum();
        let avg_doc_len = if n_docs == 0 {
            0.0
        } else {
            (total_len as f64 / n_docs as f64) as f32
        };
        // k1 * (1 - b + b * dl / avgdl) per doc; an all-empty corpus has no postings anyway.
        let norm: Vec<f32> = doc_len
            .iter()
            .map(|&dl| {
                let rel = if avg_doc_len > 0.0 {
                    dl as f32 / avg_doc_len
                } else {
                    1.0
                };
                BM25_K1 * (1.0 - BM25_B + BM25_B * rel)
            })
            .collect();

        // Counting sort of the triples by term; docs stay ascending within a term.
        let mut df = vec![0u32; n_terms];
        for &(t, _, _) in &triples {
            df[t as usize] += 1;
        }
        let mut post_off = Vec::with_capacity(n_terms + 1);
        let mut acc = 0u32;
        post_off.push(0);
        for &c in &df {
            acc += c;
            post_off.push(acc);
        }
        let mut fill: Vec<u32> = post_off[..n_terms].to_vec();
        let mut post_doc = vec![0u32; triples.len()];
        let mut post_weight = vec![0f32; triples.len()];
        for &(t, d, tf) in &triples {
            let slot = fill[t as usize] as usize;
            fill[t as usize] += 1;
            let tf = tf as f32;
            post_doc[slot] = d;
            post_weight[slot] = tf * (BM25_K1 + 1.0) / (tf + norm[d as usize]);
        }
        // The "+1" form of the Robertson–Spärck Jones idf (as in Lucene): never negative, so a
        // term in more than half the pages still counts a little instead of penalising a match.
        let n = n_docs as f64;
        let idf: Vec<f32> = df
            .iter()
            .map(|&df| (1.0 + (n - df as f64 + 0.5) / (df as f64 + 0.5)).ln() as f32)
            .collect();

        let mut stems: HashMap<String, u32> = HashMap::new();
        let mut by_id: Vec<&str> = vec![""; n_terms];
        for (t, &id) in &vocab {
            by_id[id as usize] = t;
        }
        let mut stem_idf: Vec<f32> = Vec::new();
        let term_stem = by_id
            .iter()
            .enumerate()
            .map(|(t, word)| {
                let next = stems.len() as u32;
                let id = *stems.entry(stem(word)).or_insert(next);
                if id == next {
                    stem_idf.push(idf[t]);
                } else {
                    stem_idf[id as usize] = stem_idf[id as usize].max(idf[t]);
                }
                id
            })
            .collect();

        Ok(Self {
            pages,
            vocab,
            idf,
            post_off,
            post_doc,
            post_weight,
            sent_off,
            sentences,
            sentence_terms,
            title_off,
            title_terms,
            avg_doc_len,
            term_stem,
            stems,
            stem_idf,
        })
    }

    /// The indexed pages, in corpus order.
    pub fn pages(&self) -> &[CorpusPage] {
        &self.pages
    }

    /// Gives the pages back.
    pub fn into_pages(self) -> Vec<CorpusPage> {
        self.pages
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Number of distinct terms.
    pub fn vocab_len(&self) -> usize {
        self.vocab.len()
    }

    /// Average page length in tokens (title + text).
    pub fn avg_doc_len(&self) -> f32 {
        self.avg_doc_len
    }

    /// Distinct known query terms with their idf, in first-occurrence order.
    ///
    /// A term repeated in the query counts once: "paris paris paris" should not outweigh
    /// the other words of the question.
    fn query_terms(&self, query: &str) -> Vec<(u32, f32)> {
        let mut terms: Vec<(u32, f32)> = Vec::new();
        for_each_token(query, &mut String::new(), |tok| {
            if let Some(&id) = self.vocab.get(tok) {
                if !terms.iter().any(|&(t, _)| t == id) {
                    terms.push((id, self.idf[id as usize]));
                }
            }
        });
        terms
    }

    /// The `k` best pages for `query`, best first; ties go to the earlier page. Pages that
    /// share no term with the query are never returned, so fewer than `k` hits is normal.
    pub fn search(&self, query: &str, k: usize) -> Vec<SearchHit> {
        let terms = self.query_terms(query);
        if terms.is_empty() || k == 0 {
            return Vec::new();
        }
        let top = SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.top_k(&terms, k, &mut scratch),
            // Only reachable through re-entrancy, which search never does; stay correct anyway.
            Err(_) => self.top_k(&terms, k, &mut Scratch::default()),
        });
        top.into_iter()
            .map(|(doc, score)| {
                let page = &self.pages[doc as usize];
                SearchHit {
                    doc: doc as usize,
                    url: page.url.clone(),
                    title: page.title.clone(),
                    snippet: self.snippet(doc as usize, &terms),
                    score,
                }
            })
            .collect()
    }

    /// Scores every page sharing a term with the query and returns the `k` best as
    /// `(doc, score)`, best first, ties to the lower doc.
    ///
    /// Two regimes: a query whose postings cover a good part of the corpus (common words)
    /// accumulates densely and scans the accumulator in doc order; a selective one records the
    /// docs it touches and visits only those. Either way only touched slots are reset.
    fn top_k(&self, terms: &[(u32, f32)], k: usize, scratch: &mut Scratch) -> Vec<(u32, f32)> {
        let n = self.pages.len();
        let Scratch { acc, touched } = scratch;
        if acc.len() < n {
            acc.resize(n, 0.0);
        }
        let postings = |t: u32| {
            let range = self.post_off[t as usize] as usize..self.post_off[t as usize + 1] as usize;
            self.post_doc[range.clone()]
                .iter()
                .zip(&self.post_weight[range])
        };
        let total: usize = terms.iter().map(|&(t, _)| postings(t).len()).sum();
        let dense = total >= n / 4;
        touched.clear();
        for &(t, idf) in terms {
            if dense {
                for (&d, &w) in postings(t) {
                    acc[d as usize] += idf * w;
                }
            } else {
                for (&d, &w) in postings(t) {
                    let slot = &mut acc[d as usize];
                    // Every contribution is > 0 (idf > 0, weight > 0), so 0 means "untouched".
                    if *slot == 0.0 {
                        touched.push(d);
                    }
                    *slot += idf * w;
                }
            }
        }
        if dense {
            // Doc order, and only pages with a match (score > 0) are candidates.
            touched.extend((0..n as u32).filter(|&d| acc[d as usize] > 0.0));
        }
        let top = select_best(touched, acc, k);
        for &d in touched.iter() {
            acc[d as usize] = 0.0;
        }
        top
    }

    /// Each sentence of `doc` scored for the query terms: the idf sum of the distinct terms it
    /// contains (rare words matter most), a term of the page's title counting `title_weight`
    /// (every sentence of a page is about its title; what else matches tells them apart).
    /// Terms are compared as `key` maps them (term ids as they are, or their stems).
    fn sentence_scores(&self, doc: usize, terms: &[(u32, f32)], title_weight: f32, key: impl Fn(u32) -> u32) -> Vec<f32> {
        let title = &self.title_terms[self.title_off[doc] as usize..self.title_off[doc + 1] as usize];
        let weighted: Vec<(u32, f32)> = terms
            .iter()
            .map(|&(t, idf)| (t, if title.iter().any(|&x| key(x) == t) { idf * title_weight } else { idf }))
            .collect();
        self.sentences[self.sent_off[doc] as usize..self.sent_off[doc + 1] as usize]
            .iter()
            .map(|s| {
                let have = &self.sentence_terms[s.terms_start as usize..s.terms_end as usize];
                weighted.iter().filter(|(t, _)| have.iter().any(|&x| key(x) == *t)).map(|&(_, w)| w).sum()
            })
            .collect()
    }

    /// Distinct stems of the texts known to the corpus, each with its idf times the weight of
    /// the first text it is in ([`stem`]); English stop words left out (a goal is a sentence:
    /// "where", "should", "which" are not what it seeks).
    fn stem_terms(&self, texts: &[(&str, f32)]) -> Vec<(u32, f32)> {
        let mut out: Vec<(u32, f32)> = Vec::new();
        for &(text, weight) in texts {
            for_each_token(text, &mut String::new(), |tok| {
                if STOP_WORDS.binary_search(&tok).is_ok() {
                    return;
                }
                if let Some(&id) = self.stems.get(&stem(tok)) {
                    if !out.iter().any(|&(s, _)| s == id) {
                        out.push((id, weight * self.stem_idf[id as usize]));
                    }
                }
            });
        }
        out
    }

    /// The best sentence of `doc` for the query terms, or its first ~200 chars: the earliest
    /// best ([`Self::sentence_scores`]).
    fn snippet(&self, doc: usize, terms: &[(u32, f32)]) -> String {
        let text = &self.pages[doc].text;
        let sents = &self.sentences[self.sent_off[doc] as usize..self.sent_off[doc + 1] as usize];
        let mut best: Option<(usize, f32)> = None;
        for (i, &score) in self.sentence_scores(doc, terms, SNIPPET_TITLE_WEIGHT, |t| t).iter().enumerate() {
            if score > 0.0 && best.is_none_or(|(_, b)| score > b) {
                best = Some((i, score));
            }
        }
        let Some((i, _)) = best else {
            return clip_chars(&collapse_whitespace(text), SNIPPET_FALLBACK_CHARS);
        };
        let best = sents[i];
        clip_chars(&collapse_whitespace(&text[best.start as usize..best.end as usize]), SNIPPET_MAX_CHARS)
    }

    /// An extractive summary of page `doc` for `goal` (what the reader is looking for), at most
    /// `max_chars` characters: the page's lead sentence (what the page is), then its other
    /// sentences ranked by [`Self::sentence_scores`] for the goal's words but stop words and the
    /// page title's, compared by [`stem`] ("founder" finds "founded"; ties, and the sentences
    /// that match nothing, in page order), taken while they fit, then printed in page order; the
    /// lead always, cut at a word boundary if it alone is longer. So a page that fits is returned
    /// whole, and a longer one loses what is least about the goal first. The offline stand-in
    /// for AFM's crawl summarizer, an LLM asked for what the page says about the goal (a lexical
    /// match: a goal in other words than the page's keeps its first sentences).
    ///
    /// `goal` is texts with weights (a term counts at the weight of the first text it is in).
    pub fn summary(&self, doc: usize, goal: &[(&str, f32)], max_chars: usize) -> String {
        let text = &self.pages[doc].text;
        let sents = &self.sentences[self.sent_off[doc] as usize..self.sent_off[doc + 1] as usize];
        let scores = self.sentence_scores(doc, &self.stem_terms(goal), 0.0, |t| self.term_stem[t as usize]);
        let mut order: Vec<usize> = (1..sents.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        if !sents.is_empty() {
            order.insert(0, 0);
        }
        let sentence = |i: usize| collapse_whitespace(&text[sents[i].start as usize..sents[i].end as usize]);
        let (mut taken, mut used) = (Vec::new(), 0usize);
        for i in order {
            let n = sentence(i).chars().count() + usize::from(!taken.is_empty());
            if used + n > max_chars && !taken.is_empty() {
                continue;
            }
            taken.push(i);
            used += n;
        }
        taken.sort_unstable();
        let joined = taken.into_iter().map(sentence).collect::<Vec<_>>().join(" ");
        if joined.chars().count() > max_chars {
            clip_chars(&joined, max_chars)
        } else {
            joined
        }
    }
}

/// The `k` best of `candidates` by `(score desc, doc asc)`, as `(doc, score)`, best first.
///
/// For the usual small `k`, one pass keeping a sorted buffer of k: most candidates fail the
/// single comparison against the current k-th. For a large `k`, selection then sort.
fn select_best(candidates: &mut [u32], acc: &[f32], k: usize) -> Vec<(u32, f32)> {
    let rank = |a: &u32, b: &u32| -> Ordering {
        acc[*b as usize].total_cmp(&acc[*a as usize]).then(a.cmp(b))
    };
    if k > 64 {
        let k = k.min(candidates.len());
        if candidates.len() > k {
            candidates.select_nth_unstable_by(k - 1, rank);
        }
        let best = &mut candidates[..k];
        best.sort_unstable_by(rank);
        return best.iter().map(|&d| (d, acc[d as usize])).collect();
    }
    let mut top: Vec<u32> = Vec::with_capacity(k + 1);
    for &d in candidates.iter() {
        if top.len() == k && rank(&d, &top[k - 1]) != Ordering::Less {
            continue;
        }
        let pos = top.partition_point(|t| rank(t, &d) == Ordering::Less);
        top.insert(pos, d);
        top.truncate(k);
    }
    top.into_iter().map(|d| (d, acc[d as usize])).collect()
}

/// Replaces every run of whitespace (newlines included) by one space and trims the ends, so a
/// snippet fits on the one line under its `[title](url)`.
fn collapse_whitespace(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in s.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// Cuts `s` to at most `max` chars, preferring the last word boundary, and marks the cut
/// with "...".
fn clip_chars(s: &str, max: usize) -> String {
    let Some((cut, _)) = s.char_indices().nth(max) else {
        return s.to_owned();
    };
    let head = &s[..cut];
    let head = match head.rfind(' ') {
        Some(sp) if sp > cut / 2 => &head[..sp],
        _ => head,
    };
    format!("{}...", head.trim_end())
}

/// Words a crawl goal's sentence is made of but does not look for (sorted: binary search).
const STOP_WORDS: &[&str] = &[
    "a", "about", "after", "all", "also", "an", "and", "any", "are", "as", "at", "be", "been", "before", "both", "but", "by", "can",
    "could", "did", "do", "does", "each", "for", "from", "had", "has", "have", "he", "her", "here", "hers", "him", "his", "how", "i",
    "if", "in", "into", "is", "it", "its", "itself", "just", "may", "me", "might", "more", "must", "my", "need", "next", "no", "not",
    "now", "of", "on", "one", "only", "or", "other", "our", "out", "own", "page", "read", "result", "say", "says", "she", "should",
    "so", "some", "state", "step", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "those", "to",
    "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "whose", "why", "will", "with", "would", "you",
    "your",
];

/// A token's stem for matching words across their forms: a plural or third-person `s` (not
/// `ss`), `ies`/`ied` to `i`, then the suffixes `ion`, `ing`, `ed`, `er` and `ly`
/// stripped while one is there and at least 3 letters stay ("headquarters" and
/// "headquartered" both give "headquart", "founder" and "founded" "found", "worked" and
/// "works" "work"). A light stemmer for English page text, not Porter's.
pub fn stem(token: &str) -> String {
    let mut s = token;
    let i_form;
    if let Some(base) = s.strip_suffix("ies").or_else(|| s.strip_suffix("ied")).filter(|b| b.len() >= 2) {
        i_form = format!("{base}i");
        s = &i_form;
    } else if s.len() > 3 && s.ends_with('s') && !s.ends_with("ss") {
        s = &s[..s.len() - 1];
    }
    'strip: loop {
        for suffix in ["ion", "ing", "ed", "er", "ly"] {
            if let Some(base) = s.strip_suffix(suffix).filter(|b| b.len() >= 3) {
                s = base;
                continue 'strip;
            }
        }
        break;
    }
    s.to_owned()
}

/// Renders hits as the reference `web_search` observation:
/// `Found N results:\n\n1. [title](url)\nsnippet\n\n2. ...` with N = hits returned; no hits
/// gives `Found 0 results:` and a line saying nothing matched.
pub fn render_search(hits: &[SearchHit]) -> String {
    if hits.is_empty() {
        return "Found 0 results:\n\nNo pages matched the query.".to_owned();
    }
    let mut out = format!("Found {} results:", hits.len());
    for (i, hit) in hits.iter().enumerate() {
        out.push_str(&format!(
            "\n\n{}. [{}]({})\n{}",
            i + 1,
            hit.title,
            hit.url,
            hit.snippet
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(url: &str, title: &str, text: &str) -> CorpusPage {
        CorpusPage {
            url: url.into(),
            title: title.into(),
            text: text.into(),
            kind: "entity".into(),
        }
    }

    fn corpus() -> Vec<CorpusPage> {
        vec![
            page(
                "https://wiki.local/Marta_Ilves",
                "Marta Ilves",
                "Marta Ilves is a chemist. She was born in Tallinn in 1961.\n\
                 Ilves founded the Norrvik Institute, which studies catalysts.",
            ),
            page(
                "https://wiki.local/Norrvik_Institute",
                "Norrvik Institute",
                "The Norrvik Institute is a research organisation in Tartu. It was founded by \
                 Marta Ilves in 1994. Its current director is Jonas Pikk.",
            ),
            page(
                "https://wiki.local/Tallinn",
                "Tallinn",
                "Tallinn is the capital city of Estonia. It lies on the Gulf of Finland.",
            ),
            page(
                "https://wiki.local/Distractor_1",
                "Harbour Festival",
                "A yearly festival held in a harbour city. Boats, music and food.",
            ),
        ]
    }

    #[test]
    fn tokenizer_lowercases_and_splits_on_non_alphanumerics() {
        assert_eq!(
            tokenize("Hello, Wörld! x2-y_Z ÉCOLE"),
            vec!["hello", "wörld", "x2", "y", "z", "école"]
        );
        assert!(tokenize("  ,;- ").is_empty());
    }

    #[test]
    fn sentences_split_on_terminators_and_newlines() {
        let text = "One two. Three? Four!\nFive 3.14 six";
        let got: Vec<&str> = sentence_spans(text)
            .iter()
            .map(|&(s, e)| &text[s..e])
            .collect();
        assert_eq!(got, vec!["One two.", "Three?", "Four!", "Five 3.14 six"]);
    }

    #[test]
    fn entity_page_ranks_first_for_its_name() {
        let index = Bm25Index::new(corpus()).unwrap();
        let hits = index.search("Who is Marta Ilves?", 3);
        assert_eq!(hits[0].url, "https://wiki.local/Marta_Ilves");
        assert_eq!(hits[1].url, "https://wiki.local/Norrvik_Institute");
        let hits = index.search("capital of Estonia", 5);
        assert_eq!(hits[0].title, "Tallinn");
        assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    }

    #[test]
    fn snippet_is_the_best_matching_sentence() {
        let index = Bm25Index::new(corpus()).unwrap();
        let hits = index.search("director of the Norrvik Institute", 1);
        assert_eq!(hits[0].title, "Norrvik Institute");
        assert_eq!(hits[0].snippet, "Its current director is Jonas Pikk.");
        // The short best sentence is followed by the next one.
        let hits = index.search("catalysts", 1);
        assert_eq!(
            hits[0].snippet,
            "Ilves founded the Norrvik Institute, which studies catalysts."
        );
    }

    #[test]
    fn snippet_falls_back_to_page_start_when_only_the_title_matches() {
        let long = "word ".repeat(100);
        let index = Bm25Index::new(vec![page("u", "Zebra", &long)]).unwrap();
        let hits = index.search("zebra", 1);
        assert!(hits[0].snippet.starts_with("word word"));
        assert!(hits[0].snippet.ends_with("..."));
        assert!(hits[0].snippet.chars().count() <= SNIPPET_FALLBACK_CHARS + 3);
    }

    #[test]
    fn search_is_deterministic_and_breaks_ties_by_corpus_order() {
        let pages: Vec<CorpusPage> = (0..50)
            .map(|i| page(&format!("u{i}"), "same title", "identical body text."))
            .collect();
        let index = Bm25Index::new(pages).unwrap();
        let a = index.search("identical body", 10);
        let b = index.search("identical body", 10);
        assert_eq!(a, b);
        let docs: Vec<usize> = a.iter().map(|h| h.doc).collect();
        assert_eq!(docs, (0..10).collect::<Vec<_>>());
        // The scratch accumulator is reset between queries: same scores again after others.
        index.search("title", 50);
        assert_eq!(index.search("identical body", 10), a);
    }

    #[test]
    fn no_match_and_edge_queries_return_nothing() {
        let index = Bm25Index::new(corpus()).unwrap();
        assert!(index.search("xylophone quokka", 5).is_empty());
        assert!(index.search("", 5).is_empty());
        assert!(index.search("!!!", 5).is_empty());
        assert!(index.search("Tallinn", 0).is_empty());
        let empty = Bm25Index::new(Vec::new()).unwrap();
        assert!(empty.search("anything", 5).is_empty());
    }

    /// Straightforward BM25 over token lists, to check the optimised index against.
    fn brute_force(pages: &[CorpusPage], query: &str) -> Vec<(usize, f32)> {
        let docs: Vec<Vec<String>> = pages
            .iter()
            .map(|p| {
                tokenize(&p.title)
                    .into_iter()
                    .chain(tokenize(&p.text))
                    .collect()
            })
            .collect();
        let n = docs.len() as f64;
        let avgdl = docs.iter().map(Vec::len).sum::<usize>() as f64 / n;
        let mut q = tokenize(query);
        q.dedup();
        let mut seen = std::collections::HashSet::new();
        q.retain(|t| seen.insert(t.clone()));
        let mut scored: Vec<(usize, f32)> = docs
            .iter()
            .enumerate()
            .map(|(d, toks)| {
                let mut score = 0.0f64;
                for term in &q {
                    let df = docs.iter().filter(|t| t.contains(term)).count() as f64;
                    let tf = toks.iter().filter(|t| *t == term).count() as f64;
                    if tf > 0.0 {
                        let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                        let norm = 1.2 * (1.0 - 0.75 + 0.75 * toks.len() as f64 / avgdl);
                        score += idf * tf * 2.2 / (tf + norm);
                    }
                }
                (d, score as f32)
            })
            .filter(|&(_, s)| s > 0.0)
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored
    }

    #[test]
    fn matches_brute_force_bm25_on_both_paths() {
        // 400 pages over a 60-word vocabulary, lengths varying: rare and common terms both.
        let words: Vec<String> = (0..60).map(|i| format!("t{i}")).collect();
        let pages: Vec<CorpusPage> = (0..400)
            .map(|i| {
                let len = 5 + (i * 7) % 40;
                let text: Vec<&str> = (0..len)
                    .map(|j| words[((i * 31 + j * j * 17) % 97) % 60].as_str())
                    .collect();
                page(&format!("u{i}"), &format!("Page {i}"), &text.join(" "))
            })
            .collect();
        let index = Bm25Index::new(pages.clone()).unwrap();
        // "page 17": selective ("17") plus dense ("page"); "t59 t58": fewer docs; etc.
        for query in [
            "page 17",
            "t59",
            "t3 t59 t3",
            "t0 t1 t2 t3 t4",
            "17 123 399",
            "t42 page",
        ] {
            let want = brute_force(&pages, query);
            for k in [1, 5, 100] {
                let got = index.search(query, k);
                assert_eq!(got.len(), want.len().min(k), "{query} k={k}");
                for (hit, &(doc, score)) in got.iter().zip(&want) {
                    assert!(
                        (hit.score - score).abs() <= 1e-4 * score.max(1.0),
                        "{query} k={k}: doc {} score {} vs brute force doc {doc} {score}",
                        hit.doc,
                        hit.score
                    );
                    // Same order except between (nearly) equal scores.
                    if (hit.score - score).abs() < 1e-6 {
                        assert_eq!(hit.doc, doc, "{query} k={k}");
                    }
                }
            }
        }
    }

    #[test]
    fn render_matches_the_reference_format() {
        let hits = vec![
            SearchHit {
                doc: 0,
                url: "https://a".into(),
                title: "A".into(),
                snippet: "First.".into(),
                score: 2.0,
            },
            SearchHit {
                doc: 1,
                url: "https://b".into(),
                title: "B".into(),
                snippet: "Second.".into(),
                score: 1.0,
            },
        ];
        assert_eq!(
            render_search(&hits),
            "Found 2 results:\n\n1. [A](https://a)\nFirst.\n\n2. [B](https://b)\nSecond."
        );
        assert_eq!(
            render_search(&[]),
            "Found 0 results:\n\nNo pages matched the query."
        );
    }

    #[test]
    fn stop_words_are_sorted_lowercase_tokens() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
        assert!(STOP_WORDS.iter().all(|w| tokenize(w) == [*w]));
    }

    #[test]
    fn stems_join_the_forms_of_a_word() {
        for (words, want) in [
            (&["headquarters", "headquartered"][..], "headquart"),
            (&["founder", "founded", "founders"], "found"),
            (&["works", "worked", "working"], "work"),
            (&["studies", "studied"], "studi"),
            (&["located", "location"], "locat"),
            (&["designer", "designed"], "design"),
            (&["manufacturer", "manufactured"], "manufactur"),
            (&["mentored", "mentor"], "mentor"),
            (&["born"], "born"),
            (&["class", "boss"], "class"),
        ] {
            for w in words {
                assert_eq!(stem(w), if *w == "boss" { "boss" } else { want }, "{w}");
            }
        }
        // Short words keep what would leave fewer than 3 letters.
        assert_eq!((stem("red").as_str(), stem("led").as_str(), stem("is").as_str(), stem("ties").as_str()), ("red", "led", "is", "tie"));
    }

    #[test]
    fn clip_prefers_word_boundaries() {
        assert_eq!(clip_chars("short", 10), "short");
        assert_eq!(clip_chars("alpha beta gamma delta", 13), "alpha beta...");
        assert_eq!(clip_chars("ééééé", 3), "ééé...");
    }
}
