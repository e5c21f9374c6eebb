//! Throughput of batched KV-cache decoding at several batch sizes. The model is the tiny preset
//! (random weights), or the checkpoint given (an HF directory or a GGUF file).
//!
//! Default: a random 256-token prompt per slot (prefill timed), then 128 decode steps.
//! `--context N`: one random N-token prompt prefilled once and copied to every slot
//! (`KvCache::copy_prefix`), then the decode steps alone: the contexts RL rollouts decode at.
//! `--weights f32|bf16|int8|bf16-matmul`: the format decoding holds the weights in (`DecodeDtype`);
//! `--kv f32|bf16`: the KV cache's.
//!
//!     RAYON_NUM_THREADS=2 cargo run --release -p coa-model --example decode_bench \
//!         [-- CHECKPOINT [BATCH...] [--context N] [--steps N] [--weights F] [--kv F]]

use anyhow::{bail, Context};
use coa_model::rng::random_ids;
use coa_model::{DecodeDtype, KvCache, Model, ModelConfig};

fn main() -> anyhow::Result<()> {
    let mut positional = Vec::new();
    let (mut context, mut steps, mut dtype, mut kv) = (None, 128usize, DecodeDtype::F32, DecodeDtype::F32);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |flag: &str| -> anyhow::Result<usize> {
            let v = args.next().with_context(|| format!("{flag} needs a value"))?;
            v.parse().with_context(|| format!("{flag} {v}: expected a number of tokens"))
        };
        match a.as_str() {
            "--context" => context = Some(value("--context")?),
            "--steps" => steps = value("--steps")?,
            "--weights" => dtype = args.next().context("--weights needs f32, bf16, int8 or bf16-matmul")?.parse()?,
            "--kv" => kv = args.next().context("--kv needs f32 or bf16")?.parse()?,
            s if s.starts_with("--") => bail!("unknown flag {s} (expected --context N, --steps N, --weights F, --kv F)"),
            _ => positional.push(a),
        }
    }
    let (m, name) = match positional.first() {
        Some(path) => (Model::load(std::path::Path::new(path))?, path.clone()),
        None => (Model::init(ModelConfig::preset("tiny", 4096)?, 0)?, "tiny preset".to_string()),
    };
    let batches: Vec<usize> =
        if positional.len() > 1 { positional[1..].iter().map(|b| b.parse()).collect::<Result<_, _>>()? } else { vec![1, 8, 32] };
    // Weights packed for decoding before any timing, as loading a model to decode does.
    m.prepare_decoding_as(dtype)?;
    let vocab = m.config.vocab_size;
    let threads = rayon::current_num_threads();
    for batch in batches {
        let prompt = context.unwrap_or(256);
        let mut cache = KvCache::new_as(&m.config, batch, prompt + steps, kv)?;
        let t0 = std::time::Instant::now();
        if context.is_some() {
            m.prefill(&mut cache, 0, &random_ids(prompt, vocab, 0))?;
            for slot in 1..batch {
                cache.copy_prefix(0, slot, prompt)?;
            }
        } else {
            let prompts: Vec<Vec<u32>> = (0..batch).map(|i| random_ids(prompt, vocab, i as u64)).collect();
            let items: Vec<(usize, &[u32])> = prompts.iter().enumerate().map(|(i, p)| (i, p.as_slice())).collect();
            m.extend(&mut cache, &items)?;
        }
        let prefill = t0.elapsed().as_secs_f64();
        let slots: Vec<usize> = (0..batch).collect();
        let t0 = std::time::Instant::now();
        for s in 0..steps {
            let toks: Vec<u32> = (0..batch).map(|i| ((s * 31 + i * 7) % vocab) as u32).collect();
            m.decode_step(&mut cache, &slots, &toks)?;
        }
        let dt = t0.elapsed().as_secs_f64();
        let decode = format!(
            "decode {:.0} tok/s ({:.2} ms/step)",
            (batch * steps) as f64 / dt,
            dt * 1000.0 / steps as f64
        );
        match context {
            Some(n) => println!("{name}, {dtype} weights, {kv} cache, {threads} threads, batch {batch}, context {n}..{}: {decode}", n + steps),
            None => println!(
                "{name}, {dtype} weights, {kv} cache, {threads} threads, batch {batch}: prefill {:.0} tok/s, {decode}",
                (batch * prompt) as f64 / prefill
            ),
        }
    }
    Ok(())
}
