//! Throughput of batched KV-cache decoding: a 256-token prompt per slot, then 128 decode steps,
//! at several batch sizes. The model is the tiny preset (random weights), or the checkpoint given
//! (an HF directory or a GGUF file).
//!
//!     RAYON_NUM_THREADS=2 cargo run --release -p coa-model --example decode_bench [-- CHECKPOINT [BATCH...]]

use coa_model::rng::random_ids;
use coa_model::{KvCache, Model, ModelConfig};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (m, name) = match args.first() {
        Some(path) => (Model::load(std::path::Path::new(path))?, path.clone()),
        None => (Model::init(ModelConfig::preset("tiny", 4096)?, 0)?, "tiny preset".to_string()),
    };
    let batches: Vec<usize> = if args.len() > 1 { args[1..].iter().map(|b| b.parse()).collect::<Result<_, _>>()? } else { vec![1, 8, 32] };
    let vocab = m.config.vocab_size;
    for batch in batches {
        let mut cache = KvCache::new(&m.config, batch, 256 + 128)?;
        let prompts: Vec<Vec<u32>> = (0..batch).map(|i| random_ids(256, vocab, i as u64)).collect();
        let items: Vec<(usize, &[u32])> = prompts.iter().enumerate().map(|(i, p)| (i, p.as_slice())).collect();
        let t0 = std::time::Instant::now();
        m.extend(&mut cache, &items)?;
        let prefill = t0.elapsed().as_secs_f64();
        let slots: Vec<usize> = (0..batch).collect();
        let t0 = std::time::Instant::now();
        let steps = 128;
        for s in 0..steps {
            let toks: Vec<u32> = (0..batch).map(|i| ((s * 31 + i * 7) % vocab) as u32).collect();
            m.decode_step(&mut cache, &slots, &toks)?;
        }
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "{name}, {} threads, batch {batch}: prefill {:.0} tok/s, decode {:.0} tok/s ({:.2} ms/step)",
            rayon::current_num_threads(),
            (batch * 256) as f64 / prefill,
            (batch * steps) as f64 / dt,
            dt * 1000.0 / steps as f64
        );
    }
    Ok(())
}
