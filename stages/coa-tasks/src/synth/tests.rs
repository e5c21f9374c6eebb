//! Behavioural tests of the synthetic suites: determinism, shapes, multihop chains against the
//! corpus, split disjointness, and solutions executed by python3.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::process::{Command, Stdio};

use coa_schemas::rows::{CorpusPage, Task};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use super::code::CodeSolution;
use super::math::MathSolution;
use super::multihop::{url_for, MultihopSolution};
use super::*;

fn json(g: &Generated) -> String {
    serde_json::to_string(&(&g.tasks, &g.corpus)).unwrap()
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(|w| w.to_lowercase())
}

// ---- python harness ---------------------------------------------------------------------------

const HARNESS: &str = r#"
import sys, json, io, contextlib, signal
def _alarm(signum, frame):
    raise TimeoutError("time limit")
signal.signal(signal.SIGALRM, _alarm)
out = []
for src in json.load(sys.stdin):
    buf = io.StringIO()
    ok, err = True, ""
    try:
        signal.alarm(10)
        with contextlib.redirect_stdout(buf):
            exec(compile(src, "<task>", "exec"), {"__name__": "__main__"})
    except BaseException as e:
        ok, err = False, repr(e)
    finally:
        signal.alarm(0)
    out.append({"ok": ok, "stdout": buf.getvalue(), "err": err})
json.dump(out, sys.stdout)
"#;

#[derive(Deserialize, Debug)]
struct PyRun {
    ok: bool,
    stdout: String,
    err: String,
}

/// Runs each program in a fresh namespace of one python3 process (stdout captured, 10 s alarm).
fn run_python(programs: &[String]) -> Vec<PyRun> {
    let mut child = Command::new("python3")
        .args(["-c", HARNESS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 is needed by the coa-tasks tests (solutions are verified by running them)");
    let input = serde_json::to_vec(programs).unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&input).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python harness failed");
    let runs: Vec<PyRun> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs.len(), programs.len());
    runs
}

// ---- common -----------------------------------------------------------------------------------

#[test]
fn suite_and_split_parse_and_print() {
    for s in Suite::SYNTHESISED {
        assert_eq!(parse_synthesised(&s.to_string()).unwrap(), s);
    }
    assert_eq!(parse_synthesised("multihop").unwrap(), Suite::Multihop);
    assert_eq!(parse_synthesised("Math").unwrap(), Suite::Math);
    assert!(parse_synthesised("qa").is_err());
    assert!(generate(Suite::Qa, 1, 1, Split::Train).is_err());
    for s in [Split::Train, Split::Test] {
        assert_eq!(s.to_string().parse::<Split>().unwrap(), s);
    }
    assert!("dev".parse::<Split>().is_err());
    assert_eq!(task_id(Suite::Multihop, Split::Train, 42), "multihop-train-000042");
}

#[test]
fn number_tokens_are_read_as_documented() {
    assert_eq!(number_tokens("$1500.25 at 4.5%. Year 2024, x3b12 and 7."), vec!["1500.25", "4.5", "2024", "3", "12", "7"]);
    assert!(number_tokens("no digits here").is_empty());
}

#[test]
fn same_arguments_give_identical_output_and_seeds_matter() {
    for (suite, n) in [(Suite::Multihop, 300), (Suite::Math, 300), (Suite::Code, 300)] {
        let a = json(&generate(suite, n, 42, Split::Train).unwrap());
        let b = json(&generate(suite, n, 42, Split::Train).unwrap());
        assert_eq!(a, b, "{suite} is not deterministic");
        let c = json(&generate(suite, n, 43, Split::Train).unwrap());
        assert_ne!(a, c, "{suite}: the seed changes nothing");
        let d = json(&generate(suite, n, 42, Split::Test).unwrap());
        assert_ne!(a, d, "{suite}: train and test are the same");
    }
}

fn check_rows(g: &Generated, suite: Suite, split: Split, n: usize) {
    assert_eq!(g.tasks.len(), n);
    let mut questions = HashSet::new();
    for (i, t) in g.tasks.iter().enumerate() {
        assert_eq!(t.task_id, format!("{suite}-{split}-{i:06}"));
        assert_eq!(t.suite, suite.as_str());
        assert_eq!(t.split, split.as_str());
        assert_eq!(t.source, "synthetic");
        assert_eq!(t.tools, suite.tools());
        assert!(t.system_prompt.is_none() && t.extra.is_none() && t.stdio_tests.is_empty());
        assert!(["easy", "medium", "hard"].contains(&t.difficulty.as_deref().unwrap()));
        assert!(t.solution.is_some());
        assert!(!t.question.is_empty());
        assert!(questions.insert(t.question.clone()), "duplicate question {}", t.question);
    }
}

#[test]
fn rows_have_the_documented_shape() {
    for split in [Split::Train, Split::Test] {
        for suite in Suite::SYNTHESISED {
            let g = generate(suite, 250, 7, split).unwrap();
            check_rows(&g, suite, split, 250);
            match suite {
                Suite::Multihop => {
                    assert!(!g.corpus.is_empty());
                    for t in &g.tasks {
                        assert!(t.entry_point.is_none() && t.test_code.is_none());
                        assert!(!t.answers.is_empty());
                    }
                }
                Suite::Math => {
                    assert!(g.corpus.is_empty());
                    for t in &g.tasks {
                        assert_eq!(t.answers.len(), 1);
                        let a = &t.answers[0];
                        let is_int = a.chars().all(|c| c.is_ascii_digit());
                        let is_dec = a.split_once('.').is_some_and(|(i, f)| {
                            !i.is_empty() && i.chars().all(|c| c.is_ascii_digit()) && f.len() == 2 && f.chars().all(|c| c.is_ascii_digit())
                        });
                        assert!(is_int || is_dec, "answer {a}");
                        if is_dec {
                            assert!(t.question.contains("nearest cent") || t.question.contains("two decimal places"), "{}", t.question);
                        }
                        assert!(t.hops.is_none());
                    }
                }
                Suite::Code => {
                    assert!(g.corpus.is_empty());
                    for t in &g.tasks {
                        assert!(t.answers.is_empty());
                        let ep = t.entry_point.as_deref().unwrap();
                        assert!(t.question.contains(&format!("`{ep}(")), "{}", t.question);
                        let tc = t.test_code.as_deref().unwrap();
                        assert!(tc.starts_with("def check(candidate):\n"));
                        assert!(tc.trim_end().ends_with(&format!("check({ep})")));
                        let sol: CodeSolution = serde_json::from_str(t.solution.as_deref().unwrap()).unwrap();
                        assert!(sol.code.contains(&format!("def {ep}(")) && sol.buggy_code.contains(&format!("def {ep}(")));
                        assert_ne!(sol.code, sol.buggy_code);
                    }
                }
                Suite::Qa => unreachable!("qa is not synthesised"),
            }
        }
    }
}

#[test]
fn small_n_works() {
    for suite in Suite::SYNTHESISED {
        for n in [0, 1, 5] {
            let g = generate(suite, n, 3, Split::Test).unwrap();
            assert_eq!(g.tasks.len(), n);
        }
    }
}

// ---- multihop ---------------------------------------------------------------------------------

/// Checks every task's chain against the corpus. Returns the hop-count histogram.
fn verify_multihop(g: &Generated) -> BTreeMap<i32, usize> {
    let by_url: HashMap<&str, &CorpusPage> = g.corpus.iter().map(|p| (p.url.as_str(), p)).collect();
    assert_eq!(by_url.len(), g.corpus.len(), "duplicate urls");
    let titles: HashSet<&str> = g.corpus.iter().map(|p| p.title.as_str()).collect();
    assert_eq!(titles.len(), g.corpus.len(), "duplicate titles");
    for p in &g.corpus {
        assert_eq!(p.url, url_for(&p.title));
        assert!(p.kind == "entity" || p.kind == "distractor");
        assert!(p.text.len() > 40 && p.text.ends_with('.'), "{}: {}", p.title, p.text);
    }
    let mut hist = BTreeMap::new();
    for t in &g.tasks {
        let sol: MultihopSolution = serde_json::from_str(t.solution.as_deref().unwrap()).unwrap();
        let h = t.hops.unwrap();
        assert!((2..=5).contains(&h), "{h} hops");
        assert_eq!(sol.hops.len(), h as usize);
        *hist.entry(h).or_insert(0) += 1;
        let want = match h {
            2 => "easy",
            3 => "medium",
            _ => "hard",
        };
        assert_eq!(t.difficulty.as_deref(), Some(want));
        assert!(t.question.contains(&sol.hops[0].subject), "{} / {}", t.question, sol.hops[0].subject);
        assert!(t.question.ends_with('?') || t.question.ends_with('.'));
        let mut seen = HashSet::new();
        for (k, hop) in sol.hops.iter().enumerate() {
            let page = by_url.get(hop.url.as_str()).unwrap_or_else(|| panic!("no page {}", hop.url));
            assert_eq!(page.kind, "entity");
            assert_eq!(page.title, hop.subject);
            assert!(page.text.contains(&hop.evidence), "evidence `{}` not on {}", hop.evidence, hop.url);
            assert!(hop.evidence.contains(&hop.entity), "evidence `{}` lacks {}", hop.evidence, hop.entity);
            assert!(hop.query.starts_with(&hop.subject));
            assert!(seen.insert(hop.subject.clone()), "chain revisits {}", hop.subject);
            if k + 1 < sol.hops.len() {
                assert_eq!(sol.hops[k + 1].subject, hop.entity);
            }
            for d in &hop.distractors {
                assert_eq!(by_url.get(d.as_str()).unwrap().kind, "distractor");
            }
            // the hop's answer has a page of its own
            assert!(titles.contains(hop.entity.as_str()), "no page for {}", hop.entity);
        }
        let last = sol.hops.last().unwrap();
        assert_eq!(last.entity, sol.answer);
        assert_eq!(t.answers[0], sol.answer);
        assert!(!seen.contains(&sol.answer), "answer is an earlier subject");
        assert!(!t.question.contains(&sol.answer), "question gives the answer away: {}", t.question);
        // every alias is stated on the answer's page
        let ans_page = by_url[url_for(&sol.answer).as_str()];
        for a in &t.answers {
            assert!(ans_page.text.contains(a.as_str()) || ans_page.title == *a, "alias {a} not on its page");
        }
    }
    hist
}

#[test]
fn multihop_chains_lead_to_the_answer_through_real_evidence() {
    for (n, seed, split) in [(1000, 1, Split::Train), (400, 2, Split::Test), (60, 3, Split::Train)] {
        let g = generate(Suite::Multihop, n, seed, split).unwrap();
        let hist = verify_multihop(&g);
        assert_eq!(hist.keys().copied().collect::<Vec<_>>(), vec![2, 3, 4, 5], "{hist:?}");
        if n >= 400 {
            for (&h, &c) in &hist {
                assert!(c >= n / 10, "only {c} tasks with {h} hops");
            }
            let kinds: HashSet<&str> = g.corpus.iter().map(|p| p.kind.as_str()).collect();
            assert_eq!(kinds.len(), 2);
            let distractors = g.corpus.iter().filter(|p| p.kind == "distractor").count();
            assert!(distractors * 10 >= g.corpus.len(), "{distractors} distractors of {}", g.corpus.len());
            // varied: many different start subjects, answers and relations
            let sols: Vec<MultihopSolution> = g.tasks.iter().map(|t| serde_json::from_str(t.solution.as_deref().unwrap()).unwrap()).collect();
            let starts: HashSet<&str> = sols.iter().map(|s| s.hops[0].subject.as_str()).collect();
            let answers: HashSet<&str> = sols.iter().map(|s| s.answer.as_str()).collect();
            let rels: HashSet<&str> = sols.iter().flat_map(|s| s.hops.iter().map(|h| h.relation.as_str())).collect();
            assert!(starts.len() * 2 >= n, "{} distinct starts", starts.len());
            assert!(answers.len() * 5 >= n, "{} distinct answers", answers.len());
            assert_eq!(rels.len(), 13, "{rels:?}");
        }
    }
}

/// A plain BM25 (k1 = 1.2, b = 0.75) over title + text, for checking the corpus's difficulty.
struct Bm25 {
    docs: Vec<HashMap<String, f64>>,
    lens: Vec<f64>,
    df: HashMap<String, f64>,
    avg: f64,
}

impl Bm25 {
    fn new(corpus: &[CorpusPage]) -> Bm25 {
        let mut docs = Vec::new();
        let mut lens = Vec::new();
        let mut df: HashMap<String, f64> = HashMap::new();
        for p in corpus {
            let mut tf: HashMap<String, f64> = HashMap::new();
            let mut len = 0.0;
            for w in words(&p.title).chain(words(&p.text)) {
                *tf.entry(w).or_default() += 1.0;
                len += 1.0;
            }
            for w in tf.keys() {
                *df.entry(w.clone()).or_default() += 1.0;
            }
            docs.push(tf);
            lens.push(len);
        }
        let avg = lens.iter().sum::<f64>() / lens.len() as f64;
        Bm25 { docs, lens, df, avg }
    }

    /// Indices of the top `k` documents.
    fn top(&self, query: &str, k: usize) -> Vec<usize> {
        let n = self.docs.len() as f64;
        let q: Vec<String> = words(query).collect();
        let mut scores: Vec<(f64, usize)> = (0..self.docs.len())
            .map(|d| {
                let mut s = 0.0;
                for w in &q {
                    let Some(&f) = self.docs[d].get(w) else { continue };
                    let df = self.df[w];
                    let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
                    s += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * self.lens[d] / self.avg));
                }
                (s, d)
            })
            .collect();
        scores.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
        scores.into_iter().take(k).map(|(_, d)| d).collect()
    }
}

#[test]
fn search_queries_find_their_pages_but_distractors_sometimes_win() {
    let g = generate(Suite::Multihop, 500, 11, Split::Train).unwrap();
    let bm = Bm25::new(&g.corpus);
    let (mut hops, mut top1, mut top5, mut distractor_first) = (0, 0, 0, 0);
    for t in &g.tasks {
        let sol: MultihopSolution = serde_json::from_str(t.solution.as_deref().unwrap()).unwrap();
        for hop in &sol.hops {
            hops += 1;
            let top = bm.top(&hop.query, 5);
            let urls: Vec<&str> = top.iter().map(|&d| g.corpus[d].url.as_str()).collect();
            if urls[0] == hop.url {
                top1 += 1;
            } else if g.corpus[top[0]].kind == "distractor" {
                distractor_first += 1;
            }
            if urls.contains(&hop.url.as_str()) {
                top5 += 1;
            }
        }
    }
    let (top1, top5, dfirst) = (top1 as f64 / hops as f64, top5 as f64 / hops as f64, distractor_first as f64 / hops as f64);
    eprintln!("hops {hops}: top1 {top1:.3} top5 {top5:.3} distractor first {dfirst:.3}");
    assert!(top5 >= 0.9, "good queries should find their page in the top 5 ({top5})");
    assert!(top1 < 0.99, "distractors never outrank the right page ({top1})");
    assert!(dfirst >= 0.02, "distractor pages rarely rank first ({dfirst})");
}

// ---- held-out split ---------------------------------------------------------------------------

#[test]
fn multihop_test_names_never_appear_in_train() {
    for (train_seed, test_seed) in [(1u64, 1u64), (2, 77), (123456789, 5)] {
        let tr = generate(Suite::Multihop, 300, train_seed, Split::Train).unwrap();
        let te = generate(Suite::Multihop, 300, test_seed, Split::Test).unwrap();
        for (a, b) in [(&tr, &te), (&te, &tr)] {
            // every word anywhere in split A (questions, answers, titles, page texts)
            let mut vocab: HashSet<String> = HashSet::new();
            for t in &a.tasks {
                vocab.extend(words(&t.question));
                t.answers.iter().for_each(|x| vocab.extend(words(x)));
            }
            for p in &a.corpus {
                vocab.extend(words(&p.title));
                vocab.extend(words(&p.text));
            }
            // each name of split B (page titles, answers and aliases) has a word that A never uses,
            // so it cannot occur in A's questions, answers, titles or texts
            let names = b.corpus.iter().map(|p| p.title.clone()).chain(b.tasks.iter().flat_map(|t| t.answers.clone()));
            let mut checked = 0;
            for name in names {
                assert!(words(&name).any(|w| !vocab.contains(&w)), "`{name}` occurs in the other split");
                checked += 1;
            }
            assert!(checked > 300);
        }
    }
}

#[test]
fn math_and_code_test_numbers_never_appear_in_train_questions() {
    let mut train_numbers: HashSet<String> = HashSet::new();
    for seed in [1u64, 2, 3] {
        for suite in [Suite::Math, Suite::Code] {
            for t in generate(suite, 300, seed, Split::Train).unwrap().tasks {
                for tok in number_tokens(&t.question) {
                    assert_eq!(split_of_token(tok), Split::Train);
                    train_numbers.insert(tok.to_string());
                }
            }
        }
    }
    assert!(train_numbers.len() > 300, "{} train numbers", train_numbers.len());
    let mut test_numbers = 0;
    for seed in [1u64, 4, 99] {
        for suite in [Suite::Math, Suite::Code] {
            for t in generate(suite, 300, seed, Split::Test).unwrap().tasks {
                for tok in number_tokens(&t.question) {
                    assert!(!train_numbers.contains(tok), "test number {tok} appears in train: {}", t.question);
                    test_numbers += 1;
                }
            }
        }
    }
    assert!(test_numbers > 1000);
}

#[test]
fn every_template_draws_in_both_splits() {
    for split in [Split::Train, Split::Test] {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for t in 0..math::N_TEMPLATES {
            let ok = (0..200).filter_map(|_| math::template_for_test(&mut rng, split, t)).filter(|(q, _)| numbers_in_split(q, split)).count();
            assert!(ok >= 20, "math template {t} rarely draws in {split}: {ok}/200");
        }
        for t in 0..code::N_TEMPLATES {
            let ok = (0..200).filter_map(|_| code::template_for_test(&mut rng, split, t)).filter(|x| numbers_in_split(&x.0, split)).count();
            assert!(ok >= 5, "code template {t} rarely draws in {split}: {ok}/200");
        }
    }
}

// ---- solutions run in python3 -----------------------------------------------------------------

#[test]
fn math_solutions_print_the_answer_and_buggy_ones_do_not() {
    let mut tasks: Vec<Task> = generate(Suite::Math, 150, 21, Split::Train).unwrap().tasks;
    tasks.extend(generate(Suite::Math, 100, 22, Split::Test).unwrap().tasks);
    let sols: Vec<MathSolution> = tasks.iter().map(|t| serde_json::from_str(t.solution.as_deref().unwrap()).unwrap()).collect();
    let mut programs = Vec::new();
    for s in &sols {
        programs.push(s.code.clone());
        programs.push(s.buggy_code.clone());
    }
    let runs = run_python(&programs);
    for (i, (t, s)) in tasks.iter().zip(&sols).enumerate() {
        let (good, bad) = (&runs[2 * i], &runs[2 * i + 1]);
        assert!(good.ok, "{}: {}", t.task_id, good.err);
        assert_eq!(good.stdout.trim(), t.answers[0], "{}\n{}", t.question, s.code);
        assert_eq!(s.answer, t.answers[0]);
        assert!(bad.ok, "{}: {}", t.task_id, bad.err);
        assert_eq!(bad.stdout.trim(), s.buggy_answer, "{}", s.buggy_code);
        assert_ne!(bad.stdout.trim(), t.answers[0]);
    }
}

#[test]
fn code_references_pass_their_tests_and_buggy_versions_fail() {
    // a generated sample from both splits, plus several draws of every template in both splits
    let mut cases: Vec<(String, String, String, String)> = Vec::new();
    for (seed, split) in [(31u64, Split::Train), (32, Split::Test)] {
        for t in generate(Suite::Code, 120, seed, split).unwrap().tasks {
            let sol: CodeSolution = serde_json::from_str(t.solution.as_deref().unwrap()).unwrap();
            cases.push((t.task_id.clone(), sol.code, sol.buggy_code, t.test_code.unwrap()));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for tpl in 0..code::N_TEMPLATES {
            let mut drawn = 0;
            while drawn < 4 {
                if let Some((_, r, b, tc)) = code::template_for_test(&mut rng, split, tpl) {
                    cases.push((format!("template {tpl}"), r, b, tc));
                    drawn += 1;
                }
            }
        }
    }
    let mut programs = Vec::new();
    for (_, r, b, tc) in &cases {
        programs.push(format!("{r}\n{tc}"));
        programs.push(format!("{b}\n{tc}"));
    }
    let runs = run_python(&programs);
    for (i, (id, r, b, tc)) in cases.iter().enumerate() {
        assert!(runs[2 * i].ok, "{id}: reference fails: {}\n{r}\n{tc}", runs[2 * i].err);
        assert!(!runs[2 * i + 1].ok, "{id}: buggy code passes\n{b}\n{tc}");
    }
}

// ---- speed ------------------------------------------------------------------------------------

#[test]
fn generating_1000_multihop_tasks_is_fast() {
    let t0 = std::time::Instant::now();
    let g = generate(Suite::Multihop, 1000, 9, Split::Train).unwrap();
    let dt = t0.elapsed();
    eprintln!("multihop n=1000: {} pages in {:?}", g.corpus.len(), dt);
    // the crate is built at opt-level 3 even in dev; well under a second in release
    assert!(dt.as_secs_f64() < 3.0, "{dt:?}");
}

/// Many seeds and sizes, and every solution of 2000 math and 2000 code tasks run in python3
/// (about 10 s).
#[test]
fn stress_many_seeds_and_all_solutions() {
    for seed in 0..40u64 {
        for split in [Split::Train, Split::Test] {
            let n = [1, 10, 100, 300, 1000][seed as usize % 5];
            let g = generate(Suite::Multihop, n, seed, split).unwrap();
            verify_multihop(&g);
            for suite in [Suite::Math, Suite::Code] {
                for t in generate(suite, 300, seed, split).unwrap().tasks {
                    assert!(numbers_in_split(&t.question, split));
                }
            }
        }
    }
    let mut progs = Vec::new();
    let mut expect = Vec::new();
    for split in [Split::Train, Split::Test] {
        for t in generate(Suite::Math, 1000, 77, split).unwrap().tasks {
            let s: MathSolution = serde_json::from_str(t.solution.as_deref().unwrap()).unwrap();
            progs.push(s.code.clone()); expect.push((true, t.answers[0].clone()));
            progs.push(s.buggy_code.clone()); expect.push((true, s.buggy_answer.clone()));
        }
        for t in generate(Suite::Code, 1000, 78, split).unwrap().tasks {
            let s: CodeSolution = serde_json::from_str(t.solution.as_deref().unwrap()).unwrap();
            let tc = t.test_code.clone().unwrap();
            progs.push(format!("{}\n{tc}", s.code)); expect.push((true, String::new()));
            progs.push(format!("{}\n{tc}", s.buggy_code)); expect.push((false, String::new()));
        }
    }
    let runs = run_python(&progs);
    for (i, (r, (ok, out))) in runs.iter().zip(&expect).enumerate() {
        assert_eq!(r.ok, *ok, "{}\n{}", progs[i], r.err);
        if *ok && !out.is_empty() { assert_eq!(r.stdout.trim(), out, "{}", progs[i]); }
    }
}

#[test]
fn suite_flags_name_the_synthesised_suites_only() {
    assert_eq!(parse_synthesised(" Math ").unwrap(), Suite::Math);
    assert_eq!(parse_synthesised("multihop").unwrap(), Suite::Multihop);
    let e = parse_synthesised("qa").unwrap_err().to_string();
    assert_eq!(e, "unknown suite `qa` (expected multihop, math or code)");
    assert!(parse_synthesised("web").is_err());
}
