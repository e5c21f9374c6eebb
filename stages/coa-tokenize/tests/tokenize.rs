//! Real-behaviour tests: the library on rendered CoA text, and the binary on Parquet files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, ListArray, StringArray, StructArray};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Fields, Int32Type, Schema, UInt8Type};
use arrow::record_batch::RecordBatch;
use coa_format::{render, Step, Tag};
use coa_schemas::tables::{COA_TEXT, TOKENS};
use coa_tokenize::{encode_joined, encode_row, tag_strings, Vocab};

/// One coa_text row: (task_id, prompt, text, spans in characters).
type Row = (String, String, String, Vec<(i32, i32)>);

fn rendered_row(id: &str, prompt: &str, steps: &[Step<'_>]) -> Row {
    let r = render(steps).expect("renders");
    let spans = r.observation_spans.iter().map(|s| (s.start as i32, s.end as i32)).collect();
    (id.to_string(), prompt.to_string(), r.text, spans)
}

/// A small corpus of real CoA renderings: web and code flavours, unicode, `>\n\n` in observations.
fn corpus() -> Vec<Row> {
    let mut rows = Vec::new();
    for i in 0..40 {
        let q = format!("Who founded the company that makes product {i}? Éric or Zoë?");
        let obs = format!(
            "Found 2 results:\n1. [Acme {i}](https://example.org/acme{i})\nAcme was founded by Zoë Ng in 19{i:02}.\n\n2. [Ümlaut](https://example.org/u)\n<div>\n\n</div>>\n\nnothing"
        );
        let page = format!("Page 1 [https://example.org/acme{i}] Summary:\nZoë Ng — 日本語 founder of Acme {i}.");
        let (query, url) = (format!("product {i} maker"), format!("https://example.org/acme{i}"));
        let steps = vec![
            Step::new(Tag::Think, "I should plan the search first."),
            Step::new(Tag::Plan, "1. search the product\n2. read the page"),
            Step::new(Tag::Think, "Search for the maker."),
            Step::tool(Tag::WebSearch, &query, &obs),
            Step::new(Tag::Think, "Read the page."),
            Step::tool(Tag::CrawlPage, &url, &page),
            Step::new(Tag::Think, "The founder is Zoë Ng."),
            Step::new(Tag::SuggestedAnswer, "Zoë Ng"),
            Step::new(Tag::DoubleCheck, "score: 4"),
            Step::new(Tag::Answer, "Zoë Ng"),
        ];
        rows.push(rendered_row(&format!("multihop-{i}"), &format!("Answer the question.\n\nQuestion: {q}"), &steps));
        let code = format!("print({i} * 7)");
        let out = format!("[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n{}\n[STDOUT:END]", i * 7);
        let boxed = format!("\\boxed{{{}}}", i * 7);
        let steps = vec![
            Step::new(Tag::Plan, "compute it"),
            Step::new(Tag::Think, "Use code."),
            Step::tool(Tag::Code, &code, &out),
            Step::new(Tag::Reflection, "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good"),
            Step::new(Tag::Think, "Done."),
            Step::new(Tag::Answer, &boxed),
        ];
        rows.push(rendered_row(&format!("math-{i}"), &format!("Solve.\n\nQuestion: what is {i} times 7?"), &steps));
    }
    rows
}

fn trained(rows: &[Row], vocab_size: usize) -> Vocab {
    Vocab::train(rows.iter().flat_map(|r| [r.1.as_str(), r.2.as_str()]), vocab_size, 2).expect("trains")
}

fn spans_of(row: &Row) -> (Vec<i32>, Vec<i32>) {
    (row.3.iter().map(|s| s.0).collect(), row.3.iter().map(|s| s.1).collect())
}

fn char_slice(s: &str, a: usize, b: usize) -> String {
    s.chars().skip(a).take(b - a).collect()
}

// ---------------------------------------------------------------------------------------------
// Library: tags, merges, unicode, round trip, masks.

#[test]
fn every_tag_is_one_special_token_with_its_own_id() {
    let v = trained(&corpus(), 600);
    let tags = tag_strings();
    assert_eq!(tags.len(), 2 * Tag::ALL.len());
    assert_eq!(v.tag_ids.len(), tags.len());
    for (t, &id) in tags.iter().zip(&v.tag_ids) {
        let ids = v.tokenizer.encode(*t, false).unwrap().get_ids().to_vec();
        assert_eq!(ids, vec![id], "{t}");
    }
    let mut distinct = v.tag_ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), tags.len());
    assert_eq!(v.eos, v.tokenizer.token_to_id("<|endoftext|>"));
    assert!(v.bos.is_empty());
}

#[test]
fn tags_adjacent_to_text_and_to_each_other_stay_whole() {
    let v = trained(&corpus(), 600);
    let id = |t: &str| v.tokenizer.token_to_id(t).unwrap();
    for text in [
        "<think>x</think><plan>y</plan>",
        "a<think></think>b",
        "</think>\n\n<plan>1.</plan>\n\n<answer>Zoë</answer>",
        "<code>\n```py\nprint(1)\n```\n</code><observation>>\n\n<div></observation>",
    ] {
        let ids = v.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        // Every tag occurrence is exactly its id, and nothing else decodes to a piece holding `<tag`.
        let n_tags = tag_strings().iter().map(|t| text.matches(t).count()).sum::<usize>();
        let n_tag_ids = ids.iter().filter(|i| v.tag_ids.contains(i)).count();
        assert_eq!(n_tags, n_tag_ids, "{text:?}: {ids:?}");
        assert_eq!(v.tokenizer.decode(&ids, false).unwrap(), text);
        for &i in &ids {
            if !v.tag_ids.contains(&i) {
                let piece = v.tokenizer.decode(&[i], false).unwrap();
                assert!(!tag_strings().iter().any(|t| piece.contains(t)), "{piece:?}");
            }
        }
    }
    let ids = v.tokenizer.encode("</think>\n\n<plan>", false).unwrap().get_ids().to_vec();
    assert_eq!(ids.first(), Some(&id("</think>")));
    assert_eq!(ids.last(), Some(&id("<plan>")));
}

#[test]
fn gt_newline_merges_exist_but_never_swallow_a_tag() {
    let v = trained(&corpus(), 600);
    // The corpus has `>\n\n` in observations: the BPE learned a token ending in `>\n\n`.
    let vocab = v.tokenizer.get_vocab(false);
    let merged = vocab.keys().any(|k| k.len() > 1 && k.ends_with(">ĊĊ"));
    assert!(merged, "expected a learned `>\\n\\n` token");
    let ids = v.tokenizer.encode("<div>>\n\n</div>", false).unwrap().get_ids().to_vec();
    assert!(ids.iter().any(|&i| v.tokenizer.id_to_token(i).is_some_and(|t| t.ends_with(">ĊĊ"))));
    // ... but a tag followed by `\n\n` is the tag's id, then newline tokens.
    let ids = v.tokenizer.encode("</think>\n\n", false).unwrap().get_ids().to_vec();
    assert_eq!(ids[0], v.tokenizer.token_to_id("</think>").unwrap());
    assert_eq!(v.tokenizer.decode(&ids[1..], false).unwrap(), "\n\n");
}

#[test]
fn ids_decode_back_to_the_text_and_equal_the_joined_encoding() {
    let rows = corpus();
    let v = trained(&rows, 600);
    for row in &rows {
        let (s, e) = spans_of(row);
        let enc = encode_row(&v, &row.1, &row.2, &s, &e).unwrap();
        assert!(enc.aligned);
        let decoded = v.tokenizer.decode(&enc.ids, false).unwrap();
        assert_eq!(decoded, format!("{}\n{}<|endoftext|>", row.1, row.2));
        assert_eq!(enc.ids, encode_joined(&v, &row.1, &row.2).unwrap(), "{}", row.0);
    }
}

#[test]
fn the_cached_fast_path_gives_the_tokenizers_own_ids() {
    let rows = corpus();
    let v = trained(&rows, 600);
    assert!(v.fast, "a trained BPE takes the fast path");
    let mut samples: Vec<String> = rows.iter().flat_map(|r| [r.1.clone(), r.2.clone()]).collect();
    samples.extend(
        ["", "<|endoftext|><think>", "<thin", "a <think>  b\n\n\n</think>", "x<<think>>y", "日本語<answer>Zoë</answer>é", "  \t\r\n 123 4567"]
            .map(String::from),
    );
    for s in &samples {
        for _ in 0..2 {
            // Twice: the second pass is served from the word cache.
            let mut ids = Vec::new();
            v.encode_into(s, &mut ids).unwrap();
            assert_eq!(ids, v.tokenizer.encode_fast(s.as_str(), false).unwrap().get_ids(), "{s:?}");
        }
    }
}

#[test]
fn masked_tokens_are_exactly_prompt_and_observations_with_multibyte_chars() {
    let rows = corpus();
    let v = trained(&rows, 600);
    for row in rows.iter().filter(|r| !r.2.is_ascii()) {
        let (s, e) = spans_of(row);
        let enc = encode_row(&v, &row.1, &row.2, &s, &e).unwrap();
        // Token runs by mask value, decoded: 0-runs are the prompt+"\n" and each observation span
        // (cut by character offsets), 1-runs the rest of the text; EOS last with mask 1.
        let mut runs: Vec<(u8, Vec<u32>)> = Vec::new();
        for (&id, &m) in enc.ids.iter().zip(&enc.mask) {
            match runs.last_mut() {
                Some((mm, ids)) if *mm == m => ids.push(id),
                _ => runs.push((m, vec![id])),
            }
        }
        let mut expected: Vec<(u8, String)> = vec![(0, format!("{}\n", row.1))];
        let mut at = 0;
        for &(a, b) in &row.3 {
            expected.push((1, char_slice(&row.2, at, a as usize)));
            expected.push((0, char_slice(&row.2, a as usize, b as usize)));
            at = b as usize;
        }
        expected.push((1, format!("{}<|endoftext|>", char_slice(&row.2, at, row.2.chars().count()))));
        let got: Vec<(u8, String)> = runs.iter().map(|(m, ids)| (*m, v.tokenizer.decode(ids, false).unwrap())).collect();
        assert_eq!(got, expected, "{}", row.0);
        for (m, text) in &got {
            if *m == 0 && text.starts_with("<observation>") {
                assert!(text.ends_with("</observation>"));
            }
        }
    }
}

#[test]
fn hand_checked_mask_on_a_merge_free_vocabulary() {
    // specials (1 + 22 tags) + 256 bytes: no merges, one token per ASCII character.
    let v = Vocab::train(["Q", "x"].into_iter(), 1 + tag_strings().len() + 256, 2).unwrap();
    let text = "<think>hi</think>\n<code>x</code>\n<observation>ok</observation>\n<answer>4</answer>";
    let obs_start = text.find("<observation>").unwrap() as i32;
    let obs_end = (text.find("</observation>").unwrap() + "</observation>".len()) as i32;
    let enc = encode_row(&v, "Q", text, &[obs_start], &[obs_end]).unwrap();
    let pieces: Vec<String> = enc.ids.iter().map(|&i| v.tokenizer.decode(&[i], false).unwrap()).collect();
    let expected: Vec<(&str, u8)> = vec![
        ("Q", 0),
        ("\n", 0),
        ("<think>", 1),
        ("h", 1),
        ("i", 1),
        ("</think>", 1),
        ("\n", 1),
        ("<code>", 1),
        ("x", 1),
        ("</code>", 1),
        ("\n", 1),
        ("<observation>", 0),
        ("o", 0),
        ("k", 0),
        ("</observation>", 0),
        ("\n", 1),
        ("<answer>", 1),
        ("4", 1),
        ("</answer>", 1),
        ("<|endoftext|>", 1),
    ];
    let got: Vec<(&str, u8)> = pieces.iter().map(String::as_str).zip(enc.mask.iter().copied()).collect();
    assert_eq!(got, expected);
    assert_eq!(enc.prompt_len, 2);
    assert_eq!(enc.observations, vec![(11, 15)]);
    assert_eq!(enc.targets(), 14);
}

#[test]
fn a_boundary_off_a_tag_splits_tokens_and_is_reported() {
    let rows = corpus();
    let v = trained(&rows, 600);
    // Mask the middle of a word: the segments force a token boundary there.
    let text = "<think>founder founder</think>";
    let a = text.find("under").unwrap() as i32;
    let enc = encode_row(&v, "Q", text, &[a], &[a + 5]).unwrap();
    assert!(!enc.aligned);
    let zeros: Vec<u32> = enc.ids.iter().zip(&enc.mask).skip(enc.prompt_len as usize).filter(|(_, &m)| m == 0).map(|(&i, _)| i).collect();
    assert_eq!(v.tokenizer.decode(&zeros, false).unwrap(), "under");
    assert_eq!(v.tokenizer.decode(&enc.ids, false).unwrap(), format!("Q\n{text}<|endoftext|>"));
}

#[test]
fn training_is_deterministic() {
    let rows = corpus();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    trained(&rows, 500).save(&a).unwrap();
    trained(&rows, 500).save(&b).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}

#[test]
fn training_on_one_huge_word_is_linear() {
    // 512 KB of letters and no space: one pre-tokenized word unless words are bounded, and a
    // BPE merge costs time linear in every word it touches (this took minutes before).
    let mut x = 12345u64;
    let word: String = (0..512 * 1024)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (b'a' + ((x >> 33) % 26) as u8) as char
        })
        .collect();
    let started = std::time::Instant::now();
    let v = Vocab::train([word.as_str()].into_iter(), 400, 2).expect("trains");
    let secs = started.elapsed().as_secs_f64();
    assert!(secs < 30.0, "training on one 512 KB word took {secs:.1} s");
    // The bound is part of the saved tokenizer, so encoding cuts words the same way.
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let mut pieces = PreTokenizedString::from(&word[..1000]);
    v.tokenizer.get_pre_tokenizer().expect("a pre-tokenizer").pre_tokenize(&mut pieces).unwrap();
    let lens: Vec<usize> = pieces.get_splits(OffsetReferential::Original, OffsetType::Char).iter().map(|(_, (a, b), _)| b - a).collect();
    assert_eq!(lens.iter().sum::<usize>(), 1000);
    assert!(lens.iter().all(|&n| n <= coa_tokenize::MAX_WORD_CHARS), "{lens:?}");
    let ids = v.tokenizer.encode(word.as_str(), false).unwrap().get_ids().to_vec();
    assert_eq!(v.tokenizer.decode(&ids, false).unwrap(), word, "the cut word still round-trips");
}

// ---------------------------------------------------------------------------------------------
// The binary on files.

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coa-tokenize"))
}

fn spans_array(rows: &[Row]) -> ArrayRef {
    let fields = Fields::from(vec![Field::new("start", DataType::Int32, false), Field::new("end", DataType::Int32, false)]);
    let starts: Vec<i32> = rows.iter().flat_map(|r| r.3.iter().map(|s| s.0)).collect();
    let ends: Vec<i32> = rows.iter().flat_map(|r| r.3.iter().map(|s| s.1)).collect();
    let values = StructArray::new(fields.clone(), vec![Arc::new(Int32Array::from(starts)), Arc::new(Int32Array::from(ends))], None);
    let item = match COA_TEXT.schema().field_with_name("observation_spans").unwrap().data_type() {
        DataType::List(f) => f.clone(),
        _ => unreachable!(),
    };
    Arc::new(ListArray::new(item, OffsetBuffer::from_lengths(rows.iter().map(|r| r.3.len())), Arc::new(values), None))
}

fn write_coa_text(path: &Path, rows: &[Row], drop_column: Option<&str>) {
    let strings = |f: &dyn Fn(&Row) -> &str| -> ArrayRef { Arc::new(StringArray::from_iter_values(rows.iter().map(f))) };
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("task_id", strings(&|r| &r.0)),
        ("suite", strings(&|r| r.0.split('-').next().unwrap())),
        ("prompt", strings(&|r| &r.1)),
        ("text", strings(&|r| &r.2)),
        ("observation_spans", spans_array(rows)),
    ];
    let schema = COA_TEXT.schema();
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns
        .into_iter()
        .filter(|(n, _)| Some(*n) != drop_column)
        .map(|(n, a)| (schema.field_with_name(n).unwrap().clone(), a))
        .unzip();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

struct TokenRow {
    task_id: String,
    ids: Vec<i32>,
    mask: Vec<u8>,
    segs: Option<Vec<i32>>,
    n_tokens: i32,
    n_targets: i32,
}

fn read_tokens(path: &Path) -> Vec<TokenRow> {
    let (_, batches) = coa_schemas::io::read_all(Some(path), &TOKENS).unwrap();
    let mut out = Vec::new();
    for b in batches {
        let tid = b.column(0).as_string::<i32>();
        let ids = b.column(1).as_list::<i32>();
        let mask = b.column(2).as_list::<i32>();
        let segs = b.column(3).as_list::<i32>();
        let (nt, ng) = (b.column(4).as_primitive::<Int32Type>(), b.column(5).as_primitive::<Int32Type>());
        for i in 0..b.num_rows() {
            out.push(TokenRow {
                task_id: tid.value(i).to_string(),
                ids: ids.value(i).as_primitive::<Int32Type>().values().to_vec(),
                mask: mask.value(i).as_primitive::<UInt8Type>().values().to_vec(),
                segs: (!segs.is_null(i)).then(|| segs.value(i).as_primitive::<Int32Type>().values().to_vec()),
                n_tokens: nt.value(i),
                n_targets: ng.value(i),
            });
        }
    }
    out
}

fn run_ok(cmd: &mut Command) -> serde_json::Value {
    let out: Output = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {stderr}");
    serde_json::from_str(stderr.lines().last().unwrap()).unwrap()
}

fn run_err(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "expected a failure");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

struct Fixture {
    _dir: tempfile::TempDir,
    input: PathBuf,
    tok: PathBuf,
    dir: PathBuf,
    rows: Vec<Row>,
}

/// Trains a vocabulary with the binary and writes the full (unlimited) tokens.
fn fixture() -> (Fixture, Vec<TokenRow>, serde_json::Value) {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let rows = corpus();
    let input = dir.join("coa_text.parquet");
    write_coa_text(&input, &rows, None);
    let tok = dir.join("tok/tokenizer.json");
    let out = dir.join("full.parquet");
    let summary = run_ok(bin().arg("-i").arg(&input).args(["--train-bpe", "--vocab-size", "600", "--save-tokenizer"]).arg(&tok).arg("-o").arg(&out).arg("--verify-joined"));
    let full = read_tokens(&out);
    (Fixture { _dir: d, input, tok, dir, rows }, full, summary)
}

#[test]
fn binary_trains_saves_and_tokenizes_in_one_run() {
    let (f, full, summary) = fixture();
    assert_eq!(full.len(), f.rows.len());
    assert_eq!(summary["rows_in"], 80);
    assert_eq!(summary["rows_out"], 80);
    assert_eq!(summary["rows_unaligned"], 0);
    assert_eq!(summary["joined_mismatch"], 0);
    // A small corpus runs out of pairs seen twice before 600 ids.
    let size = summary["vocab_size"].as_u64().unwrap();
    assert!(size > 23 + 256 + 100 && size <= 600, "{size}");
    // The saved file reloads to the same ids.
    let v = Vocab::load(&f.tok, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"auto".parse().unwrap()).unwrap();
    assert_eq!(v.tags_added, 0);
    for (row, t) in f.rows.iter().zip(&full) {
        assert_eq!(t.task_id, row.0);
        assert!(t.segs.is_none());
        assert_eq!(t.n_tokens as usize, t.ids.len());
        assert_eq!(t.n_targets as usize, t.mask.iter().filter(|&&m| m == 1).count());
        let (s, e) = spans_of(row);
        let enc = encode_row(&v, &row.1, &row.2, &s, &e).unwrap();
        assert_eq!(t.ids, enc.ids.iter().map(|&x| x as i32).collect::<Vec<_>>());
        assert_eq!(t.mask, enc.mask);
    }
    // Loading the saved tokenizer gives byte-identical tokens.
    let again = f.dir.join("again.parquet");
    run_ok(bin().arg("-i").arg(&f.input).arg("--tokenizer").arg(&f.tok).arg("-o").arg(&again));
    let again = read_tokens(&again);
    assert!(full.iter().zip(&again).all(|(a, b)| a.ids == b.ids && a.mask == b.mask));
}

#[test]
fn max_len_drops_or_truncates_outside_observations() {
    let (f, full, _) = fixture();
    let mut lens: Vec<usize> = full.iter().map(|t| t.ids.len()).collect();
    lens.sort();
    let max_len = lens[lens.len() / 2];
    let too_long = full.iter().filter(|t| t.ids.len() > max_len).count();
    assert!(too_long > 0);

    let out = f.dir.join("drop.parquet");
    let s = run_ok(bin().arg("-i").arg(&f.input).arg("--tokenizer").arg(&f.tok).args(["--max-len", &max_len.to_string()]).arg("-o").arg(&out));
    assert_eq!(s["dropped_overlong"], too_long as u64);
    let kept = read_tokens(&out);
    assert_eq!(kept.len(), full.len() - too_long);
    assert!(kept.iter().all(|t| t.ids.len() <= max_len));

    let out = f.dir.join("trunc.parquet");
    let s = run_ok(bin().arg("-i").arg(&f.input).arg("--tokenizer").arg(&f.tok).args(["--max-len", &max_len.to_string(), "--overlong", "truncate"]).arg("-o").arg(&out));
    let cut = read_tokens(&out);
    assert_eq!(s["truncated"].as_u64().unwrap() + s["dropped_overlong"].as_u64().unwrap(), too_long as u64);
    assert!(s["truncated"].as_u64().unwrap() > 0);
    let v = Vocab::load(&f.tok, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"auto".parse().unwrap()).unwrap();
    let (obs_open, obs_close) = (v.tokenizer.token_to_id("<observation>").unwrap() as i32, v.tokenizer.token_to_id("</observation>").unwrap() as i32);
    for t in &cut {
        let orig = full.iter().find(|o| o.task_id == t.task_id).unwrap();
        assert!(t.ids.len() <= max_len);
        assert_eq!(&orig.ids[..t.ids.len()], &t.ids[..], "a prefix of the full row");
        assert_eq!(&orig.mask[..t.ids.len()], &t.mask[..]);
        // Never inside an observation: as many openings as closings.
        let opens = t.ids.iter().filter(|&&i| i == obs_open).count();
        let closes = t.ids.iter().filter(|&&i| i == obs_close).count();
        assert_eq!(opens, closes, "{}", t.task_id);
        assert!(t.n_targets > 0);
    }
}

#[test]
fn packing_fills_rows_with_segment_ids() {
    let (f, full, _) = fixture();
    let max_len = full.iter().map(|t| t.ids.len()).max().unwrap() * 2;
    let out = f.dir.join("packed.parquet");
    let s = run_ok(bin().arg("-i").arg(&f.input).arg("--tokenizer").arg(&f.tok).args(["--max-len", &max_len.to_string(), "--pack"]).arg("-o").arg(&out));
    let packed = read_tokens(&out);
    assert!(packed.len() < full.len());
    assert_eq!(s["packed_rows"], packed.len() as u64);
    let mut pieces: Vec<(Vec<i32>, Vec<u8>)> = Vec::new();
    for t in &packed {
        assert!(t.ids.len() <= max_len);
        assert_eq!(t.n_tokens as usize, t.ids.len());
        assert_eq!(t.n_targets as usize, t.mask.iter().filter(|&&m| m == 1).count());
        let segs = t.segs.as_ref().expect("segment ids when packed");
        assert_eq!(segs.len(), t.ids.len());
        assert_eq!(segs[0], 0);
        assert!(segs.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        let n = *segs.last().unwrap() + 1;
        for k in 0..n {
            let idx: Vec<usize> = (0..segs.len()).filter(|&i| segs[i] == k).collect();
            pieces.push((idx.iter().map(|&i| t.ids[i]).collect(), idx.iter().map(|&i| t.mask[i]).collect()));
        }
    }
    // Every sequence is in exactly one packed row, unchanged.
    let mut a: Vec<(Vec<i32>, Vec<u8>)> = full.iter().map(|t| (t.ids.clone(), t.mask.clone())).collect();
    a.sort();
    pieces.sort();
    assert_eq!(a, pieces);
}

#[test]
fn a_foreign_tokenizer_gets_the_tags_and_its_bos_eos() {
    use tokenizers::models::bpe::BPE;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::{AddedToken, Tokenizer};
    // A Llama-style file: byte-level BPE with <s> / </s>, a post-processor adding <s>, no CoA tags.
    let base = trained(&corpus(), 600);
    // The byte alphabet only (no merges), renumbered from 0.
    let mut bytes: Vec<String> = base.tokenizer.get_vocab(false).into_keys().filter(|k| k.chars().count() == 1).collect();
    bytes.sort();
    assert_eq!(bytes.len(), 256);
    let bpe_vocab: std::collections::HashMap<String, u32> = bytes.into_iter().zip(0u32..).collect();
    let files = tempfile::tempdir().unwrap();
    let (vocab_json, merges_txt) = (files.path().join("vocab.json"), files.path().join("merges.txt"));
    std::fs::write(&vocab_json, serde_json::to_string(&bpe_vocab).unwrap()).unwrap();
    std::fs::write(&merges_txt, "#version: 0.2\n").unwrap();
    let model = BPE::from_file(vocab_json.to_str().unwrap(), merges_txt.to_str().unwrap()).build().unwrap();
    let mut fresh = Tokenizer::new(model);
    fresh.with_pre_tokenizer(base.tokenizer.get_pre_tokenizer().cloned());
    fresh.with_decoder(base.tokenizer.get_decoder().cloned());
    fresh.add_special_tokens([AddedToken::from("<s>", true), AddedToken::from("</s>", true)]).unwrap();
    let bos = fresh.token_to_id("<s>").unwrap();
    let eos = fresh.token_to_id("</s>").unwrap();
    fresh.with_post_processor(Some(TemplateProcessing::builder().try_single("<s> $A").unwrap().special_tokens(vec![("<s>", bos)]).build().unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    fresh.save(&path, false).unwrap();

    let v = Vocab::load(&path, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"auto".parse().unwrap()).unwrap();
    assert_eq!(v.tags_added, tag_strings().len());
    assert_eq!(v.bos, vec![bos]);
    assert_eq!(v.eos, Some(eos));
    let enc = encode_row(&v, "Q", "<think>x</think>", &[], &[]).unwrap();
    assert_eq!(enc.ids[0], bos);
    assert_eq!(enc.mask[0], 0);
    assert_eq!(*enc.ids.last().unwrap(), eos);
    assert_eq!(*enc.mask.last().unwrap(), 1);
    assert!(enc.ids.contains(&v.tokenizer.token_to_id("<think>").unwrap()));

    // Through the binary, with --save-tokenizer writing the file with the tags added.
    let input = dir.path().join("in.parquet");
    write_coa_text(&input, &corpus()[..4], None);
    let saved = dir.path().join("with_tags.json");
    let s = run_ok(bin().arg("-i").arg(&input).arg("--tokenizer").arg(&path).arg("--save-tokenizer").arg(&saved).arg("-o").arg(dir.path().join("o.parquet")));
    assert_eq!(s["tags_added"], tag_strings().len());
    assert_eq!(s["bos"], serde_json::json!([bos]));
    let reloaded = Vocab::load(&saved, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"auto".parse().unwrap()).unwrap();
    assert_eq!(reloaded.tags_added, 0);
    assert_eq!(reloaded.tag_ids, v.tag_ids);
    // `--eos none` drops the EOS; an unknown --eos token is an error naming it.
    let v = Vocab::load(&path, &"auto".parse().unwrap(), &"none".parse().unwrap(), &"auto".parse().unwrap()).unwrap();
    assert_eq!(v.eos, None);
    let e = Vocab::load(&path, &"auto".parse().unwrap(), &"<|nope|>".parse().unwrap(), &"auto".parse().unwrap()).err().unwrap();
    assert!(format!("{e}").contains("<|nope|>"), "{e}");
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let (f, _, _) = fixture();
    let out = f.dir.join("bad_out.parquet");

    let missing = f.dir.join("missing.parquet");
    write_coa_text(&missing, &f.rows[..3], Some("observation_spans"));
    let err = run_err(bin().arg("-i").arg(&missing).arg("--tokenizer").arg(&f.tok).arg("-o").arg(&out));
    assert!(err.contains("observation_spans") && err.contains("missing"), "{err}");
    assert!(!out.exists());

    let mut rows = f.rows[..5].to_vec();
    let n = rows[3].2.chars().count() as i32;
    rows[3].3.push((n, n + 4));
    let oor = f.dir.join("oor.parquet");
    write_coa_text(&oor, &rows, None);
    let err = run_err(bin().arg("-i").arg(&oor).arg("--tokenizer").arg(&f.tok).arg("-o").arg(&out));
    assert!(err.contains("row 3") && err.contains(&rows[3].0) && err.contains("out of range"), "{err}");
    assert!(!out.exists());

    let mut rows = f.rows[..5].to_vec();
    rows[1].3[0] = (10, 5);
    let back = f.dir.join("back.parquet");
    write_coa_text(&back, &rows, None);
    let err = run_err(bin().arg("-i").arg(&back).arg("--tokenizer").arg(&f.tok).arg("-o").arg(&out));
    assert!(err.contains("row 1") && err.contains("end < start") && err.contains("observation_spans[0] = [10, 5)"), "{err}");
    assert!(!out.exists());

    // Training then failing leaves neither the tokens nor the tokenizer.
    let tok = f.dir.join("never/tokenizer.json");
    let err = run_err(bin().arg("-i").arg(&back).args(["--train-bpe", "--vocab-size", "400", "--save-tokenizer"]).arg(&tok).arg("-o").arg(&out));
    assert!(err.contains("end < start"), "{err}");
    assert!(!out.exists() && !tok.exists());
    let leftovers: Vec<_> = std::fs::read_dir(f.dir.join("never")).map(|d| d.count()).into_iter().collect();
    assert!(leftovers.iter().all(|&c| c == 0), "temporary files left behind");

    // Flags: --pack needs --max-len; a tokenizer is required.
    run_err(bin().arg("-i").arg(&f.input).arg("--tokenizer").arg(&f.tok).arg("--pack"));
    let err = run_err(bin().arg("-i").arg(&f.input).arg("-o").arg(&out));
    assert!(err.contains("--tokenizer"), "{err}");
    let err = run_err(bin().arg("-i").arg(&f.input).arg("--tokenizer").arg(f.dir.join("nope.json")).arg("-o").arg(&out));
    assert!(err.contains("nope.json"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Tags as HF non-special added tokens; the HF tokenizer files; chat templates; growth pieces.

#[test]
fn tags_survive_skip_special_tokens_and_the_hf_config_says_so() {
    let v = trained(&corpus(), 600);
    let text = "<think>a</think><code>\nprint(1)\n</code><answer>\\boxed{7}</answer>";
    let mut ids = v.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    ids.push(v.eos.unwrap());
    // EOS is special and dropped; every tag is kept (verl and vLLM decode this way).
    assert_eq!(v.tokenizer.decode(&ids, true).unwrap(), text);
    assert_eq!(v.tokenizer.decode(&ids, false).unwrap(), format!("{text}<|endoftext|>"));

    let config: serde_json::Value = serde_json::from_str(&v.tokenizer_config_json().unwrap()).unwrap();
    assert_eq!(config["eos_token"], "<|endoftext|>");
    assert_eq!(config["pad_token"], "<|endoftext|>");
    assert!(config["chat_template"].as_str().unwrap().contains("Question: "));
    let decoder = config["added_tokens_decoder"].as_object().unwrap();
    assert_eq!(decoder.len(), 1 + tag_strings().len());
    for (t, id) in tag_strings().iter().zip(&v.tag_ids) {
        let e = &decoder[&id.to_string()];
        assert_eq!(e["content"], *t);
        assert_eq!(e["special"], false, "{t}");
        assert_eq!(e["normalized"], false, "{t}");
    }
    assert_eq!(decoder["0"]["special"], true);
}

#[test]
fn saved_tokenizer_files_reload_to_the_same_layout() {
    let v = trained(&corpus(), 600);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    v.save(&path).unwrap();
    assert!(dir.path().join(coa_tokenize::CONFIG_FILE).is_file());
    // The saved plain-layout template renders the same ids as the plain layout itself.
    let with_template = Vocab::load(&path, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"auto".parse().unwrap()).unwrap();
    let plain = Vocab::load(&path, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"none".parse().unwrap()).unwrap();
    assert!(with_template.chat.is_some() && plain.chat.is_none());
    assert_eq!(with_template.tag_ids, v.tag_ids);
    for row in corpus().iter().take(6) {
        let (s, e) = spans_of(row);
        let a = encode_row(&with_template, &row.1, &row.2, &s, &e).unwrap();
        let b = encode_row(&plain, &row.1, &row.2, &s, &e).unwrap();
        let c = encode_row(&v, &row.1, &row.2, &s, &e).unwrap();
        assert_eq!(a, b, "{}", row.0);
        assert_eq!(b, c, "{}", row.0);
    }
}

/// A ChatML tokenizer (SmolLM2 / Qwen style): `<|im_start|>`, `<|im_end|>` special, a template.
fn chatml_tokenizer(dir: &Path) -> PathBuf {
    use tokenizers::AddedToken;
    let base = trained(&corpus(), 600);
    let mut t = base.tokenizer.clone();
    t.add_special_tokens([AddedToken::from("<|im_start|>", true), AddedToken::from("<|im_end|>", true)]).unwrap();
    let path = dir.join("tokenizer.json");
    t.save(&path, false).unwrap();
    let template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let config = serde_json::json!({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "pad_token": "<|im_end|>", "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    path
}

#[test]
fn chat_template_layout_renders_turns_and_ends_the_assistant_turn() {
    let dir = tempfile::tempdir().unwrap();
    let path = chatml_tokenizer(dir.path());
    let v = Vocab::load(&path, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"auto".parse().unwrap()).unwrap();
    let im_end = v.tokenizer.token_to_id("<|im_end|>").unwrap();
    assert_eq!(v.eos, Some(im_end));
    assert!(v.bos.is_empty(), "the template writes its own markers");
    let row = &corpus()[1];
    let (s, e) = spans_of(row);
    let enc = encode_row(&v, &row.1, &row.2, &s, &e).unwrap();
    let (system, question) = coa_format::split_prompt(&row.1);
    let prefix = format!("<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", system.unwrap());
    let want_prefix = v.tokenizer.encode(prefix.as_str(), false).unwrap().get_ids().to_vec();
    assert_eq!(&enc.ids[..enc.prompt_len as usize], want_prefix.as_slice());
    assert!(enc.mask[..enc.prompt_len as usize].iter().all(|&m| m == 0));
    assert_eq!(*enc.ids.last().unwrap(), im_end);
    assert_eq!(*enc.mask.last().unwrap(), 1);
    // The whole row is the tokenizer's encoding of the joined string.
    let joined = encode_joined(&v, &row.1, &row.2).unwrap();
    assert_eq!(enc.ids, joined);
    // --chat-template none: the plain layout; a template file: that template.
    let none = Vocab::load(&path, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"none".parse().unwrap()).unwrap();
    assert!(none.chat.is_none());
    let file = dir.path().join("t.jinja");
    std::fs::write(&file, "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}").unwrap();
    let custom = Vocab::load(&path, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &coa_tokenize::TemplateChoice::File(file)).unwrap();
    let enc = encode_row(&custom, "Sys\n\nQuestion: Q?", "<answer>x</answer>", &[], &[]).unwrap();
    let prefix = custom.tokenizer.decode(&enc.ids[..enc.prompt_len as usize], false).unwrap();
    assert_eq!(prefix, "[system]Sys[user]Q?[assistant]");
    // The saved config keeps the template that was used.
    let config: serde_json::Value = serde_json::from_str(&v.tokenizer_config_json().unwrap()).unwrap();
    assert!(config["chat_template"].as_str().unwrap().starts_with("{% for message in messages %}"));
    assert_eq!(config["eos_token"], "<|im_end|>");
}

#[test]
fn base_pieces_split_a_tag_with_the_base_vocabulary() {
    let v = trained(&corpus(), 600);
    let think = v.tokenizer.token_to_id("<think>").unwrap();
    let pieces = v.base_pieces(think).unwrap().unwrap();
    assert!(pieces.len() >= 2, "{pieces:?}");
    assert!(pieces.iter().all(|&p| (p as usize) < v.base_size && !v.tag_ids.contains(&p)));
    let text: String = pieces.iter().map(|&p| v.tokenizer.decode(&[p], false).unwrap()).collect();
    assert_eq!(text, "<think>");
    // Different tags start from different pieces; a base token has none.
    let close = v.base_pieces(v.tokenizer.token_to_id("</think>").unwrap()).unwrap().unwrap();
    assert_ne!(pieces, close);
    assert_eq!(v.base_pieces(5).unwrap(), None);
}

#[test]
fn template_errors_name_the_template() {
    let dir = tempfile::tempdir().unwrap();
    let path = chatml_tokenizer(dir.path());
    let file = dir.path().join("bad.jinja");
    std::fs::write(&file, "{% for m in messages %}").unwrap();
    let e = Vocab::load(&path, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &coa_tokenize::TemplateChoice::File(file)).err().unwrap();
    assert!(format!("{e:#}").contains("chat template"), "{e:#}");
    let e = Vocab::load(&path, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &coa_tokenize::TemplateChoice::File(dir.path().join("nope.jinja"))).err().unwrap();
    assert!(format!("{e:#}").contains("nope.jinja"), "{e:#}");
}

#[test]
fn mask_retracted_masks_the_misstep_and_nothing_else() {
    let (f, _, _) = fixture();
    let buggy_out = "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n20\n[STDOUT:END]";
    let fixed_out = "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n21\n[STDOUT:END]";
    let steps = vec![
        Step::new(Tag::Plan, "compute it"),
        Step::new(Tag::Think, "Use code."),
        Step::tool(Tag::Code, "print(sum(range(1, 7)) - 1)", buggy_out),
        Step::new(Tag::Think, "Is 20 right?"),
        Step::new(Tag::Reflection, "information_conflict: Fair\ntool_effectiveness: Good\ntrajectory_monitoring: Fair\nOff by one. It must be fixed."),
        Step::new(Tag::Think, "Rewrite it."),
        Step::tool(Tag::Code, "print(sum(range(1, 7)))", fixed_out),
        Step::new(Tag::Reflection, "information_conflict: Good\ntool_effectiveness: Good\ntrajectory_monitoring: Good"),
        Step::new(Tag::Answer, "\\boxed{21}"),
    ];
    let mut rows = f.rows[..6].to_vec();
    rows.insert(2, rendered_row("math-retracted", "Solve.\n\nQuestion: 1 + ... + 6?", &steps));
    let input = f.dir.join("retracted.parquet");
    write_coa_text(&input, &rows, None);
    let (plain, masked) = (f.dir.join("plain.parquet"), f.dir.join("masked.parquet"));
    run_ok(bin().arg("-i").arg(&input).arg("--tokenizer").arg(&f.tok).arg("-o").arg(&plain));
    let s = run_ok(bin().arg("-i").arg(&input).arg("--tokenizer").arg(&f.tok).arg("--mask-retracted").arg("-o").arg(&masked));
    let (plain, masked) = (read_tokens(&plain), read_tokens(&masked));
    assert_eq!(plain.len(), rows.len());
    let v = Vocab::load(&f.tok, &"auto".parse().unwrap(), &"auto".parse().unwrap(), &"auto".parse().unwrap()).unwrap();
    for (i, (p, m)) in plain.iter().zip(&masked).enumerate() {
        assert_eq!(p.ids, m.ids, "row {i}: the tokens do not change");
        if i != 2 {
            assert_eq!(p.mask, m.mask, "row {i} has no retracted step");
            continue;
        }
        // The untrained tokens are exactly the first think and the buggy call; the reflection
        // that retracts it and the fix stay targets.
        let untrained: Vec<u32> = p.ids.iter().zip(p.mask.iter().zip(&m.mask)).filter(|(_, (&a, &b))| a == 1 && b == 0).map(|(&id, _)| id as u32).collect();
        assert_eq!(v.tokenizer.decode(&untrained, false).unwrap(), "<think>Use code.</think>\n<code>\n```py\nprint(sum(range(1, 7)) - 1)\n```\n</code>");
        assert!(p.mask.iter().zip(&m.mask).all(|(&a, &b)| b <= a), "only targets become untrained");
        assert_eq!(s["retracted_steps"], 1);
        assert_eq!(s["retracted_tokens"], untrained.len());
        assert_eq!((p.n_targets - m.n_targets) as usize, untrained.len());
    }

    // Text that is not CoA is an error under the flag (naming the row), not without it.
    let mut bad = f.rows[..3].to_vec();
    bad[1].2 = "just words, no tags".to_string();
    bad[1].3.clear();
    let bad_in = f.dir.join("not_coa.parquet");
    write_coa_text(&bad_in, &bad, None);
    let out = f.dir.join("not_coa_out.parquet");
    let err = run_err(bin().arg("-i").arg(&bad_in).arg("--tokenizer").arg(&f.tok).arg("--mask-retracted").arg("-o").arg(&out));
    assert!(err.contains("row 1") && err.contains(&bad[1].0) && err.contains("--mask-retracted"), "{err}");
    assert!(!out.exists());
    run_ok(bin().arg("-i").arg(&bad_in).arg("--tokenizer").arg(&f.tok).arg("-o").arg(&out));
}

#[test]
fn an_untrained_span_overlapping_an_observation_is_an_error() {
    let v = Vocab::train(["Q", "x"].into_iter(), 1 + tag_strings().len() + 256, 2).unwrap();
    let text = "<code>x</code>\n<observation>ok</observation>";
    let obs = text.find("<observation>").unwrap();
    let err = coa_tokenize::encode_row_untrained(&v, "Q", text, &[obs as i32], &[text.len() as i32], &[coa_format::Span { start: 0, end: obs + 3 }]).unwrap_err();
    assert!(err.contains("overlaps") && err.contains("observation span"), "{err}");
}

/// A SentencePiece GGUF vocabulary (Metaspace pre-tokenizer: ▁ before the text's first piece
/// only) encodes as the tokenizer itself does around added tokens: the cached per-piece path
/// would put ▁ after every one of them.
#[test]
fn sentencepiece_gguf_encodes_as_its_tokenizer_around_added_tokens() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/fixtures/gguf/tiny_llama_spm.gguf");
    let auto = coa_tokenize::SpecialChoice::Auto;
    let v = Vocab::load(&path, &auto, &auto, &coa_tokenize::TemplateChoice::Auto).unwrap();
    for text in ["<think>reasoning here</think> the answer", "a<think>b", "Hello world", "<code>x = 1</code>\n"] {
        let mut ids = Vec::new();
        v.encode_into(text, &mut ids).unwrap();
        assert_eq!(ids, v.tokenizer.encode_fast(text, false).unwrap().get_ids(), "{text:?}");
    }
}
