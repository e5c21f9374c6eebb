//! The kernel sources, embedded at build time (`kernels/*.cu`), and the entry points each one must
//! export. `coa_common.cuh` is inlined where a source includes it, so NVRTC sees one
//! self-contained program and the PTX cache key covers the helper header too.

/// One `.cu` file of `kernels/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// File stem, e.g. `attention` for `kernels/attention.cu`.
    pub name: &'static str,
    /// The file's text as written (before the common header is inlined).
    pub text: &'static str,
    /// `extern "C"` kernels the module must export.
    pub entry_points: &'static [&'static str],
}

/// The helper header inlined into every source.
pub const COMMON_HEADER: &str = include_str!("../coa_common.cuh");

macro_rules! src {
    ($name:literal, [$($e:literal),* $(,)?]) => {
        KernelSource {
            name: $name,
            text: include_str!(concat!("../", $name, ".cu")),
            entry_points: &[$($e),*],
        }
    };
}

pub const ATTENTION: KernelSource = src!(
    "attention",
    [
        "flash_attn_fwd_d64",
        "flash_attn_fwd_d128",
        "flash_attn_bwd_pre",
        "flash_attn_bwd_d64",
        "flash_attn_bwd_d128",
        "flash_attn_dq_convert",
    ]
);
pub const CROSS_ENTROPY: KernelSource =
    src!("cross_entropy", ["xent_fwd_bwd", "xent_weights_from_mask", "xent_loss_sum", "xent_entropy"]);
pub const RMSNORM: KernelSource = src!("rmsnorm", ["rmsnorm_fwd", "rmsnorm_bwd", "sum_rows_f32_add"]);
pub const ROPE: KernelSource = src!("rope", ["rope_apply"]);
pub const SWIGLU: KernelSource = src!("swiglu", ["swiglu_fwd", "swiglu_bwd"]);
pub const EMBEDDING: KernelSource = src!("embedding", ["embedding_fwd", "embedding_bwd_sorted"]);
pub const ADAMW: KernelSource = src!("adamw", ["adamw_step"]);
pub const DECODE_ATTENTION: KernelSource = src!("decode_attention", ["kv_append", "attn_extend"]);
pub const ELEMENTWISE: KernelSource = src!(
    "elementwise",
    ["cast_f32_bf16", "cast_bf16_f32", "add_bf16", "accum_bf16_f32", "sumsq_f32"]
);

/// Every kernel source of `kernels/`. The NVRTC test checks this list against the directory, so a
/// new `.cu` file cannot be forgotten here.
pub const ALL: &[KernelSource] =
    &[ATTENTION, CROSS_ENTROPY, RMSNORM, ROPE, SWIGLU, EMBEDDING, ADAMW, ELEMENTWISE, DECODE_ATTENTION];

impl KernelSource {
    /// The program NVRTC compiles: the source with `#include "coa_common.cuh"` replaced by the
    /// header's text.
    pub fn expanded(&self) -> String {
        let mut out = String::with_capacity(self.text.len() + COMMON_HEADER.len() + 64);
        for line in self.text.lines() {
            if line.trim() == "#include \"coa_common.cuh\"" {
                out.push_str("// ---- begin coa_common.cuh ----\n");
                out.push_str(COMMON_HEADER);
                out.push_str("\n// ---- end coa_common.cuh ----\n");
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}
