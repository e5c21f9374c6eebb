//! `coa-generate policy` end to end: the real binary on a tiny random checkpoint.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use coa_model::{Model, ModelConfig, SaveDtype};
use coa_schemas::io::{self, Provenance};
use coa_schemas::rows::{self, Rollout, Row, Task};
use coa_schemas::tables::{CORPUS, ROLLOUTS};
use coa_tasks::{Split, Suite};
use coa_tokenize::Vocab;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coa-generate")).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A checkpoint as coa-train-step saves it: a tiny random model and a BPE trained on the prompts.
fn checkpoint(dir: &Path, tasks: &[Task]) -> PathBuf {
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    let texts: Vec<String> = tasks.iter().map(|t| coa_format::build_prompt(&t.suite, &t.question)).collect();
    let vocab = Vocab::train(texts.iter().map(String::as_str), 600, 2).unwrap();
    vocab.save(&ckpt.join("tokenizer.json")).unwrap();
    write_model(&ckpt, vocab.size(), 1);
    ckpt
}

/// A tiny random model (weights scaled up, so sampling is far from uniform) into `ckpt`.
fn write_model(ckpt: &Path, vocab_size: usize, seed: u64) {
    let mut c = ModelConfig::preset("tiny", vocab_size).unwrap();
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    let mut m = Model::init(c, seed).unwrap();
    m.params.scale(4.0);
    m.save(ckpt, SaveDtype::F32).unwrap();
}

fn write_tasks(path: &Path, tasks: &[Task]) {
    let prov = Provenance { stage: "test".into(), ..Default::default() };
    io::write_all(Some(path), None, &Task::table().schema(), &[rows::to_batch(tasks).unwrap()], &prov).unwrap();
}

fn read_rollouts(path: &Path) -> Vec<Rollout> {
    let (_, batches) = io::read_all(Some(path), &ROLLOUTS).unwrap();
    batches.iter().flat_map(|b| rows::from_batch::<Rollout>(b).unwrap()).collect()
}

struct Setup {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    ckpt: PathBuf,
    math: PathBuf,
    web: PathBuf,
    corpus: PathBuf,
    n_math: usize,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let math = coa_tasks::generate(Suite::Math, 3, 1, Split::Train).unwrap().tasks;
    let web = coa_tasks::generate(Suite::Multihop, 2, 1, Split::Train).unwrap();
    let mut all = math.clone();
    all.extend(web.tasks.iter().cloned());
    let ckpt = checkpoint(&dir, &all);
    let (m, w, c) = (dir.join("math.parquet"), dir.join("web.parquet"), dir.join("corpus.parquet"));
    write_tasks(&m, &math);
    write_tasks(&w, &web.tasks);
    let prov = Provenance { stage: "test".into(), ..Default::default() };
    io::write_all(Some(&c), None, &CORPUS.schema(), &[rows::to_batch(&web.corpus).unwrap()], &prov).unwrap();
    Setup { _dir: tmp, dir, ckpt, math: m, web: w, corpus: c, n_math: math.len() }
}

#[test]
fn samples_g_rollouts_per_task_deterministically() {
    let s = setup();
    let out = |name: &str| s.dir.join(name);
    let args = |o: &Path, batch: &str, threads: &str| {
        run(&[
            "policy", "--checkpoint", s.ckpt.to_str().unwrap(), "-i", s.math.to_str().unwrap(), "--n", "3",
            "--max-response-tokens", "48", "--max-turns", "3", "--max-observation-tokens", "16", "--seed", "5",
            "--batch", batch, "--threads", threads, "-o", o.to_str().unwrap(),
        ])
    };
    let o = args(&out("a.parquet"), "4", "1");
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_str(stderr(&o).lines().last().unwrap()).unwrap();
    assert!(summary["sampled_tokens_per_s"].as_f64().unwrap() > 0.0, "{summary}");
    let a = read_rollouts(&out("a.parquet"));
    assert_eq!(a.len(), s.n_math * 3);
    for (i, r) in a.iter().enumerate() {
        assert_eq!(r.sample_idx as usize, i % 3);
        assert_eq!(r.model, "ckpt");
        assert!(!r.prompt_ids.is_empty() && !r.response_ids.is_empty() && r.response_ids.len() <= 48);
        assert_eq!((r.loss_mask.len(), r.logprobs.len()), (r.response_ids.len(), r.response_ids.len()));
        assert!(["answer", "budget", "max_turns", "eos"].contains(&r.finish_reason.as_str()), "{}", r.finish_reason);
        assert!((1..=3).contains(&r.turns) && (r.tool_calls == r.turns - 1 || r.tool_calls == r.turns), "{} {}", r.turns, r.tool_calls);
        for (m, lp) in r.loss_mask.iter().zip(&r.logprobs) {
            assert!(if *m == 0 { *lp == 0.0 } else { *lp <= 0.0 });
        }
    }
    // the same seed gives the same rows whatever the batch and thread count
    let o = args(&out("b.parquet"), "7", "2");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(a, read_rollouts(&out("b.parquet")));
}

#[test]
fn web_tasks_need_the_corpus_and_run_with_it() {
    let s = setup();
    let o = run(&["policy", "--checkpoint", s.ckpt.to_str().unwrap(), "-i", s.web.to_str().unwrap(), "--n", "2", "--max-response-tokens", "16"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--corpus FILE is required"), "{}", stderr(&o));
    let out = s.dir.join("web_rollouts.arrow");
    let o = run(&[
        "policy", "--checkpoint", s.ckpt.to_str().unwrap(), "-i", s.web.to_str().unwrap(), "--corpus", s.corpus.to_str().unwrap(),
        "--n", "2", "--max-response-tokens", "16", "--model-name", "sft", "-o", out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = read_rollouts(&out);
    assert_eq!(r.len(), 4);
    assert!(r.iter().all(|r| r.model == "sft" && r.suite == "multihop"));
}

#[test]
fn oversampling_stops_at_the_wanted_informative_groups() {
    let s = setup();
    let ck = s.ckpt.to_str().unwrap();
    let math = s.math.to_str().unwrap();
    let out = s.dir.join("over.parquet");
    // Greedy samples of a group are identical, so are their rewards: no group is informative,
    // every task is used and a warning says so.
    let o = run(&[
        "policy", "--checkpoint", ck, "-i", math, "--n", "2", "--temperature", "0",
        "--max-response-tokens", "16", "--oversample", "--groups", "1", "-o", out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("only 0 informative group(s)"), "{}", stderr(&o));
    assert_eq!(read_rollouts(&out).len(), s.n_math * 2);
    // Sampled: where the lengths (hence the overlong term) differ within a group, the run stops at
    // the first informative group and writes every group up to it. Most random tiny models never
    // end a 16-token sample early (an EOS or a tool call), so the test takes the first seed whose
    // model does, on these tasks.
    let vocab_size = ModelConfig::from_file(&s.ckpt.join("config.json")).unwrap().vocab_size;
    let summary = (1..=64)
        .find_map(|seed| {
            write_model(&s.ckpt, vocab_size, seed);
            let o = run(&[
                "policy", "--checkpoint", ck, "-i", math, "--n", "3", "--max-response-tokens", "16",
                "--oversample", "--groups", "1", "--overlong-cache", "8", "-o", out.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{}", stderr(&o));
            let summary: serde_json::Value = serde_json::from_str(stderr(&o).lines().last().unwrap()).unwrap();
            (summary["informative_groups"] == 1).then_some(summary)
        })
        .expect("no tiny model in 64 seeds ends a sample early");
    let groups = summary["groups"].as_u64().unwrap() as usize;
    assert!(groups >= 1 && groups <= s.n_math);
    let rows = read_rollouts(&out);
    assert_eq!(rows.len(), groups * 3);
    let last: Vec<usize> = rows[rows.len() - 3..].iter().map(|r| r.response_ids.len()).collect();
    assert!(last.iter().any(|&l| l != last[0]) || groups == 1, "the last group is informative: {last:?}");
    let o = run(&["policy", "--checkpoint", ck, "-i", math, "--oversample"]);
    assert!(!o.status.success() && stderr(&o).contains("--groups"), "{}", stderr(&o));
}

/// `--oversample` in shards: shard I of N wants its share of `--groups` and takes its own tasks in
/// order; every group is whole, and a task's samples are the ones an unsharded run draws for it.
#[test]
fn oversampled_shards_take_their_share_of_groups_with_the_unsharded_samples_of_each_task() {
    let s = setup();
    let ck = s.ckpt.to_str().unwrap();
    let tasks = coa_tasks::generate(Suite::Math, 8, 2, Split::Train).unwrap().tasks;
    let path = s.dir.join("eight.parquet");
    write_tasks(&path, &tasks);
    let all = path.to_str().unwrap();
    let common = ["policy", "--checkpoint", ck, "-i", all, "--n", "3", "--max-response-tokens", "16", "--seed", "4"];
    let with = |extra: &[&str]| -> Vec<String> { common.iter().chain(extra).map(|a| a.to_string()).collect() };
    let vocab_size = ModelConfig::from_file(&s.ckpt.join("config.json")).unwrap().vocab_size;
    // As in the test above: the first tiny model that ends some samples early, so that both shards
    // find their one informative group (a length difference within the overlong band).
    let found = (1..=64).find_map(|seed| {
        write_model(&s.ckpt, vocab_size, seed);
        let mut shards = Vec::new();
        for i in 0..2 {
            let out = s.dir.join(format!("shard{i}.parquet"));
            let args = with(&["--oversample", "--groups", "2", "--overlong-cache", "8", "--shard", &format!("{i}/2"), "-o", out.to_str().unwrap()]);
            let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert!(o.status.success(), "{}", stderr(&o));
            let summary: serde_json::Value = serde_json::from_str(stderr(&o).lines().last().unwrap()).unwrap();
            assert_eq!(summary["groups_wanted"], 1, "--groups 2 over 2 shards: {summary}");
            shards.push((summary, read_rollouts(&out)));
        }
        shards.iter().all(|(summary, _)| summary["informative_groups"] == 1).then_some(shards)
    });
    let shards = found.expect("no tiny model in 64 seeds ends a sample early in both shards");
    let whole = s.dir.join("whole.parquet");
    let o = run(&with(&["-o", whole.to_str().unwrap()]).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let whole = read_rollouts(&whole);
    for (i, (summary, rows)) in shards.iter().enumerate() {
        let spec = coa_schemas::shard::ShardSpec { index: i as u32, count: 2 };
        let mine: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).filter(|id| spec.holds(id)).collect();
        let groups = summary["groups"].as_u64().unwrap() as usize;
        assert_eq!(rows.len(), groups * 3, "shard {i}: whole groups only");
        let drawn: Vec<&str> = rows.iter().step_by(3).map(|r| r.task_id.as_str()).collect();
        assert_eq!(drawn, &mine[..groups], "shard {i}: its own tasks, in order, up to its informative group");
        for r in rows {
            let same = whole.iter().find(|w| w.task_id == r.task_id && w.sample_idx == r.sample_idx).unwrap();
            assert_eq!(r, same, "shard {i}: task {} draws the same samples as unsharded", r.task_id);
        }
    }
    // A share of no group draws nothing: --groups 1 over 2 shards, shard 1.
    let out = s.dir.join("none.parquet");
    let args = with(&["--oversample", "--groups", "1", "--shard", "1/2", "-o", out.to_str().unwrap()]);
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(read_rollouts(&out).is_empty());
}

#[test]
fn bad_input_is_named() {
    let s = setup();
    let ck = s.ckpt.to_str().unwrap();
    let math = s.math.to_str().unwrap();
    let o = run(&["policy", "--checkpoint", s.dir.join("nope").to_str().unwrap(), "-i", math]);
    assert!(!o.status.success() && stderr(&o).contains("no such checkpoint directory or GGUF file"), "{}", stderr(&o));
    // prompt + budget past the model's positions (tiny: 2048) is refused, naming the flag and the limit
    let long = s.dir.join("long.parquet");
    let o = run(&["policy", "--checkpoint", ck, "-i", math, "--max-response-tokens", "2040", "-o", long.to_str().unwrap()]);
    let e = stderr(&o);
    assert!(!o.status.success() && !long.exists(), "{e}");
    assert!(e.contains("--max-response-tokens 2040") && e.contains("max_position_embeddings 2048") && e.contains("or less"), "{e}");
    // --overlong-cache shapes only --oversample's judging, and never past the budget
    let o = run(&["policy", "--checkpoint", ck, "-i", math, "--overlong-cache", "8"]);
    assert!(!o.status.success() && stderr(&o).contains("give --oversample too"), "{}", stderr(&o));
    let o = run(&["policy", "--checkpoint", ck, "-i", math, "--oversample", "--groups", "1", "--overlong-cache", "2000"]);
    let e = stderr(&o);
    assert!(!o.status.success() && e.contains("--overlong-cache 2000 is larger than --max-response-tokens 1024"), "{e}");
    let o = run(&["policy", "--checkpoint", ck, "-i", math, "--oversample", "--groups", "1", "--overlong-cache", "-1"]);
    assert!(!o.status.success() && stderr(&o).contains("a whole number (0 or more)"), "{}", stderr(&o));
    std::fs::remove_file(s.ckpt.join("tokenizer.json")).unwrap();
    let o = run(&["policy", "--checkpoint", ck, "-i", math]);
    assert!(!o.status.success() && stderr(&o).contains("tokenizer.json is missing"), "{}", stderr(&o));
    let o = run(&["policy", "--checkpoint", ck, "-i", math, "--top-p", "0"]);
    assert!(!o.status.success() && stderr(&o).contains("--top-p"), "{}", stderr(&o));
    let out = s.dir.join("never.parquet");
    let o = run(&["policy", "--checkpoint", ck, "-i", math, "-o", out.to_str().unwrap()]);
    assert!(!o.status.success() && !out.exists(), "a failing run leaves no output");
}

/// `--device`: `cuda` without a usable GPU is a clear error before anything is written; `auto`
/// then decodes on the CPU (with a note) exactly as `cpu` does. Where a GPU exists, `cuda` decodes
/// there end to end (bf16: rows are checked for shape, not against the CPU's samples).
#[test]
fn device_flag_selects_or_refuses_the_gpu() {
    let s = setup();
    let out = |name: &str| s.dir.join(name);
    let args = |o: &Path, device: &str| {
        run(&[
            "policy", "--checkpoint", s.ckpt.to_str().unwrap(), "-i", s.math.to_str().unwrap(), "--n", "2",
            "--max-response-tokens", "32", "--max-turns", "2", "--seed", "3", "--device", device, "-o", o.to_str().unwrap(),
        ])
    };
    let cpu = args(&out("cpu.parquet"), "cpu");
    assert!(cpu.status.success(), "{}", stderr(&cpu));
    let cpu_rows = read_rollouts(&out("cpu.parquet"));
    let have_gpu = coa_kernels::probe().is_ok();

    let o = args(&out("cuda.parquet"), "cuda");
    if have_gpu {
        assert!(o.status.success(), "{}", stderr(&o));
        let rows = read_rollouts(&out("cuda.parquet"));
        assert_eq!(rows.len(), cpu_rows.len());
        assert!(rows.iter().all(|r| !r.response_ids.is_empty() && r.logprobs.len() == r.response_ids.len()));
    } else {
        println!("device_flag_selects_or_refuses_the_gpu: no CUDA device here: checking the refusal only");
        assert!(!o.status.success(), "--device cuda without a GPU must fail");
        let e = stderr(&o);
        assert!(e.contains("--device cuda"), "{e}");
        assert!(!out("cuda.parquet").exists(), "no output on failure");

        let o = args(&out("auto.parquet"), "auto");
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("running on the CPU"), "{}", stderr(&o));
        assert_eq!(read_rollouts(&out("auto.parquet")), cpu_rows, "auto without a GPU = cpu");
    }

    let o = args(&out("bad.parquet"), "tpu");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("expected auto, cpu, cuda or cuda:N"), "{}", stderr(&o));
}

/// With a chat template in the checkpoint's tokenizer_config.json, the policy conditions on the
/// same prefix, token for token, as `coa-tokenize --tokenizer DIR` lays out for training (system
/// prompt and question as the template's turns, then the assistant turn's opening).
#[test]
fn chat_template_prefix_is_the_training_layouts() {
    let s = setup();
    let template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let config_path = s.ckpt.join(coa_tokenize::CONFIG_FILE);
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["chat_template"] = template.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let out = s.dir.join("chat.parquet");
    let o = run(&[
        "policy", "--checkpoint", s.ckpt.to_str().unwrap(), "-i", s.math.to_str().unwrap(), "--n", "1",
        "--max-response-tokens", "4", "-o", out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let auto = || "auto".parse().unwrap();
    let vocab = Vocab::load(&s.ckpt, &auto(), &auto(), &coa_tokenize::TemplateChoice::Auto).unwrap();
    assert!(vocab.chat.is_some());
    let rollouts = read_rollouts(&out);
    assert_eq!(rollouts.len(), s.n_math);
    // setup()'s math tasks
    let tasks = coa_tasks::generate(Suite::Math, 3, 1, Split::Train).unwrap().tasks;
    for r in &rollouts {
        let task = tasks.iter().find(|t| t.task_id == r.task_id).unwrap();
        let prompt = coa_format::build_prompt(&task.suite, &task.question);
        let enc = coa_tokenize::encode_row(&vocab, &prompt, "", &[], &[]).unwrap();
        let want: Vec<i32> = enc.ids[..enc.prompt_len as usize].iter().map(|&i| i as i32).collect();
        assert_eq!(r.prompt_ids, want, "task {}", r.task_id);
        let ids: Vec<u32> = r.prompt_ids.iter().map(|&i| i as u32).collect();
        let text = vocab.tokenizer.decode(&ids, false).unwrap();
        assert!(text.starts_with("<|im_start|>system\n") && text.ends_with("<|im_end|>\n<|im_start|>assistant\n"), "{text}");
    }
}
