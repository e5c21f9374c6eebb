//! The Llama / Qwen2 / Qwen3 / Mistral decoder in Rust.
//!
//! - [`ModelConfig`]: HF `config.json` (presets "tiny" and "small").
//! - [`Params`]: f32 parameters in canonical order with HF names.
//! - [`Model`]: init, HF checkpoint load/save (safetensors f32/bf16/f16), logits, and
//!   `forward_backward` with a caller-supplied d loss / d logp (SFT and RL share it).
//! - [`gguf`]: a llama.cpp GGUF file (llama / qwen2 / qwen3; F32, F16, BF16, Q8_0, Q4_0, Q4_1) read as
//!   the same model, tokenizer and chat template HF transformers derives from it.
//! - [`lora`]: LoRA adapters (PEFT's config and file layout): forward, backward, merge.
//! - [`decode`]: [`KvCache`] and batched incremental decoding (`prefill`, `decode_step`, `extend`).
//! - [`quant`]: [`DecodeDtype`], the formats decoding can hold its weights in (f32, bf16, int8,
//!   and bf16 with bf16 activations, which runs on AMX tiles or AVX-512 BF16 dot products where
//!   the CPU has them).
//! - [`ops`]: every op as plain f32 functions, forward and backward: the CPU reference the GPU
//!   kernels are tested against.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod attention_packed;
mod attention_rows;
#[cfg(target_arch = "x86_64")]
mod bf16mm;
pub mod adamw;
pub mod config;
pub mod decode;
mod decode_weights;
pub mod gguf;
pub mod io;
pub mod lora;
pub mod model;
pub mod ops;
mod par;
pub mod params;
pub mod quant;
pub mod rng;
mod sgemm;
pub(crate) mod simd;

pub use config::{Llama3Rope, ModelConfig, TokenIds};
pub use decode::KvCache;
pub use io::{parse_size, SaveDtype, SaveFormat, DEFAULT_MAX_SHARD_BYTES};
pub use lora::{Lora, LoraConfig};
pub use model::{Model, Seq, TokenStats, Workspace};
pub use quant::{DecodeDtype, MatmulDtype};
pub use params::{layout, param_specs, LayerIdx, Layout, ParamSpec, Params, Tensor};
