//! Forward+backward throughput of the CPU path:
//!
//!     RAYON_NUM_THREADS=2 cargo run --release -p coa-model --example bench_step -- [preset|config.json] [vocab] [seq] [iters] [layers]
//!
//! Prints tokens/s of one SFT-style forward_backward (masked mean CE over every token). With a
//! config.json the vocabulary is the file's (the vocab argument is ignored); `layers` overrides
//! the number of decoder layers (a quick profile of a deep model). `COA_BENCH_LORA=R` trains a
//! rank-R LoRA adapter on every linear layer instead of the weights.

use std::time::Instant;

use anyhow::Result;
use coa_model::{Model, ModelConfig, Seq};

fn main() -> Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let preset = a.get(1).map(String::as_str).unwrap_or("tiny");
    let vocab: usize = a.get(2).map(|s| s.parse()).transpose()?.unwrap_or(4096);
    let t: usize = a.get(3).map(|s| s.parse()).transpose()?.unwrap_or(256);
    let iters: usize = a.get(4).map(|s| s.parse()).transpose()?.unwrap_or(10);
    let mut config = if preset.ends_with(".json") { ModelConfig::from_file(preset.as_ref())? } else { ModelConfig::preset(preset, vocab)? };
    if let Some(l) = a.get(5) {
        config.num_hidden_layers = l.parse()?;
    }
    let vocab = config.vocab_size;
    let mut m = Model::init(config, 0)?;
    if let Some(r) = std::env::var("COA_BENCH_LORA").ok().map(|r| r.parse::<usize>()).transpose()? {
        let lc = coa_model::LoraConfig { rank: r, alpha: 2.0 * r as f64, dropout: 0.0, targets: coa_model::lora::Target::ALL.to_vec() };
        m.lora = Some(coa_model::Lora::init(&m.config, lc, 0)?);
    }
    let ids: Vec<u32> = (0..t as u32).map(|i| (i * 7919 + 13) % vocab as u32).collect();
    let mut g = m.lora.as_ref().map_or(&m.params, |l| &l.params).zeros_like();
    let n = (t - 1) as f32;
    let mut ws = coa_model::Workspace::default();
    let mut step = |g: &mut coa_model::Params| {
        m.forward_backward_in(&mut ws, &Seq::new(&ids), None, g, &mut |s| {
            let mut d = vec![-1.0 / n; s.logp.len()];
            d[0] = 0.0;
            d
        })
    };
    step(&mut g)?; // warm-up
    let t0 = Instant::now();
    for _ in 0..iters {
        step(&mut g)?;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "{preset} vocab={vocab} params={} seq={t} threads={}: {:.1} ms/step, {:.0} tokens/s fwd+bwd",
        m.config.n_params(),
        rayon::current_num_threads(),
        dt / iters as f64 * 1e3,
        (t * iters) as f64 / dt
    );
    Ok(())
}
