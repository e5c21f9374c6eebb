//! Timings of our kernels on the GPU, one JSON object per line on stdout (bench/gpu/run.sh merges
//! them with bench/gpu/torch_ref.py's into BENCHMARKS-style markdown).
//!   attention fwd and fwd+bwd (causal, bf16) for T 1024..8192, head dims 64 and 128;
//!   fused masked cross-entropy fwd+bwd (GB/s over the minimal bytes: read + write the logits);
//!   device-to-device copy bandwidth (bytes read + written).
//! Medians of event-timed runs after a warm-up; inputs random (never zeros).
//! `COA_BENCH_DEVICE=emu COA_BENCH_SMALL=1`: the same calls on small shapes on the emulated device
//! (the device script's rehearsal; the numbers mean nothing).

use coa_kernels::ops::attention::{AttnLayout, AttnShape, Qkv, QkvGrads};
use coa_kernels::rng::Rng;
use coa_kernels::testing::{bench_gpu, bench_small};

fn median(mut v: Vec<f32>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2] as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = bench_gpu()?;
    let small = bench_small();
    eprintln!("device: {}", gpu.info);
    gpu.warm_up()?;
    let mut rng = Rng::new(Rng::fresh_seed());
    let iters: usize = std::env::var("COA_BENCH_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    println!("{{\"kind\":\"device\",\"name\":{:?},\"info\":{:?}}}", gpu.info.name, gpu.info.to_string());

    // Attention: 16k tokens per call, model width 2048 (32 heads of 64 or 16 of 128), no GQA
    // (what SDPA is timed on).
    let (head_dims, seqs, width, tokens): (&[usize], &[usize], usize, usize) =
        if small { (&[64], &[128], 128, 256) } else { (&[64, 128], &[1024, 2048, 4096, 8192], 2048, 16384) };
    for &hd in head_dims {
        for &t in seqs {
            let h = width / hd;
            let b = tokens / t;
            let s = AttnShape { batch: b, seq: t, q_heads: h, kv_heads: h, head_dim: hd, window: 0 };
            let l = AttnLayout::contiguous(&s);
            let n = b * t * h * hd;
            let q = gpu.upload_bf16(&rng.normals(n, 1.0))?;
            let k = gpu.upload_bf16(&rng.normals(n, 1.0))?;
            let v = gpu.upload_bf16(&rng.normals(n, 1.0))?;
            let dout = gpu.upload_bf16(&rng.normals(n, 1.0))?;
            let mut o = gpu.zeros(n)?;
            let mut lse = gpu.zeros::<f32>(b * t * h)?;
            let (mut dq, mut dk, mut dv) = (gpu.zeros(n)?, gpu.zeros(n)?, gpu.zeros(n)?);
            let fwd = median(gpu.time_ms(iters, || gpu.attention_fwd(&s, &l, Qkv { q: &q, k: &k, v: &v }, None, &mut o, &mut lse))?);
            let bwd = median(gpu.time_ms(iters, || gpu.attention_bwd(&s, &l, Qkv { q: &q, k: &k, v: &v }, &o, &lse, None, &dout, QkvGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv }))?);
            // Causal FLOPs: fwd 2 matmuls of B*H*T*T*hd/2 MACs each; bwd 2.5x the forward.
            let fwd_flops = 4.0 * (b * h) as f64 * (t * t) as f64 * hd as f64 / 2.0;
            let total = fwd_flops * 3.5;
            println!(
                "{{\"kind\":\"attention\",\"impl\":\"ours\",\"hd\":{hd},\"T\":{t},\"B\":{b},\"H\":{h},\"fwd_ms\":{fwd:.4},\"bwd_ms\":{bwd:.4},\"fwd_tflops\":{:.1},\"fwdbwd_tflops\":{:.1}}}",
                fwd_flops / fwd / 1e9,
                total / (fwd + bwd) / 1e9
            );
        }
    }

    // Masked cross-entropy, fused fwd+bwd in place. All rows unmasked for the bandwidth figure
    // (a masked row is skipped without reading its logits).
    let xent_shapes: &[(usize, usize)] = if small { &[(64, 512)] } else { &[(8192, 32000), (4096, 151_936)] };
    for &(n, v) in xent_shapes {
        let logits: Vec<f32> = (0..n * v).map(|_| rng.normal() * 2.0).collect();
        let mut x = gpu.upload_bf16(&logits)?;
        let t = gpu.upload(&(0..n).map(|_| rng.below(v) as i32).collect::<Vec<_>>())?;
        let g = gpu.upload(&vec![1.0f32 / n as f32; n])?;
        let mut logp = gpu.zeros::<f32>(n)?;
        // Each timed call overwrites the logits with gradients; values stay finite and random-
        // like, which is what the kernel's cost depends on.
        let ms = median(gpu.time_ms(iters, || gpu.xent_fwd_bwd(&mut x, &t, Some(&g), &mut logp, None, n, v, true))?);
        let bytes = 2.0 * (n * v * 2) as f64;
        println!("{{\"kind\":\"xent\",\"impl\":\"ours\",\"N\":{n},\"V\":{v},\"ms\":{ms:.4},\"gbps\":{:.0}}}", bytes / ms / 1e6);
    }

    // Copy bandwidth: 1 GiB device to device.
    let n = if small { 1usize << 16 } else { 1usize << 29 }; // bf16 elements: 1 GiB
    let src = gpu.upload_bf16(&(0..n).map(|i| (i % 251) as f32).collect::<Vec<_>>())?;
    let mut dst = gpu.zeros::<coa_kernels::bf16>(n)?;
    let ms = median(gpu.time_ms(iters, || {
        gpu.stream.memcpy_dtod(&src, &mut dst)?;
        Ok(())
    })?);
    println!("{{\"kind\":\"copy\",\"impl\":\"ours\",\"bytes\":{},\"ms\":{ms:.4},\"gbps\":{:.0}}}", 2 * n * 2, (4 * n) as f64 / ms / 1e6);
    Ok(())
}
