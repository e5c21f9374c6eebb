//! Times coa-train-step's training step on the GPU, on the model and batch of
//! `bench/gpu/torch_ref.py trainstep` (the PyTorch eager baseline): a ~125M-parameter Llama (vocab
//! 32000, hidden 768, 12 layers of 12 heads, intermediate 2048, untied head) on 8 rows of 1024
//! random tokens, every token after the first a target. One JSON line on stdout for
//! bench/gpu/report.py: `{"kind":"trainstep","impl":"ours",...}` with tokens/s, model TFLOP/s
//! (torch_ref.py's formula) and MFU.
//!
//! What is timed is `Trainer::step`, as the binary runs it (SFT, AdamW lr 1e-4 with weight decay
//! 0.01, clipping at norm 1): packing the rows, the forward and backward, the host-side objective,
//! the gradient norm, AdamW, and the synchronisation at the end of the step. Median of
//! `COA_BENCH_ITERS / 2` (at least 5) steps after 3 warm-up steps.
//!
//!   cargo run --release -p coa-train-step --example gpu_trainstep_bench   (on a GPU machine)
//!
//! `COA_BENCH_DEVICE=emu COA_BENCH_SMALL=1`: a 2-layer model of width 128 on 2 x 128 tokens on the
//! emulated device (the device script's rehearsal; the numbers mean nothing).

use std::sync::Arc;

use anyhow::{anyhow, Result};
use coa_kernels::rng::Rng;
use coa_kernels::testing::{bench_gpu, bench_small};
use coa_model::{Model, ModelConfig};
use coa_train_step::data::{Dataset, Example};
use coa_train_step::objective::Objective;
use coa_train_step::optim::AdamWConfig;
use coa_train_step::schedule::Schedule;
use coa_train_step::train::{Settings, Trainer};


/// Dense bf16 tensor-core peak (TFLOP/s) of the GPUs this is run on, for MFU.
fn peak_tflops(name: &str) -> Option<f64> {
    if name.contains("H100") && name.contains("PCIe") {
        Some(756.0)
    } else if name.contains("H100") || name.contains("H200") {
        Some(989.4)
    } else if name.contains("A100") {
        Some(312.0)
    } else {
        None
    }
}

fn main() -> Result<()> {
    let gpu = bench_gpu().map_err(|e| anyhow!("{e}"))?;
    gpu.warm_up()?;
    let info = gpu.info.clone();
    eprintln!("device: {info}");

    // The full shape is torch_ref.py's; the small one only exercises the same path.
    let small = bench_small();
    let (batch_rows, seq, vocab) = if small { (2usize, 128usize, 512usize) } else { (8, 1024, 32000) };
    let mut c = ModelConfig::preset("small", vocab)?;
    c.hidden_size = if small { 128 } else { 768 };
    c.intermediate_size = if small { 256 } else { 2048 };
    c.num_hidden_layers = if small { 2 } else { 12 };
    c.num_attention_heads = c.hidden_size / 64;
    c.num_key_value_heads = c.num_attention_heads;
    c.max_position_embeddings = 2048;
    c.tie_word_embeddings = false;
    c.validate()?;
    let layers = c.num_hidden_layers as f64;
    let hidden = c.hidden_size as f64;
    let model = Model::init(c, 0)?;
    let params = model.params.n_elements();

    let mut rng = Rng::new(1);
    let mut data = Dataset::default();
    for row in 0..batch_rows {
        let input_ids: Vec<u32> = (0..seq).map(|_| rng.below(vocab) as u32).collect();
        data.rows += 1;
        data.push(Example { source: 0, row, task_id: format!("bench{row}"), input_ids, loss_mask: vec![1; seq], segment_ids: None, n_targets: 0, rl: None });
    }
    let iters = std::env::var("COA_BENCH_ITERS").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(20).div_euclid(2).max(5);
    let settings = Settings {
        seed: 0,
        schedule: Schedule::new(1e-4, 1e-4, 0, (iters + 3) as u64)?,
        adamw: AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 },
        grad_clip: 1.0,
        batch_tokens: batch_rows * seq,
        micro_batch_tokens: batch_rows * seq,
        new_rows: None,
        frozen_layers: 0,
        matmul: Default::default(),
        lora: None,
    };
    let mut trainer = Trainer::new(model, Objective::Sft, &settings, &data)?;
    trainer.to_cuda(Arc::new(gpu), &data)?;
    let gm = trainer.cuda.as_deref().map(|g| g.device_bytes()).unwrap_or(0);
    eprintln!("{params} parameters, {batch_rows} x {seq} tokens per step, {:.2} GiB of GPU buffers", gm as f64 / (1u64 << 30) as f64);

    let mut losses = Vec::new();
    for _ in 0..3 {
        losses.push(trainer.step(&data)?.loss);
    }
    let mut ms: Vec<f64> = Vec::with_capacity(iters);
    for _ in 0..iters {
        let r = trainer.step(&data)?;
        losses.push(r.loss);
        ms.push(r.seconds * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    let ms = ms[ms.len() / 2];
    let tokens_per_s = (batch_rows * seq) as f64 / (ms / 1e3);
    // torch_ref.py's FLOPs per token: 6 N plus attention's 6 L T d.
    let flops_per_tok = 6.0 * params as f64 + 6.0 * layers * seq as f64 * hidden;
    let tflops = flops_per_tok * tokens_per_s / 1e12;
    let peak = peak_tflops(&info.name);
    let mfu = peak.map(|p| tflops / p);
    let json_opt = |x: Option<f64>| x.map_or("null".to_string(), |v| format!("{v:.4}"));
    eprintln!("median step {ms:.2} ms: {tokens_per_s:.0} tokens/s, {tflops:.1} TFLOP/s, MFU {}; losses {losses:.3?}", json_opt(mfu));
    println!(
        "{{\"kind\":\"trainstep\",\"impl\":\"ours\",\"device\":{:?},\"params\":{params},\"B\":{batch_rows},\"T\":{seq},\"ms\":{ms:.3},\"tokens_per_s\":{tokens_per_s:.1},\"tflops\":{tflops:.2},\"peak_tflops\":{},\"mfu\":{},\"loss_first\":{:.4},\"loss_last\":{:.4}}}",
        info.name,
        json_opt(peak),
        json_opt(mfu),
        losses[0],
        losses[losses.len() - 1]
    );
    Ok(())
}
