//! The kernel sources, embedded at build time (`kernels/*.cu`; each declared with the entry points
//! it must export beside its launchers, as `SOURCE` in `src/ops/<op>.rs`, and listed in
//! `ops::SOURCES`). `coa_common.cuh` is
//! inlined where a source includes it, so NVRTC sees one self-contained program and the PTX cache
//! key covers the helper header too.

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
