//! One module per op, beside its kernel: `src/ops/<op>.rs` holds the launchers of `kernels/<op>.cu`
//! (and its `SOURCE`: the file and the entry points it must export), the shapes and argument
//! structs they take, and names the op's CPU reference in `coa_model::ops` and its test in
//! `tests/gpu_kernels/<op>.rs`. A change to one op touches those four places and no other.
//!
//! Everything is asynchronous on `gpu.stream` unless a function says it synchronises (downloads,
//! [`Gpu::sumsq`](crate::Gpu::sumsq), [`Gpu::masked_cross_entropy`](crate::Gpu::masked_cross_entropy)).
//! Tensors are row-major; shapes are written as in `coa_model::ops`. Launchers accept any cudarc
//! device buffer (`CudaSlice`, `CudaView`, `CudaViewMut`), check lengths against the shapes they
//! are given and return an [`Error`](crate::Error) rather than launch out of bounds.

pub mod adamw;
pub mod attention;
pub mod cross_entropy;
pub mod decode_attention;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;
