//! The rollout loop on a scripted policy (fixed token sequences, so the tool / observation / mask /
//! budget / turn logic is checked exactly) and on a tiny random model (determinism).

use std::sync::Mutex;

use coa_agents::ToolConfig;
use coa_format::{render, Step, Tag};
use coa_model::{Model, ModelConfig};
use coa_tokenize::{encode_row, Vocab};
use coa_tools::crawl::Goal;

use super::*;

fn vocab() -> Vocab {
    let texts = [
        "<think>go</think>\n<web_search>capital of France</web_search>\n<observation>Found 1 results:\n1. [Paris](https://x)</observation>",
        "<think>ok</think>\n<answer>Paris</answer> the quick brown fox jumps over the lazy dog 0123456789",
        "<code>\n```py\nprint(6*7)\n```\n</code> Question: what is 6 times 7? You are one model playing a whole team",
    ];
    Vocab::train(texts.iter().copied(), 400, 1).unwrap()
}

fn enc(v: &Vocab, s: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    v.encode_into(s, &mut ids).unwrap();
    ids
}

/// Emits `script[k]` at its k-th forward on a slot (then EOS), as a logit of 10 over zeros, and
/// records every token it is fed.
struct Scripted {
    script: Vec<u32>,
    eos: u32,
    v: usize,
    cursor: Vec<usize>,
    fed: Vec<Vec<u32>>,
}

impl Scripted {
    fn new(script: Vec<u32>, eos: u32, v: usize, slots: usize) -> Self {
        Scripted { script, eos, v, cursor: vec![0; slots], fed: vec![Vec::new(); slots] }
    }
}

impl Policy for Scripted {
    fn vocab_size(&self) -> usize {
        self.v
    }
    fn n_slots(&self) -> usize {
        self.cursor.len()
    }
    fn reset(&mut self, slot: usize) {
        self.cursor[slot] = 0;
        self.fed[slot].clear();
    }
    fn extend(&mut self, items: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        let mut out = vec![0f32; items.len() * self.v];
        for (i, &(slot, ids)) in items.iter().enumerate() {
            self.fed[slot].extend_from_slice(ids);
            let tok = self.script.get(self.cursor[slot]).copied().unwrap_or(self.eos);
            self.cursor[slot] += 1;
            out[i * self.v + tok as usize] = 10.0;
        }
        Ok(out)
    }
}

/// Answers every call with a fixed text naming the tool and its input, and records the calls
/// and the goals they were given.
struct Echo {
    calls: Mutex<Vec<(Tag, String)>>,
    goals: Mutex<Vec<Goal>>,
}

impl Echo {
    fn new() -> Self {
        Echo { calls: Mutex::new(Vec::new()), goals: Mutex::new(Vec::new()) }
    }
}

impl Environment for Echo {
    fn observe(&self, tool: Tag, input: &str, goal: &Goal) -> Result<String> {
        self.calls.lock().unwrap().push((tool, input.to_string()));
        self.goals.lock().unwrap().push(goal.clone());
        Ok(format!("Found 1 results:\n1. [{}]({input})", tool.name()))
    }
}

/// Top-p 0.5 keeps only the scripted token (p ≈ 0.98), so sampling follows the script exactly
/// while its log-prob stays a real, non-zero number.
fn cfg(budget: usize, turns: usize) -> SampleConfig {
    SampleConfig { temperature: 1.0, top_p: 0.5, max_response_tokens: budget, max_turns: turns, max_observation_tokens: None }
}

fn run_scripted(v: &Vocab, script: &str, cfg: &SampleConfig, env: &dyn Environment) -> (Sample, Scripted, Vec<u32>) {
    let codec = Codec::new(v).unwrap();
    let prompt = codec.prompt_ids("multihop", "What is the capital of France?").unwrap();
    let mut p = Scripted::new(enc(v, script), v.eos.unwrap(), v.size(), 1);
    let mut out = Vec::new();
    let jobs = vec![Job { key: 0, prompt_ids: prompt.clone(), seed: 1 }];
    generate(&mut p, env, &codec, cfg, jobs, &mut |_, s| {
        out.push(s);
        Ok(true)
    })
    .unwrap();
    assert_eq!(out.len(), 1);
    (out.pop().unwrap(), p, prompt)
}

/// Token ranges of the observation blocks (from the `<observation>` id to the `</observation>` id).
fn observation_ranges(v: &Vocab, ids: &[u32]) -> Vec<(usize, usize)> {
    let open = v.tokenizer.token_to_id("<observation>").unwrap();
    let close = v.tokenizer.token_to_id("</observation>").unwrap();
    let mut out = Vec::new();
    let mut start = None;
    for (i, &t) in ids.iter().enumerate() {
        if t == open {
            start = Some(i);
        } else if t == close {
            out.push((start.unwrap(), i + 1));
        }
    }
    out
}

#[test]
fn the_observation_prefix_is_the_render_separator() {
    let r = render(&[Step::tool(Tag::WebSearch, "q", "obs")]).unwrap();
    assert_eq!(r.text, format!("<web_search>q</web_search>{OBSERVATION_PREFIX}<observation>obs</observation>"));
}

#[test]
fn a_tool_call_runs_and_its_observation_is_appended_as_tokens() {
    let v = vocab();
    let env = Echo::new();
    let turn1 = "<think>go</think>\n<web_search> capital of France </web_search>";
    let turn2 = "\n<think>ok</think>\n<answer>Paris</answer>";
    let (s, p, prompt) = run_scripted(&v, &format!("{turn1}{turn2} never reached"), &cfg(200, 8), &env);
    assert_eq!(s.finish_reason, "answer");
    assert_eq!((s.turns, s.tool_calls), (2, 1));
    assert_eq!(*env.calls.lock().unwrap(), vec![(Tag::WebSearch, "capital of France".to_string())]);
    let obs = "<observation>Found 1 results:\n1. [web_search](capital of France)</observation>";
    assert_eq!(s.response_text, format!("{turn1}\n{obs}{turn2}"));
    assert_eq!(s.prompt_ids, prompt);

    // Mask and log-prob are 0 exactly on the appended block ("\n<observation>…</observation>").
    let n = s.response_ids.len();
    assert_eq!((s.loss_mask.len(), s.logprobs.len()), (n, n));
    let ranges = observation_ranges(&v, &s.response_ids);
    assert_eq!(ranges.len(), 1);
    let (a, b) = (ranges[0].0 - 1, ranges[0].1); // the separator newline is the environment's
    assert_eq!(v.tokenizer.decode(&s.response_ids[a..a + 1], false).unwrap(), "\n");
    for i in 0..n {
        let obs = (a..b).contains(&i);
        assert_eq!(s.loss_mask[i], u8::from(!obs), "mask at {i}");
        if obs {
            assert_eq!(s.logprobs[i], 0.0, "logprob at {i}");
        } else {
            assert!(s.logprobs[i] < 0.0 && s.logprobs[i] > -0.1, "logprob at {i}: {}", s.logprobs[i]);
        }
    }

    // Token-in/token-out: the policy was fed exactly prompt + response (but the last token).
    let mut expect = prompt.clone();
    expect.extend_from_slice(&s.response_ids[..n - 1]);
    assert_eq!(p.fed[0], expect);

    // Same ids as the training layout of this text (coa-tokenize), EOS aside.
    let prompt_text = coa_format::build_prompt("multihop", "What is the capital of France?");
    let start = turn1.chars().count() + 1;
    let end = start + obs.chars().count();
    let row = encode_row(&v, &prompt_text, &s.response_text, &[start as i32], &[end as i32]).unwrap();
    let mut joined = prompt;
    joined.extend_from_slice(&s.response_ids);
    joined.push(v.eos.unwrap());
    assert_eq!(row.ids, joined);
}

#[test]
fn code_runs_in_the_real_sandbox() {
    let v = vocab();
    let config = ToolConfig::default();
    let env = ToolEnv { tools: Tools { corpus: None, config: &config } };
    let script = "<think>x</think>\n<code>\n```py\nprint(6*7)\n```\n</code>\n<think>y</think>\n<answer>\\boxed{42}</answer>";
    let (s, _, _) = run_scripted(&v, script, &cfg(300, 8), &env);
    assert_eq!((s.finish_reason, s.tool_calls), ("answer", 1));
    assert!(s.response_text.contains("<observation>[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n42\n[STDOUT:END]</observation>"), "{}", s.response_text);
    // a web tool without a corpus answers with an error observation instead of failing the run
    let (s, _, _) = run_scripted(&v, "<web_search>x</web_search>\n<answer>a</answer>", &cfg(300, 8), &env);
    assert!(s.response_text.contains("<observation>[ERROR] web_search is not available for this task.</observation>"), "{}", s.response_text);
}

#[test]
fn the_budget_counts_every_token_and_cuts_observations() {
    let v = vocab();
    let env = Echo::new();
    // plain text: stops at exactly the budget
    let (s, _, _) = run_scripted(&v, "the quick brown fox jumps over the lazy dog the quick brown fox", &cfg(7, 8), &env);
    assert_eq!((s.finish_reason, s.response_ids.len()), ("budget", 7));
    assert!(s.loss_mask.iter().all(|&m| m == 1));
    // an observation that does not fit is cut at the budget
    let call = enc(&v, "<web_search>capital of France</web_search>").len();
    let (s, _, _) = run_scripted(&v, "<web_search>capital of France</web_search>\n<answer>x</answer>", &cfg(call + 4, 8), &env);
    assert_eq!((s.finish_reason, s.response_ids.len(), s.tool_calls), ("budget", call + 4, 1));
    assert_eq!(&s.loss_mask[call..], &[0, 0, 0, 0]);
    assert_eq!(&s.logprobs[call..], &[0.0; 4]);
}

#[test]
fn max_turns_stops_before_running_the_next_tool() {
    let v = vocab();
    let env = Echo::new();
    let script = "<web_search>a</web_search><web_search>b</web_search><web_search>c</web_search>";
    let (s, _, _) = run_scripted(&v, script, &cfg(500, 2), &env);
    assert_eq!((s.finish_reason, s.turns, s.tool_calls), ("max_turns", 2, 1));
    assert_eq!(env.calls.lock().unwrap().len(), 1);
    assert_eq!(*s.response_ids.last().unwrap(), v.tokenizer.token_to_id("</web_search>").unwrap());
    assert!(s.response_text.ends_with("<web_search>b</web_search>"), "{}", s.response_text);
}

#[test]
fn eos_ends_a_sample_as_a_written_token() {
    let v = vocab();
    let (s, _, _) = run_scripted(&v, "<think>ok</think>", &cfg(100, 4), &Echo::new());
    assert_eq!(s.finish_reason, "eos");
    assert_eq!(*s.response_ids.last().unwrap(), v.eos.unwrap());
    assert_eq!(*s.loss_mask.last().unwrap(), 1);
}

#[test]
fn observations_are_cut_to_max_observation_tokens() {
    let v = vocab();
    let mut c = cfg(500, 4);
    c.max_observation_tokens = Some(3);
    let (s, _, _) = run_scripted(&v, "<web_search>capital of France</web_search>\n<answer>x</answer>", &c, &Echo::new());
    assert_eq!(s.finish_reason, "answer");
    let r = observation_ranges(&v, &s.response_ids);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1 - r[0].0, 3 + 2, "3 body tokens between the tags");
}

/// A crawl is summarized for AFM's goal: the response's last think (the crawl's own) and its
/// last web search; other tools get none.
#[test]
fn a_crawl_gets_the_last_think_and_search_as_its_goal() {
    let v = vocab();
    let env = Echo::new();
    let script = "<think>go</think>\n<web_search>capital of France</web_search>\n\
                  <think>read where Paris is</think>\n<crawl_page>https://w/Paris</crawl_page>\n<answer>x</answer>";
    let (s, _, _) = run_scripted(&v, script, &cfg(300, 8), &env);
    assert_eq!(s.tool_calls, 2);
    assert_eq!(env.calls.lock().unwrap()[1], (Tag::CrawlPage, "https://w/Paris".to_string()));
    assert_eq!(*env.goals.lock().unwrap(), vec![Goal::default(), Goal::new(Some("read where Paris is"), Some("capital of France"))]);
}

#[test]
fn a_tool_call_without_its_opening_tag_takes_the_turn_so_far() {
    let v = vocab();
    let env = Echo::new();
    let (s, _, _) = run_scripted(&v, "<think>go</think>\nParis fox</web_search>\n<answer>x</answer>", &cfg(200, 4), &env);
    assert_eq!(s.tool_calls, 1);
    let calls = env.calls.lock().unwrap();
    assert_eq!(calls[0], (Tag::WebSearch, "<think>go</think>\nParis fox".to_string()));
}

#[test]
fn sampling_follows_temperature_and_top_p() {
    let logits = [1.0f32, 3.0, 2.0, 3.0];
    let mut rng = Rng::new(5);
    // greedy: the first maximum, log-prob at T = 1
    let (t, lp) = sample_token(&logits, 0.0, 1.0, &mut rng).unwrap();
    let lse = logits.iter().map(|&z| (z as f64).exp()).sum::<f64>().ln();
    assert_eq!(t, 1);
    assert!((lp as f64 - (3.0 - lse)).abs() < 1e-6);
    // frequencies match softmax(z / T); the log-prob is under softmax(z / T)
    let temp = 2.0f32;
    let w: Vec<f64> = logits.iter().map(|&z| (z as f64 / temp as f64).exp()).collect();
    let sw: f64 = w.iter().sum();
    let mut counts = [0usize; 4];
    for _ in 0..20000 {
        let (t, lp) = sample_token(&logits, temp, 1.0, &mut rng).unwrap();
        counts[t as usize] += 1;
        assert!((lp as f64 - (w[t as usize] / sw).ln()).abs() < 1e-6);
    }
    for i in 0..4 {
        let f = counts[i] as f64 / 20000.0;
        assert!((f - w[i] / sw).abs() < 0.015, "token {i}: {f} vs {}", w[i] / sw);
    }
    // top-p: only the two tied best tokens (p = 0.33 each at T = 1) fit in 0.6
    let mut seen = [false; 4];
    for _ in 0..200 {
        seen[sample_token(&logits, 1.0, 0.6, &mut rng).unwrap().0 as usize] = true;
    }
    assert_eq!(seen, [false, true, false, true]);
    // same seed, same draws
    let draw = |seed| (0..50).map(|_| 0).scan(Rng::new(seed), |r, _: i32| Some(sample_token(&logits, 1.0, 1.0, r).unwrap().0)).collect::<Vec<_>>();
    assert_eq!(draw(9), draw(9));
    assert_ne!(draw(9), draw(10));
    assert!(sample_token(&[0.0, f32::NAN], 1.0, 1.0, &mut rng).unwrap_err().to_string().contains("non-finite"));
}

fn tiny_model(v: usize) -> Model {
    let mut c = ModelConfig::preset("tiny", v).unwrap();
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    let mut m = Model::init(c, 3).unwrap();
    // sharper than the init so samples are not uniform noise
    m.params.scale(4.0);
    m
}

fn run_model(m: &Model, v: &Vocab, batch: usize, threads: usize, seed: u64) -> Vec<Sample> {
    run_model_stats(m, v, batch, threads, seed, true).0
}

fn run_model_stats(m: &Model, v: &Vocab, batch: usize, threads: usize, seed: u64, reuse: bool) -> (Vec<Sample>, GenStats) {
    let codec = Codec::new(v).unwrap();
    let env = Echo::new();
    let questions = ["What is 6 times 7?", "Who wrote it?", "Where?"];
    let jobs: Vec<Job> = questions
        .iter()
        .enumerate()
        .flat_map(|(i, q)| {
            let p = codec.prompt_ids("multihop", q).unwrap();
            (0..3).map(move |k| Job { key: i * 3 + k, prompt_ids: p.clone(), seed: sample_seed(seed, q, k) })
        })
        .collect();
    let longest = jobs.iter().map(|j| j.prompt_ids.len()).max().unwrap();
    let c = SampleConfig { temperature: 1.0, top_p: 0.95, max_response_tokens: 40, max_turns: 4, max_observation_tokens: Some(8) };
    let mut out: Vec<Option<Sample>> = vec![None; jobs.len()];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let stats = pool.install(|| {
        let mut policy = ModelPolicy::new(m, batch, longest + 40).unwrap();
        if !reuse {
            policy = policy.without_prefix_reuse();
        }
        generate(&mut policy, &env, &codec, &c, jobs, &mut |k, s| {
            assert!(out[k].replace(s).is_none(), "sample {k} twice");
            Ok(true)
        })
        .unwrap()
    });
    (out.into_iter().map(|s| s.expect("every job finishes")).collect(), stats)
}

#[test]
fn the_model_loop_is_deterministic_by_seed_whatever_the_batch_and_threads() {
    let v = vocab();
    let m = tiny_model(v.size());
    let a = run_model(&m, &v, 4, 1, 7);
    let b = run_model(&m, &v, 9, 2, 7);
    let c = run_model(&m, &v, 1, 2, 7);
    assert_eq!(a, b);
    assert_eq!(a, c);
    let d = run_model(&m, &v, 4, 1, 8);
    assert_ne!(a, d, "another seed, other samples");
    for s in &a {
        assert!(s.response_ids.len() <= 40 && !s.finish_reason.is_empty());
        assert_eq!(s.loss_mask.len(), s.response_ids.len());
        for (i, (&mk, &lp)) in s.loss_mask.iter().zip(&s.logprobs).enumerate() {
            assert!(if mk == 0 { lp == 0.0 } else { lp <= 0.0 && lp.is_finite() }, "token {i}: mask {mk} logprob {lp}");
        }
    }
}

#[test]
fn narrow_decoding_weights_sample_as_the_rounded_model() {
    let v = vocab();
    let m = tiny_model(v.size());
    for dtype in [coa_model::DecodeDtype::Bf16, coa_model::DecodeDtype::Int8] {
        let narrow = m.clone();
        if let Err(e) = narrow.prepare_decoding_as(dtype) {
            eprintln!("narrow_decoding_weights_sample_as_the_rounded_model: skipped ({e:#})");
            return;
        }
        let mut rounded = m.clone();
        rounded.round_weights(dtype);
        let got = run_model(&narrow, &v, 4, 2, 7);
        assert_eq!(got, run_model(&rounded, &v, 4, 2, 7), "{dtype}: the samples and log-probs of the rounded model");
        let exact = run_model(&m, &v, 4, 2, 7);
        assert!(got.iter().zip(&exact).any(|(a, b)| a.logprobs != b.logprobs), "{dtype}: the rounding moves the log-probs");
    }
}

/// Four samples of one math prompt (seeds 0-3, temperature 1) by `m` at `batch`, its KV cache in
/// `kv`, with or without prefix reuse.
fn four_samples(m: &Model, v: &Vocab, batch: usize, reuse: bool, kv: coa_model::DecodeDtype) -> Vec<Option<Sample>> {
    let (codec, env) = (Codec::new(v).unwrap(), Echo::new());
    let p = codec.prompt_ids("math", "What is 6 times 7?").unwrap();
    let jobs = (0..4).map(|k| Job { key: k, prompt_ids: p.clone(), seed: k as u64 });
    let c = SampleConfig { temperature: 1.0, top_p: 0.95, max_response_tokens: 30, max_turns: 3, max_observation_tokens: Some(8) };
    let mut policy = ModelPolicy::with_cache(m, batch, p.len() + 30, kv).unwrap();
    if !reuse {
        policy = policy.without_prefix_reuse();
    }
    let mut out = vec![None; 4];
    generate(&mut policy, &env, &codec, &c, jobs, &mut |k, s| Ok(out[k].replace(s).is_none())).unwrap();
    out
}

#[test]
fn a_bf16_cache_samples_by_seed_whatever_the_batch() {
    // The rounding happens once, when a key or value is stored: the same samples at any batch
    // size and with or without reused prefixes, as with an f32 cache.
    let v = vocab();
    let m = tiny_model(v.size());
    let run = |batch, reuse| four_samples(&m, &v, batch, reuse, coa_model::DecodeDtype::Bf16);
    let a = run(1, false);
    assert!(a.iter().all(Option::is_some));
    assert_eq!(a, run(3, true));
    assert_eq!(a, run(4, false));
}

#[test]
fn bf16_matmul_samples_by_seed_whatever_the_batch() {
    // bf16 activations (AMX tiles where the CPU has them): a sequence's products do not depend on
    // the rows beside it, so the samples are the same at any batch size, with or without reuse.
    let v = vocab();
    let m = tiny_model(v.size());
    if let Err(e) = m.prepare_decoding_as(coa_model::DecodeDtype::Bf16Matmul) {
        eprintln!("bf16_matmul_samples_by_seed_whatever_the_batch: skipped ({e:#})");
        return;
    }
    let run = |batch, reuse| four_samples(&m, &v, batch, reuse, coa_model::DecodeDtype::F32);
    let a = run(1, false);
    assert!(a.iter().all(Option::is_some));
    assert_eq!(a, run(3, true));
    assert_eq!(a, run(4, false));
}

#[test]
fn reused_prompt_prefixes_sample_what_whole_prefills_sample() {
    let v = vocab();
    let m = tiny_model(v.size());
    // batch 9: every job at once (a prompt's later samples wait one forward for its first).
    for batch in [1, 4, 9] {
        let (whole, ws) = run_model_stats(&m, &v, batch, 2, 5, false);
        let (reused, rs) = run_model_stats(&m, &v, batch, 2, 5, true);
        assert_eq!(reused, whole, "batch {batch}");
        assert_eq!(ws.prompt_tokens_reused, 0);
        // Three tasks of three samples share the suite's instructions, a task's samples the whole
        // prompt: most prompt tokens come from kept prefixes, and are not fed.
        let prompts: u64 = whole.iter().map(|s| s.prompt_ids.len() as u64).sum();
        assert!(rs.prompt_tokens_reused * 2 > prompts, "batch {batch}: {} of {prompts} prompt tokens reused", rs.prompt_tokens_reused);
        assert_eq!(rs.tokens_fed + rs.prompt_tokens_reused, ws.tokens_fed, "batch {batch}");
    }
}

#[test]
fn a_run_starts_from_empty_slots_whatever_the_policy_held() {
    // A slot started and never fed (a run that failed mid-way) must not make this run's jobs wait
    // for a prefill that will never come.
    let v = vocab();
    let m = tiny_model(v.size());
    let codec = Codec::new(&v).unwrap();
    let p = codec.prompt_ids("math", "What is 6 times 7?").unwrap();
    let jobs = || (0..4).map(|k| Job { key: k, prompt_ids: p.clone(), seed: k as u64 });
    let c = SampleConfig { temperature: 1.0, top_p: 1.0, max_response_tokens: 12, max_turns: 2, max_observation_tokens: Some(8) };
    let run = |policy: &mut ModelPolicy| {
        let mut got = vec![None; 4];
        generate(policy, &Echo::new(), &codec, &c, jobs(), &mut |k, s| Ok(got[k].replace(s).is_none())).unwrap();
        got
    };
    let mut policy = ModelPolicy::new(&m, 2, p.len() + 12).unwrap();
    assert_eq!(policy.start(1, &p).unwrap(), Some(0));
    let got = run(&mut policy);
    assert!(got.iter().all(Option::is_some));
    assert_eq!(got, run(&mut ModelPolicy::new(&m, 2, p.len() + 12).unwrap().without_prefix_reuse()));
}

#[test]
fn a_stopped_run_drops_the_samples_in_flight() {
    let v = vocab();
    let codec = Codec::new(&v).unwrap();
    let prompt = codec.prompt_ids("math", "q").unwrap();
    let mut p = Scripted::new(enc(&v, "<answer>1</answer>"), v.eos.unwrap(), v.size(), 2);
    let jobs = (0..6).map(|k| Job { key: k, prompt_ids: prompt.clone(), seed: k as u64 });
    let mut got = Vec::new();
    generate(&mut p, &Echo::new(), &codec, &cfg(50, 4), jobs, &mut |k, _| {
        got.push(k);
        Ok(got.len() < 3)
    })
    .unwrap();
    assert_eq!(got, vec![0, 1, 2]);
}

#[test]
fn the_shards_shares_of_oversampled_groups_add_up_to_the_whole_count() {
    assert_eq!(groups_share(7, None), 7);
    for (total, n) in [(7, 3), (2, 4), (32, 8), (1, 1), (5, 64)] {
        let shares: Vec<usize> = (0..n).map(|i| groups_share(total, Some(ShardSpec { index: i, count: n }))).collect();
        assert_eq!(shares.iter().sum::<usize>(), total, "{total} over {n}: {shares:?}");
        assert!(shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1, "{shares:?}");
        assert!(shares.windows(2).all(|w| w[0] >= w[1]), "the first shards take the remainder: {shares:?}");
    }
}

/// `--plain`: the plain prompt, one turn to EOS, no tools; a tag the model favours is never
/// sampled (greedy falls to the best other token) and never starts a tool call.
#[test]
fn plain_answers_use_the_plain_prompt_never_sample_a_tag_and_call_no_tool() {
    let v = vocab();
    let codec = Codec::plain(&v);
    let prompt = codec.prompt_ids("math", "What is 6 times 7?").unwrap();
    let text = codec.decode(&prompt).unwrap();
    assert!(text.contains(coa_format::prompt::PLAIN_MATH_INSTRUCTION), "{text}");
    assert!(!text.contains("<plan>") && !text.contains("team of agents"), "{text}");
    assert_ne!(prompt, Codec::new(&v).unwrap().prompt_ids("math", "What is 6 times 7?").unwrap());

    let tags: Vec<u32> = Tag::ALL.iter().flat_map(|t| [t.open(), t.close()]).filter_map(|s| v.tokenizer.token_to_id(s)).collect();
    assert!(tags.len() >= 10, "the test vocabulary holds the CoA tags");
    let env = Echo::new();
    let greedy = SampleConfig { temperature: 0.0, top_p: 1.0, max_response_tokens: 12, max_turns: 16, max_observation_tokens: None };
    // Every tag scores 10, one ordinary token 5, the rest (EOS included) 0.
    struct LovesTags {
        tags: Vec<u32>,
        other: u32,
        v: usize,
    }
    impl Policy for LovesTags {
        fn vocab_size(&self) -> usize {
            self.v
        }
        fn n_slots(&self) -> usize {
            1
        }
        fn reset(&mut self, _: usize) {}
        fn extend(&mut self, items: &[(usize, &[u32])]) -> Result<Vec<f32>> {
            let mut z = vec![0f32; items.len() * self.v];
            for row in z.chunks_mut(self.v) {
                self.tags.iter().for_each(|&t| row[t as usize] = 10.0);
                row[self.other as usize] = 5.0;
            }
            Ok(z)
        }
    }
    let other = enc(&v, "fox")[0];
    let mut p = LovesTags { tags: tags.clone(), other, v: v.size() };
    let mut out = Vec::new();
    generate(&mut p, &env, &codec, &greedy, vec![Job { key: 0, prompt_ids: prompt.clone(), seed: 1 }], &mut |_, s| {
        out.push(s);
        Ok(true)
    })
    .unwrap();
    let s = out.pop().unwrap();
    assert_eq!(s.response_ids, vec![other; 12]);
    assert_eq!((s.tool_calls, s.turns, s.finish_reason), (0, 1, "budget"));
    assert!(env.calls.lock().unwrap().is_empty());
    // The CoA codec samples the tags (and so ends at the first `</answer>` or runs a tool).
    let mut out = Vec::new();
    generate(&mut p, &env, &Codec::new(&v).unwrap(), &greedy, vec![Job { key: 0, prompt_ids: prompt.clone(), seed: 1 }], &mut |_, s| {
        out.push(s);
        Ok(true)
    })
    .unwrap();
    assert!(tags.contains(&out[0].response_ids[0]));

    // Plain text runs to EOS in one turn.
    let (answer, eos) = ("the answer is 42", v.eos.unwrap());
    let mut p = Scripted::new(enc(&v, answer), eos, v.size(), 1);
    let mut out = Vec::new();
    generate(&mut p, &env, &codec, &cfg(64, 16), vec![Job { key: 0, prompt_ids: prompt, seed: 1 }], &mut |_, s| {
        out.push(s);
        Ok(true)
    })
    .unwrap();
    let s = out.pop().unwrap();
    assert_eq!((s.finish_reason, s.tool_calls, s.turns), ("eos", 0, 1));
    assert_eq!(&s.response_ids[..s.response_ids.len() - 1], enc(&v, answer).as_slice());
}

#[test]
fn a_token_excluded_from_sampling_is_never_drawn_and_an_all_excluded_row_is_an_error() {
    let mut rng = Rng::new(3);
    let z = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.5];
    for _ in 0..200 {
        let (t, lp) = sample_token(&z, 1.0, 1.0, &mut rng).unwrap();
        assert!(t == 1 || t == 3, "drew {t}");
        assert!(lp.is_finite());
    }
    assert_eq!(sample_token(&z, 0.0, 1.0, &mut rng).unwrap().0, 3);
    let all = [f32::NEG_INFINITY; 4];
    assert!(sample_token(&all, 1.0, 1.0, &mut rng).unwrap_err().to_string().contains("excluded"));
    assert!(sample_token(&[0.0, f32::INFINITY], 1.0, 1.0, &mut rng).unwrap_err().to_string().contains("non-finite"));
}
