//! The teacher's `openai` backend (`coa-generate mas --backend openai`, the `coa_agents` code it
//! runs) end to end against coa-serve serving SmolLM2-135M-Instruct: the runs complete over a real
//! server, tool agents are stopped before `<observation>`, the endpoint's usage is recorded, and
//! the client's retries carry it through the server's 503s (two slots and one queue place, three
//! runs starting at once).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coa_agents::{OpenAiBackend, OpenAiClient, OpenAiConfig, RunConfig, ToolConfig, Tools};
use coa_serve::{start, ServeArgs};
use coa_tasks::{Split, Suite};

/// Where `make model` puts SmolLM2 (or `COA_SMOLLM2_GGUF`).
fn smollm2_path() -> PathBuf {
    match std::env::var_os("COA_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

#[test]
fn the_teacher_runs_against_coa_serve_serving_smollm2() {
    let gguf = smollm2_path();
    if !gguf.is_file() {
        eprintln!("the_teacher_runs_against_coa_serve_serving_smollm2: SKIPPED: no SmolLM2 GGUF at {} (run `make model`, or set COA_SMOLLM2_GGUF)", gguf.display());
        return;
    }
    let args: ServeArgs = coa_schemas::flags::try_parse_from([
        "coa-serve", "--checkpoint", gguf.to_str().unwrap(), "--port", "0", "--model-name", "smollm2", "--batch", "2", "--queue", "1", "--context", "2048",
    ])
    .unwrap();
    let server = start(&args).unwrap();
    let generated = coa_tasks::generate(Suite::Multihop, 3, 1, Split::Test).unwrap();
    let corpus = coa_tools::Corpus::new(generated.corpus).unwrap();
    let mut cfg = OpenAiConfig::new(&format!("{}/v1", server.url()), "smollm2");
    (cfg.max_tokens, cfg.max_retries, cfg.timeout) = (Some(48), 60, Duration::from_secs(300));
    (cfg.backoff_base, cfg.backoff_max) = (Duration::from_millis(100), Duration::from_secs(2));
    let client = OpenAiClient::new(cfg).unwrap();
    let backend = OpenAiBackend::new(client);
    let tool_cfg = ToolConfig::default();
    let run_cfg = RunConfig { max_activations: 5, ..RunConfig::default() };
    let t0 = Instant::now();
    // Three runs at once on two slots and one queue place: while the first prompt is prefilled
    // the second waits in the queue and the third is refused (503), then retried until the
    // server has room (from then on the three fit).
    let runs: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = generated
            .tasks
            .iter()
            .map(|t| {
                let (backend, corpus, tool_cfg, run_cfg) = (&backend, &corpus, &tool_cfg, &run_cfg);
                sc.spawn(move || coa_agents::run_task(t, backend, Tools { corpus: Some(corpus), config: tool_cfg }, run_cfg))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stats = backend.client().stats();
    for run in &runs {
        let run = run.as_ref().expect("the run completes over the real server");
        assert_eq!(run.backend, "openai:smollm2");
        assert!(!run.simulator);
        let model_events: Vec<_> = run.events.iter().filter(|e| !e.input_messages.is_empty()).collect();
        assert!(!model_events.is_empty());
        for e in &model_events {
            // The server's usage counts are what the run records.
            assert!(e.tokens_in > 0 && e.tokens_out > 0 && e.tokens_out <= 48, "{} {}: {} in, {} out", e.agent, e.role, e.tokens_in, e.tokens_out);
            // `stop` is honoured: no reply carries an observation the model made up.
            assert!(!e.output.contains("<observation>"), "{}: {}", e.agent, e.output);
        }
    }
    assert!(stats.retries > 0, "three runs at once on two slots and one queue place: the third was refused and retried ({stats:?})");
    let events: usize = runs.iter().map(|r| r.as_ref().unwrap().events.len()).sum();
    eprintln!(
        "the_teacher_runs_against_coa_serve_serving_smollm2: 3 multihop runs, {events} events, {} requests, {} retries in {:.1} s",
        stats.requests,
        stats.retries,
        t0.elapsed().as_secs_f64()
    );
}
