//! The GPU path of the trainer: CUDA kernels (`kernels/*.cu`), compiled at run time by NVRTC
//! through cudarc (dynamic loading, CUDA 13.0 bindings) with the PTX cached on disk, and their host
//! side: device selection that never panics, launchers, cuBLAS matmuls (bf16 in, fp32 accumulate).
//!
//! - [`device`]: `--device auto|cpu|cuda|emu` ([`select_device`], [`probe`]).
//! - [`emu`]: the emulated CUDA device: the same kernels, host code and cudarc calls, on the CPU.
//! - [`locate`]: finding libnvrtc / libcublas / `cuda_bf16.h` (pip wheels, CUDA toolkit, env).
//! - [`compile`]: NVRTC compile + on-disk PTX cache.
//! - [`sources`]: the embedded `.cu` sources and their entry points.
//! - [`gpu`]: [`Gpu`], the context that owns the stream, the cuBLAS handle and the module cache,
//!   with one launcher per kernel.
//! - [`model`]: [`GpuModel`], the `coa_model` decoder with its optimizer state and activations on
//!   the GPU (forward, backward, AdamW, checkpoint upload/download).
//! - [`decode`]: the KV-cache append and attention launchers of decoding (`decode_attention.cu`).
//! - [`rng`]: a small seeded generator for tests and benchmarks; [`testing`]: the GPU tests' visible
//!   skip and replayable seeds.
//!
//! Semantics of every kernel equal the f32 CPU reference in `coa_model::ops` (see each `.cu`
//! header); the tests in `tests/gpu_kernels.rs` check every output element against it.

pub mod compile;
pub mod decode;
pub mod device;
pub mod emu;
pub mod error;
pub mod gpu;
mod gpu_info;
pub mod layout;
pub mod locate;
pub(crate) mod lora;
pub mod model;
pub mod ops;
pub mod rng;
pub mod sources;
pub mod testing;

pub use cudarc;
pub use device::{gpu_for_model, probe, select_device, Device, DeviceArg, DeviceChoice, GpuInfo, NoGpu};
pub use error::{Error, Result};
pub use gpu::Gpu;
pub use model::GpuModel;
pub use half::bf16;
