//! BM25 search throughput: 10^5 queries against a synthetic 10k-page corpus (the scale the
//! teacher runs at). `cargo run --release -p coa-tools --example search_bench`

use std::time::Instant;

use coa_schemas::rows::CorpusPage;
use coa_tools::Bm25Index;

fn main() {
    // Deterministic pseudo-random words (xorshift), Zipf-ish by squaring.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut word = |vocab: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let r = (state % 1_000_000) as f64 / 1_000_000.0;
        format!("w{}", (r * r * vocab as f64) as u64)
    };
    let pages: Vec<CorpusPage> = (0..10_000)
        .map(|i| {
            let title = format!("Entity {i}");
            let text: Vec<String> = (0..300)
                .map(|j| {
                    if j % 12 == 11 {
                        format!("{}.", word(20_000))
                    } else {
                        word(20_000)
                    }
                })
                .collect();
            CorpusPage {
                url: format!("https://w/{i}"),
                title,
                text: format!("Entity {i} is notable. {}", text.join(" ")),
                kind: "entity".into(),
            }
        })
        .collect();
    let t = Instant::now();
    let index = Bm25Index::new(pages).unwrap();
    let build = t.elapsed();
    let queries: Vec<String> = (0..100_000)
        .map(|i| format!("entity {} {} {}", i % 10_000, word(20_000), word(20_000)))
        .collect();
    let t = Instant::now();
    let mut hits = 0;
    for q in &queries {
        hits += index.search(q, 5).len();
    }
    let took = t.elapsed();
    eprintln!(
        "build {build:?}; {} queries in {took:?} ({:.1} us/query, {hits} hits)",
        queries.len(),
        took.as_secs_f64() * 1e6 / queries.len() as f64
    );
}
