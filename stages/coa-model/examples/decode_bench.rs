//! Throughput of batched KV-cache decoding on the tiny preset: a 256-token prompt per slot, then
//! 128 decode steps, at batch 1, 8 and 32.
//!
//!     RAYON_NUM_THREADS=2 cargo run --release -p coa-model --example decode_bench

use coa_model::rng::random_ids;
use coa_model::{KvCache, Model, ModelConfig};

fn main() -> anyhow::Result<()> {
    let c = ModelConfig::preset("tiny", 4096)?;
    let m = Model::init(c, 0)?;
    for batch in [1usize, 8, 32] {
        let mut cache = KvCache::new(&m.config, batch, 256 + 128)?;
        let prompts: Vec<Vec<u32>> = (0..batch).map(|i| random_ids(256, 4096, i as u64)).collect();
        let items: Vec<(usize, &[u32])> = prompts.iter().enumerate().map(|(i, p)| (i, p.as_slice())).collect();
        let t0 = std::time::Instant::now();
        m.extend(&mut cache, &items)?;
        let prefill = t0.elapsed().as_secs_f64();
        let slots: Vec<usize> = (0..batch).collect();
        let t0 = std::time::Instant::now();
        let steps = 128;
        for s in 0..steps {
            let toks: Vec<u32> = (0..batch).map(|i| ((s * 31 + i * 7) % 4096) as u32).collect();
            m.decode_step(&mut cache, &slots, &toks)?;
        }
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "tiny preset, {} threads, batch {batch}: prefill {:.0} tok/s, decode {:.0} tok/s ({:.2} ms/step)",
            rayon::current_num_threads(),
            (batch * 256) as f64 / prefill,
            (batch * steps) as f64 / dt,
            dt * 1000.0 / steps as f64
        );
    }
    Ok(())
}
