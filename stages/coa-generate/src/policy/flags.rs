//! The flags of `coa-generate policy` ([`PolicyArgs`]) and the checkpoint and decoder flags it
//! shares with `coa-serve` ([`CheckpointFlags`], [`DecodeFlags`]), with their value parsers and
//! what opens them (the checkpoint, the decoder on the CPU or a GPU).

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use coa_kernels::decode::{check_decodable, GpuDecoder};
use coa_kernels::{gpu_for_model, select_device, Device, DeviceArg, Gpu};
use coa_model::Model;
use coa_rewards::OverlongCacheArg;
use coa_schemas::flags::ThreadsArg;
use coa_schemas::shard::ShardArgs;
use coa_schemas::stage::IoArgs;
use coa_tokenize::{LayoutArgs, Vocab};
use coa_tools::flags::ToolFlags;

use super::model::{load_checkpoint, Decoder, GpuPolicy, ModelPolicy, GPU_PASS_ROWS};
use crate::positive;

fn temperature(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}`: expected a temperature >= 0 (0 = greedy)")),
    }
}

fn top_p(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}`: expected a probability in (0, 1]")),
    }
}

/// `--kv-cache`: f32 or bf16.
fn kv_format(s: &str) -> Result<coa_model::DecodeDtype, String> {
    match s.parse::<coa_model::DecodeDtype>() {
        Ok(d @ (coa_model::DecodeDtype::F32 | coa_model::DecodeDtype::Bf16)) => Ok(d),
        Ok(d) => Err(format!("`{d}`: the KV cache holds f32 or bf16")),
        Err(_) => Err(format!("`{s}`: expected f32 or bf16")),
    }
}

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  coa-generate policy --checkpoint ckpt -i tasks.parquet --corpus corpus.parquet --n 8 -o rollouts.parquet\n  \
coa-generate policy --checkpoint ckpt -i tasks.parquet --corpus corpus.parquet --n 8 --oversample --groups 32 | coa-score --tasks tasks.parquet")]
pub struct PolicyArgs {
    #[command(flatten)]
    pub model: CheckpointFlags,
    /// The offline web (written by `coa-generate tasks --corpus-out`); needed when the tasks
    /// include multihop or other web tasks.
    #[arg(long, value_name = "FILE")]
    pub(super) corpus: Option<PathBuf>,
    /// Samples per task (the group size G).
    #[arg(long, value_parser = positive, default_value = "8", value_name = "G")]
    pub(super) n: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, value_parser = temperature, default_value = "1.0", value_name = "T")]
    pub(super) temperature: f32,
    /// Nucleus sampling: sample among the most likely tokens whose probabilities sum to P.
    #[arg(long, value_parser = top_p, default_value = "1.0", value_name = "P")]
    pub(super) top_p: f32,
    /// Seed: the same seed gives byte-identical output (whatever --threads and --batch).
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    /// Response budget in tokens, counting every turn, observations included.
    #[arg(long, value_parser = positive, default_value = "1024", value_name = "N")]
    pub(super) max_response_tokens: usize,
    /// Generation turns per sample (a turn ends at a tool call).
    #[arg(long, value_parser = positive, default_value = "16", value_name = "N")]
    pub(super) max_turns: usize,
    /// Keep only the first N tokens of each observation's body (tags not counted).
    #[arg(long, value_parser = positive, value_name = "N")]
    pub(super) max_observation_tokens: Option<usize>,
    /// Sequences decoded together (KV-cache slots).
    #[arg(long, value_parser = positive, default_value = "16", value_name = "N")]
    pub(super) batch: usize,
    #[command(flatten)]
    pub decode: DecodeFlags,
    /// Keep taking tasks until --groups informative groups (rewards not all equal) exist.
    #[arg(long, requires = "groups")]
    pub(super) oversample: bool,
    /// Plain answers: the model answers on its own, without CoA tags or tools (a base model
    /// measured beside the students): math and short answers in \boxed{}, code in a fenced
    /// block, one turn. Grade the rollouts with `coa-score --plain`.
    #[arg(long, conflicts_with = "oversample")]
    pub(super) plain: bool,
    /// With --oversample: informative groups wanted (with --shard I/N: over all N shards; this
    /// shard wants G/N, one more for the first G mod N shards).
    #[arg(long, value_parser = positive, value_name = "N", requires = "oversample")]
    pub(super) groups: Option<usize>,
    /// With --oversample: the overlong shaping the groups are judged with (Lmax is
    /// --max-response-tokens; give coa-score the same --max-response-len and --overlong-cache).
    #[command(flatten)]
    pub(super) overlong: OverlongCacheArg,
    /// The `model` column (default: the checkpoint directory's name).
    #[arg(long, value_name = "NAME")]
    pub(super) model_name: Option<String>,
    #[command(flatten)]
    pub(super) tools: ToolFlags,
    #[command(flatten)]
    pub(super) threads: ThreadsArg,
    #[command(flatten)]
    pub shard: ShardArgs,
    #[command(flatten)]
    pub io: IoArgs,
}

/// The checkpoint and how its vocabulary lays out a sequence (`coa-generate policy`, `coa-serve`).
#[derive(clap::Args, Debug, Clone)]
pub struct CheckpointFlags {
    /// Checkpoint: an HF directory (config.json + model.safetensors + tokenizer.json, as
    /// coa-train-step saves it) or a GGUF file (e.g. a pretrained model, the CoA tags then added).
    #[arg(long, value_name = "DIR|GGUF")]
    pub checkpoint: PathBuf,
    /// The layout the model was trained with: give the values given to coa-tokenize.
    #[command(flatten)]
    pub layout: LayoutArgs,
}

impl CheckpointFlags {
    /// The model's name: `given`, else the checkpoint directory's (or file's) name.
    pub fn name(&self, given: Option<&str>) -> String {
        match given {
            Some(n) => n.to_string(),
            None => std::fs::canonicalize(&self.checkpoint)
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| self.checkpoint.display().to_string()),
        }
    }

    /// The checkpoint's model and vocabulary ([`load_checkpoint`]).
    pub fn load(&self) -> Result<(Model, Vocab)> {
        load_checkpoint(&self.checkpoint, &self.layout.bos, &self.layout.eos, &self.layout.chat_template)
    }
}

/// Where and how sequences are decoded (`coa-generate policy`, `coa-serve`).
#[derive(clap::Args, Debug, Clone)]
pub struct DecodeFlags {
    /// Prefill every prompt whole on the CPU, instead of copying the keys and values of the prefix
    /// it shares with a recent prompt (the same bits either way; the copy saves about two thirds
    /// of a prompt's prefill, and all but two tokens of it for a task's later samples).
    #[arg(long)]
    pub no_prefix_reuse: bool,
    #[command(flatten)]
    pub device: DeviceArg,
    /// The format the CPU decoder holds the weights in: `f32` (as trained; the trainer's
    /// log-probs bit for bit), `bf16`, or `int8` (symmetric, one scale per 32 inputs of an
    /// output). A decode step reads every weight once, so on AVX-512 CPUs bf16 and int8 read a
    /// half and about a quarter of the bytes and decode faster (with AVX2 alone the rounded
    /// values are kept as f32: the rounding without the speed); the logits move by the rounding
    /// (RL then sees a non-zero sampling-vs-trainer log-prob mismatch). `bf16-matmul`: bf16
    /// weights and each product's activations rounded to bf16 too (f32 sums; the arithmetic of
    /// bf16 inference in llama.cpp and PyTorch), which runs on AMX tiles on CPUs that have them
    /// (Intel Xeon since Sapphire Rapids) and makes prompts several times faster there.
    #[arg(long, value_name = "f32|bf16|int8|bf16-matmul", default_value = "f32")]
    pub decode_weights: coa_model::DecodeDtype,
    /// The format the CPU decoder's KV cache holds keys and values in: `f32`, or `bf16` (half
    /// the bytes each step's attention reads, which grow with the context; each key and value
    /// rounded once when stored).
    #[arg(long, value_name = "f32|bf16", default_value = "f32", value_parser = kv_format)]
    pub kv_cache: coa_model::DecodeDtype,
}

impl DecodeFlags {
    /// The device of `--device` (first, so that `--device cuda` without a GPU fails before
    /// anything is read).
    pub fn select(&self) -> Result<Device> {
        select_device(self.device.device).map_err(|e| anyhow!("{e}"))
    }

    /// Opens `model` for decoding on `device` (from [`DecodeFlags::select`]): `slots` sequences
    /// of up to `max_len` tokens. Returns the decoder and the device's name; `who` prefixes the
    /// note printed when a GPU is used.
    pub fn open<'a>(&self, device: Device, model: &'a Model, slots: usize, max_len: usize, who: &str) -> Result<(Decoder<'a>, String)> {
        let supported = check_decodable(&model.config);
        match gpu_for_model(device, self.device.device, supported, "decodes this model").map_err(|e| anyhow!("{e}"))? {
            Some(info) => {
                if self.decode_weights != coa_model::DecodeDtype::F32 || self.kv_cache != coa_model::DecodeDtype::F32 {
                    bail!(
                        "--decode-weights {} --kv-cache {}: the CPU decoder's options; the GPU decoder (--device {}) holds bf16 weights and KV cache",
                        self.decode_weights,
                        self.kv_cache,
                        self.device.device
                    );
                }
                let at = |e: coa_kernels::Error| anyhow!("--device {}: {e}", self.device.device);
                let gpu = Gpu::open(&info).map_err(at)?;
                gpu.warm_up().map_err(at)?;
                let decoder = GpuDecoder::new(std::sync::Arc::new(gpu), &model.config, &model.params, slots, max_len, GPU_PASS_ROWS).map_err(at)?;
                eprintln!(
                    "{who}: decoding on {info}: {slots} sequences of up to {max_len} tokens, {:.2} GiB of weights, cache and buffers",
                    decoder.device_bytes() as f64 / (1u64 << 30) as f64
                );
                Ok((Decoder::Gpu(GpuPolicy { decoder }), info.to_string()))
            }
            None => {
                model.prepare_decoding_as(self.decode_weights).context("--decode-weights")?;
                let mut cpu = ModelPolicy::with_cache(model, slots, max_len, self.kv_cache)?;
                if self.no_prefix_reuse {
                    cpu = cpu.without_prefix_reuse();
                }
                let exact = self.decode_weights == coa_model::DecodeDtype::F32 && self.kv_cache == coa_model::DecodeDtype::F32;
                let name = if exact { "cpu".to_string() } else { format!("cpu ({} weights, {} KV cache)", self.decode_weights, self.kv_cache) };
                Ok((Decoder::Cpu(cpu), name))
            }
        }
    }
}
