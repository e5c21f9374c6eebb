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

use crate::error::Result;
use crate::gpu::Gpu;
use crate::sources::KernelSource;

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

/// Every kernel source of `kernels/`, each declared beside its launchers (`<op>::SOURCE`). The
/// NVRTC test checks this list against the directory, so a new `.cu` file cannot be forgotten here.
pub const SOURCES: &[KernelSource] = &[
    attention::SOURCE,
    cross_entropy::SOURCE,
    rmsnorm::SOURCE,
    rope::SOURCE,
    swiglu::SOURCE,
    embedding::SOURCE,
    adamw::SOURCE,
    elementwise::SOURCE,
    decode_attention::SOURCE,
];

impl Gpu {
    /// Compiles (or loads from the PTX cache) and loads every kernel module now, so that the first
    /// training step or timed region does not pay for it.
    pub fn warm_up(&self) -> Result<()> {
        for s in SOURCES {
            for e in s.entry_points {
                self.func(s, e)?;
            }
        }
        Ok(())
    }
}
